//! Counters and histograms the CA updates as things happen (decisions,
//! sessions, reports, refusals), exported on `/metrics` by `api::metrics`
//! next to the gauges of the state computed at scrape time.

use std::sync::OnceLock;

use policy::RefusalReason;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label of a decision: `selected` or the refusal reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `selected`, `no_segment`, `port_not_in_segment`, …
    pub outcome: String,
}

/// How many `RefusalReason`s there are (the decision series' places).
const REFUSAL_REASONS: usize = 7;

/// Labels of `reach_ca_throttled_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ThrottleLabel {
    /// `token` or `enrollment`.
    pub what: &'static str,
    /// `source` (the address's own limit) or `global` (the whole CA's).
    pub scope: &'static str,
}

/// The CA's metrics. Cloning a metric handle is shallow (an `Arc`).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Connectors with a live session.
    pub connectors_connected: Gauge,
    /// Application results accepted from connectors.
    pub reports_received: Counter,
    /// Application results rejected (malformed, or for an application the
    /// connector's group does not serve).
    pub reports_rejected: Counter,
    /// Access decisions by outcome.
    pub decisions: Family<OutcomeLabel, Counter>,
    /// `decisions`' series by outcome, each taken from the family on first
    /// use (so the exposition shows only outcomes that happened, as
    /// before); counting a decision then neither allocates nor hashes a
    /// label. Index 0 is `selected`, then `RefusalReason`s in order.
    decision_series: [OnceLock<Counter>; 1 + REFUSAL_REASONS],
    /// Time to decide an access request, in seconds (includes discovery).
    pub decision_seconds: Histogram,
    /// Access events forwarded to connectors.
    pub access_events_forwarded: Counter,
    /// On-access windows refused by `max_windows_per_connector` or
    /// `max_windows_per_segment`, by origin
    /// (`access` or `report`).
    pub windows_refused: Family<OutcomeLabel, Counter>,
    /// On-access report entries no verified access asked for (no access
    /// id, a forged one, or one a window old): stored, never routed on.
    pub unsolicited_entries: Counter,
    /// Configuration reloads by result.
    pub reloads: Family<OutcomeLabel, Counter>,
    /// Connector messages dropped by the per-connector rate cap.
    pub messages_rate_limited: Counter,
    /// Connector reports refused with `FlowControl` (over the session's
    /// entry limit; the connector sends them again, nothing is lost).
    pub reports_deferred: Counter,
    /// Connector reports that sent an application of their session's
    /// latest refused report again before that `FlowControl`'s
    /// `retry_after_ms` had passed (a connector that does not wait as the
    /// contract asks).
    pub reports_early: Counter,
    /// Enrollments by outcome (`enrolled` or the refusal).
    pub enrollments: Family<OutcomeLabel, Counter>,
    /// Connector sessions refused at authentication, by reason.
    pub sessions_refused: Family<OutcomeLabel, Counter>,
    /// Attempts refused unevaluated because their source (or the whole CA)
    /// failed too often (`state::limits`).
    pub throttled: Family<ThrottleLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut metrics = Metrics {
            registry: Registry::with_prefix("reach_ca"),
            decision_series: Default::default(),
            connectors_connected: Gauge::default(),
            reports_received: Counter::default(),
            reports_rejected: Counter::default(),
            decisions: Family::default(),
            decision_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 18)),
            access_events_forwarded: Counter::default(),
            windows_refused: Family::default(),
            unsolicited_entries: Counter::default(),
            reloads: Family::default(),
            messages_rate_limited: Counter::default(),
            reports_deferred: Counter::default(),
            reports_early: Counter::default(),
            enrollments: Family::default(),
            sessions_refused: Family::default(),
            throttled: Family::default(),
        };
        // The exposition lists families in registration order.
        metrics.register_refusals();
        metrics.register_traffic();
        metrics
    }
}

