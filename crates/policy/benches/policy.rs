//! Criterion benchmarks of `policy`'s access-path hot spots: connector
//! selection (healthy, nearest, group) with 10, 100 and 1,000 candidates (nearest also with
//! the user's location at 100), a decision's explanation among 32 and
//! 10,000 candidates (over a slice and from a `Roster`), a whole decision
//! from a `Roster` of 32 and 10,000, and request matching against 10 and 10,000 segments. `cargo xtask bench` reads their estimates.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use policy::{
    AppEntry, Candidate, HealthReporting, Host, Location, PortRange, Protocol, Proximity, Request,
    Roster, Segment, SegmentIndex, Status, Strategy, Tolerance, explain_owned, select, select_with,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;

/// `n` connected candidates in four groups; three in four report Up, the
/// rest Down, so selection has to filter.
fn candidates(n: usize) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            connector: format!("connector-{i:05}"),
            group: format!("group-{}", i % 4),
            connected: true,
            drained: false,
            status: if i % 4 == 3 { Status::Down } else { Status::Up },
            // Smoothed RTTs spread over 0.5-50 ms, a handful within the
            // tolerance of the best.
            rtt: Some(Duration::from_micros(500 + (i as u64 * 7919) % 49_500)),
            location: None,
        })
        .collect()
}

fn bench_select(c: &mut Criterion) {
    let mut group = c.benchmark_group("select");
    let mut rng = SmallRng::seed_from_u64(7);
    for n in [10usize, 100, 1000] {
        let cands = candidates(n);
        group.bench_with_input(BenchmarkId::new("healthy", n), &cands, |b, cands| {
            b.iter(|| {
                select(
                    black_box(cands),
                    HealthReporting::Continuous,
                    Strategy::Healthy,
                    &mut rng,
                )
            });
        });
        group.bench_with_input(BenchmarkId::new("nearest", n), &cands, |b, cands| {
            b.iter(|| {
                select(
                    black_box(cands),
                    HealthReporting::Continuous,
                    Strategy::Nearest,
                    &mut rng,
                )
            });
        });
        if n == 100 {
            // The same with the user's location counted: every group
            // placed, the user in Paris (a haversine per candidate).
            let placed: Vec<Candidate> = cands
                .iter()
                .enumerate()
                .map(|(i, c)| Candidate {
                    location: Location::new(
                        40.0 + i as f64 % 4.0 * 3.0,
                        -70.0 + i as f64 % 4.0 * 25.0,
                    )
                    .ok(),
                    ..c.clone()
                })
                .collect();
            let proximity = Proximity {
                tolerance: Tolerance::default(),
                user: Location::new(48.8566, 2.3522).ok(),
            };
            group.bench_with_input(
                BenchmarkId::new("nearest_located", n),
                &placed,
                |b, cands| {
                    b.iter(|| {
                        select_with(
                            black_box(cands),
                            HealthReporting::Continuous,
                            Strategy::Nearest,
                            proximity,
                            &mut rng,
                        )
                    });
                },
            );
        }
        group.bench_with_input(BenchmarkId::new("group", n), &cands, |b, cands| {
            b.iter(|| {
                select(
                    black_box(cands),
                    HealthReporting::Continuous,
                    Strategy::Group,
                    &mut rng,
                )
            });
        });
    }
    group.finish();
}

/// `n` segments: every fourth holds a wildcard, the rest two FQDNs and an IP
/// each, so the index has every kind of entry.
fn segments(n: usize) -> Vec<Segment> {
    (0..n)
        .map(|i| {
            let applications = if i % 4 == 0 {
                vec![AppEntry::Wildcard(format!("zone{i}.corp.example"))]
            } else {
                vec![
                    AppEntry::Fqdn(format!("app{i}.corp.example")),
                    AppEntry::Fqdn(format!("www.app{i}.corp.example")),
                    AppEntry::Ip(std::net::IpAddr::V4(std::net::Ipv4Addr::new(
                        10,
                        (i >> 16) as u8,
                        (i >> 8) as u8,
                        i as u8,
                    ))),
                ]
            };
            Segment {
                check: policy::AppCheck::default(),
                name: format!("segment-{i}"),
                applications,
                tcp_ports: PortRange::new(8000, 8100).into_iter().collect(),
                udp_ports: PortRange::single(3389).into_iter().collect(),
                health_reporting: HealthReporting::OnAccess,
                report_interval: Duration::from_secs(60),
                multimatch: false,
                client_hostname_validation: false,
                connector_groups: vec!["group-0".to_owned()],
                damping: policy::Damping::default(),
                strategy: None,
            }
        })
        .collect()
}

