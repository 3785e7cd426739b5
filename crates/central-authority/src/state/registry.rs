//! The connector registry: every connector the CA has seen, with its live
//! session (the outbound channel and kill switch), its stated and reported
//! load and the CA's check-load estimate. Entries are kept after a
//! connector disconnects, so the API can list it as disconnected.
//!
//! It also keeps which connectors are drained (selected for no new
//! access): the administrators' drains as last read from the store (for
//! every connector name, also those not connected here), and a session's
//! own drain while its connector shuts down (`v1::Drain`), which ends with
//! the session. A member's link carries the result, so a decision reads it
//! with the rest of the link.
//!
//! It also holds the *pending* streams: authenticated, not yet registered
//! (before `Hello`). Disable, revoke, re-enrollment and delete close those
//! too, and registration takes a stream out of the pending set under the
//! same lock as it records the session: a stream closed while pending can
//! never register later.
//!
//! **Invariant:** the registry's lock is taken only here, for short
//! synchronous sections, never across an `.await` and never together with
//! another lock of CA state. Messages to connectors are queued with
//! `try_send`, so no section waits on a slow peer.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use policy::BudgetEstimate;
use protocol::v1;
use tokio::sync::{Notify, mpsc};

use crate::ground::clock::unix_ms;
use crate::ground::sync::lock;
use crate::state::policy_state::PolicyState;
use crate::state::series::{LoadSeries, Merge};
use crate::store::DrainRecord;

/// The sending half of a session's outbound stream.
pub(crate) type Outbound = mpsc::Sender<Result<v1::AuthorityMessage, tonic::Status>>;

/// A live session of a connector.
#[derive(Debug)]
pub(crate) struct LiveSession {
    pub id: u64,
    pub label: String,
    /// Serial of the certificate the session stands on (`None` for a
    /// plain-text session): the reconcile checks it against the store.
    pub cert_serial: Option<String>,
    /// SHA-256 of the provisioning key that authenticated a plain-text
    /// session (`None` with a certificate): the reconcile checks that key,
    /// not whichever key the group has now.
    pub key_sha256: Option<String>,
    /// Fingerprint of the root the session's certificate chains to (`None`
    /// for a plain-text session): a reload that stops trusting it ends the
    /// session, and one that switches roots asks it to renew.
    pub cert_root: Option<String>,
    pub tx: Outbound,
    pub kill: Arc<Notify>,
    /// The connector drains itself (it sent `v1::Drain` on this session):
    /// selected for no new access until the session ends.
    pub draining: Option<SelfDrain>,
}

/// A session's own drain (`v1::Drain`), as its connector stated it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SelfDrain {
    /// When the CA received it, Unix ms.
    pub since_ms: i64,
    /// When the connector said it will close the session, Unix ms (`None`:
    /// it did not say).
    pub until_ms: Option<i64>,
}

/// A connector as its `connector_status` log records show it
/// (`Registry::log_view`).
#[derive(Clone, Debug)]
pub(crate) struct LogView {
    /// Its group.
    pub group: String,
    /// What its latest heartbeat said of it.
    pub status: Option<v1::ConnectorStatus>,
    /// Whether its session drains.
    pub draining: bool,
    /// Whether this replica writes its records seen by every replica.
    pub followed: bool,
}

/// A live session as the reconcile sees it (`Registry::live_sessions`).
#[derive(Clone, Debug)]
pub(crate) struct LiveRef {
    /// The connector.
    pub name: String,
    /// The session's id.
    pub id: u64,
    /// The connector's group.
    pub group: String,
    /// The client certificate's serial; `None` for a session authenticated
    /// by its group's provisioning key (`[tls] enabled = false`).
    pub serial: Option<String>,
    /// For such a session: the SHA-256 of the key that authenticated it.
    pub key_sha256: Option<String>,
}

/// Everything the CA knows about one connector. Handed out only as a
/// reference inside the registry's lock (`Registry::list`).
#[derive(Debug)]
pub(crate) struct ConnectorEntry {
    pub group: String,
    pub version: String,
    /// Whether its Hello said it keeps the trust bundles the CA sends.
    pub trust_bundle: bool,
    pub session: Option<LiveSession>,
    pub load: Option<v1::CheckLoad>,
    /// How the connector sees the CA replicas (its latest heartbeat).
    pub replicas: Option<v1::ReplicaAttachment>,
    /// Its software, host and resource use (its latest heartbeat of this
    /// session, sanitized: [`sanitize_status`]) and when it arrived.
    pub status: Option<(Box<v1::ConnectorStatus>, SystemTime)>,
    /// Checks per second from the connector's Hello (0 = not stated).
    pub stated_rate: u32,
    pub connected_since: Option<SystemTime>,
    pub last_seen: Option<SystemTime>,
    pub estimate: BudgetEstimate,
    /// `estimate.checks_per_cycle` over time (the highest of each
    /// interval), recorded with every estimate.
    pub load_series: Box<LoadSeries>,
    /// An administrator's drain of it, as last read from the store.
    pub drain: Option<DrainRecord>,
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

