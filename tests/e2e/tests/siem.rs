//! Log streaming to the receivers a SIEM runs: the real CA and connector
//! stream every record type to a real rsyslogd over TLS (RFC 5424, read
//! back as rsyslog parsed it) and to a TCP JSON-lines receiver; rsyslogd
//! is stopped for 30 s under access load and started again, and every
//! record of the outage reaches it. Its own test binary: it runs once, on
//! the default store (the store is not what it tests).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::{App, Ca, Connector, Scenario, TcpApp, ca_config_head, retry, wait_status};
use serde_json::Value;
use test_support::Segment;
use test_support::siem::{Auth, JsonReceiver, Parsed, Rsyslog, TlsFiles};

const LIMIT: Duration = Duration::from_secs(300);
/// How long rsyslogd is stopped.
const OUTAGE: Duration = Duration::from_secs(30);
/// rsyslog's name for the structured data the CA writes.
const SD: &str = "reach@32473";
const TYPES: [&str; 4] = ["connector_status", "health", "access", "audit"];

/// The CA's configuration: one segment served by `dc-east`, the receivers
/// `siem` (rsyslogd over TLS with a client certificate, syslog) and
/// `lake` (the JSON receiver, json).
fn config(
    sc: &Scenario,
    app: SocketAddr,
    tls: &TlsFiles,
    siem: SocketAddr,
    lake: SocketAddr,
) -> String {
    let mut cfg = ca_config_head(sc, &["dc-east"], "", "healthy");
    cfg += &Segment::new("web")
        .apps([app.ip().to_string()])
        .tcp([app.port().to_string()])
        .groups(["dc-east"])
        .interval_ms(1000)
        .toml();
    cfg += &format!(
        r#"
[[log_receivers]]
name = "siem"
destination = "tls://{siem}"
format = "syslog"
root_file = {root:?}
server_name = {name:?}
client_cert_file = {cert:?}
client_key_file = {key:?}

[[log_receivers]]
name = "lake"
destination = "tcp://{lake}"
format = "json"
types = ["connector_status", "health", "access", "audit"]
"#,
        root = tls.root.display().to_string(),
        name = tls.server_name,
        cert = tls.client_cert.display().to_string(),
        key = tls.client_key.display().to_string(),
    );
    cfg
}

/// Access requests from 4 tasks, 20 ms apart each, until stopped: the HTTP
/// status of every answer.
struct Load {
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<Result<Vec<u16>>>>,
}

