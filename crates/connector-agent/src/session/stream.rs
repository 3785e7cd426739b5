//! A session with one CA replica (see [`crate::session::attach`] for how the
//! connector holds one per replica): one `Connect` stream at a time over mutual TLS
//! with the enrolled certificate (or, only against a CA run with
//! `[tls] enabled = false`, plain text with the provisioning key in
//! metadata); Hello first, Welcome/PolicyUpdate applied, access events and
//! pings answered, health reports (batched and paced by the [`Outbox`],
//! re-sent when the CA answers `FlowControl`) and heartbeats sent, and on any
//! disconnect a reconnect with exponential backoff and full jitter while
//! checks go on. A renewed certificate (from [`crate::ca::renewal`]) moves the
//! session over: a new session with it is opened first, the old one closed
//! once the CA welcomed the new one (the CA replaces a connector's session
//! with its newer one), and the checks never stop.
//!
//! Every session subscribes to the one scheduler when it is welcomed (its
//! full state first, then every report) and has its own [`Outbox`], since
//! each replica flow-controls its own session. Its assignment goes to
//! [`crate::session::follow`], which decides whether it is the one in force; access
//! events from any session are honoured.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use policy::AppKey;
use protocol::v1::authority_message::Kind as FromCa;
use protocol::v1::connector_message::Kind as ToCa;
use protocol::v1::{self, AuthorityMessage};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::metadata::MetadataValue;
use tonic::transport::Endpoint;

use crate::ca::dial::{CaTarget, CaUrl};
use crate::ca::enroll::Enrollment;
use crate::ca::traffic::{CountingConnector, Traffic};
use crate::retry::{backoff_within, error_chain, stopped};
use crate::schedule::inbox::Inbox;
use crate::send::outbox::{BATCH_WINDOW, Outbox};
use crate::session::options::{Credentials, Parts, SessionOptions};
use crate::session::status::StatusMeter;

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

/// An open session: outbound queue, inbound stream, the CA's Welcome, the
/// bytes its connection carried.
type Opened = (
    mpsc::Sender<Encoded>,
    Streaming<AuthorityMessage>,
    v1::Welcome,
    Traffic,
);

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
    let mut refused = 0u32;
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
                parts.left(id, &options).await;
                return;
            }
        };
        if !matches!(ended, Err(SessionError::Renewed(_))) {
            // The replica's assignment no longer counts; a reconnect is a
            // new session (connected for the shortest time).
            parts.left(id, &options).await;
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
                    match follow_reconnect(&to).and_then(|to| CaUrl::parse(&to).ok()) {
                        Some(to) => target = to.by_name(),
                        None => tracing::warn!(
                            reconnect_to = %to.escape_debug(),
                            "ignoring the CA's reconnect_to: only an https:// URL is followed"
                        ),
                    }
                }
                delay = delay.max(retry_after);
            }
            Err(e) => delay = delay.max(after_loss(&e, &target, &options, &mut refused)),
        }
        lost.notify_one();
        tracing::info!(delay_ms = delay.as_millis(), ca = %target.label(), "reconnecting");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stopped(&mut shutdown) => return,
        }
    }
}

/// Logs why a session was lost (for a refusal: what to do); the least
/// delay before reconnecting: minutes after a refusal that needs
/// re-enrollment, zero else (the usual backoff: a disabled connector is
/// back within it once enabled).
fn after_loss(
    e: &SessionError,
    target: &CaTarget,
    options: &SessionOptions,
    refused: &mut u32,
) -> Duration {
    let ca = target.label();
    match refusal(e) {
        Some(Refusal::Disabled(message)) => {
            *refused = 0;
            tracing::error!(
                %ca,
                reason = %message,
                "the CA disabled this connector; it reconnects on its own once an admin runs `central-authority api connectors enable {}`",
                options.identity.name
            );
            Duration::ZERO
        }
        Some(Refusal::Release(message)) => {
            let delay = crate::retry::refused_backoff(*refused, &mut rand::rng());
            *refused = refused.saturating_add(1);
            tracing::error!(
                %ca,
                reason = %message,
                retry_in_s = delay.as_secs(),
                "the CA refuses this connector's release ({}): upgrade the CA or this connector as the reason says; until then it asks again every few minutes; {}",
                protocol::release::RELEASE,
                build_info::hints::see(build_info::hints::RELEASE)
            );
            delay
        }
        Some(Refusal::Reenroll(message)) => {
            let delay = crate::retry::refused_backoff(*refused, &mut rand::rng());
            *refused = refused.saturating_add(1);
            tracing::error!(
                %ca,
                reason = %message,
                retry_in_s = delay.as_secs(),
                "re-enrollment needed: the CA no longer accepts this connector's certificate (revoked, or the connector was deleted). Run `connector-agent enroll` with the same flags and the group's provisioning key on this host, then start the connector again; the CA refuses a name that still holds a valid certificate until an admin runs `central-authority api connectors allow-reenroll {}`; {}",
                options.identity.name,
                build_info::hints::see(build_info::hints::REENROLL)
            );
            delay
        }
        None => {
            *refused = 0;
            let error = e.to_string();
            match crate::retry::tls_hint(&error, options.ca_cert.as_deref()) {
                Some(hint) => tracing::warn!(%ca, %error, %hint, "session lost"),
                None => tracing::warn!(%ca, %error, "session lost"),
            }
            Duration::ZERO
        }
    }
}