    /// Its connection state, cycle and whether it is drained.
    fn link(&self) -> Link {
        Link {
            connected: self.session.is_some(),
            cycle: self.cycle(),
            drained: self.is_drained(),
        }
    }

    /// Whether it is drained: by an administrator, or by its live session.
    pub fn is_drained(&self) -> bool {
        self.drain.is_some() || self.self_drain().is_some()
    }

    /// Its live session's own drain, if it sent one.
    pub fn self_drain(&self) -> Option<SelfDrain> {
        self.session.as_ref().and_then(|s| s.draining)
    }

    /// Takes the live session, if any, and marks the connector disconnected.
    fn disconnect(&mut self) -> Option<LiveSession> {
        self.connected_since = None;
        self.session.take()
    }
}

/// Every connector's snapshot by name. foldhash: the housekeeping sweep
/// looks a connector up for every (application, connector) result twice a
/// second, and std's SipHash was most of that sweep's CPU at 100,000
/// results (BENCHMARKS.md, dashboard at rest).
pub(crate) type ConnSnaps = HashMap<String, ConnSnap, foldhash::fast::RandomState>;

/// A cheap copy of one connector's state for the access path.
#[derive(Clone, Debug)]
pub(crate) struct ConnSnap {
    pub group: String,
    pub connected: bool,
    pub cycle: Duration,
    pub drained: bool,
}

impl ConnSnap {
    /// What a stored result's effective status depends on.
    pub fn link(&self) -> Link {
        Link {
            connected: self.connected,
            cycle: self.cycle,
            drained: self.drained,
        }
    }
}

/// A connector's connection state and check cycle, what the effective
/// status of its stored results depends on (`Authority::effective`), and
/// whether it is drained (selected for no new access; its results stand).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    pub connected: bool,
    pub cycle: Duration,
    pub drained: bool,
}

/// What a connector says about itself in its `Hello`.
#[derive(Debug)]
pub(crate) struct Arrival<'a> {
    pub name: &'a str,
    pub group: &'a str,
    pub hello: &'a v1::Hello,
}

/// The registry. One per `Authority`.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    conns: Mutex<Conns>,
}

/// What the registry's lock guards.
#[derive(Debug, Default)]
struct Conns {
    /// foldhash: a decision looks up every member of its segment's groups
    /// (`members`), 10,000 of them in the largest group measured.
    map: HashMap<String, ConnectorEntry, foldhash::fast::RandomState>,
    /// Each group's connectors by name, with each one's link (connection
    /// state and cycle): what a decision reads (`members`), so it visits
    /// its segment's groups only, sorts nothing and looks nothing up. Kept
    /// with `map` under the same lock: whatever changes an entry's link
    /// copies it here (`relink`). Looking each member up in `map` instead
    /// was most of a decision's 7-9 ms of CPU at a 10,000-connector group
    /// (one hash of the name and two string reads per member, each a
    /// cache miss).
    groups: HashMap<String, BTreeMap<String, Link>>,
    /// Authenticated streams that have not registered yet, by session id,
    /// with their connector's name.
    pending: HashMap<u64, (String, LiveSession)>,
    /// Every administrator's drain as last read from the store, by
    /// connector (those not in `map` too: an entry made later takes its
    /// drain from here).
    drains: HashMap<String, DrainRecord>,
    /// What changed in `groups`, for the rosters (`links`).
    log: LinkLog,
}

/// The changes to the groups' members a roster follows (`Registry::links`):
/// a count of membership changes (a connector joins, leaves or changes
/// group: the roster is built again), and each change of a member's link,
/// numbered, the oldest dropped past a bound (a roster behind them is
/// built again).
#[derive(Debug, Default)]
struct LinkLog {
    members: u64,
    seq: u64,
    /// Every link change numbered above `floor` is in `changed`.
    floor: u64,
    changed: std::collections::VecDeque<(u64, String)>,
}

impl LinkLog {
    /// Notes that `name`'s link changed.
    fn changed(&mut self, name: &str) {
        self.seq += 1;
        self.changed.push_back((self.seq, name.to_owned()));
        if self.changed.len() > LINK_LOG_MAX {
            let cut = self.changed.len() / 2;
            self.floor = self.changed[cut - 1].0;
            self.changed.drain(..cut);
        }
    }

    fn at(&self) -> LinksAt {
        LinksAt {
            members: self.members,
            seq: self.seq,
        }
    }
}

/// Most link changes the log keeps: 10,000 connectors' heartbeats (each
/// may change a cycle) for half a minute between two decisions.
const LINK_LOG_MAX: usize = 1 << 16;

