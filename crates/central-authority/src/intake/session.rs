//! Connector sessions: the `ConnectorSession.Connect` service. Authenticates
//! the connector by the client certificate it got from `Enrollment.Enroll`
//! (serial checked against the database) before reading anything; only a CA
//! run with `[tls] enabled = false`, for local experiments, takes the
//! group's provisioning key in metadata instead. Then it expects a `Hello`
//! that agrees with that identity and whose release the compatibility
//! policy accepts (`protocol::release`), answers `Welcome`, and takes reports and
//! heartbeats (reports go to `intake::reports`) until the stream ends, the
//! connector goes quiet, or a newer session replaces this one. Two limits per session: report entries
//! (`[limits] connector_entries_per_second`; a report beyond it is refused
//! with `FlowControl` and the connector sends it again, so nothing is lost)
//! and, as a guard against floods of tiny messages, messages of any kind
//! (`connector_messages_per_second`; excess ones are dropped and counted).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use protocol::release::Release;
use protocol::scan::{ScannedReport, decode_connector_message, scan_report};
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use protocol::v1::connector_message::Kind as In;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::Bytes;
use tonic::{Request, Response, Status as GrpcStatus, Streaming};

use crate::access;
use crate::credentials::auth::AuthError;
use crate::error::SessionError;
use crate::intake;
use crate::intake::reports::Intake;
use crate::state::authority::Authority;
use crate::state::policy_state::PolicyState;
use crate::state::registry::{Arrival, LiveSession, Outbound};
use crate::trust;
use crate::trust::enroll::SessionCert;
use crate::trust::identity::Identity;

/// How long a connector has to send `Hello` after opening the stream.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages queued toward one connector before it counts as not reading.
const OUTBOUND_CAPACITY: usize = 1024;

/// What authenticated a session: checked again at registration and by
/// the reconcile for as long as the session lives.
#[derive(Debug)]
enum Credential {
    /// A client certificate the CA issued.
    Cert(SessionCert),
    /// The SHA-256 of the group's provisioning key in metadata (`[tls]
    /// enabled = false`).
    Key(String),
}

/// An authenticated stream, as `run_session` takes it.
#[derive(Debug)]
struct Opened {
    identity: Identity,
    credential: Credential,
    /// `Store::announced` just before the authentication read the store.
    announced: Option<u64>,
    /// The connector's address.
    peer: Option<std::net::SocketAddr>,
}

/// What `Connect` answers with.
pub type ConnectStream = ReceiverStream<Result<v1::AuthorityMessage, GrpcStatus>>;

/// The `ConnectorSession` gRPC service (served by `intake::connect::ConnectServer`,
/// which hands the inbound messages over still encoded).
#[derive(Clone, Debug)]
pub struct SessionService {
    authority: Arc<Authority>,
}

impl SessionService {
    /// The service over shared state.
    pub fn new(authority: Arc<Authority>) -> Self {
        SessionService { authority }
    }
}

