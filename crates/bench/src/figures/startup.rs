//! Start-up at scale: a CA (TLS, the default SQLite store) whose policy has
//! 100,000 applications and whose store holds 10,000 connectors enrolled
//! through the real `Enroll` RPC (`connector_agent::ca::enroll::enroll`). The
//! sites are small, as deployments at this scale are: two connectors per
//! connector group, each group with its own segment of 20 applications.
//! The CA is killed and started again on the same data directory; every
//! connector then re-attaches at once over mutual TLS with its enrolled
//! certificate and sends its full state (the `storm` group measures the
//! same restart with the agent's backoff). Figures: the time from the
//! process start to its `READY` line (configuration read, listening), to
//! `/healthz` 200 (ready: the store's connectors have all re-attached and
//! reported, `state::warmup`), to every session open and every full state
//! received (the table whole), and the CA's RSS after warm-up.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use connector_agent::ca::dial::{CaTarget, CaUrl};
use connector_agent::ca::enroll::{self, Enrollment};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::{Semaphore, watch};
use tonic::transport::Endpoint;

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::servers::Server;
use crate::sim::{self, Identity};
use crate::sys::rss_bytes;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "startup_listening_s",
        unit: "s",
        goal: Goal::Info,
    },
    Spec {
        name: "startup_ready_s",
        unit: "s",
        // The warm-up's own bound is 30 s; a CA at this scale is ready
        // well before it.
        goal: Goal::AtMost { limit: 30.0 },
    },
    Spec {
        name: "startup_whole_s",
        unit: "s",
        goal: Goal::AtMost { limit: 30.0 },
    },
    Spec {
        name: "startup_rss_mib",
        unit: "MiB",
        goal: Goal::AtMost { limit: 2048.0 },
    },
];

/// Connectors per connector group (a site's pair).
const PER_GROUP: usize = 2;
/// Applications per group's segment.
const APPS_PER_GROUP: usize = 20;
/// Sessions being opened at once (TLS handshake to `Welcome`): all 10,000
/// at once made the handshakes time out and retry without end on this
/// machine, as connectors without backoff would.
const DIALING: usize = 64;
/// How long the restart may take before the group gives up.
const LIMIT: Duration = Duration::from_secs(120);

/// The `k`-th application (127.40.0.1 onwards, 250 per /24).
fn host(k: usize) -> String {
    format!(
        "127.{}.{}.{}",
        40 + k / 62_500,
        (k / 250) % 250,
        k % 250 + 1
    )
}

fn group(g: usize) -> String {
    format!("site-{g:05}")
}

fn key(g: usize) -> String {
    format!("site-provisioning-key-{g:05}-nRf8MKQ2SU5DDJ0PprU0WC5O")
}

/// The CA's configuration: TLS, and `groups` groups with a segment each.
fn config(groups: usize) -> String {
    let mut s = ca::with_tls(
        &ca::config_text(&CaSetup {
            filler_segments: 0,
            ingest_apps: 0,
            ..CaSetup::default()
        }),
        "",
    );
    for g in 0..groups {
        let apps: Vec<String> = (g * APPS_PER_GROUP..(g + 1) * APPS_PER_GROUP)
            .map(|k| format!("\"{}\"", host(k)))
            .collect();
        s += &format!(
            "\n[[connector_groups]]\nname = \"{}\"\nprovisioning_key = \"{}\"\n\n\
             [[segments]]\nname = \"{}\"\napplications = [{}]\ntcp_ports = [\"{}\"]\n\
             health_reporting = \"continuous\"\nreport_interval_s = 60\n\
             connector_groups = [\"{}\"]\n",
            group(g),
            key(g),
            group(g),
            apps.join(", "),
            ca::APP_PORT,
            group(g)
        );
    }
    s
}

/// Enrolls connector `i` into `target`; its enrollment.
async fn enroll_one(
    target: &CaTarget,
    ca_pem: &str,
    states: &std::path::Path,
    i: usize,
) -> Result<Enrollment> {
    let name = format!("st-{i:05}");
    let dir = states.join(&name);
    std::fs::create_dir_all(&dir)?;
    let g = i / PER_GROUP;
    enroll::enroll(
        target,
        &connector_agent::ca::trust::Trust::fixed(ca_pem),
        &dir,
        &name,
        &group(g),
        &key(g).as_str().into(),
    )
    .await
    .with_context(|| format!("enrolling {name}"))
}

