//! Periodic upkeep of the shared state, run every `HOUSEKEEPING_EVERY` by
//! `run`: window renewals coalescing owes, the end of on-access windows,
//! staleness sweeps of the health table (recorded for the history), load
//! estimates and the forgetting of throttle entries that refilled. The
//! access path does not depend on it: effective statuses are computed when
//! read.

use std::collections::{HashMap, HashSet};
use std::time::{Instant, SystemTime};

use policy::{AppKey, HealthReporting, Segment, Status};

use crate::state::authority::Authority;
use crate::state::health::UnknownCause;
use crate::state::registry::ConnSnap;

/// Periodic upkeep: sends the window renewals coalescing owes, ends
/// on-access windows the CA tracks, turns stale reports Unknown
/// (recording the transition for the dashboard), prunes coalescing state
/// and refreshes load estimates. The access path does not depend on it:
/// effective statuses are computed when read.
pub fn run_once(a: &Authority, now: Instant) {
    a.renew_windows(now);
    let mut ended: HashMap<AppKey, HashSet<String>> = HashMap::new();
    for k in a.on_access().expire(now) {
        ended.entry(k.0).or_default().insert(k.1);
    }
    let due = a.sweep_due(now, !ended.is_empty());
    if due && sweep(a, now, &ended) {
        a.bump();
    }
    a.recompute_budgets();
    a.flush_throttle_logs();
    a.renew_limit().retain_recent();
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
