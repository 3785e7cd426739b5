//! The `/metrics` exposition (prometheus-client text): the counters the CA
//! updates as things happen (`state::counters`) and gauges of its state
//! (applications by status, connectors connected, over budget, certificate
//! expiry, whether the store answers) computed at scrape time from the same read models the dashboard
//! uses ([`StateMetrics`]), so no code path that changes the state has to
//! remember to update a gauge. `deploy/grafana` and `deploy/prometheus` use
//! these names; the `observability` test checks that every name they use is
//! exported.

use std::sync::atomic::AtomicU64;

use policy::Status;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::api;
use crate::api::listing::Row;
use crate::api::views::{ConnectorView, RowFilter, StatusView};
use crate::state::authority::Authority;

/// The exposition `/metrics` serves: the CA's counters plus the state
/// gauges of `authority` as it is now.
pub fn scrape(authority: &Authority) -> String {
    let state = StateMetrics::observe(authority);
    let mut out = String::new();
    let encoded = authority
        .metrics()
        .encode_into(&mut out)
        .and_then(|()| {
            prometheus_client::encoding::text::encode_registry(&mut out, &state.registry)
        })
        .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut out));
    if let Err(e) = encoded {
        tracing::warn!(error = %e, "cannot encode metrics");
    }
    out
}

/// Whether a client sending this `Accept` header gets the classic text
/// format: it names `text/plain` and not OpenMetrics (Prometheus names
/// both and gets OpenMetrics; `*/*` gets OpenMetrics).
pub fn wants_classic_text(accept: &str) -> bool {
    let accept = accept.to_ascii_lowercase();
    accept.contains("text/plain") && !accept.contains("application/openmetrics-text")
}

/// The classic Prometheus text format (0.0.4) of an OpenMetrics
/// exposition: a counter's `# HELP` and `# TYPE` name its samples
/// (`x_total`, where OpenMetrics names the family `x`), there is no
/// `# UNIT` and no `# EOF`. Without this a classic reader (`promtool check
/// metrics`) finds no help text for any counter.
pub fn classic_text(openmetrics: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if let Some((name, "counter")) =
            line.strip_prefix("# TYPE ").and_then(|r| r.split_once(' '))
        {
            counters.insert(name);
        }
    }
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta.and_then(|(p, rest)| Some((p, rest.split_once(' ')?))) {
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

/// Label of `reach_ca_applications`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    /// `up`, `unhealthy`, `down` or `unknown`.
    pub status: String,
}

/// Labels of `reach_ca_segment_applications`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SegmentStatusLabels {
    /// Segment name.
    pub segment: String,
    /// `up`, `unhealthy`, `down` or `unknown`.
    pub status: String,
}

/// Labels of a per-application series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApplicationLabels {
    /// Segment name.
    pub segment: String,
    /// FQDN or IP address.
    pub host: String,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// Port.
    pub port: u16,
}

/// Labels of a per-connector series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectorLabels {
    /// Connector name.
    pub connector: String,
    /// Its connector group.
    pub group: String,
}

/// Label of `reach_ca_certificate_expiry_timestamp_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertificateLabel {
    /// `server` (the CA's TLS certificate) or `root` (the issuing CA that
    /// connectors trust).
    pub certificate: String,
}

/// Gauges of the CA's state, built afresh for one scrape (a registry of its
/// own, so a connector or application that went away leaves no stale
/// series behind).
#[derive(Debug)]
pub struct StateMetrics {
    registry: Registry,
}

