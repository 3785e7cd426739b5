//! The CA's shared state (`Authority`): the policy in force, the connector
//! registry with each live session's outbound channel, the health table,
//! on-access windows and access coalescing, and the operations that change
//! more than one of them (reload, disconnect, housekeeping).
//!
//! **Invariant:** locks here are `std` locks taken for short synchronous
//! sections, one at a time, and never held across an `.await`. Messages to
//! connectors are queued with `try_send` so no lock waits on a slow peer.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant, SystemTime};

use policy::{
    AccessWindows, AppEntry, AppKey, BudgetEstimate, Coalescer, HealthReporting, Policy, Segment,
    SegmentIndex, Status,
};
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use tokio::sync::{Notify, mpsc, watch};

use crate::config::{Config, Settings};
use crate::health::{HealthTable, UnknownCause};
use crate::metrics::Metrics;

pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The sending half of a session's outbound stream.
pub(crate) type Outbound = mpsc::Sender<Result<v1::AuthorityMessage, tonic::Status>>;

/// An on-access window or coalescing key: (application, connector).
pub(crate) type WindowKey = (AppKey, String);

/// The policy and settings in force; replaced whole on reload, so readers
/// see one consistent version by cloning the `Arc`.
#[derive(Debug)]
pub struct PolicyState {
    /// The configuration.
    pub config: Config,
    /// Matching index over `config.policy.segments`.
    pub index: SegmentIndex,
    /// Each segment's position in `config.policy.segments` and its report
    /// hosts, by segment name (report intake looks every entry up here).
    segments: FastMap<String, (usize, SegmentHosts)>,
}

/// A hash map with foldhash (seeded per process) for the maps every report
/// entry is looked up in: several times faster than std's SipHash on short
/// names, and the keys are the operator's policy, not a peer's choice.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type FastSet<T> = HashSet<T, foldhash::fast::RandomState>;

/// The hosts a segment takes reports for, in a form that is cheap to test:
/// exact names and IPs in hash sets, discovery entries (wildcards, subnets)
/// in a list. Built once per policy version.
#[derive(Debug, Default)]
struct SegmentHosts {
    names: FastSet<String>,
    ips: FastSet<IpAddr>,
    discovery: Vec<AppEntry>,
}

impl SegmentHosts {
    fn new(segment: &Segment) -> Self {
        let mut hosts = SegmentHosts::default();
        for entry in &segment.applications {
            match entry {
                AppEntry::Fqdn(name) => {
                    hosts.names.insert(name.clone());
                }
                AppEntry::Ip(ip) => {
                    hosts.ips.insert(*ip);
                }
                AppEntry::Wildcard(_) | AppEntry::Subnet(_) => hosts.discovery.push(entry.clone()),
            }
        }
        hosts
    }

    /// Whether `host` (lower-case name or canonical IP text; `ip` is its
    /// parse) is an application of the segment: what `host_in_segment`
    /// answers, without scanning the exact entries.
    fn contains(&self, host: &str, ip: Option<IpAddr>) -> bool {
        let exact = match ip {
            Some(ip) => self.ips.contains(&ip),
            None => self.names.contains(host),
        };
        exact || self.discovery.iter().any(|entry| entry.matches(host, ip))
    }
}

impl PolicyState {
    /// Builds the matching index and the report-host sets for a
    /// configuration.
    pub fn new(config: Config) -> Self {
        let index = SegmentIndex::new(&config.policy.segments);
        let mut segments = FastMap::with_capacity_and_hasher(
            config.policy.segments.len(),
            foldhash::fast::RandomState::default(),
        );
        for (i, seg) in config.policy.segments.iter().enumerate() {
            // Names are unique after validation; the first one wins, as
            // with `Policy::segment`.
            segments
                .entry(seg.name.clone())
                .or_insert_with(|| (i, SegmentHosts::new(seg)));
        }
        PolicyState {
            config,
            index,
            segments,
        }
    }

    /// The segment named `name` (what `Policy::segment` finds, by hash).
    pub fn segment(&self, name: &str) -> Option<&Segment> {
        let (i, _) = self.segments.get(name)?;
        self.policy().segments.get(*i)
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.config.settings
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.config.policy
    }

