//! Prometheus metrics (prometheus-client), rendered as text on `/metrics`.

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
    /// Time to decide an access request, in seconds (includes discovery).
    pub decision_seconds: Histogram,
    /// Access events forwarded to connectors.
    pub access_events_forwarded: Counter,
    /// Configuration reloads by result.
    pub reloads: Family<OutcomeLabel, Counter>,
    /// Connector messages dropped by the per-connector rate cap.
    pub messages_rate_limited: Counter,
    /// Enrollments by outcome (`enrolled` or the refusal).
    pub enrollments: Family<OutcomeLabel, Counter>,
    /// Connector sessions refused at authentication, by reason.
    pub sessions_refused: Family<OutcomeLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("reach_ca");
        let connectors_connected = Gauge::default();
        let reports_received = Counter::default();
        let reports_rejected = Counter::default();
        let decisions = Family::<OutcomeLabel, Counter>::default();
        let decision_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 18));
        let access_events_forwarded = Counter::default();
        let reloads = Family::<OutcomeLabel, Counter>::default();
        let messages_rate_limited = Counter::default();
        let enrollments = Family::<OutcomeLabel, Counter>::default();
        let sessions_refused = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "messages_rate_limited",
            "Connector messages dropped by the per-connector rate cap",
            messages_rate_limited.clone(),
        );
        registry.register(
            "enrollments",
            "Connector enrollments by outcome (enrolled or the refusal)",
            enrollments.clone(),
        );
        registry.register(
            "sessions_refused",
            "Connector sessions refused at authentication, by reason",
            sessions_refused.clone(),
        );
        registry.register(
            "connectors_connected",
            "Connectors with a live session",
            connectors_connected.clone(),
        );
        registry.register(
            "reports_received",
            "Application health results accepted from connectors",
            reports_received.clone(),
        );
        registry.register(
            "reports_rejected",
            "Application health results rejected (malformed or not served by the connector's group)",
            reports_rejected.clone(),
        );
        registry.register(
            "decisions",
            "Access decisions by outcome (selected or the refusal reason)",
            decisions.clone(),
        );
        registry.register(
            "decision_duration_seconds",
            "Time to decide an access request, including on-access discovery",
            decision_seconds.clone(),
        );
        registry.register(
            "access_events_forwarded",
            "Access events forwarded to connectors (after coalescing)",
            access_events_forwarded.clone(),
        );
        registry.register(
            "config_reloads",
            "Configuration reloads by outcome (applied or rejected)",
            reloads.clone(),
        );
        Metrics {
            registry,
            connectors_connected,
            reports_received,
            reports_rejected,
            decisions,
            decision_seconds,
            access_events_forwarded,
            reloads,
            messages_rate_limited,
            enrollments,
            sessions_refused,
        }
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

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        out
    }
}
