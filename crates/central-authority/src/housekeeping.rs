//! Periodic upkeep of the shared state, run every `HOUSEKEEPING_EVERY` by
//! `run`: window renewals coalescing owes, the end of on-access windows,
//! staleness sweeps of the health table (recorded for the history), load
//! estimates and the forgetting of throttle entries that refilled; and,
//! less often, the pruning of the audit trail past `[audit] retention_s`
//! (`prune_audit`). The access path does not depend on it: effective
//! statuses are computed when read. `Repeated` keeps a failure that recurs
//! every round (the store down) to one log line a minute.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use policy::{AppKey, HealthReporting, Segment, Status};

use crate::access;
use crate::state::authority::Authority;
use crate::state::health::UnknownCause;
use crate::state::registry::ConnSnap;
use crate::trust;

/// Periodic upkeep: sends the window renewals coalescing owes, ends
/// on-access windows the CA tracks, turns stale reports Unknown
/// (recording the transition for the dashboard), prunes coalescing state
/// and refreshes load estimates. The access path does not depend on it:
/// effective statuses are computed when read.
pub fn run_once(a: &Authority, now: Instant) {
    access::decide::renew_windows(a, now);
    let mut ended: HashMap<AppKey, HashSet<String>> = HashMap::new();
    for k in a.on_access().expire(now) {
        ended.entry(k.0).or_default().insert(k.1);
    }
    let due = a.sweep_due(now, !ended.is_empty());
    if due && sweep(a, now, &ended) {
        a.bump();
    }
    a.recompute_budgets();
    trust::throttle::flush_throttle_logs(a);
    a.renew_limit().retain_recent();
}

/// How often the audit trail is pruned (and once at start).
pub const AUDIT_PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// Deletes the audit trail from before `[audit] retention_s` ago, at
/// `now_ms` (Unix ms); returns how many entries went.
pub fn prune_audit(a: &Authority, now_ms: i64) -> Result<usize, crate::store::StoreError> {
    let retention = a.snapshot().settings().audit_retention;
    let before = now_ms.saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX));
    let n = a.store().prune_audit(before)?;
    if n > 0 {
        tracing::debug!(deleted = n, "audit trail past its retention deleted");
    }
    Ok(n)
}

/// Turns stale results (and those of the `ended` windows) Unknown,
/// recording the transitions, and removes on-access entries past their
/// retention. Returns whether anything changed.
fn sweep(a: &Authority, now: Instant, ended: &HashMap<AppKey, HashSet<String>>) -> bool {
    let state = a.snapshot();
    let keep = state.settings().transitions_kept;
    let conns = a.registry().snapshot();
    // The table hands every connector's result of one application in
    // a row: its segment is looked up once (a name compare instead of a
    // hash per result).
    let mut last: Option<&Segment> = None;
    let changed = a
        .health()
        .mark_unknown(SystemTime::now(), keep, |key, c, report| {
            if ended.get(key).is_some_and(|s| s.contains(c)) {
                return Some(UnknownCause::WindowExpired);
            }
            let segment = match last {
                Some(s) if s.name == key.segment => s,
                _ => {
                    let s = state.segment(&key.segment)?;
                    last = Some(s);
                    s
                }
            };
            // Windows are checked through `ended` above; pass `true` here.
            Authority::effective(
                &state,
                segment,
                report.status,
                now.saturating_duration_since(report.checked_at),
                conns.get(c).map(ConnSnap::link),
                true,
            )
            .1
        });
    // Bounded state: entries of on-access applications whose window
    // ended (listed as Unknown until then) go after the retention. A
    // live window is reported on every interval, so an entry that is
    // Unknown and has had no report for the retention has none (judged
    // without taking the windows' lock inside the table's).
    let retention = state.settings().on_access_retention;
    let removed = a.health().remove_where(|key, _, report| {
        report.status == Status::Unknown
            && now.saturating_duration_since(report.received_at) >= retention
            && state
                .segment(&key.segment)
                .is_some_and(|s| s.health_reporting == HealthReporting::OnAccess)
    });
    if removed > 0 {
        tracing::debug!(removed, "on-access entries past their retention removed");
    }
    changed > 0 || removed > 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trust::audit::{Actor, AdminAction, Outcome};

    /// Entries older than `[audit] retention_s` at the injected time go;
    /// the younger stay.
    #[test]
    fn the_audit_trail_is_pruned_past_its_retention() {
        let config = crate::Config::from_toml(
            "[server]\nallow_short_secrets = true\n[audit]\nretention_s = 60\n",
            std::path::Path::new("."),
        )
        .expect("valid");
        let store = crate::store::Store::in_memory().expect("db");
        let a = Authority::with_trust(config, None, store);
        let root = Actor::token("root");
        let action = AdminAction {
            actor: &root,
            source: None,
            action: "connector.revoke",
            target: "c1",
            outcome: Outcome::Ok,
            detail: String::new(),
        };
        let now = 10_000_000;
        for at in [now - 61_000, now - 60_000, now - 1_000] {
            a.store()
                .record_audit(&action.record(at))
                .expect("recorded");
        }
        assert_eq!(prune_audit(&a, now).expect("pruned"), 1);
        let (left, total) = a
            .store()
            .audit(&crate::store::AuditFilter::default(), 10, 0)
            .expect("read");
        assert_eq!(total, 2);
        assert_eq!(
            left.iter().map(|r| r.at_ms).collect::<Vec<_>>(),
            [now - 1_000, now - 60_000]
        );
        assert_eq!(prune_audit(&a, now + 60_000).expect("pruned"), 2);
    }
}

