//! CA scale: one CA with 10,000 simulated connectors connected (many
//! sessions per HTTP/2 connection, each sending heartbeats at the CA's
//! interval, spread evenly over it). Figures: the CA's RSS, and whether it
//! handles the heartbeats without backlog — after the connectors stop
//! sending, how long until the CA's connector list shows every connector's
//! last heartbeat.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::watch;

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::sim::{self, Identity};
use crate::sys::{cpu_time, rss_bytes};

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "ca_10k_connectors_rss_mib",
        unit: "MiB",
        goal: Goal::AtMost { limit: 2048.0 },
    },
    Spec {
        name: "ca_10k_heartbeat_lag_s",
        unit: "s",
        goal: Goal::AtMost { limit: 1.0 },
    },
    Spec {
        name: "ca_10k_cpu_percent",
        unit: "% of a core",
        goal: Goal::Info,
    },
];

/// Sessions per HTTP/2 connection (the CA allows 64 streams per connection
/// by default).
const PER_CHANNEL: usize = 50;

/// Measures (quick: 200 connectors, 1 s heartbeats).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let n = mode.pick(200usize, 10_000);
    let interval = mode.pick(Duration::from_secs(1), Duration::from_secs(5));
    let steady = mode.pick(Duration::from_secs(2), Duration::from_secs(20));
    let server = ca::start(&CaSetup {
        heartbeat_ms: interval.as_millis() as u64,
        ..CaSetup::default()
    })
    .await?;
    let pid = server.pid();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle_rss = rss_bytes(pid);

    let channels = sim::channels(&server.grpc_url(), n.div_ceil(PER_CHANNEL)).await?;
    let last: Arc<Vec<AtomicU32>> = Arc::new((0..n).map(|_| AtomicU32::new(0)).collect());
    let (stop_tx, stop_rx) = watch::channel(false);
    let t_connect = Instant::now();
    let start = tokio::time::Instant::now() + Duration::from_millis(500);
    let mut sessions = Vec::with_capacity(n);
    let mut connecting = FuturesUnordered::new();
    for i in 0..n {
        let ch = channels[i / PER_CHANNEL].clone();
        let (last, stop) = (last.clone(), stop_rx.clone());
        let phase = interval.mul_f64(i as f64 / n as f64);
        connecting.push(async move {
            let id = Identity {
                name: format!("sim-{i:05}"),
                group: ca::GROUP.to_owned(),
                key: ca::KEY.to_owned(),
            };
            // Heartbeat k (k = 1, 2, …) goes at start + phase + k·interval,
            // until stopped; the session then stays open without sending.
            let beats = futures::stream::unfold(1u32, move |k| {
                let (last, mut stop) = (last.clone(), stop.clone());
                async move {
                    let at = start + phase + interval * k;
                    let woke = tokio::select! {
                        () = tokio::time::sleep_until(at) => false,
                        r = stop.wait_for(|s| *s) => r.is_ok(),
                    };
                    let stopped = woke || *stop.borrow();
                    if stopped {
                        std::future::pending::<()>().await;
                    }
                    last[i].store(k, Ordering::Relaxed);
                    Some((sim::heartbeat(k), k + 1))
                }
            });
            sim::connect(ch, &id, beats).await
        });
        // At most 500 session openings in flight.
        if connecting.len() >= 500
            && let Some(r) = connecting.next().await
        {
            sessions.push(sim::drain(r?));
        }
    }
    while let Some(r) = connecting.next().await {
        sessions.push(sim::drain(r?));
    }
    let connect_s = t_connect.elapsed().as_secs_f64();

    let cpu0 = cpu_time(pid);
    let t0 = Instant::now();
    tokio::time::sleep(steady).await;
    let cpu = cpu_time(pid).saturating_sub(cpu0).as_secs_f64() / t0.elapsed().as_secs_f64();
    let rss = rss_bytes(pid);
    let _ = stop_tx.send(true);
    let t_stop = Instant::now();
    let sent: Vec<u32> = last.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    let beats: u64 = sent.iter().map(|&k| u64::from(k)).sum();

    // How long until the CA shows every connector's last heartbeat.
    let ch = channels[0].clone();
    let mut lagging;
    let lag = loop {
        lagging = ca::behind(ch.clone(), &sent).await?;
        if lagging == 0 || t_stop.elapsed() > Duration::from_secs(10) {
            break t_stop.elapsed().as_secs_f64();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let connected = sent.iter().filter(|k| **k > 0).count();
    for s in sessions {
        s.abort();
    }
    drop(server);

    let mib = |b: u64| b as f64 / 1048576.0;
    let label = if n == 10_000 {
        String::new()
    } else {
        format!(" (quick mode: {n} connectors, not 10,000)")
    };
    let lag_note = if lagging == 0 {
        format!("every connector's last heartbeat visible {lag:.2} s after the last was sent")
    } else {
        format!(
            "{lagging} connectors' last heartbeats still not handled {lag:.1} s after sending stopped"
        )
    };
    let mut lag_fig = SPECS[1].figure(
        lag,
        None,
        format!(
            "{connected} connectors sent {beats} heartbeats in {:.0} s ({:.0}/s, one per {} ms each); {lag_note}{label}",
            steady.as_secs_f64(),
            n as f64 / interval.as_secs_f64(),
            interval.as_millis()
        ),
    );
    if lagging > 0 {
        lag_fig.met = Some(false);
    }
    Ok(vec![
        SPECS[0].figure(
            mib(rss),
            None,
            format!(
                "CA RSS with {n} sessions over {} HTTP/2 connections (idle CA: {:.1} MiB; all \
                 connected in {connect_s:.1} s){label}",
                channels.len(),
                mib(idle_rss)
            ),
        ),
        lag_fig,
        SPECS[2].figure(
            cpu * 100.0,
            None,
            format!(
                "CA process CPU during the {:.0} s of steady heartbeats{label}",
                steady.as_secs_f64()
            ),
        ),
    ])
}
