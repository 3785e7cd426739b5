//! Access resolution: match a user request to a segment, select a connector
//! by strategy, and for on-access segments forward the access to the
//! candidates (coalesced) and, when nothing is reachable yet, wait for the
//! first reachable report up to the discovery timeout.

use std::collections::{HashMap, HashSet};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use policy::{
    AppKey, Candidate, Decision, HealthReporting, Host, Location, MatchOutcome, Protocol,
    Proximity, RefusalReason, Request, Segment, Status, Strategy,
};
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use serde::Serialize;
use tokio::sync::watch;

use crate::access;
use crate::access::explain::ExplanationView;
use crate::error::ApiError;
use crate::state::authority::Authority;
use crate::state::counters::Metrics;
use crate::state::health::{Report, Reports};
use crate::state::on_access::{Caps, Claim, Limit, WindowKey};
use crate::state::policy_state::PolicyState;
use crate::state::rosters;

/// A user request as the APIs receive it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessRequest {
    /// FQDN or IP literal.
    pub host: String,
    /// Protocol.
    pub protocol: Protocol,
    /// Port (1-65535; checked here).
    pub port: u32,
}

/// The chosen connector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Selected {
    /// Connector name.
    pub connector: String,
    /// Its group.
    pub group: String,
    /// The matched segment.
    pub segment: String,
}

/// A refusal with its reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// Machine-readable reason.
    pub reason: RefusalReason,
    /// Human-readable explanation.
    pub message: String,
}

/// The answer to an access request.
#[derive(Clone, Debug, PartialEq)]
pub struct AccessOutcome {
    /// The selection, or why there is none.
    pub decision: Result<Selected, Refusal>,
    /// How it was reached.
    pub explanation: ExplanationView,
}

impl AccessOutcome {
    /// The wire form.
    pub fn to_wire(&self) -> v1::AccessDecision {
        self.clone().into_wire()
    }

    /// The wire form, moving the strings instead of copying them (the
    /// gRPC answer; a decision's explanation holds a few per candidate).
    pub fn into_wire(self) -> v1::AccessDecision {
        use v1::access_decision::Outcome;
        let e = self.explanation;
        let outcome = match self.decision {
            Ok(s) => Outcome::Selected(v1::Selection {
                connector: s.connector,
                group: s.group,
                segment: s.segment,
            }),
            Err(r) => Outcome::Refusal(v1::Refusal {
                reason: v1::RefusalReason::from(r.reason) as i32,
                message: r.message,
            }),
        };
        let (candidates, counts, user_location) = match e.selection {
            Some(s) => (
                s.candidates
                    .into_iter()
                    .map(v1::CandidateExplanation::from)
                    .collect(),
                [
                    s.candidates_total,
                    s.candidates_eligible,
                    s.candidates_connected,
                ]
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
                s.user_location
                    .as_ref()
                    .map(v1::UserLocationExplanation::from),
            ),
            None => (Vec::new(), [0; 3], None),
        };
        let [candidates_total, candidates_eligible, candidates_connected] = counts;
        v1::AccessDecision {
            outcome: Some(outcome),
            explanation: Some(v1::Explanation {
                segment: e.segment.unwrap_or_default(),
                strategy: e.strategy.as_str().to_owned(),
                candidates,
                candidates_total,
                candidates_eligible,
                candidates_connected,
                discovery_waited: e.discovery_waited,
                discovery_ms: e.discovery_ms,
                matched_entry: e.matched_entry.unwrap_or_default(),
                chosen_group: e.chosen_group.unwrap_or_default(),
                user_location,
            }),
        }
    }
}

/// The request's host by `Host`'s rules. Surrounding whitespace is
/// forgiven here, as the APIs always have; inside, the rules hold.
fn request_host(host: &str) -> Result<Host, ApiError> {
    Host::parse(host.trim()).map_err(|e| ApiError::InvalidRequest(format!("host {e}")))
}

/// An access request's port, checked: 1-65535, else `invalid_request`.
/// The one check of it, which both APIs' requests pass (`resolve_from`, and
/// the HTTP body as it is parsed).
pub(crate) fn access_port(port: i64) -> Result<u16, ApiError> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p >= 1)
        .ok_or_else(|| port_outside(port))
}

