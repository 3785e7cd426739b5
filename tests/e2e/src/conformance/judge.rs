//! Watches the connector under test and judges it rule by rule.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::Value;

use super::deployment::{
    ACCESS_PORT, APP_NAME, CLOSED_PORT, Deployment, INTERVAL, NAME, OPEN_PORTS, RATE, UDP_PORT,
    WINDOW,
};
use super::{Options, RULES, Verdict};
use crate::{App, Ca, find_app, max_in_window};

/// How long the connector has to enroll and open its first session.
const FIRST_SESSION: Duration = Duration::from_secs(30);
/// How long after its first session every application must have a result.
const FIRST_RESULTS: Duration = Duration::from_secs(15);
/// When, after the first session, the kit accesses the on-access application.
const ACCESS_AT: Duration = Duration::from_secs(6);
/// How long the replicas stay away in the reconnect test.
const AWAY: Duration = Duration::from_secs(10);
/// Most connection attempts per replica address while it is away: a
/// connector with backoff makes a handful, a tight loop hundreds.
const MAX_ATTEMPTS_AWAY: usize = 20;

/// What the watch collected.
#[derive(Default)]
struct Watch {
    /// When every continuous application first had a result (from the first session).
    all_results: Option<Duration>,
    /// (application, when) of every result shown as Unknown after that.
    stale: Vec<(String, Duration)>,
    /// Certificate serials, in the order seen.
    serials: Vec<String>,
    /// The access: when, HTTP status, the connector it named.
    access: Option<(Instant, u16, String)>,
    /// Whether the second replica listed a session of the connector.
    second_replica: bool,
    /// Every status the first replica showed for each application
    /// (`host:port/protocol`).
    seen: BTreeMap<String, BTreeSet<String>>,
    /// Reports the replicas refused with `FlowControl`, per replica.
    deferred: Vec<Option<f64>>,
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

/// The connector's status for `app` in a health table.
fn status_of(health: &Value, app: &App) -> Option<String> {
    find_app(health, app)?["connectors"]
        .as_array()?
        .iter()
        .find(|c| c["connector"] == NAME)?["status"]
        .as_str()
        .map(str::to_owned)
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
            for (app, s) in apps.iter().zip(statuses) {
                if let Some(s) = s {
                    w.seen.entry(key(app)).or_default().insert(s);
                }
            }
        }
        if let Some(row) = connector_row(&d.replicas[0]).await
            && let Some(serial) = row["certificate_serial"].as_str()
            && w.serials.last().map(String::as_str) != Some(serial)
        {
            w.serials.push(serial.to_owned());
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
    }
    w.watched = session.elapsed();
    w
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

fn flow_control(w: &Watch) -> Verdict {
    let Some(deferred) = w.deferred.iter().copied().sum::<Option<f64>>() else {
        return rule(
            "flow-control",
            false,
            "a replica's /metrics has no reach_ca_reports_deferred_total".into(),
        );
    };
    // A full-state report per session may be refused once or twice; a
    // connector that sends again before `retry_after_ms` is refused over
    // and over.
    let allowed = 4.0 + w.watched.as_secs_f64() / 4.0;
    let lost = w.all_results.is_none();
    rule(
        "flow-control",
        deferred <= allowed && !lost,
        format!(
            "{deferred} reports refused with FlowControl in {:.0} s (at most {allowed:.0} allowed){}",
            w.watched.as_secs_f64(),
            if lost {
                "; some application never had a result stored"
            } else {
                ""
            }
        ),
    )
}

fn renewal(w: &Watch) -> Verdict {
    rule(
        "renewal",
        w.serials.len() >= 2,
        format!(
            "certificate serials seen in turn: {}",
            w.serials.join(" → ")
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

/// Takes the replicas away, counts the connector's attempts at their
/// addresses, brings them back and waits for full reports.
async fn reconnect(d: &mut Deployment) -> Result<Verdict> {
    for ca in &mut d.replicas {
        ca.proc.stop().await;
    }
    let attempts: Vec<Arc<AtomicUsize>> = d.replica_at.iter().map(|_| Arc::default()).collect();
    let mut listeners = Vec::new();
    for ((grpc, _), count) in d.replica_at.iter().zip(&attempts) {
        listeners.push(count_attempts(*grpc, count.clone()).await?);
    }
    tokio::time::sleep(AWAY).await;
    for l in listeners {
        l.abort();
        let _ = l.await;
    }
    let counts: Vec<usize> = attempts.iter().map(|a| a.load(Ordering::Relaxed)).collect();
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
            "{counts:?} connection attempts at the replicas' addresses in {AWAY:?} away (at most {MAX_ATTEMPTS_AWAY} each); {}",
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

/// Accepts (and drops) connections at `addr`, counting them.
async fn count_attempts(
    addr: SocketAddr,
    count: Arc<AtomicUsize>,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = crate::retry(Duration::from_secs(5), || async {
        Ok(tokio::net::TcpListener::bind(addr).await?)
    })
    .await?;
    Ok(tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::Relaxed);
            drop(socket);
        }
    }))
}
