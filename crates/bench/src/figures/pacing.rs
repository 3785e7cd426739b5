//! Pacing precision at 20 checks/s: the agent's pacer (governor on an ideal
//! timeline plus a one-second window) starting real checks against loopback
//! listeners, next to a bare governor `until_ready` loop with burst 1 that
//! opens the same connections to listeners of its own, run at the same
//! time. Every figure is read at the listeners (the instant each connection
//! was accepted), not from the pacer's own slot times, which its window
//! enforces by construction: the long-run rate, the wall time 6,000 checks
//! would take at that rate (extrapolated, not measured: 300 s of checks
//! would take the suite's budget), and the largest number of arrivals in
//! any one-second window. A pool of targets, each asked for again as soon
//! as its check ends, keeps the pacer's queue full throughout.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use connector_agent::IcmpPreference;
use connector_agent::checks::pacer::{Pacer, Priority};
use connector_agent::checks::probe::Prober;
use connector_agent::metrics::Metrics;
use governor::{Quota, RateLimiter};
use policy::{CheckTarget, Protocol};
use tokio::net::{TcpListener, TcpStream};

use super::Spec;
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::stats::max_in_window;

const RATE: u32 = 20;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "pacing_long_run_rate",
        unit: "checks/s",
        goal: Goal::Within {
            target: 20.0,
            tolerance: 0.05,
        },
    },
    Spec {
        name: "pacing_6000_checks_wall_s_extrapolated",
        unit: "s",
        goal: Goal::Within {
            target: 300.0,
            tolerance: 0.75,
        },
    },
    Spec {
        name: "pacing_max_starts_in_1s",
        unit: "checks",
        goal: Goal::AtMost { limit: 20.0 },
    },
];

/// Long-run rate of sorted start times (seconds): intervals / span.
fn rate(starts: &[f64]) -> f64 {
    match (starts.first(), starts.last()) {
        (Some(a), Some(b)) if b > a => (starts.len() - 1) as f64 / (b - a),
        _ => 0.0,
    }
}

/// The shortest time 21 consecutive arrivals (or starts) took (below 1 s
/// means some one-second window held 21).
fn min_span_21(starts: &[f64]) -> f64 {
    starts
        .windows(RATE as usize + 1)
        .map(|w| w[RATE as usize] - w[0])
        .fold(f64::INFINITY, f64::min)
}

/// Distinct targets checked in turn (the pacer merges checks of one
/// target while one is pending, so each target has one check at a time);
/// far more than one second's worth, so the pacer always has a queue.
const POOL: usize = 64;

