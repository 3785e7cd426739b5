//! DNS-expanded targets: names resolved through the agent's resolver
//! (hickory-resolver, its TTL cache disabled so every lookup reaches the
//! server) and crossed with the segment's ports into check targets, next to
//! bare hickory `lookup_ip` calls with the same options, both against a real
//! hickory-server on loopback.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Result;
use connector_agent::resolver::{Resolver, TtlBounds};
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use policy::{CheckTarget, Protocol};
use test_support::DnsServer;

use super::Spec;
use super::tcp::closed_loop;
use crate::Mode;
use crate::report::{Figure, Goal};

/// The figures.
pub const SPECS: &[Spec] = &[Spec {
    name: "dns_targets_per_s",
    unit: "targets/s",
    goal: Goal::Info,
}];

/// Names in the zone; each has `ADDRESSES` A records.
const NAMES: usize = 1000;
const ADDRESSES: usize = 2;
/// Ports each address is crossed with (TCP 80 and 443).
const PORTS: [u16; 2] = [80, 443];
const CONCURRENCY: usize = 32;
const ZONE: &str = "bench.test";

/// Serves `bench.test` with `NAMES` names on a loopback UDP socket (the
/// tests' shared hickory-server).
async fn dns_server() -> Result<DnsServer> {
    let records: Vec<(String, IpAddr)> = (0..NAMES)
        .flat_map(|i| {
            (0..ADDRESSES).map(move |k| {
                let ip = Ipv4Addr::new(10, (i >> 8) as u8, i as u8, k as u8 + 1);
                (format!("app{i}.{ZONE}"), IpAddr::V4(ip))
            })
        })
        .collect();
    let records: Vec<(&str, IpAddr)> = records.iter().map(|(n, ip)| (n.as_str(), *ip)).collect();
    DnsServer::start(SocketAddr::from(([127, 0, 5, 1], 0)), ZONE, &records).await
}

/// A bare resolver with the agent's options: only `server`, no cache, no
/// hosts file, A and AAAA.
fn bare_resolver(server: SocketAddr) -> Result<TokioResolver> {
    let mut ns = NameServerConfig::udp_and_tcp(server.ip());
    for conn in &mut ns.connections {
        conn.port = server.port();
    }
    let mut builder = TokioResolver::builder_with_config(
        ResolverConfig::from_name_servers(vec![ns]),
        TokioRuntimeProvider::default(),
    );
    let opts = builder.options_mut();
    opts.cache_size = 0;
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    opts.timeout = Duration::from_secs(2);
    opts.attempts = 2;
    opts.use_hosts_file = ResolveHosts::Never;
    Ok(builder.build()?)
}

fn expand(addresses: &[IpAddr]) -> Vec<CheckTarget> {
    let mut out = Vec::with_capacity(addresses.len() * PORTS.len());
    for port in PORTS {
        for &address in addresses {
            out.push(CheckTarget {
                check: 0,
                address,
                protocol: Protocol::Tcp,
                port,
            });
        }
    }
    out
}

/// Measures both.
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let duration = mode.pick(Duration::from_millis(500), Duration::from_secs(6));
    let dns = dns_server().await?;
    let server = dns.addr();
    let next = Arc::new(AtomicUsize::new(0));

    let bare = Arc::new(bare_resolver(server)?);
    let bare_targets = Arc::new(AtomicU64::new(0));
    let measure_bare = |run: Duration| {
        let (r, n, t) = (bare.clone(), next.clone(), bare_targets.clone());
        closed_loop(CONCURRENCY, run, move |_| {
            let (r, n, t) = (r.clone(), n.clone(), t.clone());
            async move {
                let i = n.fetch_add(1, Ordering::Relaxed) % NAMES;
                match r.lookup_ip(format!("app{i}.{ZONE}.").as_str()).await {
                    Ok(lookup) => {
                        let addrs: Vec<IpAddr> = lookup.iter().collect();
                        let targets = expand(&addrs);
                        t.fetch_add(targets.len() as u64, Ordering::Relaxed);
                        std::hint::black_box(targets);
                        true
                    }
                    Err(_) => false,
                }
            }
        })
    };
    measure_bare(Duration::from_millis(200)).await;
    bare_targets.store(0, Ordering::Relaxed);
    let (bare_n, bare_t, _) = measure_bare(duration).await;
    let bare_targets = bare_targets.load(Ordering::Relaxed);

    let zero = TtlBounds {
        min: Duration::ZERO,
        max: Duration::ZERO,
    };
    let reach = Resolver::new(Some(server), zero)?;
    let reach_targets = Arc::new(AtomicU64::new(0));
    let measure_reach = |run: Duration| {
        let (r, n, t) = (reach.clone(), next.clone(), reach_targets.clone());
        closed_loop(CONCURRENCY, run, move |_| {
            let (r, n, t) = (r.clone(), n.clone(), t.clone());
            async move {
                let i = n.fetch_add(1, Ordering::Relaxed) % NAMES;
                match r.resolve(&format!("app{i}.{ZONE}")).await {
                    Ok(addrs) => {
                        let targets = expand(&addrs);
                        t.fetch_add(targets.len() as u64, Ordering::Relaxed);
                        std::hint::black_box(targets);
                        true
                    }
                    Err(_) => false,
                }
            }
        })
    };
    measure_reach(Duration::from_millis(200)).await;
    reach_targets.store(0, Ordering::Relaxed);
    let (reach_n, reach_t, _) = measure_reach(duration).await;
    let reach_targets = reach_targets.load(Ordering::Relaxed);
    drop(dns);

    Ok(vec![SPECS[0].figure(
        reach_targets as f64 / reach_t.as_secs_f64(),
        Some(bare_targets as f64 / bare_t.as_secs_f64()),
        format!(
            "{reach_n} names resolved (A+AAAA, {ADDRESSES} addresses each, × {} ports) through \
             the agent's Resolver with its TTL cache off vs {bare_n} bare hickory lookup_ip; \
             hickory-server on 127.0.5.1 in the same process, {CONCURRENCY} concurrent",
            PORTS.len()
        ),
    )])
}
