//! The monitoring kit in `deploy/` against the real exports: the CA's state
//! gauges follow its state, and every metric the Grafana dashboard
//! (`deploy/grafana/reach.json`) and the alert rules
//! (`deploy/prometheus/reach-alerts.yml`) use is one that a running CA or a
//! connector's `/metrics` actually exports, so a renamed metric breaks CI
//! instead of a production dashboard.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Compiled in, so editing the file rebuilds and reruns this test.
const DASHBOARD: &str = include_str!("../../../deploy/grafana/reach.json");
const ALERTS: &str = include_str!("../../../deploy/prometheus/reach-alerts.yml");

/// Series Prometheus itself makes, not the targets.
const SYNTHETIC: &[&str] = &["up"];

#[tokio::test]
async fn state_gauges_follow_the_cas_state() {
    let ca = Ca::start(&default_config()).await;
    let http = ca.web();
    let (east, _) = connect(&ca, "east-1", "dc-east").await;
    east.report(
        vec![
            app("jira", "jira.test.reach", 80, &[], &["127.0.0.21"]),
            app("jira", "127.0.0.21", 80, &["127.0.0.21"], &[]),
        ],
        true,
    )
    .await;
    let down = r#"reach_ca_application_down{segment="jira",host="jira.test.reach",protocol="tcp",port="80"} 1"#;
    let text = scrape_until(&http, "the down application is exported", |m| {
        m.contains(down)
    })
    .await;
    for line in [
        r#"reach_ca_applications{status="up"} 1"#,
        r#"reach_ca_applications{status="down"} 1"#,
        r#"reach_ca_applications{status="unhealthy"} 0"#,
        r#"reach_ca_applications{status="unknown"} 0"#,
        r#"reach_ca_segment_applications{segment="jira",status="down"} 1"#,
        r#"reach_ca_segment_applications{segment="jira",status="up"} 1"#,
        r#"reach_ca_segment_applications{segment="jira",status="unknown"} 0"#,
        r#"reach_ca_connector_connected{connector="east-1",group="dc-east"} 1"#,
        r#"reach_ca_connector_over_budget{connector="east-1",group="dc-east"} 0"#,
        "reach_ca_check_budget ",
        // Counters and histograms still come along.
        "reach_ca_reports_received_total 2",
    ] {
        assert!(text.contains(line), "no `{line}` in\n{text}");
    }
    assert!(
        !text.contains(r#"host="127.0.0.21""#),
        "only Down applications get a series:\n{text}"
    );
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64();
    for series in [
        r#"reach_ca_connector_certificate_expiry_timestamp_seconds{connector="east-1",group="dc-east"}"#,
        r#"reach_ca_certificate_expiry_timestamp_seconds{certificate="server"}"#,
        r#"reach_ca_certificate_expiry_timestamp_seconds{certificate="root"}"#,
    ] {
        let t = value(&text, series).unwrap_or_else(|| panic!("no {series} in\n{text}"));
        assert!(
            t > now + 86_400.0,
            "{series} = {t}: a fresh certificate is valid for more than a day"
        );
    }

    // The connector goes away: it is still listed, now disconnected.
    drop(east);
    scrape_until(&http, "the connector shows disconnected", |m| {
        m.contains(r#"reach_ca_connector_connected{connector="east-1",group="dc-east"} 0"#)
    })
    .await;
    ca.stop().await;
}

/// What a tls/https check reports (a reason, a certificate's expiry) is
/// kept by the CA: the application view shows both with a warning near
/// expiry (the status stays what was reported), and the metrics export the
/// expiry per address and the count expiring per segment.
#[tokio::test]
async fn checked_certificates_reach_the_application_view_and_the_metrics() {
    let ca = Ca::start(&default_config()).await;
    let http = ca.web();
    let (east, _) = connect(&ca, "east-1", "dc-east").await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64;
    let (expired, soon, later) = (now - 86_400, now + 3 * 86_400 + 600, now + 90 * 86_400);
    let mut report = app(
        "jira",
        "jira.test.reach",
        80,
        &["127.0.0.22", "127.0.0.23"],
        &["127.0.0.21"],
    );
    for a in &mut report.addresses {
        match a.address.as_str() {
            "127.0.0.21" => {
                a.failure = protocol::v1::FailureKind::Other as i32;
                a.detail = "tls: certificate expired".into();
                a.reason = Some("tls: certificate expired".into());
                a.certificate_not_after_unix_s = Some(expired);
            }
            "127.0.0.22" => a.certificate_not_after_unix_s = Some(soon),
            _ => a.certificate_not_after_unix_s = Some(later),
        }
    }
    east.report(vec![report], true).await;
    let text = scrape_until(&http, "the certificates are exported", |m| {
        m.contains("reach_ca_segment_certificates_expiring{")
    })
    .await;
    for line in [
        format!(
            r#"reach_ca_application_certificate_expiry_timestamp_seconds{{segment="jira",host="jira.test.reach",protocol="tcp",port="80",connector="east-1",address="127.0.0.21"}} {expired}"#
        ),
        format!(
            r#"reach_ca_application_certificate_expiry_timestamp_seconds{{segment="jira",host="jira.test.reach",protocol="tcp",port="80",connector="east-1",address="127.0.0.23"}} {later}"#
        ),
        // Default [health] certificate_warn_days = 14: the expired one and
        // the one expiring in 3 days.
        r#"reach_ca_segment_certificates_expiring{segment="jira"} 2"#.to_owned(),
    ] {
        assert!(text.contains(&line), "no `{line}` in\n{text}");
    }

    let path = "/api/v1/application?segment=jira&host=jira.test.reach&protocol=tcp&port=80";
    let (status, v) = http.get_json(path, Some(READ_TOKEN)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["application"]["status"], "unhealthy", "{v}");
    let addresses = &v["application"]["connectors"][0]["addresses"];
    let by = |ip: &str| {
        addresses
            .as_array()
            .and_then(|a| a.iter().find(|x| x["address"] == ip))
            .cloned()
            .unwrap_or_else(|| panic!("no {ip} in {addresses}"))
    };
    let down = by("127.0.0.21");
    assert_eq!(down["reason"], "tls: certificate expired");
    assert_eq!(down["certificate_not_after"], expired);
    assert_eq!(down["certificate_warning"], "certificate expired");
    let soon_view = by("127.0.0.22");
    assert_eq!(soon_view["status"], "up");
    assert!(soon_view["reason"].is_null(), "{soon_view}");
    assert_eq!(
        soon_view["certificate_warning"],
        "certificate expires in 3 days"
    );
    let later_view = by("127.0.0.23");
    assert_eq!(later_view["certificate_not_after"], later);
    assert!(later_view["certificate_warning"].is_null(), "{later_view}");
    ca.stop().await;
}

#[tokio::test]
async fn every_metric_the_dashboard_and_alerts_use_is_exported() {
    let (ca_text, _) = exercised_ca_exposition().await;
    let agent_text = scrape_connector().await;
    let mut exported = exported_series(&ca_text);
    exported.extend(exported_series(&agent_text));

    let in_deploy = used(DASHBOARD, ALERTS);
    assert_eq!(
        missing(&in_deploy, &exported),
        Vec::<String>::new(),
        "used in deploy/ but not exported by the CA or a connector; exported:\n{exported:#?}"
    );
    // The check has teeth: one name changed in the dashboard is caught.
    let renamed = DASHBOARD.replace("reach_ca_applications{", "reach_ca_applicationz{");
    assert_eq!(
        missing(&used(&renamed, ALERTS), &exported),
        ["reach_ca_applicationz"]
    );
    // Every state gauge is on the dashboard or in an alert, and so is every
    // metric the connector exports.
    for name in [
        "reach_ca_applications",
        "reach_ca_application_down",
        "reach_ca_segment_applications",
        "reach_ca_connector_connected",
        "reach_ca_connector_over_budget",
        "reach_ca_connector_checks_per_cycle",
        "reach_ca_connector_checks_per_second",
        "reach_ca_connector_certificate_expiry_timestamp_seconds",
        "reach_ca_connector_drained_since_timestamp_seconds",
        "reach_ca_certificate_expiry_timestamp_seconds",
        "reach_ca_check_budget",
        "up",
    ] {
        assert!(
            in_deploy.contains(name),
            "{name} is used nowhere in deploy/"
        );
    }
    for line in agent_text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap_or_default();
            assert!(
                in_deploy.iter().any(|u| u.starts_with(name)),
                "the connector's {name} is not on the dashboard"
            );
        }
    }
}

