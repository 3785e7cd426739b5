//! The health table: the latest report per (application, connector), with
//! its per-address detail, and the last status transitions per application.
//!
//! **Invariant:** every method takes a shard's lock for one short, purely
//! synchronous critical section; nothing here awaits, so the access path can
//! never queue behind a lock held across an `.await`.
//!
//! The table is split into [`SHARDS`] shards by a hash of the application
//! key, each behind its own lock, so sessions storing reports of different
//! applications on different threads rarely contend (one lock for the whole
//! table was the CA's most contended point under report load). A method that
//! visits every application takes the shards' locks one after another, never
//! two at once: what it decides, it decides per report, so it needs no
//! snapshot of the whole table.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use policy::{AddressResult, AppKey, HostRef, Protocol, Status};
use serde::Serialize;

use crate::ground::clock::unix_ms;
use crate::ground::sync::{read, write};
use crate::state::addresses::{AddressBook, AddressChange, StatusRow};
use crate::state::series::{Merge, RttSeries};

/// Why a connector's status for an application is Unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownCause {
    /// The connector's session ended.
    Disconnected,
    /// The on-access window ended (reported by the connector or noticed by
    /// the CA).
    WindowExpired,
    /// No report for longer than the staleness limit.
    Stale,
    /// A full-state report of the connector left the application out.
    NotInFullState,
    /// The connector itself reported Unknown.
    Reported,
    /// On-access: a result no verified access asked for (no valid access
    /// id); kept and listed, never routed on.
    Unsolicited,
}

impl UnknownCause {
    /// The snake_case name used in JSON and on the dashboard.
    pub fn as_str(self) -> &'static str {
        match self {
            UnknownCause::Disconnected => "disconnected",
            UnknownCause::WindowExpired => "window_expired",
            UnknownCause::Stale => "stale",
            UnknownCause::NotInFullState => "not_in_full_state",
            UnknownCause::Reported => "reported",
            UnknownCause::Unsolicited => "unsolicited",
        }
    }
}

/// One connector's latest report for one application.
#[derive(Clone, Debug)]
pub struct Report {
    /// The connector's group (shared by all of a session's reports).
    pub group: Arc<str>,
    /// The status as last reported (or set Unknown by the CA).
    pub status: Status,
    /// Per-address results (empty once the status is set Unknown).
    pub addresses: protocol::scan::Addresses,
    /// The resolver's reason when DNS failed.
    pub dns_error: Option<String>,
    /// When the CA received it.
    pub received_at: Instant,
    /// When the check behind it ran, on the CA's monotonic clock: the
    /// receive time minus the age the connector reported (staleness counts
    /// from here, so a re-sent old result does not look fresh).
    pub checked_at: Instant,
    /// When the CA received it (for display).
    pub received_wall: SystemTime,
    /// When the connector finished the check round (its clock), Unix ms.
    pub checked_at_unix_ms: i64,
    /// Why the status is Unknown, when it is.
    pub unknown_cause: Option<UnknownCause>,
    /// The connector's smoothed RTT to the application
    /// (`policy::smooth_rtt` over its reports' reachable addresses); set by
    /// the table when it stores a report, whatever the caller put here.
    pub rtt: Option<Duration>,
}

/// What an updated report no longer holds, freed by the caller after the
/// shard's lock is released: the allocations only (results held inline are
/// dropped in place, which frees nothing but a failure's detail text).
#[derive(Debug)]
struct Replaced {
    _group: Arc<str>,
    _addresses: Vec<AddressResult>,
    _dns_error: Option<String>,
}

impl Report {
    /// Takes `new`'s fields in place (the entry is not moved as a whole,
    /// and its group is kept when it is the same one); returns what was
    /// replaced.
    fn update(&mut self, new: Report) -> Replaced {
        let Report {
            group,
            status,
            addresses,
            dns_error,
            received_at,
            checked_at,
            received_wall,
            checked_at_unix_ms,
            unknown_cause,
            rtt,
        } = new;
        let group = if Arc::ptr_eq(&self.group, &group) {
            group
        } else {
            std::mem::replace(&mut self.group, group)
        };
        self.status = status;
        self.received_at = received_at;
        self.checked_at = checked_at;
        self.received_wall = received_wall;
        self.checked_at_unix_ms = checked_at_unix_ms;
        self.unknown_cause = unknown_cause;
        self.rtt = rtt;
        let old_addresses = if self.addresses.spilled() {
            std::mem::replace(&mut self.addresses, addresses).into_vec()
        } else {
            self.addresses = addresses;
            Vec::new()
        };
        Replaced {
            _group: group,
            _addresses: old_addresses,
            _dns_error: std::mem::replace(&mut self.dns_error, dns_error),
        }
    }
}

/// When a check `age` old at `received_at` ran, on the same monotonic
/// clock. An age beyond what the clock can represent (a hostile or broken
/// connector) counts as a year, which is stale under any interval.
pub fn checked_at(received_at: Instant, age: std::time::Duration) -> Instant {
    const LONGEST: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);
    // A fresh result (the usual case under load) needs no clock arithmetic.
    if age.is_zero() {
        return received_at;
    }
    received_at
        .checked_sub(age)
        .or_else(|| received_at.checked_sub(age.min(LONGEST)))
        .unwrap_or(received_at)
}

/// A status change of one connector for one application.
#[derive(Clone, Debug)]
pub struct Transition {
    /// When the CA saw it.
    pub at: SystemTime,
    /// Which connector.
    pub connector: String,
    /// Status before.
    pub from: Status,
    /// Status after.
    pub to: Status,
    /// Why (`report`, or an `UnknownCause` name).
    pub cause: &'static str,
}

#[derive(Debug, Default)]
struct AppRecord {
    reports: Reports,
    transitions: VecDeque<Transition>,
    /// Every address the connectors' answers have had.
    addresses: AddressBook,
    /// The writes a roster follows (`HealthTable::facts`).
    writes: Writes,
}

/// The writes to one application's reports, for a roster that follows it
/// (`state::rosters`): once a roster read the record (`watched`), every
/// write notes its connector, numbered; the oldest are dropped past a
/// bound (a roster behind them reads every report again).
#[derive(Debug, Default)]
struct Writes {
    /// The record's identity: a record removed and made again is another.
    id: u64,
    /// Set under a read lock by the roster's first reading.
    watched: std::sync::atomic::AtomicBool,
    seq: u64,
    /// Every write numbered above `floor` is in `log`.
    floor: u64,
    log: Vec<(u64, Arc<str>)>,
}

