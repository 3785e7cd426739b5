//! The CA's shared state (`Authority`): the policy in force, and the owners
//! of everything else as private fields — the connector registry
//! (`state::registry`), the on-access windows and coalescing
//! (`state::on_access`), the health table (`state::health`), the rate
//! limits (`state::limits`), the history stream (`state::history`), the
//! database (`store`) and the rest of `state` — plus the operations that
//! change more than one of them (reload, closing sessions). It composes the
//! owners only: the features (`intake`, `access`, `trust`, `api`) work
//! through it and it imports none of them.
//!
//! **Invariant:** each piece of state is locked only by its owner module, in
//! short synchronous sections, one at a time, and never across an `.await`.
//! Here that is the policy lock and the time of the last sweep. Messages to connectors are queued
//! with `try_send` so no lock waits on a slow peer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use policy::{HealthReporting, Segment, Status};
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use tokio::sync::watch;

use crate::config::Config;
use crate::error::TrustError;
use crate::ground::sync::{lock, read, write};
use crate::state::counters::Metrics;
use crate::state::health::{HealthTable, UnknownCause};
use crate::state::on_access::OnAccess;
use crate::state::policy_state::{PolicyState, app_allowed};
use crate::state::registry::{Link, LiveSession, Outbound, Registry};
use crate::store::Store;

/// A connector's assignment: its segments and settings on the wire.
type Assignment = (Vec<v1::Segment>, v1::ConnectorSettings);

/// The CA's shared state. One per `run`; handed around as `Arc<Authority>`.
#[derive(Debug)]
pub struct Authority {
    policy: RwLock<Arc<PolicyState>>,
    /// Bumped after every policy swap, so sessions can keep a snapshot and
    /// take a new one only when it changed.
    policy_version: AtomicU64,
    registry: Registry,
    health: HealthTable,
    on_access: OnAccess,
    /// The candidates of the applications decided on, kept indexed.
    rosters: crate::state::rosters::Rosters,
    /// Bumped whenever the health table or the connector set changes; access
    /// requests waiting for on-access discovery watch it.
    changes: watch::Sender<u64>,
    metrics: Metrics,
    next_session: AtomicU64,
    /// The CA's certificates and the listeners' TLS configurations in
    /// force; `None` when it runs without TLS.
    tls: Option<crate::credentials::tls::Tls>,
    /// Enrolled connectors, certificates, key uses.
    store: Store,
    /// The live stream of status transitions.
    history: crate::state::history::History,
    /// One-time tickets that open that stream from a browser.
    stream_tickets: crate::state::tickets::StreamTickets,
    /// Failed bearer tokens, per source address.
    token_throttle: crate::state::limits::Throttle,
    /// Failed enrollments (provisioning key guessing), per source address.
    enroll_throttle: crate::state::limits::Throttle,
    /// Sign-ins started, per source address and in all.
    login_throttle: crate::state::limits::Throttle,
    /// Renewals per connector.
    renew_limit: crate::state::limits::RenewLimit,
    /// This process's id among the replicas sharing the store (set once
    /// `run` knows its listeners).
    replica_id: std::sync::OnceLock<String>,
    /// Issues and verifies on-access ids with the key the replicas share.
    access_ids: crate::state::access_ids::AccessIds,
    /// The OpenID providers' discovered metadata (people's sign-in).
    oidc: crate::credentials::oidc::Providers,
    /// Readiness until the health table is warm after the start.
    warmup: crate::state::warmup::Warmup,
    /// The log receivers records stream to.
    log_stream: crate::logstream::LogStream,
    /// When housekeeping last swept every result of the table (`None`:
    /// not yet in this process).
    swept: std::sync::Mutex<Option<Instant>>,
}

/// How often housekeeping sweeps every (application, connector) result for
/// staleness and the on-access retention, unless a window ended. Reads
/// judge staleness themselves (access decisions, the listing), so the sweep
/// only records the transition for the history and the stream: at 100,000
/// results a sweep every 500 ms was most of an idle CA's CPU.
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// Fresh random bytes for a shared secret (kept only if no replica stored
/// one before).
fn fresh_secret() -> [u8; crate::state::access_ids::SECRET_BYTES] {
    rand::random()
}

