//! The scheduling core: which applications to check when, and when to
//! report them, per health reporting mode. Pure and synchronous: time comes
//! in as `Instant` arguments and decisions go out as `Action`s, so windows,
//! intervals and expiry are unit-tested without sleeping. The [`task`]
//! module is the thin async task that owns a `Schedule` and carries its
//! actions out.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::net::IpAddr;
use std::num::NonZeroU64;
use std::time::{Duration, Instant, SystemTime};

use policy::{
    AccessWindows, AddressResult, AppKey, ApplicationReport, CheckTarget, Damper, Damping,
    HealthReporting, MatchOutcome, Request, Segment, SegmentIndex, Status, application_status,
    cycle_time, plan_checks,
};

use crate::checks::pacer::{CONTINUOUS_WEIGHT, ON_ACCESS_WEIGHT};
use crate::send::report::{Outgoing, unix_ms};

pub mod inbox;
pub mod task;

pub use task::Scheduler;

/// Default on-access window when the CA sends none.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30 * 60);

/// The outcome of one check round of an application.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// Per-address results (empty when DNS failed).
    pub addresses: Vec<AddressResult>,
    /// The resolver's reason when resolution failed, or when it failed
    /// transiently and the round checked the last known addresses.
    pub dns_error: Option<String>,
    /// The addresses are the last known ones, used within the stale grace
    /// because the DNS failed transiently (`dns_error` says how): the
    /// status comes from their checks, not from the DNS failure.
    pub dns_stale: bool,
    /// When the round finished (wall clock, for the report).
    pub finished_at: SystemTime,
}

impl Round {
    /// The application status this round adds up to.
    pub fn status(&self) -> Status {
        application_status(&self.addresses, self.dns_error.is_some() && !self.dns_stale)
    }

    /// `key`'s report of this round, showing `status` (the damped one).
    fn report(&self, key: &AppKey, status: Status, access_id: Option<String>) -> ApplicationReport {
        ApplicationReport {
            key: key.clone(),
            status,
            addresses: self.addresses.clone(),
            checked_at_unix_ms: unix_ms(self.finished_at),
            dns_error: self.dns_error.clone(),
            expired: false,
            age: Duration::ZERO,
            access_id,
        }
    }
}

/// What the driver must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Start a check round of `key`; hand the outcome back to
    /// `Schedule::round_done` with `generation`.
    Check {
        /// Which application.
        key: AppKey,
        /// Identifies this round.
        generation: u64,
        /// An on-access application's round (the pacer shares the rate
        /// fairly between these and continuous rounds).
        on_access: bool,
        /// The round a user's access triggered: a user waits for it, so its
        /// checks jump the pacer's queue. Periodic re-checks inside the
        /// window are not triggered.
        triggered: bool,
        /// Reuse a target's result up to this old (targets shared with other
        /// segments are probed once per round).
        max_age: Duration,
    },
    /// Send these reports to the CA.
    Report(Vec<Outgoing>),
}

/// Why an access event was ignored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AccessRejected {
    /// No segment of that name is assigned to this connector.
    #[error("segment {0:?} is not assigned to this connector")]
    UnknownSegment(String),
    /// The segment is not an on-access segment.
    #[error("segment {segment:?} is {mode}, not on_access")]
    NotOnAccess {
        /// Segment name.
        segment: String,
        /// Its mode.
        mode: HealthReporting,
    },
    /// The segment does not include the host, protocol or port.
    #[error("{0} is not an application of its segment")]
    NotInSegment(String),
}

#[derive(Debug)]
struct App {
    on_access: bool,
    interval: Duration,
    /// When the next round is due; None while one runs.
    due: Option<Instant>,
    /// The running round's generation (generations start at 1).
    running: Option<NonZeroU64>,
    /// The next round is one an access asked for (see `Action::Check`).
    triggered: bool,
    /// The running round is one an access asked for: its result is
    /// `Outgoing::awaited`.
    running_triggered: bool,
    round_started: Option<Instant>,
    /// Boxed: most applications wait without a result for a long time
    /// (a queued cycle), and a `Round` inline would cost every one of them.
    last: Option<Box<Round>>,
    /// When `last` finished (the schedule's clock).
    last_checked: Option<Instant>,
    reported_status: Option<Status>,
    last_report: Option<Instant>,
    /// An access asked for a fresh probe (its latest result was not Up):
    /// the next round must not use a cached result.
    fresh: bool,
    /// The status shown (reported), damped by the segment's rise/fall.
    damper: Damper,
    /// On-access: the id of the latest access (by when it happened) and
    /// when that was; echoed in every report of the window.
    /// Boxed: only on-access applications that were accessed have one
    /// (inline it would cost every application 32 bytes more).
    access: Option<Box<(String, Instant)>>,
}

impl App {
    fn new(on_access: bool, interval: Duration, now: Instant) -> Self {
        App {
            on_access,
            interval,
            due: Some(now),
            running: None,
            // An on-access application exists because a user accessed it.
            triggered: on_access,
            running_triggered: false,
            round_started: None,
            last: None,
            last_checked: None,
            reported_status: None,
            last_report: None,
            fresh: false,
            damper: Damper::default(),
            access: None,
        }
    }

    /// Keeps `id` as the window's access id unless the access it names
    /// happened before the one kept (a late renewal).
    fn note_access(&mut self, id: Option<String>, accessed: Instant) {
        if let Some(id) = id
            && self.access.as_ref().is_none_or(|a| a.1 <= accessed)
        {
            self.access = Some(Box::new((id, accessed)));
        }
    }

