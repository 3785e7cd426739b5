//! Report intake: the entries of a connector's health report are checked
//! one by one (well-formed, for an application its group serves) and stored
//! in the health table (`state::health`), keeping the CA's on-access
//! windows in step (`state::on_access`). Every entry takes one route, as a
//! `protocol::scan::EntryView`: read in place from the report's bytes
//! (`protocol::scan`), or lent by an entry prost decoded and `policy`
//! converted (a report the scan does not take); a full-state report also
//! marks what it left out Unknown.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use policy::{AppKey, ApplicationReport, HealthReporting, Status};
use protocol::scan::EntryView;
use protocol::v1;

use crate::config::Settings;
use crate::error::ReportError;
use crate::state::authority::Authority;
use crate::state::counters::Metrics;
use crate::state::health::{KeyRef, Report, TableKey, UnknownCause};
use crate::state::on_access::{Adoption, Caps};
use crate::state::policy_state::{PolicyState, app_allowed_parts};
use crate::trust::identity::Identity;

/// Rejected report entries logged one by one per report.
const LOGGED_REJECTIONS: u64 = 3;

/// How far ahead of this CA's wall clock another replica's clock may be
/// for an access id it issued to count (replicas run NTP; more skew than
/// this is a broken clock or a forged time).
const MAX_ACCESS_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// Takes a health report decoded with prost (the route for every report
/// `protocol::scan` does not read in place): each entry is converted on
/// its own, a malformed one rejected, and the rest taken by
/// [`intake_entries`] as views of the converted entries.
pub(crate) fn intake(
    authority: &Authority,
    identity: &Identity,
    state: &PolicyState,
    report: v1::HealthReport,
    now: Instant,
    wall: SystemTime,
) {
    let mut rejected = 0u64;
    let mut converted = Vec::with_capacity(report.applications.len());
    for app in report.applications {
        match ApplicationReport::try_from(app) {
            Ok(entry) => converted.push(entry),
            Err(e) => {
                rejected += 1;
                rejected_entry(authority, identity, &e.into(), rejected);
            }
        }
    }
    let mut views: Vec<EntryView<'_>> = converted.iter_mut().map(EntryView::lend).collect();
    intake_entries(
        authority,
        identity,
        state,
        Intake {
            full_state: report.full_state,
            rejected,
        },
        views.iter_mut(),
        now,
        wall,
    );
}

/// The one route of a report's entries into the health table: each
/// entry is checked on its own; entries for applications the
/// connector's group does not serve are rejected and logged, the rest
/// are stored. A full-state report also marks what it left out Unknown.
/// Discovery waiters are woken only when an application's effective
/// status may have changed.
pub(crate) fn intake_entries<'e, 'm: 'e>(
    authority: &Authority,
    identity: &Identity,
    state: &PolicyState,
    report: Intake,
    entries: impl Iterator<Item = &'e mut EntryView<'m>>,
    now: Instant,
    wall: SystemTime,
) {
    let settings = state.settings();
    let Intake {
        full_state,
        mut rejected,
    } = report;
    // Only a full-state report needs the keys it names.
    let mut seen = full_state.then(HashSet::new);
    let mut accepted = 0u64;
    let mut changed = false;
    for view in entries {
        match store_view(authority, identity, state, view, now, wall) {
            Ok(entry_changed) => {
                changed |= entry_changed;
                accepted += 1;
                if let Some(seen) = &mut seen {
                    seen.insert(view.key());
                }
            }
            Err(e) => {
                rejected += 1;
                rejected_entry(authority, identity, &e, rejected);
            }
        }
    }
    if rejected > LOGGED_REJECTIONS {
        tracing::warn!(
            connector = %identity.name,
            rejected,
            "rejected health report entries (only the first {LOGGED_REJECTIONS} logged)"
        );
    }
    if let Some(seen) = &seen {
        changed |= mark_missing(authority, identity, seen, settings, wall);
    }
    authority.metrics().reports_received.inc_by(accepted);
    if changed {
        authority.bump();
    }
}

/// Counts a rejected report entry; logs it when it is one of the first
/// `LOGGED_REJECTIONS` of its report (the `nth`).
fn rejected_entry(authority: &Authority, identity: &Identity, error: &ReportError, nth: u64) {
    authority.metrics().reports_rejected.inc();
    // A broken or hostile connector must not flood the log: a few
    // entries in detail, then a count.
    if nth <= LOGGED_REJECTIONS {
        tracing::warn!(
            connector = %identity.name,
            group = %identity.group,
            error = %error,
            "rejected a health report entry"
        );
    }
}

