//! The scheduling core: which applications to check when, and when to
//! report them, per health reporting mode. Pure and synchronous: time comes
//! in as `Instant` arguments and decisions go out as `Action`s, so windows,
//! intervals and expiry are unit-tested without sleeping.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use policy::{
    AccessWindows, AddressResult, AppKey, CheckTarget, HealthReporting, MatchOutcome, Request,
    Segment, SegmentIndex, Status, application_status, plan_checks,
};

/// Default on-access window when the CA sends none.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30 * 60);

/// The outcome of one check round of an application.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// Per-address results (empty when DNS failed).
    pub addresses: Vec<AddressResult>,
    /// The resolver's reason when resolution failed.
    pub dns_error: Option<String>,
    /// When the round finished (wall clock, for the report).
    pub finished_at: SystemTime,
}

impl Round {
    /// The application status this round adds up to.
    pub fn status(&self) -> Status {
        application_status(&self.addresses, self.dns_error.is_some())
    }
}

/// One application's entry in a health report.
#[derive(Clone, Debug, PartialEq)]
pub struct AppReport {
    /// Which application.
    pub key: AppKey,
    /// Its status.
    pub status: Status,
    /// The latest round (None for an expired on-access application).
    pub round: Option<Round>,
    /// True when the on-access window ended and checks stopped.
    pub expired: bool,
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
        /// Queue priority: on-access rounds go first.
        on_access: bool,
        /// Reuse a target's result up to this old (targets shared with other
        /// segments are probed once per round).
        max_age: Duration,
    },
    /// Send these applications to the CA.
    Report(Vec<AppReport>),
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
    running: Option<u64>,
    round_started: Option<Instant>,
    last: Option<Round>,
    reported_status: Option<Status>,
    last_report: Option<Instant>,
}

impl App {
    fn new(on_access: bool, interval: Duration, now: Instant) -> Self {
        App {
            on_access,
            interval,
            due: Some(now),
            running: None,
            round_started: None,
            last: None,
            reported_status: None,
            last_report: None,
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
}

/// The scheduling state of one connector.
#[derive(Debug)]
pub struct Schedule {
    segments: BTreeMap<String, Segment>,
    indexes: HashMap<String, SegmentIndex>,
    apps: HashMap<AppKey, App>,
    windows: AccessWindows<AppKey>,
    next_generation: u64,
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
            windows: AccessWindows::new(DEFAULT_WINDOW),
            next_generation: 1,
        }
    }

    /// Replaces the assignment (Welcome or PolicyUpdate). Applications whose
    /// key, mode and interval are unchanged keep their state and schedule;
    /// a changed interval applies from the running round on; removed ones
    /// are forgotten.
    pub fn apply(&mut self, segments: Vec<Segment>, window: Duration, now: Instant) -> Vec<Action> {
        self.windows.set_window(window);
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
        self.poll(now)
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
        let interval = self.check_access(&key)?.report_interval;
        self.windows.record(key.clone(), now);
        self.apps
            .entry(key)
            .or_insert_with(|| App::new(true, interval, now));
        Ok(self.poll(now))
    }

    /// A round finished. Reports at once when the status changed (or it is
    /// the application's first result), else as the interval's report.
    pub fn round_done(
        &mut self,
        key: &AppKey,
        generation: u64,
        round: Round,
        now: Instant,
    ) -> Vec<Action> {
        let mut actions = Vec::new();
        if let Some(app) = self.apps.get_mut(key)
            && app.running == Some(generation)
        {
            app.running = None;
            let started = app.round_started.unwrap_or(now);
            // Next round one interval after this one started, or at once when
            // the round took longer than the interval.
            app.due = Some((started + app.interval).max(now));
            let status = round.status();
            app.last = Some(round.clone());
            app.reported_status = Some(status);
            app.last_report = Some(now);
            actions.push(Action::Report(vec![AppReport {
                key: key.clone(),
                status,
                round: Some(round),
                expired: false,
            }]));
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
            if self.apps.remove(&key).is_some() {
                expired.push(AppReport {
                    key,
                    status: Status::Unknown,
                    round: None,
                    expired: true,
                });
            }
        }
        let mut resend = Vec::new();
        let mut keys: Vec<&AppKey> = self.apps.keys().collect();
        // Deterministic order: on-access first (the queue gives them
        // priority anyway), then by key.
        keys.sort_by_key(|k| (!self.apps[*k].on_access, (*k).clone()));
        let keys: Vec<AppKey> = keys.into_iter().cloned().collect();
        for key in keys {
            let Some(app) = self.apps.get_mut(&key) else {
                continue;
            };
            if let Some(due) = app.due
                && due <= now
            {
                let generation = self.next_generation;
                self.next_generation += 1;
                let first_on_access = app.on_access && app.last.is_none();
                app.due = None;
                app.running = Some(generation);
                app.round_started = Some(now);
                actions.push(Action::Check {
                    key: key.clone(),
                    generation,
                    on_access: app.on_access,
                    // A waiting user gets a fresh probe; otherwise a result
                    // another segment obtained this round serves.
                    max_age: if first_on_access {
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
                resend.push(AppReport {
                    key: key.clone(),
                    status: round.status(),
                    round: Some(round.clone()),
                    expired: false,
                });
            }
        }
        expired.extend(resend);
        if !expired.is_empty() {
            actions.push(Action::Report(expired));
        }
        actions
    }

    /// When `poll` must run next, if ever.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let apps = self
            .apps
            .values()
            .flat_map(|a| [a.due, a.report_due()])
            .flatten();
        apps.chain(self.windows.next_expiry()).min()
    }

    /// Every application with a result, for a `full_state` report.
    pub fn full_state(&self) -> Vec<AppReport> {
        let mut out: Vec<AppReport> = self
            .apps
            .iter()
            .filter_map(|(key, app)| {
                app.last.as_ref().map(|round| AppReport {
                    key: key.clone(),
                    status: round.status(),
                    round: Some(round.clone()),
                    expired: false,
                })
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// Whether `key` is scheduled (continuous, or on-access with a window).
    pub fn is_scheduled(&self, key: &AppKey) -> bool {
        self.apps.contains_key(key)
    }

    /// Distinct targets of everything scheduled, from the latest answers:
    /// `plan_checks` over the continuous segments plus the live on-access
    /// applications.
    pub fn targets(&self) -> BTreeSet<CheckTarget> {
        let mut resolved: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
        for (key, app) in &self.apps {
            if let Some(round) = &app.last {
                let entry = resolved.entry(key.host.clone()).or_default();
                for r in &round.addresses {
                    if !entry.contains(&r.address) {
                        entry.push(r.address);
                    }
                }
            }
        }
        let mut targets = BTreeSet::new();
        for segment in self.segments.values() {
            if segment.health_reporting == HealthReporting::Continuous {
                targets.extend(plan_checks(segment, &resolved));
            }
        }
        for (key, app) in &self.apps {
            if !app.on_access {
                continue;
            }
            let addresses: Vec<IpAddr> = match key.host.parse::<IpAddr>() {
                Ok(ip) => vec![ip],
                Err(_) => resolved.get(&key.host).cloned().unwrap_or_default(),
            };
            targets.extend(addresses.into_iter().map(|address| CheckTarget {
                address,
                protocol: key.protocol,
                port: key.port,
            }));
        }
        targets
    }
}
