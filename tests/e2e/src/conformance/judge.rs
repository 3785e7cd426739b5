//! Watches the connector under test and judges it rule by rule.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::Value;

use super::away::Away;
use super::deployment::{
    ACCESS_PORT, APP_NAME, CERT_VALIDITY_S, CLOSED_PORT, Deployment, ENTRIES, INTERVAL, NAME,
    OPEN_PORTS, PAUSE, RATE, UDP_PORT, WINDOW,
};
use super::{Options, RULES, Verdict};
use crate::{App, Ca, find_app, max_in_window};

/// How long the connector has to enroll and open its first session.
const FIRST_SESSION: Duration = Duration::from_secs(30);
/// How long after its first session every application must have a result.
const FIRST_RESULTS: Duration = Duration::from_secs(15);
/// When, after the first session, the kit accesses the on-access application.
const ACCESS_AT: Duration = Duration::from_secs(6);
/// When, after the first session, the kit pauses the first replica
/// (`PAUSE`): after the access window, before the certificate's renewal
/// (at two thirds of its 30 s, less a tenth).
const PAUSE_AT: Duration = Duration::from_secs(12);
/// How long the replicas stay away in the reconnect test.
const AWAY: Duration = Duration::from_secs(10);
/// The certificate validity the connector's certificate must have left
/// when the replicas go away: more than they stay away and take to come
/// back, so that the rule judges reconnecting, not an expiry while away.
const VALID_WHILE_AWAY: Duration = Duration::from_secs(22);
/// Most attempts to open a session per replica address while it is away:
/// a connector with backoff makes a handful, a tight loop hundreds.
const MAX_ATTEMPTS_AWAY: usize = 20;

/// What the watch collected.
#[derive(Default)]
struct Watch {
    /// When every continuous application first had a result (from the first session).
    all_results: Option<Duration>,
    /// (application, when) of every result shown as Unknown after that.
    stale: Vec<(String, Duration)>,
    /// Certificate serials, in the order seen, each with when it was
    /// first listed (Unix ms) and whether its session was listed connected.
    serials: Vec<(String, u64, bool)>,
    /// The latest time the first replica received a report of the
    /// connector's (`reported_at`, Unix ms).
    last_report_ms: u64,
    /// Certificates the replicas issued by `Enroll` (with the
    /// provisioning key) and by `Renew`, from `reach_ca_enrollments_total`.
    enrolled: Option<f64>,
    renewed: Option<f64>,
    /// Whether the kit paused the first replica (else why not).
    paused: Option<Result<(), String>>,
    /// The access: when, HTTP status, the connector it named.
    access: Option<(Instant, u16, String)>,
    /// Whether the second replica listed a session of the connector.
    second_replica: bool,
    /// Every status the first replica showed for each application
    /// (`host:port/protocol`).
    seen: BTreeMap<String, BTreeSet<String>>,
    /// Reports the replicas refused with `FlowControl`, per replica.
    deferred: Vec<Option<f64>>,
    /// Reports that sent a refused application again before the
    /// `retry_after_ms` of their session's latest refusal, per replica.
    early: Vec<Option<f64>>,
    /// How long the watch lasted.
    watched: Duration,
}

fn rule(name: &'static str, pass: bool, evidence: String) -> Verdict {
    let requires = RULES
        .iter()
        .find(|(n, _)| *n == name)
        .map_or("", |(_, r)| *r);
    Verdict {
        rule: name,
        requires,
        pass,
        evidence,
    }
}

/// Every continuous application key of the kit's policy.
fn continuous_apps(d: &Deployment) -> Vec<App> {
    let explicit = Deployment::app_ips(&d.sc)[2].to_string();
    let mut apps = Vec::new();
    for host in [APP_NAME.to_owned(), explicit] {
        for port in OPEN_PORTS.into_iter().chain([CLOSED_PORT]) {
            apps.push(App::new("continuous", &host, "tcp", port));
        }
    }
    apps.push(App::new("udp", &d.sc.ip(2, 1).to_string(), "udp", UDP_PORT));
    apps
}

/// How the verdicts name an application.
fn key(app: &App) -> String {
    format!("{}:{}/{}", app.host, app.port, app.protocol)
}

/// The statuses shown for `app` during the watch.
fn seen<'a>(w: &'a Watch, app: &App) -> Vec<&'a str> {
    w.seen
        .get(&key(app))
        .map(|s| s.iter().map(String::as_str).collect())
        .unwrap_or_default()
}

