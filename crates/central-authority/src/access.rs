//! Access resolution: match a user request to a segment, select a connector
//! by strategy, and for on-access segments forward the access to the
//! candidates (coalesced) and, when nothing is reachable yet, wait for the
//! first reachable report up to the discovery timeout.

use std::time::Instant;

use policy::{
    AppKey, Candidate, CandidateNote, Decision, HealthReporting, MatchOutcome, Protocol,
    RefusalReason, Request, Segment, Status, Strategy,
};
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use serde::Serialize;

use crate::authority::Authority;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::policy_state::PolicyState;

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

/// How a decision was reached (policy's explanation plus what the CA did).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExplanationView {
    /// Matched segment, if any.
    pub segment: Option<String>,
    /// The segment entry that matched (FQDN, IP, wildcard or subnet).
    pub matched_entry: Option<String>,
    /// Strategy used.
    pub strategy: Strategy,
    /// The segment's health reporting mode.
    pub mode: Option<HealthReporting>,
    /// Every candidate and why it was (not) eligible.
    pub candidates: Vec<CandidateNote>,
    /// Group strategy: the eligible groups.
    pub eligible_groups: Vec<String>,
    /// Group strategy: the group chosen first.
    pub chosen_group: Option<String>,
    /// Connectors this access was forwarded to (on-access; after coalescing).
    pub forwarded_to: Vec<String>,
    /// Whether the CA waited for on-access discovery.
    pub discovery_waited: bool,
    /// How long it waited, in milliseconds.
    pub discovery_ms: u64,
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
        use v1::access_decision::Outcome;
        let e = &self.explanation;
        let outcome = match &self.decision {
            Ok(s) => Outcome::Selected(v1::Selection {
                connector: s.connector.clone(),
                group: s.group.clone(),
                segment: s.segment.clone(),
            }),
            Err(r) => Outcome::Refusal(v1::Refusal {
                reason: v1::RefusalReason::from(r.reason) as i32,
                message: r.message.clone(),
            }),
        };
        v1::AccessDecision {
            outcome: Some(outcome),
            explanation: Some(v1::Explanation {
                segment: e.segment.clone().unwrap_or_default(),
                strategy: e.strategy.as_str().to_owned(),
                candidates: e
                    .candidates
                    .iter()
                    .map(|c| v1::CandidateExplanation {
                        connector: c.connector.clone(),
                        group: c.group.clone(),
                        connected: c.connected,
                        status: v1::HealthStatus::from(c.status) as i32,
                        eligible: c.eligible,
                        reason: c.reason.clone(),
                    })
                    .collect(),
                discovery_waited: e.discovery_waited,
                discovery_ms: e.discovery_ms,
                matched_entry: e.matched_entry.clone().unwrap_or_default(),
                chosen_group: e.chosen_group.clone().unwrap_or_default(),
            }),
        }
    }
}

/// Host as a key: lower-case, no trailing dot, canonical IP text.
fn normalize_host(host: &str) -> Result<String, ApiError> {
    let h = host.trim().trim_end_matches('.');
    if h.is_empty() {
        return Err(ApiError::InvalidRequest("host is empty".into()));
    }
    if h.len() > 253 {
        return Err(ApiError::InvalidRequest(format!(
            "host is {} characters long (max 253)",
            h.len()
        )));
    }
    if let Ok(ip) = h.parse::<std::net::IpAddr>() {
        return Ok(ip.to_string());
    }
    if !h
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    {
        return Err(ApiError::InvalidRequest(format!(
            "host {:?} is neither a domain name nor an IP address",
            h.chars().take(64).collect::<String>()
        )));
    }
    Ok(h.to_ascii_lowercase())
}

impl Authority {
    /// Resolves one access request. Refusals are answers; errors mean the
    /// request was unusable.
    pub async fn resolve(&self, request: AccessRequest) -> Result<AccessOutcome, ApiError> {
        let started = Instant::now();
        let host = normalize_host(&request.host)?;
        let port = u16::try_from(request.port)
            .ok()
            .filter(|p| *p >= 1)
            .ok_or_else(|| {
                ApiError::InvalidRequest(format!("port {} is outside 1-65535", request.port))
            })?;
        let outcome = self.decide(host, request.protocol, port).await;
        let label = match &outcome.decision {
            Ok(_) => "selected",
            Err(r) => r.reason.as_str(),
        };
        Metrics::count(&self.metrics().decisions, label);
        self.metrics()
            .decision_seconds
            .observe(started.elapsed().as_secs_f64());
        match &outcome.decision {
            Ok(s) => {
                tracing::debug!(host = %request.host, port, connector = %s.connector, "access selected")
            }
            Err(r) => {
                tracing::info!(host = %request.host, port, reason = %r.reason, message = %r.message, "access refused")
            }
        }
        Ok(outcome)
    }

