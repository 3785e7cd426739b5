//! Property tests of the policy rules: check plans, connector selection
//! (including a chi-square test that random choices are uniform), matching
//! and validation, over generated inputs rather than hand-picked ones.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, Ipv4Addr};

use policy::validate::{PortSpec, SegmentSpec};
use policy::{
    AppEntry, Candidate, Decision, HealthReporting, Host, MatchOutcome, Protocol, RefusalReason,
    Request, Segment, SegmentIndex, Status, Strategy as Pick, plan_checks, select,
    validate_segment,
};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;

// ---- generators ----

fn ip(i: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, i))
}

/// Port lists as non-overlapping single ports and ranges: single ports from
/// 1..=200 and ranges of up to 20 ports above 1000, 100 apart.
fn port_specs() -> impl Strategy<Value = Vec<PortSpec>> {
    (
        prop::collection::btree_set(1u16..=200, 0..6),
        prop::collection::btree_map(0u16..10, 0u16..20, 0..3),
    )
        .prop_map(|(singles, ranges)| {
            let mut out: Vec<PortSpec> = singles
                .into_iter()
                .map(|p| PortSpec::Number(i64::from(p)))
                .collect();
            for (slot, extra) in ranges {
                let start = 1000 + slot * 100;
                out.push(PortSpec::Text(format!("{start}-{}", start + extra)));
            }
            out
        })
}

fn port_count(specs: &[PortSpec]) -> usize {
    specs
        .iter()
        .map(|p| match p {
            PortSpec::Number(_) => 1,
            PortSpec::Text(t) => {
                let (a, b) = t.split_once('-').expect("generated ranges have a dash");
                let a: usize = a.parse().expect("generated ports are numbers");
                let b: usize = b.parse().expect("generated ports are numbers");
                b - a + 1
            }
        })
        .sum()
}

/// A segment of up to four FQDNs and four IPs from small pools (so that
/// names resolve to explicit IPs and to each other's addresses), with DNS
/// answers drawn from the same pool of eight addresses.
#[derive(Debug, Clone)]
struct PlanCase {
    segment: Segment,
    resolved: BTreeMap<String, Vec<IpAddr>>,
}

fn plan_case() -> impl Strategy<Value = PlanCase> {
    let names = prop::collection::btree_set(0u8..4, 0..4);
    let ips = prop::collection::btree_set(0u8..8, 0..4);
    let answers = prop::collection::vec(prop::collection::vec(0u8..8, 0..4), 4);
    (names, ips, answers, port_specs(), port_specs())
        .prop_filter(
            "a segment needs an application and a port",
            |(n, i, _, t, u)| {
                let no_apps = n.is_empty() && i.is_empty();
                let no_ports = t.is_empty() && u.is_empty();
                !no_apps && !no_ports
            },
        )
        .prop_map(|(names, ips, answers, tcp, udp)| {
            let name = |n: u8| format!("app{n}.example.com");
            let mut applications: Vec<String> = names.iter().map(|&n| name(n)).collect();
            applications.extend(ips.iter().map(|&i| ip(i).to_string()));
            let segment = validate_segment(&SegmentSpec {
                name: "s".into(),
                applications,
                tcp_ports: tcp,
                udp_ports: udp,
                health_reporting: Some("on_access".into()),
                connector_groups: vec!["g".into()],
                ..SegmentSpec::default()
            })
            .expect("generated segments are valid");
            // Answers for every pool name, including ones the segment lacks.
            let resolved = (0u8..4)
                .map(|n| {
                    let addrs = answers[usize::from(n)].iter().map(|&i| ip(i)).collect();
                    (name(n), addrs)
                })
                .collect();
            PlanCase { segment, resolved }
        })
}

fn status() -> impl Strategy<Value = Status> {
    prop_oneof![
        Just(Status::Up),
        Just(Status::Unhealthy),
        Just(Status::Down),
        Just(Status::Unknown),
    ]
}

fn mode() -> impl Strategy<Value = HealthReporting> {
    prop_oneof![
        Just(HealthReporting::Continuous),
        Just(HealthReporting::OnAccess),
        Just(HealthReporting::None),
    ]
}

/// Candidates, about one in four drained.
fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
    prop::collection::vec((0u8..3, any::<bool>(), status(), 0u8..4), 0..12).prop_map(|cs| {
        cs.into_iter()
            .enumerate()
            .map(|(i, (group, connected, status, drain))| Candidate {
                rtt: None,
                location: None,
                connector: format!("c{i}"),
                group: format!("g{group}"),
                connected,
                drained: drain == 0,
                status,
            })
            .collect()
    })
}