impl Authority {
    /// State for a validated configuration: opens (creating on first start)
    /// the data directory, the database and, with TLS, the certificates.
    pub fn open(config: Config, tls: bool) -> Result<Self, TrustError> {
        let dir = config.settings.data_dir.clone();
        private_files::create_private_dir(&dir).map_err(|source| TrustError::DataDir {
            path: dir.clone(),
            source,
        })?;
        let location = config.settings.store.resolve(&dir);
        let store = Store::open(&location).map_err(|source| TrustError::Store {
            location: location.to_string(),
            source,
        })?;
        tracing::info!(store = %location, "store opened");
        // The on-access id key: created here on first start (any replica).
        store
            .shared_secret(crate::state::access_ids::SECRET_NAME, &fresh_secret())
            .map_err(|source| TrustError::Store {
                location: location.to_string(),
                source,
            })?;
        let tls = if tls {
            let settings = &config.settings;
            let material = crate::credentials::tls::Material::load(
                &settings.data_dir,
                &settings.tls,
                &settings.listen_hosts(),
                settings.connector_cert_validity,
            )?;
            Some(crate::credentials::tls::Tls::new(material))
        } else {
            None
        };
        Ok(Self::with_trust(config, tls, store))
    }

    pub(crate) fn with_trust(
        config: Config,
        tls: Option<crate::credentials::tls::Tls>,
        store: Store,
    ) -> Self {
        let window = config.settings.on_access_window;
        let gap = config.settings.access_forward_interval;
        let (quotas, login) = crate::state::limits::Quotas::of(&config.settings.limits);
        let fresh = fresh_secret();
        let secret = store
            .shared_secret(crate::state::access_ids::SECRET_NAME, &fresh)
            .unwrap_or_else(|e| {
                // `open` read it already; only tests get here with a
                // failing store. Ids then verify on this replica only.
                tracing::error!(error = %e, "cannot read the shared on-access id key; using a key of this process");
                fresh.to_vec()
            });
        Authority {
            log_stream: crate::logstream::LogStream::new(&config.settings.data_dir),
            access_ids: crate::state::access_ids::AccessIds::new(&secret),
            tls,
            store,
            history: crate::state::history::History::default(),
            stream_tickets: crate::state::tickets::StreamTickets::default(),
            token_throttle: crate::state::limits::Throttle::new(quotas),
            enroll_throttle: crate::state::limits::Throttle::new(quotas),
            login_throttle: crate::state::limits::Throttle::new(login),
            renew_limit: crate::state::limits::RenewLimit::new(),
            policy: RwLock::new(Arc::new(PolicyState::new(config))),
            registry: Registry::default(),
            health: HealthTable::default(),
            on_access: OnAccess::new(window, gap),
            rosters: crate::state::rosters::Rosters::default(),
            changes: watch::channel(0).0,
            metrics: Metrics::default(),
            next_session: AtomicU64::new(1),
            policy_version: AtomicU64::new(0),
            replica_id: std::sync::OnceLock::new(),
            warmup: crate::state::warmup::Warmup::new(
                Instant::now(),
                crate::ground::clock::now_ms(),
            ),
            swept: std::sync::Mutex::new(None),
            oidc: crate::credentials::oidc::Providers::default(),
        }
    }

    /// The OpenID providers people sign in with, as discovered.
    pub fn oidc(&self) -> &crate::credentials::oidc::Providers {
        &self.oidc
    }

    /// The CA's certificates in force (`None` without TLS).
    pub fn pki(&self) -> Option<Arc<crate::credentials::pki::Pki>> {
        self.tls.as_ref().map(|t| t.current().pki.clone())
    }

