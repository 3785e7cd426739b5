//! The session's outbox: health results wait here until they go out as
//! one batched `HealthReport`, bounded in time (`BATCH_WINDOW`), entries
//! and bytes, coalesced to the latest result per application, and paced to
//! the CA's entry limit. A report the CA refuses with `FlowControl` comes
//! back: its entries are pending again (unless a newer result of the same
//! application is pending or was sent since), so no result is lost. A
//! result a user waits for (`Outgoing::awaited`: the round an access
//! triggered; the CA holds the access until it arrives) does not wait for
//! the batch window: it goes out at once, with whatever else is pending.
//! Pure: time comes in as arguments.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use policy::AppKey;
use protocol::v1;

use crate::send::report::{Entry, Outgoing};
use crate::send::wire::Report;

/// Longest a result waits before it is sent: results produced within it go
/// out together.
pub const BATCH_WINDOW: Duration = Duration::from_millis(100);
/// Most entries in one report when the CA names no limit.
pub const DEFAULT_MAX_ENTRIES: usize = 2_000;
/// Most encoded bytes of one report's entries (the CA takes up to 4 MiB).
pub const MAX_REPORT_BYTES: usize = 1024 * 1024;
/// Sent reports remembered for a `FlowControl` that refers to them: far more
/// than can be in flight between the CA's refusal and its arrival here.
const REMEMBERED: usize = 1024;

/// The CA's entry limit as the connector paces itself to it: a token
/// bucket mirroring the CA's (`ConnectorSettings.max_entries_*`).
#[derive(Clone, Debug)]
struct Pace {
    per_second: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Pace {
    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = self.at.max(now);
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
    }

    /// When `entries` may be sent (now or later).
    fn ready_at(&self, entries: usize) -> Instant {
        let need = (entries as f64).min(self.burst);
        if self.tokens >= need {
            return self.at;
        }
        self.at + Duration::from_secs_f64((need - self.tokens) / self.per_second)
    }
}

/// Results waiting to be sent, and what was sent recently.
#[derive(Debug)]
pub struct Outbox {
    pending: BTreeMap<AppKey, Outgoing>,
    /// When the oldest pending result arrived.
    oldest: Option<Instant>,
    /// Pending results include one a user waits for (`Outgoing::awaited`).
    awaited: usize,
    next_sequence: u64,
    /// Recently sent reports by sequence, for `FlowControl`.
    sent: VecDeque<(u64, Vec<Outgoing>)>,
    /// The sequence of the report that last carried each application.
    last_sent: HashMap<AppKey, u64>,
    /// No report before this (the CA's `retry_after_ms`).
    resume_at: Option<Instant>,
    pace: Option<Pace>,
    max_entries: usize,
}