/// Where a roster's reading of the groups' members stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LinksAt {
    members: u64,
    seq: u64,
}

/// The members of a segment's groups as a roster reads them.
#[derive(Debug)]
pub(crate) enum Links {
    /// Every member, per group (in the order asked), by name.
    All {
        at: LinksAt,
        groups: Vec<Vec<(String, Link)>>,
    },
    /// The members whose link changed since the reading asked about: name,
    /// group and link.
    Changed {
        at: LinksAt,
        changed: Vec<(String, String, Link)>,
    },
}

impl Conns {
    /// Runs `f` on `name`'s entry, then copies its link into its group's
    /// members (`relink`); `None` when `name` is unknown. What changes an
    /// entry's session, load or estimate goes through here, or relinks
    /// itself where it walks every entry.
    fn update<R>(&mut self, name: &str, f: impl FnOnce(&mut ConnectorEntry) -> R) -> Option<R> {
        let e = self.map.get_mut(name)?;
        let r = f(e);
        relink(&mut self.groups, &mut self.log, name, e);
        Some(r)
    }
}

/// `Registry::sort_by_root`'s answer: the sessions taken (connector and
/// session), and the ones kept (connector, outbound channel, root).
pub(crate) type ByRoot = (Vec<(String, LiveSession)>, Vec<(String, Outbound, String)>);

/// Registration refused: the stream was closed while pending (its
/// connector was disabled, revoked, re-enrolled or deleted).
#[derive(Debug)]
pub(crate) struct NotPending;

impl Registry {
    /// Records an authenticated stream of `name` that has not sent `Hello`
    /// yet (`session.id` is the id it registers with).
    pub(crate) fn open_pending(&self, name: &str, session: LiveSession) {
        lock(&self.conns)
            .pending
            .insert(session.id, (name.to_owned(), session));
    }

    /// Forgets pending stream `id` (it ended before registering).
    pub(crate) fn drop_pending(&self, id: u64) {
        lock(&self.conns).pending.remove(&id);
    }

    /// Records pending stream `id` as the live session of `arrival.name`
    /// and returns the session it replaces, if any; `NotPending` when the
    /// stream was closed meanwhile. `welcome` queues the session's Welcome
    /// and returns how many segments it assigns: it runs under the
    /// registry's lock, so a concurrent reload either is reflected in the
    /// Welcome or sees this session and sends a PolicyUpdate after it.
    pub(crate) fn register(
        &self,
        arrival: Arrival<'_>,
        id: u64,
        welcome: impl FnOnce(&LiveSession) -> usize,
    ) -> Result<Option<LiveSession>, NotPending> {
        let Arrival { name, group, hello } = arrival;
        let mut guard = lock(&self.conns);
        let conns = &mut *guard;
        let Some((_, session)) = conns.pending.remove(&id) else {
            return Err(NotPending);
        };
        let count = welcome(&session);
        let drain = conns.drains.get(name).cloned();
        let entry = conns
            .map
            .entry(name.to_owned())
            .or_insert_with(|| ConnectorEntry {
                group: group.to_owned(),
                version: String::new(),
                trust_bundle: false,
                session: None,
                load: None,
                replicas: None,
                status: None,
                stated_rate: 0,
                connected_since: None,
                last_seen: None,
                estimate: policy::estimate_budget(0, 20, u64::MAX),
                load_series: Box::default(),
                drain,
            });
        if entry.group != group
            && let Some(old) = conns.groups.get_mut(&entry.group)
        {
            old.remove(name);
            conns.log.members += 1;
            if old.is_empty() {
                conns.groups.remove(&entry.group);
            }
        }
        group.clone_into(&mut entry.group);
        entry.version = sanitize_version(&hello.version);
        entry.stated_rate = hello
            .capabilities
            .as_ref()
            .map_or(0, |c| c.checks_per_second);
        entry.trust_bundle = hello.capabilities.as_ref().is_some_and(|c| c.trust_bundle);
        entry.load = None;
        entry.replicas = None;
        entry.status = None;
        entry.connected_since = Some(SystemTime::now());
        entry.last_seen = Some(SystemTime::now());
        tracing::info!(
            connector = %name,
            group = %group,
            session = %session.label,
            version = %entry.version,
            segments = count,
            "connector connected"
        );
        let replaced = entry.session.replace(session);
        let link = entry.link();
        let before = conns
            .groups
            .entry(group.to_owned())
            .or_default()
            .insert(name.to_owned(), link);
        match before {
            None => conns.log.members += 1,
            Some(old) if old != link => conns.log.changed(name),
            Some(_) => {}
        }
        Ok(replaced)
    }