impl StateMetrics {
    /// Reads `authority`'s applications, connectors and certificates.
    pub fn observe(authority: &Authority) -> Self {
        let mut certificates = Vec::new();
        if let Some(pki) = authority.pki() {
            for (name, pem) in [("server", &pki.server_cert_pem), ("root", &pki.issuer_pem)] {
                match not_after_unix_seconds(pem) {
                    Some(t) => certificates.push((name, t)),
                    None => tracing::warn!(certificate = name, "cannot read its expiry"),
                }
            }
        }
        // Rows with a note (on-access applications nobody accessed,
        // `none` ones) were never checked: an alert on Unknown must not
        // fire for them. The listing's rows (status without per-connector
        // views) are all a scrape needs: building every application's view
        // cost each scrape tens of milliseconds at 10,000 applications.
        let mut applications = api::views::rows(authority, &RowFilter::default());
        applications.retain(|a| !a.noted);
        Self::from_views(
            &applications,
            &api::views::connectors(authority),
            &certificates,
            authority.snapshot().settings().check_budget,
        )
        .with_store(authority.store().status().up)
        .with_store_calls(&authority.store().calls())
        .with_log_receivers(&authority.log_stream().states())
        .with_app_certificates(
            &app_certificates(authority),
            crate::ground::clock::now_ms() / 1000,
            authority.snapshot().settings().certificate_warn,
        )
    }

    /// Adds the checked applications' TLS certificates: each one's expiry
    /// per (application, connector, address) for drill-down, and per
    /// segment how many expire (or have expired) within `warn` of
    /// `now_s` (what the alert watches; every segment with a certificate
    /// gets a series, zero included).
    fn with_app_certificates(
        mut self,
        certificates: &[AppCertificate],
        now_s: i64,
        warn: std::time::Duration,
    ) -> Self {
        let expiry = Family::<AppCertificateLabels, Gauge>::default();
        let expiring = Family::<SegmentLabel, Gauge>::default();
        let warn_s = i64::try_from(warn.as_secs()).unwrap_or(i64::MAX);
        let mut per_segment: std::collections::BTreeMap<&str, std::collections::BTreeSet<_>> =
            Default::default();
        for c in certificates {
            expiry.get_or_create(&c.labels).set(c.not_after);
            let soon = per_segment.entry(c.labels.segment.as_str()).or_default();
            if c.not_after.saturating_sub(now_s) < warn_s {
                // An address counts once, however many connectors saw it.
                soon.insert((
                    &c.labels.host,
                    &c.labels.protocol,
                    c.labels.port,
                    &c.labels.address,
                ));
            }
        }
        for (segment, soon) in per_segment {
            expiring
                .get_or_create(&SegmentLabel {
                    segment: segment.to_owned(),
                })
                .set(i64::try_from(soon.len()).unwrap_or(i64::MAX));
        }
        self.registry.register(
            "application_certificate_expiry_timestamp_seconds",
            "End of the validity (notAfter) of the TLS certificate a tls/https check found, per application, connector and address, Unix seconds",
            expiry,
        );
        self.registry.register(
            "segment_certificates_expiring",
            "Addresses of each segment whose checked TLS certificate expires within [health] certificate_warn_days (or has expired); segments with no checked certificate have no series",
            expiring,
        );
        self
    }

    /// The gauges for these read models; `certificates` are (name, expiry
    /// in Unix seconds).
    fn from_views<T>(
        applications: &[Row<T>],
        connectors: &[ConnectorView],
        certificates: &[(&str, i64)],
        check_budget: u64,
    ) -> Self {
        let mut registry = Registry::with_prefix("reach_ca");
        register_applications(&mut registry, applications);
        register_connectors(&mut registry, connectors);
        register_connector_status(&mut registry, connectors);
        let budget: Gauge = Gauge::default();
        budget.set(i64::try_from(check_budget).unwrap_or(i64::MAX));
        registry.register(
            "check_budget",
            "Checks per cycle a connector may have before it counts as over budget",
            budget,
        );

        let ca_certs = Family::<CertificateLabel, Gauge>::default();
        for (name, t) in certificates {
            ca_certs
                .get_or_create(&CertificateLabel {
                    certificate: (*name).to_owned(),
                })
                .set(*t);
        }
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "End of the validity of the CA's own certificates (server, root), Unix seconds",
            ca_certs,
        );