/// `promtool check metrics` (the linter Prometheus ships) has no finding on
/// the real exposition of a running CA nor on a connector's `/metrics`:
/// every family has help text, counters end in `_total`, units are in
/// the names.
#[tokio::test]
async fn promtool_finds_nothing_in_the_expositions() {
    let (_, ca_text) = exercised_ca_exposition().await;
    let agent_text = scrape_connector_as("text/plain;version=0.0.4").await;
    for (who, text) in [("the CA", &ca_text), ("a connector", &agent_text)] {
        let findings = promtool_check_metrics(text);
        assert_eq!(
            findings, "",
            "promtool check metrics on {who}'s /metrics:\n{text}"
        );
    }
    // The check has teeth: a family without help text is a finding.
    let bare = "# TYPE reach_ca_x_total counter\nreach_ca_x_total 1\n# EOF\n";
    assert!(promtool_check_metrics(bare).contains("no help text"));
}

/// What `promtool check metrics` reports on `exposition` ("" when nothing).
fn promtool_check_metrics(exposition: &str) -> String {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is not installed: `apt-get install prometheus` (.ci/run does this)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(exposition.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.success(), text.trim().is_empty(), "{text}");
    text.trim().to_owned()
}

#[test]
fn the_suffixes_follow_the_metric_type() {
    let exposition = "# TYPE reach_ca_applications gauge\n\
                      # TYPE reach_ca_decisions counter\n\
                      # TYPE reach_ca_decision_duration_seconds histogram\n";
    let exported = exported_series(exposition);
    let ok = r#"sum by (status) (reach_ca_applications) + rate(reach_ca_decisions_total[5m])
        + rate(reach_ca_decision_duration_seconds_bucket[5m])"#;
    assert!(missing(&metric_names(ok), &exported).is_empty());
    // A counter without `_total`, a histogram without a suffix, a typo.
    for bad in [
        "rate(reach_ca_decisions[5m])",
        "reach_ca_decision_duration_seconds",
        "reach_ca_application",
    ] {
        assert!(
            !missing(&metric_names(bad), &exported).is_empty(),
            "`{bad}` passed"
        );
    }
}