    async fn decide(&self, host: String, protocol: Protocol, port: u16) -> AccessOutcome {
        let state = self.snapshot();
        let strategy = state.settings().strategy;
        let mut explanation = ExplanationView {
            segment: None,
            matched_entry: None,
            strategy,
            mode: None,
            candidates: Vec::new(),
            eligible_groups: Vec::new(),
            chosen_group: None,
            forwarded_to: Vec::new(),
            discovery_waited: false,
            discovery_ms: 0,
        };
        let request = Request {
            host: host.clone(),
            protocol,
            port,
        };
        let refuse = |reason, message: String, explanation| AccessOutcome {
            decision: Err(Refusal { reason, message }),
            explanation,
        };
        let m = match state.index.match_request(&request) {
            MatchOutcome::NoSegment => {
                return refuse(
                    RefusalReason::NoSegment,
                    format!("no segment's applications match host {host:?}"),
                    explanation,
                );
            }
            MatchOutcome::PortNotInSegment(m) => {
                let seg = &state.policy().segments[m.segment];
                explanation.segment = Some(seg.name.clone());
                explanation.matched_entry = seg.applications.get(m.entry).map(ToString::to_string);
                return refuse(
                    RefusalReason::PortNotInSegment,
                    format!(
                        "segment {:?}, the most specific match for {host:?}, does not include {protocol}/{port}",
                        seg.name
                    ),
                    explanation,
                );
            }
            MatchOutcome::Matched(m) => m,
        };
        let segment = &state.policy().segments[m.segment];
        explanation.segment = Some(segment.name.clone());
        explanation.matched_entry = segment.applications.get(m.entry).map(ToString::to_string);
        explanation.mode = Some(segment.health_reporting);
        let key = AppKey {
            segment: segment.name.clone(),
            host,
            protocol,
            port,
        };
        let mode = segment.health_reporting;

        // Subscribe before looking, so no report between the look and the
        // wait is missed.
        let mut changes = self.subscribe();
        changes.borrow_and_update();
        let now = Instant::now();
        let mut candidates = self.candidates(&state, segment, &key, now);
        if mode == HealthReporting::OnAccess {
            explanation.forwarded_to = self.forward_access(&key, &candidates, now);
        }
        let mut decision = self.pick(&candidates, mode, strategy);

        if mode == HealthReporting::OnAccess
            && decision == Decision::Refused(RefusalReason::NoHealthReport)
        {
            explanation.discovery_waited = true;
            let wait_start = Instant::now();
            let deadline = tokio::time::Instant::now() + state.settings().discovery_timeout;
            decision = loop {
                match tokio::time::timeout_at(deadline, changes.changed()).await {
                    Err(_) | Ok(Err(_)) => {
                        break Decision::Refused(RefusalReason::DiscoveryTimeout);
                    }
                    Ok(Ok(())) => {
                        changes.borrow_and_update();
                        candidates = self.candidates(&state, segment, &key, Instant::now());
                        match self.pick(&candidates, mode, strategy) {
                            Decision::Refused(RefusalReason::NoHealthReport) => continue,
                            other => break other,
                        }
                    }
                }
            };
            explanation.discovery_ms =
                u64::try_from(wait_start.elapsed().as_millis()).unwrap_or(u64::MAX);
        }

        let notes = policy::explain(&candidates, mode, strategy);
        explanation.candidates = notes.candidates;
        explanation.eligible_groups = notes.eligible_groups;
        match decision {
            Decision::Selected { index } => {
                let c = &candidates[index];
                if strategy == Strategy::Group {
                    explanation.chosen_group = Some(c.group.clone());
                }
                AccessOutcome {
                    decision: Ok(Selected {
                        connector: c.connector.clone(),
                        group: c.group.clone(),
                        segment: key.segment.clone(),
                    }),
                    explanation,
                }
            }
            Decision::Refused(reason) => {
                let message = refusal_message(reason, segment, &key, &state);
                refuse(reason, message, explanation)
            }
        }
    }

    fn pick(
        &self,
        candidates: &[Candidate],
        mode: HealthReporting,
        strategy: Strategy,
    ) -> Decision {
        policy::select(candidates, mode, strategy, &mut rand::rng())
    }

    /// Every known connector of the segment's groups with its effective
    /// status for `key`, in group order, then by name.
    pub(crate) fn candidates(
        &self,
        state: &PolicyState,
        segment: &Segment,
        key: &AppKey,
        now: Instant,
    ) -> Vec<Candidate> {
        let conns = self.registry().snapshot();
        let reports = self.health().statuses(key);
        let mut out = Vec::new();
        for group in &segment.connector_groups {
            let mut names: Vec<_> = conns.iter().filter(|(_, c)| &c.group == group).collect();
            names.sort_by(|a, b| a.0.cmp(b.0));
            for (name, conn) in names {
                let status = match reports.iter().find(|(c, _, _)| c == name) {
                    Some((_, stored, at)) => {
                        let live = segment.health_reporting != HealthReporting::OnAccess
                            || self.on_access().is_live(key, name, now);
                        Self::effective(
                            state,
                            segment,
                            *stored,
                            now.saturating_duration_since(*at),
                            Some(conn),
                            live,
                        )
                        .0
                    }
                    None => Status::Unknown,
                };
                out.push(Candidate {
                    connector: name.clone(),
                    group: group.clone(),
                    connected: conn.connected,
                    status,
                });
            }
        }
        out
    }

    /// Forwards an access to the connected candidates, at most once per
    /// `access_forward_interval` per (application, connector), and starts or
    /// renews the CA's own window for each forward. Returns who got it.
    fn forward_access(&self, key: &AppKey, candidates: &[Candidate], now: Instant) -> Vec<String> {
        let targets = self.registry().senders(
            candidates
                .iter()
                .filter(|c| c.connected)
                .map(|c| c.connector.as_str()),
        );
        let mut sent = Vec::new();
        for (name, tx) in targets {
            let wk = (key.clone(), name.clone());
            if !self.on_access().claim_forward(&wk, now) {
                continue;
            }
            let event = v1::AuthorityMessage {
                kind: Some(Out::Access(v1::AccessEvent {
                    app: Some(v1::ApplicationKey::from(key)),
                })),
            };
            if tx.try_send(Ok(event)).is_ok() {
                self.on_access().forwarded(wk, now);
                self.metrics().access_events_forwarded.inc();
                sent.push(name);
            } else {
                self.on_access().forward_failed(&wk);
                tracing::warn!(connector = %name, app = %key, "cannot forward access: connector's queue is full");
            }
        }
        sent
    }
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
        RefusalReason::NoSegment | RefusalReason::PortNotInSegment => reason.to_string(),
    }
}