impl Load {
    fn start(ca: &Arc<Ca>, app: SocketAddr) -> Load {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let tasks = (0..4)
            .map(|_| {
                let (ca, mut stopped) = (ca.clone(), stopped.clone());
                tokio::spawn(async move {
                    let mut statuses = Vec::new();
                    while !*stopped.borrow_and_update() {
                        let (status, _) =
                            ca.access(&app.ip().to_string(), "tcp", app.port()).await?;
                        statuses.push(status);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Ok(statuses)
                })
            })
            .collect();
        Load { stop, tasks }
    }

    /// Stops the load; the statuses of every answer.
    async fn finish(self) -> Result<Vec<u16>> {
        self.stop.send(true)?;
        let mut all = Vec::new();
        for t in self.tasks {
            all.extend(t.await??);
        }
        Ok(all)
    }
}

/// Receiver `name` as `GET /api/v1/log_receivers` shows it.
async fn receiver(ca: &Ca, name: &str) -> Result<Value> {
    let body = ca.get("/api/v1/log_receivers").await?;
    body["log_receivers"]
        .as_array()
        .and_then(|l| l.iter().find(|r| r["name"] == name))
        .cloned()
        .with_context(|| format!("no receiver {name} in {body}"))
}

/// Whether `t` is RFC 3339 UTC with milliseconds (`2026-12-07T11:12:13.456Z`).
fn is_rfc3339_ms(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() == 24
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            23 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

/// The fields each type must carry (besides `type`, `time`, `replica`,
/// `seq`), as the book documents them; `connector_status` heartbeats also
/// carry the connector's own status (`HEARTBEAT_FIELDS`), its `connected`
/// event the session's peer address.
fn required(kind: &str, r: &Value) -> &'static [&'static str] {
    match kind {
        "connector_status" => &["connector", "group", "event", "status"],
        "health" => &[
            "application",
            "protocol",
            "port",
            "segment",
            "group",
            "connector",
            "from",
            "to",
        ],
        "access" if r["decision"] == "allowed" => &[
            "request_id",
            "host",
            "port",
            "protocol",
            "segment",
            "decision",
            "connector",
            "group",
            "candidates_healthy",
            "candidates_total",
            "match_us",
            "select_us",
            "total_us",
        ],
        "access" => &[
            "request_id",
            "host",
            "port",
            "protocol",
            "segment",
            "decision",
            "reason",
            "match_us",
            "select_us",
            "total_us",
        ],
        _ => &["actor", "action", "target", "outcome"],
    }
}

/// What a heartbeat's `connector_status` carries of the connector's status.
const HEARTBEAT_FIELDS: &[&str] = &[
    "version",
    "os",
    "arch",
    "process_cpu_percent",
    "host_cpu_percent",
    "process_memory_bytes",
    "host_memory_total_bytes",
    "host_memory_available_bytes",
    "applications",
    "bytes_to_ca",
    "bytes_from_ca",
];

/// One JSON record checked against the documented fields and values.
fn check_json(r: &Value) -> Result<()> {
    let kind = r["type"]
        .as_str()
        .with_context(|| format!("no type: {r}"))?;
    ensure!(TYPES.contains(&kind), "type {kind}: {r}");
    ensure!(r["time"].as_str().is_some_and(is_rfc3339_ms), "time: {r}");
    ensure!(
        r["replica"].as_str().is_some_and(|s| !s.is_empty()),
        "replica: {r}"
    );
    ensure!(r["seq"].is_u64(), "seq: {r}");
    let mut want = required(kind, r).to_vec();
    if kind == "connector_status" && r["event"] == "heartbeat" {
        want.extend(HEARTBEAT_FIELDS);
    }
    if kind == "connector_status" && r["event"] == "connected" {
        // The session's peer.
        want.push("address");
    }
    let missing: Vec<_> = want.iter().filter(|f| r.get(**f).is_none()).collect();
    ensure!(missing.is_empty(), "{kind} without {missing:?}: {r}");
    let one_of = |field: &str, allowed: &[&str]| {
        let v = r[field].as_str().unwrap_or_default();
        ensure!(
            allowed.contains(&v),
            "{kind}: {field} {v:?} not one of {allowed:?}: {r}"
        );
        Ok(())
    };
    match kind {
        "connector_status" => {
            one_of(
                "event",
                &["heartbeat", "connected", "disconnected", "drained"],
            )?;
            one_of("status", &["online", "offline", "draining"])?;
            ensure!(r["connector"] == "c1" && r["group"] == "dc-east", "{r}");
            if r["event"] == "heartbeat" {
                ensure!(r["version"] == env!("CARGO_PKG_VERSION"), "version: {r}");
                ensure!(r["applications"] == 1 && r["bytes_to_ca"].is_u64(), "{r}");
            }
        }
        "health" => {
            one_of("from", &["up", "unhealthy", "down", "unknown"])?;
            one_of("to", &["up", "unhealthy", "down", "unknown"])?;
            ensure!(
                r["segment"] == "web" && r["connector"] == "c1" && r["port"].is_u64(),
                "{r}"
            );
        }
        "access" => {
            one_of("decision", &["allowed", "refused"])?;
            ensure!(r["segment"] == "web" && r["total_us"].is_u64(), "{r}");
            if r["decision"] == "allowed" {
                ensure!(r["connector"] == "c1" && r["group"] == "dc-east", "{r}");
                ensure!(r["candidates_total"] == 1, "{r}");
            }
        }
        _ => ensure!(r["action"].as_str().is_some_and(|a| !a.is_empty()), "{r}"),
    }
    Ok(())
}

/// A JSON value as the text a syslog SD-PARAM carries.
fn as_param(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// One message as rsyslog parsed it, checked against the syslog format;
/// returns its SD parameters with `type` and `time` from the header, so it
/// reads as the JSON record does.
fn check_syslog(p: &Parsed) -> Result<BTreeMap<String, String>> {
    ensure!(p.appname == "central-authority", "APP-NAME: {p:?}");
    ensure!(TYPES.contains(&p.msgid.as_str()), "MSGID: {p:?}");
    ensure!(
        p.pri / 8 == 13,
        "facility {} (want 13, log audit): {p:?}",
        p.pri / 8
    );
    ensure!(is_rfc3339_ms(&p.timestamp), "TIMESTAMP: {p:?}");
    let mut params =
        p.sd.get(SD)
            .cloned()
            .with_context(|| format!("no [{SD}]: {p:?}"))?;
    ensure!(
        params.get("replica") == Some(&p.hostname),
        "HOSTNAME is the replica: {p:?}"
    );
    ensure!(
        params.get("seq").is_some_and(|s| s.parse::<u64>().is_ok()),
        "seq: {p:?}"
    );
    ensure!(!p.msg.is_empty(), "no MSG: {p:?}");
    params.insert("type".into(), p.msgid.clone());
    params.insert("time".into(), p.timestamp.clone());
    Ok(params)
}

/// Every record of both receivers checked; the access records rsyslog
/// parsed compared field by field with the JSON receiver's (by
/// `request_id`). Fails (to be retried) until each receiver has every
/// type, a health transition to down and back to up, and the reload's
/// audit record.
fn check_all(siem: &[Parsed], lake: &[Value]) -> Result<()> {
    let mut json_types = BTreeSet::new();
    let mut by_id = HashMap::new();
    for r in lake {
        check_json(r)?;
        json_types.insert(r["type"].as_str().unwrap_or_default());
        if let Some(id) = r["request_id"].as_str() {
            by_id.insert(id, r);
        }
    }
    let mut syslog_types = BTreeSet::new();
    let mut compared = 0;
    for p in siem {
        let params = check_syslog(p)?;
        syslog_types.insert(p.msgid.clone());
        let Some(j) = params
            .get("request_id")
            .and_then(|id| by_id.get(id.as_str()))
        else {
            continue;
        };
        for (k, v) in j.as_object().into_iter().flatten() {
            if k != "seq" {
                ensure!(
                    params.get(k) == Some(&as_param(v)),
                    "{k}: rsyslog {params:?}, JSON {j}"
                );
            }
        }
        compared += 1;
    }
    ensure!(
        json_types.len() == 4,
        "JSON receiver has {json_types:?} only"
    );
    ensure!(syslog_types.len() == 4, "rsyslog has {syslog_types:?} only");
    ensure!(compared > 0, "no access record in both receivers yet");
    let event = |e: &str| {
        lake.iter()
            .any(|r| r["type"] == "connector_status" && r["event"] == e)
    };
    ensure!(
        event("heartbeat") && event("connected"),
        "no heartbeat or connected event yet"
    );
    let to = |to: &str| lake.iter().any(|r| r["type"] == "health" && r["to"] == to);
    ensure!(
        to("down") && to("up"),
        "no transition to down and back to up yet"
    );
    let audited = |p: &Parsed| p.msgid == "audit" && p.param(SD, "action") == Some("config.reload");
    ensure!(
        siem.iter().any(audited),
        "no config.reload audit record in rsyslog yet"
    );
    Ok(())
}

/// The sequence numbers of `seqs` with the first and last, and those
/// missing in between.
fn gaps(seqs: &BTreeSet<u64>) -> (u64, u64, Vec<u64>) {
    let (first, last) = (
        seqs.first().copied().unwrap_or(0),
        seqs.last().copied().unwrap_or(0),
    );
    let missing = (first..=last).filter(|s| !seqs.contains(s)).collect();
    (first, last, missing)
}

/// rsyslog's sequence numbers (each replica numbers its records per
/// receiver).
fn syslog_seqs(siem: &[Parsed]) -> BTreeSet<u64> {
    siem.iter()
        .filter_map(|p| p.param(SD, "seq")?.parse().ok())
        .collect()
}

/// Phase 1: the CA, the connector, the load; a reload, a drain and a
/// failure of the application make audit, refused access and health
/// records; both receivers get every type with the documented fields.
async fn every_type(
    ca: &Arc<Ca>,
    app: &mut TcpApp,
    siem: &Rsyslog,
    lake: &JsonReceiver,
) -> Result<()> {
    let config = std::fs::read_to_string(&ca.config)?;
    ca.reload(&config.replace(
        "[[log_receivers]]",
        "# reloaded by the test\n[[log_receivers]]",
    ))?;
    let key = App::new(
        "web",
        &app.addr().ip().to_string(),
        "tcp",
        app.addr().port(),
    );
    ensure!(
        ca.admin("/api/v1/connectors/c1/drain?force=true").await? == 200,
        "drain c1"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    ensure!(
        ca.admin("/api/v1/connectors/c1/undrain").await? == 200,
        "undrain c1"
    );
    app.stop();
    wait_status(ca, &key, "c1", "down", Duration::from_secs(20)).await?;
    app.resume().await?;
    wait_status(ca, &key, "c1", "up", Duration::from_secs(20)).await?;
    retry(Duration::from_secs(30), || async {
        check_all(&siem.received()?, &lake.records())
    })
    .await
    .context("every type at both receivers, parsed, with the documented fields")
}

/// Phase 2: rsyslogd stopped for `OUTAGE` under load; the CA's receivers
/// API samples taken each second meanwhile: (connected, spool_records,
/// spool_bytes) of `siem`.
async fn outage(ca: &Ca, siem: &mut Rsyslog) -> Result<Vec<(bool, u64, u64)>> {
    siem.stop().await?;
    let t0 = Instant::now();
    let mut samples = Vec::new();
    while t0.elapsed() < OUTAGE {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let r = receiver(ca, "siem").await?;
        samples.push((
            r["connected"].as_bool().context("connected")?,
            r["spool_records"].as_u64().context("spool_records")?,
            r["spool_bytes"].as_u64().context("spool_bytes")?,
        ));
    }
    siem.restart().await?;
    let down: Vec<_> = samples.iter().filter(|s| !s.0).collect();
    ensure!(
        down.len() >= samples.len() / 2,
        "siem shown connected while rsyslogd was stopped: {samples:?}"
    );
    let (first, last) = (down[0], down[down.len() - 1]);
    ensure!(
        last.1 > first.1 && last.2 > first.2,
        "the spool did not grow while rsyslogd was stopped: {samples:?}"
    );
    Ok(samples)
}

/// After the load: waits until both receivers have every record (both
/// connected, rsyslog's numbers without gaps up to the JSON receiver's
/// last), then compares them. (The spool keeps a record until 8 MiB more
/// went out after it, in case a broken connection lost it: at this volume
/// it empties only by sending again.) Returns (messages at rsyslog,
/// duplicates among them).
async fn delivered(
    ca: &Ca,
    siem: &Rsyslog,
    lake: &JsonReceiver,
    answered: usize,
) -> Result<(usize, usize)> {
    let (siem_seqs, lake_records) = retry(Duration::from_secs(60), || async {
        for name in ["siem", "lake"] {
            let r = receiver(ca, name).await?;
            ensure!(r["connected"] == true, "{name}: {r}");
            ensure!(r["dropped_total"] == 0, "{name} dropped records: {r}");
        }
        let lake_records = lake.records();
        let lake_last = lake_records.iter().filter_map(|r| r["seq"].as_u64()).max();
        let seqs = syslog_seqs(&siem.received()?);
        let (_, last, missing) = gaps(&seqs);
        ensure!(
            Some(last) >= lake_last,
            "rsyslog at seq {last}, the JSON receiver at {lake_last:?}"
        );
        ensure!(
            missing.is_empty(),
            "rsyslog misses {} records: {missing:?}",
            missing.len()
        );
        Ok((seqs, lake_records))
    })
    .await?;
    let lake_seqs: BTreeSet<u64> = lake_records
        .iter()
        .filter_map(|r| r["seq"].as_u64())
        .collect();
    let (lake_first, _, lake_missing) = gaps(&lake_seqs);
    ensure!(
        lake_missing.is_empty(),
        "the JSON receiver misses {lake_missing:?}"
    );
    ensure!(
        gaps(&siem_seqs).0 == lake_first,
        "the receivers' first records differ"
    );
    let received = siem.received()?;
    let siem_ids: BTreeSet<&str> = received
        .iter()
        .filter_map(|p| p.param(SD, "request_id"))
        .collect();
    let lake_ids: BTreeSet<&str> = lake_records
        .iter()
        .filter_map(|r| r["request_id"].as_str())
        .collect();
    ensure!(
        siem_ids == lake_ids,
        "access records differ: {} at rsyslog, {} at the JSON receiver",
        siem_ids.len(),
        lake_ids.len()
    );
    ensure!(
        siem_ids.len() >= answered,
        "{} access records for {answered} answers",
        siem_ids.len()
    );
    let replicas: BTreeSet<_> = received.iter().map(|p| p.hostname.as_str()).collect();
    ensure!(replicas.len() == 1, "one CA, replicas {replicas:?}");
    Ok((received.len(), received.len() - siem_seqs.len()))
}

/// The CA streams connector status, health transitions, access decisions
/// and its audit trail to a real rsyslogd over TLS (client certificate
/// required, RFC 5424 parsed by rsyslog) and to a TCP JSON receiver, every
/// type with its documented fields, the same values in both. rsyslogd is
/// stopped for 30 s under access load: the CA's receivers API shows it
/// disconnected with its spool growing, and once rsyslogd is back every
/// record of the outage reaches it (numbers without a gap; the same access
/// decisions as the JSON receiver, one per answer), nothing dropped.
#[tokio::test]
#[ignore = "end-to-end: run with `cargo xtask e2e`"]
async fn log_streaming_to_rsyslog_and_a_json_receiver() -> Result<()> {
    test_support::siem::rsyslogd()?;
    let sc = Scenario::new("log_streaming", 58)?;
    sc.run(LIMIT, |sc| async move {
        let app_addr = sc.addr(1, 1, 8080);
        let mut app = TcpApp::start(app_addr).await?;
        let tls = TlsFiles::issue(&sc.dir.join("siem-tls"), "siem.reach.test", "ca.reach.test")?;
        let mut siem = Rsyslog::start(sc.addr(0, 60, 6514), &tls, Auth::X509Name, &sc.dir).await?;
        let lake = JsonReceiver::start(sc.addr(0, 61, 0)).await?;
        let ca =
            Arc::new(Ca::start(&sc, &config(&sc, app_addr, &tls, siem.addr(), lake.addr())).await?);
        let _c1 = Connector::start(&sc, &ca, "c1", "dc-east", &[])?;
        let key = App::new("web", &app_addr.ip().to_string(), "tcp", 8080);
        wait_status(&ca, &key, "c1", "up", Duration::from_secs(20)).await?;
        let load = Load::start(&ca, app_addr);
        every_type(&ca, &mut app, &siem, &lake).await?;
        let before = syslog_seqs(&siem.received()?).last().copied().unwrap_or(0);
        let samples = outage(&ca, &mut siem).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let statuses = load.finish().await?;
        let answered = statuses.iter().filter(|s| **s == 200).count();
        let (records, duplicates) = delivered(&ca, &siem, &lake, answered).await?;
        let after = syslog_seqs(&siem.received()?).last().copied().unwrap_or(0);
        ensure!(
            after > before + OUTAGE.as_secs(),
            "no records during the outage: seq {before} → {after}"
        );
        if !siem.is_running() {
            bail!("rsyslogd exited: {}", siem.log_text());
        }
        eprintln!(
            "log streaming: {records} messages at rsyslog ({duplicates} sent again), {} accesses \
             ({answered} allowed); outage samples (connected, spool records, bytes): {samples:?}",
            statuses.len()
        );
        Ok(())
    })
    .await
}