/// The refusal of a port that is not one, quoting it as the request gave it.
pub(crate) fn port_outside(port: impl std::fmt::Display) -> ApiError {
    ApiError::InvalidRequest(format!("port {port} is outside 1-65535"))
}

/// Resolves one access request. Refusals are answers; errors mean the
/// request was unusable.
pub async fn resolve(
    authority: &Authority,
    request: AccessRequest,
) -> Result<AccessOutcome, ApiError> {
    resolve_from(authority, request, None).await
}

/// `resolve` for a user at `user_location`, when the caller knows it:
/// the `nearest` strategy then adds the estimated round trip from there
/// to each candidate's group (`policy::select`).
pub async fn resolve_from(
    authority: &Authority,
    request: AccessRequest,
    user_location: Option<Location>,
) -> Result<AccessOutcome, ApiError> {
    let started = Instant::now();
    let host = request_host(&request.host)?;
    let port = access_port(i64::from(request.port))?;
    let outcome = decide(authority, host, request.protocol, port, user_location).await;
    authority
        .metrics()
        .count_decision(outcome.decision.as_ref().err().map(|r| r.reason));
    let total = started.elapsed();
    authority
        .metrics()
        .decision_seconds
        .observe(total.as_secs_f64());
    if authority.log_stream().wants(crate::logstream::Kind::Access) {
        let matched = (outcome.explanation.matched_at).map_or(total, |m| m.duration_since(started));
        emit_access(authority, &request, &outcome, (matched, total));
    }
    match &outcome.decision {
        Ok(s) => {
            tracing::debug!(host = %request.host, port, connector = %s.connector, "access selected")
        }
        Err(r) => {
            tracing::info!(host = %request.host, port, reason = %r.reason, detail = %r.message, "access refused")
        }
    }
    Ok(outcome)
}

async fn decide(
    authority: &Authority,
    host: Host,
    protocol: Protocol,
    port: u16,
    user: Option<Location>,
) -> AccessOutcome {
    let state = authority.snapshot();
    let mut explanation = ExplanationView::new(state.settings().strategy);
    let request = Request {
        host,
        protocol,
        port,
    };
    let segment = match matched_segment(&state, &request, &mut explanation) {
        Ok(segment) => segment,
        Err(refusal) => {
            return AccessOutcome {
                decision: Err(refusal),
                explanation,
            };
        }
    };
    let mode = segment.health_reporting;
    let strategy = strategy_of(&state, segment);
    explanation.strategy = strategy;
    let proximity = Proximity {
        tolerance: state.settings().nearest_tolerance,
        user,
    };
    let key = AppKey {
        segment: segment.name.clone(),
        host: request.host,
        protocol,
        port,
    };

    // Subscribe before looking, so no report between the look and the
    // wait is missed.
    let mut changes = authority.subscribe();
    changes.borrow_and_update();
    let now = Instant::now();
    let how = (mode, strategy, proximity);
    let rostered = (mode != HealthReporting::OnAccess).then(|| {
        let rng = &mut rand::rng();
        access::roster::decide_on_roster(authority, &state, segment, &key, how, now, rng)
    });
    if let Some(decided) = rostered.flatten() {
        return finish(explanation, decided, strategy, segment, key, &state);
    }
    let mut candidates = candidates(authority, &state, segment, &key, now);
    let mut decision = pick(&candidates, mode, strategy, proximity);
    let mut rechecking = Vec::new();
    if mode == HealthReporting::OnAccess {
        let all_down = decision == Decision::Refused(RefusalReason::AllDown);
        let caps = Caps::of(state.settings());
        (explanation.forwarded_to, rechecking) =
            forward_on_access(authority, segment, &key, &candidates, all_down, caps, now);
    }
    let waits = decision == Decision::Refused(RefusalReason::NoHealthReport)
        || (decision == Decision::Refused(RefusalReason::AllDown) && !rechecking.is_empty());
    if mode == HealthReporting::OnAccess && waits {
        let started = Instant::now();
        (decision, candidates) = discover(
            authority,
            &state,
            segment,
            &key,
            proximity,
            changes,
            candidates,
            &rechecking,
        )
        .await;
        explanation.discovery_waited = true;
        explanation.discovery_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    }
    outcome(explanation, decision, candidates, how, segment, key, &state)
}

