//! Bounded on-access state: what a flood of accesses under a
//! wildcard and a flood of unsolicited report entries make the CA hold,
//! and whether it lets go after the window and the retention.
//!
//! One CA (child process) with an on-access wildcard segment and a short
//! window and retention; one simulated connector that answers every
//! forwarded access with a report at once (as the real agent would after
//! its check). The driver makes 100,000 accesses to distinct names under
//! the wildcard (512 in flight), then the connector sends 100,000
//! unsolicited entries for other names under it (in reports of 2,000, the
//! per-report limit). Figures: the applications the CA holds for the
//! segment (from `GET /api/v1/health?segment=`) and its RSS growth over
//! the connected baseline: the most seen while the floods run (sampled
//! every 250 ms), and again after the window and the retention have passed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use protocol::v1::connector_message::Kind as In;
use tokio::sync::mpsc;

use super::Spec;
use super::ca::{self, GROUP, KEY};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::sim::{self, Identity};
use crate::sys::rss_bytes;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "ca_onaccess_apps_after_flood",
        unit: "applications",
        goal: Goal::AtMost {
            limit: MAX_WINDOWS as f64 + 1.0,
        },
    },
    Spec {
        name: "ca_onaccess_flood_rss_growth_mib",
        unit: "MiB",
        goal: Goal::Info,
    },
    Spec {
        name: "ca_onaccess_apps_after_retention",
        unit: "applications",
        goal: Goal::AtMost { limit: 1.0 },
    },
    Spec {
        name: "ca_onaccess_rss_growth_after_retention_mib",
        unit: "MiB",
        goal: Goal::Info,
    },
];

/// `[health] max_windows_per_connector` (the default); the bench's one
/// segment gets as many (`max_windows_per_segment`, default 5,000), so the
/// per-connector cap is what is measured.
const MAX_WINDOWS: usize = 10_000;
/// The wildcard segment's name.
const SEGMENT: &str = "mem";
/// Its domain.
const DOMAIN: &str = "mem.bench.test";
/// `[health] on_access_window_s`.
const WINDOW_S: u64 = 10;
/// `[health] on_access_retention_s`.
const RETENTION_S: u64 = 4;
/// Entries per report (`max_report_entries`).
const PER_REPORT: usize = 2000;
/// Accesses in flight.
const IN_FLIGHT: usize = 512;

fn config() -> String {
    format!(
        r#"[server]
grpc_listen = "127.0.0.1:1"
http_listen = "127.0.0.1:2"
anonymous_read = false

[selection]
strategy = "healthy"
discovery_timeout_ms = 100

[health]
on_access_window_s = {WINDOW_S}
on_access_retention_s = {RETENTION_S}
max_windows_per_connector = {MAX_WINDOWS}
max_windows_per_segment = {MAX_WINDOWS}

{shared}[[segments]]
name = "{SEGMENT}"
applications = ["*.{DOMAIN}"]
tcp_ports = ["443"]
health_reporting = "on_access"
report_interval_s = 60
connector_groups = ["{GROUP}"]
"#,
        shared = ca::shared_sections(),
    )
}

/// One report entry: `host:443` Up on 127.0.9.1, checked just now, echoing
/// `access_id` (the forwarded access's; empty for an unsolicited entry).
fn entry(host: String, rtt_us: u64, access_id: String) -> v1::ApplicationHealth {
    let up = v1::HealthStatus::Up as i32;
    v1::ApplicationHealth {
        app: Some(v1::ApplicationKey {
            segment: SEGMENT.to_owned(),
            host,
            protocol: v1::Protocol::Tcp as i32,
            port: 443,
        }),
        status: up,
        addresses: vec![v1::AddressResult {
            reason: None,
            certificate_not_after_unix_s: None,
            address: "127.0.9.1".to_owned(),
            status: up,
            method: v1::CheckMethod::Tcp as i32,
            rtt_us,
            failure: 0,
            detail: String::new(),
        }],
        checked_at_unix_ms: 0,
        dns_error: String::new(),
        expired: false,
        age_ms: 0,
        access_id,
    }
}

fn report(entries: Vec<v1::ApplicationHealth>, sequence: u64) -> v1::ConnectorMessage {
    v1::ConnectorMessage {
        kind: Some(In::Report(v1::HealthReport {
            applications: entries,
            full_state: false,
            sequence,
        })),
    }
}

/// Applications the CA lists for the segment (the wildcard's own row
/// included).
async fn held(http: &reqwest::Client, base: &str) -> Result<usize> {
    let v = ca::get_json(
        http,
        base,
        &format!("/api/v1/health?segment={SEGMENT}&per_page=1"),
    )
    .await?;
    v.get("total")
        .and_then(serde_json::Value::as_u64)
        .map(|t| t as usize)
        .ok_or_else(|| anyhow!("no total in the health listing: {v}"))
}

fn mib(bytes: u64, base: u64) -> f64 {
    bytes.saturating_sub(base) as f64 / f64::from(1u32 << 20)
}