    /// The access id to echo in this application's reports.
    fn access_id(&self) -> Option<String> {
        self.access.as_ref().map(|a| a.0.clone())
    }

    /// The status to report for the latest round: the damped one.
    fn shown(&self, round: &Round) -> Status {
        self.damper.shown().unwrap_or_else(|| round.status())
    }

    /// The latest round's report again (`round` is `last`), not awaited.
    fn latest(&self, key: &AppKey, round: &Round) -> Outgoing {
        Outgoing {
            report: round.report(key, self.shown(round), self.access_id()),
            checked: self.last_checked,
            awaited: false,
            encoding: Default::default(),
        }
    }

    /// When the latest result must be reported again although nothing
    /// changed: rounds report themselves, so this only fires when rounds fall
    /// behind the interval (a cycle longer than the interval).
    fn report_due(&self) -> Option<Instant> {
        match (&self.last, self.last_report) {
            (Some(_), Some(at)) => Some(at + self.interval + self.interval / 2),
            _ => None,
        }
    }

    /// When `poll` has something to do for it: its next round and its
    /// re-sent report, whichever are set (the schedule's timers).
    fn wakes(&self) -> impl Iterator<Item = Instant> {
        [self.due, self.report_due()].into_iter().flatten()
    }
}

/// The scheduling state of one connector.
#[derive(Debug)]
pub struct Schedule {
    segments: BTreeMap<String, Segment>,
    indexes: HashMap<String, SegmentIndex>,
    apps: HashMap<AppKey, App>,
    /// When each application's next round or re-sent report is due: every
    /// time either is set, it is pushed here, so `poll` and `next_wakeup`
    /// read what is due, never every application. An entry whose time
    /// has changed since is stale: `poll` drops it when its time comes.
    timers: BinaryHeap<Reverse<(Instant, AppKey)>>,
    windows: AccessWindows<AppKey>,
    next_generation: u64,
    /// Changes whenever `load()`'s targets may have changed.
    targets_version: u64,
}

impl Default for Schedule {
    fn default() -> Self {
        Self::new()
    }
}

impl Schedule {
    /// An empty schedule (no segments).
    pub fn new() -> Self {
        Schedule {
            segments: BTreeMap::new(),
            indexes: HashMap::new(),
            apps: HashMap::new(),
            timers: BinaryHeap::new(),
            windows: AccessWindows::new(DEFAULT_WINDOW),
            next_generation: 1,
            targets_version: 0,
        }
    }

    /// Replaces the assignment (Welcome or PolicyUpdate). Applications whose
    /// key, mode and interval are unchanged keep their state and schedule;
    /// a changed interval applies from the running round on; removed ones
    /// are forgotten.
    pub fn apply(&mut self, segments: Vec<Segment>, window: Duration, now: Instant) -> Vec<Action> {
        self.windows.set_window(window);
        self.targets_version += 1;
        self.segments = segments.into_iter().map(|s| (s.name.clone(), s)).collect();
        self.indexes = self
            .segments
            .iter()
            .map(|(n, s)| (n.clone(), SegmentIndex::new(std::slice::from_ref(s))))
            .collect();
        let mut continuous: HashMap<AppKey, Duration> = HashMap::new();
        for segment in self.segments.values() {
            if segment.health_reporting == HealthReporting::Continuous {
                for key in segment.applications() {
                    continuous.insert(key, segment.report_interval);
                }
            }
        }
        // On-access windows survive only where the application still is an
        // on-access application of its segment.
        let keep: HashSet<AppKey> = self
            .windows
            .keys()
            .filter(|k| self.check_access(k).is_ok())
            .cloned()
            .collect();
        self.windows.retain(|k| keep.contains(k));
        self.apps.retain(|key, app| {
            if app.on_access {
                keep.contains(key)
            } else {
                continuous.contains_key(key)
            }
        });
        for (key, interval) in continuous {
            match self.apps.get_mut(&key) {
                Some(app) => {
                    app.interval = interval;
                    if let (Some(due), Some(started)) = (app.due, app.round_started) {
                        app.due = Some(due.min(started + interval));
                    }
                }
                None => {
                    self.apps.insert(key, App::new(false, interval, now));
                }
            }
        }
        for key in &keep {
            let interval = self.interval_of(key);
            if let Some(app) = self.apps.get_mut(key) {
                app.interval = interval;
            }
        }
        self.timers = self
            .apps
            .iter()
            .flat_map(|(key, app)| app.wakes().map(|at| Reverse((at, key.clone()))))
            .collect();
        self.poll(now)
    }

    /// Pushes `key`'s due times (its next round, its re-sent report) onto
    /// the timers: called whenever either is set.
    fn arm(&mut self, key: &AppKey) {
        if let Some(app) = self.apps.get(key) {
            for at in app.wakes() {
                self.timers.push(Reverse((at, key.clone())));
            }
        }
    }

    /// The applications whose timers are due at `now`, once each (stale
    /// timers included: `poll` checks each against its application).
    fn take_due(&mut self, now: Instant) -> Vec<AppKey> {
        let mut keys = Vec::new();
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            if let Some(Reverse((_, key))) = self.timers.pop() {
                keys.push(key);
            }
        }
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// Drops stale timers from the top, so the earliest one left is an
    /// application's real due time (`next_wakeup`).
    fn prune(&mut self) {
        while let Some(Reverse((at, key))) = self.timers.peek() {
            let live = self
                .apps
                .get(key)
                .is_some_and(|app| app.wakes().any(|wake| wake == *at));
            if live {
                return;
            }
            self.timers.pop();
        }
    }