/// The decision to the log receivers that take access records: the
/// request, segment, selection, candidates counted, reason and the
/// time to match and to select (`timings`: matched, total).
fn emit_access(
    authority: &Authority,
    request: &AccessRequest,
    outcome: &AccessOutcome,
    (matched, total): (std::time::Duration, std::time::Duration),
) {
    use crate::logstream::{Field, Kind, Record};
    let us = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    let e = &outcome.explanation;
    let mut r = Record::new(
        Kind::Access,
        u64::try_from(crate::ground::clock::now_ms()).unwrap_or(0),
    )
    .text(Field::RequestId, format!("{:016x}", rand::random::<u64>()))
    .text(Field::Host, request.host.as_str())
    .int(Field::Port, u64::from(request.port))
    .text(Field::Protocol, request.protocol.as_str())
    .text(Field::Segment, e.segment.clone().unwrap_or_default());
    r = match &outcome.decision {
        Ok(s) => r
            .text(Field::Decision, "allowed")
            .text(Field::Connector, s.connector.as_str())
            .text(Field::Group, s.group.as_str()),
        Err(refusal) => r
            .text(Field::Decision, "refused")
            .text(Field::Group, e.chosen_group.clone().unwrap_or_default())
            .text(
                Field::Reason,
                format!("{}: {}", refusal.reason, refusal.message),
            ),
    };
    if let Some(s) = &e.selection {
        r = r
            .int(Field::CandidatesHealthy, s.candidates_eligible as u64)
            .int(Field::CandidatesTotal, s.candidates_total as u64);
    }
    authority.log_stream().emit(
        r.int(Field::MatchUs, us(matched))
            .int(Field::SelectUs, us(total.saturating_sub(matched)))
            .int(Field::TotalUs, us(total)),
    );
}

/// On-access discovery: nothing is reachable yet, so wait (up to the
/// discovery timeout) for reports that change that, re-selecting after
/// each. While re-checks of `rechecking` (connectors whose result was
/// Down) are unanswered, an all-Down decision waits too; once all are
/// answered (or at the deadline) it stands. Returns the decision and the
/// candidates it was made on (those seen last).
#[allow(clippy::too_many_arguments)] // the decision's inputs, as `decide` holds them
async fn discover(
    authority: &Authority,
    state: &PolicyState,
    segment: &Segment,
    key: &AppKey,
    proximity: Proximity,
    mut changes: watch::Receiver<u64>,
    mut candidates: Vec<Candidate>,
    rechecking: &[String],
) -> (Decision, Vec<Candidate>) {
    let (mode, strategy) = (segment.health_reporting, strategy_of(state, segment));
    let deadline = tokio::time::Instant::now() + state.settings().discovery_timeout;
    let pending = |this: &Authority| {
        rechecking
            .iter()
            .any(|c| this.on_access().recheck_pending(&(key.clone(), c.clone())))
    };
    let mut decision = pick(&candidates, mode, strategy, proximity);
    loop {
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Err(_) | Ok(Err(_)) => {
                let decision = match decision {
                    Decision::Refused(RefusalReason::NoHealthReport) => {
                        Decision::Refused(RefusalReason::DiscoveryTimeout)
                    }
                    other => other,
                };
                return (decision, candidates);
            }
            Ok(Ok(())) => {
                changes.borrow_and_update();
                candidates =
                    access::decide::candidates(authority, state, segment, key, Instant::now());
                decision = pick(&candidates, mode, strategy, proximity);
                match decision {
                    Decision::Refused(RefusalReason::NoHealthReport) => continue,
                    Decision::Refused(RefusalReason::AllDown) if pending(authority) => continue,
                    other => return (other, candidates),
                }
            }
        }
    }
}

/// The connected candidates whose latest result for `key` is Down or
/// older than the segment's report interval: an access re-checks them.
fn needs_recheck(
    authority: &Authority,
    segment: &Segment,
    key: &AppKey,
    candidates: &[Candidate],
    now: Instant,
) -> Vec<String> {
    let stale: HashSet<String> = authority
        .health()
        .statuses(key)
        .into_iter()
        .filter(|(_, status, at)| {
            *status == Status::Down || now.saturating_duration_since(*at) > segment.report_interval
        })
        .map(|(name, _, _)| name)
        .collect();
    candidates
        .iter()
        .filter(|c| c.connected && !c.drained && stale.contains(&c.connector))
        .map(|c| c.connector.clone())
        .collect()
}