/// Measures (quick: 2,000 accesses and 2,000 entries).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let n = mode.pick(2_000usize, 100_000);
    let (server, _dir) = ca::start_text(&config()).await?;
    let pid = server.pid();
    let base = format!("http://{}", server.http);
    let http = reqwest::Client::new();

    // The connector: answers each forwarded access with a report (batched
    // every 5 ms), and sends the unsolicited flood when told to.
    let (out_tx, out_rx) = mpsc::channel::<v1::ConnectorMessage>(64);
    let channel = sim::channels(&server.grpc_url(), 1)
        .await?
        .pop()
        .ok_or_else(|| anyhow!("no channel"))?;
    let id = Identity {
        name: "sim-onaccess".to_owned(),
        group: GROUP.to_owned(),
        key: KEY.to_owned(),
    };
    let mut inbound = sim::connect(
        channel.clone(),
        &id,
        tokio_stream::wrappers::ReceiverStream::new(out_rx),
    )
    .await?;
    let forwarded = Arc::new(AtomicU64::new(0));
    let answering = {
        let (out_tx, forwarded) = (out_tx.clone(), forwarded.clone());
        tokio::spawn(async move {
            let mut pending = Vec::new();
            let mut seq = 1u64 << 32;
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            loop {
                tokio::select! {
                    m = inbound.message() => match m {
                        Ok(Some(v1::AuthorityMessage { kind: Some(Out::Access(ev)) })) => {
                            if let Some(app) = ev.app {
                                forwarded.fetch_add(1, Ordering::Relaxed);
                                pending.push(entry(app.host, 300, ev.access_id));
                            }
                        }
                        Ok(Some(_)) => {}
                        _ => break,
                    },
                    _ = tick.tick() => {
                        while !pending.is_empty() {
                            let rest = pending.split_off(pending.len().min(PER_REPORT));
                            let batch = std::mem::replace(&mut pending, rest);
                            seq += 1;
                            if out_tx.send(report(batch, seq)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_connected = rss_bytes(pid);

    // The most the CA held and its largest RSS while the floods run,
    // sampled every 250 ms.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let sampler = {
        let (http, base) = (http.clone(), base.clone());
        tokio::spawn(async move {
            let (mut most, mut rss) = (0usize, 0u64);
            while !*stop_rx.borrow() {
                if let Ok(h) = held(&http, &base).await {
                    most = most.max(h);
                }
                rss = rss.max(rss_bytes(pid));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            (most, rss)
        })
    };

    // 100,000 accesses to distinct names under the wildcard.
    let t0 = Instant::now();
    let channels = sim::channels(&server.grpc_url(), 4).await?;
    let mut running = FuturesUnordered::new();
    let mut selected = 0usize;
    for i in 0..n {
        if running.len() >= IN_FLIGHT
            && let Some(r) = running.next().await
        {
            selected += usize::from(r?);
        }
        let ch = channels[i % channels.len()].clone();
        running.push(async move {
            let d = ca::resolve(ch, &format!("a{i}.{DOMAIN}"), 443).await?;
            Ok::<bool, anyhow::Error>(ca::selected(&d))
        });
    }
    while let Some(r) = running.next().await {
        selected += usize::from(r?);
    }
    let access_s = t0.elapsed().as_secs_f64();

    // 100,000 unsolicited entries for names nobody accessed.
    for (k, chunk) in (0..n).collect::<Vec<_>>().chunks(PER_REPORT).enumerate() {
        let batch = chunk
            .iter()
            .map(|i| entry(format!("r{i}.{DOMAIN}"), 300, String::new()))
            .collect();
        out_tx
            .send(report(batch, k as u64 + 1))
            .await
            .context("the connector's session ended during the report flood")?;
    }
    // Until the CA has taken them all (its received counter stops moving).
    let mut last = u64::MAX;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = ca::reports_received(&http, &base).await?;
        if now == last {
            break;
        }
        last = now;
    }
    let flood_s = t0.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    let (most, rss_most) = sampler.await.context("the sampler failed")?;
    let held_flood = most.max(held(&http, &base).await?);
    let rss_flood = rss_most.max(rss_bytes(pid));

    // The window, then the retention (plus the CA's housekeeping period).
    tokio::time::sleep(Duration::from_secs(WINDOW_S + RETENTION_S + 2)).await;
    let held_after = held(&http, &base).await?;
    let rss_after = rss_bytes(pid);
    answering.abort();
    drop(out_tx);

    let note = format!(
        "{n} accesses under *.{DOMAIN} in {access_s:.1} s ({selected} selected, {} forwarded to the connector), then {n} unsolicited entries ({flood_s:.1} s in all; most held and largest RSS sampled every 250 ms meanwhile); cap max_windows_per_connector = {MAX_WINDOWS}, window {WINDOW_S} s, retention {RETENTION_S} s; CA RSS connected {:.1} MiB",
        forwarded.load(Ordering::Relaxed),
        mib(rss_connected, 0)
    );
    Ok(vec![
        SPECS[0].figure(held_flood as f64, None, note.clone()),
        SPECS[1].figure(mib(rss_flood, rss_connected), None, note.clone()),
        SPECS[2].figure(held_after as f64, None, note.clone()),
        SPECS[3].figure(
            mib(rss_after, rss_connected),
            None,
            format!(
                "{note}; RSS is what the allocator kept from the OS, not what the CA holds: the application counts are the bound"
            ),
        ),
    ])
}