/// Stores one accepted entry of an on-access segment in the health
/// table, keeping the CA's window in step. Returns whether an
/// application's effective status may have changed.
fn store_on_access(
    authority: &Authority,
    identity: &Identity,
    settings: &Settings,
    entry: Accepted,
    now: Instant,
    wall: SystemTime,
) -> bool {
    let Accepted {
        report,
        mode,
        report_interval,
    } = entry;
    let ApplicationReport {
        key,
        status,
        addresses,
        checked_at_unix_ms,
        dns_error,
        expired,
        age,
        access_id,
    } = report;
    let mut changed = false;
    if mode == HealthReporting::OnAccess {
        let entry = WindowReport {
            status,
            expired,
            accessed: access_id
                .and_then(|id| verified_access(authority, identity, &key, &id, now, wall)),
        };
        let (window_changed, keep) = follow_window(authority, identity, settings, &key, entry, now);
        changed |= window_changed;
        if !keep {
            return changed;
        }
    }
    let report = Report {
        addresses: protocol::scan::Addresses::from_vec(addresses),
        dns_error,
        checked_at: crate::state::health::checked_at(now, age),
        checked_at_unix_ms,
        ..table_report(identity, status, expired, now, wall)
    };
    changed
        | store_report(
            authority,
            identity,
            settings,
            key,
            report,
            report_interval,
            now,
        )
}

/// Checks one entry (for an application the connector's group serves)
/// and stores it, with its key as read from the message (an on-access
/// entry's window bookkeeping keeps owned keys: `store_on_access`).
fn store_view(
    authority: &Authority,
    identity: &Identity,
    state: &PolicyState,
    view: &mut EntryView<'_>,
    now: Instant,
    wall: SystemTime,
) -> Result<bool, ReportError> {
    let segment = app_allowed_parts(
        state,
        &identity.group,
        (view.segment, view.host.as_str()),
        view.host.ip(),
        view.protocol,
        view.port,
    )?;
    let settings = state.settings();
    if segment.health_reporting == HealthReporting::OnAccess {
        // The on-access window's bookkeeping keeps owned keys.
        let entry = Accepted {
            mode: segment.health_reporting,
            report_interval: segment.report_interval,
            report: view.take_report(),
        };
        return Ok(store_on_access(
            authority, identity, settings, entry, now, wall,
        ));
    }
    let report = Report {
        dns_error: view.dns_error(),
        checked_at: crate::state::health::checked_at(now, view.age),
        checked_at_unix_ms: view.checked_at_unix_ms,
        addresses: std::mem::take(&mut view.addresses),
        ..table_report(identity, view.status, view.expired, now, wall)
    };
    let key = KeyRef {
        segment: view.segment,
        host: view.host,
        protocol: view.protocol,
        port: view.port,
    };
    Ok(store_report(
        authority,
        identity,
        settings,
        key,
        report,
        segment.report_interval,
        now,
    ))
}

/// Puts `report` in the health table as `identity`'s latest for `key`.
/// Returns whether the application's effective status may have changed.
fn store_report(
    authority: &Authority,
    identity: &Identity,
    settings: &Settings,
    key: impl TableKey,
    report: Report,
    report_interval: Duration,
    now: Instant,
) -> bool {
    let stored = report.status;
    let previous =
        authority
            .health()
            .replace(key, &identity.name, report, settings.transitions_kept);
    // The effective status can change only if the stored one does, or
    // if the previous report may have been stale (older than the
    // staleness limit's lower bound; a fresh report makes it current
    // again).
    match previous {
        None => stored != Status::Unknown,
        Some((was, at)) => {
            was != stored
                || (was != Status::Unknown
                    && now.saturating_duration_since(at)
                        > report_interval.saturating_mul(settings.stale_after_intervals))
        }
    }
}

