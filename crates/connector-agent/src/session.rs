//! A session with one CA replica (see [`crate::attach`] for how the
//! connector holds one per replica): one `Connect` stream at a time over mutual TLS
//! with the enrolled certificate (or, only against a CA run with
//! `[tls] enabled = false`, plain text with the provisioning key in
//! metadata); Hello first, Welcome/PolicyUpdate applied, access events and
//! pings answered, health reports (batched and paced by the [`Outbox`],
//! re-sent when the CA answers `FlowControl`) and heartbeats sent, and on any
//! disconnect a reconnect with exponential backoff and full jitter while
//! checks go on. A renewed certificate (from [`crate::renewal`]) moves the
//! session over: a new session with it is opened first, the old one closed
//! once the CA welcomed the new one (the CA replaces a connector's session
//! with its newer one), and the checks never stop.
//!
//! Every session subscribes to the one scheduler when it is welcomed (its
//! full state first, then every report) and has its own [`Outbox`], since
//! each replica flow-controls its own session. Its assignment goes to
//! [`crate::follow`], which decides whether it is the one in force; access
//! events from any session are honoured.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use policy::{AppKey, ApplicationReport, Segment};
use protocol::v1::authority_message::Kind as FromCa;
use protocol::v1::connector_message::Kind as ToCa;
use protocol::v1::{self, AuthorityMessage};
use rand::RngExt;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::metadata::MetadataValue;
use tonic::transport::Endpoint;

use crate::attach::CaTarget;
use crate::config::Ceilings;
use crate::enroll::{Enrollment, ProvisioningKey};
use crate::follow::Assignments;
use crate::metrics::Metrics;
use crate::outbox::{BATCH_WINDOW, Outbox};
use crate::pacer::Pacer;
use crate::probe::Prober;
use crate::schedule::Scheduler;
use crate::schedule::{AppReport, DEFAULT_WINDOW};

/// First reconnect delay (before jitter).
pub const BACKOFF_MIN: Duration = Duration::from_millis(500);
/// Longest reconnect delay (before jitter).
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Longest reconnect delay (before jitter) to one of several CA replicas:
/// a replica that restarts must have every connector back within seconds
/// (its table is whole within two report intervals), and retrying one
/// address of several every few seconds costs little.
pub const REPLICA_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// Default heartbeat interval when the CA sends none.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(5);
/// How long the CA has to send its Welcome.
const WELCOME_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a session ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The CA could not be reached.
    #[error("cannot connect to the CA: {}", error_chain(.0))]
    Connect(#[from] tonic::transport::Error),
    /// The CA refused or ended the stream with an error.
    #[error("the CA ended the session: {0}")]
    Rpc(#[from] tonic::Status),
    /// The CA broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The CA closed the stream.
    #[error("the CA closed the stream")]
    Closed,
    /// The certificate was renewed: the session moves onto the new one
    /// (already open when the move succeeded).
    #[error("moving to a renewed certificate")]
    Renewed(Box<Handover>),
    /// The CA asked the connector to leave.
    #[error("the CA asked to end the session: {reason}")]
    Shutdown {
        /// The CA's reason.
        reason: String,
        /// Wait at least this long.
        retry_after: Duration,
        /// Another CA address, if any.
        reconnect_to: Option<String>,
    },
}

/// A session opened on a renewed certificate while the old one still ran.
#[derive(Debug)]
pub struct Handover {
    /// The renewed credentials.
    pub enrollment: Enrollment,
    /// The new session, welcomed, if it could be opened (else the next
    /// session opens with the new credentials as usual).
    opened: Option<Opened>,
}

/// An open session: outbound queue, inbound stream, the CA's Welcome.
type Opened = (
    mpsc::Sender<Encoded>,
    Streaming<AuthorityMessage>,
    v1::Welcome,
);

/// An error with its sources (tonic's transport errors say only
/// "transport error" at the top).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

/// The backoff before reconnect attempt `attempt` (0-based), before jitter:
/// 0.5 s doubling to 30 s.
pub fn backoff_cap(attempt: u32) -> Duration {
    BACKOFF_MIN
        .saturating_mul(2u32.saturating_pow(attempt.min(16)))
        .min(BACKOFF_MAX)
}

/// Full jitter: a uniformly random delay up to the cap.
pub fn backoff(attempt: u32, rng: &mut impl rand::Rng) -> Duration {
    backoff_within(attempt, BACKOFF_MAX, rng)
}

/// Full jitter up to the cap, the cap held to `max`.
pub fn backoff_within(attempt: u32, max: Duration, rng: &mut impl rand::Rng) -> Duration {
    let cap = u64::try_from(backoff_cap(attempt).min(max).as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rng.random_range(0..=cap))
}

/// Who the connector is: the name and group its `Hello` states (and, with
/// TLS, its certificate already proves).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Connector name, unique in the deployment.
    pub name: String,
    /// Connector group.
    pub group: String,
}