/// A refusal of the connector's credentials that retrying soon cannot
/// change, with the CA's message.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The certificate is revoked, expired or unknown to the CA (the
    /// connector was deleted): the connector must enroll again.
    Reenroll(String),
    /// An admin disabled the connector (`PERMISSION_DENIED`, "… is
    /// disabled").
    Disabled(String),
    /// The CA's compatibility policy refuses this connector's release
    /// (`FAILED_PRECONDITION` at `Hello`): too old or too new for it.
    Release(String),
}

/// Whether `e` is such a refusal: the CA's status code and the message its
/// `AuthError` gives (see `proto/reach/v1/connector.proto`, `Connect`).
pub fn refusal(e: &SessionError) -> Option<Refusal> {
    let SessionError::Rpc(status) = e else {
        return None;
    };
    let message = status.message().to_owned();
    match status.code() {
        tonic::Code::PermissionDenied if message.ends_with("is disabled") => {
            Some(Refusal::Disabled(message))
        }
        tonic::Code::FailedPrecondition => Some(Refusal::Release(message)),
        tonic::Code::Unauthenticated
            if message.contains("was revoked")
                || message.contains("has expired; enroll again")
                || message.contains("is not one this CA issued") =>
        {
            Some(Refusal::Reenroll(message))
        }
        _ => None,
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

/// An encoded `ConnectorMessage` for the `Connect` stream
/// ([`protocol::compose::RawCodec`]).
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

/// The heartbeat interval a session's `ConnectorSettings` ask for (each
/// replica's own).
fn heartbeat_interval(settings: Option<&v1::ConnectorSettings>) -> Duration {
    match settings.map_or(0, |s| s.heartbeat_interval_ms) {
        0 => DEFAULT_HEARTBEAT,
        ms => Duration::from_millis(ms.max(100)),
    }
}

async fn send(out: &mpsc::Sender<Encoded>, kind: ToCa) -> Result<(), SessionError> {
    out.send(crate::send::wire::encode(kind))
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
    renewals: Option<&mut watch::Receiver<Enrollment>>,
    opened: Option<Opened>,
) -> Result<(), SessionError> {
    let opened = match opened {
        Some(o) => o,
        None => {
            let (out, mut inbound, traffic) = open(target, options, parts).await?;
            let welcome = expect_welcome(&mut inbound).await?;
            (out, inbound, welcome, traffic)
        }
    };
    *attempt = 0;
    let live = welcomed(target, id, options, parts, opened).await?;
    exchange(target, id, options, parts, shutdown, renewals, live).await
}

/// A welcomed session: its streams, its outbox and inbox, its heartbeat
/// interval.
struct Live {
    out: mpsc::Sender<Encoded>,
    inbound: Streaming<AuthorityMessage>,
    outbox: Outbox,
    inbox: Inbox,
    heartbeat: Duration,
    /// Whether (and until when) the connector drains, as this session
    /// last told its CA replica.
    draining: watch::Receiver<Option<std::time::Instant>>,
    /// The bytes its connection carried.
    traffic: Traffic,
}

/// Takes in the CA's `Welcome` (its assignment and limits), subscribes to
/// the scheduler and sends the full state: every later report follows it
/// (the same ones every other replica's session gets).
async fn welcomed(
    target: &CaTarget,
    id: u64,
    options: &SessionOptions,
    parts: &Parts,
    (out, inbound, welcome, traffic): Opened,
) -> Result<Live, SessionError> {
    parts.metrics.sessions.inc();
    tracing::info!(ca = %target.label(), session = %welcome.session_id, segments = welcome.segments.len(), "connected to the CA");
    let heartbeat = heartbeat_interval(welcome.settings.as_ref());
    let mut outbox = Outbox::new();
    outbox.set_limits(&welcome.settings.unwrap_or_default(), now());
    parts
        .assigned(id, welcome.segments, welcome.settings, options)
        .await;
    let (state, inbox) = parts.scheduler.subscribe().await;
    let full = outbox.full_state(state, now(), SystemTime::now());
    out.send(full.encode())
        .await
        .map_err(|_| SessionError::Closed)?;
    // A session opened while the connector drains says so at once.
    let mut draining = parts.draining.clone();
    if let Some(drain) = drain_message(&mut draining) {
        send(&out, ToCa::Drain(drain)).await?;
    }
    Ok(Live {
        out,
        inbound,
        outbox,
        inbox,
        heartbeat,
        draining,
        traffic,
    })
}

/// The `Drain` to send when the connector has started draining since
/// `draining` was last read (the time left until it closes its sessions).
fn drain_message(draining: &mut watch::Receiver<Option<std::time::Instant>>) -> Option<v1::Drain> {
    let until = (*draining.borrow_and_update())?;
    let left = until.saturating_duration_since(now());
    tracing::info!(
        drain_ms = left.as_millis(),
        "telling the CA this connector drains"
    );
    Some(v1::Drain {
        drain_ms: u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
    })
}

/// The message loop of a welcomed session: the CA's messages, reports when
/// due, heartbeats, a renewed certificate, the stop flag.
async fn exchange(
    target: &CaTarget,
    id: u64,
    options: &SessionOptions,
    parts: &Parts,
    shutdown: &mut watch::Receiver<bool>,
    mut renewals: Option<&mut watch::Receiver<Enrollment>>,
    live: Live,
) -> Result<(), SessionError> {
    let Live {
        out,
        mut inbound,
        mut outbox,
        inbox,
        mut heartbeat,
        mut draining,
        traffic,
    } = live;
    let mut ticker = tokio::time::interval(heartbeat);
    let mut rate = RateMeter::new(parts.pacer.stats().started);
    let mut meter = StatusMeter::new();
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
                let beat = heartbeat_message(parts, id, &mut rate, &mut meter, &traffic);
                send(&out, ToCa::Heartbeat(beat)).await?;
            }
            Ok(()) = draining.changed() => {
                if let Some(drain) = drain_message(&mut draining) {
                    send(&out, ToCa::Drain(drain)).await?;
                }
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
        let (out, mut inbound, traffic) = open(target, &next, parts).await?;
        let welcome = expect_welcome(&mut inbound).await?;
        Ok::<_, SessionError>((out, inbound, welcome, traffic))
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
/// the `Connect` stream: the outbound queue, the inbound stream and the
/// connection's byte counts.
async fn open(
    target: &CaTarget,
    options: &SessionOptions,
    parts: &Parts,
) -> Result<(mpsc::Sender<Encoded>, Streaming<AuthorityMessage>, Traffic), SessionError> {
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
    let traffic = Traffic::default();
    let channel = endpoint
        .connect_with_connector(CountingConnector::new(traffic.clone()))
        .await?;
    // The generated client's `connect`, with a codec that sends messages
    // already encoded (reports share their entries' encodings across
    // replicas: `crate::send::wire`).
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
        .streaming(request, path, protocol::compose::RawCodec)
        .await?
        .into_inner();
    Ok((out, inbound, traffic))
}

/// The connector's `Hello`: its identity, version and what it can do.
fn hello(options: &SessionOptions, parts: &Parts) -> v1::Hello {
    let icmp = parts.prober.icmp_mode();
    v1::Hello {
        name: options.identity.name.clone(),
        group: options.identity.group.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        release: protocol::release::RELEASE.to_owned(),
        capabilities: Some(v1::Capabilities {
            icmp: icmp != crate::checks::probe::IcmpMode::None,
            icmp_mode: icmp.as_str().to_owned(),
            checks_per_second: options.checks_per_second,
            trust_bundle: true,
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
                .assigned(id, update.segments, update.settings, options)
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
        Some(FromCa::TrustBundle(bundle)) => trust_bundle(bundle, options),
        Some(FromCa::Welcome(_)) => tracing::warn!("ignoring a second Welcome"),
        None => tracing::warn!("ignoring an empty message from the CA"),
    }
    Ok(None)
}

/// Takes a trust bundle the CA sent (a session on a certificate only: the
/// roots it holds are trusted from now on and kept), and passes on its ask
/// to renew.
fn trust_bundle(bundle: v1::TrustBundle, options: &SessionOptions) {
    let Credentials::Certificate(enrollment) = &options.credentials else {
        return;
    };
    if let Err(e) = enrollment.trust.learn(&bundle.roots_pem) {
        tracing::warn!(error = %e, "ignoring the CA's trust bundle; the roots in force stay");
    }
    if bundle.renew_within_ms > 0 {
        enrollment.trust.ask_renewal(
            &enrollment.serial,
            Duration::from_millis(bundle.renew_within_ms),
            crate::ca::enroll::now_ms(),
            &mut rand::rng(),
        );
    }
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

/// The heartbeat: the scheduler's load and the pacer's figures, how the
/// replicas look, and the connector's status.
fn heartbeat_message(
    parts: &Parts,
    id: u64,
    rate: &mut RateMeter,
    meter: &mut StatusMeter,
    traffic: &Traffic,
) -> v1::Heartbeat {
    let status = v1::ConnectorStatus {
        applications: parts.assignments.applications(),
        dns_resolvers: parts.resolver.servers(),
        bytes_sent: traffic.sent(),
        bytes_received: traffic.received(),
        ..meter.measure()
    };
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
        status: Some(Box::new(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
