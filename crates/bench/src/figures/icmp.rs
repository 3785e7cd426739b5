//! ICMP echoes with the rate limit lifted: the check engine's UDP-port path
//! (pacer + prober: an ICMP echo through the agent's shared surge-ping
//! client) next to a bare surge-ping loop, both on a RAW socket to loopback
//! addresses, at the same concurrency, each pinger with its own identifier.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use connector_agent::IcmpPreference;
use connector_agent::checks::pacer::{Pacer, Priority};
use connector_agent::checks::probe::{IcmpMode, Prober};
use connector_agent::metrics::Metrics;
use policy::{CheckTarget, Method, Protocol};
use surge_ping::{Client, ICMP, PingIdentifier, PingSequence};

use super::Spec;
use super::tcp::{CONCURRENCY, LIFTED_RATE, LoopRun, closed_loop, per, rate};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::stats::{median_of, per_trial};

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "icmp_echoes_per_s",
        unit: "echoes/s",
        goal: Goal::RatioAtLeast { ratio: 0.95 },
    },
    Spec {
        name: "icmp_cpu_us_per_echo",
        unit: "µs CPU",
        // The agent's CPU per check within 20% of the bare loop's.
        goal: Goal::RatioAtMost { ratio: 1.2 },
    },
];

fn address(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 2, (i % 250) as u8 + 1))
}

/// One trial of the bare loop: a RAW surge-ping client of its own (opened
/// for the trial and closed after it: a RAW socket gets a copy of every
/// echo reply, so the other side's socket must not be open meanwhile), 64
/// pingers with their own identifiers; (echoes, elapsed, process CPU).
async fn bare_trial(run: Duration, timeout: Duration) -> Result<LoopRun> {
    let config = surge_ping::Config::builder()
        .kind(ICMP::V4)
        .sock_type_hint(socket2::Type::RAW)
        .build();
    let client = Client::new(&config).context("opening a RAW ICMP socket (needs CAP_NET_RAW)")?;
    if client.get_socket().get_type() != socket2::Type::RAW {
        bail!("surge-ping gave a datagram socket, not RAW: run as root or with CAP_NET_RAW");
    }
    // Distinct identifiers per pinger (RAW replies are matched by
    // (source, identifier, sequence)); a fresh base per trial.
    let base: u16 = rand::random();
    let mut pingers = Vec::with_capacity(CONCURRENCY);
    for i in 0..CONCURRENCY {
        let mut p = client
            .pinger(address(i), PingIdentifier(base.wrapping_add(i as u16)))
            .await;
        p.timeout(timeout);
        pingers.push(tokio::sync::Mutex::new(p));
    }
    let pingers = Arc::new(pingers);
    let seq = Arc::new(AtomicU16::new(0));
    let bare = |run: Duration| {
        let (pingers, seq) = (pingers.clone(), seq.clone());
        closed_loop(CONCURRENCY, run, move |i| {
            let (pingers, seq) = (pingers.clone(), seq.clone());
            async move {
                let mut p = pingers[i].lock().await;
                let s = seq.fetch_add(1, Ordering::Relaxed);
                p.ping(PingSequence(s), &[0u8; 16]).await.is_ok()
            }
        })
    };
    bare(WARM_UP).await;
    let measured = bare(run).await;
    drop(pingers);
    drop(client);
    Ok(measured)
}

/// One trial of the agent's check engine: a prober (its own RAW socket)
/// and a pacer, built for the trial and dropped after it.
async fn reach_trial(run: Duration, timeout: Duration) -> Result<LoopRun> {
    let prober = Prober::new(IcmpPreference::Raw, timeout);
    if prober.icmp_mode() != IcmpMode::Raw {
        bail!("the agent's prober could not open a RAW ICMP socket");
    }
    let (pacer, pacer_task) = Pacer::spawn(
        Arc::new(prober),
        LIFTED_RATE,
        CONCURRENCY as u32,
        Metrics::new(),
    );
    let targets: Arc<Vec<CheckTarget>> = Arc::new(
        (0..CONCURRENCY)
            .map(|i| CheckTarget {
                check: 0,
                address: address(i),
                protocol: Protocol::Udp,
                port: 3389,
            })
            .collect(),
    );
    let reach = |run: Duration| {
        let (p, t) = (pacer.clone(), targets.clone());
        closed_loop(CONCURRENCY, run, move |i| {
            let (p, target) = (p.clone(), t[i]);
            async move {
                let r = p.check(target, Priority::Continuous, Duration::ZERO).await;
                r.reachable && r.method == Method::Icmp
            }
        })
    };
    reach(WARM_UP).await;
    let measured = reach(run).await;
    pacer_task.abort();
    Ok(measured)
}

/// Each trial's warm-up (pages the code path in; not counted).
const WARM_UP: Duration = Duration::from_millis(200);

/// Measures both loops in alternating trials, in the order bare, agent,
/// agent, bare, bare, agent, … (each pair's first side alternates, so a
/// drift of the machine's speed during the run does not favour the side
/// that always runs first); medians of the trials.
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let trials = mode.pick(1, 4);
    let duration = mode.pick(Duration::from_millis(500), Duration::from_secs(2));
    let timeout = Duration::from_secs(1);
    let (mut bare, mut reach) = (Vec::new(), Vec::new());
    for k in 0..trials {
        if k % 2 == 0 {
            bare.push(bare_trial(duration, timeout).await?);
            tokio::time::sleep(Duration::from_millis(100)).await;
            reach.push(reach_trial(duration, timeout).await?);
        } else {
            reach.push(reach_trial(duration, timeout).await?);
            tokio::time::sleep(Duration::from_millis(100)).await;
            bare.push(bare_trial(duration, timeout).await?);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
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
                "{reach_n} UDP-port checks answered by ICMP (Pacer+Prober, RAW socket, \
                 {CONCURRENCY} in flight, 127.0.2.x) vs {bare_n} bare surge-ping echoes, {} \
                 alternating trials of {:.1} s, each pair's first side alternating (median; \
                 per-trial ratios {})",
                reach.len(),
                duration.as_secs_f64(),
                per_trial(&pairs, |(r, b)| rate(r) / rate(b))
            ),
        ),
        SPECS[1].figure(
            median_of(&reach, per),
            Some(median_of(&bare, per)),
            "process CPU (user+sys) / answered echoes, median of the trials",
        ),
    ])
}