#[test]
fn metric_names_skips_functions_keywords_labels_and_variables() {
    let expr = r#"histogram_quantile(0.99, sum by (le, instance) (rate(a_seconds_bucket{job="x", le!~"in.*"}[$__rate_interval] offset 1h)))
        / on (instance) group_left (group) b_info
        or count(c == 0) or vector(0)
        - time() < 14 * 86400 and d:recorded:rate5m unless ignoring(x) e{}"#;
    assert_eq!(
        metric_names(expr),
        BTreeSet::from(
            ["a_seconds_bucket", "b_info", "c", "d:recorded:rate5m", "e"].map(String::from)
        )
    );
}

#[test]
fn the_dashboard_and_the_rules_are_well_formed() {
    let d: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard is JSON");
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 39));
    assert_eq!(d["__inputs"][0]["name"], "DS_PROMETHEUS");
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(ids.insert(p["id"].as_u64()), "duplicate panel id: {p}");
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}", "{}", p["title"]);
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{} has no query", p["title"]);
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "{}", p["title"]);
        }
    }
    let rules: serde_norway::Value = serde_norway::from_str(ALERTS).expect("rules are YAML");
    let rules = rules["groups"][0]["rules"].as_sequence().expect("rules");
    let names: BTreeSet<&str> = rules.iter().filter_map(|r| r["alert"].as_str()).collect();
    let records: BTreeSet<&str> = rules.iter().filter_map(|r| r["record"].as_str()).collect();
    for r in rules.iter().filter(|r| r["record"].is_null()) {
        let name = r["alert"].as_str().expect("every rule records or alerts");
        for field in [&r["for"], &r["labels"]["severity"]] {
            assert!(field.as_str().is_some(), "{name}: {field:?}");
        }
        for a in ["summary", "description"] {
            assert!(
                r["annotations"][a].as_str().is_some_and(|s| !s.is_empty()),
                "{name} has no {a}"
            );
        }
    }
    for wanted in [
        "ReachCAScrapeDown",
        "ReachSegmentApplicationsDown",
        "ReachSegmentMostlyDown",
        "ReachConnectorGroupDisconnected",
        "ReachConnectorGroupOverBudget",
        "ReachConnectorCertificateExpiring",
        "ReachConnectorDrainedLong",
        "ReachCACertificateExpiring",
    ] {
        assert!(names.contains(wanted), "no {wanted}: {names:?}");
    }
    // No alert per application or per connector: an outage of 10,000
    // applications pages once per segment (`cargo xtask monitoring` tests
    // that with promtool).
    for per_item in [
        "ReachApplicationDown",
        "ReachConnectorDisconnected",
        "ReachConnectorOverBudget",
    ] {
        assert!(!names.contains(per_item), "{per_item} pages per item");
    }
    assert!(records.contains("reach:segment_applications_down:ratio"));
}

/// Every metric name the dashboard's and the rules' expressions use.
fn used(dashboard: &str, alerts: &str) -> BTreeSet<String> {
    let dashboard = dashboard_expressions(dashboard).unwrap_or_else(|e| panic!("{e}"));
    let alerts = alert_expressions(alerts).unwrap_or_else(|e| panic!("{e}"));
    let mut used = BTreeSet::new();
    for expr in dashboard.iter().chain(&alerts) {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no metric in `{expr}`");
        used.extend(names);
    }
    used
}