    /// What a connector of `group` is told: its segments and settings.
    pub fn assignment(&self, group: &str) -> (Vec<v1::Segment>, v1::ConnectorSettings) {
        let s = self.settings();
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        (
            self.policy()
                .segments_for_group(group)
                .map(v1::Segment::from)
                .collect(),
            v1::ConnectorSettings {
                on_access_window_ms: millis(s.on_access_window),
                heartbeat_interval_ms: millis(s.heartbeat_interval),
                checks_per_second: s.connector_checks_per_second,
                check_timeout_ms: s.connector_check_timeout_ms,
            },
        )
    }
}

/// A live session of a connector.
#[derive(Debug)]
pub(crate) struct LiveSession {
    pub id: u64,
    pub label: String,
    pub tx: Outbound,
    pub kill: Arc<Notify>,
}

/// Everything the CA knows about one connector (kept after it disconnects,
/// so the API can list it as disconnected).
#[derive(Debug)]
pub(crate) struct ConnectorEntry {
    pub group: String,
    pub version: String,
    pub session: Option<LiveSession>,
    pub load: Option<v1::CheckLoad>,
    /// Checks per second from the connector's Hello (0 = not stated).
    pub stated_rate: u32,
    pub connected_since: Option<SystemTime>,
    pub last_seen: Option<SystemTime>,
    pub estimate: BudgetEstimate,
}

impl ConnectorEntry {
    /// The cycle time used for staleness: the connector's own measurement
    /// when it sent one, else the CA's estimate.
    pub fn cycle(&self) -> Duration {
        match &self.load {
            Some(l) if l.cycle_seconds.is_finite() && l.cycle_seconds >= 0.0 => {
                Duration::from_secs_f64(l.cycle_seconds.min(86_400.0))
            }
            _ => self.estimate.cycle,
        }
    }
}

/// A cheap copy of one connector's state for the access path.
#[derive(Clone, Debug)]
pub(crate) struct ConnSnap {
    pub group: String,
    pub connected: bool,
    pub cycle: Duration,
}

/// The CA's shared state. One per `run`; handed around as `Arc<Authority>`.
#[derive(Debug)]
pub struct Authority {
    pub(crate) policy: RwLock<Arc<PolicyState>>,
    pub(crate) connectors: Mutex<HashMap<String, ConnectorEntry>>,
    pub(crate) health: HealthTable,
    pub(crate) windows: Mutex<AccessWindows<WindowKey>>,
    pub(crate) coalescer: Mutex<Coalescer<WindowKey>>,
    /// Bumped whenever the health table or the connector set changes; access
    /// requests waiting for on-access discovery watch it.
    pub(crate) changes: watch::Sender<u64>,
    pub(crate) metrics: Metrics,
    pub(crate) next_session: AtomicU64,
    /// Bumped after every policy swap, so sessions can keep a snapshot and
    /// take a new one only when it changed.
    pub(crate) policy_version: AtomicU64,
    /// The CA's certificates; `None` when it runs without TLS.
    pub(crate) pki: Option<Arc<crate::pki::Pki>>,
    /// Enrolled connectors, certificates, key uses.
    pub(crate) store: crate::store::Store,
    /// Bounds enrollment attempts (key guessing) for the whole CA.
    pub(crate) enroll_limiter: governor::DefaultDirectRateLimiter,
}

