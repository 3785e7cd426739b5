//! Prometheus metrics (prometheus-client) and the `/metrics` HTTP endpoint.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use policy::{AddressResult, FailureKind, Method};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

/// Labels of `reach_agent_checks`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CheckLabels {
    /// tcp, icmp or tcp_fallback.
    pub method: String,
    /// up, or the failure kind (timeout, refused, unreachable, other).
    pub result: String,
}

/// Labels of `reach_agent_session_state`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// connecting, connected or backoff.
    pub state: String,
}

/// Labels of `reach_agent_dns_lookups`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DnsLabels {
    /// ok, stale (a transient DNS failure: the last known addresses were
    /// used, within `--dns-stale-grace-s`) or error.
    pub result: String,
}

/// Every metric the connector exports. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Checks finished, by method and result.
    pub checks: Family<CheckLabels, Counter>,
    /// Duration of checks (probe time, including timeouts).
    pub check_duration: Histogram,
    /// Time checks waited for the rate limiter and a concurrency slot.
    pub limiter_wait: Histogram,
    /// Checks in flight.
    pub in_flight: Gauge,
    /// Checks waiting to start.
    pub queue_depth: Gauge,
    /// Distinct (address, protocol, port) targets scheduled.
    pub targets: Gauge,
    /// Session state (1 for the current state): `connected` while at
    /// least one CA replica's session is.
    pub session_state: Family<StateLabels, Gauge>,
    /// CA replica addresses the connector attaches to (one session each).
    pub ca_addresses: Gauge,
    /// CA sessions welcomed and live.
    pub ca_sessions: Gauge,
    /// Distinct assignments among the live sessions (more than 1: the
    /// replicas disagree).
    pub ca_assignments: Gauge,
    /// 1 while the live sessions' assignments differ.
    pub policy_disagreement: Gauge,
    /// Sessions established with the CA.
    pub sessions: Counter,
    /// Reports the CA deferred with `FlowControl` (their results were sent
    /// again).
    pub reports_deferred: Counter,
    /// DNS lookups by result.
    pub dns_lookups: Family<DnsLabels, Counter>,
    /// `checks`' counters by (method, result), each taken from the family
    /// on its first use: counting a check is then one atomic add, not two
    /// label strings built and hashed into the family's map per check.
    check_counters: Arc<[OnceLock<Counter>; CHECK_SLOTS]>,
}

/// Results a check can have: up, or one of the failure kinds.
const CHECK_RESULTS: usize = 7;

/// (method, result) pairs of `reach_agent_checks`.
const CHECK_SLOTS: usize = 3 * CHECK_RESULTS;

/// The slot of a check's (method, result) in `Metrics::check_counters`.
fn check_slot(method: Method, failure: Option<FailureKind>) -> usize {
    let method = match method {
        Method::Tcp => 0,
        Method::Icmp => 1,
        Method::TcpFallback => 2,
    };
    let result = match failure {
        None => 0,
        Some(FailureKind::Timeout) => 1,
        Some(FailureKind::Refused) => 2,
        Some(FailureKind::Unreachable) => 3,
        Some(FailureKind::Dns) => 4,
        Some(FailureKind::Other) => 5,
        Some(FailureKind::NotAllowed) => 6,
    };
    method * CHECK_RESULTS + result
}

/// A registry being filled.
struct Registering(Registry);