/// Loopback listeners recording when each connection was accepted.
struct Listeners {
    targets: Vec<SocketAddr>,
    arrivals: Arc<Mutex<Vec<Instant>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Listeners {
    /// `POOL` listeners on 127.3.`octet`.1.. (each on a port of its own).
    async fn start(octet: u8) -> Result<Self> {
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let (mut targets, mut tasks) = (Vec::new(), Vec::new());
        for k in 0..POOL {
            let ip = IpAddr::V4(Ipv4Addr::new(127, 3, octet, k as u8 + 1));
            let listener = TcpListener::bind((ip, 0))
                .await
                .with_context(|| format!("binding a listener on {ip}"))?;
            targets.push(listener.local_addr()?);
            let arrivals = arrivals.clone();
            tasks.push(tokio::spawn(async move {
                loop {
                    if let Ok((s, _)) = listener.accept().await {
                        if let Ok(mut a) = arrivals.lock() {
                            a.push(Instant::now());
                        }
                        drop(s);
                    }
                }
            }));
        }
        Ok(Listeners {
            targets,
            arrivals,
            tasks,
        })
    }

    /// The arrivals, seconds since `t0`, sorted.
    fn since(&self, t0: Instant) -> Vec<f64> {
        let mut times: Vec<f64> = self
            .arrivals
            .lock()
            .map(|a| {
                a.iter()
                    .map(|t| t.duration_since(t0).as_secs_f64())
                    .collect()
            })
            .unwrap_or_default();
        times.sort_by(f64::total_cmp);
        times
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// `checks` checks through the agent's pacer at the listeners; returns
/// the arrivals and the pacer's own start times (seconds since the start).
async fn reach(checks: usize, at: &Listeners) -> Result<(Vec<f64>, Vec<f64>)> {
    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_secs(1)));
    let (pacer, task) = Pacer::spawn(prober, RATE, 256, Metrics::new());
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let workers: Vec<_> = at
        .targets
        .iter()
        .map(|&addr| {
            let (pacer, next) = (pacer.clone(), next.clone());
            tokio::spawn(async move {
                let target = CheckTarget {
                    check: 0,
                    address: addr.ip(),
                    protocol: Protocol::Tcp,
                    port: addr.port(),
                };
                let (mut slots, mut failed) = (Vec::new(), 0usize);
                while next.fetch_add(1, Ordering::Relaxed) < checks {
                    let (result, started) = pacer
                        .check_timed(target, Priority::Continuous, Duration::ZERO)
                        .await;
                    if !result.reachable {
                        failed += 1;
                    }
                    if let Some(s) = started {
                        slots.push(s.into_std().duration_since(t0).as_secs_f64());
                    }
                }
                (slots, failed)
            })
        })
        .collect();
    let (mut slots, mut failed) = (Vec::with_capacity(checks), 0);
    for w in workers {
        let (s, f) = w.await?;
        slots.extend(s);
        failed += f;
    }
    task.abort();
    if failed > 0 {
        bail!("{failed} of {checks} checks of the loopback listeners failed");
    }
    slots.sort_by(f64::total_cmp);
    Ok((arrivals_of(at, t0, checks).await?, slots))
}

/// Waits (briefly) until the listeners saw every connection; the arrivals.
async fn arrivals_of(at: &Listeners, t0: Instant, checks: usize) -> Result<Vec<f64>> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let times = at.since(t0);
        if times.len() >= checks {
            return Ok(times);
        }
        if Instant::now() > deadline {
            bail!("the listeners saw {} of {checks} connections", times.len());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A bare governor loop opening the same connections to its own listeners.
async fn bare(checks: usize, at: &Listeners) -> Result<Vec<f64>> {
    let limiter = RateLimiter::direct(
        Quota::per_second(NonZeroU32::new(RATE).unwrap_or(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::MIN),
    );
    let t0 = Instant::now();
    let mut connects = Vec::with_capacity(checks);
    for k in 0..checks {
        limiter.until_ready().await;
        let addr = at.targets[k % at.targets.len()];
        connects.push(tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await
        }));
    }
    for c in connects {
        c.await?
            .context("a bare connection timed out")?
            .context("a bare connection failed")?;
    }
    arrivals_of(at, t0, checks).await
}

/// Runs both for the mode's duration, side by side.
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let seconds = mode.pick(2usize, 30);
    let checks = seconds * RATE as usize + 1;
    let (reach_at, bare_at) = (Listeners::start(0).await?, Listeners::start(1).await?);
    let (r, b) = tokio::join!(reach(checks, &reach_at), bare(checks, &bare_at));
    let ((r, slots), b) = (r?, b?);
    let (rr, br) = (rate(&r), rate(&b));
    let (rw, bw) = (max_in_window(&r, 1.0), max_in_window(&b, 1.0));
    let span = |s: &[f64]| s.last().copied().unwrap_or(0.0) - s.first().copied().unwrap_or(0.0);
    Ok(vec![
        SPECS[0].figure(
            rr,
            Some(br),
            format!(
                "{checks} checks started by the agent's Pacer at {RATE}/s, counted where they \
                 arrive (accepted at {POOL} loopback listeners; first to last {:.3} s) vs a bare \
                 governor Quota::per_second({RATE}), burst 1, until_ready loop opening the same \
                 connections to {POOL} listeners of its own ({:.3} s), run side by side",
                span(&r),
                span(&b)
            ),
        ),
        SPECS[1].figure(
            6000.0 / rr.max(f64::MIN_POSITIVE),
            Some(6000.0 / br.max(f64::MIN_POSITIVE)),
            format!(
                "extrapolated, not measured: 6,000 / the long-run rate at the listeners over \
                 {seconds} s"
            ),
        ),
        SPECS[2].figure(
            rw as f64,
            Some(bw as f64),
            format!(
                "busiest half-open 1-s window of arrivals at the listeners (connections \
                 accepted); shortest span of {} consecutive arrivals: {:.4} s (reach), {:.4} s \
                 (bare); from the pacer's own start times: {} in the busiest window, shortest \
                 span {:.4} s",
                RATE + 1,
                min_span_21(&r),
                min_span_21(&b),
                max_in_window(&slots, 1.0),
                min_span_21(&slots)
            ),
        ),
    ])
}