/// A CA's exposition after it was made to use every metric it has (a
/// labelled family shows up only once it has a sample): OpenMetrics, and
/// the classic text format a client asking for `text/plain` gets.
async fn exercised_ca_exposition() -> (String, String) {
    let dir = scratch_dir("observability");
    let path = dir.join("ca.toml");
    // A log receiver (the log streaming families), a file.
    let receiver = format!(
        "\n[[log_receivers]]\nname = \"file\"\ndestination = \"file://{}\"\n",
        dir.join("records.json").display()
    );
    std::fs::write(
        &path,
        config_text("", "discovery_timeout_ms = 400", &receiver),
    )
    .expect("write");
    let ca = Ca::start_file(&path).await;
    let http = ca.web();
    // Enrolls (enrollments), connects, reports (reports, state gauges) and
    // heartbeats (its load).
    let (east, _) = connect(&ca, "east-1", "dc-east").await;
    // The down address carries a tls check's certificate expiry (the
    // application certificate families).
    let mut report = app("jira", "jira.test.reach", 80, &[], &["127.0.0.21"]);
    report.addresses[0].certificate_not_after_unix_s = Some(1_900_000_000);
    east.report(vec![report], true).await;
    east.heartbeat(protocol::v1::CheckLoad {
        targets: 1,
        checks_per_cycle: 1,
        cycle_seconds: 0.05,
        queue_depth: 0,
        checks_per_second: 20.0,
        in_flight: 0,
        rate_limit: 20,
    })
    .await;
    // It drains itself (the drain's family).
    east.drain(0).await;
    // A session without a client certificate is refused.
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(hello("east-2", "dc-east"))
        .await
        .expect("queue hello");
    let refused =
        protocol::v1::connector_session_client::ConnectorSessionClient::new(ca.channel().await)
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await;
    assert!(refused.is_err(), "a session without a certificate opened");
    // An access decision and a configuration reload.
    let _ = http.access("jira.test.reach", "tcp", 80).await;
    std::fs::write(
        &path,
        config_text("heartbeat_interval_ms = 4321", "", &receiver),
    )
    .expect("write");
    let text = scrape_until(&http, "every family has a sample", |m| {
        [
            "reach_ca_sessions_refused_total{",
            "reach_ca_config_reloads_total{",
            "reach_ca_segment_certificates_expiring{",
            "reach_ca_decisions_total{",
            "reach_ca_enrollments_total{",
            "reach_ca_connector_checks_per_second{",
            "reach_ca_application_down{",
            "reach_ca_connector_drained_since_timestamp_seconds{",
        ]
        .iter()
        .all(|s| m.contains(s))
    })
    .await;
    let bearer = format!("Bearer {READ_TOKEN}");
    let (status, classic) = http
        .send_raw(
            "GET",
            "/metrics",
            &[
                ("authorization", bearer.as_str()),
                ("accept", "text/plain;version=0.0.4"),
            ],
            "",
        )
        .await;
    assert_eq!(status, 200, "{classic}");
    assert!(!classic.contains("# EOF"), "{classic}");
    drop(east);
    ca.stop().await;
    (text, classic)
}

/// Scrapes the CA until `done` holds for the exposition.
async fn scrape_until(http: &Http, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, text) = http.send("GET", "/metrics", Some(READ_TOKEN), None).await;
        assert_eq!(status, 200, "{text}");
        if done(&text) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of the sample whose name and labels are exactly `series`.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The connector's real registry behind its real `/metrics` handler, with a
/// few values set, read over plain HTTP as Prometheus would.
async fn scrape_connector() -> String {
    scrape_connector_as("application/openmetrics-text;version=1.0.0,text/plain;q=0.3").await
}