impl Default for Outbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Outbox {
    /// An empty outbox without a known CA limit.
    pub fn new() -> Self {
        Outbox {
            pending: BTreeMap::new(),
            oldest: None,
            awaited: 0,
            next_sequence: 1,
            sent: VecDeque::new(),
            last_sent: HashMap::new(),
            resume_at: None,
            pace: None,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }

    /// Applies the CA's limits (`ConnectorSettings`); zeros mean unknown.
    pub fn set_limits(&mut self, settings: &v1::ConnectorSettings, now: Instant) {
        self.max_entries = match settings.max_report_entries {
            0 => DEFAULT_MAX_ENTRIES,
            n => usize::try_from(n).unwrap_or(DEFAULT_MAX_ENTRIES),
        };
        self.pace = (settings.max_entries_per_second > 0).then(|| {
            let burst = f64::from(settings.max_entries_burst.max(1));
            Pace {
                per_second: f64::from(settings.max_entries_per_second),
                burst,
                tokens: burst,
                at: now,
            }
        });
    }

    /// Results to send: each replaces a pending result of its application.
    pub fn push(&mut self, reports: Vec<Outgoing>, now: Instant) {
        if reports.is_empty() {
            return;
        }
        self.oldest.get_or_insert(now);
        for mut report in reports {
            let key = report.key().clone();
            // A newer result of an application a user waits for is still
            // awaited: it replaces the one the user waits for.
            if let Some(old) = self.pending.get(&key) {
                report.awaited |= old.awaited;
                self.awaited -= usize::from(old.awaited);
            }
            self.awaited += usize::from(report.awaited);
            self.pending.insert(key, report);
        }
    }

    /// How many results wait.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// How many more results make a full report's worth (at least 1).
    pub fn room(&self) -> usize {
        self.max_entries.saturating_sub(self.pending.len()).max(1)
    }

    /// When the next report is due, if anything waits: when the oldest
    /// result has waited `BATCH_WINDOW` (at once when a full report's worth
    /// waits or a user waits for one of them), but not before the CA's
    /// `retry_after` nor before the entry limit allows it.
    pub fn next_send(&self) -> Option<Instant> {
        let oldest = self.oldest?;
        if self.pending.is_empty() {
            return None;
        }
        let count = self.pending.len().min(self.max_entries);
        let mut at = if self.pending.len() >= self.max_entries || self.awaited > 0 {
            oldest
        } else {
            oldest + BATCH_WINDOW
        };
        if let Some(resume) = self.resume_at {
            at = at.max(resume);
        }
        if let Some(pace) = &self.pace {
            at = at.max(pace.ready_at(count));
        }
        Some(at)
    }

    /// The next report if it is due at `now` (`sent` and `wall` stamp the
    /// entries' ages and, for expired ones, their time).
    pub fn take(&mut self, now: Instant, wall: SystemTime) -> Option<Report> {
        if self.next_send().is_none_or(|at| at > now) {
            return None;
        }
        if let Some(pace) = &mut self.pace {
            pace.refill(now);
        }
        let mut apps = Vec::new();
        let mut entries = Vec::new();
        let mut bytes = 0usize;
        while apps.len() < self.max_entries {
            let Some(entry) = self.pending.first_entry() else {
                break;
            };
            let wire = entry.get().entry(wall, now);
            let size = wire.len() + 8;
            if !apps.is_empty() && bytes + size > MAX_REPORT_BYTES {
                break;
            }
            bytes += size;
            let report = entry.remove();
            self.awaited -= usize::from(report.awaited);
            apps.push(report);
            entries.push(wire);
        }
        if self.pending.is_empty() {
            self.oldest = None;
        } else {
            // What is left is due at once (a report's worth) or within the
            // window from now.
            self.oldest = Some(now);
        }
        if let Some(pace) = &mut self.pace {
            pace.tokens -= entries.len() as f64;
        }
        Some(self.record(apps, entries, false))
    }

    /// The complete state after a (re)connect: supersedes everything
    /// pending and is always taken by the CA.
    pub fn full_state(&mut self, state: Vec<Outgoing>, now: Instant, wall: SystemTime) -> Report {
        self.pending.clear();
        self.oldest = None;
        self.awaited = 0;
        let entries = state.iter().map(|r| r.entry(wall, now)).collect();
        if let Some(pace) = &mut self.pace {
            pace.refill(now);
            pace.tokens = (pace.tokens - state.len() as f64).max(-pace.burst);
        }
        self.record(state, entries, true)
    }

    fn record(&mut self, apps: Vec<Outgoing>, entries: Vec<Entry>, full_state: bool) -> Report {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        for app in &apps {
            self.last_sent.insert(app.key().clone(), sequence);
        }
        self.sent.push_back((sequence, apps));
        while self.sent.len() > REMEMBERED {
            if let Some((seq, old)) = self.sent.pop_front() {
                for app in old {
                    if self.last_sent.get(app.key()) == Some(&seq) {
                        self.last_sent.remove(app.key());
                    }
                }
            }
        }
        Report {
            entries,
            full_state,
            sequence,
        }
    }

    /// The CA refused report `sequence` (`FlowControl`): its entries wait
    /// again unless a newer result of the same application is pending or
    /// was sent since, and nothing goes out before `retry_after`. Returns
    /// how many entries wait again.
    pub fn refused(&mut self, sequence: u64, retry_after: Duration, now: Instant) -> usize {
        let resume = now + retry_after;
        self.resume_at = Some(self.resume_at.map_or(resume, |r| r.max(resume)));
        let Some(index) = self.sent.iter().position(|(s, _)| *s == sequence) else {
            return 0;
        };
        let Some((_, apps)) = self.sent.remove(index) else {
            return 0;
        };
        let mut again = 0;
        for app in apps {
            if self.last_sent.get(app.key()) != Some(&sequence) {
                continue;
            }
            self.last_sent.remove(app.key());
            if let std::collections::btree_map::Entry::Vacant(slot) =
                self.pending.entry(app.key().clone())
            {
                self.awaited += usize::from(app.awaited);
                slot.insert(app);
                again += 1;
            }
        }
        if again > 0 {
            self.oldest = Some(self.oldest.map_or(now, |o| o.min(now)));
        }
        // After a refusal the CA's bucket is empty: pace from nothing.
        if let Some(pace) = &mut self.pace {
            pace.refill(now);
            pace.tokens = pace.tokens.min(0.0);
        }
        again
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::{AddressResult, ApplicationReport, Method, Protocol, Status};

    fn report(host: &str, up: bool, checked: Instant) -> Outgoing {
        let report = ApplicationReport {
            key: AppKey {
                segment: "s".into(),
                host: host.parse().expect("host"),
                protocol: Protocol::Tcp,
                port: 80,
            },
            status: if up { Status::Up } else { Status::Down },
            addresses: vec![AddressResult {
                check: None,
                address: "10.0.0.1".parse().expect("ip"),
                reachable: up,
                method: Method::Tcp,
                rtt: Duration::from_millis(1),
                failure: None,
            }],
            checked_at_unix_ms: crate::send::report::unix_ms(SystemTime::now()),
            dns_error: None,
            expired: false,
            age: Duration::ZERO,
            access_id: None,
        };
        Outgoing::checked(report, checked, false)
    }

    fn decoded(r: Report) -> v1::HealthReport {
        r.message().expect("a report decodes")
    }

    fn limits(per_second: u32, burst: u32, max: u32) -> v1::ConnectorSettings {
        v1::ConnectorSettings {
            max_entries_per_second: per_second,
            max_entries_burst: burst,
            max_report_entries: max,
            ..Default::default()
        }
    }

    #[test]
    fn results_wait_for_the_window_and_coalesce() {
        let t0 = Instant::now();
        let mut o = Outbox::new();
        o.push(vec![report("a.test", true, t0)], t0);
        o.push(
            vec![report("a.test", false, t0)],
            t0 + Duration::from_millis(40),
        );
        o.push(
            vec![report("b.test", true, t0)],
            t0 + Duration::from_millis(60),
        );
        assert_eq!(o.next_send(), Some(t0 + BATCH_WINDOW));
        assert!(
            o.take(t0 + Duration::from_millis(99), SystemTime::now())
                .is_none()
        );
        let r = o
            .take(t0 + BATCH_WINDOW, SystemTime::now())
            .map(decoded)
            .expect("due");
        assert_eq!(r.applications.len(), 2);
        // Only the latest result of a.test, with its age at send time.
        assert_eq!(r.applications[0].status, v1::HealthStatus::Down as i32);
        assert_eq!(r.applications[0].age_ms, 100);
        assert_eq!(o.next_send(), None);
    }

    #[test]
    fn a_result_a_user_waits_for_goes_out_at_once_with_what_is_pending() {
        let t0 = Instant::now();
        let mut o = Outbox::new();
        o.push(vec![report("a.test", true, t0)], t0);
        assert_eq!(o.next_send(), Some(t0 + BATCH_WINDOW));
        let t1 = t0 + Duration::from_millis(10);
        let mut awaited = report("b.test", true, t1);
        awaited.awaited = true;
        o.push(vec![awaited], t1);
        // Due at once (the oldest pending arrived at t0), not at t0 + 100 ms.
        assert_eq!(o.next_send(), Some(t0));
        let r = o
            .take(t1, SystemTime::now())
            .map(decoded)
            .expect("due at once");
        assert_eq!(r.applications.len(), 2);
        // Nothing awaited is left: the next result waits for the window.
        let t2 = t1 + Duration::from_millis(5);
        o.push(vec![report("c.test", true, t2)], t2);
        assert_eq!(o.next_send(), Some(t2 + BATCH_WINDOW));
        // A newer, periodic result of an awaited application keeps it awaited.
        let mut d = report("d.test", false, t2);
        d.awaited = true;
        o.push(vec![d], t2);
        o.push(vec![report("d.test", true, t2)], t2);
        assert_eq!(o.next_send(), Some(t2));
    }

    #[test]
    fn reports_are_bounded_and_paced_to_the_ca_limit() {
        let t0 = Instant::now();
        let mut o = Outbox::new();
        o.set_limits(&limits(100, 50, 20), t0);
        let many: Vec<_> = (0..70)
            .map(|i| report(&format!("h{i}.test"), true, t0))
            .collect();
        o.push(many, t0);
        // A full report's worth waits: due at once.
        let sizes: Vec<usize> =
            std::iter::from_fn(|| o.take(t0, SystemTime::now()).map(|r| r.entries.len())).collect();
        // The burst of 50 allows two reports of 20, then 10 tokens are left.
        assert_eq!(sizes, [20, 20]);
        // 10 more tokens at 100/s: 100 ms later.
        assert_eq!(o.next_send(), Some(t0 + Duration::from_millis(100)));
        let r = o.take(t0 + Duration::from_millis(100), SystemTime::now());
        assert_eq!(r.map(|r| r.entries.len()), Some(20));
    }

    #[test]
    fn a_refused_report_waits_again_without_overwriting_newer_results() {
        let t0 = Instant::now();
        let mut o = Outbox::new();
        o.push(
            vec![report("a.test", true, t0), report("b.test", true, t0)],
            t0,
        );
        let first = o
            .take(t0 + BATCH_WINDOW, SystemTime::now())
            .map(decoded)
            .expect("due");
        // b.test changed and went out in a later report; a.test did not.
        let t1 = t0 + Duration::from_millis(150);
        o.push(vec![report("b.test", false, t1)], t1);
        let second = o
            .take(t1 + BATCH_WINDOW, SystemTime::now())
            .map(decoded)
            .expect("due");
        assert_eq!(second.applications.len(), 1);
        let t2 = t1 + Duration::from_millis(200);
        // The CA refuses the first: only a.test waits again (b.test's newer
        // result was sent since), after the CA's delay.
        assert_eq!(o.refused(first.sequence, Duration::from_millis(500), t2), 1);
        assert_eq!(o.pending(), 1);
        assert_eq!(o.next_send(), Some(t2 + Duration::from_millis(500)));
        let again = o
            .take(t2 + Duration::from_millis(500), SystemTime::now())
            .map(decoded)
            .expect("due");
        assert_eq!(again.applications.len(), 1);
        assert_eq!(
            again.applications[0].app.as_ref().map(|k| k.host.as_str()),
            Some("a.test")
        );
        // Its age still counts from its check.
        assert_eq!(again.applications[0].age_ms, 850);
        // Refusing a report that is unknown or already handled does nothing.
        assert_eq!(o.refused(first.sequence, Duration::ZERO, t2), 0);
    }
}