    /// Takes session `id` of `name` if it is still the live one (a replaced
    /// session was already closed by its replacement).
    pub(crate) fn end(&self, name: &str, id: u64) -> Option<LiveSession> {
        lock(&self.conns)
            .update(name, |e| {
                e.session
                    .as_ref()
                    .is_some_and(|s| s.id == id)
                    .then(|| e.disconnect())
                    .flatten()
            })
            .flatten()
    }

    /// Takes `name`'s live session, whichever it is.
    pub(crate) fn close(&self, name: &str) -> Option<LiveSession> {
        lock(&self.conns)
            .update(name, ConnectorEntry::disconnect)
            .flatten()
    }

    /// Takes `name`'s live session and its pending streams, under one lock
    /// (so none of them can register after).
    pub(crate) fn close_streams(&self, name: &str) -> (Option<LiveSession>, Vec<LiveSession>) {
        let mut guard = lock(&self.conns);
        let conns = &mut *guard;
        let live = conns.update(name, ConnectorEntry::disconnect).flatten();
        let ids: Vec<u64> = conns
            .pending
            .iter()
            .filter(|(_, (n, _))| n == name)
            .map(|(id, _)| *id)
            .collect();
        let pending = ids
            .iter()
            .filter_map(|id| conns.pending.remove(id).map(|(_, s)| s))
            .collect();
        (live, pending)
    }

    /// Forgets `name` (a deleted connector): it is no longer listed.
    pub(crate) fn forget(&self, name: &str) {
        let mut guard = lock(&self.conns);
        let conns = &mut *guard;
        if let Some(e) = conns.map.remove(name)
            && let Some(members) = conns.groups.get_mut(&e.group)
        {
            members.remove(name);
            conns.log.members += 1;
            if members.is_empty() {
                conns.groups.remove(&e.group);
            }
        }
    }

    /// Replaces the administrators' drains with `drains` (the store's);
    /// returns whether that changed any. Relinks only the connectors whose
    /// drain changed.
    pub(crate) fn set_drains(&self, drains: Vec<DrainRecord>) -> bool {
        let drains: HashMap<String, DrainRecord> = drains
            .into_iter()
            .map(|d| (d.connector.clone(), d))
            .collect();
        let mut guard = lock(&self.conns);
        let conns = &mut *guard;
        if conns.drains == drains {
            return false;
        }
        for (name, e) in conns.map.iter_mut() {
            let now = drains.get(name);
            if e.drain.as_ref() != now {
                e.drain = now.cloned();
                relink(&mut conns.groups, &mut conns.log, name, e);
            }
        }
        conns.drains = drains;
        true
    }

    /// Records an administrator's drain made here (the store has it): in
    /// force here at once, before the next reading of the store.
    pub(crate) fn drained(&self, drain: DrainRecord) {
        let mut guard = lock(&self.conns);
        let conns = &mut *guard;
        let name = drain.connector.clone();
        if let Some(e) = conns.map.get_mut(&name) {
            e.drain = Some(drain.clone());
            relink(&mut conns.groups, &mut conns.log, &name, e);
        }
        conns.drains.insert(name, drain);
    }

    /// Ends an administrator's drain of `name` here (the store has ended
    /// it).
    pub(crate) fn undrained(&self, name: &str) {
        let mut guard = lock(&self.conns);
        let conns = &mut *guard;
        conns.drains.remove(name);
        if let Some(e) = conns.map.get_mut(name) {
            e.drain = None;
            relink(&mut conns.groups, &mut conns.log, name, e);
        }
    }

    /// Records that `name`'s live session drains itself (`v1::Drain`);
    /// returns whether it has a live session (a repeated `Drain` keeps the
    /// first's start).
    pub(crate) fn self_drain(&self, name: &str, drain: SelfDrain) -> bool {
        lock(&self.conns)
            .update(name, |e| match e.session.as_mut() {
                Some(s) => {
                    s.draining.get_or_insert(drain);
                    true
                }
                None => false,
            })
            .unwrap_or(false)
    }

    /// What a `connector_status` log record says of `name` besides its
    /// event: its group, latest status, whether its session drains, and
    /// whether its latest heartbeat said it follows this replica's session
    /// (or said nothing of replicas).
    pub(crate) fn log_view(&self, name: &str) -> Option<LogView> {
        lock(&self.conns).map.get(name).map(|e| LogView {
            group: e.group.clone(),
            status: e.status.as_ref().map(|(s, _)| (**s).clone()),
            draining: e.session.as_ref().is_some_and(|s| s.draining.is_some()),
            followed: e.replicas.as_ref().is_none_or(|r| r.follows_this_session),
        })
    }

    /// Whether the registry knows `name` (it connected since the CA
    /// started).
    pub(crate) fn knows(&self, name: &str) -> bool {
        lock(&self.conns).map.contains_key(name)
    }

