//! The Health dashboard at 10,000 applications: the bytes a
//! browser transfers for the first load of `/` (the page, its script and
//! style sheet, the overview and one page of 50 rows), against the
//! baseline of the whole listing as JSON (what a page showing every row
//! would fetch; the server-rendered page it replaced was larger still), and
//! how long the CA takes to answer one filtered page.
//!
//! One simulated connector reports every application first (one in ten
//! Down), so rows carry a connector's result with an address each.
//!
//! Then, in headless Chromium (WebDriver, `test_support::browser`), with
//! 10,000 applications and 500 connectors (50 groups of 10, each serving a
//! segment of 200 applications that all ten report): how long until the
//! first page of rows is shown, how long a change takes from the CA
//! receiving a report to the open page showing it, and the CA's CPU with
//! 20 dashboards open at rest. Without Chromium these three are reported
//! missing with the reason (the other figures do not need it).

use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use protocol::v1;
use test_support::browser::{self, Browser};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::sim::{self, Identity};

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "dashboard_first_load_kib",
        unit: "KiB",
        goal: Goal::AtMost { limit: 200.0 },
    },
    Spec {
        name: "dashboard_page_ms",
        unit: "ms",
        goal: Goal::Info,
    },
    Spec {
        name: "dashboard_interactive_ms",
        unit: "ms",
        goal: Goal::AtMost { limit: 1000.0 },
    },
    Spec {
        name: "dashboard_update_ms",
        unit: "ms",
        goal: Goal::AtMost { limit: 1000.0 },
    },
    Spec {
        name: "dashboard_rest_cpu_pct",
        unit: "% of a core",
        goal: Goal::AtMost { limit: 5.0 },
    },
    // The first-load goal holds at 500 connectors too: what the browser
    // transferred (its Resource Timing) by the time the rows showed.
    Spec {
        name: "dashboard_first_load_browser_kib",
        unit: "KiB",
        goal: Goal::AtMost { limit: 200.0 },
    },
];

/// What the browser fetches on the first load of `/` (the API calls with
/// the parameters the script sends).
pub(crate) const FIRST_LOAD: &[&str] = &[
    "/",
    "/assets/dashboard.js",
    "/assets/dashboard.css",
    "/api/v1/health?per_page=50&page=1&view=summary",
    "/api/v1/overview",
];

async fn body_bytes(http: &reqwest::Client, base: &str, path: &str) -> Result<usize> {
    let r = http
        .get(format!("{base}{path}"))
        .bearer_auth(ca::TOKEN)
        .send()
        .await?
        .error_for_status()?;
    Ok(r.bytes().await?.len())
}

/// Measures (quick: 1,000 applications; the browser figures with 1,000
/// applications, 50 connectors and 2 dashboards).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let mut figures = bytes_and_page_time(mode).await?;
    match browser::available() {
        Err(e) => {
            for spec in &SPECS[2..] {
                figures.push(spec.missing(format!("no browser: {e:#}")));
            }
        }
        Ok(()) => match in_browser(mode).await {
            Ok(f) => figures.extend(f),
            Err(e) => {
                for spec in &SPECS[2..] {
                    figures.push(spec.missing(format!("not measured: {e:#}")));
                }
            }
        },
    }
    Ok(figures)
}

/// The CA with `apps` applications of the `ingest` segment, each reported
/// once by one simulated connector (one in ten Down); returns it with the
/// connector's session task.
pub(crate) async fn reported_ca(
    apps: usize,
) -> Result<(crate::servers::Server, tokio::task::JoinHandle<()>)> {
    let server = ca::start(&CaSetup {
        ingest_apps: apps,
        filler_segments: 0,
        ..CaSetup::default()
    })
    .await?;
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http);

    // One connector reports every application once.
    let before = ca::reports_received(&http, &base).await?;
    let channel = sim::channels(&server.grpc_url(), 1).await?.remove(0);
    let id = Identity {
        name: "dashboard-0".to_owned(),
        group: ca::GROUP.to_owned(),
        key: ca::KEY.to_owned(),
    };
    let reports = futures::stream::iter(0..apps).map(|i| {
        sim::report(
            "ingest",
            &ca::ingest_host(i),
            ca::APP_PORT,
            i % 10 != 0,
            1234,
        )
    });
    let inbound = sim::connect(channel, &id, reports).await?;
    let session = sim::drain(inbound);
    ca::wait_until(Duration::from_secs(60), "every report handled", || {
        let (http, base) = (http.clone(), base.clone());
        async move { Ok(ca::reports_received(&http, &base).await? >= before + apps as u64) }
    })
    .await?;
    Ok((server, session))
}