/// Whether a candidate counts as reporting the application reachable (a
/// drained one never does).
fn counts_reachable(c: &Candidate, mode: HealthReporting) -> bool {
    c.connected && !c.drained && (mode == HealthReporting::None || c.status.is_reachable())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    // ---- planning ----

    #[test]
    fn plan_size_is_distinct_addresses_times_ports(case in plan_case()) {
        let PlanCase { segment, resolved } = &case;
        let mut addresses = HashSet::new();
        for entry in &segment.applications {
            match entry {
                AppEntry::Fqdn(n) => addresses.extend(resolved[n].iter().copied()),
                AppEntry::Ip(ip) => {
                    addresses.insert(*ip);
                }
                AppEntry::Wildcard(_) | AppEntry::Subnet(_) => {}
            }
        }
        let ports = segment.port_count() as usize;
        let plan = plan_checks(segment, resolved);
        prop_assert_eq!(plan.len(), addresses.len() * ports);
        // No duplicates, and every target is an address and port of the segment.
        let distinct: HashSet<_> = plan.iter().collect();
        prop_assert_eq!(distinct.len(), plan.len());
        for t in &plan {
            prop_assert!(addresses.contains(&t.address));
            prop_assert!(segment.includes(t.protocol, t.port));
        }
    }

    // ---- selection ----

    #[test]
    fn healthy_never_selects_an_unreachable_disconnected_or_drained_candidate(
        cs in candidates(),
        mode in mode(),
        seed in any::<u64>(),
    ) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let any_reachable = cs.iter().any(|c| counts_reachable(c, mode));
        match select(&cs, mode, Pick::Healthy, &mut rng) {
            Decision::Selected { index } => {
                prop_assert!(counts_reachable(&cs[index], mode), "{:?}", cs[index]);
            }
            Decision::Refused(reason) => {
                prop_assert!(!any_reachable, "refused {reason} with a reachable candidate");
                let connected: Vec<_> = cs.iter().filter(|c| c.connected && !c.drained).collect();
                let expected = if cs.iter().all(|c| !c.connected) {
                    RefusalReason::NoConnector
                } else if connected.is_empty() {
                    RefusalReason::AllDrained
                } else if connected.iter().all(|c| c.status == Status::Down) {
                    RefusalReason::AllDown
                } else {
                    RefusalReason::NoHealthReport
                };
                prop_assert_eq!(reason, expected);
            }
        }
    }

    #[test]
    fn group_never_selects_a_disconnected_drained_or_down_connector(
        cs in candidates(),
        mode in mode(),
        seed in any::<u64>(),
    ) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let eligible: BTreeSet<&str> = cs
            .iter()
            .filter(|c| counts_reachable(c, mode))
            .map(|c| c.group.as_str())
            .collect();
        match select(&cs, mode, Pick::Group, &mut rng) {
            Decision::Selected { index } => {
                let c = &cs[index];
                prop_assert!(c.connected && !c.drained, "{c:?}");
                prop_assert!(mode == HealthReporting::None || c.status != Status::Down, "{c:?}");
                prop_assert!(eligible.contains(c.group.as_str()), "{c:?} not in {eligible:?}");
            }
            Decision::Refused(_) => prop_assert!(eligible.is_empty()),
        }
    }

    // ---- matching ----

    #[test]
    fn a_match_always_includes_the_port_and_matches_the_host(
        case in plan_case(),
        host in prop_oneof![
            (0u8..6).prop_map(|n| format!("APP{n}.example.com.")),
            (0u8..10).prop_map(|i| ip(i).to_string()),
            "[a-z0-9.*:-]{0,20}",
        ],
        udp in any::<bool>(),
        port in 1u16..1300,
    ) {
        let segments = [case.segment];
        let protocol = if udp { Protocol::Udp } else { Protocol::Tcp };
        // A text that is no host never becomes a request (`Host::parse`
        // refuses it where it arrives).
        let Ok(parsed) = Host::parse(&host) else { return Ok(()) };
        let request = Request { host: parsed, protocol, port };
        match SegmentIndex::new(&segments).match_request(&request) {
            MatchOutcome::Matched(m) => {
                prop_assert!(segments[m.segment].includes(protocol, port));
                let entry = &segments[m.segment].applications[m.entry];
                let wanted = host.trim_end_matches('.').to_ascii_lowercase();
                let got = entry.host();
                prop_assert_eq!(got.as_deref(), Some(wanted.as_str()));
            }
            MatchOutcome::PortNotInSegment(m) => {
                prop_assert!(!segments[m.segment].includes(protocol, port));
            }
            MatchOutcome::NoSegment => {}
        }
    }

    // ---- validation ----

    #[test]
    fn continuous_is_valid_exactly_up_to_ten_ports(tcp in port_specs(), udp in port_specs()) {
        let n = port_count(&tcp) + port_count(&udp);
        prop_assume!(n > 0);
        let spec = SegmentSpec {
            name: "jira".into(),
            applications: vec!["jira.lanukcorp.com".into()],
            tcp_ports: tcp,
            udp_ports: udp,
            health_reporting: Some("continuous".into()),
            connector_groups: vec!["g".into()],
            ..SegmentSpec::default()
        };
        match validate_segment(&spec) {
            Ok(s) => {
                prop_assert!(n <= 10);
                prop_assert_eq!(s.port_count() as usize, n);
            }
            Err(errors) => {
                prop_assert!(n > 10);
                prop_assert_eq!(errors.len(), 1);
                prop_assert_eq!(
                    errors[0].to_string(),
                    format!(
                        "segment \"jira\": health_reporting = \"continuous\" is not allowed with {n} ports (max 10)"
                    )
                );
            }
        }
    }

    #[test]
    fn validation_never_panics(
        name in ".{0,20}",
        applications in prop::collection::vec(".{0,30}", 0..4),
        tcp in prop::collection::vec(prop_oneof![any::<i64>().prop_map(PortSpec::Number), ".{0,12}".prop_map(PortSpec::Text)], 0..4),
        udp in prop::collection::vec(prop_oneof![(-5i64..70000).prop_map(PortSpec::Number), "[0-9-]{0,12}".prop_map(PortSpec::Text)], 0..4),
        health_reporting in prop::option::of(prop_oneof![Just("continuous".to_owned()), Just("on_access".to_owned()), Just("none".to_owned()), ".{0,8}"]),
        report_interval_s in prop::option::of(any::<u64>()),
        report_interval_ms in prop::option::of(any::<u64>()),
        multimatch in any::<bool>(),
        connector_groups in prop::collection::vec(".{0,8}", 0..3),
        check_path in prop::option::of(".{0,8}"),
    ) {
        let spec = SegmentSpec {
            name,
            applications,
            tcp_ports: tcp,
            udp_ports: udp,
            health_reporting,
            report_interval_s,
            report_interval_ms,
            multimatch,
            client_hostname_validation: false,
            connector_groups,
            rise: None,
            fall: None,
            strategy: None,
            check: multimatch.then(|| "https".into()),
            check_path: check_path.clone(),
            check_expect: check_path,
            check_ca_file: None,
            check_ca_pem: None,
        };
        if let Err(errors) = validate_segment(&spec) {
            prop_assert!(!errors.is_empty());
        }
    }
}