    /// Every administrator's drain, by connector.
    pub(crate) fn drains(&self) -> HashMap<String, DrainRecord> {
        lock(&self.conns).drains.clone()
    }

    /// Takes every live session (at shutdown).
    pub(crate) fn close_all(&self) -> Vec<(String, LiveSession)> {
        let mut guard = lock(&self.conns);
        let conns = &mut *guard;
        let mut closed = Vec::new();
        for (name, e) in conns.map.iter_mut() {
            if let Some(s) = e.disconnect() {
                relink(&mut conns.groups, &mut conns.log, name, e);
                closed.push((name.clone(), s));
            }
        }
        closed
    }

    /// Takes the live sessions for which `reason` (given the connector's
    /// name, group and outbound channel) names a reason to close them.
    pub(crate) fn close_where(
        &self,
        mut reason: impl FnMut(&str, &str, &Outbound) -> Option<&'static str>,
    ) -> Vec<(String, LiveSession, &'static str)> {
        let mut closed = Vec::new();
        let mut guard = lock(&self.conns);
        let conns = &mut *guard;
        for (name, entry) in conns.map.iter_mut() {
            let Some(session) = &entry.session else {
                continue;
            };
            if let Some(why) = reason(name, &entry.group, &session.tx)
                && let Some(s) = entry.disconnect()
            {
                relink(&mut conns.groups, &mut conns.log, name, entry);
                closed.push((name.clone(), s, why));
            }
        }
        closed
    }

    /// Takes the live sessions whose certificate's root `trusted` refuses
    /// (plain-text sessions, without one, stay), and returns with them
    /// every remaining certificate session's outbound channel and root.
    pub(crate) fn sort_by_root(&self, trusted: impl Fn(&str) -> bool) -> ByRoot {
        let (mut closed, mut kept) = (Vec::new(), Vec::new());
        let mut guard = lock(&self.conns);
        let conns = &mut *guard;
        for (name, entry) in conns.map.iter_mut() {
            let Some(root) = entry.session.as_ref().and_then(|s| s.cert_root.clone()) else {
                continue;
            };
            if trusted(&root) {
                if let Some(s) = &entry.session {
                    kept.push((name.clone(), s.tx.clone(), root));
                }
            } else if let Some(s) = entry.disconnect() {
                relink(&mut conns.groups, &mut conns.log, name, entry);
                closed.push((name.clone(), s));
            }
        }
        (closed, kept)
    }