    /// The TLS material in force and the listeners' configurations (`None`
    /// without TLS).
    pub fn tls(&self) -> Option<&crate::credentials::tls::Tls> {
        self.tls.as_ref()
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The connector registry.
    pub(crate) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The health table.
    pub(crate) fn health(&self) -> &HealthTable {
        &self.health
    }

    /// The readiness warm-up after the start.
    pub(crate) fn warmup(&self) -> &crate::state::warmup::Warmup {
        &self.warmup
    }

    /// The rosters of the applications decided on.
    pub(crate) fn rosters(&self) -> &crate::state::rosters::Rosters {
        &self.rosters
    }

    /// The on-access windows and coalescing.
    pub(crate) fn on_access(&self) -> &OnAccess {
        &self.on_access
    }

    /// The on-access ids (issued with forwarded accesses, verified in
    /// reports).
    pub(crate) fn access_ids(&self) -> &crate::state::access_ids::AccessIds {
        &self.access_ids
    }

    /// The log receivers.
    pub fn log_stream(&self) -> &crate::logstream::LogStream {
        &self.log_stream
    }

    /// This replica's id, once `run` set it.
    pub fn replica_id(&self) -> Option<&str> {
        self.replica_id.get().map(String::as_str)
    }

    /// Sets this replica's id (the first call wins).
    pub(crate) fn set_replica_id(&self, id: String) {
        let _ = self.replica_id.set(id);
    }

    /// The database.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The live stream of status transitions.
    pub fn history(&self) -> &crate::state::history::History {
        &self.history
    }

    /// The change stream's one-time tickets.
    pub fn stream_tickets(&self) -> &crate::state::tickets::StreamTickets {
        &self.stream_tickets
    }

    /// Runs `f` on tokio's blocking pool: for SQLite writes (each waits for
    /// `synchronous = FULL`), certificate signing and the database reads
    /// that can queue behind them, which must not stall an async worker
    /// (and every session and access request scheduled on it). A panic in
    /// `f` is resumed here; `None` only when the runtime is shutting down.
    pub(crate) async fn blocking<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Authority) -> T + Send + 'static,
    ) -> Option<T> {
        let this = Arc::clone(self);
        match tokio::task::spawn_blocking(move || f(&this)).await {
            Ok(t) => Some(t),
            Err(e) => match e.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(_) => None,
            },
        }
    }

    /// How often each connector may renew.
    pub(crate) fn renew_limit(&self) -> &crate::state::limits::RenewLimit {
        &self.renew_limit
    }

    /// The throttle of failed attempts at `what`.
    pub(crate) fn throttle(
        &self,
        what: crate::state::limits::Guarded,
    ) -> &crate::state::limits::Throttle {
        match what {
            crate::state::limits::Guarded::Token => &self.token_throttle,
            crate::state::limits::Guarded::Enrollment => &self.enroll_throttle,
            crate::state::limits::Guarded::Login => &self.login_throttle,
        }
    }

    /// The policy in force.
    pub fn snapshot(&self) -> Arc<PolicyState> {
        read(&self.policy).clone()
    }

    /// The policy in force and the version to pass to `refresh` with it.
    pub(crate) fn versioned_snapshot(&self) -> (Arc<PolicyState>, u64) {
        // The version is read first: a swap in between makes the next
        // `refresh` take the snapshot again, never miss it.
        let version = self.policy_version.load(Ordering::Acquire);
        (self.snapshot(), version)
    }

    /// `snapshot()`, refreshed only when the policy was swapped since
    /// `cached` was taken (`version` remembers when that was).
    pub(crate) fn refresh(&self, cached: &mut Arc<PolicyState>, version: &mut u64) {
        let now = self.policy_version.load(Ordering::Acquire);
        if now != *version {
            *version = now;
            *cached = self.snapshot();
        }
    }

    /// Wakes discovery waiters.
    pub(crate) fn bump(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// A receiver woken by every `bump`.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// A fresh session number.
    pub(crate) fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }

    /// The status the CA acts on for one stored report: Unknown when the
    /// connector is not connected, the report is stale, or (on-access) the
    /// window has ended.
    pub(crate) fn effective(
        state: &PolicyState,
        segment: &Segment,
        stored: Status,
        age: Duration,
        conn: Option<Link>,
        window_live: bool,
    ) -> (Status, Option<UnknownCause>) {
        let Some(conn) = conn.filter(|c| c.connected) else {
            return (Status::Unknown, Some(UnknownCause::Disconnected));
        };
        if stored == Status::Unknown {
            return (Status::Unknown, None);
        }
        if segment.health_reporting == HealthReporting::OnAccess && !window_live {
            return (Status::Unknown, Some(UnknownCause::WindowExpired));
        }
        let s = policy::effective_status(
            stored,
            age,
            segment.report_interval,
            state.settings().stale_after_intervals,
            conn.cycle,
        );
        if s == Status::Unknown {
            (Status::Unknown, Some(UnknownCause::Stale))
        } else {
            (s, None)
        }
    }

    /// Marks all of a connector's applications Unknown and forgets its
    /// windows and coalescing state (it must be told about accesses again).
    pub(crate) fn forget_connector(&self, name: &str, cause: UnknownCause) {
        let keep = self.snapshot().settings().transitions_kept;
        let changed = self
            .health
            .mark_unknown_of(name, SystemTime::now(), keep, |_, _| Some(cause));
        self.on_access.forget_connector(name);
        tracing::debug!(
            connector = name,
            changed,
            cause = cause.as_str(),
            "applications marked unknown"
        );
        self.bump();
    }

    /// Ends a live session: tells the connector why, closes the stream and
    /// marks its applications Unknown.
    pub(crate) fn close_session(&self, name: &str, session: LiveSession, reason: &str) {
        self.end_stream(name, session, reason);
        self.forget_connector(name, UnknownCause::Disconnected);
        self.log_connector(name, "disconnected", None);
    }

    /// A `connector_status` record of `name` for `event` to the log
    /// receivers. A session's own events (connected, disconnected) are
    /// this replica's; a heartbeat or drain every replica receives is
    /// written by the replica whose session the connector follows.
    pub(crate) fn log_connector(
        &self,
        name: &str,
        event: &str,
        address: Option<std::net::SocketAddr>,
    ) {
        use crate::logstream::Kind;
        if !self.log_stream.wants(Kind::ConnectorStatus) {
            return;
        }
        let Some(view) = self.registry.log_view(name) else {
            return;
        };
        let own = matches!(event, "connected" | "disconnected");
        if !own && !view.followed {
            return;
        }
        let status = match event {
            "disconnected" => "offline",
            _ if view.draining || event == "drained" => "draining",
            _ => "online",
        };
        self.log_stream
            .emit(crate::logstream::record::connector_status(
                u64::try_from(crate::ground::clock::now_ms()).unwrap_or(0),
                (name, &view.group),
                (event, status),
                view.status.as_ref(),
                address,
            ));
    }

    /// Ends a session that a newer session of the same connector replaced
    /// (a renewal, a reconnect before the old stream was seen to end): the
    /// connector is still connected, so its results and access windows
    /// stand until its new full state (or staleness) changes them.
    pub(crate) fn replace_session(&self, name: &str, session: LiveSession) {
        self.end_stream(
            name,
            session,
            "replaced by a newer session of this connector",
        );
    }

    /// Tells the connector why its session ends and closes the stream.
    fn end_stream(&self, name: &str, session: LiveSession, reason: &str) {
        let shutdown = v1::AuthorityMessage {
            kind: Some(Out::Shutdown(v1::Shutdown {
                reason: reason.to_owned(),
                reconnect_to: String::new(),
                retry_after_ms: 0,
            })),
        };
        // A full queue means the peer is not reading; it is cut off anyway.
        let _ = session.tx.try_send(Ok(shutdown));
        session.kill.notify_one();
        self.metrics.connectors_connected.dec();
        tracing::info!(connector = name, session = %session.label, reason, "session closed");
    }

    /// Ends a connector's live session, if any, telling it why.
    pub(crate) fn close_connector(&self, name: &str, reason: &str) {
        if let Some(s) = self.registry.close(name) {
            self.close_session(name, s, reason);
        }
    }

    /// Ends a connector's live session and its pending (not yet
    /// registered) streams, telling each why: after a disable, revocation,
    /// re-enrollment or delete, no stream opened before it may go on or
    /// register later.
    pub(crate) fn close_connector_streams(&self, name: &str, reason: &str) {
        let (live, pending) = self.registry.close_streams(name);
        if let Some(s) = live {
            self.close_session(name, s, reason);
        }
        for s in pending {
            let shutdown = v1::AuthorityMessage {
                kind: Some(Out::Shutdown(v1::Shutdown {
                    reason: reason.to_owned(),
                    reconnect_to: String::new(),
                    retry_after_ms: 0,
                })),
            };
            let _ = s.tx.try_send(Ok(shutdown));
            s.kill.notify_one();
            tracing::info!(connector = name, session = %s.label, reason, "pending stream closed");
        }
    }

    /// Closes every session (at shutdown).
    pub fn close_all_sessions(&self, reason: &str) {
        for (name, session) in self.registry.close_all() {
            self.close_session(&name, session, reason);
        }
    }

    /// Applies a new, valid configuration: swaps the policy, prunes the
    /// health table, pushes `PolicyUpdate` to every connector whose
    /// assignment changed, and closes sessions whose group was removed or
    /// whose provisioning key changed.
    pub fn apply(&self, mut config: Config) {
        keep_restart_settings(self.snapshot().settings(), &mut config.settings);
        let new = Arc::new(PolicyState::new(config));
        let old = std::mem::replace(&mut *write(&self.policy), new.clone());
        self.policy_version.fetch_add(1, Ordering::Release);
        self.log_stream.reconfigure(&new.config.log_receivers);
        let settings = new.settings();
        if old.settings().grpc_listen != settings.grpc_listen
            || old.settings().http_listen != settings.http_listen
        {
            tracing::warn!("listen addresses changed; they take effect only after a restart");
        }
        let policy = new.policy();
        let new_gap = (old.settings().access_forward_interval != settings.access_forward_interval)
            .then_some(settings.access_forward_interval);
        self.on_access
            .reconfigure(settings.on_access_window, new_gap, |key| {
                policy
                    .segment(&key.segment)
                    .is_some_and(|s| s.health_reporting == HealthReporting::OnAccess)
            });
        self.health
            .retain(|key, _, report| app_allowed(&new, &report.group, key).is_ok());
        self.rosters.clear();

        let mut updates = Vec::new();
        let closed = self.registry.close_where(|name, group, tx| {
            if !policy.has_group(group) {
                return Some("connector group removed from the policy");
            }
            // Sessions authenticated by certificate are not affected by a
            // new provisioning key: it affects only future enrollments.
            if self.tls.is_none() {
                match (
                    old.config.group_keys.get(group),
                    new.config.group_keys.get(group),
                ) {
                    (Some(a), Some(b)) if a.same_as(b) => {}
                    _ => return Some("provisioning key of the connector group changed"),
                }
            }
            let after = new.assignment(group);
            if old.assignment(group) != after {
                updates.push((name.to_owned(), tx.clone(), after));
            }
            None
        });
        self.push_updates(updates);
        for (name, session, reason) in closed {
            self.close_session(&name, session, reason);
        }
        self.recompute_budgets();
        self.bump();
    }

    /// Pushes each connector its new assignment (`PolicyUpdate`); one whose
    /// queue is full is closed instead.
    fn push_updates(&self, updates: Vec<(String, Outbound, Assignment)>) {
        for (name, tx, (segments, settings)) in updates {
            let count = segments.len();
            let msg = v1::AuthorityMessage {
                kind: Some(Out::PolicyUpdate(v1::PolicyUpdate {
                    segments,
                    settings: Some(settings),
                })),
            };
            if tx.try_send(Ok(msg)).is_ok() {
                tracing::info!(connector = %name, segments = count, "policy update pushed");
            } else {
                // A connector that cannot take its update would run on a
                // stale assignment; closing makes it reconnect and get a
                // fresh Welcome.
                self.close_connector(&name, "outbound queue full during policy update");
            }
        }
    }

    /// Recomputes every connector's check-load estimate (continuous targets
    /// of its group plus its live on-access windows) and warns when one
    /// crosses the budget.
    pub(crate) fn recompute_budgets(&self) {
        let state = self.snapshot();
        let live = self.on_access.counts();
        self.registry
            .estimate_all(&state, &live, std::time::SystemTime::now());
    }

    /// Whether housekeeping should sweep the whole table now: every
    /// `SWEEP_EVERY`, or at once when a window `ended` (its results turn
    /// Unknown now). Records the sweep when it is due.
    pub(crate) fn sweep_due(&self, now: Instant, ended: bool) -> bool {
        let mut swept = lock(&self.swept);
        let due = ended || swept.is_none_or(|t| now.saturating_duration_since(t) >= SWEEP_EVERY);
        if due {
            *swept = Some(now);
        }
        due
    }
}

/// Carries over from the settings in force (`a`) those a reload cannot
/// change (`b` is the new configuration's): the data directory, whether
/// TLS is on, the store, replica id and listener limits are taken once, at
/// start (the `[tls]` files are read again by `reload`). Warns
/// when the new file changes them.
fn keep_restart_settings(a: &crate::config::Settings, b: &mut crate::config::Settings) {
    // The data directory and the listeners are opened once, at start.
    if a.data_dir != b.data_dir
        || a.tls_enabled != b.tls_enabled
        || a.store != b.store
        || a.replica_id != b.replica_id
        || a.handshake_timeout != b.handshake_timeout
        || a.limits.max_concurrent_streams != b.limits.max_concurrent_streams
        || a.limits.max_connections != b.limits.max_connections
    {
        tracing::warn!(
            "[server] data_dir, [tls] enabled and handshake_timeout_ms, [store], [replica] and listener [limits] changed; they take effect only after a restart"
        );
    }
    b.data_dir = a.data_dir.clone();
    b.store = a.store.clone();
    b.replica_id = a.replica_id.clone();
    b.tls_enabled = a.tls_enabled;
    b.handshake_timeout = a.handshake_timeout;
}
