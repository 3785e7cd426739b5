//! TCP checks with the rate limit lifted: the connector's check engine
//! (pacer + prober, as the agent builds them) against loopback listeners,
//! next to a bare tokio connect loop at the same concurrency.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use connector_agent::IcmpPreference;
use connector_agent::checks::pacer::{Pacer, Priority};
use connector_agent::checks::probe::Prober;
use connector_agent::metrics::Metrics;
use policy::{CheckTarget, Protocol};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use super::Spec;
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::stats::{median_of, per_trial};
use crate::sys::cpu_time;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "tcp_checks_per_s",
        unit: "checks/s",
        goal: Goal::RatioAtLeast { ratio: 0.95 },
    },
    Spec {
        name: "tcp_cpu_us_per_check",
        unit: "µs CPU",
        // The agent's CPU per check within 20% of the bare loop's.
        goal: Goal::RatioAtMost { ratio: 1.2 },
    },
];

/// Concurrency of both loops (the agent's `--max-in-flight`).
pub const CONCURRENCY: usize = 64;

/// A rate far above anything loopback can do: the limit is lifted.
pub const LIFTED_RATE: u32 = 10_000_000;

/// Listeners on `n` loopback addresses (127.0.1.1, 127.0.1.2, …), each
/// accepting and closing at once; returns their addresses.
pub async fn listeners(
    n: usize,
    third_octet: u8,
) -> Result<(Vec<SocketAddr>, Vec<tokio::task::JoinHandle<()>>)> {
    let mut addrs = Vec::with_capacity(n);
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let ip = Ipv4Addr::new(127, 0, third_octet, (i % 250) as u8 + 1);
        let socket = TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind(SocketAddr::new(IpAddr::V4(ip), 0))?;
        let listener: TcpListener = socket.listen(4096)?;
        addrs.push(listener.local_addr()?);
        tasks.push(tokio::spawn(async move {
            loop {
                if let Ok((stream, _)) = listener.accept().await {
                    drop(stream);
                }
            }
        }));
    }
    Ok((addrs, tasks))
}

/// Runs `n` copies of `body(i)` until `run` elapses; returns completed
/// iterations, elapsed time and the CPU time the process used.
pub async fn closed_loop<F, Fut>(n: usize, run: Duration, body: F) -> (u64, Duration, Duration)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = bool> + Send,
{
    let body = Arc::new(body);
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let cpu0 = cpu_time(None);
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (body, done, stop) = (body.clone(), done.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if body(i).await {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(run).await;
    let count = done.load(Ordering::Relaxed);
    let elapsed = t0.elapsed();
    let cpu = cpu_time(None).saturating_sub(cpu0);
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    (count, elapsed, cpu)
}

/// A closed loop's result: completed iterations, elapsed time, CPU time.
pub type LoopRun = (u64, Duration, Duration);

/// Iterations per second of a closed-loop run.
pub fn rate((n, t, _): &LoopRun) -> f64 {
    *n as f64 / t.as_secs_f64()
}

/// CPU µs per iteration of a closed-loop run.
pub fn per((n, _, cpu): &LoopRun) -> f64 {
    cpu.as_secs_f64() * 1e6 / (*n).max(1) as f64
}

/// Measures both loops.
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let duration = mode.pick(Duration::from_millis(500), Duration::from_millis(2250));
    let (addrs, servers) = listeners(CONCURRENCY, 1).await?;
    let addrs = Arc::new(addrs);

    // Warm-up: page in both code paths and the listeners.
    let a = addrs.clone();
    closed_loop(CONCURRENCY, Duration::from_millis(200), move |i| {
        let addr = a[i];
        async move { TcpStream::connect(addr).await.is_ok() }
    })
    .await;

    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_secs(1)));
    let (pacer, pacer_task) = Pacer::spawn(prober, LIFTED_RATE, CONCURRENCY as u32, Metrics::new());
    let targets: Arc<Vec<CheckTarget>> = Arc::new(
        addrs
            .iter()
            .map(|a| CheckTarget {
                check: 0,
                address: a.ip(),
                protocol: Protocol::Tcp,
                port: a.port(),
            })
            .collect(),
    );
    let bare_trial = || {
        let a = addrs.clone();
        closed_loop(CONCURRENCY, duration, move |i| {
            let addr = a[i];
            async move { TcpStream::connect(addr).await.is_ok() }
        })
    };
    let reach_trial = || {
        let (p, t) = (pacer.clone(), targets.clone());
        closed_loop(CONCURRENCY, duration, move |i| {
            let (p, target) = (p.clone(), t[i]);
            async move {
                p.check(target, Priority::Continuous, Duration::ZERO)
                    .await
                    .reachable
            }
        })
    };
    // Alternating trials in the order bare, agent, agent, bare, bare, …: a
    // change in the shared machine's speed reaches both sides alike, and a
    // drift during the run (the kernel's TIME_WAIT table fills as the
    // trials go on) does not favour the side that would always run first;
    // medians of the trials.
    let (mut bare, mut reach) = (Vec::new(), Vec::new());
    for k in 0..mode.pick(1, 4) {
        if k % 2 == 0 {
            bare.push(bare_trial().await);
            // Let TIME_WAIT sockets of one loop not favour either side.
            tokio::time::sleep(Duration::from_millis(200)).await;
            reach.push(reach_trial().await);
        } else {
            reach.push(reach_trial().await);
            tokio::time::sleep(Duration::from_millis(200)).await;
            bare.push(bare_trial().await);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pacer_task.abort();
    for s in servers {
        s.abort();
    }

    let pairs: Vec<_> = reach.iter().zip(&bare).collect();
    let (reach_n, bare_n): (u64, u64) = (
        reach.iter().map(|r| r.0).sum(),
        bare.iter().map(|b| b.0).sum(),
    );
    Ok(vec![
        SPECS[0].figure(
            median_of(&reach, rate),
            Some(median_of(&bare, rate)),
            format!(
                "{reach_n} checks through Pacer+Prober (rate {LIFTED_RATE}/s, {CONCURRENCY} in \
                 flight) vs {bare_n} bare TcpStream::connect, {} alternating trials of {:.2} s, \
                 each pair's first side alternating (median; per-trial ratios {}); \
                 {CONCURRENCY} loopback listeners in the same process",
                reach.len(),
                duration.as_secs_f64(),
                per_trial(&pairs, |(r, b)| rate(r) / rate(b))
            ),
        ),
        SPECS[1].figure(
            median_of(&reach, per),
            Some(median_of(&bare, per)),
            "process CPU (user+sys, client and listeners) / completed checks, median of the trials",
        ),
    ])
}
