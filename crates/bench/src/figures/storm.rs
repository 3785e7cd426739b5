//! Reconnect storm: 10,000 simulated connectors (real gRPC sessions, 50 per
//! HTTP/2 connection) are connected to a CA that is then killed and started
//! again on the same data directory. Every connector reconnects as
//! `connector-agent` does (`connector_agent::retry`: full-jitter backoff from
//! 0.5 s doubling to 30 s), so the storm's shape is the real one. Figures:
//! the time from the new CA's start until every connector has a session
//! again (the table whole), the peak connection attempts per second the CA
//! saw, sessions it refused, and its peak CPU and RSS during the storm.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::servers::Server;
use crate::sim::{self, Identity};
use crate::sys::peak_usage;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "storm_10k_whole_s",
        unit: "s",
        // The outage plus connector-agent's longest backoff (30 s): the
        // last connector is back when its backoff ends, however fast the CA.
        goal: Goal::AtMost { limit: 35.0 },
    },
    Spec {
        name: "storm_10k_attempts_per_s_peak",
        unit: "attempts/s",
        goal: Goal::Info,
    },
    Spec {
        name: "storm_10k_refused",
        unit: "sessions",
        goal: Goal::AtMost { limit: 0.0 },
    },
    Spec {
        name: "storm_10k_peak_cpu_percent",
        unit: "% of a core",
        goal: Goal::Info,
    },
    Spec {
        name: "storm_10k_peak_rss_mib",
        unit: "MiB",
        goal: Goal::Info,
    },
];

/// Sessions per HTTP/2 connection (the CA allows 64 streams per connection).
const PER_CHANNEL: usize = 50;
/// How long the storm may take before the group gives up.
const LIMIT: Duration = Duration::from_secs(90);
/// Attempt counters: one per second since the new CA started.
const SECONDS: usize = 120;

/// What the simulated connectors share.
struct Fleet {
    /// The CA's current connections (replaced when it restarts).
    channels: watch::Receiver<Arc<Vec<Channel>>>,
    /// When the new CA started (attempts are counted from then).
    restarted: watch::Receiver<Option<Instant>>,
    /// Attempts per second since the restart.
    attempts: Vec<AtomicU64>,
    /// Sessions the new CA refused.
    refused: AtomicU64,
    /// Connectors with a live session.
    live: AtomicUsize,
    heartbeat: Duration,
}

fn lazy_channels(server: &Server, n: usize) -> Result<Arc<Vec<Channel>>> {
    let url = server.grpc_url();
    let mut out = Vec::new();
    for _ in 0..n.div_ceil(PER_CHANNEL) {
        out.push(
            Endpoint::from_shared(url.clone())?
                .tcp_nodelay(true)
                .connect_lazy(),
        );
    }
    Ok(Arc::new(out))
}