/// Why the CA's trust state could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Certificates or keys.
    #[error("TLS material: {0}")]
    Pki(#[from] crate::pki::PkiError),
    /// The database.
    #[error("{path}: {source}")]
    Store {
        /// The database file.
        path: std::path::PathBuf,
        /// Why.
        source: crate::store::StoreError,
    },
    /// The data directory.
    #[error("data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Enrollment attempts per second the CA accepts (with a burst of
/// `ENROLL_BURST`); far above any real fleet's rate, far below guessing.
const ENROLL_PER_SECOND: u32 = 20;
const ENROLL_BURST: u32 = 50;

impl Authority {
    /// State for a validated configuration: opens (creating on first start)
    /// the data directory, the database and, with TLS, the certificates.
    pub fn open(config: Config, tls: bool) -> Result<Self, TrustError> {
        let dir = config.settings.data_dir.clone();
        std::fs::create_dir_all(&dir).map_err(|source| TrustError::DataDir {
            path: dir.clone(),
            source,
        })?;
        let db = dir.join("reach.db");
        let store = crate::store::Store::open(&db).map_err(|source| TrustError::Store {
            path: db.clone(),
            source,
        })?;
        let pki = if tls {
            let s = &config.settings;
            let hosts = [s.grpc_listen.ip(), s.http_listen.ip()];
            Some(Arc::new(crate::pki::Pki::load(
                &dir,
                &s.tls,
                &hosts,
                s.connector_cert_validity,
            )?))
        } else {
            None
        };
        Ok(Self::with_trust(config, pki, store))
    }

    fn with_trust(
        config: Config,
        pki: Option<Arc<crate::pki::Pki>>,
        store: crate::store::Store,
    ) -> Self {
        let window = config.settings.on_access_window;
        let gap = config.settings.access_forward_interval;
        let quota = governor::Quota::per_second(
            std::num::NonZeroU32::new(ENROLL_PER_SECOND).unwrap_or(std::num::NonZeroU32::MIN),
        )
        .allow_burst(std::num::NonZeroU32::new(ENROLL_BURST).unwrap_or(std::num::NonZeroU32::MIN));
        Authority {
            pki,
            store,
            enroll_limiter: governor::RateLimiter::direct(quota),
            policy: RwLock::new(Arc::new(PolicyState::new(config))),
            connectors: Mutex::new(HashMap::new()),
            health: HealthTable::default(),
            windows: Mutex::new(AccessWindows::new(window)),
            coalescer: Mutex::new(Coalescer::new(gap)),
            changes: watch::channel(0).0,
            metrics: Metrics::default(),
            next_session: AtomicU64::new(1),
            policy_version: AtomicU64::new(0),
        }
    }

    /// The CA's certificates (`None` without TLS).
    pub fn pki(&self) -> Option<&Arc<crate::pki::Pki>> {
        self.pki.as_ref()
    }

    /// The policy in force.
    pub fn snapshot(&self) -> Arc<PolicyState> {
        read(&self.policy).clone()
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

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Wakes discovery waiters.
    pub(crate) fn bump(&self) {
        self.changes.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub(crate) fn conn_snapshot(&self) -> HashMap<String, ConnSnap> {
        lock(&self.connectors)
            .iter()
            .map(|(name, e)| {
                (
                    name.clone(),
                    ConnSnap {
                        group: e.group.clone(),
                        connected: e.session.is_some(),
                        cycle: e.cycle(),
                    },
                )
            })
            .collect()
    }

    /// The status the CA acts on for one stored report: Unknown when the
    /// connector is not connected, the report is stale, or (on-access) the
    /// window has ended.
    pub(crate) fn effective(
        state: &PolicyState,
        segment: &Segment,
        stored: Status,
        age: Duration,
        conn: Option<&ConnSnap>,
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

    /// Whether `key`'s on-access window for `connector` is live.
    pub(crate) fn window_live(&self, key: &AppKey, connector: &str, now: Instant) -> bool {
        lock(&self.windows).is_live(&(key.clone(), connector.to_owned()), now)
    }

    /// Marks all of a connector's applications Unknown and forgets its
    /// windows and coalescing state (it must be told about accesses again).
    pub(crate) fn forget_connector(&self, name: &str, cause: UnknownCause) {
        let keep = self.snapshot().settings().transitions_kept;
        let changed = self
            .health
            .mark_unknown(SystemTime::now(), keep, |_, c, _| {
                (c == name).then_some(cause)
            });
        lock(&self.windows).retain(|(_, c)| c != name);
        lock(&self.coalescer).retain(|(_, c)| c != name);
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
        self.forget_connector(name, UnknownCause::Disconnected);
    }

    /// Closes every session (at shutdown).
    pub fn close_all_sessions(&self, reason: &str) {
        let sessions: Vec<(String, LiveSession)> = lock(&self.connectors)
            .iter_mut()
            .filter_map(|(n, e)| {
                e.connected_since = None;
                e.session.take().map(|s| (n.clone(), s))
            })
            .collect();
        for (name, session) in sessions {
            self.close_session(&name, session, reason);
        }
    }

    /// Applies a new, valid configuration: swaps the policy, prunes the
    /// health table, pushes `PolicyUpdate` to every connector whose
    /// assignment changed, and closes sessions whose group was removed or
    /// whose provisioning key changed.
    pub fn apply(&self, mut config: Config) {
        {
            // The data directory and TLS material are opened once, at start.
            let before = self.snapshot();
            let (a, b) = (before.settings(), &mut config.settings);
            if a.data_dir != b.data_dir
                || a.tls_enabled != b.tls_enabled
                || a.tls != b.tls
                || a.connector_cert_validity != b.connector_cert_validity
                || a.handshake_timeout != b.handshake_timeout
                || a.limits.max_concurrent_streams != b.limits.max_concurrent_streams
                || a.limits.max_connections != b.limits.max_connections
            {
                tracing::warn!(
                    "[server] data_dir, [tls] and listener [limits] changed; they take effect only after a restart"
                );
            }
            b.data_dir = a.data_dir.clone();
            b.tls_enabled = a.tls_enabled;
            b.tls = a.tls.clone();
            b.connector_cert_validity = a.connector_cert_validity;
            b.handshake_timeout = a.handshake_timeout;
        }
        let new = Arc::new(PolicyState::new(config));
        let old = std::mem::replace(&mut *write(&self.policy), new.clone());
        self.policy_version.fetch_add(1, Ordering::Release);
        let settings = new.settings();
        if old.settings().grpc_listen != settings.grpc_listen
            || old.settings().http_listen != settings.http_listen
        {
            tracing::warn!("listen addresses changed; they take effect only after a restart");
        }
        lock(&self.windows).set_window(settings.on_access_window);
        if old.settings().access_forward_interval != settings.access_forward_interval {
            *lock(&self.coalescer) = Coalescer::new(settings.access_forward_interval);
        }
        let policy = new.policy();
        self.health
            .retain(|key, _, report| app_allowed(&new, &report.group, key).is_ok());
        lock(&self.windows).retain(|(key, _)| {
            policy
                .segment(&key.segment)
                .is_some_and(|s| s.health_reporting == HealthReporting::OnAccess)
        });

        let mut updates = Vec::new();
        let mut closed = Vec::new();
        {
            let mut conns = lock(&self.connectors);
            for (name, entry) in conns.iter_mut() {
                let Some(session) = &entry.session else {
                    continue;
                };
                let reason = if !policy.has_group(&entry.group) {
                    Some("connector group removed from the policy")
                } else if self.pki.is_some() {
                    // Sessions are authenticated by certificate: a new
                    // provisioning key affects only future enrollments.
                    None
                } else {
                    match (
                        old.config.group_keys.get(&entry.group),
                        new.config.group_keys.get(&entry.group),
                    ) {
                        (Some(a), Some(b)) if a.same_as(b) => None,
                        _ => Some("provisioning key of the connector group changed"),
                    }
                };
                if let Some(reason) = reason {
                    if let Some(s) = entry.session.take() {
                        entry.connected_since = None;
                        closed.push((name.clone(), s, reason));
                    }
                    continue;
                }
                let after = new.assignment(&entry.group);
                if old.assignment(&entry.group) != after {
                    updates.push((name.clone(), session.tx.clone(), after));
                }
            }
        }
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
                let session = lock(&self.connectors)
                    .get_mut(&name)
                    .and_then(|e| e.session.take());
                if let Some(s) = session {
                    self.close_session(&name, s, "outbound queue full during policy update");
                }
            }
        }
        for (name, session, reason) in closed {
            self.close_session(&name, session, reason);
        }
        self.recompute_budgets();
        self.bump();
    }

    /// Recomputes every connector's check-load estimate (continuous targets
    /// of its group plus its live on-access windows) and warns when one
    /// crosses the budget.
    pub(crate) fn recompute_budgets(&self) {
        let state = self.snapshot();
        let mut live: HashMap<String, u64> = HashMap::new();
        for (_, c) in lock(&self.windows).keys() {
            *live.entry(c.clone()).or_default() += 1;
        }
        let mut per_group: HashMap<&str, u64> = HashMap::new();
        for g in &state.policy().connector_groups {
            per_group.insert(&g.name, group_checks(&state, &g.name));
        }
        let mut conns = lock(&self.connectors);
        for (name, e) in conns.iter_mut() {
            let estimated = per_group.get(e.group.as_str()).copied().unwrap_or(0)
                + live.get(name).copied().unwrap_or(0);
            update_estimate(&state, name, e, estimated);
        }
    }

    /// Recomputes one connector's check-load estimate, as
    /// `recompute_budgets` does for every connector (after its heartbeat:
    /// nothing else of the others changed).
    pub(crate) fn recompute_budget(&self, name: &str) {
        let state = self.snapshot();
        let live = lock(&self.windows)
            .keys()
            .filter(|(_, c)| c == name)
            .count() as u64;
        let mut conns = lock(&self.connectors);
        let Some(e) = conns.get_mut(name) else {
            return;
        };
        let group = if state.policy().has_group(&e.group) {
            group_checks(&state, &e.group)
        } else {
            0
        };
        update_estimate(&state, name, e, group + live);
    }

    /// Periodic upkeep: ends on-access windows the CA tracks, turns stale
    /// reports Unknown (recording the transition for the dashboard), prunes
    /// coalescing state and refreshes load estimates. The access path does
    /// not depend on it: effective statuses are computed when read.
    pub fn housekeeping(&self, now: Instant) {
        let state = self.snapshot();
        let keep = state.settings().transitions_kept;
        let expired = lock(&self.windows).expire(now);
        let mut ended: HashMap<AppKey, HashSet<String>> = HashMap::new();
        {
            let mut coalescer = lock(&self.coalescer);
            for k in expired {
                coalescer.forget(&k);
                ended.entry(k.0).or_default().insert(k.1);
            }
            coalescer.prune(now);
        }
        let conns = self.conn_snapshot();
        let changed = self
            .health
            .mark_unknown(SystemTime::now(), keep, |key, c, report| {
                if ended.get(key).is_some_and(|s| s.contains(c)) {
                    return Some(UnknownCause::WindowExpired);
                }
                let segment = state.segment(&key.segment)?;
                // Windows are checked through `ended` above; pass `true` here.
                Self::effective(
                    &state,
                    segment,
                    report.status,
                    now.saturating_duration_since(report.received_at),
                    conns.get(c),
                    true,
                )
                .1
            });
        self.recompute_budgets();
        if changed > 0 {
            self.bump();
        }
    }

    /// A fresh session number.
    pub(crate) fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }
}

/// Checks per cycle of the continuous segments `group` serves.
fn group_checks(state: &PolicyState, group: &str) -> u64 {
    state
        .policy()
        .segments_for_group(group)
        .filter(|seg| seg.health_reporting == HealthReporting::Continuous)
        .map(|seg| policy::estimated_checks(seg, 1))
        .sum()
}

/// Sets `e`'s budget estimate from `estimated` checks per cycle (or the
/// connector's own count, if larger) and warns when it crosses the budget.
fn update_estimate(state: &PolicyState, name: &str, e: &mut ConnectorEntry, estimated: u64) {
    let s = state.settings();
    let reported = e.load.as_ref().map_or(0, |l| u64::from(l.checks_per_cycle));
    let rate = [
        s.connector_checks_per_second,
        e.load.as_ref().map_or(0, |l| l.rate_limit),
        e.stated_rate,
        s.assumed_checks_per_second,
    ]
    .into_iter()
    .find(|r| *r > 0)
    .unwrap_or(20);
    let was = e.estimate.over_budget;
    e.estimate = policy::estimate_budget(estimated.max(reported), rate, s.check_budget);
    if e.estimate.over_budget && !was {
        tracing::warn!(
            connector = %name,
            checks_per_cycle = e.estimate.checks_per_cycle,
            cycle_seconds = e.estimate.cycle.as_secs_f64(),
            budget = s.check_budget,
            "connector is over its check budget: reports will be slow to reflect changes"
        );
    }
}

/// Whether a connector of `group` may report `key`: the segment exists, the
/// group serves it, the port is in it, and the host is one of its entries
/// (for on-access segments also a name under a wildcard or an IP inside a
/// subnet, since users may access those). Returns the segment.
pub(crate) fn app_allowed<'a>(
    state: &'a PolicyState,
    group: &str,
    key: &AppKey,
) -> Result<&'a Segment, crate::error::ReportError> {
    app_allowed_ip(state, group, key, key.host.ip())
}