impl Writes {
    /// Notes a write of `connector`'s report (`reports`: how many the
    /// application has, which bounds the log).
    fn note(&mut self, connector: &Arc<str>, reports: usize) {
        if !self.watched.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        self.seq += 1;
        self.log.push((self.seq, Arc::clone(connector)));
        if self.log.len() > reports.saturating_mul(2).saturating_add(64) {
            let cut = self.log.len() / 2;
            self.floor = self.log[cut - 1].0;
            self.log.drain(..cut);
        }
    }

    fn at(&self) -> FactsAt {
        FactsAt {
            record: self.id,
            seq: self.seq,
        }
    }
}

/// What a roster reads of one connector's report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fact {
    /// The status as stored.
    pub status: Status,
    /// When the check behind it ran.
    pub checked_at: Instant,
    /// The smoothed RTT.
    pub rtt: Option<Duration>,
}

impl Fact {
    fn of(r: &Report) -> Fact {
        Fact {
            status: r.status,
            checked_at: r.checked_at,
            rtt: r.rtt,
        }
    }
}

/// Where a roster's reading of an application's reports stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FactsAt {
    record: u64,
    seq: u64,
}

/// An application's reports as a roster reads them.
#[derive(Debug)]
pub(crate) enum Facts {
    /// No connector reported it.
    Absent,
    /// Every connector's report, in name order.
    All {
        at: FactsAt,
        reports: Vec<(Arc<str>, Fact)>,
    },
    /// The reports written since the reading asked about (`None`: removed).
    Changed {
        at: FactsAt,
        changed: Vec<(Arc<str>, Option<Fact>)>,
    },
}

/// The connectors' latest reports for one application, in name order.
///
/// Names and reports are two parallel vectors, sorted by name. A session
/// stores its reports under one shared name (`Arc<str>`), so the slot of a
/// known connector is found by comparing pointers in the contiguous name
/// vector, without reading any name's text; only a miss (a new connector,
/// or the first report of a new session) searches by text, and a hit by
/// text adopts the caller's pointer for the next time. With a `BTreeMap<String,
/// Report>` each update compared the text of several names, each in its own
/// allocation: under report load that was a third of the table's CPU.
#[derive(Clone, Debug, Default)]
pub struct Reports {
    names: Vec<Arc<str>>,
    reports: Vec<Report>,
    /// Each connector's smoothed RTT over time (parallel to `reports`),
    /// allocated with its first RTT.
    rtt: Vec<Option<Box<RttSeries>>>,
}

impl Reports {
    /// `name`'s report.
    pub fn get(&self, name: &str) -> Option<&Report> {
        self.search(name).ok().map(|i| &self.reports[i])
    }

    /// `name`'s smoothed RTT over time, once it reported one.
    pub fn rtt_series(&self, name: &str) -> Option<&RttSeries> {
        self.search(name).ok().and_then(|i| self.rtt[i].as_deref())
    }

    /// Records the smoothed RTT `rtt` of the connector in slot `i` at
    /// `at_ms`, Unix ms (the latest of each interval is kept).
    fn record_rtt(&mut self, i: usize, at_ms: i64, rtt: Duration) {
        let us = u32::try_from(rtt.as_micros()).unwrap_or(u32::MAX);
        self.rtt[i]
            .get_or_insert_with(Box::default)
            .record(at_ms, us, Merge::Latest);
    }

    /// How many connectors reported.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no connector reported.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every connector's name and report, in name order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Report)> + '_ {
        self.names.iter().map(|n| &**n).zip(&self.reports)
    }

    /// Where `name` is (`Ok`) or would go (`Err`), by its text.
    fn search(&self, name: &str) -> Result<usize, usize> {
        self.names.binary_search_by(|n| (**n).cmp(name))
    }

    /// The slot of `name`: by pointer first, then by text (adopting
    /// `name`'s pointer when its text is found).
    fn slot(&mut self, name: &Arc<str>) -> Result<usize, usize> {
        if let Some(i) = self.names.iter().position(|n| Arc::ptr_eq(n, name)) {
            return Ok(i);
        }
        let found = self.search(name);
        if let Ok(i) = found {
            self.names[i] = Arc::clone(name);
        }
        found
    }

    fn insert_at(&mut self, at: usize, name: &Arc<str>, report: Report) {
        self.names.insert(at, Arc::clone(name));
        self.reports.insert(at, report);
        self.rtt.insert(at, None);
    }

    /// Keeps the reports for which `keep` is true; returns the names of
    /// those removed (no allocation when none is).
    fn retain(&mut self, mut keep: impl FnMut(&str, &mut Report) -> bool) -> Vec<Arc<str>> {
        let mut removed = Vec::new();
        let mut i = 0;
        while i < self.names.len() {
            if keep(&self.names[i], &mut self.reports[i]) {
                i += 1;
            } else {
                removed.push(self.names.remove(i));
                self.reports.remove(i);
                self.rtt.remove(i);
            }
        }
        removed
    }
}

impl std::ops::Index<&str> for Reports {
    type Output = Report;

    /// `name`'s report; panics when it has none (as a map's index does).
    fn index(&self, name: &str) -> &Report {
        match self.get(name) {
            Some(r) => r,
            None => panic!("no report of connector {name:?}"),
        }
    }
}

impl<'a> IntoIterator for &'a Reports {
    type Item = (&'a str, &'a Report);
    type IntoIter = std::iter::Zip<
        std::iter::Map<std::slice::Iter<'a, Arc<str>>, fn(&Arc<str>) -> &str>,
        std::slice::Iter<'a, Report>,
    >;

    fn into_iter(self) -> Self::IntoIter {
        let name: fn(&Arc<str>) -> &str = |n| n;
        self.names.iter().map(name).zip(self.reports.iter())
    }
}

/// The RTT sample `report` gives, if any address was reachable.
fn rtt_sample_of(report: &Report) -> Option<Duration> {
    match report.addresses.as_slice() {
        // One address (the usual report): its RTT is the sample, as
        // `rtt_sample` would compute it, without iterating twice.
        [only] => only.reachable.then_some(only.rtt),
        all => policy::rtt_sample(all),
    }
}

impl AppRecord {
    /// What the report just stored in slot `i` of `connector` at `wall_ms`
    /// (Unix ms) adds to the series and the address book: its smoothed RTT
    /// when it had a reachable result (`sampled`), and its addresses (each
    /// change the address history shows pushed to `changes`; `status`:
    /// whether the report changed the connector's status).
    fn follow(
        &mut self,
        i: usize,
        connector: &Arc<str>,
        sampled: bool,
        wall_ms: i64,
        status: StatusRow,
        changes: &mut Vec<AddressChange>,
    ) {
        if let (true, Some(rtt)) = (sampled, self.reports.reports[i].rtt) {
            self.reports.record_rtt(i, wall_ms, rtt);
        }
        let stored = &self.reports.reports[i].addresses;
        self.addresses
            .record(connector, stored, wall_ms, status, changes);
    }