    /// The connected connectors whose Hello did not say they keep the
    /// trust bundle, sorted.
    pub(crate) fn without_trust_bundle(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.conns)
            .map
            .iter()
            .filter(|(_, e)| e.session.is_some() && !e.trust_bundle)
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names
    }

    /// Every live session: connector, session id, group and certificate
    /// serial.
    pub(crate) fn live_sessions(&self) -> Vec<LiveRef> {
        lock(&self.conns)
            .map
            .iter()
            .filter_map(|(name, e)| {
                let s = e.session.as_ref()?;
                Some(LiveRef {
                    name: name.clone(),
                    id: s.id,
                    group: e.group.clone(),
                    serial: s.cert_serial.clone(),
                    key_sha256: s.key_sha256.clone(),
                })
            })
            .collect()
    }

    /// Records that `name` was heard from at `wall`.
    pub(crate) fn seen(&self, name: &str, wall: SystemTime) {
        if let Some(e) = lock(&self.conns).map.get_mut(name) {
            e.last_seen = Some(wall);
        }
    }

    /// Records `name`'s heartbeat (its load and how it sees the CA
    /// replicas) and recomputes its check-load estimate from it: `live` is
    /// its count of live on-access windows.
    pub(crate) fn heartbeat(
        &self,
        state: &PolicyState,
        name: &str,
        wall: SystemTime,
        heartbeat: v1::Heartbeat,
        live: u64,
    ) {
        let v1::Heartbeat {
            load,
            replicas,
            status,
        } = heartbeat;
        let status = status.map(|mut s| {
            sanitize_status(&mut s);
            (s, wall)
        });
        lock(&self.conns).update(name, |e| {
            e.last_seen = Some(wall);
            e.load = load;
            e.replicas = replicas;
            e.status = status;
            let group = state.group_checks(&e.group);
            update_estimate(state, name, e, group + live, wall);
        });
    }

    /// Recomputes every connector's check-load estimate (continuous targets
    /// of its group plus `live`, its count of live on-access windows) as
    /// of `wall`.
    pub(crate) fn estimate_all(
        &self,
        state: &PolicyState,
        live: &HashMap<String, u64>,
        wall: SystemTime,
    ) {
        let mut guard = lock(&self.conns);
        let conns = &mut *guard;
        for (name, e) in conns.map.iter_mut() {
            let estimated = state.group_checks(&e.group) + live.get(name).copied().unwrap_or(0);
            update_estimate(state, name, e, estimated, wall);
            relink(&mut conns.groups, &mut conns.log, name, e);
        }
    }

    /// [`Registry::estimate_all`] for one connector (`live`: its on-access
    /// checks per cycle), as a new session of it registers: the others'
    /// estimates do not change with it.
    pub(crate) fn estimate_one(
        &self,
        state: &PolicyState,
        name: &str,
        live: u64,
        wall: SystemTime,
    ) {
        lock(&self.conns).update(name, |e| {
            let estimated = state.group_checks(&e.group) + live;
            update_estimate(state, name, e, estimated, wall);
        });
    }

    /// A copy of every connector's group, connection state and cycle.
    pub(crate) fn snapshot(&self) -> ConnSnaps {
        lock(&self.conns)
            .map
            .iter()
            .map(|(name, e)| {
                (
                    name.clone(),
                    ConnSnap {
                        group: e.group.clone(),
                        connected: e.session.is_some(),
                        cycle: e.cycle(),
                        drained: e.is_drained(),
                    },
                )
            })
            .collect()
    }

    /// The connectors of `group`, sorted by name, with their connection
    /// state and cycle. The access path asks this for each decision: it
    /// copies only the group's names and links, not every connector's
    /// entry.
    pub(crate) fn members(&self, group: &str) -> Vec<(String, Link)> {
        let conns = lock(&self.conns);
        let Some(members) = conns.groups.get(group) else {
            return Vec::new();
        };
        debug_assert!(
            members
                .iter()
                .all(|(name, link)| conns.map.get(name).map(ConnectorEntry::link) == Some(*link)),
            "a link in group {group} differs from its connector's entry"
        );
        members
            .iter()
            .map(|(name, link)| (name.clone(), *link))
            .collect()
    }

    /// The members of `groups` for a roster that read them at `since`:
    /// those whose link changed since, or all when their membership
    /// changed, the changes it missed were dropped, or it read none.
    pub(crate) fn links(&self, groups: &[String], since: Option<LinksAt>) -> Links {
        let conns = lock(&self.conns);
        let log = &conns.log;
        let at = log.at();
        match since {
            Some(s) if s.members == log.members && s.seq >= log.floor => {
                let from = log.changed.partition_point(|(seq, _)| *seq <= s.seq);
                let mut changed = Vec::new();
                for (_, name) in log.changed.range(from..) {
                    let Some(e) = conns.map.get(name) else {
                        continue;
                    };
                    if groups.contains(&e.group) {
                        changed.push((name.clone(), e.group.clone(), e.link()));
                    }
                }
                Links::Changed { at, changed }
            }
            _ => Links::All {
                at,
                groups: groups
                    .iter()
                    .map(|g| {
                        conns.groups.get(g).map_or_else(Vec::new, |m| {
                            m.iter().map(|(n, l)| (n.clone(), *l)).collect()
                        })
                    })
                    .collect(),
            },
        }
    }

    /// The outbound channels of those of `names` that have a live session.
    pub(crate) fn senders<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
    ) -> Vec<(String, Outbound)> {
        let conns = lock(&self.conns);
        names
            .into_iter()
            .filter_map(|name| {
                let s = conns.map.get(name)?.session.as_ref()?;
                Some((name.to_owned(), s.tx.clone()))
            })
            .collect()
    }

    /// `view` of every connector, in no particular order.
    pub(crate) fn list<T>(&self, mut view: impl FnMut(&str, &ConnectorEntry) -> T) -> Vec<T> {
        lock(&self.conns)
            .map
            .iter()
            .map(|(name, e)| view(name, e))
            .collect()
    }
}

/// Copies `e`'s link (connector `name`) into its group's members, after
/// whatever may have changed it.
fn relink(
    groups: &mut HashMap<String, BTreeMap<String, Link>>,
    log: &mut LinkLog,
    name: &str,
    e: &ConnectorEntry,
) {
    if let Some(link) = groups.get_mut(&e.group).and_then(|m| m.get_mut(name)) {
        let new = e.link();
        if *link != new {
            *link = new;
            log.changed(name);
        }
    }
}

