//! The Health dashboard at 10,000 applications (issue 15): the bytes a
//! browser transfers for the first load of `/` (the page, its script and
//! style sheet, the overview and one page of 50 rows), against the
//! baseline of the whole listing as JSON (what a page showing every row
//! would fetch; the server-rendered page it replaced was larger still), and
//! how long the CA takes to answer one filtered page.
//!
//! One simulated connector reports every application first (one in ten
//! Down), so rows carry a connector's result with an address each.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use futures::StreamExt;

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
];

/// What the browser fetches on the first load of `/` (the API calls with
/// the parameters the script sends).
const FIRST_LOAD: &[&str] = &[
    "/",
    "/assets/dashboard.js",
    "/assets/dashboard.css",
    "/api/v1/health?per_page=50&page=1",
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

/// Measures (quick: 1,000 applications).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let apps = mode.pick(1_000usize, 10_000);
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
                 applications, median of 5 (the CA builds every row's view, then filters)"
            ),
        ),
    ])
}