/// The connector's row in `/api/v1/connectors`, if listed.
async fn connector_row(ca: &Ca) -> Option<Value> {
    let v = ca.get("/api/v1/connectors").await.ok()?;
    v["connectors"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == NAME)
        .cloned()
}

/// The connector's entry for `app` in a health table.
fn mine<'a>(health: &'a Value, app: &App) -> Option<&'a Value> {
    find_app(health, app)?["connectors"]
        .as_array()?
        .iter()
        .find(|c| c["connector"] == NAME)
}

/// The connector's status for `app` in a health table.
fn status_of(health: &Value, app: &App) -> Option<String> {
    mine(health, app)?["status"].as_str().map(str::to_owned)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Judges every rule; the verdicts in [`RULES`] order.
pub async fn judge(d: &mut Deployment, options: &Options) -> Result<Vec<Verdict>> {
    let started = Instant::now();
    let first = loop {
        if let Some(row) = connector_row(&d.replicas[0]).await
            && row["connected"] == true
        {
            break Some(row);
        }
        if started.elapsed() > FIRST_SESSION {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let Some(first) = first else {
        let log = d.connector.as_ref().map(|c| c.log()).unwrap_or_default();
        let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        let mut verdicts = vec![rule(
            "enrollment",
            false,
            format!(
                "no session of {NAME:?} within {FIRST_SESSION:?}; connector log (last lines): {tail}"
            ),
        )];
        for (name, _) in &RULES[1..] {
            verdicts.push(rule(
                name,
                false,
                "not judged: the connector never opened a session".into(),
            ));
        }
        return Ok(verdicts);
    };
    let enrolled = rule(
        "enrollment",
        first["enrolled"] == true,
        format!(
            "enrolled and connected after {:.1} s, certificate {}",
            started.elapsed().as_secs_f64(),
            first["certificate_serial"]
        ),
    );
    let session = Instant::now();
    let watch = watch(d, options, session).await;
    let mut verdicts = vec![enrolled];
    verdicts.extend(judge_watch(d, &watch, session));
    verdicts.push(reconnect(d).await?);
    Ok(verdicts)
}

/// Polls both replicas for `options.observe`, making the access on the way.
async fn watch(d: &Deployment, options: &Options, session: Instant) -> Watch {
    let apps = continuous_apps(d);
    let mut w = Watch::default();
    while session.elapsed() < options.observe {
        let now = session.elapsed();
        if w.access.is_none() && now >= ACCESS_AT {
            let host = d.sc.ip(3, 1).to_string();
            let at = Instant::now();
            if let Ok((status, body)) = d.replicas[0].access(&host, "tcp", ACCESS_PORT).await {
                let named = body["connector"].as_str().unwrap_or_default().to_owned();
                w.access = Some((at, status, named));
            }
        }
        if w.paused.is_none() && now >= PAUSE_AT {
            w.paused = Some(pause(d).await);
        }
        if let Ok(health) = d.replicas[0].get("/api/v1/health").await {
            let statuses: Vec<Option<String>> =
                apps.iter().map(|a| status_of(&health, a)).collect();
            let have_all = statuses
                .iter()
                .all(|s| s.as_deref().is_some_and(|s| s != "unknown"));
            if w.all_results.is_none() && have_all {
                w.all_results = Some(now);
            }
            if w.all_results.is_some() {
                for (app, s) in apps.iter().zip(&statuses) {
                    if s.as_deref().is_none_or(|s| s == "unknown") {
                        w.stale.push((key(app), now));
                    }
                }
            }
            for app in &apps {
                if let Some(at) = mine(&health, app).and_then(|c| c["reported_at"].as_u64()) {
                    w.last_report_ms = w.last_report_ms.max(at);
                }
            }
            for (app, s) in apps.iter().zip(statuses) {
                if let Some(s) = s {
                    w.seen.entry(key(app)).or_default().insert(s);
                }
            }
        }
        if let Some(row) = connector_row(&d.replicas[0]).await
            && let Some(serial) = row["certificate_serial"].as_str()
        {
            let connected = row["connected"] == true;
            match w.serials.last_mut() {
                Some((last, _, on)) if last == serial => *on |= connected,
                _ => w.serials.push((serial.to_owned(), unix_ms(), connected)),
            }
        }
        if !w.second_replica
            && let Some(row) = connector_row(&d.replicas[1]).await
        {
            w.second_replica = row["connected"] == true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for ca in &d.replicas {
        let text = ca.get_text("/metrics").await.unwrap_or_default();
        w.deferred
            .push(metric(&text, "reach_ca_reports_deferred_total"));
        w.early.push(metric(&text, "reach_ca_reports_early_total"));
        let issued = |outcome: &str| {
            let series = format!("reach_ca_enrollments_total{{outcome=\"{outcome}\"}}");
            // A family without a sample is left out of the exposition: zero.
            metric(&text, &series).or_else(|| text.contains("# HELP reach_ca_").then_some(0.0))
        };
        w.enrolled = sum(w.enrolled, issued("enrolled"));
        w.renewed = sum(w.renewed, issued("renewed"));
    }
    w.watched = session.elapsed();
    w
}

/// Stops the first replica for `PAUSE` and lets it go on: what the
/// connector sent meanwhile reaches it at once.
async fn pause(d: &Deployment) -> Result<(), String> {
    let proc = &d.replicas[0].proc;
    proc.signal("STOP").map_err(|e| format!("{e:#}"))?;
    tokio::time::sleep(PAUSE).await;
    proc.signal("CONT").map_err(|e| format!("{e:#}"))
}

/// The verdicts judged from the watch, in [`RULES`] order after enrollment.
fn judge_watch(d: &Deployment, w: &Watch, session: Instant) -> Vec<Verdict> {
    vec![
        every_address(d),
        tcp_handshake(d, w),
        udp_icmp(d, w),
        rate_limit(d),
        report_interval(w),
        on_access(d, w),
        flow_control(w),
        renewal(w),
        rule(
            "replicas",
            w.second_replica,
            format!(
                "the second replica {} a session of {NAME:?} within {:.0} s",
                if w.second_replica {
                    "listed"
                } else {
                    "never listed"
                },
                session.elapsed().as_secs_f64()
            ),
        ),
    ]
}

fn every_address(d: &Deployment) -> Verdict {
    let missed: Vec<String> = d
        .tcp
        .iter()
        .filter(|a| a.count() == 0)
        .map(|a| a.addr().to_string())
        .collect();
    let checked = d.tcp.len() - missed.len();
    rule(
        "every-address",
        missed.is_empty(),
        if missed.is_empty() {
            format!(
                "all {checked} address:port pairs (2 resolved addresses and 1 explicit IP, {} ports) were connected to",
                OPEN_PORTS.len()
            )
        } else {
            format!("never connected to {}", missed.join(", "))
        },
    )
}

fn tcp_handshake(d: &Deployment, w: &Watch) -> Verdict {
    let explicit = Deployment::app_ips(&d.sc)[2].to_string();
    let mut wrong = Vec::new();
    for host in [APP_NAME, explicit.as_str()] {
        for port in OPEN_PORTS.into_iter().chain([CLOSED_PORT]) {
            let (want, never) = if port == CLOSED_PORT {
                ("down", "up")
            } else {
                ("up", "down")
            };
            let got = seen(w, &App::new("continuous", host, "tcp", port));
            if !got.contains(&want) || got.contains(&never) {
                wrong.push(format!("{host}:{port} was {got:?}, want {want}"));
            }
        }
    }
    let accepted: usize = d.tcp.iter().map(|a| a.count()).sum();
    rule(
        "tcp-handshake",
        wrong.is_empty() && accepted > 0,
        if wrong.is_empty() {
            format!(
                "{accepted} handshakes completed at the applications; open ports shown Up, port {CLOSED_PORT} Down, never the other way"
            )
        } else {
            wrong.join("; ")
        },
    )
}

fn udp_icmp(d: &Deployment, w: &Watch) -> Verdict {
    let IpAddr::V4(ip) = d.sc.ip(2, 1) else {
        return rule(
            "udp-icmp",
            false,
            "the kit's UDP address is not IPv4".into(),
        );
    };
    let echoes = d.echo.requests_to(ip);
    let got = seen(w, &App::new("udp", &ip.to_string(), "udp", UDP_PORT));
    rule(
        "udp-icmp",
        echoes > 0 && got.contains(&"up"),
        format!("{echoes} ICMP echo requests reached {ip}; its UDP application was {got:?}"),
    )
}

fn rate_limit(d: &Deployment) -> Verdict {
    let mut times: Vec<Instant> = d.tcp.iter().flat_map(|a| a.arrivals()).collect();
    times.extend(d.on_access.arrivals());
    times.sort();
    // Two seconds and one check over the rate: a token bucket refilled at
    // the rate lets the check that starts the next window fall inside it,
    // and a connection's latency can move its arrival by a little.
    let max = max_in_window(&times, Duration::from_secs(2));
    let allowed = 2 * RATE as usize + 1;
    rule(
        "rate-limit",
        max <= allowed && !times.is_empty(),
        format!(
            "at most {max} checks reached the applications in any 2 s ({} in all; imposed {RATE}/s, {allowed} allowed in 2 s)",
            times.len()
        ),
    )
}

fn report_interval(w: &Watch) -> Verdict {
    let pass = w.all_results.is_some_and(|t| t <= FIRST_RESULTS) && w.stale.is_empty();
    let evidence = match (w.all_results, w.stale.first()) {
        (None, _) => "some application never had a result".to_owned(),
        (Some(t), None) => format!(
            "every application had a result {:.1} s after the session opened and none went stale (interval {:?})",
            t.as_secs_f64(),
            INTERVAL
        ),
        (Some(_), Some((app, at))) => format!(
            "{} stale or missing readings, the first {app} at {:.1} s",
            w.stale.len(),
            at.as_secs_f64()
        ),
    };
    rule("report-interval", pass, evidence)
}

fn on_access(d: &Deployment, w: &Watch) -> Verdict {
    let Some((at, status, named)) = &w.access else {
        return rule(
            "on-access",
            false,
            "the kit could not make its access".into(),
        );
    };
    let arrivals = d.on_access.arrivals();
    let during = arrivals.iter().filter(|t| **t >= *at).count();
    // A check that started just before the window ended may still connect.
    let end = *at + WINDOW + Duration::from_millis(1500);
    let after = arrivals.iter().filter(|t| **t > end).count();
    let watched_past = Instant::now() > end;
    let routed = *status == 200 && named == NAME;
    rule(
        "on-access",
        routed && during > 0 && after == 0 && watched_past,
        format!(
            "access answered {status} naming {named:?} (routing needs the echoed access id); {during} checks after the access, {after} more than {:?} after it",
            WINDOW + Duration::from_millis(1500)
        ),
    )
}

/// Reports were refused (the kit provokes it: it pauses the first replica
/// for `PAUSE`, and the reports of that time exceed the entry budget when
/// they arrive at once), none sent a refused application again before the
/// `retry_after_ms` of its session's latest refusal, and the refused results were stored after
/// all: every application had a result and none went stale.
fn flow_control(w: &Watch) -> Verdict {
    let (Some(deferred), Some(early)) = (
        w.deferred.iter().copied().sum::<Option<f64>>(),
        w.early.iter().copied().sum::<Option<f64>>(),
    ) else {
        return rule(
            "flow-control",
            false,
            "a replica's /metrics has no reach_ca_reports_deferred_total or reach_ca_reports_early_total".into(),
        );
    };
    let lost = w.all_results.is_none() || !w.stale.is_empty();
    let paused = match &w.paused {
        Some(Ok(())) => format!("the first replica paused {PAUSE:?}"),
        Some(Err(e)) => format!("the first replica could not be paused ({e})"),
        None => "the first replica was not paused (the watch ended first)".to_owned(),
    };
    rule(
        "flow-control",
        deferred > 0.0 && early == 0.0 && !lost,
        format!(
            "{paused}; {deferred} reports refused with FlowControl in {:.0} s (entry budget {}/s, burst {}){}, {early} reports sent a refused application again before the retry_after_ms of its refusal{}",
            w.watched.as_secs_f64(),
            ENTRIES.0,
            ENTRIES.1,
            if deferred == 0.0 {
                ": none refused, so resending was not judged (a connector that sent nothing while the replica was paused)"
            } else {
                ""
            },
            if lost {
                "; refused results lost: some application never had a result stored or went stale"
            } else {
                "; every application's results stored"
            }
        ),
    )
}

/// Adds two readings; unknown when either is.
fn sum(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a.unwrap_or(0.0) + b?)
}

/// A `Renew` before `not_after`, a report received on the renewed
/// certificate, and no second `Enroll`: a connector whose certificate
/// expired can only enroll again with the provisioning key, which is not
/// a renewal.
fn renewal(w: &Watch) -> Verdict {
    let (Some(enrolled), Some(renewed)) = (w.enrolled, w.renewed) else {
        return rule(
            "renewal",
            false,
            "a replica's /metrics has no reach_ca_enrollments_total".into(),
        );
    };
    let serials: Vec<&str> = w.serials.iter().map(|(s, _, _)| s.as_str()).collect();
    // Reports on the renewed certificate: a session on a later serial, and
    // a report received after it was listed (a renewed session replaces
    // the one before).
    let on_renewed = w.serials.iter().skip(1).any(|(_, _, connected)| *connected);
    let reported = w
        .serials
        .get(1)
        .is_some_and(|(_, at, _)| w.last_report_ms > *at);
    let pass = enrolled == 1.0 && renewed >= 1.0 && on_renewed && reported;
    rule(
        "renewal",
        pass,
        format!(
            "{renewed} certificates issued by Renew and {enrolled} by Enroll with the provisioning key (1 allowed); serials seen in turn: {}; {}",
            serials.join(" → "),
            match (on_renewed, reported) {
                (true, true) => "a session and reports on a later certificate",
                (true, false) => "a session on a later certificate but no report after it",
                (false, _) => "no session on a later certificate",
            }
        ),
    )
}

/// The value of counter `name` in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

/// Waits (at most one certificate lifetime) until the connector's current
/// certificate is valid for `VALID_WHILE_AWAY` more: a connector renews at
/// about two thirds of the lifetime, so one that renews has such a
/// certificate soon. Without it, the certificate could expire while the
/// replicas are away, and only enrolling again with the provisioning key
/// (which the rule does not ask for) would bring the connector back. How
/// long it waited, or why not.
async fn certificate_outlasting_away(d: &Deployment) -> String {
    let start = Instant::now();
    let limit = Duration::from_secs(CERT_VALIDITY_S + 5);
    loop {
        let left = connector_row(&d.replicas[0])
            .await
            .and_then(|row| row["certificate_not_after"].as_i64())
            .map(|at| at - i64::try_from(unix_ms()).unwrap_or(i64::MAX));
        let wanted = i64::try_from(VALID_WHILE_AWAY.as_millis()).unwrap_or(i64::MAX);
        if left.is_some_and(|ms| ms >= wanted) {
            return format!(
                "the replicas went away {:.1} s after the watch, on a certificate valid {:.0} s more",
                start.elapsed().as_secs_f64(),
                left.unwrap_or(0) as f64 / 1000.0
            );
        }
        if start.elapsed() > limit {
            return format!(
                "no certificate valid {VALID_WHILE_AWAY:?} more within {limit:?} (left: {left:?} ms): the replicas went away anyway"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Takes the replicas away (once the connector's certificate outlasts
/// that), counts the connector's attempts to open a session at their
/// addresses (`away`), brings them back and waits for full reports.
async fn reconnect(d: &mut Deployment) -> Result<Verdict> {
    let waited = certificate_outlasting_away(d).await;
    for ca in &mut d.replicas {
        ca.proc.stop().await;
    }
    let dir = d.data_dir();
    let cert = std::fs::read_to_string(dir.join("server.pem"))
        .context("the replicas' server certificate (server.pem in their data directory)")?;
    let key = std::fs::read_to_string(dir.join("server.key"))?;
    let mut listeners = Vec::new();
    for (grpc, _) in &d.replica_at {
        listeners.push(Away::start(*grpc, &cert, &key).await?);
    }
    tokio::time::sleep(AWAY).await;
    let mut counts = Vec::new();
    let mut streams = 0;
    for l in listeners {
        let (hellos, opened) = l.attempts();
        counts.push(hellos);
        streams += opened;
        l.stop().await;
    }
    let back = Instant::now();
    let mut replicas = Vec::new();
    for i in 0..d.replica_at.len() {
        replicas.push(d.start_replica(i).await?);
    }
    d.replicas = replicas;
    let apps = continuous_apps(d);
    let whole = crate::retry(Duration::from_secs(25), || async {
        let health = d.replicas[0].get("/api/v1/health").await?;
        let missing = apps
            .iter()
            .filter(|a| status_of(&health, a).is_none_or(|s| s == "unknown"))
            .count();
        anyhow::ensure!(
            missing == 0,
            "{missing} applications without a fresh result"
        );
        Ok(())
    })
    .await;
    let bounded = counts.iter().all(|c| *c <= MAX_ATTEMPTS_AWAY);
    let retried = counts.iter().sum::<usize>() >= 2;
    Ok(rule(
        "reconnect-backoff",
        bounded && retried && whole.is_ok(),
        format!(
            "{waited}; {counts:?} attempts to open a session (Connect streams with Hello; {streams} streams in all) at the replicas' addresses in {AWAY:?} away (at most {MAX_ATTEMPTS_AWAY} each); {}",
            match whole {
                Ok(()) => format!(
                    "every application fresh again {:.1} s after the replicas were restarted",
                    back.elapsed().as_secs_f64()
                ),
                Err(e) => format!("not whole 25 s after the replicas came back: {e:#}"),
            }
        ),
    ))
}