/// A failure that recurs while its cause lasts (a periodic task against a
/// store that is down): logged the first time, then at most once per
/// `every` with how many failures there were since, and once more when it
/// stops failing. Time is an argument.
#[derive(Debug)]
pub struct Repeated {
    every: Duration,
    /// When it was last logged (`None`: not failing).
    logged: Option<Instant>,
    /// Failures since then.
    unlogged: u64,
    /// Failures since it last succeeded.
    run: u64,
}

impl Repeated {
    /// Logs at most once per `every`.
    pub fn new(every: Duration) -> Repeated {
        Repeated {
            every,
            logged: None,
            unlogged: 0,
            run: 0,
        }
    }

    /// A failure at `now`: `Some(n)` when it is to be logged, `n` the
    /// failures it stands for (this one and those not logged since the
    /// last line).
    pub fn failed(&mut self, now: Instant) -> Option<u64> {
        self.run += 1;
        self.unlogged += 1;
        let due = self
            .logged
            .is_none_or(|at| now.saturating_duration_since(at) >= self.every);
        if !due {
            return None;
        }
        self.logged = Some(now);
        Some(std::mem::take(&mut self.unlogged))
    }

    /// A success: `Some(n)` when it ends a run of `n` failures.
    pub fn succeeded(&mut self) -> Option<u64> {
        self.logged = None;
        self.unlogged = 0;
        Some(std::mem::take(&mut self.run)).filter(|&n| n > 0)
    }
}

#[cfg(test)]
mod repeated_tests {
    use super::*;

    /// Every 0.5 s for three minutes (the housekeeping pace against a store
    /// that is down): the first failure, then one line a minute counting
    /// the failures since, then the end of the run once.
    #[test]
    fn a_recurring_failure_is_logged_once_then_once_a_minute_with_a_count() {
        let start = Instant::now();
        let mut r = Repeated::new(Duration::from_secs(60));
        let mut lines = Vec::new();
        for i in 0..360u64 {
            let now = start + Duration::from_millis(500 * i);
            if let Some(n) = r.failed(now) {
                lines.push((now - start, n));
            }
        }
        assert_eq!(
            lines,
            [
                (Duration::ZERO, 1),
                (Duration::from_secs(60), 120),
                (Duration::from_secs(120), 120),
            ]
        );
        assert_eq!(r.succeeded(), Some(360), "the end of the run, once");
        assert_eq!(r.succeeded(), None);
        // A new run is logged at once again.
        let later = start + Duration::from_secs(200);
        assert_eq!(r.failed(later), Some(1));
        assert_eq!(r.failed(later + Duration::from_millis(500)), None);
    }
}