    /// The assigned segment named `name`.
    pub fn segment(&self, name: &str) -> Option<&Segment> {
        self.segments.get(name)
    }

    fn interval_of(&self, key: &AppKey) -> Duration {
        self.segments
            .get(&key.segment)
            .map_or(Duration::from_secs(60), |s| s.report_interval)
    }

    fn check_access(&self, key: &AppKey) -> Result<&Segment, AccessRejected> {
        let segment = self
            .segments
            .get(&key.segment)
            .ok_or_else(|| AccessRejected::UnknownSegment(key.segment.clone()))?;
        if segment.health_reporting != HealthReporting::OnAccess {
            return Err(AccessRejected::NotOnAccess {
                segment: segment.name.clone(),
                mode: segment.health_reporting,
            });
        }
        let request = Request {
            host: key.host.clone(),
            protocol: key.protocol,
            port: key.port,
        };
        match self
            .indexes
            .get(&key.segment)
            .map(|i| i.match_request(&request))
        {
            Some(MatchOutcome::Matched(_)) => Ok(segment),
            _ => Err(AccessRejected::NotInSegment(key.to_string())),
        }
    }

    /// A user accessed `key` (an `AccessEvent`): start checking it at once
    /// unless its window is live, and (re)start its window.
    pub fn access(&mut self, key: AppKey, now: Instant) -> Result<Vec<Action>, AccessRejected> {
        self.access_at(key, now, now)
    }

    /// An access to `key` that happened at `accessed` (a CA renewal of
    /// coalesced accesses says how long ago): the window ends a window after
    /// `accessed`, never earlier than it already did. A renewal of an access
    /// whose window has already run out is ignored. An access to an
    /// application whose latest result is not Up re-checks it at once with a
    /// fresh probe (the user is waiting; it may have come back).
    pub fn access_at(
        &mut self,
        key: AppKey,
        accessed: Instant,
        now: Instant,
    ) -> Result<Vec<Action>, AccessRejected> {
        self.access_event(key, accessed, None, now)
    }