/// [`app_allowed`] for a key whose host was parsed already (`ip` is
/// `key.host` as an address, `None` for a name), as the wire conversion
/// hands it out.
pub(crate) fn app_allowed_ip<'a>(
    state: &'a PolicyState,
    group: &str,
    key: &AppKey,
    ip: Option<IpAddr>,
) -> Result<&'a Segment, crate::error::ReportError> {
    use crate::error::ReportError;
    let (segment, hosts) = state
        .segments
        .get(key.segment.as_str())
        .and_then(|(i, hosts)| Some((state.policy().segments.get(*i)?, hosts)))
        .ok_or_else(|| ReportError::UnknownSegment(key.segment.clone()))?;
    if !segment.served_by(group) {
        return Err(ReportError::NotServed {
            group: group.to_owned(),
            segment: key.segment.clone(),
        });
    }
    if segment.health_reporting == HealthReporting::None {
        return Err(ReportError::NotInSegment(format!(
            "segment {:?} has health_reporting = \"none\" and takes no reports",
            segment.name
        )));
    }
    if !segment.includes(key.protocol, key.port) {
        return Err(ReportError::NotInSegment(format!(
            "segment {:?} does not include {}/{}",
            segment.name, key.protocol, key.port
        )));
    }
    if !hosts.contains(&key.host, ip) {
        return Err(ReportError::NotInSegment(format!(
            "host {:?} is not an application of segment {:?}",
            key.host, segment.name
        )));
    }
    Ok(segment)
}