// ---- uniformity ----

/// Critical values of the chi-square distribution at p = 0.001, by degrees
/// of freedom.
fn chi_square_critical(df: usize) -> f64 {
    match df {
        1 => 10.828,
        2 => 13.816,
        3 => 16.266,
        4 => 18.467,
        5 => 20.515,
        7 => 24.322,
        9 => 27.877,
        _ => panic!("no critical value tabulated for {df} degrees of freedom"),
    }
}

/// Pearson's statistic of `observed` counts against a uniform expectation.
fn chi_square(observed: &[u64]) -> f64 {
    let total: u64 = observed.iter().sum();
    let expected = total as f64 / observed.len() as f64;
    observed
        .iter()
        .map(|&o| (o as f64 - expected).powi(2) / expected)
        .sum()
}

const DRAWS: usize = 10_000;

/// `k` reachable connectors (alternately Up and Unhealthy) interleaved with
/// connectors that must never be chosen.
fn healthy_pool(k: usize) -> Vec<Candidate> {
    let mut out = Vec::new();
    for i in 0..k {
        out.push(Candidate {
            rtt: None,
            location: None,
            connector: format!("ok{i}"),
            group: format!("g{}", i % 3),
            connected: true,
            drained: false,
            status: if i % 2 == 0 {
                Status::Up
            } else {
                Status::Unhealthy
            },
        });
        out.push(Candidate {
            rtt: None,
            location: None,
            connector: format!("down{i}"),
            group: format!("g{}", i % 3),
            connected: true,
            drained: false,
            status: Status::Down,
        });
        out.push(Candidate {
            rtt: None,
            location: None,
            connector: format!("gone{i}"),
            group: format!("g{}", i % 3),
            connected: false,
            drained: false,
            status: Status::Up,
        });
    }
    out
}