    /// Turns the report in slot `i` Unknown for `cause` (it was not),
    /// recording the transition and queuing it in `published`.
    fn mark(
        &mut self,
        key: &AppKey,
        i: usize,
        cause: UnknownCause,
        wall: SystemTime,
        keep: usize,
        published: &mut Vec<(AppKey, Transition)>,
    ) {
        let report = &mut self.reports.reports[i];
        let t = Transition {
            at: wall,
            connector: self.reports.names[i].to_string(),
            from: report.status,
            to: Status::Unknown,
            cause: cause.as_str(),
        };
        report.status = Status::Unknown;
        report.addresses.clear();
        report.dns_error = None;
        report.unknown_cause = Some(cause);
        self.writes
            .note(&self.reports.names[i], self.reports.reports.len());
        published.push((key.clone(), t.clone()));
        self.push(t, keep);
    }

    fn push(&mut self, t: Transition, keep: usize) {
        self.transitions.push_back(t);
        while self.transitions.len() > keep {
            self.transitions.pop_front();
        }
    }
}

/// An application key as the table looks it up: owned ([`AppKey`]) or
/// borrowed from a report message ([`KeyRef`]). Both hash and compare as
/// the same parts, so a borrowed key finds the owned one in the maps
/// without being copied.
pub trait KeyLike {
    /// Segment name, normalised host text, protocol and port.
    fn parts(&self) -> (&str, &str, Protocol, u16);
}

impl KeyLike for AppKey {
    fn parts(&self) -> (&str, &str, Protocol, u16) {
        (&self.segment, &self.host, self.protocol, self.port)
    }
}

/// Hashes as `AppKey`'s derived `Hash` does (`Host` hashes as its text).
impl Hash for dyn KeyLike + '_ {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let (segment, host, protocol, port) = self.parts();
        segment.hash(state);
        host.hash(state);
        protocol.hash(state);
        port.hash(state);
    }
}

impl PartialEq for dyn KeyLike + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for dyn KeyLike + '_ {}

impl<'a> Borrow<dyn KeyLike + 'a> for AppKey {
    fn borrow(&self) -> &(dyn KeyLike + 'a) {
        self
    }
}

/// A borrowed application key: the report intake's, read from the message
/// (`protocol::scan`).
#[derive(Clone, Copy, Debug)]
pub struct KeyRef<'a> {
    /// Segment name.
    pub segment: &'a str,
    /// The host, in normal form.
    pub host: HostRef<'a>,
    /// Protocol.
    pub protocol: Protocol,
    /// Port.
    pub port: u16,
}

impl KeyLike for KeyRef<'_> {
    fn parts(&self) -> (&str, &str, Protocol, u16) {
        (self.segment, self.host.as_str(), self.protocol, self.port)
    }
}

/// A key [`HealthTable::replace`] takes: looked up as it is, owned only
/// when the table keeps it (a new application, a published transition).
pub trait TableKey: KeyLike {
    /// The owned key, copied.
    fn to_key(&self) -> AppKey;
    /// The owned key.
    fn into_key(self) -> AppKey;
}

impl TableKey for AppKey {
    fn to_key(&self) -> AppKey {
        self.clone()
    }

    fn into_key(self) -> AppKey {
        self
    }
}

impl TableKey for KeyRef<'_> {
    fn to_key(&self) -> AppKey {
        AppKey {
            segment: self.segment.to_owned(),
            host: self.host.to_host(),
            protocol: self.protocol,
            port: self.port,
        }
    }

    fn into_key(self) -> AppKey {
        self.to_key()
    }
}

/// How many shards the table has (a power of two, comfortably more than
/// the worker threads that store reports at once).
pub const SHARDS: usize = 16;

/// The hasher of the table's maps: foldhash (what hashbrown uses by default;
/// several times faster than std's SipHash on these short keys), with a
/// per-process random seed, so hosts a connector reports under a wildcard
/// cannot be chosen to collide.
type Hasher = foldhash::fast::RandomState;

type Shard = RwLock<ShardMap>;

/// One shard's applications: a hash table looked up with the hash that
/// also picked the shard (`HealthTable::hash`), so a key is hashed once per
/// lookup, not twice (a `HashMap` hashes again with its own hasher).
#[derive(Debug, Default)]
struct ShardMap {
    entries: hashbrown::HashTable<(AppKey, AppRecord)>,
    /// Per connector, the hashes of this shard's applications it has a
    /// report for: what is done to one connector's reports (its session
    /// ends, its full state leaves applications out) visits those, not
    /// the whole table, which at 10,000 connectors made a reconnect storm
    /// quadratic. Kept under the shard's lock with `entries`.
    by_connector:
        std::collections::HashMap<Arc<str>, std::collections::HashSet<u64, Hasher>, Hasher>,
}

impl ShardMap {
    fn find(&self, hash: u64, key: &dyn KeyLike) -> Option<&AppRecord> {
        let parts = key.parts();
        self.entries
            .find(hash, |(k, _)| KeyLike::parts(k) == parts)
            .map(|(_, r)| r)
    }

    fn find_mut(&mut self, hash: u64, key: &dyn KeyLike) -> Option<&mut AppRecord> {
        let parts = key.parts();
        self.entries
            .find_mut(hash, |(k, _)| KeyLike::parts(k) == parts)
            .map(|(_, r)| r)
    }

    /// Adds `key`, which the shard does not hold, with an empty record.
    fn insert_new(&mut self, hash: u64, key: AppKey, hasher: &Hasher, id: u64) -> &mut AppRecord {
        let mut record = AppRecord::default();
        record.writes.id = id;
        let entry = self.entries.insert_unique(hash, (key, record), |(k, _)| {
            hasher.hash_one(k as &dyn KeyLike)
        });
        &mut entry.into_mut().1
    }