impl Metrics {
    /// Registers the families of refused or held-back work.
    fn register_refusals(&mut self) {
        self.registry.register(
            "on_access_windows_refused",
            "On-access windows refused by max_windows_per_connector or max_windows_per_segment, by origin (access or report)",
            self.windows_refused.clone(),
        );
        self.registry.register(
            "on_access_unsolicited_entries",
            "On-access report entries no verified access asked for (stored, never routed on)",
            self.unsolicited_entries.clone(),
        );
        self.registry.register(
            "throttled",
            "Token and enrollment attempts refused unevaluated after too many failures, by the limit (source address or whole CA)",
            self.throttled.clone(),
        );
        self.registry.register(
            "messages_rate_limited",
            "Connector messages dropped by the per-connector rate cap",
            self.messages_rate_limited.clone(),
        );
        self.registry.register(
            "reports_deferred",
            "Connector reports refused with flow control (re-sent by the connector)",
            self.reports_deferred.clone(),
        );
        self.registry.register(
            "reports_early",
            "Connector reports that sent a refused application again before the retry_after_ms of their session's latest flow control",
            self.reports_early.clone(),
        );
        self.registry.register(
            "enrollments",
            "Connector enrollments by outcome (enrolled or the refusal)",
            self.enrollments.clone(),
        );
        self.registry.register(
            "sessions_refused",
            "Connector sessions refused at authentication or, for a release outside the compatibility policy, at Hello, by reason",
            self.sessions_refused.clone(),
        );
    }

    /// Registers the families of sessions, reports, decisions and reloads.
    fn register_traffic(&mut self) {
        self.registry.register(
            "connectors_connected",
            "Connectors with a live session",
            self.connectors_connected.clone(),
        );
        self.registry.register(
            "reports_received",
            "Application health results accepted from connectors",
            self.reports_received.clone(),
        );
        self.registry.register(
            "reports_rejected",
            "Application health results rejected (malformed or not served by the connector's group)",
            self.reports_rejected.clone(),
        );
        self.registry.register(
            "decisions",
            "Access decisions by outcome (selected or the refusal reason)",
            self.decisions.clone(),
        );
        self.registry.register(
            "decision_duration_seconds",
            "Time to decide an access request, including on-access discovery",
            self.decision_seconds.clone(),
        );
        self.registry.register(
            "access_events_forwarded",
            "Access events forwarded to connectors (after coalescing)",
            self.access_events_forwarded.clone(),
        );
        self.registry.register(
            "config_reloads",
            "Configuration reloads by outcome (applied or rejected)",
            self.reloads.clone(),
        );
    }
}

impl Metrics {
    /// Counts one outcome in a labelled family.
    pub fn count(family: &Family<OutcomeLabel, Counter>, outcome: &str) {
        family
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Counts one access decision: `None` selected, else the refusal.
    pub fn count_decision(&self, refusal: Option<RefusalReason>) {
        let (index, label) = match refusal {
            None => (0, "selected"),
            Some(r) => (1 + r as usize, r.as_str()),
        };
        if let Some(series) = self.decision_series.get(index) {
            series
                .get_or_init(|| {
                    self.decisions
                        .get_or_create(&OutcomeLabel {
                            outcome: label.to_owned(),
                        })
                        .clone()
                })
                .inc();
        } else {
            // A reason added to policy without a place here: counted the
            // slow way rather than not at all.
            Self::count(&self.decisions, label);
        }
    }

    /// The Prometheus text exposition of these metrics alone.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        out
    }

    /// Appends the text exposition of these metrics (without the closing
    /// `# EOF`) to `out`.
    pub fn encode_into(&self, out: &mut String) -> std::fmt::Result {
        prometheus_client::encoding::text::encode_registry(out, &self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decisions are counted by outcome through the cached series: the
    /// exposition shows each outcome that happened with its count, and
    /// (as when every count looked its label up) none that did not.
    #[test]
    fn decisions_are_counted_by_outcome_and_only_outcomes_that_happened_show() {
        let m = Metrics::default();
        m.count_decision(None);
        m.count_decision(None);
        m.count_decision(Some(RefusalReason::AllDown));
        m.count_decision(Some(RefusalReason::DiscoveryTimeout));
        let text = m.render();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("reach_ca_decisions_total{"))
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            text.contains("reach_ca_decisions_total{outcome=\"selected\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("reach_ca_decisions_total{outcome=\"all_down\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("reach_ca_decisions_total{outcome=\"discovery_timeout\"} 1"),
            "{text}"
        );
    }
}