impl SessionService {
    /// `ConnectorSession.Connect`: authenticates the stream and runs its
    /// session on a task of its own.
    pub(crate) async fn connect(
        &self,
        request: Request<Streaming<Bytes>>,
    ) -> Result<Response<ConnectStream>, GrpcStatus> {
        // Read before the store is: `run_session` checks the standing
        // again only if something was announced after this.
        let announced = self.authority.store().announced();
        // Both look the connector up in the database, which may wait for
        // an enrollment's write: off the async workers.
        let authenticated = if self.authority.pki().is_some() {
            let certs = request.peer_certs();
            self.authority
                .blocking(move |a| {
                    trust::enroll::authenticate_session_cert(a, certs.as_deref().map(Vec::as_slice))
                        .map(|(identity, cert)| (identity, Credential::Cert(cert)))
                })
                .await
        } else {
            let metadata = request.metadata().clone();
            self.authority
                .blocking(move |a| {
                    trust::enroll::authenticate_key(a, &metadata)
                        .map(|(identity, key)| (identity, Credential::Key(key)))
                })
                .await
        }
        .unwrap_or(Err(AuthError::Unavailable));
        let (identity, credential) = match authenticated {
            Ok(identity) => identity,
            Err(e) => {
                // The reason is logged without the key.
                crate::state::counters::Metrics::count(
                    &self.authority.metrics().sessions_refused,
                    e.label(),
                );
                tracing::warn!(peer = ?request.remote_addr(), error = %e, "connector authentication failed");
                return Err(e.into());
            }
        };
        let (tx, rx) = mpsc::channel(OUTBOUND_CAPACITY);
        let authority = self.authority.clone();
        let peer = request.remote_addr();
        let inbound = request.into_inner();
        tokio::spawn(async move {
            let name = identity.name.clone();
            let opened = Opened {
                identity,
                credential,
                announced,
                peer,
            };
            if let Err(e) = run_session(&authority, opened, inbound, tx.clone()).await {
                tracing::warn!(connector = %name, error = %e, "session ended with an error");
                // Never wait on a peer that does not read.
                let _ = tx.try_send(Err(e.into()));
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// At most this many messages are handled as one batch (at one receive
/// time) before the session checks its kill switch and timer again.
const RECEIVE_BATCH: usize = 64;

/// The next message of `inbound` if one is ready now (`None` when it is
/// not): polled in the session task's own context, so when nothing is ready
/// the task is registered to wake for the next one as usual.
async fn ready<T>(inbound: &mut Streaming<T>) -> Option<Option<Result<T, GrpcStatus>>> {
    use futures::Stream;
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut *inbound).poll_next(cx) {
            std::task::Poll::Ready(next) => Some(next),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

/// The session's receive time as governor's clock: the message limiter
/// decides on the time the current batch was received (read once per
/// batch), not on a clock read of its own per message.
#[derive(Clone, Debug)]
struct ReceiveClock {
    start: Instant,
    nanos: Arc<std::sync::atomic::AtomicU64>,
}

impl ReceiveClock {
    fn new() -> Self {
        ReceiveClock {
            start: Instant::now(),
            nanos: Arc::default(),
        }
    }

    /// Sets the time the limiter sees.
    fn set(&self, now: Instant) {
        let nanos =
            u64::try_from(now.saturating_duration_since(self.start).as_nanos()).unwrap_or(u64::MAX);
        self.nanos
            .store(nanos, std::sync::atomic::Ordering::Relaxed);
    }
}

impl governor::clock::Clock for ReceiveClock {
    type Instant = governor::nanos::Nanos;

    fn now(&self) -> Self::Instant {
        self.nanos.load(std::sync::atomic::Ordering::Relaxed).into()
    }
}

/// What a session last wrote to the registry's `last_seen`: the receive
/// time it last looked at and the Unix millisecond it last wrote.
#[derive(Debug, Default)]
struct SeenMs {
    wall: Option<SystemTime>,
    ms: Option<u128>,
}

/// Wall-clock times for messages, derived from their monotonic receive
/// times: the wall clock is read once a second, not once per message (the
/// times are for display; within a second the two clocks agree to well
/// under a millisecond).
struct WallClock {
    at: Instant,
    wall: SystemTime,
}

impl WallClock {
    fn new() -> Self {
        WallClock {
            at: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    /// The wall-clock time at `now`.
    fn at(&mut self, now: Instant) -> SystemTime {
        let since = now.saturating_duration_since(self.at);
        if since >= Duration::from_secs(1) {
            self.at = now;
            self.wall = SystemTime::now();
            return self.wall;
        }
        self.wall + since
    }
}

/// Drives one session from `Hello` to its end: the stream is recorded as
/// pending (so disable / revoke close it before it registers), the
/// connector's standing is checked again after `Hello`, it is registered
/// (replacing an older session of it), its messages are taken until the
/// session ends (at the latest when its certificate expires), and the
/// registry is told why.
async fn run_session(
    authority: &Arc<Authority>,
    opened: Opened,
    mut inbound: Streaming<Bytes>,
    tx: Outbound,
) -> Result<(), SessionError> {
    let Opened {
        identity,
        credential,
        announced,
        peer,
    } = opened;
    let (cert, key) = match credential {
        Credential::Cert(cert) => (Some(cert), None),
        Credential::Key(key) => (None, Some(key)),
    };
    let id = authority.next_session_id();
    let kill = Arc::new(Notify::new());
    // The receiver answers refused reports (`FlowControl`) on the stream.
    let out = tx.clone();
    authority.registry().open_pending(
        &identity.name,
        LiveSession {
            id,
            label: format!("{}-{:08x}", id, rand::random::<u32>()),
            cert_serial: cert.as_ref().map(|c| c.serial.clone()),
            key_sha256: key.clone(),
            cert_root: cert.as_ref().and_then(|c| c.root.clone()),
            tx,
            kill: kill.clone(),
            draining: None,
        },
    );
    let hello = tokio::select! {
        biased;
        () = kill.notified() => Err(SessionError::ClosedBeforeHello),
        hello = await_hello(&identity, &mut inbound) => hello,
    };
    let hello = match hello {
        Ok(Some(hello)) => hello,
        other => {
            authority.registry().drop_pending(id);
            count_release_refusal(authority, &other);
            return other.map(|_| ());
        }
    };
    // The stream was checked when it opened, up to HELLO_TIMEOUT ago. A
    // disable or revocation since then either is seen here, or (if it
    // comes after this check) closes the pending stream or the session it
    // became: the registry decides under one lock. On PostgreSQL the store
    // is read again only if a change was announced since that check (in a
    // reconnect storm, half the session's reads).
    let standing = standing_at_hello(authority, &identity, cert.as_ref(), key, announced).await;
    if let Err(e) = standing {
        authority.registry().drop_pending(id);
        crate::state::counters::Metrics::count(&authority.metrics().sessions_refused, e.label());
        return Err(e.into());
    }
    register(authority, &identity, &hello, id)?;
    authority.log_connector(&identity.name, "connected", peer);
    trust::rotation::announce_trust(authority, &identity.name, &out, cert.as_ref());
    let result = Receiver::new(authority, &identity, out)
        .run(&mut inbound, &kill, expiry(cert.as_ref()))
        .await
        .map_err(|e| match (e, &cert) {
            (SessionError::CertificateExpired, Some(c)) => {
                SessionError::Auth(AuthError::CertificateExpired(c.serial.clone()))
            }
            (e, _) => e,
        });
    let reason = match &result {
        Ok(()) => "session ended".to_owned(),
        Err(e) => e.to_string(),
    };
    end_session(authority, &identity.name, id, &reason);
    result
}

/// When the session's certificate expires (none without one): the session
/// ends then.
fn expiry(cert: Option<&SessionCert>) -> Option<tokio::time::Instant> {
    cert.map(|c| {
        let left = c
            .not_after_ms
            .saturating_sub(crate::ground::clock::now_ms())
            .max(0);
        tokio::time::Instant::now() + Duration::from_millis(u64::try_from(left).unwrap_or(0))
    })
}

/// Counts a `Hello` whose release the compatibility policy refused (with
/// the other refused sessions, by its reason).
fn count_release_refusal(authority: &Authority, hello: &Result<Option<v1::Hello>, SessionError>) {
    if let Err(SessionError::Release(e)) = hello {
        crate::state::counters::Metrics::count(&authority.metrics().sessions_refused, e.label());
    }
}

/// The standing of a stream that said `Hello`, authenticated when
/// `Store::announced` read `announced`: from the store again only if a
/// change was announced since (always on SQLite).
async fn standing_at_hello(
    authority: &Arc<Authority>,
    identity: &Identity,
    cert: Option<&SessionCert>,
    key: Option<String>,
    announced: Option<u64>,
) -> Result<(), AuthError> {
    if announced.is_some() && announced == authority.store().announced() {
        return trust::enroll::check_standing_locally(authority, identity, cert, key.as_deref());
    }
    let (who, held) = (identity.clone(), cert.cloned());
    authority
        .blocking(move |a| trust::enroll::check_standing(a, &who, held.as_ref(), key.as_deref()))
        .await
        .unwrap_or(Err(AuthError::Unavailable))
}

/// Waits (at most `HELLO_TIMEOUT`) for the session's first message, which
/// must be a `Hello` that agrees with the authenticated identity. `None`
/// when the stream ended first.
async fn await_hello(
    identity: &Identity,
    inbound: &mut Streaming<Bytes>,
) -> Result<Option<v1::Hello>, SessionError> {
    let first = match tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await {
        Err(_) => return Err(SessionError::HelloTimeout(HELLO_TIMEOUT)),
        Ok(Err(status)) => return Err(status.into()),
        Ok(Ok(None)) => return Ok(None),
        Ok(Ok(Some(m))) => decode_connector_message(m)?,
    };
    let Some(In::Hello(hello)) = first.kind else {
        return Err(SessionError::ExpectedHello);
    };
    if *hello.name != *identity.name || *hello.group != *identity.group {
        return Err(SessionError::HelloMismatch {
            name: hello.name.chars().take(128).collect(),
            group: hello.group.chars().take(128).collect(),
            authenticated_name: identity.name.to_string(),
            authenticated_group: identity.group.to_string(),
        });
    }
    // The compatibility policy: before the standing is read again, so a
    // refused release costs no store call.
    Release::current().accepts(&hello.release)?;
    Ok(Some(hello))
}

/// The per-connector message cap (`[limits] connector_messages_per_second`):
/// a message over it is dropped (the session stays), counted, and logged
/// once per 1,000 drops.
struct MessageCap {
    /// The limiter decides on each message's receive time, not on a clock
    /// read of its own.
    clock: ReceiveClock,
    limiter: governor::RateLimiter<
        governor::state::NotKeyed,
        governor::state::InMemoryState,
        ReceiveClock,
        governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
    >,
    dropped: u64,
}

impl MessageCap {
    fn new(per_second: u32, burst: u32) -> Self {
        let clock = ReceiveClock::new();
        let limiter = governor::RateLimiter::direct_with_clock(
            governor::Quota::per_second(
                std::num::NonZeroU32::new(per_second).unwrap_or(std::num::NonZeroU32::MIN),
            )
            .allow_burst(std::num::NonZeroU32::new(burst).unwrap_or(std::num::NonZeroU32::MIN)),
            clock.clone(),
        );
        MessageCap {
            clock,
            limiter,
            dropped: 0,
        }
    }

    /// Whether the next message may be handled; counts and logs it if not.
    fn admit(&mut self, authority: &Authority, identity: &Identity) -> bool {
        if self.limiter.check().is_ok() {
            return true;
        }
        authority.metrics().messages_rate_limited.inc();
        if self.dropped.is_multiple_of(1000) {
            tracing::warn!(
                connector = %identity.name,
                dropped = self.dropped + 1,
                "connector exceeds its message rate cap; dropping messages"
            );
        }
        self.dropped += 1;
        false
    }
}

/// The per-session entry limit (`[limits] connector_entries_per_second`
/// and `connector_entries_burst`): a token bucket counted in application
/// entries, on the session's receive times. A report is taken whole or
/// refused whole (the connector re-sends it); a full-state report is always
/// taken (it follows every connect and must not wait behind itself) and may
/// leave the bucket in debt, at most one burst deep.
#[derive(Debug)]
struct EntryBudget {
    per_second: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
    /// The latest refusal.
    refused: Option<Refusal>,
}

/// How long after a refusal a report carrying a refused application is
/// still taken as sent before the connector read the refusal.
const IN_FLIGHT: Duration = Duration::from_millis(100);

/// Refused reports: when the first of a chain was received (a refusal
/// while an earlier one's `retry_after` runs continues the chain), the end
/// of the latest one's `retry_after`, and their applications ([`app_id`]).
#[derive(Debug)]
struct Refusal {
    at: Instant,
    until: Instant,
    apps: std::collections::HashSet<u64>,
}

/// An application of a report, as [`EntryBudget::early`] compares them.
fn app_id(segment: &str, host: &str, protocol: &str, port: u32) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (segment, host, protocol, port).hash(&mut h);
    h.finish()
}

/// The applications of a report ([`app_id`]).
fn report_apps(message: &mut Inbound<'_>) -> Vec<u64> {
    match message {
        Inbound::Scanned(report) => report
            .entries
            .iter_mut()
            .map(|e| {
                let protocol = e.protocol.as_str();
                app_id(e.segment, e.host.as_str(), protocol, u32::from(e.port))
            })
            .collect(),
        Inbound::Decoded(v1::ConnectorMessage {
            kind: Some(In::Report(report)),
        }) => report
            .applications
            .iter()
            .filter_map(|a| a.app.as_ref())
            .map(|k| {
                let protocol = match v1::Protocol::try_from(k.protocol) {
                    Ok(v1::Protocol::Udp) => "udp",
                    _ => "tcp",
                };
                app_id(&k.segment, &k.host, protocol, k.port)
            })
            .collect(),
        Inbound::Decoded(_) => Vec::new(),
    }
}

impl EntryBudget {
    fn new(per_second: u32, burst: u32, now: Instant) -> Self {
        EntryBudget {
            per_second: f64::from(per_second.max(1)),
            burst: f64::from(burst.max(1)),
            tokens: f64::from(burst.max(1)),
            at: now,
            refused: None,
        }
    }

    /// Whether a report of `apps` received at `now` sends a refused
    /// application again before the `retry_after` of the session's
    /// refusals: it carries an application of a refused report and came
    /// more than [`IN_FLIGHT`] after the first refusal of the chain. A
    /// report received sooner may have been sent before the refusal
    /// reached the connector (a paused CA reads what queued meanwhile in
    /// several batches, and a connector's next round names the same
    /// applications); a connector that ignores the refusal sends again and
    /// again until it is taken, past that allowance.
    fn early(&mut self, now: Instant, apps: &[u64]) -> bool {
        self.awaits_retry(now)
            && self
                .refused
                .as_ref()
                .is_some_and(|r| apps.iter().any(|a| r.apps.contains(a)))
    }

    /// Whether a report received at `now` comes before the `retry_after`
    /// of the session's latest refusal, past [`IN_FLIGHT`] after the first
    /// refusal of the chain (only then can it be [`early`](Self::early));
    /// forgets a wait that passed.
    fn awaits_retry(&mut self, now: Instant) -> bool {
        match &self.refused {
            Some(r) if now < r.until => now > r.at + IN_FLIGHT,
            _ => {
                self.refused = None;
                false
            }
        }
    }

    /// Records a report of `apps` refused at `now` for `wait`: a refusal
    /// while an earlier one's wait runs continues its chain.
    fn refuse(&mut self, now: Instant, wait: Duration, apps: Vec<u64>) {
        let until = now + wait;
        match &mut self.refused {
            Some(r) if now < r.until => {
                r.until = until;
                r.apps.extend(apps);
            }
            _ => {
                self.refused = Some(Refusal {
                    at: now,
                    until,
                    apps: apps.into_iter().collect(),
                });
            }
        }
    }

    /// Takes a report of `entries` at `now`, or says how long until it can
    /// be taken. A report larger than the burst is taken from a full bucket.
    fn take(&mut self, entries: usize, full_state: bool, now: Instant) -> Result<(), Duration> {
        // A batch's messages share one receive time: the bucket is
        // refilled once per batch, not per message.
        if now > self.at {
            let elapsed = now.duration_since(self.at).as_secs_f64();
            self.at = now;
            self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        }
        let entries = entries as f64;
        let need = entries.min(self.burst);
        if full_state || self.tokens >= need {
            self.tokens = (self.tokens - entries).max(-self.burst);
            return Ok(());
        }
        Err(
            Duration::from_secs_f64((need - self.tokens) / self.per_second)
                .max(Duration::from_millis(1)),
        )
    }
}

/// The receiving side of a registered session: takes messages until the
/// stream ends, the connector goes quiet or the kill switch fires.
struct Receiver<'a> {
    authority: &'a Authority,
    identity: &'a Identity,
    /// The policy snapshot is taken again only after a reload (an atomic
    /// load per message instead of a lock and a reference count).
    state: Arc<PolicyState>,
    version: u64,
    cap: MessageCap,
    entries: EntryBudget,
    /// Where `FlowControl` goes.
    tx: Outbound,
    /// The Unix millisecond last written to the registry's `last_seen`.
    seen_ms: SeenMs,
    clock: WallClock,
}

impl<'a> Receiver<'a> {
    fn new(authority: &'a Authority, identity: &'a Identity, tx: Outbound) -> Self {
        let (state, version) = authority.versioned_snapshot();
        let limits = &state.settings().limits;
        Receiver {
            entries: EntryBudget::new(
                limits.connector_entries_per_second,
                limits.connector_entries_burst,
                Instant::now(),
            ),
            tx,
            authority,
            identity,
            cap: MessageCap::new(
                state.settings().limits.connector_messages_per_second,
                state.settings().limits.connector_message_burst,
            ),
            state,
            version,
            seen_ms: SeenMs::default(),
            clock: WallClock::new(),
        }
    }

    /// The message loop.
    async fn run(
        mut self,
        inbound: &mut Streaming<Bytes>,
        kill: &Notify,
        expires: Option<tokio::time::Instant>,
    ) -> Result<(), SessionError> {
        // A session never outlives its certificate.
        let expiry = async {
            match expires {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expiry);
        // When the last message arrived: the idle timeout counts from it, and
        // the report intake stamps reports with it.
        let mut last = tokio::time::Instant::now();
        // One idle timer for the whole session, moved only when it fires early
        // (a timer per message costs more than the message).
        let idle_timer = tokio::time::sleep_until(last + self.state.settings().idle_timeout());
        tokio::pin!(idle_timer);
        loop {
            self.authority.refresh(&mut self.state, &mut self.version);
            let idle = self.state.settings().idle_timeout();
            if last + idle < idle_timer.deadline() {
                // A reload shortened the idle timeout.
                idle_timer.as_mut().reset(last + idle);
            }
            // A message that is ready wins over the timer, as with `timeout`.
            let next = async {
                tokio::select! {
                    biased;
                    next = inbound.message() => Some(next),
                    () = &mut idle_timer => None,
                }
            };
            tokio::select! {
                _ = kill.notified() => return Ok(()),
                () = &mut expiry => return Err(SessionError::CertificateExpired),
                next = next => match next {
                    None => {
                        let deadline = last + idle;
                        if tokio::time::Instant::now() >= deadline {
                            return Err(SessionError::Idle(idle));
                        }
                        idle_timer.as_mut().reset(deadline);
                    }
                    Some(Err(status)) => return Err(status.into()),
                    Some(Ok(None)) => return Ok(()),
                    Some(Ok(Some(first))) => {
                        last = tokio::time::Instant::now();
                        if let Some(end) = self.batch(inbound, first, last.into_std()).await {
                            return end;
                        }
                    }
                }
            }
        }
    }

    /// Handles `first` and the messages that arrived with it (already
    /// decoded or in the stream's buffer) as one batch at one receive time
    /// `now`: one clock read and one pass through the `select!` per batch,
    /// not per message. Returns how the session ends if the stream ended
    /// inside the batch.
    async fn batch(
        &mut self,
        inbound: &mut Streaming<Bytes>,
        first: Bytes,
        now: Instant,
    ) -> Option<Result<(), SessionError>> {
        let wall = self.clock.at(now);
        self.cap.clock.set(now);
        let mut message = first;
        let mut handled = 0;
        loop {
            // A report is read straight from its bytes; any other message,
            // and any report the scan leaves alone, is decoded with prost.
            let mut inbound_message = match scan_report(&message) {
                Some(report) => Inbound::Scanned(report),
                None => match decode_connector_message(message.clone()) {
                    Ok(decoded) => Inbound::Decoded(decoded),
                    Err(status) => return Some(Err(status.into())),
                },
            };
            if self.cap.admit(self.authority, self.identity)
                && self.within_budget(&mut inbound_message, now)
            {
                handle(
                    self.authority,
                    self.identity,
                    &self.state,
                    &mut inbound_message,
                    now,
                    wall,
                    &mut self.seen_ms,
                );
            }
            handled += 1;
            if handled == RECEIVE_BATCH {
                return None;
            }
            // The handled message's bytes are a slice of the stream's receive
            // buffer: freed before the next read, the buffer is not shared
            // and is reused, not reallocated and copied.
            drop(std::mem::take(&mut message));
            match ready(inbound).await {
                None => return None,
                Some(Some(Ok(m))) => message = m,
                Some(Some(Err(status))) => return Some(Err(status.into())),
                Some(None) => return Some(Ok(())),
            }
        }
    }
}

impl Receiver<'_> {
    /// Whether `message` fits the session's entry limit; a report that does
    /// not is refused with `FlowControl` (the connector keeps its entries
    /// and sends them again after `retry_after_ms`).
    fn within_budget(&mut self, message: &mut Inbound<'_>, now: Instant) -> bool {
        let (entries, full_state, sequence) = match message {
            Inbound::Scanned(report) => (report.entries.len(), report.full_state, report.sequence),
            Inbound::Decoded(v1::ConnectorMessage {
                kind: Some(In::Report(report)),
            }) => (
                report.applications.len(),
                report.full_state,
                report.sequence,
            ),
            Inbound::Decoded(_) => return true,
        };
        // A report's applications are read only while a refusal awaits its
        // retry, or when this report is refused: not for every report taken.
        let mut apps = None;
        if self.entries.awaits_retry(now) {
            let read = report_apps(message);
            if self.entries.early(now, &read) {
                self.authority.metrics().reports_early.inc();
            }
            apps = Some(read);
        }
        let Err(wait) = self.entries.take(entries, full_state, now) else {
            return true;
        };
        let apps = apps.unwrap_or_else(|| report_apps(message));
        self.entries.refuse(now, wait, apps);
        self.authority.metrics().reports_deferred.inc();
        let refusal = v1::AuthorityMessage {
            kind: Some(Out::FlowControl(v1::FlowControl {
                sequence,
                retry_after_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                max_entries_per_second: self.state.settings().limits.connector_entries_per_second,
            })),
        };
        // A connector that does not read its stream (1,024 messages queued)
        // is cut off by the idle and keepalive rules anyway.
        if self.tx.try_send(Ok(refusal)).is_err() {
            tracing::warn!(connector = %self.identity.name, "cannot queue flow control: the connector does not read");
        }
        false
    }
}

/// Registers pending stream `id` as a session after `Hello`: queues
/// `Welcome` first and replaces (and closes) an older session of the
/// same connector. Refused when the stream was closed while pending.
fn register(
    authority: &Authority,
    identity: &Identity,
    hello: &v1::Hello,
    id: u64,
) -> Result<(), SessionError> {
    let arrival = Arrival {
        name: &identity.name,
        group: &identity.group,
        hello,
    };
    let old = authority
        .registry()
        .register(arrival, id, |session| {
            let (segments, settings) = authority.snapshot().assignment(&identity.group);
            let count = segments.len();
            let welcome = v1::AuthorityMessage {
                kind: Some(Out::Welcome(v1::Welcome {
                    session_id: session.label.clone(),
                    segments,
                    settings: Some(settings),
                })),
            };
            // Nothing but a pending-close Shutdown (which makes this
            // unreachable) is queued before, so this cannot fail for space.
            let _ = session.tx.try_send(Ok(welcome));
            count
        })
        .map_err(|_| SessionError::ClosedBeforeHello)?;
    authority.metrics().connectors_connected.inc();
    if let Some(old) = old {
        authority.replace_session(&identity.name, old);
    }
    authority.registry().estimate_one(
        &authority.snapshot(),
        &identity.name,
        authority.on_access().count(&identity.name),
        SystemTime::now(),
    );
    authority.bump();
    Ok(())
}

/// Handles one message of a live session. The message is borrowed
/// (what the intake keeps is moved out of it): a scanned report's
/// entries are worked on where the scan put them, not copied from
/// frame to frame.
fn handle(
    authority: &Authority,
    identity: &Identity,
    state: &PolicyState,
    message: &mut Inbound<'_>,
    now: Instant,
    wall: SystemTime,
    seen_ms: &mut SeenMs,
) {
    let kind = match message {
        Inbound::Scanned(report) => {
            seen(authority, identity, wall, seen_ms);
            let full_state = report.full_state;
            intake::reports::intake_entries(
                authority,
                identity,
                state,
                Intake {
                    full_state,
                    rejected: 0,
                },
                report.entries.iter_mut(),
                now,
                wall,
            );
            if full_state {
                authority.warmup().full_state(&identity.name);
            }
            return;
        }
        Inbound::Decoded(message) => message.kind.take(),
    };
    match kind {
        Some(In::Report(report)) => {
            seen(authority, identity, wall, seen_ms);
            let full_state = report.full_state;
            intake::reports::intake(authority, identity, state, report, now, wall);
            // Only once it is in the table: readiness may follow.
            if full_state {
                authority.warmup().full_state(&identity.name);
            }
        }
        Some(In::Heartbeat(hb)) => {
            // Only the sender's load changed: its estimate alone is
            // recomputed (housekeeping refreshes every connector's).
            let live = authority.on_access().count(&identity.name);
            authority
                .registry()
                .heartbeat(&authority.snapshot(), &identity.name, wall, hb, live);
            authority.log_connector(&identity.name, "heartbeat", None);
        }
        Some(In::Pong(_)) => seen(authority, identity, wall, seen_ms),
        Some(In::Drain(d)) => {
            seen(authority, identity, wall, seen_ms);
            access::drain::self_drain(authority, &identity.name, d.drain_ms);
            authority.log_connector(&identity.name, "drained", None);
        }
        Some(In::Hello(_)) => {
            seen(authority, identity, wall, seen_ms);
            tracing::warn!(connector = %identity.name, "ignoring a second Hello");
        }
        None => {
            seen(authority, identity, wall, seen_ms);
            tracing::debug!(connector = %identity.name, "ignoring an empty message");
        }
    }
}

/// Records that `identity` was heard from at `wall`. `last_seen` is
/// shown in milliseconds, so within the millisecond already written
/// (`seen_ms`) the registry is not locked again.
fn seen(authority: &Authority, identity: &Identity, wall: SystemTime, seen_ms: &mut SeenMs) {
    // A batch of messages shares one receive time: compared first.
    if seen_ms.wall == Some(wall) {
        return;
    }
    seen_ms.wall = Some(wall);
    let ms = wall
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    if seen_ms.ms == Some(ms) {
        return;
    }
    seen_ms.ms = Some(ms);
    authority.registry().seen(&identity.name, wall);
}

/// Ends session `id` of `name` if it is still the live one (a replaced
/// session was already closed by its replacement).
fn end_session(authority: &Authority, name: &str, id: u64, reason: &str) {
    if let Some(session) = authority.registry().end(name, id) {
        authority.close_session(name, session, reason);
    }
}

/// One inbound message of a live session.
enum Inbound<'a> {
    /// A health report read from its bytes (`protocol::scan`).
    Scanned(ScannedReport<'a>),
    /// Any other message, decoded with prost.
    Decoded(v1::ConnectorMessage),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_budget_counts_entries_and_says_when_to_retry() {
        let t0 = Instant::now();
        let mut b = EntryBudget::new(100, 50, t0);
        assert_eq!(b.take(30, false, t0), Ok(()));
        // 20 left: 30 more need 100 ms at 100/s.
        assert_eq!(b.take(30, false, t0), Err(Duration::from_millis(100)));
        assert_eq!(b.take(30, false, t0 + Duration::from_millis(100)), Ok(()));
        // A report larger than the burst is taken from a full bucket.
        assert!(b.take(80, false, t0 + Duration::from_millis(200)).is_err());
        assert_eq!(b.take(80, false, t0 + Duration::from_millis(600)), Ok(()));
        // A full-state report is always taken, leaving at most a burst of debt.
        assert_eq!(
            b.take(10_000, true, t0 + Duration::from_millis(600)),
            Ok(())
        );
        assert_eq!(
            b.take(1, false, t0 + Duration::from_millis(600)),
            Err(Duration::from_millis(510))
        );
    }

    #[test]
    fn a_refused_application_sent_before_the_retry_time_is_early() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let (a, b) = (
            app_id("s", "a.example", "tcp", 80),
            app_id("s", "b.example", "tcp", 80),
        );
        assert_ne!(a, app_id("s", "a.example", "udp", 80));
        let mut budget = EntryBudget::new(100, 50, t0);
        assert!(!budget.early(t0, &[a]));
        budget.refused = Some(Refusal {
            at: t0,
            until: t0 + ms(300),
            apps: [a].into(),
        });
        // The refused report's own receive batch is not early, nor is a
        // report received within the refusal's flight.
        assert!(!budget.early(t0, &[a]));
        assert!(!budget.early(t0 + IN_FLIGHT, &[a]));
        // Another application's report.
        assert!(!budget.early(t0 + ms(101), &[b]));
        assert!(budget.early(t0 + ms(101), &[b, a]));
        assert!(budget.early(t0 + ms(299), &[a]));
        assert!(!budget.early(t0 + ms(300), &[a]));
        assert!(
            !budget.early(t0 + ms(150), &[a]),
            "a wait that passed is forgotten"
        );
    }

    /// A connector that sends a refused report again at once, over and
    /// over, is refused each time within the first refusal's flight; the
    /// chain keeps its start, so the resends past the flight are early.
    #[test]
    fn resending_at_once_again_and_again_is_early_past_the_flight() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let a = app_id("s", "a.example", "tcp", 80);
        let mut budget = EntryBudget::new(10, 3, t0);
        assert_eq!(budget.take(3, false, t0), Ok(()));
        let mut early = 0;
        for i in 1..=250 {
            let now = t0 + ms(i);
            if budget.awaits_retry(now) && budget.early(now, &[a]) {
                early += 1;
            }
            match budget.take(3, false, now) {
                Ok(()) => break,
                Err(wait) => budget.refuse(now, wait, vec![a]),
            }
        }
        assert!(early > 100, "{early} resends counted early");
        // One refusal, and the report sent again after its wait: not early.
        let t1 = t0 + ms(10_000);
        let mut budget = EntryBudget::new(10, 3, t1);
        assert_eq!(budget.take(3, false, t1), Ok(()));
        let Err(wait) = budget.take(3, false, t1) else {
            panic!("an empty bucket took a report");
        };
        budget.refuse(t1, wait, vec![a]);
        assert!(!budget.early(t1 + wait, &[a]));
    }

    #[test]
    fn a_check_time_is_the_receive_time_minus_the_reported_age() {
        let now = Instant::now();
        let at = crate::state::health::checked_at(now, Duration::from_millis(1500));
        assert_eq!(
            now.saturating_duration_since(at),
            Duration::from_millis(1500)
        );
        // An absurd age never panics and is never fresh.
        let at = crate::state::health::checked_at(now, Duration::from_millis(u64::MAX));
        assert!(now.saturating_duration_since(at) >= Duration::from_secs(3600));
    }
}