/// How a session proves the connector's identity to the CA.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// Mutual TLS with the client certificate from `Enrollment.Enroll`: the
    /// normal case, an `https://` CA.
    Certificate(Enrollment),
    /// The group's provisioning key in `x-reach-provisioning-key` metadata
    /// on every session, over plain text: only a CA run with
    /// `[tls] enabled = false` (local experiments) accepts it.
    ProvisioningKey(ProvisioningKey),
}

/// What a session needs besides the CA's address: who the connector is,
/// how it proves it, and the connector's own check settings.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Name and group.
    pub identity: Identity,
    /// Certificate or (plain text only) provisioning key.
    pub credentials: Credentials,
    /// The connector's own rate limit: announced in `Hello`, and in force
    /// whenever the CA's `ConnectorSettings` leave it at 0.
    pub checks_per_second: u32,
    /// The connector's own probe timeout, in force whenever the CA's
    /// `ConnectorSettings` leave it at 0.
    pub check_timeout: Duration,
    /// Renewed certificates, when a renewal task runs: each one replaces
    /// `credentials` and the session moves onto it.
    pub renewals: Option<watch::Receiver<Enrollment>>,
    /// The most the CA may ask for (`--max-checks-per-second`,
    /// `--max-check-timeout-ms`).
    pub ceilings: Ceilings,
    /// Longest reconnect backoff: [`BACKOFF_MAX`], or
    /// [`REPLICA_BACKOFF_MAX`] for one of several replicas.
    pub reconnect_max: Duration,
}

/// Everything the sessions drive.
#[derive(Clone, Debug)]
pub struct Parts {
    /// The scheduler.
    pub scheduler: Scheduler,
    /// The pacer (rate overrides, load).
    pub pacer: Pacer,
    /// The prober (timeout overrides, ICMP capability).
    pub prober: Arc<Prober>,
    /// Metrics.
    pub metrics: Metrics,
    /// The resolver (the group's `dns_resolution`).
    pub resolver: crate::resolver::Resolver,
    /// Every session's assignment and which one is in force.
    pub assignments: Arc<Assignments>,
}