/// A mix of requests: exact names, names under wildcards, IPs, misses.
fn requests(n: usize) -> Vec<Request> {
    let mut out = Vec::new();
    for k in 0..64usize {
        let i = (k * 7919) % n;
        let host = match k % 4 {
            0 => format!("host{k}.zone{}.corp.example", i - i % 4),
            1 => format!("app{}.corp.example", i | 1),
            2 => format!("10.0.{}.{}", ((i | 1) >> 8) as u8, (i | 1) as u8),
            _ => format!("unknown{k}.elsewhere.example"),
        };
        out.push(Request {
            host: Host::parse(&host).expect("a valid host"),
            protocol: Protocol::Tcp,
            port: 8080,
        });
    }
    out
}

fn bench_matching(c: &mut Criterion) {
    let mut group = c.benchmark_group("match");
    for n in [10usize, 10_000] {
        let index = SegmentIndex::new(&segments(n));
        let reqs = requests(n);
        let mut k = 0usize;
        group.bench_function(BenchmarkId::new("segments", n), |b| {
            b.iter(|| {
                k = (k + 1) % reqs.len();
                index.match_request(black_box(&reqs[k]))
            });
        });
    }
    group.finish();
}

/// The explanation the CA writes into every access answer, among 32
/// candidates (all listed) and 10,000 (32 listed, all counted); the
/// candidates are copied outside the timing, as the CA moves its own in.
fn bench_explain(c: &mut Criterion) {
    let mut group = c.benchmark_group("explain");
    for n in [32usize, 10_000] {
        let cands = candidates(n);
        group.bench_with_input(BenchmarkId::new("healthy", n), &cands, |b, cands| {
            b.iter_batched(
                || cands.clone(),
                |cands| {
                    explain_owned(
                        cands,
                        Some(n / 2),
                        HealthReporting::Continuous,
                        Strategy::Healthy,
                        Tolerance::default(),
                    )
                },
                BatchSize::LargeInput,
            );
        });
        // The same decision's explanation from a `Roster` (kept indexed as
        // results change, so built outside the timing). Dropped outside the
        // timing, as `iter_batched` drops the one above.
        let roster = Roster::new(cands.clone());
        group.bench_with_input(BenchmarkId::new("roster", n), &roster, |b, roster| {
            b.iter_with_large_drop(|| {
                roster.explain(
                    Some(n / 2),
                    HealthReporting::Continuous,
                    Strategy::Healthy,
                    Tolerance::default(),
                )
            });
        });
    }
    group.finish();
}

/// A whole decision (choice and explanation) from a `Roster` of 32 and
/// 10,000 candidates, healthy strategy.
fn bench_roster(c: &mut Criterion) {
    let mut group = c.benchmark_group("roster");
    let mut rng = SmallRng::seed_from_u64(7);
    for n in [32usize, 10_000] {
        let roster = Roster::new(candidates(n));
        group.bench_with_input(BenchmarkId::new("decision", n), &roster, |b, roster| {
            b.iter(|| {
                let (mode, strategy) = (HealthReporting::Continuous, Strategy::Healthy);
                let chosen =
                    match roster.select_with(mode, strategy, Tolerance::default(), &mut rng) {
                        policy::Decision::Selected { index } => Some(index),
                        policy::Decision::Refused(_) => None,
                    };
                roster.explain(chosen, mode, strategy, Tolerance::default())
            });
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_select,
    bench_explain,
    bench_roster,
    bench_matching
);
criterion_main!(benches);