        StateMetrics { registry }
    }

    /// Adds `reach_ca_store_calls_total`: this replica's store calls by
    /// method since it started.
    fn with_store_calls(mut self, calls: &[(&'static str, u64)]) -> Self {
        let family = Family::<CallLabel, prometheus_client::metrics::counter::Counter>::default();
        for (call, n) in calls {
            family
                .get_or_create(&CallLabel {
                    call: (*call).to_owned(),
                })
                .inc_by(*n);
        }
        self.registry.register(
            "store_calls",
            "Calls this replica made to its store (database), by call, since it started: each is one statement or one transaction",
            family,
        );
        self
    }

    /// Adds the log receivers' series: records sent and dropped (by
    /// reason), spool bytes and whether each is connected.
    fn with_log_receivers(mut self, receivers: &[crate::logstream::ReceiverState]) -> Self {
        use prometheus_client::metrics::counter::Counter;
        let sent = Family::<ReceiverLabel, Counter>::default();
        let dropped = Family::<DroppedLabels, Counter>::default();
        let spool = Family::<ReceiverLabel, Gauge>::default();
        let connected = Family::<ReceiverLabel, Gauge>::default();
        for r in receivers {
            let label = ReceiverLabel {
                receiver: r.name.clone(),
            };
            sent.get_or_create(&label).inc_by(r.sent_total);
            for (reason, n) in [
                ("queue_full", r.dropped_queue),
                ("spool_full", r.dropped_spool),
            ] {
                dropped
                    .get_or_create(&DroppedLabels {
                        receiver: r.name.clone(),
                        reason: reason.to_owned(),
                    })
                    .inc_by(n);
            }
            spool
                .get_or_create(&label)
                .set(signed_gauge(r.spool_bytes).unwrap_or(i64::MAX));
            connected.get_or_create(&label).set(i64::from(r.connected));
        }
        self.registry.register(
            "log_records_sent",
            "Records this replica wrote to each log receiver since it started (a record sent again after a broken connection counts again)",
            sent,
        );
        self.registry.register(
            "log_records_dropped",
            "Records this replica dropped for a log receiver since it started: queue_full (its queue of 16384 records was full) or spool_full (its spool on disk was full or could not be written)",
            dropped,
        );
        self.registry.register(
            "log_spool_bytes",
            "Bytes of each log receiver's spool on disk",
            spool,
        );
        self.registry.register(
            "log_receiver_connected",
            "Whether each log receiver's connection (a file receiver: its file) is open",
            connected,
        );
        self
    }

    /// Adds `reach_ca_store_up`: whether the store answered this replica's
    /// last call.
    fn with_store(mut self, up: bool) -> Self {
        let gauge: Gauge = Gauge::default();
        gauge.set(i64::from(up));
        self.registry.register(
            "store_up",
            "Whether this replica's store (database) answered its last call (1) or could not be reached (0); access decisions go on without it, enrollment, renewal, new connector sessions and admin changes do not",
            gauge,
        );
        self
    }
}

/// One certificate a tls/https check reported.
#[derive(Debug)]
struct AppCertificate {
    labels: AppCertificateLabels,
    not_after: i64,
}

/// Labels of `reach_ca_application_certificate_expiry_timestamp_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AppCertificateLabels {
    segment: String,
    host: String,
    protocol: String,
    port: u16,
    connector: String,
    address: String,
}

/// Label of the log receivers' series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReceiverLabel {
    receiver: String,
}

/// Labels of `reach_ca_log_records_dropped_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DroppedLabels {
    receiver: String,
    reason: String,
}

/// Label of `reach_ca_store_calls_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabel {
    call: String,
}

/// Label of `reach_ca_segment_certificates_expiring`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SegmentLabel {
    segment: String,
}

/// The certificates of the visible applications' latest reports.
fn app_certificates(authority: &Authority) -> Vec<AppCertificate> {
    let snapshot = authority.snapshot();
    authority
        .health()
        .certificates()
        .into_iter()
        .filter(|(key, ..)| {
            snapshot
                .segment(&key.segment)
                .is_some_and(|s| !s.client_hostname_validation)
        })
        .map(|(key, connector, address, not_after)| AppCertificate {
            labels: AppCertificateLabels {
                segment: key.segment,
                host: key.host.into_string(),
                protocol: key.protocol.as_str().to_owned(),
                port: key.port,
                connector: connector.to_string(),
                address: address.to_string(),
            },
            not_after,
        })
        .collect()
}

