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
use connector_agent::metrics::Metrics;
use connector_agent::pacer::{Pacer, Priority};
use connector_agent::probe::{IcmpMode, Prober};
use policy::{CheckTarget, Method, Protocol};
use surge_ping::{Client, ICMP, PingIdentifier, PingSequence};

use super::Spec;
use super::tcp::{CONCURRENCY, LIFTED_RATE, closed_loop};
use crate::Mode;
use crate::report::{Figure, Goal};

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
        // Issue 17: the agent's CPU per check within 20% of the bare loop's.
        goal: Goal::RatioAtMost { ratio: 1.2 },
    },
];

fn address(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 2, (i % 250) as u8 + 1))
}

/// Measures both loops.
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let duration = mode.pick(Duration::from_millis(500), Duration::from_secs(8));
    let timeout = Duration::from_secs(1);

    let config = surge_ping::Config::builder()
        .kind(ICMP::V4)
        .sock_type_hint(socket2::Type::RAW)
        .build();
    let client = Client::new(&config).context("opening a RAW ICMP socket (needs CAP_NET_RAW)")?;
    if client.get_socket().get_type() != socket2::Type::RAW {
        bail!("surge-ping gave a datagram socket, not RAW: run as root or with CAP_NET_RAW");
    }
    // Distinct identifiers per pinger (RAW replies are matched by
    // (source, identifier, sequence)); a fresh base per run.
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
    bare(Duration::from_millis(200)).await;
    let (bare_n, bare_t, bare_cpu) = bare(duration).await;
    drop(pingers);
    drop(client);
    tokio::time::sleep(Duration::from_millis(100)).await;

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
    reach(Duration::from_millis(200)).await;
    let (reach_n, reach_t, reach_cpu) = reach(duration).await;
    pacer_task.abort();

    let bare_rate = bare_n as f64 / bare_t.as_secs_f64();
    let reach_rate = reach_n as f64 / reach_t.as_secs_f64();
    let per = |cpu: Duration, n: u64| cpu.as_secs_f64() * 1e6 / n.max(1) as f64;
    Ok(vec![
        SPECS[0].figure(
            reach_rate,
            Some(bare_rate),
            format!(
                "{reach_n} UDP-port checks answered by ICMP in {:.1} s (Pacer+Prober, RAW socket, \
                 {CONCURRENCY} in flight, 127.0.2.x) vs {bare_n} bare surge-ping echoes",
                reach_t.as_secs_f64()
            ),
        ),
        SPECS[1].figure(
            per(reach_cpu, reach_n),
            Some(per(bare_cpu, bare_n)),
            "process CPU (user+sys) / answered echoes",
        ),
    ])
}