/// One connector: a session, and after it ends, reconnects with backoff.
async fn connector(fleet: Arc<Fleet>, i: usize, mut stop: watch::Receiver<bool>) {
    let id = Identity {
        name: format!("sim-{i:05}"),
        group: ca::GROUP.to_owned(),
        key: ca::KEY.to_owned(),
    };
    let mut attempt = 0u32;
    while !*stop.borrow() {
        // The restart time first: once it is set, the channels are the new
        // CA's (they are replaced before it is set).
        let restarted = *fleet.restarted.borrow();
        let channel = fleet.channels.borrow()[i / PER_CHANNEL].clone();
        if let Some(t) = restarted {
            let s = (t.elapsed().as_secs() as usize).min(SECONDS - 1);
            fleet.attempts[s].fetch_add(1, Ordering::Relaxed);
        }
        let every = fleet.heartbeat;
        let beats = futures::stream::unfold(0u32, move |k| async move {
            tokio::time::sleep(every).await;
            Some((sim::heartbeat(k), k + 1))
        });
        match sim::connect(channel, &id, beats).await {
            Ok(mut inbound) => {
                attempt = 0;
                fleet.live.fetch_add(1, Ordering::Relaxed);
                tokio::select! {
                    _ = async { while let Ok(Some(_)) = inbound.message().await {} } => {}
                    _ = stop.wait_for(|s| *s) => {}
                }
                fleet.live.fetch_sub(1, Ordering::Relaxed);
            }
            // Only the new CA's refusals count: before it started, a failed
            // attempt is the CA being away.
            Err(_) if restarted.is_some() => {
                fleet.refused.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {}
        }
        let wait = connector_agent::retry::backoff(attempt, &mut rand::rng());
        attempt = attempt.saturating_add(1);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }
}

/// Measures (quick: 200 connectors).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let n = mode.pick(200usize, 10_000);
    crate::sys::need_open_files(n as u64 + 1024, "storm's connectors")?;
    let setup = CaSetup {
        heartbeat_ms: 5000,
        ..CaSetup::default()
    };
    let (server, dir) = ca::start_text(&ca::config_text(&setup)).await?;
    let (channels_tx, channels) = watch::channel(lazy_channels(&server, n)?);
    let (restarted_tx, restarted) = watch::channel(None);
    let fleet = Arc::new(Fleet {
        channels,
        restarted,
        attempts: (0..SECONDS).map(|_| AtomicU64::new(0)).collect(),
        refused: AtomicU64::new(0),
        live: AtomicUsize::new(0),
        heartbeat: Duration::from_millis(setup.heartbeat_ms),
    });
    let (stop_tx, stop) = watch::channel(false);
    let tasks: Vec<_> = (0..n)
        .map(|i| tokio::spawn(connector(fleet.clone(), i, stop.clone())))
        .collect();
    ca::wait_until(LIMIT, "every simulated connector connected", || {
        let live = fleet.live.load(Ordering::Relaxed);
        async move { Ok(live == n) }
    })
    .await?;
    // The crash: the CA is killed; the new one starts on the same data
    // directory a second later, on new ports.
    drop(server);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let config = dir.join("ca.toml");
    let path = config.to_str().context("temporary path is not UTF-8")?;
    let server = Server::spawn(&["serve-ca", path]).await?;
    let started = Instant::now();
    let (done_tx, done) = watch::channel(false);
    let sampler = tokio::spawn(peak_usage(server.pid(), done));
    channels_tx.send(lazy_channels(&server, n)?)?;
    restarted_tx.send(Some(started))?;
    let (mut half, mut most) = (None, None);
    let whole = ca::wait_until(LIMIT, "every simulated connector back", || {
        let live = fleet.live.load(Ordering::Relaxed);
        if live * 2 >= n {
            half.get_or_insert(started.elapsed().as_secs_f64());
        }
        if live * 100 >= n * 99 {
            most.get_or_insert(started.elapsed().as_secs_f64());
        }
        async move { Ok(live == n) }
    })
    .await;
    let whole_s = started.elapsed().as_secs_f64();
    let (half, most) = (half.unwrap_or(whole_s), most.unwrap_or(whole_s));
    let _ = done_tx.send(true);
    let (cpu, rss) = sampler.await?;
    let _ = stop_tx.send(true);
    for t in tasks {
        t.abort();
    }
    let peak = fleet
        .attempts
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    let total: u64 = fleet
        .attempts
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum();
    let refused = fleet.refused.load(Ordering::Relaxed);
    drop(server);
    let label = if n == 10_000 {
        String::new()
    } else {
        format!(" (quick mode: {n} connectors, not 10,000)")
    };
    let whole_fig = match whole {
        Ok(_) => SPECS[0].figure(
            whole_s,
            None,
            format!("{n} connectors with a session again {whole_s:.1} s after the new CA started (half after {half:.1} s, 99 % after {most:.1} s; killed, restarted a second later; the tail is the connectors' backoff, full jitter up to 30 s){label}"),
        ),
        Err(e) => SPECS[0].missing(format!("{e:#}{label}")),
    };
    Ok(vec![
        whole_fig,
        SPECS[1].figure(
            peak as f64,
            None,
            format!("{total} attempts after the restart in all{label}"),
        ),
        SPECS[2].figure(
            refused as f64,
            None,
            format!("sessions the new CA refused during the storm{label}"),
        ),
        SPECS[3].figure(
            cpu * 100.0,
            None,
            format!("the new CA's busiest 500 ms until the table was whole{label}"),
        ),
        SPECS[4].figure(
            rss as f64 / 1048576.0,
            None,
            format!("the new CA's largest RSS until the table was whole{label}"),
        ),
    ])
}
