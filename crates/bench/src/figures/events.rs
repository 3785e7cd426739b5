//! The status history by segment: `GET /api/v1/events?segment=S` (first
//! page, with its total) against `GET /api/v1/events?app=…` for one
//! application, on a SQLite store holding 1,000,000 history rows (50
//! segments of 200 applications, rows interleaved in time), written
//! through the store API before the CA starts on it.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use central_authority::store::{EventRecord, Store, StoreLocation};

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::stats::median;

/// The figures.
pub const SPECS: &[Spec] = &[Spec {
    name: "events_segment_page_ms",
    unit: "ms",
    goal: Goal::RatioAtMost { ratio: 2.0 },
}];

const SEGMENTS: usize = 50;
const APPS_PER_SEGMENT: usize = 200;
/// Rows written per `record_events` call.
const BATCH: usize = 50_000;

fn host(s: usize, a: usize) -> String {
    format!("127.40.{s}.{}", a + 1)
}

/// Writes `rows` history rows into a fresh SQLite store at `path`, the
/// newest a minute ago, one a millisecond apart, round robin over every
/// application.
fn fill(path: std::path::PathBuf, rows: usize) -> Result<()> {
    let store = Store::open(&StoreLocation::Sqlite(path))?;
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let start = now_ms - 60_000 - rows as i64;
    let apps = SEGMENTS * APPS_PER_SEGMENT;
    let mut written = 0;
    while written < rows {
        let n = BATCH.min(rows - written);
        let events: Vec<EventRecord> = (written..written + n)
            .map(|i| {
                let app = i % apps;
                let up = (i / apps).is_multiple_of(2);
                let (from, to) = if up { ("down", "up") } else { ("up", "down") };
                EventRecord {
                    at_ms: start + i as i64,
                    segment: format!("hist-{}", app / APPS_PER_SEGMENT),
                    host: host(app / APPS_PER_SEGMENT, app % APPS_PER_SEGMENT),
                    protocol: "tcp".to_owned(),
                    port: i64::from(ca::APP_PORT),
                    connector: format!("hist-c{}", i % 4),
                    from: from.to_owned(),
                    to: to.to_owned(),
                    cause: "report".to_owned(),
                }
            })
            .collect();
        store.record_events(&events)?;
        written += n;
    }
    Ok(())
}

/// `GET {base}{path}`: its time and the page's `total`.
async fn timed(http: &reqwest::Client, base: &str, path: &str) -> Result<(f64, u64)> {
    let t0 = Instant::now();
    let page: serde_json::Value = ca::get_json(http, base, path).await?;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    let total = page["total"]
        .as_u64()
        .ok_or_else(|| anyhow!("{path}: no total in the answer"))?;
    Ok((ms, total))
}

/// Measures (quick: 100,000 rows).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let rows = mode.pick(100_000usize, 1_000_000);
    let dir = std::env::temp_dir().join(format!(
        "reach-bench-{}/events-{}",
        std::process::id(),
        rows
    ));
    let data = dir.join("reach-ca-data");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&data)?;
    let t0 = Instant::now();
    let db = data.join("reach.db");
    tokio::task::spawn_blocking(move || fill(db, rows))
        .await?
        .context("filling the history")?;
    let filled_s = t0.elapsed().as_secs_f64();
    let data_str = data
        .to_str()
        .ok_or_else(|| anyhow!("temporary path is not UTF-8"))?;
    let text = ca::config_text(&CaSetup {
        ingest_apps: 0,
        filler_segments: 0,
        ..CaSetup::default()
    })
    .replace(
        "[server]\n",
        &format!("[server]\ndata_dir = {data_str:?}\n"),
    );
    let (server, _dir) = ca::start_text(&text).await?;
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http);
    let per_app = rows / (SEGMENTS * APPS_PER_SEGMENT);
    let (mut by_segment, mut by_app) = (Vec::new(), Vec::new());
    let (mut segment_total, mut app_total) = (0, 0);
    let port = ca::APP_PORT;
    for k in 0..mode.pick(5, 21) + 1 {
        let s = k % SEGMENTS;
        let a = (k * 37) % APPS_PER_SEGMENT;
        let seg = timed(&http, &base, &format!("/api/v1/events?segment=hist-{s}")).await?;
        let app_path = format!("/api/v1/events?app=hist-{s}/{}/tcp/{port}", host(s, a));
        let app = timed(&http, &base, &app_path).await?;
        if k > 0 {
            // The first pair warms the connection and the page cache.
            by_segment.push(seg.0);
            by_app.push(app.0);
        }
        (segment_total, app_total) = (seg.1, app.1);
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    if segment_total != (per_app * APPS_PER_SEGMENT) as u64 || app_total != per_app as u64 {
        bail!(
            "the CA counted {segment_total} rows of a segment and {app_total} of an \
             application; {} and {per_app} were written",
            per_app * APPS_PER_SEGMENT
        );
    }
    Ok(vec![SPECS[0].figure(
        median(&by_segment),
        Some(median(&by_app)),
        format!(
            "{rows} history rows in SQLite ({SEGMENTS} segments × {APPS_PER_SEGMENT} applications, \
             written in {filled_s:.1} s through the store API); first page (100 rows, total \
             {segment_total}) of `?segment=`, median of {} alternating requests; baseline: \
             `?app=` (total {app_total}); max {:.1} ms vs {:.1} ms",
            by_segment.len(),
            by_segment.iter().copied().fold(0.0, f64::max),
            by_app.iter().copied().fold(0.0, f64::max),
        ),
    )])
}