async fn bytes_and_page_time(mode: Mode) -> Result<Vec<Figure>> {
    let apps = mode.pick(1_000usize, 10_000);
    let (server, session) = reported_ca(apps).await?;
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http);

    let mut first = 0;
    for path in FIRST_LOAD {
        first += body_bytes(&http, &base, path).await?;
    }
    let whole = body_bytes(&http, &base, "/api/v1/health").await?;
    if whole <= first {
        bail!("the whole listing ({whole} B) is not larger than one page ({first} B)");
    }
    // One filtered, sorted page, as the list asks for it (median of 5).
    let mut times = Vec::new();
    for _ in 0..5 {
        let t0 = Instant::now();
        body_bytes(
            &http,
            &base,
            "/api/v1/health?status=down&sort=host&per_page=50&page=2",
        )
        .await?;
        times.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    // The CA's CPU per page (robust to a loaded machine, unlike the time).
    let cpu0 = crate::sys::cpu_time(server.pid());
    const CPU_PAGES: u32 = 20;
    for _ in 0..CPU_PAGES {
        body_bytes(
            &http,
            &base,
            "/api/v1/health?status=down&sort=host&per_page=50&page=2",
        )
        .await?;
    }
    let cpu_ms = crate::sys::cpu_time(server.pid())
        .saturating_sub(cpu0)
        .as_secs_f64()
        * 1000.0
        / f64::from(CPU_PAGES);
    session.abort();
    drop(server);
    let kib = |b: usize| b as f64 / 1024.0;
    Ok(vec![
        SPECS[0].figure(
            kib(first),
            Some(kib(whole)),
            format!(
                "{apps} applications, one connector's result each: bytes of {} \
                 (uncompressed bodies); baseline: the whole listing `GET /api/v1/health`",
                FIRST_LOAD.join(", ")
            ),
        ),
        SPECS[1].figure(
            times[times.len() / 2],
            None,
            format!(
                "`GET /api/v1/health?status=down&sort=host&per_page=50&page=2` at {apps} \
                 applications, median of 5 (the CA filters, counts and sorts cheap rows, \
                 then builds the views of the page's 50 only); the CA's CPU per page: \
                 {cpu_ms:.1} ms (mean of 20)"
            ),
        ),
    ])
}

/// The browser figures' setup.
struct Fleet {
    groups: usize,
    per_group: usize,
    apps_per_segment: usize,
    dashboards: usize,
    rest: Duration,
}

/// The `g`-th segment's `i`-th application.
fn fleet_host(g: usize, i: usize) -> String {
    format!("127.30.{g}.{}", i + 1)
}