fn pick(
    candidates: &[Candidate],
    mode: HealthReporting,
    strategy: Strategy,
    proximity: Proximity,
) -> Decision {
    policy::select_with(candidates, mode, strategy, proximity, &mut rand::rng())
}

/// Every known connector of the segment's groups with its effective
/// status for `key` and its group's location, in group order, then by
/// name.
///
/// Called for every decision: the group's members come from the
/// registry (its lock), then their results from the health table (the
/// shard's read lock, nothing copied out), never both locks at once;
/// each name is copied once, into its candidate.
pub(crate) fn candidates(
    authority: &Authority,
    state: &PolicyState,
    segment: &Segment,
    key: &AppKey,
    now: Instant,
) -> Vec<Candidate> {
    // Each group's candidates, in name order.
    let members = segment
        .connector_groups
        .iter()
        .map(|group| authority.registry().members(group));
    let (mut out, links, runs) = rosters::unjudged(state, segment, members);
    // On-access: whose window is live (its own lock, so before the
    // health table's).
    let live: Vec<bool> = if segment.health_reporting == HealthReporting::OnAccess {
        out.iter()
            .map(|c| authority.on_access().is_live(key, &c.connector, now))
            .collect()
    } else {
        Vec::new()
    };
    authority.health().inspect(key, |reports, _| {
        for run in runs {
            for (i, report) in matched(reports, &out[run.clone()]) {
                let i = run.start + i;
                let c = &mut out[i];
                c.status = Authority::effective(
                    state,
                    segment,
                    report.status,
                    now.saturating_duration_since(report.checked_at),
                    links.get(i).copied(),
                    live.get(i).copied().unwrap_or(true),
                )
                .0;
                c.rtt = report.rtt;
            }
        }
    });
    out
}

/// Forwards the access to the candidates' connectors (on-access
/// segments). When nobody is reachable (`all_down`) but some
/// connector's latest result is Down or old, it may have come back:
/// those re-check now (even within the forward interval), and the
/// decision waits for their answer before refusing. Returns the
/// connectors forwarded to and those re-checking.
fn forward_on_access(
    authority: &Authority,
    segment: &Segment,
    key: &AppKey,
    candidates: &[Candidate],
    all_down: bool,
    caps: Caps,
    now: Instant,
) -> (Vec<String>, Vec<String>) {
    let recheck = if all_down {
        needs_recheck(authority, segment, key, candidates, now)
    } else {
        Vec::new()
    };
    forward_access(authority, key, candidates, &recheck, caps, now)
}

/// Forwards an access to the connected candidates that are not drained
/// (a drained connector carries no new access, so nobody waits for
/// its check), at most once per
/// `access_forward_interval` per (application, connector) (held-back
/// accesses follow as a renewal, see `renew_windows`), and starts or
/// renews the CA's own window for each forward; not to connectors with
/// no room under `caps` (counted in `windows_refused`). Those in
/// `recheck` get it regardless of the interval (a re-check; see
/// `OnAccess`). Returns
/// who got it, and who of those as a re-check.
fn forward_access(
    authority: &Authority,
    key: &AppKey,
    candidates: &[Candidate],
    recheck: &[String],
    caps: Caps,
    now: Instant,
) -> (Vec<String>, Vec<String>) {
    let targets = authority.registry().senders(
        candidates
            .iter()
            .filter(|c| c.connected && !c.drained)
            .map(|c| c.connector.as_str()),
    );
    let mut sent = Vec::new();
    let mut rechecking = Vec::new();
    for (name, tx) in targets {
        let wk = (key.clone(), name.clone());
        let forced = recheck.contains(&name) && authority.on_access().claim_recheck(&wk, now);
        if !forced {
            match authority.on_access().claim_forward(&wk, now, caps) {
                Claim::Forward => {}
                Claim::Coalesced => continue,
                Claim::Full(limit) => {
                    // Bounded state: this connector (or segment) checks
                    // enough applications on access already.
                    window_refused(authority, &name, key, limit, "access not forwarded");
                    continue;
                }
            }
        }
        if send_access(authority, &name, &tx, wk, now, now, caps) {
            if forced {
                rechecking.push(name.clone());
            }
            sent.push(name);
        }
    }
    (sent, rechecking)
}