/// Sets `e`'s budget estimate from `estimated` checks per cycle (or the
/// connector's own count, if larger), records it in its series at `wall`
/// and warns when it crosses the budget.
fn update_estimate(
    state: &PolicyState,
    name: &str,
    e: &mut ConnectorEntry,
    estimated: u64,
    wall: SystemTime,
) {
    let s = state.settings();
    let reported = e.load.as_ref().map_or(0, |l| u64::from(l.checks_per_cycle));
    // The heartbeat's `rate_limit` is the rate its pacer runs at: the
    // imposed one held to the connector's ceiling, or its own.
    let running = e.load.as_ref().map_or(0, |l| l.rate_limit);
    let own = [running, e.stated_rate, s.assumed_checks_per_second];
    let ceiling = (running > 0).then_some(running);
    let rate = policy::effective_rate(s.connector_checks_per_second, ceiling, &own);
    let was = e.estimate.over_budget;
    e.estimate = policy::estimate_budget(estimated.max(reported), rate, s.check_budget);
    e.load_series.record(
        i64::try_from(unix_ms(wall)).unwrap_or(i64::MAX),
        u32::try_from(e.estimate.checks_per_cycle).unwrap_or(u32::MAX),
        Merge::Max,
    );
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

/// Longest `Hello.version` the CA keeps.
pub const MAX_VERSION_CHARS: usize = 64;

/// `Hello.version` as the CA logs, stores and shows it: printable ASCII
/// only (anything else, such as a newline that would forge a log line or an
/// ANSI escape that would rewrite a terminal, becomes `?`), at most
/// `MAX_VERSION_CHARS` characters. A connector states its version; it does
/// not get to write into the CA's logs.
pub fn sanitize_version(raw: &str) -> String {
    raw.chars()
        .take(MAX_VERSION_CHARS)
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .collect()
}

/// Most DNS servers of a `ConnectorStatus` the CA keeps.
pub const MAX_STATUS_RESOLVERS: usize = 8;

/// Makes a heartbeat's `ConnectorStatus` what the CA keeps and shows: every
/// string as [`sanitize_version`] makes it, at most
/// [`MAX_STATUS_RESOLVERS`] DNS servers, CPU figures that are not finite
/// or negative as 0 (unknown).
pub fn sanitize_status(s: &mut v1::ConnectorStatus) {
    for text in [
        &mut s.version,
        &mut s.os,
        &mut s.arch,
        &mut s.default_route_interface,
    ] {
        *text = sanitize_version(text);
    }
    s.dns_resolvers.truncate(MAX_STATUS_RESOLVERS);
    for r in &mut s.dns_resolvers {
        *r = sanitize_version(r);
    }
    for cpu in [&mut s.process_cpu_percent, &mut s.host_cpu_percent] {
        if !cpu.is_finite() || *cpu < 0.0 {
            *cpu = 0.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Registers `name` in `group` as session `id`.
    fn arrive(registry: &Registry, name: &str, group: &str, id: u64) {
        let (tx, _) = mpsc::channel(1);
        registry.open_pending(
            name,
            LiveSession {
                id,
                label: format!("s{id}"),
                cert_serial: None,
                key_sha256: None,
                cert_root: None,
                tx,
                kill: Arc::new(Notify::new()),
                draining: None,
            },
        );
        let hello = v1::Hello::default();
        let arrival = Arrival {
            name,
            group,
            hello: &hello,
        };
        assert!(registry.register(arrival, id, |_| 0).is_ok());
    }

    fn names(registry: &Registry, group: &str) -> Vec<(String, bool)> {
        registry
            .members(group)
            .into_iter()
            .map(|(n, l)| (n, l.connected))
            .collect()
    }

    #[test]
    fn a_groups_members_follow_registrations_group_moves_and_deletions() {
        let registry = Registry::default();
        for (i, (name, group)) in [("c", "g1"), ("a", "g1"), ("z", "g2"), ("b", "g1")]
            .into_iter()
            .enumerate()
        {
            arrive(&registry, name, group, i as u64);
        }
        let yes = |n: &str| (n.to_owned(), true);
        assert_eq!(names(&registry, "g1"), [yes("a"), yes("b"), yes("c")]);
        assert_eq!(names(&registry, "g2"), [yes("z")]);
        assert!(names(&registry, "nope").is_empty());
        // A session that ends leaves its connector listed, disconnected.
        assert!(registry.end("a", 1).is_some());
        assert_eq!(names(&registry, "g1")[0], ("a".to_owned(), false));
        // Coming back in another group moves it.
        arrive(&registry, "a", "g2", 10);
        assert_eq!(names(&registry, "g1"), [yes("b"), yes("c")]);
        assert_eq!(names(&registry, "g2"), [yes("a"), yes("z")]);
        arrive(&registry, "a", "g2", 11);
        assert_eq!(names(&registry, "g2"), [yes("a"), yes("z")]);
        registry.forget("z");
        registry.forget("a");
        assert!(names(&registry, "g2").is_empty());
        assert!(!lock(&registry.conns).groups.contains_key("g2"));
        assert_eq!(names(&registry, "g1"), [yes("b"), yes("c")]);
    }

    /// Each member's link as a decision reads it (the group index's copy)
    /// follows what changes it in the connector's entry: a heartbeat's
    /// load, a new session, every way of closing one.
    #[test]
    fn a_members_link_follows_its_heartbeats_sessions_and_closes() {
        let state = crate::state::policy_state::one_segment(443);
        let registry = Registry::default();
        arrive(&registry, "a", "g", 1);
        arrive(&registry, "b", "g", 2);
        let link = |n: &str| {
            registry
                .members("g")
                .into_iter()
                .find(|(m, _)| m == n)
                .map(|(_, l)| l)
        };
        let beat = |cycle_seconds| v1::Heartbeat {
            load: Some(v1::CheckLoad {
                cycle_seconds,
                ..Default::default()
            }),
            replicas: None,
            status: None,
        };
        let seven = Duration::from_secs(7);
        registry.heartbeat(&state, "a", SystemTime::now(), beat(7.0), 0);
        assert_eq!(
            link("a"),
            Some(Link {
                connected: true,
                cycle: seven,
                drained: false,
            })
        );
        assert_ne!(link("b").map(|l| l.cycle), Some(seven));
        assert!(registry.close("a").is_some());
        assert_eq!(link("a").map(|l| l.connected), Some(false));
        let closed = registry.close_where(|n, _, _| (n == "b").then_some("test"));
        assert_eq!(closed.len(), 1);
        assert_eq!(link("b").map(|l| l.connected), Some(false));
        // A new session starts without the old one's load.
        arrive(&registry, "a", "g", 3);
        assert_eq!(link("a").map(|l| l.connected), Some(true));
        assert_ne!(link("a").map(|l| l.cycle), Some(seven));
        registry.heartbeat(&state, "a", SystemTime::now(), beat(7.0), 0);
        assert!(registry.end("a", 99).is_none());
        assert_eq!(link("a").map(|l| l.connected), Some(true));
        assert!(registry.end("a", 3).is_some());
        assert_eq!(link("a").map(|l| l.connected), Some(false));
        arrive(&registry, "b", "g", 4);
        let (live, _) = registry.close_streams("b");
        assert!(live.is_some());
        assert_eq!(link("b").map(|l| l.connected), Some(false));
        arrive(&registry, "b", "g", 5);
        assert_eq!(registry.close_all().len(), 1);
        assert!(registry.members("g").iter().all(|(_, l)| !l.connected));
    }

    /// A member's link says it is drained while an administrator's drain
    /// (also one read before it connected) or its session's own drain
    /// holds; the session's ends with the session.
    #[test]
    fn a_members_link_follows_its_drains() {
        let registry = Registry::default();
        let drained = |n: &str| {
            registry
                .members("g")
                .into_iter()
                .find(|(m, _)| m == n)
                .map(|(_, l)| l.drained)
        };
        let record = |n: &str| DrainRecord {
            connector: n.to_owned(),
            since_ms: 1,
            actor_kind: "token".into(),
            actor: "ops".into(),
        };
        // Read from the store before "b" ever connected.
        assert!(registry.set_drains(vec![record("b")]));
        assert!(!registry.set_drains(vec![record("b")]), "no change");
        arrive(&registry, "a", "g", 1);
        arrive(&registry, "b", "g", 2);
        assert_eq!((drained("a"), drained("b")), (Some(false), Some(true)));
        registry.drained(record("a"));
        assert_eq!(drained("a"), Some(true));
        registry.undrained("a");
        assert_eq!(drained("a"), Some(false));
        assert!(registry.set_drains(Vec::new()));
        assert_eq!(drained("b"), Some(false));
        // A session's own drain lasts as long as the session.
        let own = SelfDrain {
            since_ms: 5,
            until_ms: Some(10),
        };
        assert!(registry.self_drain("a", own));
        assert_eq!(drained("a"), Some(true));
        assert!(registry.self_drain("a", SelfDrain { since_ms: 7, ..own }));
        let kept = registry.list(|n, e| (n == "a").then(|| e.self_drain()).flatten());
        assert_eq!(kept.into_iter().flatten().collect::<Vec<_>>(), vec![own]);
        assert!(registry.end("a", 1).is_some());
        assert_eq!(drained("a"), Some(false));
        arrive(&registry, "a", "g", 3);
        assert_eq!(drained("a"), Some(false), "a new session is not drained");
        assert!(!registry.self_drain("nobody", own));
        assert!(registry.snapshot().values().all(|c| !c.drained));
    }

    #[test]
    fn hello_versions_are_printable_ascii_and_bounded() {
        assert_eq!(sanitize_version("0.3.1 (abc)"), "0.3.1 (abc)");
        assert_eq!(
            sanitize_version("1.0\nERROR forged line\u{1b}[31m"),
            "1.0?ERROR forged line?[31m"
        );
        assert_eq!(sanitize_version("é\t\0"), "???");
        assert_eq!(sanitize_version(&"v".repeat(1000)).len(), MAX_VERSION_CHARS);
    }
}