    /// `access_at` for an `AccessEvent` that carries the CA's `id` for the
    /// access: the latest access's id is echoed in every report of the
    /// window (`ApplicationReport::access_id`).
    pub fn access_event(
        &mut self,
        key: AppKey,
        accessed: Instant,
        id: Option<String>,
        now: Instant,
    ) -> Result<Vec<Action>, AccessRejected> {
        let interval = self.check_access(&key)?.report_interval;
        let accessed = accessed.min(now);
        if accessed
            .checked_add(self.windows.window())
            .is_some_and(|end| end <= now)
        {
            return Ok(Vec::new());
        }
        self.windows.record(key.clone(), accessed);
        let armed = match self.apps.entry(key.clone()) {
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let app = e.get_mut();
                let not_up = app.last.as_ref().is_some_and(|r| r.status() != Status::Up);
                let recheck = not_up && app.running.is_none() && app.due.is_none_or(|d| d > now);
                if recheck {
                    app.due = Some(now);
                    app.fresh = true;
                }
                app.note_access(id, accessed);
                recheck
            }
            std::collections::hash_map::Entry::Vacant(e) => {
                self.targets_version += 1;
                e.insert(App::new(true, interval, now))
                    .note_access(id, accessed);
                true
            }
        };
        if armed {
            self.arm(&key);
        }
        Ok(self.poll(now))
    }

    /// A round finished: reports the application with its status damped
    /// by the segment's `rise`/`fall` (the round's own per-address results
    /// go with it undamped).
    pub fn round_done(
        &mut self,
        key: &AppKey,
        generation: u64,
        round: Round,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        let damping = self
            .segments
            .get(&key.segment)
            .map_or_else(Damping::default, |s| s.damping);
        if let Some(app) = self.apps.get_mut(key)
            && app.running == NonZeroU64::new(generation)
        {
            app.running = None;
            let started = app.round_started.unwrap_or(now);
            // Next round one interval after this one started, or at once when
            // the round took longer than the interval.
            app.due = Some((started + app.interval).max(now));
            let status = app.damper.observe(round.status(), damping);
            // The target set depends on the addresses rounds found.
            let same = app.last.as_ref().is_some_and(|last| {
                last.addresses.len() == round.addresses.len()
                    && last
                        .addresses
                        .iter()
                        .zip(&round.addresses)
                        .all(|(a, b)| a.address == b.address)
            });
            if !same {
                self.targets_version += 1;
            }
            let report = round.report(key, status, app.access_id());
            app.last = Some(Box::new(round));
            app.last_checked = Some(now);
            app.reported_status = Some(status);
            app.last_report = Some(now);
            let awaited = std::mem::take(&mut app.running_triggered);
            actions.push(Action::Report(vec![Outgoing::checked(
                report, now, awaited,
            )]));
            self.arm(key);
        }
        actions.extend(self.poll(now));
        actions
    }

    /// Expires windows, starts due rounds and re-sends reports that are
    /// due. Call at `next_wakeup()` and after every other event.
    pub fn poll(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut expired = Vec::new();
        for key in self.windows.expire(now) {
            if let Some(app) = self.apps.remove(&key) {
                self.targets_version += 1;
                expired.push(Outgoing::expired(key, app.access_id()));
            }
        }
        let mut resend = Vec::new();
        // Only applications with something due now, from the timers.
        let mut keys: Vec<(AppKey, bool)> = Vec::new();
        for key in self.take_due(now) {
            if let Some(app) = self.apps.get(&key)
                && app.wakes().any(|wake| wake <= now)
            {
                let on_access = app.on_access;
                keys.push((key, on_access));
            }
        }
        // Deterministic order: on-access first (the queue gives them
        // priority anyway), then by key.
        keys.sort_unstable_by(|(a, a_on), (b, b_on)| (!a_on, a).cmp(&(!b_on, b)));
        for (key, _) in keys {
            let Some(app) = self.apps.get_mut(&key) else {
                continue;
            };
            if let Some(due) = app.due
                && due <= now
            {
                let generation = self.next_generation;
                self.next_generation += 1;
                // A user's access triggered this round (a new window, or a
                // re-check of an application that was not Up): it jumps the
                // queue and gets a fresh probe.
                let triggered = std::mem::take(&mut app.triggered) | std::mem::take(&mut app.fresh);
                app.due = None;
                app.running = NonZeroU64::new(generation);
                app.running_triggered = triggered;
                app.round_started = Some(now);
                actions.push(Action::Check {
                    key: key.clone(),
                    generation,
                    on_access: app.on_access,
                    triggered,
                    // A waiting user gets a fresh probe; otherwise a result
                    // another segment obtained this round serves.
                    max_age: if triggered {
                        Duration::ZERO
                    } else {
                        app.interval / 2
                    },
                });
            }
            if let Some(due) = app.report_due()
                && due <= now
                && let Some(round) = &app.last
            {
                app.last_report = Some(now);
                resend.push(app.latest(&key, round));
                self.arm(&key);
            }
        }
        expired.extend(resend);
        if !expired.is_empty() {
            actions.push(Action::Report(expired));
        }
        self.prune();
        actions
    }

    /// When `poll` must run next, if ever.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let timer = self.timers.peek().map(|Reverse((at, _))| *at);
        timer.into_iter().chain(self.windows.next_expiry()).min()
    }

    /// Every application with a result, for a `full_state` report.
    pub fn full_state(&self) -> Vec<Outgoing> {
        let mut out: Vec<Outgoing> = self
            .apps
            .iter()
            .filter_map(|(key, app)| app.last.as_ref().map(|round| app.latest(key, round)))
            .collect();
        out.sort_by(|a, b| a.key().cmp(b.key()));
        out
    }

    /// Changes whenever `load()`'s targets may have changed (they are
    /// counted from every application, so callers count only then).
    pub fn targets_version(&self) -> u64 {
        self.targets_version
    }

    /// Whether `key` is scheduled (continuous, or on-access with a window).
    pub fn is_scheduled(&self, key: &AppKey) -> bool {
        self.apps.contains_key(key)
    }

    /// How many distinct targets everything scheduled has, from the latest
    /// answers (`plan_checks` over the continuous segments plus the live
    /// on-access applications' addresses), and how long one cycle of checks
    /// takes at `rate` checks per second: the heartbeat tells the CA, which
    /// lets a result age that much on top of its report intervals before it
    /// shows it as stale. Every distinct
    /// target once at the full rate, or, while on-access windows are
    /// re-checked, the continuous targets at the share of the rate the pacer
    /// guarantees them, whichever is longer: periodic on-access re-checks
    /// take what they ask for (their addresses once per interval), up to
    /// their weight's share of the turns, and continuous checks the rest.
    /// Without that share, 2,000 continuous targets at 500/s next to 600
    /// re-checks a second were declared a 5.2-s cycle but took 8 s, and
    /// their results were shown stale before their turn came again.
    pub fn load(&self, rate: u32) -> (usize, Duration) {
        let resolved = self.resolved();
        let mut continuous: HashSet<CheckTarget> = HashSet::new();
        for segment in self.segments.values() {
            if segment.health_reporting == HealthReporting::Continuous {
                continuous.extend(plan_checks(segment, &resolved));
            }
        }
        // On-access targets no continuous segment checks already.
        let mut extra: HashSet<CheckTarget> = HashSet::new();
        // Periodic on-access re-checks asked for, per second.
        let mut demand = 0.0;
        for (key, app) in &self.apps {
            if app.on_access {
                let targets = on_access_targets(key, &resolved);
                demand += targets.len() as f64 / app.interval.as_secs_f64().max(1e-3);
                extra.extend(targets.into_iter().filter(|t| !continuous.contains(t)));
            }
        }
        let targets = continuous.len() + extra.len();
        let at_full_rate = cycle_time(targets as u64, rate);
        if demand == 0.0 {
            return (targets, at_full_rate);
        }
        let rate = f64::from(rate.max(1));
        let weights = f64::from(ON_ACCESS_WEIGHT + CONTINUOUS_WEIGHT);
        let share = (rate - demand).max(rate * f64::from(CONTINUOUS_WEIGHT) / weights);
        let continuous_cycle =
            Duration::try_from_secs_f64(continuous.len() as f64 / share).unwrap_or(Duration::MAX);
        (targets, at_full_rate.max(continuous_cycle))
    }

    /// Each host's addresses, from the latest answers.
    fn resolved(&self) -> BTreeMap<String, Vec<IpAddr>> {
        let mut resolved: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
        for (key, app) in &self.apps {
            if let Some(round) = &app.last {
                let entry = resolved.entry(key.host.to_string()).or_default();
                for r in &round.addresses {
                    if !entry.contains(&r.address) {
                        entry.push(r.address);
                    }
                }
            }
        }
        resolved
    }
}