/// Counts and logs an on-access window for `name` and `key` that
/// `limit` refused (`what` became of the access).
fn window_refused(authority: &Authority, name: &str, key: &AppKey, limit: Limit, what: &str) {
    Metrics::count(&authority.metrics().windows_refused, "access");
    tracing::debug!(connector = %name, app = %key, "{what}: {} reached", limit.setting());
}

/// Sends connector `name` an `AccessEvent` for the access to `wk` at
/// `accessed`, renewing the CA's window on success (under `caps` if it
/// ended since it was claimed). Returns whether it was queued.
fn send_access(
    authority: &Authority,
    name: &str,
    tx: &crate::state::registry::Outbound,
    wk: WindowKey,
    accessed: Instant,
    now: Instant,
    caps: Caps,
) -> bool {
    let ago = now.saturating_duration_since(accessed);
    // The access's wall time names it for every replica (`state::access_ids`).
    let accessed_unix_ms = SystemTime::now()
        .checked_sub(ago)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let event = v1::AuthorityMessage {
        kind: Some(Out::Access(v1::AccessEvent {
            app: Some(v1::ApplicationKey::from(&wk.0)),
            accessed_ms_ago: u64::try_from(ago.as_millis()).unwrap_or(u64::MAX),
            access_id: authority.access_ids().issue(name, &wk.0, accessed_unix_ms),
        })),
    };
    if tx.try_send(Ok(event)).is_ok() {
        if let Err(limit) = authority.on_access().forwarded(wk.clone(), accessed, caps) {
            // Its window ended since the claim and its place is taken:
            // the connector checks it for this access alone.
            window_refused(authority, name, &wk.0, limit, "window not reopened");
        }
        authority.metrics().access_events_forwarded.inc();
        true
    } else {
        tracing::warn!(connector = %name, app = %wk.0, "cannot forward access: connector's queue is full");
        authority.on_access().forward_failed(&wk);
        false
    }
}

/// Sends the renewals coalescing owes at `now`: for every (application,
/// connector) whose accesses were held back and whose forward interval
/// has passed, one `AccessEvent` saying when the latest access was, so
/// the connector's window (and the CA's) ends a window after it.
pub(crate) fn renew_windows(authority: &Authority, now: Instant) {
    let due = authority.on_access().due_renewals(now);
    if due.is_empty() {
        return;
    }
    let mut by_connector: HashMap<String, Vec<(AppKey, Instant)>> = HashMap::new();
    for ((key, connector), accessed) in due {
        by_connector
            .entry(connector)
            .or_default()
            .push((key, accessed));
    }
    let caps = Caps::of(authority.snapshot().settings());
    let senders = authority
        .registry()
        .senders(by_connector.keys().map(String::as_str));
    for (name, tx) in senders {
        for (key, accessed) in by_connector.remove(&name).unwrap_or_default() {
            send_access(
                authority,
                &name,
                &tx,
                (key, name.clone()),
                accessed,
                now,
                caps,
            );
        }
    }
}

/// The reports of `candidates` (one group's, in name order) among
/// `reports` (in name order), with each one's index in `candidates`. A
/// merge of the two lists, unless the group is much smaller than the
/// application's reporters: then one search per candidate. At 10,000
/// connectors a search per candidate (14 string compares, each a pointer
/// chase) cost more than the rest of the decision.
fn matched<'r>(reports: &'r Reports, candidates: &[Candidate]) -> Vec<(usize, &'r Report)> {
    if candidates.len().saturating_mul(16) < reports.len() {
        return candidates
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i, reports.get(&c.connector)?)))
            .collect();
    }
    let mut found = Vec::new();
    let mut reports = reports.iter().peekable();
    for (i, c) in candidates.iter().enumerate() {
        while reports
            .next_if(|(name, _)| *name < c.connector.as_str())
            .is_some()
        {}
        if let Some((_, report)) = reports.next_if(|(name, _)| *name == c.connector) {
            found.push((i, report));
        }
    }
    found
}