    fn iter(&self) -> impl Iterator<Item = (&AppKey, &AppRecord)> + '_ {
        self.entries.iter().map(|(k, r)| (k, r))
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (&AppKey, &mut AppRecord)> + '_ {
        self.entries.iter_mut().map(|(k, r)| (&*k, r))
    }

    /// Notes that `connector` has a report for the application with `hash`.
    fn index(&mut self, connector: &Arc<str>, hash: u64) {
        self.by_connector
            .entry(Arc::clone(connector))
            .or_default()
            .insert(hash);
    }

    /// Forgets that `connector` has a report for the application with
    /// `hash`, unless another application with that hash still has one.
    fn unindex(&mut self, connector: &str, hash: u64, hasher: &Hasher) {
        let still = self.entries.iter_hash(hash).any(|(k, r)| {
            hasher.hash_one(k as &dyn KeyLike) == hash && r.reports.search(connector).is_ok()
        });
        if still {
            return;
        }
        if let Some(hashes) = self.by_connector.get_mut(connector) {
            hashes.remove(&hash);
            if hashes.is_empty() {
                self.by_connector.remove(connector);
            }
        }
    }

    /// Removes the reports for which `remove` is true (and applications
    /// left without any), keeping the index; returns how many went.
    fn remove_reports(
        &mut self,
        hasher: &Hasher,
        mut remove: impl FnMut(&AppKey, &str, &mut Report) -> bool,
    ) -> usize {
        let mut gone: Vec<(u64, Arc<str>)> = Vec::new();
        for (key, record) in self.entries.iter_mut() {
            let removed = record.reports.retain(|c, r| !remove(key, c, r));
            for c in &removed {
                record.writes.note(c, record.reports.len());
            }
            if !removed.is_empty() {
                let hash = hasher.hash_one(&*key as &dyn KeyLike);
                gone.extend(removed.into_iter().map(|c| (hash, c)));
            }
        }
        self.entries.retain(|(_, r)| !r.reports.is_empty());
        for (hash, c) in &gone {
            self.unindex(c, *hash, hasher);
        }
        gone.len()
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The table. Its data is read by cloning it out, or through `inspect`
/// under a shard's read lock.
#[derive(Debug)]
pub struct HealthTable {
    /// Picks a key's shard.
    hasher: Hasher,
    shards: Box<[Shard]>,
    /// Transitions not yet taken by `take_transitions` (the history and the
    /// live streams): pushed after the shard's lock is released, so this
    /// lock is never held with a shard's.
    outbox: std::sync::Mutex<Vec<(AppKey, Transition)>>,
    /// Address changes not yet taken by `take_address_changes` (the
    /// address history), likewise.
    address_outbox: std::sync::Mutex<Vec<(AppKey, SystemTime, AddressChange)>>,
    /// Numbers the records (`Writes::id`).
    records: std::sync::atomic::AtomicU64,
}

impl Default for HealthTable {
    fn default() -> Self {
        HealthTable {
            hasher: Hasher::default(),
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            outbox: std::sync::Mutex::default(),
            address_outbox: std::sync::Mutex::default(),
            records: std::sync::atomic::AtomicU64::new(1),
        }
    }
}

/// Most transitions the outbox holds between two `take_transitions`; past
/// it the oldest are dropped (and counted in the log), so a stalled taker
/// cannot grow memory without bound.
const OUTBOX_CAP: usize = 100_000;

impl HealthTable {
    /// `key`'s hash, which picks its shard and its slot in the shard.
    fn hash(&self, key: &dyn KeyLike) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The shard of a key with `hash`: bits 32 and up pick it. A shard's
    /// table takes its slot from the low bits and its tags from the top 7,
    /// so the shard's bits must be neither: every key of a shard shares
    /// them.
    fn shard_of(&self, hash: u64) -> &Shard {
        // SHARDS is a power of two.
        &self.shards[((hash >> 32) as usize) & (SHARDS - 1)]
    }

    /// The shard that holds `key`, and `key`'s hash.
    fn shard(&self, key: &dyn KeyLike) -> (&Shard, u64) {
        let hash = self.hash(key);
        (self.shard_of(hash), hash)
    }

    /// A new record's id (`Writes::id`).
    fn next_id(&self) -> u64 {
        self.records
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Stores `report` as `connector`'s latest for `key`; returns the
    /// previous status (Unknown when there was none).
    pub fn record(&self, key: AppKey, connector: &str, report: Report, keep: usize) -> Status {
        self.replace(key, &Arc::from(connector), report, keep)
            .map_or(Status::Unknown, |(status, _)| status)
    }

    /// Stores `report` as `connector`'s latest for `key`; returns the
    /// previous report's status and check time, if there was one.
    pub fn replace(
        &self,
        key: impl TableKey,
        connector: &Arc<str>,
        report: Report,
        keep: usize,
    ) -> Option<(Status, Instant)> {
        let (shard, hash) = self.shard(&key);
        let wall = report.received_wall;
        // The series and the address book each keep Unix ms: read once,
        // before the lock.
        let wall_ms = i64::try_from(unix_ms(wall)).unwrap_or(i64::MAX);
        let mut apps = write(shard);
        let transition = |previous: Status, report: &Report| {
            (previous != report.status).then(|| Transition {
                at: report.received_wall,
                connector: connector.to_string(),
                from: previous,
                to: report.status,
                cause: report.unknown_cause.map_or("report", UnknownCause::as_str),
            })
        };
        // The smoothed RTT goes on from the previous report's; a report
        // with no reachable address keeps it (a failure says nothing about
        // distance) and adds no point to its series.
        let mut report = report;
        // Addresses that appeared, changed result or left (none, and no
        // allocation, for most reports).
        let mut changes: Vec<AddressChange> = Vec::new();
        let store = |record: &mut AppRecord| {
            let sample = rtt_sample_of(&report);
            // One search of the connector's slot, then update or insert.
            let (i, before, change, old) = match record.reports.slot(connector) {
                Ok(i) => {
                    let slot = &mut record.reports.reports[i];
                    report.rtt = sample.map(|s| policy::smooth_rtt(slot.rtt, s)).or(slot.rtt);
                    let before = (slot.status, slot.checked_at);
                    let change = transition(slot.status, &report);
                    (i, Some(before), change, Some(slot.update(report)))
                }
                Err(at) => {
                    report.rtt = sample.map(|s| policy::smooth_rtt(None, s));
                    let change = transition(Status::Unknown, &report);
                    record.reports.insert_at(at, connector, report);
                    (at, None, change, None)
                }
            };
            let row = StatusRow::after(change.is_some());
            record.follow(i, connector, sample.is_some(), wall_ms, row, &mut changes);
            record.writes.note(connector, record.reports.len());
            if let Some(t) = &change {
                record.push(t.clone(), keep);
            }
            (before, change, old)
        };
        // The key stays ours for the published transition; it is cloned
        // only when the application is new. One search of the map for a
        // known application, not two (each compares the key's strings).
        let (before, published, old) = match apps.find_mut(hash, &key) {
            Some(record) => store(record),
            None => store(apps.insert_new(hash, key.to_key(), &self.hasher, self.next_id())),
        };
        if before.is_none() {
            // The connector's first report of the application.
            apps.index(connector, hash);
        }
        // The replaced report is freed after the lock is released.
        drop(apps);
        drop(old);
        if !changes.is_empty() {
            self.publish_addresses(key.to_key(), wall, changes);
        }
        // The outbox is one lock for the whole table: only a transition
        // takes it (most reports change nothing).
        if let Some(t) = published {
            self.publish(std::iter::once((key.into_key(), t)));
        }
        before
    }

    /// Queues transitions for `take_transitions`.
    fn publish(&self, transitions: impl IntoIterator<Item = (AppKey, Transition)>) {
        let mut outbox = crate::ground::sync::lock(&self.outbox);
        outbox.extend(transitions);
        if outbox.len() > OUTBOX_CAP {
            let excess = outbox.len() - OUTBOX_CAP;
            outbox.drain(..excess);
            tracing::warn!(
                dropped = excess,
                "status history: transitions dropped (nobody took them)"
            );
        }
    }

    /// Every transition since the last call, oldest first.
    pub fn take_transitions(&self) -> Vec<(AppKey, Transition)> {
        std::mem::take(&mut *crate::ground::sync::lock(&self.outbox))
    }

    /// Queues address changes of `key` seen at `at` for
    /// `take_address_changes` (bounded as the transitions' outbox is).
    fn publish_addresses(&self, key: AppKey, at: SystemTime, changes: Vec<AddressChange>) {
        let mut outbox = crate::ground::sync::lock(&self.address_outbox);
        outbox.extend(changes.into_iter().map(|c| (key.clone(), at, c)));
        if outbox.len() > OUTBOX_CAP {
            let excess = outbox.len() - OUTBOX_CAP;
            outbox.drain(..excess);
            tracing::warn!(
                dropped = excess,
                "address history: changes dropped (nobody took them)"
            );
        }
    }

    /// Whether address changes wait for `take_address_changes`.
    pub fn has_address_changes(&self) -> bool {
        !crate::ground::sync::lock(&self.address_outbox).is_empty()
    }

    /// Every address change since the last call, oldest first, with when
    /// the CA saw it.
    pub fn take_address_changes(&self) -> Vec<(AppKey, SystemTime, AddressChange)> {
        std::mem::take(&mut *crate::ground::sync::lock(&self.address_outbox))
    }

    /// Sets every entry for which `decide` names a cause to Unknown (entries
    /// already Unknown are left alone); returns how many changed.
    pub fn mark_unknown(
        &self,
        wall: SystemTime,
        keep: usize,
        mut decide: impl FnMut(&AppKey, &str, &Report) -> Option<UnknownCause>,
    ) -> usize {
        let mut changed = 0;
        for shard in &self.shards {
            let mut published = Vec::new();
            changed += Self::mark_shard(&mut write(shard), wall, keep, &mut decide, &mut published);
            self.publish(published);
        }
        changed
    }

    fn mark_shard(
        apps: &mut ShardMap,
        wall: SystemTime,
        keep: usize,
        decide: &mut impl FnMut(&AppKey, &str, &Report) -> Option<UnknownCause>,
        published: &mut Vec<(AppKey, Transition)>,
    ) -> usize {
        let mut changed = 0;
        for (key, record) in apps.iter_mut() {
            for i in 0..record.reports.len() {
                let report = &record.reports.reports[i];
                if report.status == Status::Unknown {
                    continue;
                }
                if let Some(cause) = decide(key, &record.reports.names[i], report) {
                    record.mark(key, i, cause, wall, keep, published);
                    changed += 1;
                }
            }
        }
        changed
    }

    /// [`HealthTable::mark_unknown`] for the reports of `connector` only:
    /// visits the applications it has a report for (each shard's index),
    /// not the whole table. Returns how many turned Unknown.
    pub fn mark_unknown_of(
        &self,
        connector: &str,
        wall: SystemTime,
        keep: usize,
        mut decide: impl FnMut(&AppKey, &Report) -> Option<UnknownCause>,
    ) -> usize {
        let mut changed = 0;
        for shard in &self.shards {
            let mut published = Vec::new();
            {
                let mut apps = write(shard);
                let Some(hashes) = apps.by_connector.get(connector) else {
                    continue;
                };
                let hashes: Vec<u64> = hashes.iter().copied().collect();
                for hash in hashes {
                    for (key, record) in apps.entries.iter_hash_mut(hash) {
                        if self.hasher.hash_one(&*key as &dyn KeyLike) != hash {
                            continue;
                        }
                        let Ok(i) = record.reports.search(connector) else {
                            continue;
                        };
                        let report = &record.reports.reports[i];
                        if report.status == Status::Unknown {
                            continue;
                        }
                        if let Some(cause) = decide(key, report) {
                            record.mark(key, i, cause, wall, keep, &mut published);
                            changed += 1;
                        }
                    }
                }
            }
            self.publish(published);
        }
        changed
    }

    /// `key`'s reports for a roster that read them at `since`: those
    /// written since, or all when it read another record, missed dropped
    /// writes or read none. The record notes its writes from here on.
    pub(crate) fn facts(&self, key: &AppKey, since: Option<FactsAt>) -> Facts {
        let (shard, hash) = self.shard(key);
        let apps = read(shard);
        let Some(r) = apps.find(hash, key) else {
            return Facts::Absent;
        };
        let w = &r.writes;
        let at = w.at();
        match since {
            Some(s)
                if s.record == w.id
                    && s.seq >= w.floor
                    && w.watched.load(std::sync::atomic::Ordering::Relaxed) =>
            {
                let from = w.log.partition_point(|(seq, _)| *seq <= s.seq);
                let changed = w.log[from..]
                    .iter()
                    .map(|(_, c)| (Arc::clone(c), r.reports.get(c).map(Fact::of)))
                    .collect();
                Facts::Changed { at, changed }
            }
            _ => {
                w.watched.store(true, std::sync::atomic::Ordering::Relaxed);
                let reports = r
                    .reports
                    .names
                    .iter()
                    .zip(&r.reports.reports)
                    .map(|(c, rep)| (Arc::clone(c), Fact::of(rep)))
                    .collect();
                Facts::All { at, reports }
            }
        }
    }

    /// Every connector's stored status and check time (`Report::checked_at`)
    /// for `key`.
    pub fn statuses(&self, key: &AppKey) -> Vec<(String, Status, Instant)> {
        let (shard, hash) = self.shard(key);
        read(shard)
            .find(hash, key)
            .map(|r| {
                r.reports
                    .iter()
                    .map(|(c, rep)| (c.to_owned(), rep.status, rep.checked_at))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// What `f` makes of `key`'s reports and latest transition, under the
    /// shard's read lock (nothing is copied out; `f` must not take other
    /// locks). `None` when no connector reported `key`.
    pub fn inspect<R>(
        &self,
        key: &AppKey,
        f: impl FnOnce(&Reports, Option<&Transition>) -> R,
    ) -> Option<R> {
        let (shard, hash) = self.shard(key);
        read(shard)
            .find(hash, key)
            .map(|r| f(&r.reports, r.transitions.back()))
    }

    /// A copy of every address `key` has had.
    pub fn address_book(&self, key: &AppKey) -> Option<AddressBook> {
        let (shard, hash) = self.shard(key);
        read(shard).find(hash, key).map(|r| r.addresses.clone())
    }

    /// A copy of everything known about `key`.
    pub fn app(&self, key: &AppKey) -> Option<(Reports, Vec<Transition>)> {
        let (shard, hash) = self.shard(key);
        read(shard)
            .find(hash, key)
            .map(|r| (r.reports.clone(), r.transitions.iter().cloned().collect()))
    }

    /// Removes every connector's entry for which `remove` is true, and
    /// applications left without any; returns how many entries went.
    pub fn remove_where(&self, mut remove: impl FnMut(&AppKey, &str, &Report) -> bool) -> usize {
        let mut removed = 0;
        for shard in &self.shards {
            removed += write(shard).remove_reports(&self.hasher, |k, c, r| remove(k, c, r));
        }
        removed
    }

    /// Every TLS certificate expiry the latest reports carry: (application,
    /// connector, address, notAfter in Unix seconds), in no order.
    pub fn certificates(&self) -> Vec<(AppKey, Arc<str>, std::net::IpAddr, i64)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            for (key, record) in read(shard).iter() {
                for (connector, report) in &record.reports {
                    for a in &report.addresses {
                        if let Some(t) = a.check.as_ref().and_then(|c| c.not_after) {
                            out.push((key.clone(), Arc::from(connector), a.address, t));
                        }
                    }
                }
            }
        }
        out
    }

    /// How many applications the table holds.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| read(s).len()).sum()
    }

    /// Whether the table holds no application.
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| read(s).is_empty())
    }

    /// Every application with at least one report.
    pub fn keys(&self) -> Vec<AppKey> {
        let mut keys = Vec::new();
        for shard in &self.shards {
            keys.extend(read(shard).iter().map(|(k, _)| k.clone()));
        }
        keys
    }

    /// Drops every report for which `keep` is false, and applications left
    /// without reports (after a policy change removed them).
    pub fn retain(&self, mut keep: impl FnMut(&AppKey, &str, &Report) -> bool) {
        for shard in &self.shards {
            write(shard).remove_reports(&self.hasher, |k, c, r| !keep(k, c, r));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::Protocol;
    use std::time::Duration;

    fn key() -> AppKey {
        AppKey {
            segment: "s".into(),
            host: "h.example.test".parse().expect("host"),
            protocol: Protocol::Tcp,
            port: 80,
        }
    }

    fn report(status: Status, at: Instant) -> Report {
        Report {
            group: "g".into(),
            status,
            addresses: protocol::scan::Addresses::new(),
            dns_error: None,
            received_at: at,
            checked_at: at,
            received_wall: SystemTime::now(),
            checked_at_unix_ms: 0,
            unknown_cause: None,
            rtt: None,
        }
    }

    #[test]
    fn transitions_are_kept_and_bounded() {
        let t = HealthTable::default();
        let now = Instant::now();
        assert_eq!(
            t.record(key(), "c1", report(Status::Up, now), 2),
            Status::Unknown
        );
        assert_eq!(
            t.record(key(), "c1", report(Status::Up, now), 2),
            Status::Up
        );
        t.record(key(), "c1", report(Status::Down, now), 2);
        t.record(key(), "c1", report(Status::Up, now), 2);
        let (_, transitions) = t.app(&key()).expect("app");
        assert_eq!(transitions.len(), 2);
        assert_eq!(
            (transitions[0].from, transitions[0].to),
            (Status::Up, Status::Down)
        );
    }

    #[test]
    fn an_update_takes_every_field_of_the_new_report() {
        let t = HealthTable::default();
        let now = Instant::now();
        t.record(key(), "c1", report(Status::Up, now), 4);
        let later = now + Duration::from_secs(5);
        let address = policy::AddressResult {
            check: None,
            address: "10.0.0.1".parse().expect("ip"),
            reachable: true,
            method: policy::Method::Tcp,
            rtt: Duration::from_millis(3),
            failure: None,
        };
        let new = Report {
            group: "other".into(),
            addresses: smallvec::smallvec![address.clone()],
            dns_error: Some("none".into()),
            checked_at: now + Duration::from_secs(4),
            checked_at_unix_ms: 42,
            unknown_cause: Some(UnknownCause::Reported),
            ..report(Status::Unknown, later)
        };
        assert_eq!(t.record(key(), "c1", new, 4), Status::Up);
        let (reports, _) = t.app(&key()).expect("app");
        let r = &reports["c1"];
        assert_eq!(&*r.group, "other");
        assert_eq!(r.status, Status::Unknown);
        assert_eq!(r.addresses.as_slice(), [address]);
        assert_eq!(r.dns_error.as_deref(), Some("none"));
        assert_eq!(r.received_at, later);
        assert_eq!(r.checked_at, now + Duration::from_secs(4));
        assert_eq!(r.checked_at_unix_ms, 42);
        assert_eq!(r.unknown_cause, Some(UnknownCause::Reported));
        assert_eq!(r.rtt, Some(Duration::from_millis(3)));
    }

    /// Each report with a reachable address adds its smoothed RTT to the
    /// connector's series, in the minute it was received (the wall time
    /// the caller gives); a report without one adds nothing; a removed
    /// connector's series goes with it.
    #[test]
    fn the_smoothed_rtt_is_kept_per_minute() {
        let t = HealthTable::default();
        let now = Instant::now();
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let with = |ms: u64, reachable: bool, at: SystemTime| Report {
            addresses: smallvec::smallvec![policy::AddressResult {
                address: "10.0.0.1".parse().expect("ip"),
                reachable,
                method: policy::Method::Tcp,
                rtt: Duration::from_millis(ms),
                failure: None,
                check: None,
            }],
            received_wall: at,
            ..report(Status::Up, now)
        };
        t.record(key(), "c1", with(4, true, base), 4);
        t.record(
            key(),
            "c1",
            with(8, true, base + Duration::from_secs(61)),
            4,
        );
        t.record(
            key(),
            "c1",
            with(9, false, base + Duration::from_secs(300)),
            4,
        );
        t.record(key(), "c2", report(Status::Up, now), 4);
        let (reports, _) = t.app(&key()).expect("app");
        let smoothed = policy::smooth_rtt(Some(Duration::from_millis(4)), Duration::from_millis(8));
        let v = reports
            .rtt_series("c1")
            .and_then(|s| s.view(|us| us))
            .expect("a series");
        let minute = |t: SystemTime| i64::try_from(unix_ms(t)).expect("ms") / 60_000 * 60_000;
        assert_eq!(v.start, minute(base));
        assert_eq!(
            v.values,
            [
                Some(4_000),
                Some(u32::try_from(smoothed.as_micros()).expect("us"))
            ]
        );
        assert!(reports.rtt_series("c2").is_none());
        t.remove_where(|_, c, _| c == "c1");
        let (reports, _) = t.app(&key()).expect("app");
        assert!(reports.rtt_series("c1").is_none() && reports.get("c2").is_some());
    }

    #[test]
    fn one_address_is_held_inline_and_any_count_replaces_any_other() {
        let t = HealthTable::default();
        let now = Instant::now();
        let result = |last: u8, failure: Option<&str>| policy::AddressResult {
            check: None,
            address: std::net::IpAddr::from([10, 0, 0, last]),
            reachable: failure.is_none(),
            method: policy::Method::Tcp,
            rtt: Duration::from_millis(u64::from(last)),
            failure: failure.map(|detail| policy::Failure {
                kind: policy::FailureKind::Refused,
                detail: detail.to_owned(),
            }),
        };
        // Inline → two (on the heap) → inline with a failure's text →
        // inline: each time the table holds exactly the new results.
        let rounds = [
            vec![result(1, None)],
            vec![result(2, None), result(3, Some("refused"))],
            vec![result(4, Some("connection refused"))],
            vec![result(5, None)],
        ];
        for addresses in rounds {
            let new = Report {
                addresses: protocol::scan::Addresses::from_vec(addresses.clone()),
                ..report(Status::Up, now)
            };
            t.record(key(), "c1", new, 4);
            let (reports, _) = t.app(&key()).expect("app");
            let stored = &reports["c1"].addresses;
            assert_eq!(stored.as_slice(), addresses.as_slice());
            // One result needs no allocation of its own.
            assert_eq!(stored.spilled(), addresses.len() > 1);
        }
    }

    #[test]
    fn a_borrowed_key_finds_the_owned_one() {
        let t = HealthTable::default();
        let now = Instant::now();
        let hosts = ["127.20.0.1", "db.example.test", "::1"];
        for (i, host) in hosts.iter().enumerate() {
            let owned = AppKey {
                host: host.parse().expect("host"),
                port: 80 + i as u16,
                ..key()
            };
            let borrowed = KeyRef {
                segment: &owned.segment,
                host: policy::Host::normal(host).expect("normal"),
                protocol: owned.protocol,
                port: owned.port,
            };
            // Same hash (so the same shard and slot) and equal.
            let h = foldhash::fast::RandomState::default();
            assert_eq!(h.hash_one(&owned), h.hash_one(&borrowed as &dyn KeyLike));
            assert!(std::ptr::eq(t.shard(&owned).0, t.shard(&borrowed).0));
            assert_eq!(TableKey::to_key(&borrowed), owned);
            // Stored under the owned key, updated through the borrowed one.
            t.record(owned.clone(), "c1", report(Status::Up, now), 4);
            let previous = t.replace(borrowed, &Arc::from("c1"), report(Status::Down, now), 4);
            assert_eq!(previous.map(|(s, _)| s), Some(Status::Up));
            assert_eq!(t.statuses(&owned).len(), 1);
            assert_eq!(t.statuses(&owned)[0].1, Status::Down);
        }
        // A new application stored through a borrowed key is owned by the
        // table, and its transition names it.
        t.take_transitions();
        let fresh = KeyRef {
            segment: "s",
            host: policy::Host::normal("new.example.test").expect("normal"),
            protocol: Protocol::Udp,
            port: 53,
        };
        assert!(
            t.replace(fresh, &Arc::from("c2"), report(Status::Up, now), 4)
                .is_none()
        );
        assert_eq!(t.statuses(&fresh.to_key())[0].1, Status::Up);
        let published = t.take_transitions();
        assert_eq!(published.len(), 1);
        assert_eq!(published[0].0, fresh.to_key());
        assert_eq!(t.keys().len(), hosts.len() + 1);
    }

    #[test]
    fn reports_are_kept_in_name_order_and_found_by_any_copy_of_a_name() {
        let t = HealthTable::default();
        let now = Instant::now();
        let names: Vec<Arc<str>> = ["c3", "c1", "c2", "c10"].map(Arc::from).into();
        for n in &names {
            assert!(t.replace(key(), n, report(Status::Up, now), 4).is_none());
        }
        let order = |t: &HealthTable| {
            t.inspect(&key(), |reports, _| {
                reports
                    .iter()
                    .map(|(n, _)| n.to_owned())
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(
            order(&t),
            Some(vec!["c1".into(), "c10".into(), "c2".into(), "c3".into()])
        );
        // A new session's name is another allocation of the same text: it
        // updates the connector's slot, never adds a second one.
        let again: Arc<str> = Arc::from("c2");
        assert!(!Arc::ptr_eq(&again, &names[2]));
        let previous = t.replace(key(), &again, report(Status::Down, now), 4);
        assert_eq!(previous.map(|(s, _)| s), Some(Status::Up));
        // And the old pointer still finds it (by text, adopting it back).
        let previous = t.replace(key(), &names[2], report(Status::Up, now), 4);
        assert_eq!(previous.map(|(s, _)| s), Some(Status::Down));
        let (reports, _) = t.app(&key()).expect("app");
        assert_eq!(reports.len(), 4);
        assert_eq!(reports["c2"].status, Status::Up);
        assert!(reports.get("c4").is_none());
        assert!(reports.get("c").is_none());
        // Removal keeps the rest in order, each with its own report.
        let removed = t.remove_where(|_, c, _| c == "c10" || c == "c3");
        assert_eq!(removed, 2);
        assert_eq!(order(&t), Some(vec!["c1".into(), "c2".into()]));
        t.record(key(), "c0", report(Status::Down, now), 4);
        let (reports, _) = t.app(&key()).expect("app");
        let statuses: Vec<_> = reports.iter().map(|(n, r)| (n, r.status)).collect();
        assert_eq!(
            statuses,
            [("c0", Status::Down), ("c1", Status::Up), ("c2", Status::Up)]
        );
    }

    #[test]
    fn every_shard_is_visited() {
        let t = HealthTable::default();
        let now = Instant::now();
        let key = |i: usize| AppKey {
            host: format!("h{i}.example.test").parse().expect("host"),
            ..key()
        };
        for i in 0..200 {
            t.record(key(i), "c1", report(Status::Up, now), 4);
        }
        let used = t.shards.iter().filter(|s| !read(s).is_empty()).count();
        // Spread over the shards (bits of the hash that no shard's own
        // table uses pick them).
        assert!(used >= SHARDS / 2, "200 keys in {used} shards");
        assert_eq!(t.keys().len(), 200);
        // Each key is found in its own shard.
        assert!((0..200).all(|i| t.statuses(&key(i)).len() == 1));
        // Whole-table passes reach every shard.
        let even = |k: &AppKey| {
            k.host[1..]
                .split('.')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .is_some_and(|n| n % 2 == 0)
        };
        let marked = t.mark_unknown(SystemTime::now(), 4, |k, _, _| {
            even(k).then_some(UnknownCause::Stale)
        });
        assert_eq!(marked, 100);
        t.retain(|k, _, _| !even(k));
        assert_eq!(t.keys().len(), 100);
        assert!(t.keys().iter().all(|k| !even(k)));
        assert_eq!(t.statuses(&key(1))[0].1, Status::Up);
        assert!(t.statuses(&key(2)).is_empty());
    }

    /// Whether every shard's connector index is what scanning its
    /// applications gives.
    fn index_is_exact(t: &HealthTable) -> bool {
        t.shards.iter().all(|shard| {
            let apps = read(shard);
            let mut scanned: std::collections::HashMap<String, std::collections::BTreeSet<u64>> =
                std::collections::HashMap::new();
            for (key, record) in apps.iter() {
                for (c, _) in &record.reports {
                    scanned
                        .entry(c.to_owned())
                        .or_default()
                        .insert(t.hasher.hash_one(key as &dyn KeyLike));
                }
            }
            let indexed: std::collections::HashMap<String, std::collections::BTreeSet<u64>> = apps
                .by_connector
                .iter()
                .map(|(c, h)| (c.to_string(), h.iter().copied().collect()))
                .collect();
            scanned == indexed
        })
    }

    #[test]
    fn one_connectors_reports_are_found_through_the_index() {
        let t = HealthTable::default();
        let now = Instant::now();
        let key = |i: usize| AppKey {
            host: format!("h{i}.example.test").parse().expect("host"),
            ..key()
        };
        // c1 reports 0..100, c2 50..150, c3 the even ones of 0..150.
        for i in 0..150 {
            if i < 100 {
                t.record(key(i), "c1", report(Status::Up, now), 4);
            }
            if i >= 50 {
                t.record(key(i), "c2", report(Status::Down, now), 4);
            }
            if i % 2 == 0 {
                t.record(key(i), "c3", report(Status::Up, now), 4);
            }
        }
        assert!(index_is_exact(&t));
        drop(t.take_transitions());
        // c2 leaves out its first ten: only those turn Unknown, only c2's.
        let marked = t.mark_unknown_of("c2", SystemTime::now(), 4, |k, r| {
            assert_eq!(r.status, Status::Down, "{k:?}: another connector's report");
            (!(60..150).any(|i| key(i) == *k)).then_some(UnknownCause::NotInFullState)
        });
        assert_eq!(marked, 10);
        let published = t.take_transitions();
        assert_eq!(published.len(), 10);
        assert!(
            published
                .iter()
                .all(|(_, tr)| tr.connector == "c2" && tr.cause == "not_in_full_state")
        );
        for i in 0..150 {
            let want = if (50..60).contains(&i) {
                Status::Unknown
            } else {
                Status::Down
            };
            let got = t
                .statuses(&key(i))
                .into_iter()
                .find(|(c, ..)| c == "c2")
                .map(|(_, s, _)| s);
            assert_eq!(got, (i >= 50).then_some(want), "h{i}");
        }
        // Already Unknown: not marked again.
        assert_eq!(
            t.mark_unknown_of("c2", SystemTime::now(), 4, |_, _| Some(
                UnknownCause::Disconnected
            )),
            90
        );
        assert_eq!(
            t.mark_unknown_of("c2", SystemTime::now(), 4, |_, _| Some(
                UnknownCause::Disconnected
            )),
            0
        );
        assert_eq!(
            t.mark_unknown_of("nobody", SystemTime::now(), 4, |_, _| Some(
                UnknownCause::Disconnected
            )),
            0
        );
        // Removing reports keeps the index exact: c1's odd ones, then all of
        // c3's; applications left without reports go.
        t.retain(|k, c, _| !(c == "c1" && (0..100).step_by(2).all(|i| key(i) != *k)));
        assert!(index_is_exact(&t));
        let removed = t.remove_where(|_, c, _| c == "c3");
        assert_eq!(removed, 75);
        assert!(index_is_exact(&t));
        assert!(
            t.shards
                .iter()
                .all(|s| !read(s).by_connector.contains_key("c3"))
        );
        assert_eq!(
            t.mark_unknown_of("c3", SystemTime::now(), 4, |_, _| Some(
                UnknownCause::Disconnected
            )),
            0
        );
        // c1 keeps its even ones, and they are found.
        assert_eq!(
            t.mark_unknown_of("c1", SystemTime::now(), 4, |_, _| Some(
                UnknownCause::Disconnected
            )),
            50
        );
        // A report after its removal is indexed again.
        t.record(key(1), "c3", report(Status::Up, now), 4);
        assert!(index_is_exact(&t));
        assert_eq!(
            t.mark_unknown_of("c3", SystemTime::now(), 4, |_, _| Some(
                UnknownCause::Disconnected
            )),
            1
        );
    }

    #[test]
    fn staleness_with_an_injected_clock() {
        // The sweep decides with a caller-supplied `now`: no sleeping.
        let t = HealthTable::default();
        let start = Instant::now();
        t.record(key(), "c1", report(Status::Up, start), 10);
        let interval = Duration::from_secs(60);
        let sweep = |now: Instant| {
            t.mark_unknown(SystemTime::now(), 10, |_, _, r| {
                let s = policy::effective_status(
                    r.status,
                    now.saturating_duration_since(r.checked_at),
                    interval,
                    3,
                    Duration::from_secs(30),
                );
                (s == Status::Unknown).then_some(UnknownCause::Stale)
            })
        };
        assert_eq!(sweep(start + Duration::from_secs(209)), 0);
        assert_eq!(t.statuses(&key())[0].1, Status::Up);
        assert_eq!(sweep(start + Duration::from_secs(211)), 1);
        assert_eq!(t.statuses(&key())[0].1, Status::Unknown);
        let (reports, transitions) = t.app(&key()).expect("app");
        assert_eq!(reports["c1"].unknown_cause, Some(UnknownCause::Stale));
        assert_eq!(transitions.last().map(|t| t.cause), Some("stale"));
    }
}