#[test]
fn healthy_choices_are_uniform_over_reachable_connectors() {
    for (k, seed) in [(2, 1), (3, 2), (5, 3), (8, 4), (10, 5)] {
        let cs = healthy_pool(k);
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        for _ in 0..DRAWS {
            match select(&cs, HealthReporting::Continuous, Pick::Healthy, &mut rng) {
                Decision::Selected { index } => {
                    *counts.entry(cs[index].connector.clone()).or_default() += 1;
                }
                Decision::Refused(r) => panic!("refused: {r}"),
            }
        }
        assert_eq!(
            counts.len(),
            k,
            "every reachable connector is chosen: {counts:?}"
        );
        assert!(counts.keys().all(|c| c.starts_with("ok")), "{counts:?}");
        let observed: Vec<u64> = counts.values().copied().collect();
        let x2 = chi_square(&observed);
        assert!(
            x2 < chi_square_critical(k - 1),
            "k = {k}: chi-square {x2:.2} >= {} for {counts:?}",
            chi_square_critical(k - 1)
        );
    }
}

#[test]
fn none_mode_choices_are_uniform_over_connected_connectors() {
    let cs = healthy_pool(2); // 4 connected (ok*, down*), 2 disconnected
    let mut rng = SmallRng::seed_from_u64(11);
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for _ in 0..DRAWS {
        if let Decision::Selected { index } =
            select(&cs, HealthReporting::None, Pick::Healthy, &mut rng)
        {
            *counts.entry(cs[index].connector.clone()).or_default() += 1;
        }
    }
    assert_eq!(counts.len(), 4, "{counts:?}");
    assert!(counts.keys().all(|c| !c.starts_with("gone")), "{counts:?}");
    let observed: Vec<u64> = counts.values().copied().collect();
    assert!(chi_square(&observed) < chi_square_critical(3), "{counts:?}");
}

#[test]
fn group_choices_are_uniform_over_groups_then_connectors() {
    // Four eligible groups of different sizes, and one ineligible group. A
    // group is chosen uniformly (so a big group is not favoured), then a
    // non-Down connected connector of it uniformly.
    let mut cs = Vec::new();
    let sizes = [1usize, 2, 3, 5];
    for (g, &size) in sizes.iter().enumerate() {
        for i in 0..size {
            cs.push(Candidate {
                rtt: None,
                location: None,
                connector: format!("g{g}c{i}"),
                group: format!("g{g}"),
                connected: true,
                drained: false,
                // One reporting Up makes the group eligible; the others are
                // Unknown, which the literal rule allows.
                status: if i == 0 { Status::Up } else { Status::Unknown },
            });
        }
        cs.push(Candidate {
            rtt: None,
            location: None,
            connector: format!("g{g}down"),
            group: format!("g{g}"),
            connected: true,
            drained: false,
            status: Status::Down,
        });
    }
    cs.push(Candidate {
        rtt: None,
        location: None,
        connector: "x".into(),
        group: "ineligible".into(),
        connected: true,
        drained: false,
        status: Status::Unknown,
    });

    let mut rng = SmallRng::seed_from_u64(42);
    let mut per_group = vec![0u64; sizes.len()];
    let mut per_connector: BTreeMap<String, u64> = BTreeMap::new();
    for _ in 0..DRAWS {
        let Decision::Selected { index } =
            select(&cs, HealthReporting::OnAccess, Pick::Group, &mut rng)
        else {
            panic!("refused");
        };
        let c = &cs[index];
        assert_ne!(c.status, Status::Down);
        assert_ne!(c.group, "ineligible");
        let g: usize = c.group[1..].parse().unwrap();
        per_group[g] += 1;
        *per_connector.entry(c.connector.clone()).or_default() += 1;
    }
    let x2 = chi_square(&per_group);
    assert!(
        x2 < chi_square_critical(3),
        "groups {per_group:?}: chi-square {x2:.2}"
    );
    // Within each group with more than one choice, connectors are uniform.
    for (g, &size) in sizes.iter().enumerate().filter(|(_, s)| **s > 1) {
        let observed: Vec<u64> = (0..size)
            .map(|i| {
                per_connector
                    .get(&format!("g{g}c{i}"))
                    .copied()
                    .unwrap_or(0)
            })
            .collect();
        let x2 = chi_square(&observed);
        assert!(
            x2 < chi_square_critical(size - 1),
            "group g{g} {observed:?}: chi-square {x2:.2}"
        );
    }
}