/// Whether `host` (lower-case name or canonical IP text) is an application
/// of `segment`, by scanning its entries: the reference `SegmentHosts`
/// must agree with.
#[cfg(test)]
fn host_in_segment(segment: &Segment, host: &str) -> bool {
    let ip = host.parse::<IpAddr>().ok();
    segment
        .applications
        .iter()
        .any(|entry| entry.matches(host, ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::Protocol;

    const POLICY: &str = r#"
        [[connector_groups]]
        name = "g"
        provisioning_key = "k"

        [[segments]]
        name = "exact"
        applications = ["a.example.test", "b.example.test", "127.0.0.10", "::1"]
        tcp_ports = ["80"]
        connector_groups = ["g"]

        [[segments]]
        name = "discovery"
        applications = ["*.corp.test", "10.122.0.0/16", "c.example.test", "127.0.0.11"]
        tcp_ports = ["443"]
        health_reporting = "on_access"
        connector_groups = ["g"]
    "#;

    #[test]
    fn host_sets_agree_with_scanning_the_entries() {
        let config = Config::from_toml(POLICY, std::path::Path::new(".")).expect("valid");
        let state = PolicyState::new(config);
        let hosts = [
            "a.example.test",
            "b.example.test",
            "c.example.test",
            "x.example.test",
            "127.0.0.10",
            "127.0.0.11",
            "127.0.0.12",
            "::1",
            "::2",
            "db.corp.test",
            "a.b.corp.test",
            "corp.test",
            ".corp.test",
            "xcorp.test",
            "10.122.3.4",
            "10.123.0.1",
        ];
        for segment in &state.policy().segments {
            let (_, set) = &state.segments[&segment.name];
            for host in hosts {
                let ip = host.parse::<IpAddr>().ok();
                assert_eq!(
                    set.contains(host, ip),
                    host_in_segment(segment, host),
                    "{host} in {}",
                    segment.name
                );
            }
        }
        let key = |segment: &str, host: &str, port| AppKey {
            segment: segment.into(),
            host: host.parse().expect("host"),
            protocol: Protocol::Tcp,
            port,
        };
        assert!(app_allowed(&state, "g", &key("exact", "127.0.0.10", 80)).is_ok());
        assert!(app_allowed(&state, "g", &key("discovery", "db.corp.test", 443)).is_ok());
        assert!(app_allowed(&state, "g", &key("exact", "127.0.0.11", 80)).is_err());
        assert!(app_allowed(&state, "g", &key("exact", "127.0.0.10", 443)).is_err());
        assert!(app_allowed(&state, "h", &key("exact", "127.0.0.10", 80)).is_err());
        assert!(app_allowed(&state, "g", &key("nope", "127.0.0.10", 80)).is_err());
        assert_eq!(
            state.segment("discovery").map(|s| s.name.as_str()),
            Some("discovery")
        );
        assert!(state.segment("nope").is_none());
    }
}