/// What an on-access application's round checks: its address, or its
/// host's latest answers.
fn on_access_targets(key: &AppKey, resolved: &BTreeMap<String, Vec<IpAddr>>) -> Vec<CheckTarget> {
    let addresses: Vec<IpAddr> = match key.host.ip() {
        Some(ip) => vec![ip],
        None => resolved.get(key.host.as_str()).cloned().unwrap_or_default(),
    };
    addresses
        .into_iter()
        .map(|address| CheckTarget {
            check: 0,
            address,
            protocol: key.protocol,
            port: key.port,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::validate::{PortSpec, SegmentSpec};
    use policy::{Method, Protocol};

    fn segment(name: &str, apps: &[&str], tcp: &[u16], mode: &str, interval_s: u64) -> Segment {
        policy::validate_segment(&SegmentSpec {
            name: name.into(),
            applications: apps.iter().map(|s| s.to_string()).collect(),
            tcp_ports: tcp
                .iter()
                .map(|p| PortSpec::Number(i64::from(*p)))
                .collect(),
            health_reporting: Some(mode.into()),
            report_interval_s: Some(interval_s),
            connector_groups: vec!["g".into()],
            ..SegmentSpec::default()
        })
        .expect("valid segment")
    }

    fn key(segment: &str, host: &str, port: u16) -> AppKey {
        AppKey {
            segment: segment.into(),
            host: host.parse().expect("host"),
            protocol: Protocol::Tcp,
            port,
        }
    }

    fn up_round(ip: &str) -> Round {
        Round {
            addresses: vec![AddressResult {
                check: None,
                address: ip.parse().expect("ip"),
                reachable: true,
                method: Method::Tcp,
                rtt: Duration::from_millis(1),
                failure: None,
            }],
            dns_error: None,
            dns_stale: false,
            finished_at: SystemTime::now(),
        }
    }

    fn down_round(ip: &str) -> Round {
        let mut r = up_round(ip);
        r.addresses[0].reachable = false;
        r.addresses[0].failure = Some(policy::Failure {
            kind: policy::FailureKind::Refused,
            detail: "refused".into(),
        });
        r
    }

    fn checks(actions: &[Action]) -> Vec<(AppKey, u64)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Check {
                    key, generation, ..
                } => Some((key.clone(), *generation)),
                Action::Report(_) => None,
            })
            .collect()
    }

    fn reports(actions: &[Action]) -> Vec<Outgoing> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Report(r) => Some(r.clone()),
                Action::Check { .. } => None,
            })
            .flatten()
            .collect()
    }

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn continuous_applications_are_checked_every_interval_and_reported() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        let actions = s.apply(
            vec![segment("web", &["10.0.0.1"], &[80], "continuous", 60)],
            DEFAULT_WINDOW,
            t0,
        );
        let started = checks(&actions);
        assert_eq!(started.len(), 1);
        let (k, generation) = started[0].clone();
        assert_eq!(k, key("web", "10.0.0.1", 80));
        // Nothing due while the round runs.
        assert!(checks(&s.poll(t0 + Duration::from_secs(30))).is_empty());
        let done = s.round_done(
            &k,
            generation,
            up_round("10.0.0.1"),
            t0 + Duration::from_secs(1),
        );
        let r = reports(&done);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].report.status, Status::Up);
        assert_eq!(s.next_wakeup(), Some(t0 + MIN));
        assert!(checks(&s.poll(t0 + MIN - Duration::from_millis(1))).is_empty());
        let next = checks(&s.poll(t0 + MIN));
        assert_eq!(next.len(), 1);
        // A stale generation is ignored.
        assert!(
            reports(&s.round_done(&k, generation, down_round("10.0.0.1"), t0 + MIN)).is_empty()
        );
        let done = s.round_done(&k, next[0].1, down_round("10.0.0.1"), t0 + MIN);
        assert_eq!(reports(&done)[0].report.status, Status::Down);
    }

    /// The timers hold a few entries per application however many rounds
    /// ran (stale ones are dropped as their time comes), and `poll` starts
    /// exactly the applications that are due.
    #[test]
    fn timers_stay_a_few_per_application_over_many_rounds() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        let apps = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"];
        let mut running = checks(&s.apply(
            vec![segment("web", &apps, &[80], "continuous", 60)],
            DEFAULT_WINDOW,
            t0,
        ));
        for n in 1..=500u32 {
            assert_eq!(running.len(), apps.len(), "round {n}");
            let now = t0 + MIN * n - MIN + Duration::from_millis(10);
            for (k, generation) in std::mem::take(&mut running) {
                let ip = k.host.to_string();
                let round = if n % 3 == 0 {
                    down_round(&ip)
                } else {
                    up_round(&ip)
                };
                running.extend(checks(&s.round_done(&k, generation, round, now)));
            }
            assert!(running.is_empty(), "nothing due before the interval ends");
            assert_eq!(s.next_wakeup(), Some(t0 + MIN * n));
            running = checks(&s.poll(t0 + MIN * n));
            assert!(
                s.timers.len() <= 3 * apps.len(),
                "{} timers for {} applications after round {n}",
                s.timers.len(),
                apps.len()
            );
        }
    }

    #[test]
    fn a_round_longer_than_the_interval_is_followed_at_once() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        let a = s.apply(
            vec![segment("web", &["10.0.0.1"], &[80], "continuous", 60)],
            DEFAULT_WINDOW,
            t0,
        );
        let (k, g) = checks(&a)[0].clone();
        let late = t0 + Duration::from_secs(90);
        let done = s.round_done(&k, g, up_round("10.0.0.1"), late);
        assert_eq!(checks(&done).len(), 1, "next round starts at once");
    }

    #[test]
    fn on_access_checks_until_the_window_passes_then_reports_unknown_once() {
        let t0 = Instant::now();
        let window = Duration::from_secs(1800);
        let mut s = Schedule::new();
        let seg = segment("jira", &["*.corp.test"], &[443], "on_access", 60);
        assert!(
            s.apply(vec![seg], window, t0).is_empty(),
            "on-access: nothing until accessed"
        );
        let k = key("jira", "wiki.corp.test", 443);
        let a = s.access(k.clone(), t0).expect("accepted");
        let (_, g) = checks(&a)[0].clone();
        let done = s.round_done(&k, g, up_round("10.0.0.9"), t0 + Duration::from_millis(5));
        assert_eq!(
            reports(&done)[0].report.status,
            Status::Up,
            "reported at once"
        );
        // Re-checked every interval while the window lasts.
        let mut now = t0;
        let mut rounds = 1;
        let t_access2 = t0 + Duration::from_secs(630);
        let mut accessed_again = false;
        while let Some(wake) = s.next_wakeup() {
            now = wake;
            if !accessed_again && now >= t_access2 {
                accessed_again = true;
                assert!(checks(&s.access(k.clone(), t_access2).expect("ok")).is_empty());
            }
            let actions = s.poll(now);
            for (ck, g) in checks(&actions) {
                rounds += 1;
                s.round_done(&ck, g, up_round("10.0.0.9"), now);
            }
            let r = reports(&actions);
            if r.iter().any(|r| r.report.expired) {
                assert_eq!(r.len(), 1);
                assert_eq!(r[0].report.status, Status::Unknown);
                assert!(r[0].checked.is_none() && r[0].report.addresses.is_empty());
                break;
            }
        }
        // The second access at 630 s renewed the window to 2430 s.
        assert_eq!(now, t_access2 + window);
        assert_eq!(rounds, 41, "one round per minute from 0 s to 2400 s");
        assert!(!s.is_scheduled(&k));
        assert_eq!(s.next_wakeup(), None, "stops touching it");
        assert!(s.full_state().is_empty());
    }

    fn triggered(actions: &[Action]) -> Vec<bool> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Check { triggered, .. } => Some(*triggered),
                Action::Report(_) => None,
            })
            .collect()
    }

    #[test]
    fn only_the_round_an_access_triggers_jumps_the_queue() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        let a = s.apply(
            vec![
                segment("jira", &["*.corp.test"], &[443], "on_access", 60),
                segment("web", &["10.0.0.1"], &[80], "continuous", 60),
            ],
            DEFAULT_WINDOW,
            t0,
        );
        assert_eq!(triggered(&a), vec![false], "continuous rounds never are");
        let k = key("jira", "wiki.corp.test", 443);
        let a = s.access(k.clone(), t0).expect("accepted");
        assert_eq!(triggered(&a), vec![true], "the access's own round");
        let (_, g) = checks(&a)[0].clone();
        let done = s.round_done(&k, g, up_round("10.0.0.9"), t0);
        // Its result is awaited (the outbox sends it at once).
        assert_eq!(awaited(&done, &k), vec![true]);
        // The periodic re-check inside the window is on-access, not
        // triggered: it shares the rate with continuous checks.
        let a = s.poll(t0 + MIN);
        let rounds: Vec<(bool, bool)> = a
            .iter()
            .filter_map(|a| match a {
                Action::Check {
                    key,
                    on_access,
                    triggered,
                    ..
                } if *key == k => Some((*on_access, *triggered)),
                _ => None,
            })
            .collect();
        assert_eq!(rounds, vec![(true, false)]);
        let g = a
            .iter()
            .find_map(|a| match a {
                Action::Check {
                    key, generation, ..
                } if *key == k => Some(*generation),
                _ => None,
            })
            .expect("the periodic round");
        let done = s.round_done(&k, g, up_round("10.0.0.9"), t0 + MIN);
        assert_eq!(awaited(&done, &k), vec![false], "nobody waits for it");
    }

    /// `Outgoing::awaited` of `k`'s entries in `actions`' reports.
    fn awaited(actions: &[Action], k: &AppKey) -> Vec<bool> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Report(r) => Some(r),
                _ => None,
            })
            .flatten()
            .filter(|r| *r.key() == *k)
            .map(|r| r.awaited)
            .collect()
    }

    #[test]
    fn access_events_outside_on_access_segments_are_rejected() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        s.apply(
            vec![
                segment("jira", &["*.corp.test"], &[443], "on_access", 60),
                segment("web", &["10.0.0.1"], &[80], "continuous", 60),
            ],
            DEFAULT_WINDOW,
            t0,
        );
        assert!(matches!(
            s.access(key("nope", "a.corp.test", 443), t0),
            Err(AccessRejected::UnknownSegment(_))
        ));
        assert!(matches!(
            s.access(key("web", "10.0.0.1", 80), t0),
            Err(AccessRejected::NotOnAccess { .. })
        ));
        assert!(matches!(
            s.access(key("jira", "a.corp.test", 80), t0),
            Err(AccessRejected::NotInSegment(_))
        ));
        assert!(matches!(
            s.access(key("jira", "a.other.test", 443), t0),
            Err(AccessRejected::NotInSegment(_))
        ));
    }

    #[test]
    fn none_segments_are_never_checked() {
        let mut s = Schedule::new();
        let a = s.apply(
            vec![segment("n", &["10.0.0.1"], &[80], "none", 60)],
            DEFAULT_WINDOW,
            Instant::now(),
        );
        assert!(a.is_empty());
        assert_eq!(s.next_wakeup(), None);
    }

    #[test]
    fn policy_update_keeps_unchanged_applications_and_drops_removed_ones() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        let a = s.apply(
            vec![segment(
                "web",
                &["10.0.0.1", "10.0.0.2"],
                &[80],
                "continuous",
                60,
            )],
            DEFAULT_WINDOW,
            t0,
        );
        for (k, g) in checks(&a) {
            s.round_done(&k, g, up_round(&k.host), t0);
        }
        let t1 = t0 + Duration::from_secs(10);
        // 10.0.0.2 goes, 10.0.0.3 comes, 10.0.0.1 stays untouched.
        let a = s.apply(
            vec![segment(
                "web",
                &["10.0.0.1", "10.0.0.3"],
                &[80],
                "continuous",
                60,
            )],
            DEFAULT_WINDOW,
            t1,
        );
        let started: Vec<AppKey> = checks(&a).into_iter().map(|(k, _)| k).collect();
        assert_eq!(started, vec![key("web", "10.0.0.3", 80)]);
        assert!(s.is_scheduled(&key("web", "10.0.0.1", 80)));
        assert!(!s.is_scheduled(&key("web", "10.0.0.2", 80)));
        let state = s.full_state();
        assert_eq!(state.len(), 1, "only 10.0.0.1 has a result");
        // A shorter interval applies to the kept application.
        s.apply(
            vec![segment(
                "web",
                &["10.0.0.1", "10.0.0.3"],
                &[80],
                "continuous",
                20,
            )],
            DEFAULT_WINDOW,
            t1,
        );
        assert_eq!(s.next_wakeup(), Some(t0 + Duration::from_secs(20)));
    }

    #[test]
    fn reports_repeat_when_rounds_fall_behind() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        let a = s.apply(
            vec![segment("web", &["10.0.0.1"], &[80], "continuous", 60)],
            DEFAULT_WINDOW,
            t0,
        );
        let (k, g) = checks(&a)[0].clone();
        s.round_done(&k, g, up_round("10.0.0.1"), t0);
        let a = s.poll(t0 + MIN);
        assert_eq!(checks(&a).len(), 1);
        // That round hangs (a slow cycle); the last result is re-sent.
        let r = reports(&s.poll(t0 + MIN + MIN / 2));
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].report.status, Status::Up);
        // ... with the time its check really ran, not the re-send time.
        assert_eq!(r[0].checked, Some(t0));
        let again = reports(&s.poll(t0 + 3 * MIN));
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].checked, Some(t0));
        assert_eq!(
            s.full_state().first().and_then(|r| r.checked),
            Some(t0),
            "a full-state report keeps the check time too"
        );
    }

    #[test]
    fn dns_failure_is_down_with_the_reason() {
        let round = Round {
            addresses: Vec::new(),
            dns_error: Some("NXDomain".into()),
            dns_stale: false,
            finished_at: SystemTime::now(),
        };
        assert_eq!(round.status(), Status::Down);
    }

    #[test]
    fn stale_addresses_are_judged_by_their_checks_with_the_dns_error_beside() {
        let mut round = up_round("10.0.0.1");
        round.dns_error = Some("SERVFAIL: the DNS server failed to resolve a.test".into());
        round.dns_stale = true;
        assert_eq!(round.status(), Status::Up);
        round.dns_stale = false;
        assert_eq!(round.status(), Status::Down);
    }

    /// With `fall = 3` a target that alternates between open
    /// and closed every round keeps showing Up; three failures in a row
    /// turn it Down, and `rise = 2` successes bring it back. Re-sent and
    /// full-state reports carry the damped status too.
    #[test]
    fn rise_and_fall_damp_the_reported_status() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        let mut seg = segment("web", &["10.0.0.1"], &[80], "continuous", 60);
        seg.damping = Damping::new(2, 3).expect("valid");
        let a = s.apply(vec![seg], DEFAULT_WINDOW, t0);
        let (k, mut g) = checks(&a)[0].clone();
        let mut now = t0;
        let mut shown = Vec::new();
        let mut raw = Vec::new();
        let pattern = [
            true, false, true, false, true, false, false, false, true, true,
        ];
        for up in pattern {
            let round = if up {
                up_round("10.0.0.1")
            } else {
                down_round("10.0.0.1")
            };
            raw.push(round.status());
            let done = s.round_done(&k, g, round, now);
            let r = reports(&done);
            assert_eq!(r.len(), 1);
            shown.push(r[0].report.status);
            // The per-address result is the round's own.
            assert_eq!(r[0].report.addresses.first().map(|a| a.reachable), Some(up));
            now += MIN;
            g = checks(&s.poll(now))[0].1;
        }
        use Status::{Down, Up};
        assert_eq!(
            shown,
            vec![Up, Up, Up, Up, Up, Up, Up, Down, Down, Up],
            "raw {raw:?}"
        );
        assert_eq!(s.full_state()[0].report.status, Up);
    }

    /// An access to an application whose latest result is Down
    /// re-checks it at once with a fresh probe, although its window is live
    /// and its next round is an interval away.
    #[test]
    fn an_access_to_a_down_application_rechecks_it_at_once() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        let seg = segment("jira", &["*.corp.test"], &[443], "on_access", 600);
        s.apply(vec![seg], DEFAULT_WINDOW, t0);
        let k = key("jira", "wiki.corp.test", 443);
        let (_, g) = checks(&s.access(k.clone(), t0).expect("accepted"))[0].clone();
        s.round_done(&k, g, down_round("10.0.0.9"), t0 + Duration::from_millis(5));
        let t1 = t0 + Duration::from_secs(20);
        let a = s.access(k.clone(), t1).expect("accepted");
        let fresh: Vec<_> = a
            .iter()
            .filter_map(|a| match a {
                Action::Check { key, max_age, .. } => Some((key.clone(), *max_age)),
                Action::Report(_) => None,
            })
            .collect();
        assert_eq!(fresh, vec![(k.clone(), Duration::ZERO)]);
        // While that round runs, more accesses add nothing.
        assert!(checks(&s.access(k.clone(), t1).expect("ok")).is_empty());
        // An Up application is not re-checked by an access.
        let (_, g) = checks(&a)[0].clone();
        s.round_done(&k, g, up_round("10.0.0.9"), t1);
        assert!(
            checks(
                &s.access(k.clone(), t1 + Duration::from_secs(1))
                    .expect("ok")
            )
            .is_empty()
        );
    }

    /// A renewal says when the access happened; the window ends
    /// a window after it, and a renewal of a lapsed access is ignored.
    #[test]
    fn a_renewal_ends_the_window_a_window_after_the_access_it_carries() {
        let t0 = Instant::now();
        let window = Duration::from_secs(1800);
        let mut s = Schedule::new();
        s.apply(
            vec![segment("jira", &["*.corp.test"], &[443], "on_access", 60)],
            window,
            t0,
        );
        let k = key("jira", "wiki.corp.test", 443);
        s.access(k.clone(), t0).expect("accepted");
        // Accessed at 50 s, renewed (coalesced) at 60 s.
        let accessed = t0 + Duration::from_secs(50);
        s.access_at(k.clone(), accessed, t0 + Duration::from_secs(60))
            .expect("accepted");
        assert_eq!(s.windows.expires_at(&k), Some(accessed + window));
        // An older renewal does not shorten it.
        s.access_at(
            k.clone(),
            t0 + Duration::from_secs(10),
            t0 + Duration::from_secs(61),
        )
        .expect("accepted");
        assert_eq!(s.windows.expires_at(&k), Some(accessed + window));
        // A renewal of an access a whole window back opens nothing.
        let other = key("jira", "other.corp.test", 443);
        let late = t0 + window + Duration::from_secs(1);
        assert!(s.access_at(other.clone(), t0, late).expect("ok").is_empty());
        assert!(!s.is_scheduled(&other));
    }

    /// The cycle the heartbeat declares: every target at the full rate
    /// while nothing else competes; the continuous targets at what the
    /// pacer leaves them once on-access windows are re-checked (the rest of
    /// the rate, at least the continuous weight's share).
    #[test]
    fn the_cycle_counts_the_share_on_access_rechecks_leave_to_continuous_targets() {
        let t0 = Instant::now();
        let mut s = Schedule::new();
        let hosts: Vec<String> = (1..=10).map(|i| format!("10.0.0.{i}")).collect();
        let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
        let ports: Vec<u16> = (20001..=20010).collect();
        s.apply(
            vec![
                segment("bulk", &hosts, &ports, "continuous", 1),
                segment("burst", &["10.1.0.0/24"], &[30001], "on_access", 1),
            ],
            DEFAULT_WINDOW,
            t0,
        );
        let ms = |d: Duration| d.as_millis();
        // 100 continuous targets at 20/s.
        assert_eq!(s.load(20).0, 100);
        assert_eq!(ms(s.load(20).1), 5000);
        let open = |s: &mut Schedule, from: u8, to: u8| {
            for i in from..=to {
                s.access_at(key("burst", &format!("10.1.0.{i}"), 30001), t0, t0)
                    .expect("accepted");
            }
        };
        // 5 windows re-checked every second: continuous targets get the
        // other 15 checks a second.
        open(&mut s, 1, 5);
        assert_eq!(s.load(20).0, 105);
        assert_eq!(ms(s.load(20).1), 6666);
        // 30 a second ask for more than their half: continuous targets
        // still get 10 a second.
        open(&mut s, 6, 30);
        assert_eq!(s.load(20).0, 130);
        assert_eq!(ms(s.load(20).1), 10_000);
        // Everything at the full rate is longer still at 2 checks a second
        // (130 targets, 65 s; the continuous ones alone at 1/s: 100 s).
        assert_eq!(ms(s.load(2).1), 100_000);
    }

    /// Every report of an on-access window echoes the id of the
    /// latest access (by when it happened) the CA sent, the expiry too; a
    /// late renewal of an older access does not replace it.
    #[test]
    fn reports_echo_the_latest_access_id() {
        let t0 = Instant::now();
        let window = Duration::from_secs(1800);
        let mut s = Schedule::new();
        s.apply(
            vec![segment("jira", &["*.corp.test"], &[443], "on_access", 60)],
            window,
            t0,
        );
        let k = key("jira", "wiki.corp.test", 443);
        let id = |n: &str| Some(n.to_owned());
        let a = s
            .access_event(k.clone(), t0, id("first"), t0)
            .expect("accepted");
        let (_, g) = checks(&a)[0].clone();
        let r = reports(&s.round_done(&k, g, up_round("10.0.0.9"), t0));
        assert_eq!(r[0].report.access_id, id("first"));
        // A renewal for a later access replaces it; one for an earlier
        // access (arriving late) does not.
        let t1 = t0 + Duration::from_secs(50);
        s.access_event(k.clone(), t1, id("second"), t1 + MIN)
            .expect("accepted");
        s.access_event(k.clone(), t0 + MIN / 2, id("older"), t1 + MIN)
            .expect("accepted");
        // An event without an id (an old CA) keeps the one there is.
        s.access_event(k.clone(), t1, None, t1 + MIN)
            .expect("accepted");
        let full = s.full_state();
        assert_eq!(full[0].report.access_id, id("second"));
        let r = reports(&s.poll(t1 + window));
        assert!(r[0].report.expired);
        assert_eq!(r[0].report.access_id, id("second"));
    }
}