/// When the access that report entry's `id` names happened, on this
/// CA's monotonic clock, if any replica of this deployment issued `id`
/// for this connector and application (`state::access_ids`). Replicas' wall
/// clocks are assumed synchronised (NTP); an access time more than
/// `MAX_ACCESS_CLOCK_SKEW` ahead of this CA's clock is refused.
fn verified_access(
    authority: &Authority,
    identity: &Identity,
    key: &AppKey,
    id: &str,
    now: Instant,
    wall: SystemTime,
) -> Option<Instant> {
    let at_ms = authority.access_ids().verify(&identity.name, key, id)?;
    let wall_ms = wall
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let skew = i64::try_from(MAX_ACCESS_CLOCK_SKEW.as_millis()).unwrap_or(i64::MAX);
    if at_ms > wall_ms.saturating_add(skew) {
        return None;
    }
    let ago = u64::try_from(wall_ms.saturating_sub(at_ms)).unwrap_or(0);
    // Too far back for this clock: certainly more than a window.
    now.checked_sub(Duration::from_millis(ago))
}

/// Keeps the CA's on-access window for (`key`, connector) in step with
/// what the connector reports. Returns whether a window was adopted or
/// a forced re-check answered (either may change a decision), and
/// whether to store the entry: not when its window would be one more
/// than the caps allow (`max_windows_per_connector`,
/// `max_windows_per_segment`; counted in `windows_refused`), so a
/// report cannot grow the CA beyond them.
fn follow_window(
    authority: &Authority,
    identity: &Identity,
    settings: &Settings,
    key: &AppKey,
    entry: WindowReport,
    now: Instant,
) -> (bool, bool) {
    let WindowReport {
        status,
        expired,
        accessed,
    } = entry;
    let wk = (key.clone(), identity.name.to_string());
    // A report answers a forced re-check: an access waiting on it must
    // look again even if the status did not change.
    let answered = authority.on_access().answered(&wk);
    let (adopted, keep) = if expired {
        // The connector stopped checking: the next access must reach it
        // again, not be coalesced away.
        authority.on_access().end(&wk);
        (false, true)
    } else if status != Status::Unknown {
        // Adopt windows the CA did not start (another replica forwarded
        // the access, or this CA restarted) when a verified access
        // opened them; keep the rest as unsolicited entries.
        match authority
            .on_access()
            .adopt(wk, accessed, now, Caps::of(settings))
        {
            Adoption::Live => (false, true),
            Adoption::Adopted => (true, true),
            Adoption::Unsolicited => {
                authority.metrics().unsolicited_entries.inc();
                (false, true)
            }
            Adoption::Full(_) => {
                Metrics::count(&authority.metrics().windows_refused, "report");
                (false, false)
            }
        }
    } else {
        (false, true)
    };
    (answered || adopted, keep)
}

/// A full-state report lists everything the connector checks: what it
/// left out is Unknown for it now. Returns whether anything changed.
fn mark_missing(
    authority: &Authority,
    identity: &Identity,
    seen: &HashSet<AppKey>,
    settings: &Settings,
    wall: SystemTime,
) -> bool {
    let name = &*identity.name;
    let marked =
        authority
            .health()
            .mark_unknown_of(name, wall, settings.transitions_kept, |key, _| {
                (!seen.contains(key)).then_some(UnknownCause::NotInFullState)
            });
    marked > 0
}

/// The table's form of an entry with `status` (`expired`: its on-access
/// window ended) received at `now`: no addresses, no resolver reason,
/// checked when received; the caller fills those in.
fn table_report(
    identity: &Identity,
    status: Status,
    expired: bool,
    now: Instant,
    wall: SystemTime,
) -> Report {
    let unknown_cause = match (status, expired) {
        (_, true) => Some(UnknownCause::WindowExpired),
        (Status::Unknown, false) => Some(UnknownCause::Reported),
        _ => None,
    };
    Report {
        group: Arc::clone(&identity.group),
        status: if expired { Status::Unknown } else { status },
        addresses: protocol::scan::Addresses::new(),
        dns_error: None,
        received_at: now,
        checked_at: now,
        received_wall: wall,
        checked_at_unix_ms: 0,
        unknown_cause,
        rtt: None,
    }
}

/// What the intake knows of a report besides its entries.
pub(crate) struct Intake {
    /// `HealthReport.full_state`.
    pub(crate) full_state: bool,
    /// Entries rejected before the intake saw them (malformed on the wire).
    pub(crate) rejected: u64,
}

/// What one on-access report entry says about its window.
struct WindowReport {
    status: Status,
    /// The connector stopped checking (the window ended).
    expired: bool,
    /// When the access the entry's verified access id names happened
    /// (`None`: no id, or one that does not verify).
    accessed: Option<Instant>,
}

/// One accepted report entry with what its segment says about it.
struct Accepted {
    report: ApplicationReport,
    /// The segment's mode and report interval.
    mode: HealthReporting,
    report_interval: Duration,
}