/// One connector after the restart: dials over mutual TLS until its
/// session opens, sends its full state, then heartbeats until `stop`.
async fn attach(
    url: String,
    enrollment: Enrollment,
    i: usize,
    live: Arc<AtomicUsize>,
    dialing: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) {
    let g = i / PER_GROUP;
    let id = Identity {
        name: format!("st-{i:05}"),
        group: group(g),
        key: key(g),
    };
    let results: Vec<(String, bool)> = (g * APPS_PER_GROUP..(g + 1) * APPS_PER_GROUP)
        .map(|k| (host(k), true))
        .collect();
    while !*stop.borrow() {
        let channel =
            match Endpoint::from_shared(url.clone()).and_then(|e| e.tls_config(enrollment.tls())) {
                Ok(e) => e.tcp_nodelay(true).connect_lazy(),
                Err(_) => return,
            };
        let full = sim::report_of(&group(g), ca::APP_PORT, &results, true);
        let beats = futures::stream::unfold(0u32, |k| async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Some((sim::heartbeat(k), k + 1))
        });
        let rest = futures::stream::once(async move { full }).chain(beats);
        let Ok(permit) = dialing.acquire().await else {
            return;
        };
        let opened = sim::connect(channel, &id, rest).await;
        drop(permit);
        if let Ok(mut inbound) = opened {
            live.fetch_add(1, Ordering::Relaxed);
            tokio::select! {
                _ = async { while let Ok(Some(_)) = inbound.message().await {} } => {}
                _ = stop.wait_for(|s| *s) => {}
            }
            live.fetch_sub(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the CA answers `/healthz` with 200.
async fn ready(http: &reqwest::Client, base: &str) -> bool {
    http.get(format!("{base}/healthz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

/// The times measured after the restart.
struct Restart {
    listening: f64,
    ready: f64,
    whole: f64,
    rss: u64,
}

/// Measures (quick: 2,000 applications, 200 connectors).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let n = mode.pick(200usize, 10_000);
    // This process holds every session; the CA (a child, same limit) the
    // other end of each.
    crate::sys::need_open_files(n as u64 + 1024, "startup's connectors")?;
    let groups = n / PER_GROUP;
    let (server, dir) = ca::start_text(&config(groups)).await?;
    let root = dir.join("reach-ca-data").join("ca.pem");
    let r = root.clone();
    ca::wait_until(Duration::from_secs(15), "the CA's root", || {
        let r = r.clone();
        async move { Ok(r.exists()) }
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ca_pem = std::fs::read_to_string(&root)?;
    let target = CaTarget {
        url: CaUrl::parse(&format!("https://{}", server.grpc)).map_err(|e| anyhow!(e))?,
        addr: None,
    };
    let states = dir.join("connectors");
    let t = Instant::now();
    let enrollments: Vec<Enrollment> = futures::stream::iter(0..n)
        .map(|i| enroll_one(&target, &ca_pem, &states, i))
        .buffered(16)
        .try_collect()
        .await?;
    let enrolled_s = t.elapsed().as_secs_f64();
    drop(server);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = restart(&dir, enrollments).await?;
    let label = format!(
        "{} applications in {groups} segments, one per connector group of {PER_GROUP}; {n} \
         connectors enrolled through Enroll ({enrolled_s:.0} s, 16 at a time) on the default \
         SQLite store, TLS; killed and started on the same data directory, every connector \
         re-attaching at once (at most {DIALING} handshakes in flight) over mutual TLS \
         (simulated connectors, real sessions) with its \
         full state; driver and CA on this shared 2-core machine{}",
        groups * APPS_PER_GROUP,
        if mode == Mode::Quick {
            " (quick mode: not 100,000 applications and 10,000 connectors)"
        } else {
            ""
        }
    );
    Ok(vec![
        SPECS[0].figure(r.listening, None, format!("process start to its READY line (configuration read and checked, listening); {label}")),
        SPECS[1].figure(r.ready, None, format!("process start to /healthz 200 (warm: every enrolled connector re-attached and sent its full state, state::warmup); {label}")),
        SPECS[2].figure(r.whole, None, format!("process start to every session open and every full state's results counted in reach_ca_reports_received_total; {label}")),
        SPECS[3].figure(r.rss as f64 / 1_048_576.0, None, format!("the restarted CA's RSS 2 s after the table was whole; {label}")),
    ])
}

/// Starts the CA again on `dir` and waits for the connectors.
async fn restart(dir: &std::path::Path, enrollments: Vec<Enrollment>) -> Result<Restart> {
    let n = enrollments.len();
    let config = dir.join("ca.toml");
    let path = config.to_str().context("temporary path is not UTF-8")?;
    let t0 = Instant::now();
    let server = Server::spawn(&["serve-ca", path]).await?;
    let listening = t0.elapsed().as_secs_f64();
    let url = format!("https://{}", server.grpc);
    let live = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop) = watch::channel(false);
    let dialing = Arc::new(Semaphore::new(DIALING));
    let tasks: Vec<_> = enrollments
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let (url, live, dialing) = (url.clone(), live.clone(), dialing.clone());
            tokio::spawn(attach(url, e, i, live, dialing, stop.clone()))
        })
        .collect();
    let root = dir.join("reach-ca-data").join("ca.pem");
    let http = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&std::fs::read(&root)?)?])
        .timeout(Duration::from_secs(5))
        .build()?;
    let base = format!("https://{}", server.http);
    let (mut ready_at, mut whole_at) = (None, None);
    let result = loop {
        let at = t0.elapsed().as_secs_f64();
        if ready_at.is_none() && ready(&http, &base).await {
            ready_at = Some(at);
        }
        // `reach_ca_reports_received_total` counts results, not reports:
        // whole is every connector's full state of its group's applications.
        let reports = ca::reports_received(&http, &base).await.unwrap_or(0);
        let sessions = live.load(Ordering::Relaxed);
        if whole_at.is_none() && sessions == n && reports >= (n * APPS_PER_GROUP) as u64 {
            whole_at = Some(at);
        }
        if let (Some(r), Some(w)) = (ready_at, whole_at) {
            break Ok((r, w));
        }
        if t0.elapsed() > LIMIT {
            break Err(anyhow!(
                "{sessions} of {n} sessions open, {reports} of {} results received, /healthz {} \
                 {LIMIT:?} after the restart",
                n * APPS_PER_GROUP,
                if ready_at.is_some() { "200" } else { "not 200" }
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = rss_bytes(server.pid());
    let _ = stop_tx.send(true);
    for t in tasks {
        t.abort();
    }
    let (ready, whole) = result?;
    Ok(Restart {
        listening,
        ready,
        whole,
        rss,
    })
}