impl Registering {
    /// `metric`, registered as `name` with `help` (the registry keeps a
    /// clone: both share the value).
    fn add<M: Metric + Clone>(&mut self, name: &str, help: &str, metric: M) -> M {
        self.0.register(name, help, metric.clone());
        metric
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `reach_agent` prefix.
    pub fn new() -> Self {
        let mut r = Registering(Registry::with_prefix("reach_agent"));
        Metrics {
            checks: r.add(
                "checks",
                "Checks finished, by method and result",
                Family::default(),
            ),
            check_duration: r.add(
                "check_duration_seconds",
                "Duration of checks, timeouts included",
                Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            ),
            limiter_wait: r.add(
                "rate_limiter_wait_seconds",
                "Time a check waited for the rate limiter and a concurrency slot",
                Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            ),
            in_flight: r.add(
                "checks_in_flight",
                "Checks in flight",
                Gauge::default(),
            ),
            queue_depth: r.add(
                "check_queue_depth",
                "Checks waiting for the rate limiter",
                Gauge::default(),
            ),
            targets: r.add(
                "targets",
                "Distinct (address, protocol, port) targets scheduled",
                Gauge::default(),
            ),
            session_state: r.add(
                "session_state",
                "Session with the CA: 1 for the current state (connecting, connected, backoff)",
                Family::default(),
            ),
            ca_addresses: r.add(
                "ca_addresses",
                "CA replica addresses attached to (one session each)",
                Gauge::default(),
            ),
            ca_sessions: r.add(
                "ca_sessions",
                "CA sessions welcomed and live",
                Gauge::default(),
            ),
            ca_assignments: r.add(
                "ca_assignments",
                "Distinct assignments among the live CA sessions (more than 1: the replicas disagree)",
                Gauge::default(),
            ),
            policy_disagreement: r.add(
                "policy_disagreement",
                "1 while the CA replicas hand out different assignments (the longest-connected session's is followed)",
                Gauge::default(),
            ),
            sessions: r.add(
                "sessions",
                "Sessions established with the CA",
                Counter::default(),
            ),
            reports_deferred: r.add(
                "reports_deferred",
                "Reports the CA deferred with flow control (their results are sent again)",
                Counter::default(),
            ),
            dns_lookups: r.add(
                "dns_lookups",
                "DNS resolutions by result",
                Family::default(),
            ),
            check_counters: Arc::new(std::array::from_fn(|_| OnceLock::new())),
            registry: Arc::new(r.0),
        }
    }

    /// Counts a finished check.
    pub fn observe_check(&self, result: &AddressResult) {
        let failure = result.failure.as_ref().map(|f| f.kind);
        self.check_counters[check_slot(result.method, failure)]
            .get_or_init(|| {
                // A family's counters share their value with their clones.
                self.checks
                    .get_or_create(&CheckLabels {
                        method: result.method.as_str().to_owned(),
                        result: failure.map_or("up", FailureKind::as_str).to_owned(),
                    })
                    .clone()
            })
            .inc();
    }

    /// Sets the current session state.
    pub fn set_session_state(&self, state: &str) {
        for s in ["connecting", "connected", "backoff"] {
            self.session_state
                .get_or_create(&StateLabels {
                    state: s.to_owned(),
                })
                .set(i64::from(s == state));
        }
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// OpenMetrics, or the classic Prometheus text format (0.0.4) to a client
/// whose `Accept` names `text/plain` and not OpenMetrics (`promtool check
/// metrics`, older scrapers).
async fn metrics_handler(
    State(metrics): State<Metrics>,
    headers: axum::http::HeaderMap,
) -> impl IntoResponse {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let classic = accept.contains("text/plain") && !accept.contains("application/openmetrics-text");
    match metrics.encode() {
        Ok(body) if classic => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            classic_text(&body),
        )
            .into_response(),
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// The classic text format of an OpenMetrics exposition: a counter's
/// `# HELP`/`# TYPE` name its samples (`x_total`), no `# UNIT`, no `# EOF`
/// (the CA's `/metrics` does the same).
fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| Some((p, line.strip_prefix(p)?.split_once(' ')?)));
        match meta {
            Some((p, (name, rest))) if counters.contains(name) => {
                out.push_str(&format!("{p}{name}_total {rest}\n"));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// Serves `/metrics` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(metrics);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Binds the metrics listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    use policy::Failure;

    use super::*;

    fn result(method: Method, failure: Option<FailureKind>) -> AddressResult {
        AddressResult {
            check: None,
            address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            reachable: failure.is_none(),
            method,
            rtt: Duration::ZERO,
            failure: failure.map(|kind| Failure {
                kind,
                detail: String::new(),
            }),
        }
    }

    /// Every (method, result) pair counts into its own labelled series,
    /// through the cached counters as through the family.
    #[test]
    fn each_method_and_result_is_counted_under_its_own_labels() {
        let metrics = Metrics::new();
        let methods = [Method::Tcp, Method::Icmp, Method::TcpFallback];
        let results = [
            None,
            Some(FailureKind::Timeout),
            Some(FailureKind::Refused),
            Some(FailureKind::Unreachable),
            Some(FailureKind::Dns),
            Some(FailureKind::Other),
            Some(FailureKind::NotAllowed),
        ];
        let mut times = 1;
        for method in methods {
            for failure in results {
                for _ in 0..times {
                    metrics.observe_check(&result(method, failure));
                }
                times += 1;
            }
        }
        let mut times = 1;
        for method in methods {
            for failure in results {
                let labels = CheckLabels {
                    method: method.as_str().to_owned(),
                    result: failure.map_or("up", FailureKind::as_str).to_owned(),
                };
                assert_eq!(
                    metrics.checks.get_or_create(&labels).get(),
                    times,
                    "{labels:?}"
                );
                times += 1;
            }
        }
        let text = metrics.encode().expect("encode");
        assert!(
            text.contains(r#"reach_agent_checks_total{method="icmp",result="refused"} 10"#),
            "{text}"
        );
    }
}
