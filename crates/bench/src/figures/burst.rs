//! Burst delivery: one connector reporting 10,000 applications disconnects,
//! which makes one batch of 10,000 changes (each result Unknown); how long
//! from the disconnect until the last of them reaches a gRPC `WatchHealth`
//! subscriber and an HTTP `/api/v1/health/stream` reader, both reading as
//! fast as they can, and how many transitions they were told they missed
//! (`lagged`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use protocol::v1;
use protocol::v1::health_query_client::HealthQueryClient;

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::sim::{self, Identity};

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "burst_watch_last_ms",
        unit: "ms",
        goal: Goal::Info,
    },
    Spec {
        name: "burst_stream_last_ms",
        unit: "ms",
        goal: Goal::Info,
    },
    Spec {
        name: "burst_lagged",
        unit: "transitions",
        goal: Goal::AtMost { limit: 0.0 },
    },
];

/// What a subscriber saw: transitions, `lagged` totals, and when it got
/// its `want`-th transition.
#[derive(Default)]
struct Seen {
    count: AtomicU64,
    lagged: AtomicU64,
    done: std::sync::Mutex<Option<Instant>>,
}

impl Seen {
    fn add(&self, want: u64) {
        if self.count.fetch_add(1, Ordering::Relaxed) + 1 == want
            && let Ok(mut d) = self.done.lock()
        {
            *d = Some(Instant::now());
        }
    }

    fn done(&self) -> Option<Instant> {
        self.done.lock().ok().and_then(|d| *d)
    }
}

/// Reads `WatchHealth` (segment `ingest`) into `seen` until it ends.
async fn watch(channel: tonic::transport::Channel, seen: Arc<Seen>, want: u64) -> Result<()> {
    let mut client = HealthQueryClient::new(channel).max_decoding_message_size(64 << 20);
    let mut stream = client
        .watch_health(ca::authorized(v1::WatchHealthRequest {
            segment: "ingest".to_owned(),
            connector: String::new(),
        })?)
        .await?
        .into_inner();
    while let Some(t) = stream.message().await? {
        if t.lagged > 0 {
            seen.lagged.fetch_add(t.lagged, Ordering::Relaxed);
        } else {
            seen.add(want);
        }
    }
    Ok(())
}

/// Reads `/api/v1/health/stream` into `seen` until it ends; `ready` is set
/// at its `hello`.
async fn stream(base: String, seen: Arc<Seen>, want: u64, ready: Arc<AtomicU64>) -> Result<()> {
    let mut r = reqwest::Client::new()
        .get(format!("{base}/api/v1/health/stream"))
        .bearer_auth(ca::TOKEN)
        .send()
        .await?
        .error_for_status()?;
    let mut buf = Vec::new();
    while let Some(chunk) = r.chunk().await? {
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let name = text.lines().find_map(|l| l.strip_prefix("event:"));
            let data = text.lines().find_map(|l| l.strip_prefix("data:"));
            match name.map(str::trim) {
                Some("hello") => {
                    ready.store(1, Ordering::Relaxed);
                }
                Some("transition") => seen.add(want),
                Some("lagged") => {
                    let n = data.and_then(|d| d.trim().parse::<u64>().ok()).unwrap_or(1);
                    seen.lagged.fetch_add(n, Ordering::Relaxed);
                }
                _ => {}
            }
        }
    }
    Ok(())
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
    let base = format!("http://{}", server.http);
    // Each subscriber gets the reports' changes (Unknown to Up), then the
    // disconnect's (Up to Unknown).
    let want = 2 * apps as u64;
    let (grpc_seen, http_seen) = (Arc::new(Seen::default()), Arc::new(Seen::default()));
    let ready = Arc::new(AtomicU64::new(0));
    let channel = sim::channels(&server.grpc_url(), 1).await?.remove(0);
    let watcher = tokio::spawn(watch(channel, grpc_seen.clone(), want));
    let reader = tokio::spawn(stream(base.clone(), http_seen.clone(), want, ready.clone()));
    ca::wait_until(Duration::from_secs(10), "the stream's hello", || {
        let ready = ready.clone();
        async move { Ok(ready.load(Ordering::Relaxed) == 1) }
    })
    .await?;
    // The watch is open once the CA counts it (no hello over gRPC): give
    // it the time the HTTP stream took, and check the count below.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let id = Identity {
        name: "burst-0".to_owned(),
        group: ca::GROUP.to_owned(),
        key: ca::KEY.to_owned(),
    };
    let session_channel = sim::channels(&server.grpc_url(), 1).await?.remove(0);
    let inbound = sim::connect(
        session_channel,
        &id,
        tokio_stream::wrappers::ReceiverStream::new(rx),
    )
    .await?;
    let session = sim::drain(inbound);
    tx.send(sim::heartbeat(0)).await?;
    for i in 0..apps {
        let report = sim::report("ingest", &ca::ingest_host(i), ca::APP_PORT, true, 1234);
        tx.send(report).await?;
    }
    let half = apps as u64;
    ca::wait_until(
        Duration::from_secs(60),
        "every report's change delivered",
        || {
            let (g, h) = (grpc_seen.clone(), http_seen.clone());
            async move {
                Ok(g.count.load(Ordering::Relaxed) >= half
                    && h.count.load(Ordering::Relaxed) >= half)
            }
        },
    )
    .await?;
    let (g0, h0) = (
        grpc_seen.count.load(Ordering::Relaxed),
        http_seen.count.load(Ordering::Relaxed),
    );
    if g0 != half || h0 != half {
        bail!("before the disconnect: {g0} and {h0} changes delivered, {half} expected");
    }
    // The disconnect: the session's both directions end at once.
    let t0 = Instant::now();
    drop(tx);
    session.abort();
    let limit = Duration::from_secs(60);
    let wait = ca::wait_until(limit, "every disconnect change delivered", || {
        let (g, h) = (grpc_seen.clone(), http_seen.clone());
        async move { Ok(g.done().is_some() && h.done().is_some()) }
    })
    .await;
    drop(server);
    let outcome = (
        watcher.await.map_err(|e| anyhow!("{e}")),
        reader.await.map_err(|e| anyhow!("{e}")),
    );
    let counts = format!(
        "gRPC {} and HTTP {} of {want} changes delivered, lagged {} and {}",
        grpc_seen.count.load(Ordering::Relaxed),
        http_seen.count.load(Ordering::Relaxed),
        grpc_seen.lagged.load(Ordering::Relaxed),
        http_seen.lagged.load(Ordering::Relaxed),
    );
    wait.with_context(|| format!("{counts}; readers ended with {outcome:?}"))?;
    let last = |s: &Seen| {
        s.done()
            .map(|d| d.saturating_duration_since(t0).as_secs_f64() * 1000.0)
            .unwrap_or(f64::NAN)
    };
    let lagged =
        grpc_seen.lagged.load(Ordering::Relaxed) + http_seen.lagged.load(Ordering::Relaxed);
    let note = format!(
        "{apps} applications reported Up by one simulated connector, which then disconnects: \
         {apps} changes in one batch; time from the disconnect to the last change read"
    );
    Ok(vec![
        SPECS[0].figure(
            last(&grpc_seen),
            None,
            format!("{note} by a gRPC WatchHealth subscriber (segment filter)"),
        ),
        SPECS[1].figure(
            last(&http_seen),
            None,
            format!("{note} by an HTTP /api/v1/health/stream reader (SSE, parsed)"),
        ),
        SPECS[2].figure(
            lagged as f64,
            None,
            format!("`lagged` transitions told to both subscribers over the run; {counts}"),
        ),
    ])
}