/// The outcome of `decision` among `candidates` (decided under `how`: the
/// segment's mode, the strategy and the user's proximity), with its
/// explanation completed.
fn outcome(
    explanation: ExplanationView,
    decision: Decision,
    candidates: Vec<Candidate>,
    how: (HealthReporting, Strategy, Proximity),
    segment: &Segment,
    key: AppKey,
    state: &PolicyState,
) -> AccessOutcome {
    let (mode, strategy, proximity) = how;
    // The selection's names are copied out first: the candidates then
    // move into the explanation (`policy::explain_owned`).
    let (chosen, decision) = match decision {
        Decision::Selected { index } => (
            Some(index),
            Ok((
                candidates[index].connector.clone(),
                candidates[index].group.clone(),
            )),
        ),
        Decision::Refused(reason) => (None, Err(reason)),
    };
    let selection = policy::explain_owned(candidates, chosen, mode, strategy, proximity);
    finish(
        explanation,
        (decision, selection),
        strategy,
        segment,
        key,
        state,
    )
}

/// The outcome of a choice (connector and group) or refusal made under
/// `strategy`, and its explanation.
fn finish(
    mut explanation: ExplanationView,
    (decision, selection): crate::access::roster::Decided,
    strategy: Strategy,
    segment: &Segment,
    key: AppKey,
    state: &PolicyState,
) -> AccessOutcome {
    explanation.selection = Some(selection);
    match decision {
        Ok((connector, group)) => {
            if strategy == Strategy::Group {
                explanation.chosen_group = Some(group.clone());
            }
            AccessOutcome {
                decision: Ok(Selected {
                    connector,
                    group,
                    segment: key.segment,
                }),
                explanation,
            }
        }
        Err(reason) => AccessOutcome {
            decision: Err(Refusal {
                reason,
                message: refusal_message(reason, segment, &key, state),
            }),
            explanation,
        },
    }
}

/// The strategy that selects for `segment`: its own, else the CA's.
fn strategy_of(state: &PolicyState, segment: &Segment) -> Strategy {
    segment.strategy.unwrap_or(state.settings().strategy)
}

/// `segment_of`, noting in `explanation` when the match was made.
fn matched_segment<'s>(
    state: &'s PolicyState,
    request: &Request,
    explanation: &mut ExplanationView,
) -> Result<&'s Segment, Refusal> {
    let found = segment_of(state, request, explanation);
    explanation.matched_at = Some(Instant::now());
    found
}

/// The segment a request falls under, or the refusal when there is none
/// (or it lacks the port); notes the match in `explanation` either way.
fn segment_of<'s>(
    state: &'s PolicyState,
    request: &Request,
    explanation: &mut ExplanationView,
) -> Result<&'s Segment, Refusal> {
    let Request {
        host,
        protocol,
        port,
    } = request;
    let (m, has_port) = match state.index.match_request(request) {
        MatchOutcome::NoSegment => {
            return Err(Refusal {
                reason: RefusalReason::NoSegment,
                message: format!("no segment's applications match host {host:?}"),
            });
        }
        MatchOutcome::PortNotInSegment(m) => (m, false),
        MatchOutcome::Matched(m) => (m, true),
    };
    let segment = &state.policy().segments[m.segment];
    explanation.segment = Some(segment.name.clone());
    explanation.matched_entry = segment.applications.get(m.entry).map(ToString::to_string);
    if !has_port {
        return Err(Refusal {
            reason: RefusalReason::PortNotInSegment,
            message: format!(
                "segment {:?}, the most specific match for {host:?}, does not include {protocol}/{port}",
                segment.name
            ),
        });
    }
    Ok(segment)
}

fn refusal_message(
    reason: RefusalReason,
    segment: &Segment,
    key: &AppKey,
    state: &PolicyState,
) -> String {
    let app = format!("{}:{}/{}", key.host, key.port, key.protocol);
    match reason {
        RefusalReason::NoConnector => format!(
            "no connector of connector group(s) {} is connected",
            segment.connector_groups.join(", ")
        ),
        RefusalReason::AllDown => {
            format!("every connected connector reports {app} down")
        }
        RefusalReason::NoHealthReport => format!(
            "no connected connector has a current health report for {app} (segment {:?} is {})",
            segment.name, segment.health_reporting
        ),
        RefusalReason::DiscoveryTimeout => format!(
            "no connector reported {app} reachable within the discovery timeout ({} ms)",
            state.settings().discovery_timeout.as_millis()
        ),
        RefusalReason::AllDrained => format!(
            "every connected connector of connector group(s) {} is drained (by an administrator, or shutting down)",
            segment.connector_groups.join(", ")
        ),
        RefusalReason::NoSegment | RefusalReason::PortNotInSegment => reason.to_string(),
    }
}