/// Session ids for [`Assignments`]: one per session, kept across a move to
/// a renewed certificate (the same replica, still connected).
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Keeps a session with the CA replica `target` until `shutdown` turns
/// true; `lost` is notified whenever the session ends otherwise (the
/// replicas' names are resolved again).
pub async fn run(
    target: CaTarget,
    options: SessionOptions,
    parts: Parts,
    mut shutdown: watch::Receiver<bool>,
    lost: Arc<Notify>,
) {
    let mut target = target;
    let mut attempt = 0u32;
    let mut options = options;
    let mut renewals = options.renewals.take();
    let mut handover: Option<Opened> = None;
    let mut id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    loop {
        if handover.is_none() {
            // A certificate renewed while no session ran: connect with it
            // (the old one may be revoked or expired by now).
            if let Some(rx) = renewals.as_mut()
                && rx.has_changed().unwrap_or(false)
            {
                options.credentials = Credentials::Certificate(rx.borrow_and_update().clone());
            }
        }
        let mut stop = shutdown.clone();
        let ended = tokio::select! {
            ended = session(&target, id, &options, &parts, &mut attempt, &mut stop, renewals.as_mut(), handover.take()) => ended,
            () = stopped(&mut shutdown) => {
                parts.assignments.left(id, &options, &parts).await;
                return;
            }
        };
        if !matches!(ended, Err(SessionError::Renewed(_))) {
            // The replica's assignment no longer counts; a reconnect is a
            // new session (connected for the shortest time).
            parts.assignments.left(id, &options, &parts).await;
            id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let mut delay = backoff_within(attempt, options.reconnect_max, &mut rand::rng());
        attempt = attempt.saturating_add(1);
        match ended {
            Ok(()) => return,
            Err(SessionError::Renewed(next)) => {
                let Handover { enrollment, opened } = *next;
                tracing::info!(serial = %enrollment.serial, moved = opened.is_some(), "session moving to the renewed certificate");
                options.credentials = Credentials::Certificate(enrollment);
                handover = opened;
                attempt = 0;
                // No backoff: the new session is open, or opens now.
                continue;
            }
            Err(SessionError::Shutdown {
                reason,
                retry_after,
                reconnect_to,
            }) => {
                tracing::info!(%reason, retry_after_ms = retry_after.as_millis(), "the CA ended the session");
                if let Some(to) = reconnect_to {
                    match follow_reconnect(&to).and_then(|to| crate::attach::CaUrl::parse(&to).ok())
                    {
                        Some(to) => target = to.by_name(),
                        None => tracing::warn!(
                            reconnect_to = %to.escape_debug(),
                            "ignoring the CA's reconnect_to: only an https:// URL is followed"
                        ),
                    }
                }
                delay = delay.max(retry_after);
            }
            Err(e) => tracing::warn!(ca = %target.label(), error = %e, "session lost"),
        }
        lost.notify_one();
        tracing::info!(delay_ms = delay.as_millis(), ca = %target.label(), "reconnecting");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}

/// The address a `Shutdown.reconnect_to` may send the connector to: an
/// `https://` URL with a host and nothing else (no user info, path or
/// query). The session keeps its credentials, so the new CA is verified
/// against the same root certificate (`--ca-cert`) and must present a
/// server certificate that root issued for the new host: a CA can move its
/// connectors only within its own trust root, never to plain text or to a
/// server outside it.
pub fn follow_reconnect(to: &str) -> Option<String> {
    let uri: tonic::transport::Uri = to.parse().ok()?;
    let authority = uri.authority()?;
    let plain = uri.scheme_str() == Some("https")
        && !authority.as_str().contains('@')
        && !authority.host().is_empty()
        && matches!(uri.path(), "" | "/")
        && uri.query().is_none();
    plain.then(|| format!("https://{authority}"))
}

/// The CA's rate limit and probe timeout held to the local ceilings; a 0
/// from the CA means the connector's own value. Returns the effective pair
/// and whether anything was clamped.
pub fn effective_limits(
    ca_checks_per_second: u32,
    ca_check_timeout_ms: u32,
    options: &SessionOptions,
) -> (u32, Duration, bool) {
    let ceilings = options.ceilings;
    let rate = match ca_checks_per_second {
        0 => options.checks_per_second,
        n => n.min(ceilings.checks_per_second),
    };
    let timeout = match ca_check_timeout_ms {
        0 => options.check_timeout,
        ms => Duration::from_millis(u64::from(ms)).min(ceilings.check_timeout),
    };
    let clamped = ca_checks_per_second > ceilings.checks_per_second
        || Duration::from_millis(u64::from(ca_check_timeout_ms)) > ceilings.check_timeout;
    (rate, timeout, clamped)
}

/// Completes when the stop flag turns true (or its sender is gone).
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// One application's report as `policy` states it, sent at `now` (wall
/// clock, for display) and `sent` (monotonic: the check's age is measured
/// from `AppReport::checked` to it, so a re-sent result keeps its true age
/// whatever the clocks of connector and CA say); an expired application (no
/// round) is stamped with `now` and age zero.
pub fn application_report(
    report: &AppReport,
    now: SystemTime,
    sent: std::time::Instant,
) -> ApplicationReport {
    let (addresses, dns_error, at) = match &report.round {
        Some(round) => (
            round.addresses.clone(),
            round.dns_error.clone(),
            round.finished_at,
        ),
        None => (Vec::new(), None, now),
    };
    ApplicationReport {
        key: report.key.clone(),
        status: report.status,
        addresses,
        checked_at_unix_ms: unix_ms(at),
        dns_error,
        expired: report.expired,
        age: report
            .checked
            .map_or(Duration::ZERO, |at| sent.saturating_duration_since(at)),
        access_id: report.access_id.clone(),
    }
}

/// The wire form of one application's report, sent now.
pub fn to_wire(report: &AppReport) -> v1::ApplicationHealth {
    application_report(report, SystemTime::now(), Instant::now().into_std()).into()
}

/// An encoded `ConnectorMessage` for the `Connect` stream
/// ([`crate::wire::RawCodec`]).
type Encoded = Vec<u8>;

/// The earlier of two optional instants.
fn earliest(
    a: Option<std::time::Instant>,
    b: Option<std::time::Instant>,
) -> Option<std::time::Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Completes at `at`, or never.
async fn sleep_until(at: Option<std::time::Instant>) {
    match at {
        // Due already (a result a user waits for): at once. tokio's timer
        // rounds a deadline up to its next millisecond tick, so a sleep
        // until "now" held that result up to a millisecond longer.
        Some(at) if at <= std::time::Instant::now() => {}
        Some(at) => tokio::time::sleep_until(Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

fn metadata(
    value: &str,
    field: &str,
) -> Result<MetadataValue<tonic::metadata::Ascii>, SessionError> {
    MetadataValue::try_from(value)
        .map_err(|_| SessionError::Protocol(format!("{field} is not valid in gRPC metadata")))
}

/// Segments from the wire; an invalid one is logged and skipped, never
/// fatal.
pub(crate) fn segments(wire: Vec<v1::Segment>) -> Vec<Segment> {
    wire.into_iter()
        .filter_map(|s| match Segment::try_from(s) {
            Ok(segment) => Some(segment),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring an invalid segment from the CA");
                None
            }
        })
        .collect()
}

/// The heartbeat interval a session's `ConnectorSettings` ask for (each
/// replica's own).
fn heartbeat_interval(settings: Option<&v1::ConnectorSettings>) -> Duration {
    match settings.map_or(0, |s| s.heartbeat_interval_ms) {
        0 => DEFAULT_HEARTBEAT,
        ms => Duration::from_millis(ms.max(100)),
    }
}

/// Applies the followed assignment's `ConnectorSettings` (rate and probe
/// timeout, held to the ceilings); returns the on-access window.
pub(crate) fn apply_settings(
    settings: Option<&v1::ConnectorSettings>,
    options: &SessionOptions,
    parts: &Parts,
) -> Duration {
    let s = settings.cloned().unwrap_or_default();
    let window = match s.on_access_window_ms {
        0 => DEFAULT_WINDOW,
        ms => Duration::from_millis(ms),
    };
    let (rate, timeout, clamped) =
        effective_limits(s.checks_per_second, s.check_timeout_ms, options);
    if clamped {
        tracing::warn!(
            ca_checks_per_second = s.checks_per_second,
            ca_check_timeout_ms = s.check_timeout_ms,
            checks_per_second = rate,
            check_timeout_ms = timeout.as_millis(),
            "the CA asks for more than --max-checks-per-second / --max-check-timeout-ms allow; clamped"
        );
    }
    // The heartbeat's `rate_limit` and the metrics read the pacer, so they
    // show the effective (clamped) rate.
    parts.pacer.set_rate(rate);
    parts.prober.set_timeout(timeout);
    parts
        .resolver
        .set_dns_resolution(protocol::convert::dns_resolution_from_wire(
            s.dns_resolution,
        ));
    window
}

async fn send(out: &mpsc::Sender<Encoded>, kind: ToCa) -> Result<(), SessionError> {
    out.send(crate::wire::encode(kind))
        .await
        .map_err(|_| SessionError::Closed)
}

/// One session: open the stream, wait for Welcome, send the full state,
/// then the message loop. `Ok(())` only when `shutdown` asked to stop.
#[allow(clippy::too_many_arguments)] // the session's state lives in `run`, which owns it across sessions
async fn session(
    target: &CaTarget,
    id: u64,
    options: &SessionOptions,
    parts: &Parts,
    attempt: &mut u32,
    shutdown: &mut watch::Receiver<bool>,
    mut renewals: Option<&mut watch::Receiver<Enrollment>>,
    opened: Option<Opened>,
) -> Result<(), SessionError> {
    let (out, mut inbound, welcome) = match opened {
        Some(o) => o,
        None => {
            let (out, mut inbound) = open(target, options, parts).await?;
            let welcome = expect_welcome(&mut inbound).await?;
            (out, inbound, welcome)
        }
    };
    *attempt = 0;
    parts.metrics.sessions.inc();
    tracing::info!(ca = %target.label(), session = %welcome.session_id, segments = welcome.segments.len(), "connected to the CA");
    let mut heartbeat = heartbeat_interval(welcome.settings.as_ref());
    let mut outbox = Outbox::new();
    outbox.set_limits(&welcome.settings.unwrap_or_default(), now());
    parts
        .assignments
        .assigned(id, welcome.segments, welcome.settings, options, parts)
        .await;

    // The full state, then every later report (the same ones every other
    // replica's session gets).
    let (state, inbox) = parts.scheduler.subscribe().await;
    let full = outbox.full_state(state, now(), SystemTime::now());
    out.send(full.encode())
        .await
        .map_err(|_| SessionError::Closed)?;

    let mut ticker = tokio::time::interval(heartbeat);
    let mut rate = RateMeter::new(parts.pacer.stats().started);
    loop {
        // The inbox wakes this task only when its results start to wait,
        // are awaited or make a full report (not for every round the
        // scheduler finishes); they reach the outbox when due.
        inbox.wake_at(outbox.room());
        let due = earliest(outbox.next_send(), inbox.due(BATCH_WINDOW));
        tokio::select! {
            message = inbound.message() => {
                let Some(message) = message? else {
                    return Err(SessionError::Closed);
                };
                if let Some(beat) = handle(message, id, options, parts, &out, &mut outbox).await?
                    && beat != heartbeat
                {
                    heartbeat = beat;
                    ticker = tokio::time::interval(heartbeat);
                }
            }
            () = inbox.changed() => {
                if inbox.is_finished() {
                    return Ok(());
                }
            }
            () = sleep_until(due) => {
                if let Some((batch, first)) = inbox.take() {
                    outbox.push(batch, first);
                }
                while let Some(report) = outbox.take(now(), SystemTime::now()) {
                    out.send(report.encode()).await.map_err(|_| SessionError::Closed)?;
                }
            }
            _ = ticker.tick() => {
                send(&out, ToCa::Heartbeat(heartbeat_message(parts, id, &mut rate))).await?;
            }
            () = renewed(renewals.as_deref_mut()) => {
                let enrollment = match renewals.as_deref_mut() {
                    Some(rx) => rx.borrow_and_update().clone(),
                    None => continue,
                };
                return Err(SessionError::Renewed(Box::new(move_to(target, options, parts, enrollment).await)));
            }
            () = stopped(shutdown) => {
                // Ending the outbound stream closes the session cleanly.
                drop(out);
                return Ok(());
            }
        }
    }
}

/// Completes when a renewed certificate arrives (never without a renewal
/// task, or once it ended).
async fn renewed(renewals: Option<&mut watch::Receiver<Enrollment>>) {
    if let Some(rx) = renewals
        && rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Opens and welcomes a session with the renewed `enrollment` while the
/// current one still runs; the caller then drops the current one.
async fn move_to(
    target: &CaTarget,
    options: &SessionOptions,
    parts: &Parts,
    enrollment: Enrollment,
) -> Handover {
    let mut next = options.clone();
    next.renewals = None;
    next.credentials = Credentials::Certificate(enrollment.clone());
    let opened = async {
        let (out, mut inbound) = open(target, &next, parts).await?;
        let welcome = expect_welcome(&mut inbound).await?;
        Ok::<_, SessionError>((out, inbound, welcome))
    }
    .await;
    match opened {
        Ok(o) => Handover {
            enrollment,
            opened: Some(o),
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot open a session with the renewed certificate yet; reconnecting with it");
            Handover {
                enrollment,
                opened: None,
            }
        }
    }
}

/// Connects to the CA (mutual TLS with the enrolled certificate, or plain
/// text with the provisioning key in metadata), queues `Hello` and opens
/// the `Connect` stream: the outbound queue and the inbound stream.
async fn open(
    target: &CaTarget,
    options: &SessionOptions,
    parts: &Parts,
) -> Result<(mpsc::Sender<Encoded>, Streaming<AuthorityMessage>), SessionError> {
    let tls = match &options.credentials {
        Credentials::Certificate(enrollment) => Some(enrollment.tls()),
        Credentials::ProvisioningKey(_) => None,
    };
    let endpoint: Endpoint = target
        .endpoint(tls)
        .map_err(SessionError::Protocol)?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10));
    let channel = endpoint.connect().await?;
    // The generated client's `connect`, with a codec that sends messages
    // already encoded (reports share their entries' encodings across
    // replicas: `crate::wire`).
    let mut client = tonic::client::Grpc::new(channel)
        .max_decoding_message_size(protocol::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(protocol::MAX_MESSAGE_BYTES);
    let (out, rx) = mpsc::channel::<Encoded>(64);
    send(&out, ToCa::Hello(hello(options, parts))).await?;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    let identity = &options.identity;
    let md = request.metadata_mut();
    md.insert(
        protocol::metadata::CONNECTOR,
        metadata(&identity.name, "the name")?,
    );
    md.insert(
        protocol::metadata::GROUP,
        metadata(&identity.group, "the group")?,
    );
    if let Credentials::ProvisioningKey(key) = &options.credentials {
        md.insert(
            protocol::metadata::PROVISIONING_KEY,
            metadata(key.expose(), "the provisioning key")?,
        );
    }
    client
        .ready()
        .await
        .map_err(|e| tonic::Status::unknown(format!("Service was not ready: {e}")))?;
    request.extensions_mut().insert(tonic::GrpcMethod::new(
        "reach.v1.ConnectorSession",
        "Connect",
    ));
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/reach.v1.ConnectorSession/Connect");
    let inbound = client
        .streaming(request, path, crate::wire::RawCodec)
        .await?
        .into_inner();
    Ok((out, inbound))
}

/// The connector's `Hello`: its identity, version and what it can do.
fn hello(options: &SessionOptions, parts: &Parts) -> v1::Hello {
    let icmp = parts.prober.icmp_mode();
    v1::Hello {
        name: options.identity.name.clone(),
        group: options.identity.group.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        capabilities: Some(v1::Capabilities {
            icmp: icmp != crate::probe::IcmpMode::None,
            icmp_mode: icmp.as_str().to_owned(),
            checks_per_second: options.checks_per_second,
        }),
    }
}

/// The CA's first message, which must be a `Welcome` within
/// `WELCOME_TIMEOUT`.
async fn expect_welcome(
    inbound: &mut Streaming<AuthorityMessage>,
) -> Result<v1::Welcome, SessionError> {
    let first = tokio::time::timeout(WELCOME_TIMEOUT, inbound.message())
        .await
        .map_err(|_| SessionError::Protocol("no Welcome within 10 s".into()))??;
    match first {
        Some(AuthorityMessage {
            kind: Some(FromCa::Welcome(w)),
        }) => Ok(w),
        Some(_) => Err(SessionError::Protocol(
            "first message is not a Welcome".into(),
        )),
        None => Err(SessionError::Closed),
    }
}

/// Acts on one message from the CA after `Welcome`. Returns the heartbeat
/// interval a `PolicyUpdate` set; a `Shutdown` ends the session as an
/// error that carries the CA's reason and retry hint.
async fn handle(
    message: AuthorityMessage,
    id: u64,
    options: &SessionOptions,
    parts: &Parts,
    out: &mpsc::Sender<Encoded>,
    outbox: &mut Outbox,
) -> Result<Option<Duration>, SessionError> {
    match message.kind {
        Some(FromCa::PolicyUpdate(update)) => {
            let beat = heartbeat_interval(update.settings.as_ref());
            outbox.set_limits(&update.settings.unwrap_or_default(), now());
            parts
                .assignments
                .assigned(id, update.segments, update.settings, options, parts)
                .await;
            tracing::info!("policy updated");
            return Ok(Some(beat));
        }
        Some(FromCa::Access(event)) => match event.app.map(AppKey::try_from) {
            // An over-long id is not echoed (the CA would refuse the entry).
            Some(Ok(key)) => parts.scheduler.access_with_id(
                key,
                Duration::from_millis(event.accessed_ms_ago),
                (!event.access_id.is_empty()
                    && event.access_id.len() <= policy::report::MAX_ACCESS_ID_BYTES)
                    .then_some(event.access_id),
            ),
            Some(Err(e)) => tracing::warn!(error = %e, "ignoring an invalid access event"),
            None => tracing::warn!("ignoring an access event without application"),
        },
        Some(FromCa::Ping(ping)) => {
            send(out, ToCa::Pong(v1::Pong { nonce: ping.nonce })).await?;
        }
        Some(FromCa::Shutdown(s)) => {
            return Err(SessionError::Shutdown {
                reason: s.reason,
                retry_after: Duration::from_millis(s.retry_after_ms),
                reconnect_to: (!s.reconnect_to.is_empty()).then_some(s.reconnect_to),
            });
        }
        Some(FromCa::FlowControl(fc)) => {
            let retry = Duration::from_millis(fc.retry_after_ms);
            let again = outbox.refused(fc.sequence, retry, now());
            parts.metrics.reports_deferred.inc();
            tracing::debug!(
                sequence = fc.sequence,
                retry_after_ms = fc.retry_after_ms,
                again,
                "the CA deferred a report; its results wait to be sent again"
            );
        }
        Some(FromCa::Welcome(_)) => tracing::warn!("ignoring a second Welcome"),
        None => tracing::warn!("ignoring an empty message from the CA"),
    }
    Ok(None)
}

/// The monotonic clock the outbox runs on (tokio's, so paused-time tests
/// drive it).
fn now() -> std::time::Instant {
    Instant::now().into_std()
}

/// The check rate the heartbeat reports: checks started since the last
/// measurement over the time since then.
struct RateMeter {
    since: Instant,
    started: u64,
}

impl RateMeter {
    fn new(started: u64) -> Self {
        RateMeter {
            since: Instant::now(),
            started,
        }
    }

    /// Checks per second since the last measurement. The heartbeat
    /// interval's first tick fires at once: a rate measured over a few
    /// milliseconds would be noise (one start in 1 ms reads as 1,000/s), so
    /// it measures over at least half a second and keeps the window open
    /// until then (0 before).
    fn measure(&mut self, started: u64) -> f64 {
        let elapsed = self.since.elapsed().as_secs_f64();
        if elapsed < 0.5 {
            return 0.0;
        }
        let rate = started.saturating_sub(self.started) as f64 / elapsed;
        *self = RateMeter::new(started);
        rate
    }
}

/// The heartbeat: the scheduler's load and the pacer's figures.
fn heartbeat_message(parts: &Parts, id: u64, rate: &mut RateMeter) -> v1::Heartbeat {
    let stats = parts.pacer.stats();
    let load = parts.scheduler.load();
    v1::Heartbeat {
        load: Some(v1::CheckLoad {
            targets: load.targets,
            checks_per_cycle: load.checks_per_cycle,
            cycle_seconds: load.cycle.as_secs_f64(),
            queue_depth: stats.queue_depth,
            checks_per_second: rate.measure(stats.started),
            in_flight: stats.in_flight,
            rate_limit: stats.rate,
        }),
        replicas: Some(parts.assignments.view(id)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_half_a_second_to_thirty() {
        let caps: Vec<u64> = (0..10).map(|a| backoff_cap(a).as_millis() as u64).collect();
        assert_eq!(
            caps,
            [
                500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000
            ]
        );
        assert_eq!(backoff_cap(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn options_never_print_the_provisioning_key() {
        let options = SessionOptions {
            identity: Identity {
                name: "c1".into(),
                group: "g".into(),
            },
            credentials: Credentials::ProvisioningKey(ProvisioningKey::new("s3cret-key")),
            checks_per_second: 20,
            check_timeout: Duration::from_secs(1),
            renewals: None,
            ceilings: Ceilings::default(),
            reconnect_max: BACKOFF_MAX,
        };
        let printed = format!("{options:?}");
        assert!(printed.contains("c1"), "{printed}");
        assert!(!printed.contains("s3cret-key"), "{printed}");
    }

    fn options(rate: u32, timeout_ms: u64, max_rate: u32, max_timeout_ms: u64) -> SessionOptions {
        SessionOptions {
            identity: Identity {
                name: "c1".into(),
                group: "g".into(),
            },
            credentials: Credentials::ProvisioningKey(ProvisioningKey::new("k")),
            checks_per_second: rate,
            check_timeout: Duration::from_millis(timeout_ms),
            renewals: None,
            ceilings: Ceilings {
                checks_per_second: max_rate,
                check_timeout: Duration::from_millis(max_timeout_ms),
            },
            reconnect_max: BACKOFF_MAX,
        }
    }

    #[test]
    fn the_cas_rate_and_timeout_are_held_to_the_local_ceilings() {
        let o = options(10, 1000, 20, 5000);
        // A CA asking for a fast scan gets the ceiling.
        assert_eq!(
            effective_limits(10_000, 60_000, &o),
            (20, Duration::from_secs(5), true)
        );
        // Within the ceilings the CA's values hold.
        assert_eq!(
            effective_limits(15, 2000, &o),
            (15, Duration::from_secs(2), false)
        );
        // 0 means the connector's own.
        assert_eq!(
            effective_limits(0, 0, &o),
            (10, Duration::from_secs(1), false)
        );
    }

    #[test]
    fn reconnect_to_is_followed_only_as_https() {
        assert_eq!(
            follow_reconnect("https://ca2.example:7443").as_deref(),
            Some("https://ca2.example:7443")
        );
        assert_eq!(
            follow_reconnect("https://ca2.example:7443/").as_deref(),
            Some("https://ca2.example:7443")
        );
        for refused in [
            "http://ca2.example:7443",
            "ca2.example:7443",
            "https://user@ca2.example:7443",
            "https://ca2.example:7443/elsewhere",
            "https://ca2.example:7443/?x=1",
            "unix:///tmp/sock",
            "",
        ] {
            assert_eq!(follow_reconnect(refused), None, "{refused}");
        }
    }

    #[test]
    fn jitter_stays_within_the_cap() {
        let mut rng = rand::rng();
        for attempt in 0..8 {
            for _ in 0..100 {
                assert!(backoff(attempt, &mut rng) <= backoff_cap(attempt));
            }
        }
    }
}