/// The same, asking for the format `accept` names.
async fn scrape_connector_as(accept: &str) -> String {
    let metrics = connector_agent::metrics::Metrics::new();
    // Every labelled family needs a sample to show up.
    metrics.set_session_state("connected");
    metrics.sessions.inc();
    metrics.observe_check(&policy::AddressResult {
        check: None,
        address: std::net::IpAddr::from([127, 0, 0, 1]),
        reachable: true,
        method: policy::Method::Tcp,
        rtt: Duration::from_millis(1),
        failure: None,
    });
    metrics
        .dns_lookups
        .get_or_create(&connector_agent::metrics::DnsLabels {
            result: "ok".into(),
        })
        .inc();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(connector_agent::metrics::serve(
        listener,
        metrics,
        async move {
            let _ = stopped.await;
        },
    ));
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.write_all(
        format!(
            "GET /metrics HTTP/1.1\r\nHost: connector\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .expect("request");
    let mut response = String::new();
    conn.read_to_string(&mut response).await.expect("response");
    let _ = stop.send(());
    server.await.expect("joins").expect("serves");
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

/// Every series name a scrape of `exposition` can produce, from its
/// `# TYPE` lines (a family with no samples yet still counts), with the
/// suffixes OpenMetrics gives each type.
fn exported_series(exposition: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let Some((name, kind)) = rest.split_once(' ') else {
            continue;
        };
        let suffixes: &[&str] = match kind.trim() {
            "counter" => &["_total", "_created"],
            "histogram" | "gaugehistogram" => &["_bucket", "_sum", "_count", "_created"],
            "summary" => &["", "_sum", "_count", "_created"],
            "info" => &["_info"],
            _ => &[""],
        };
        out.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    out
}

fn missing(used: &BTreeSet<String>, exported: &BTreeSet<String>) -> Vec<String> {
    used.iter()
        .filter(|n| !exported.contains(*n) && !SYNTHETIC.contains(&n.as_str()))
        // `reach:…` series are the rules' own recordings.
        .filter(|n| !n.starts_with("reach:"))
        .cloned()
        .collect()
}

/// Every PromQL expression of the dashboard: each `expr` anywhere in it
/// (panel targets, nested rows).
fn dashboard_expressions(json: &str) -> Result<Vec<String>, String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("reach.json: {e}"))?;
    let mut out = Vec::new();
    walk(&v, &mut out);
    if out.is_empty() {
        return Err("reach.json has no expr".into());
    }
    Ok(out)
}

/// The `expr` of every rule in every group.
fn alert_expressions(yaml: &str) -> Result<Vec<String>, String> {
    let v: serde_norway::Value =
        serde_norway::from_str(yaml).map_err(|e| format!("reach-alerts.yml: {e}"))?;
    let groups = v["groups"]
        .as_sequence()
        .ok_or("reach-alerts.yml: no groups")?;
    let mut out = Vec::new();
    for g in groups {
        for r in g["rules"].as_sequence().ok_or("a group without rules")? {
            let expr = r["expr"]
                .as_str()
                .ok_or_else(|| format!("no expr: {r:?}"))?;
            out.push(expr.to_owned());
        }
    }
    Ok(out)
}

/// PromQL keywords that look like identifiers: aggregations (followed by
/// `by`/`without` or their parenthesis), set and grouping operators.
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
];

/// The metric names a PromQL expression selects. Strings, label matchers
/// `{…}`, ranges `[…]`, Grafana variables (`$__rate_interval`) and the
/// label lists of `by`/`without`/`on`/`ignoring`/`group_left`/`group_right`
/// are dropped first; what remains that is an identifier, not a keyword,
/// not a function (followed by `(`) and not part of a number or duration is
/// a metric name.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    // Pass 1: blank out strings, matchers, ranges and variables.
    let mut clean = String::with_capacity(chars.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += usize::from(chars[i] == '\\') + 1;
                }
                clean.push(' ');
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    i += 1;
                }
                clean.push(' ');
            }
            '$' => {
                i += 1;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                clean.push(' ');
                continue;
            }
            _ => clean.push(c),
        }
        i += 1;
    }
    // Pass 2: identifiers.
    let chars: Vec<char> = clean.chars().collect();
    let is_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let is_part = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let next_non_space = |mut j: usize| {
        while j < chars.len() && chars[j].is_whitespace() {
            j += 1;
        }
        (j, chars.get(j).copied())
    };
    let mut out = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let glued_to_number = i > 0 && (chars[i - 1].is_ascii_digit() || chars[i - 1] == '.');
        if !is_start(c) || glued_to_number {
            // Skip the rest of a number or duration (`1e3`, `5m`).
            i += 1;
            while glued_to_number && i < chars.len() && is_part(chars[i]) {
                i += 1;
            }
            continue;
        }
        let start = i;
        while i < chars.len() && is_part(chars[i]) {
            i += 1;
        }
        let word: String = chars[start..i].iter().collect();
        let (after, next) = next_non_space(i);
        let grouping = matches!(
            word.as_str(),
            "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
        );
        if grouping && next == Some('(') {
            // Skip its label list.
            i = after;
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            i += 1;
            continue;
        }
        if next == Some('(') || KEYWORDS.contains(&word.as_str()) {
            continue;
        }
        out.insert(word);
    }
    out
}