/// The gauges of the applications: how many by status, and which are down.
fn register_applications<T>(registry: &mut Registry, applications: &[Row<T>]) {
    let by_status = Family::<StatusLabel, Gauge>::default();
    // Every status gets a series, zero included, so a panel or an alert
    // on "down > 0" sees 0 rather than no data.
    for status in [Status::Up, Status::Unhealthy, Status::Down, Status::Unknown] {
        let n = applications.iter().filter(|a| a.status == status).count();
        by_status
            .get_or_create(&StatusLabel {
                status: status.as_str().to_owned(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    registry.register(
        "applications",
        "Visible applications by overall status (the best over their connectors)",
        by_status,
    );

    // Counts per segment, so alerts page once per segment (with how many
    // and what share are down), not once per application. Every status of
    // a segment with applications gets a series, zero included, so the
    // share down has a denominator.
    let by_segment = Family::<SegmentStatusLabels, Gauge>::default();
    let mut counts: std::collections::BTreeMap<(&str, &str), i64> = Default::default();
    for a in applications {
        for status in [Status::Up, Status::Unhealthy, Status::Down, Status::Unknown] {
            let n = counts
                .entry((a.segment.as_str(), status.as_str()))
                .or_default();
            *n += i64::from(a.status == status);
        }
    }
    for ((segment, status), n) in counts {
        by_segment
            .get_or_create(&SegmentStatusLabels {
                segment: segment.to_owned(),
                status: status.to_owned(),
            })
            .set(n);
    }
    registry.register(
        "segment_applications",
        "Visible applications of each segment by overall status (segments with no checked application have no series)",
        by_segment,
    );

    // Only Down applications get a series: at 10,000 applications a
    // series each would make every scrape megabytes for a value that is
    // nearly always "not down".
    let down = Family::<ApplicationLabels, Gauge>::default();
    for a in applications.iter().filter(|a| a.status == Status::Down) {
        down.get_or_create(&ApplicationLabels {
            segment: a.segment.clone(),
            host: a.host.clone(),
            protocol: a.protocol.as_str().to_owned(),
            port: a.port,
        })
        .set(1);
    }
    registry.register(
        "application_down",
        "1 for each application whose overall status is Down (no connector reaches it); other applications have no series",
        down,
    );
}

/// The per-connector gauges.
fn register_connectors(registry: &mut Registry, connectors: &[ConnectorView]) {
    let connected = Family::<ConnectorLabels, Gauge>::default();
    let over_budget = Family::<ConnectorLabels, Gauge>::default();
    let checks_per_cycle = Family::<ConnectorLabels, Gauge>::default();
    let checks_per_second = Family::<ConnectorLabels, Gauge<f64, AtomicU64>>::default();
    let last_seen = Family::<ConnectorLabels, Gauge>::default();
    let cert_expiry = Family::<ConnectorLabels, Gauge>::default();
    let drained_since = Family::<ConnectorLabels, Gauge>::default();
    // A disabled connector is disconnected on purpose: it gets no
    // series, so "disconnected" means a connector that should be there.
    for c in connectors.iter().filter(|c| !c.disabled) {
        let labels = ConnectorLabels {
            connector: c.name.clone(),
            group: c.group.clone(),
        };
        connected.get_or_create(&labels).set(i64::from(c.connected));
        over_budget
            .get_or_create(&labels)
            .set(i64::from(c.over_budget));
        checks_per_cycle
            .get_or_create(&labels)
            .set(i64::try_from(c.checks_per_cycle).unwrap_or(i64::MAX));
        // The load a disconnected connector reported last is history,
        // not its rate now.
        if let Some(load) = c.load.as_ref().filter(|_| c.connected) {
            checks_per_second
                .get_or_create(&labels)
                .set(load.checks_per_second);
        }
        if let Some(t) = c.last_seen {
            last_seen
                .get_or_create(&labels)
                .set(i64::try_from(t / 1000).unwrap_or(i64::MAX));
        }
        if let Some(t) = c.certificate_not_after {
            cert_expiry.get_or_create(&labels).set(t.div_euclid(1000));
        }
        if let Some(d) = &c.drained {
            drained_since
                .get_or_create(&labels)
                .set(d.since.div_euclid(1000));
        }
    }
    registry.register(
        "connector_drained_since_timestamp_seconds",
        "When the connector's drain began, Unix seconds (an administrator's drain, or its own while it shuts down); connectors that are not drained have no series",
        drained_since,
    );
    registry.register(
        "connector_connected",
        "1 when the connector has a live session with the CA, 0 when it is known but disconnected (disabled connectors have no series)",
        connected,
    );
    registry.register(
        "connector_over_budget",
        "1 when the connector's checks per cycle exceed the check budget",
        over_budget,
    );
    registry.register(
        "connector_checks_per_cycle",
        "The CA's estimate of the connector's checks per full cycle",
        checks_per_cycle,
    );
    registry.register(
        "connector_checks_per_second",
        "Checks per second a connected connector last reported starting",
        checks_per_second,
    );
    registry.register(
        "connector_last_seen_timestamp_seconds",
        "When the CA last heard from the connector, Unix seconds",
        last_seen,
    );
    registry.register(
        "connector_certificate_expiry_timestamp_seconds",
        "End of the validity of the connector's current certificate, Unix seconds",
        cert_expiry,
    );
}

/// How an integer gauge reads a connector's status (`None`: no series).
type Int = fn(&StatusView) -> Option<i64>;
/// How a float gauge reads it.
type Float = fn(&StatusView) -> f64;

/// A byte count as a gauge value.
fn signed_gauge(n: u64) -> Option<i64> {
    Some(i64::try_from(n).unwrap_or(i64::MAX))
}

/// The integer gauges of a connector's status: name, help, value.
const STATUS_INTS: [(&str, &str, Int); 8] = [
    (
        "connector_process_start_timestamp_seconds",
        "When the connector's process started, Unix seconds (its heartbeat)",
        |s| s.process_started_at.map(|t| t.div_euclid(1000)),
    ),
    (
        "connector_host_boot_timestamp_seconds",
        "When the connector's host booted, Unix seconds (its heartbeat)",
        |s| s.host_booted_at.map(|t| t.div_euclid(1000)),
    ),
    (
        "connector_process_memory_bytes",
        "Resident memory of the connector's process",
        |s| signed_gauge(s.process_memory_bytes),
    ),
    (
        "connector_host_memory_total_bytes",
        "Memory of the connector's host",
        |s| signed_gauge(s.host_memory_total_bytes),
    ),
    (
        "connector_host_memory_available_bytes",
        "Memory of the connector's host available without swapping",
        |s| signed_gauge(s.host_memory_available_bytes),
    ),
    (
        "connector_applications",
        "Applications the connector serves (entries of its assignment's segments)",
        |s| Some(i64::from(s.applications)),
    ),
    (
        "connector_sent_bytes",
        "Bytes the connector sent to this CA replica over its current session's connection",
        |s| signed_gauge(s.bytes_sent),
    ),
    (
        "connector_received_bytes",
        "Bytes the connector received from this CA replica over its current session's connection",
        |s| signed_gauge(s.bytes_received),
    ),
];
/// The float gauges of a connector's status: name, help, value.
const STATUS_FLOATS: [(&str, &str, Float); 2] = [
    (
        "connector_process_cpu_percent",
        "CPU the connector's process used over its last heartbeat interval, percent of one core",
        |s| s.process_cpu_percent,
    ),
    (
        "connector_host_cpu_percent",
        "Busy share of the connector's host's CPUs over its last heartbeat interval, percent of all cores",
        |s| s.host_cpu_percent,
    ),
];

/// Labels of `reach_ca_connector_info`: a connector's software and
/// platform as its heartbeats report them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectorInfoLabels {
    /// Connector name.
    pub connector: String,
    /// Its connector group.
    pub group: String,
    /// Its software version.
    pub version: String,
    /// Its operating system.
    pub os: String,
    /// Its CPU architecture.
    pub arch: String,
}

/// The gauges of each connected connector's own status (its latest
/// heartbeat's `ConnectorStatus`), `{connector,group}` like the other
/// per-connector gauges: one series per connector and gauge, so as many
/// series as connectors. The version and platform are labels of one
/// `reach_ca_connector_info` series per connector (its value 1), never of
/// the figures, and the DNS servers and route interface are not exported
/// (free text: the API shows them). A disconnected connector's status is
/// history and has no series; nor has a connector that sends none.
fn register_connector_status(registry: &mut Registry, connectors: &[ConnectorView]) {
    let info = Family::<ConnectorInfoLabels, Gauge>::default();
    let int_families: Vec<Family<ConnectorLabels, Gauge>> =
        STATUS_INTS.iter().map(|_| Family::default()).collect();
    let float_families: Vec<Family<ConnectorLabels, Gauge<f64, AtomicU64>>> =
        STATUS_FLOATS.iter().map(|_| Family::default()).collect();
    for c in connectors.iter().filter(|c| c.connected && !c.disabled) {
        let Some(s) = &c.status else { continue };
        let labels = ConnectorLabels {
            connector: c.name.clone(),
            group: c.group.clone(),
        };
        info.get_or_create(&ConnectorInfoLabels {
            connector: c.name.clone(),
            group: c.group.clone(),
            version: s.version.clone(),
            os: s.os.clone(),
            arch: s.arch.clone(),
        })
        .set(1);
        for ((_, _, read), family) in STATUS_INTS.iter().zip(&int_families) {
            if let Some(v) = read(s) {
                family.get_or_create(&labels).set(v);
            }
        }
        for ((_, _, read), family) in STATUS_FLOATS.iter().zip(&float_families) {
            family.get_or_create(&labels).set(read(s));
        }
    }
    for ((name, help, _), family) in STATUS_INTS.iter().zip(int_families) {
        registry.register(*name, *help, family);
    }
    for ((name, help, _), family) in STATUS_FLOATS.iter().zip(float_families) {
        registry.register(*name, *help, family);
    }
    registry.register(
        "connector_info",
        "1 per connected connector, its software version and platform as labels (from its heartbeat)",
        info,
    );
}

/// The end of the validity of the first certificate in `pem`, Unix seconds.
fn not_after_unix_seconds(pem: &str) -> Option<i64> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    Some(cert.validity().not_after.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::views::LoadView;

    fn connector(name: &str, connected: bool, disabled: bool) -> ConnectorView {
        ConnectorView {
            name: name.to_owned(),
            group: "g".to_owned(),
            connected,
            session_id: None,
            version: String::new(),
            checks_per_cycle: 7,
            cycle_seconds: 0.5,
            over_budget: true,
            check_budget: 5,
            load: Some(LoadView {
                targets: 7,
                checks_per_cycle: 7,
                cycle_seconds: 0.5,
                queue_depth: 0,
                checks_per_second: 14.0,
                in_flight: 0,
                rate_limit: 20,
            }),
            replicas: None,
            status: None,
            connected_since: None,
            last_seen: Some(1_700_000_000_500),
            enrolled: true,
            enrolled_at: Some(1_700_000_000_000),
            disabled,
            drained: None,
            certificate_serial: None,
            certificate_not_after: Some(1_800_000_000_999),
            certificates: Vec::new(),
        }
    }

    fn render(m: &StateMetrics) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &m.registry).expect("encodes");
        out
    }

    #[test]
    fn the_classic_text_names_counters_by_their_samples() {
        let om = "# HELP a_seconds Latency.\n# TYPE a_seconds histogram\n# UNIT a_seconds seconds\n\
                  a_seconds_count 1\n# HELP b Things done.\n# TYPE b counter\nb_total{x=\"1\"} 2\n# EOF\n";
        assert_eq!(
            classic_text(om),
            "# HELP a_seconds Latency.\n# TYPE a_seconds histogram\na_seconds_count 1\n\
             # HELP b_total Things done.\n# TYPE b_total counter\nb_total{x=\"1\"} 2\n"
        );
        assert!(wants_classic_text("text/plain;version=0.0.4"));
        assert!(!wants_classic_text("*/*"));
        assert!(!wants_classic_text(
            "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3"
        ));
    }

    #[test]
    fn checked_certificates_are_exported_and_counted_per_segment_within_the_warning() {
        const DAY: i64 = 86_400;
        let now = 1_800_000_000;
        let cert =
            |segment: &str, host: &str, connector: &str, address: &str, days: i64| AppCertificate {
                labels: AppCertificateLabels {
                    segment: segment.into(),
                    host: host.into(),
                    protocol: "tcp".into(),
                    port: 443,
                    connector: connector.into(),
                    address: address.into(),
                },
                not_after: now + days * DAY,
            };
        let certs = [
            // One address seen by two connectors counts once.
            cert("web", "a.test", "c1", "10.0.0.1", 3),
            cert("web", "a.test", "c2", "10.0.0.1", 3),
            cert("web", "a.test", "c1", "10.0.0.2", -1),
            cert("web", "b.test", "c1", "10.0.0.3", 14),
            cert("web", "b.test", "c1", "10.0.0.4", 90),
            cert("far", "c.test", "c1", "10.0.0.5", 200),
        ];
        let m = StateMetrics::from_views::<()>(&[], &[], &[], 5).with_app_certificates(
            &certs,
            now,
            std::time::Duration::from_secs(14 * 86_400),
        );
        let text = render(&m);
        for line in [
            r#"reach_ca_application_certificate_expiry_timestamp_seconds{segment="web",host="a.test",protocol="tcp",port="443",connector="c2",address="10.0.0.1"} 1800259200"#,
            r#"reach_ca_segment_certificates_expiring{segment="web"} 2"#,
            r#"reach_ca_segment_certificates_expiring{segment="far"} 0"#,
        ] {
            assert!(text.contains(line), "no `{line}` in\n{text}");
        }
    }

    #[test]
    fn store_calls_are_counted_per_call() {
        let text = render(
            &StateMetrics::from_views::<()>(&[], &[], &[], 5)
                .with_store_calls(&[("is_disabled", 3), ("key_usage", 7)]),
        );
        for line in [
            "# TYPE reach_ca_store_calls counter",
            "reach_ca_store_calls_total{call=\"is_disabled\"} 3",
            "reach_ca_store_calls_total{call=\"key_usage\"} 7",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }

    #[test]
    fn connectors_are_exported_unless_disabled_and_load_only_while_connected() {
        let text = render(&StateMetrics::from_views::<()>(
            &[],
            &[
                connector("on", true, false),
                connector("off", false, false),
                connector("retired", false, true),
                ConnectorView {
                    drained: Some(crate::access::drain::DrainView {
                        since: 1_750_000_000_999,
                        by: crate::access::drain::DrainedBy {
                            kind: "token".into(),
                            name: "ops".into(),
                        },
                        until: None,
                    }),
                    ..connector("maintained", true, false)
                },
            ],
            &[("root", 1_900_000_000)],
            5,
        ));
        for line in [
            r#"reach_ca_connector_connected{connector="on",group="g"} 1"#,
            r#"reach_ca_connector_connected{connector="off",group="g"} 0"#,
            r#"reach_ca_connector_over_budget{connector="on",group="g"} 1"#,
            r#"reach_ca_connector_checks_per_cycle{connector="off",group="g"} 7"#,
            r#"reach_ca_connector_checks_per_second{connector="on",group="g"} 14.0"#,
            r#"reach_ca_connector_last_seen_timestamp_seconds{connector="on",group="g"} 1700000000"#,
            r#"reach_ca_connector_certificate_expiry_timestamp_seconds{connector="off",group="g"} 1800000000"#,
            r#"reach_ca_certificate_expiry_timestamp_seconds{certificate="root"} 1900000000"#,
            r#"reach_ca_connector_drained_since_timestamp_seconds{connector="maintained",group="g"} 1750000000"#,
            "reach_ca_check_budget 5",
            // No application at all: every status is still a series.
            r#"reach_ca_applications{status="down"} 0"#,
        ] {
            assert!(text.contains(line), "no `{line}` in\n{text}");
        }
        assert!(!text.contains("retired"), "{text}");
        assert!(
            !text.contains(r#"reach_ca_connector_drained_since_timestamp_seconds{connector="on""#),
            "only drained connectors have a drain series: {text}"
        );
        assert!(
            !text.contains(r#"reach_ca_connector_checks_per_second{connector="off""#),
            "{text}"
        );
    }
}