fn fleet_config(f: &Fleet) -> String {
    let mut s = ca::config_text(&CaSetup {
        ingest_apps: 0,
        filler_segments: 0,
        ..CaSetup::default()
    })
    // The browser reads without a token; the stream opens with a ticket
    // all the same.
    .replace("anonymous_read = false", "anonymous_read = true");
    for g in 0..f.groups {
        let apps: Vec<String> = (0..f.apps_per_segment)
            .map(|i| format!("\"{}\"", fleet_host(g, i)))
            .collect();
        let _ = write!(
            s,
            r#"
[[connector_groups]]
name = "dash-g{g}"
provisioning_key = "{key}"

[[segments]]
name = "dash-s{g}"
applications = [{apps}]
tcp_ports = ["{port}"]
health_reporting = "continuous"
report_interval_s = 60
connector_groups = ["dash-g{g}"]
"#,
            key = ca::KEY,
            apps = apps.join(", "),
            port = ca::APP_PORT,
        );
    }
    s
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

/// Waits until the page's script says `want` (a function body returning a
/// value, `null` while not there yet).
async fn page_wait(
    b: &Browser,
    script: &str,
    args: serde_json::Value,
    what: &str,
) -> Result<serde_json::Value> {
    let t0 = Instant::now();
    loop {
        let v = b.eval(script, args.clone()).await?;
        if !v.is_null() {
            return Ok(v);
        }
        if t0.elapsed() > Duration::from_secs(30) {
            bail!("{what}: not within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// When the list first showed rows (ms after navigation start), the bytes
/// the page transferred and how many pages of rows it fetched (so far).
const SHOWN: &str = r#"
const m = performance.getEntriesByName('reach-rows');
if (!m.length) return null;
const nav = performance.getEntriesByType('navigation')[0];
let bytes = nav ? nav.transferSize : 0;
let pages = 0;
for (const r of performance.getEntriesByType('resource')) {
  bytes += r.transferSize;
  if (r.name.includes('/api/v1/health?')) pages += 1;
}
return {ms: m[0].startTime, bytes, pages};
"#;

/// The domain whose names the browser resolves to the CA (one origin per
/// dashboard at rest).
const DASH_DOMAIN: &str = "reach.test";

/// The stream is open.
const LIVE: &str = "const e = document.getElementById('live'); return e && e.dataset.live === 'live' ? true : null;";

/// Notes the time (Unix ms) at which the row `arguments[0]` first shows
/// connector `arguments[1]` with status `arguments[2]`.
const WATCH: &str = r#"
const [key, conn, want] = arguments;
window.__seen = null;
const check = () => {
  if (window.__seen) return;
  const tr = [...document.querySelectorAll('tr[data-app]')].find((r) => r.dataset.app === key);
  const s = tr && tr.querySelector(`[data-connector="${conn}"] [data-status]`);
  if (s && s.dataset.status === want) window.__seen = Date.now();
};
if (window.__observer) window.__observer.disconnect();
window.__observer = new MutationObserver(check);
window.__observer.observe(document.querySelector('#applications tbody'), { subtree: true, childList: true, attributes: true });
check();
return true;
"#;

async fn in_browser(mode: Mode) -> Result<Vec<Figure>> {
    let f = mode.pick(
        Fleet {
            groups: 5,
            per_group: 10,
            apps_per_segment: 200,
            dashboards: 2,
            rest: Duration::from_secs(3),
        },
        Fleet {
            groups: 50,
            per_group: 10,
            apps_per_segment: 200,
            dashboards: 20,
            rest: Duration::from_secs(15),
        },
    );
    let apps = f.groups * f.apps_per_segment;
    let connectors = f.groups * f.per_group;
    let server = ca::start_text(&fleet_config(&f)).await?.0;
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http);
    let before = ca::reports_received(&http, &base).await?;

    // Every connector opens its session and reports its segment (all Up);
    // one sender per connector stays open for heartbeats and changes.
    let channels = sim::channels(&server.grpc_url(), connectors.div_ceil(50)).await?;
    let mut senders = Vec::with_capacity(connectors);
    let mut sessions = Vec::with_capacity(connectors);
    for g in 0..f.groups {
        for c in 0..f.per_group {
            let (tx, rx) = mpsc::channel::<v1::ConnectorMessage>(f.apps_per_segment + 16);
            for i in 0..f.apps_per_segment {
                tx.send(sim::report(
                    &format!("dash-s{g}"),
                    &fleet_host(g, i),
                    ca::APP_PORT,
                    true,
                    1500,
                ))
                .await?;
            }
            let id = Identity {
                name: format!("dash-{g}-{c}"),
                group: format!("dash-g{g}"),
                key: ca::KEY.to_owned(),
            };
            let channel = channels[senders.len() % channels.len()].clone();
            let inbound = sim::connect(channel, &id, ReceiverStream::new(rx)).await?;
            sessions.push(sim::drain(inbound));
            // Heartbeats from the start (inside the CA's 5 s interval):
            // connecting 500 sessions takes longer than the CA waits for
            // a silent one.
            let beat = tx.clone();
            sessions.push(tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(4)).await;
                    if beat.send(sim::heartbeat(0)).await.is_err() {
                        break;
                    }
                }
            }));
            senders.push(tx);
        }
    }
    let total = (connectors * f.apps_per_segment) as u64;
    ca::wait_until(Duration::from_secs(120), "every report handled", || {
        let (http, base) = (http.clone(), base.clone());
        async move { Ok(ca::reports_received(&http, &base).await? >= before + total) }
    })
    .await?;
    let profile = std::env::temp_dir()
        .join(format!("reach-bench-{}", std::process::id()))
        .join("chromium");
    // The 20 dashboards at rest are opened from 20 origins (host names of
    // one loopback CA): the tabs of one origin share one change stream over
    // HTTP/1.1 (the CA runs without TLS here), and 20 operators' browsers
    // hold 20 streams.
    let b = Browser::start_with(
        &profile,
        &[
            format!("--host-resolver-rules=MAP *.{DASH_DOMAIN} 127.0.0.1"),
            // Plain http:// to the CA, never tried as https:// first.
            "--disable-features=HttpsUpgrades".to_owned(),
        ],
    )
    .await?;
    let result = measure_in(&b, &f, &server, &base, &senders).await;
    b.close().await;
    for s in sessions {
        s.abort();
    }
    drop(server);
    let (interactive, (bytes, pages), updates, cpu, cpu_idle) = result?;
    let setup = format!(
        "{apps} applications, {connectors} connectors ({} groups of {}, each serving a segment of {} \
         applications that all its connectors report), headless Chromium",
        f.groups, f.per_group, f.apps_per_segment
    );
    Ok(vec![
        SPECS[2].figure(
            crate::stats::median(&interactive),
            None,
            format!(
                "{setup}: navigation start to the first page of rows shown (`/`, 50 rows), \
                 median of {} loads ({}); the last load had transferred {:.1} KiB \
                 ({pages} page(s) of rows fetched) when its rows showed",
                interactive.len(),
                interactive
                    .iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                bytes / 1024.0
            ),
        ),
        SPECS[3].figure(
            updates.iter().copied().fold(0.0, f64::max),
            None,
            format!(
                "{setup}: from sending one connector's report to the open page showing the \
                 changed status in its row (loopback, so ≈ the CA receiving it), worst of {} \
                 ({} ms)",
                updates.len(),
                updates
                    .iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        SPECS[4].figure(
            cpu,
            Some(cpu_idle),
            format!(
                "{setup}: the CA's CPU over {} s with {} dashboards open and live (each \
                 from its own origin, so each holds its own change stream: the tabs of one \
                 origin share one over HTTP/1.1), no transitions, connectors heartbeating \
                 every 4 s; baseline: the same without dashboards",
                f.rest.as_secs(),
                f.dashboards
            ),
        ),
        SPECS[5].figure(
            bytes / 1024.0,
            None,
            format!(
                "{setup}: what the browser transferred for the last measured load of `/`                  (navigation and every resource, Resource Timing `transferSize`,                  uncompressed) when its first page of rows showed ({pages} page(s) of rows)"
            ),
        ),
    ])
}

/// (interactive ms per load, bytes of a load and its pages of rows fetched,
/// update ms per change, CPU % with dashboards, CPU % without).
type Measured = (Vec<f64>, (f64, u64), Vec<f64>, f64, f64);

async fn measure_in(
    b: &Browser,
    f: &Fleet,
    server: &crate::servers::Server,
    base: &str,
    senders: &[mpsc::Sender<v1::ConnectorMessage>],
) -> Result<Measured> {
    let cpu_pct = |d: Duration| {
        let pid = server.pid();
        async move {
            let c0 = crate::sys::cpu_time(pid);
            let t0 = Instant::now();
            tokio::time::sleep(d).await;
            let used = crate::sys::cpu_time(pid).saturating_sub(c0);
            used.as_secs_f64() / t0.elapsed().as_secs_f64() * 100.0
        }
    };
    // At rest without a dashboard (connectors heartbeating only).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cpu_idle = cpu_pct(f.rest).await;

    // Interactive: fresh navigations of the list.
    let mut interactive = Vec::new();
    let mut bytes = 0.0;
    let mut pages = 0;
    for load in 1..=5 {
        b.goto("about:blank").await?;
        b.goto(&format!("{base}/"))
            .await
            .with_context(|| format!("load {load} of the list"))?;
        let v = page_wait(
            b,
            SHOWN,
            serde_json::json!([]),
            &format!("load {load}: rows shown"),
        )
        .await?;
        interactive.push(v["ms"].as_f64().context("no time")?);
        bytes = v["bytes"].as_f64().unwrap_or(0.0);
        pages = v["pages"].as_u64().unwrap_or(0);
    }

    // Updates: the first segment's first application, one connector's
    // status flipped back and forth while the page watches its row.
    b.goto(&format!("{base}/?segment=dash-s0"))
        .await
        .context("the list of segment dash-s0")?;
    page_wait(b, LIVE, serde_json::json!([]), "stream live").await?;
    let key = format!("dash-s0/{}/tcp/{}", fleet_host(0, 0), ca::APP_PORT);
    let mut updates = Vec::new();
    for trial in 0..6 {
        let up = trial % 2 == 1;
        let want = if up { "up" } else { "down" };
        b.eval(WATCH, serde_json::json!([key, "dash-0-0", want]))
            .await?;
        let sent = now_ms();
        senders[0]
            .send(sim::report(
                "dash-s0",
                &fleet_host(0, 0),
                ca::APP_PORT,
                up,
                1500,
            ))
            .await?;
        let seen = page_wait(
            b,
            "return window.__seen || null",
            serde_json::json!([]),
            "change shown",
        )
        .await?;
        updates.push(seen.as_f64().context("no time")? - sent);
    }

    // At rest with dashboards open: one per tab, each live, each from its
    // own origin (so its own stream).
    let port = server.http.port();
    for i in 0..f.dashboards {
        if i > 0 {
            b.new_tab().await?;
        }
        let url = format!("http://dash{i}.{DASH_DOMAIN}:{port}/");
        b.goto(&url)
            .await
            .with_context(|| format!("dashboard {} of {}: loading {url}", i + 1, f.dashboards))?;
        page_wait(
            b,
            LIVE,
            serde_json::json!([]),
            &format!("dashboard {} of {}: stream live", i + 1, f.dashboards),
        )
        .await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu = cpu_pct(f.rest).await;
    Ok((interactive, (bytes, pages), updates, cpu, cpu_idle))
}
