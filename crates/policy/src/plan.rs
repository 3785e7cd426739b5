//! Check planning: which (address, protocol, port) targets a segment needs,
//! how many checks a cycle holds, the check rate a connector runs at, and
//! how long a cycle takes at that rate.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use crate::model::{AppEntry, Protocol, Segment};

/// One health check: an address on one protocol and port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CheckTarget {
    /// Address to probe.
    pub address: IpAddr,
    /// Protocol of the port (UDP is probed by ICMP, then TCP fallback).
    pub protocol: Protocol,
    /// Port.
    pub port: u16,
    /// The application-level check to run on a TCP port: an id the
    /// connector hands out for an (application name, [`crate::AppCheck`])
    /// pair; 0 is the handshake alone.
    pub check: u32,
}

/// The checks of one segment: every address each FQDN resolved to (from
/// `resolved`, keyed by the lower-case FQDN; a name missing from it
/// contributes nothing) plus every explicit IP, crossed with every TCP and
/// UDP port, deduplicated. Ordered port by port (TCP first), then address in
/// entry order, which is how the seed's example lists its six checks.
pub fn plan_checks(
    segment: &Segment,
    resolved: &BTreeMap<String, Vec<IpAddr>>,
) -> Vec<CheckTarget> {
    let mut addresses = Vec::new();
    let mut seen_addr = HashSet::new();
    for entry in &segment.applications {
        match entry {
            AppEntry::Fqdn(name) => {
                for ip in resolved.get(name).into_iter().flatten() {
                    if seen_addr.insert(*ip) {
                        addresses.push(*ip);
                    }
                }
            }
            AppEntry::Ip(ip) => {
                if seen_addr.insert(*ip) {
                    addresses.push(*ip);
                }
            }
            AppEntry::Wildcard(_) | AppEntry::Subnet(_) => {}
        }
    }
    let mut out = Vec::new();
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        for range in segment.ports(protocol) {
            for port in range.ports() {
                for &address in &addresses {
                    out.push(CheckTarget {
                        address,
                        protocol,
                        port,
                        check: 0,
                    });
                }
            }
        }
    }
    out
}

/// Time one cycle of `checks` takes at `checks_per_second` (6,000 at 20/s
/// is 300 s). A rate of 0 is treated as 1.
pub fn cycle_time(checks: u64, checks_per_second: u32) -> Duration {
    let rate = u64::from(checks_per_second.max(1));
    Duration::from_secs(checks / rate)
        + Duration::from_nanos((checks % rate) * 1_000_000_000 / rate)
}

/// A connector's check rate when nothing states one: the default of its
/// `--checks-per-second` and of the CA's `assumed_checks_per_second`.
pub const DEFAULT_CHECKS_PER_SECOND: u32 = 20;

/// The checks per second a connector runs at, by the rule
/// `ConnectorSettings.checks_per_second` states: the CA's `imposed` rate
/// when it imposes one (not 0), held to the connector's `ceiling`
/// (`--max-checks-per-second`) where the caller knows it; else the
/// connector's own, the first of `own` that is not 0 (what is known of
/// it, most certain first); else [`DEFAULT_CHECKS_PER_SECOND`].
pub fn effective_rate(imposed: u32, ceiling: Option<u32>, own: &[u32]) -> u32 {
    match imposed {
        0 => own
            .iter()
            .copied()
            .find(|r| *r > 0)
            .unwrap_or(DEFAULT_CHECKS_PER_SECOND),
        n => ceiling.map_or(n, |c| n.min(c)),
    }
}

/// A connector's estimated load against the check budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BudgetEstimate {
    /// Checks in one cycle.
    pub checks_per_cycle: u64,
    /// Time one cycle takes at the rate limit.
    pub cycle: Duration,
    /// True when `checks_per_cycle` exceeds the budget.
    pub over_budget: bool,
}

/// Estimates a cycle against the budget (default 6,000 checks per cycle).
pub fn estimate_budget(
    checks_per_cycle: u64,
    checks_per_second: u32,
    budget: u64,
) -> BudgetEstimate {
    BudgetEstimate {
        checks_per_cycle,
        cycle: cycle_time(checks_per_cycle, checks_per_second),
        over_budget: checks_per_cycle > budget,
    }
}

/// The CA's estimate of a segment's checks per cycle when it has no DNS
/// answers: each FQDN counted as `addresses_per_fqdn` addresses.
pub fn estimated_checks(segment: &Segment, addresses_per_fqdn: u64) -> u64 {
    let addresses: u64 = segment
        .applications
        .iter()
        .map(|e| match e {
            AppEntry::Fqdn(_) => addresses_per_fqdn,
            AppEntry::Ip(_) => 1,
            AppEntry::Wildcard(_) | AppEntry::Subnet(_) => 0,
        })
        .sum();
    addresses * u64::from(segment.port_count())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::{SegmentSpec, validate_segment};

    fn segment(apps: &[&str], tcp: &[&str], udp: &[&str]) -> Segment {
        validate_segment(&SegmentSpec {
            name: "jira".into(),
            applications: apps.iter().map(|&a| a.into()).collect(),
            tcp_ports: tcp.iter().map(|&p| p.into()).collect(),
            udp_ports: udp.iter().map(|&p| p.into()).collect(),
            health_reporting: Some("on_access".into()),
            connector_groups: vec!["dc-east".into()],
            ..SegmentSpec::default()
        })
        .expect("valid segment")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn target(address: &str, protocol: Protocol, port: u16) -> CheckTarget {
        CheckTarget {
            address: ip(address),
            protocol,
            port,
            check: 0,
        }
    }

    fn resolved(entries: &[(&str, &[&str])]) -> BTreeMap<String, Vec<IpAddr>> {
        entries
            .iter()
            .map(|(name, ips)| ((*name).to_owned(), ips.iter().map(|s| ip(s)).collect()))
            .collect()
    }

    #[test]
    fn the_seeds_example_gives_exactly_six_checks() {
        let s = segment(&["jira.lanukcorp.com", "10.1.1.1"], &["80"], &["3389"]);
        let dns = resolved(&[("jira.lanukcorp.com", &["10.1.2.1", "10.1.2.2"])]);
        assert_eq!(
            plan_checks(&s, &dns),
            vec![
                target("10.1.2.1", Protocol::Tcp, 80),
                target("10.1.2.2", Protocol::Tcp, 80),
                target("10.1.1.1", Protocol::Tcp, 80),
                target("10.1.2.1", Protocol::Udp, 3389),
                target("10.1.2.2", Protocol::Udp, 3389),
                target("10.1.1.1", Protocol::Udp, 3389),
            ]
        );
    }

    #[test]
    fn an_fqdn_resolving_to_an_explicit_ip_is_checked_once() {
        let s = segment(
            &["jira.lanukcorp.com", "10.1.1.1", "wiki.lanukcorp.com"],
            &["80"],
            &[],
        );
        let dns = resolved(&[
            ("jira.lanukcorp.com", &["10.1.1.1", "10.1.2.2", "10.1.2.2"]),
            ("wiki.lanukcorp.com", &["10.1.2.2", "10.1.1.1"]),
        ]);
        assert_eq!(
            plan_checks(&s, &dns),
            vec![
                target("10.1.1.1", Protocol::Tcp, 80),
                target("10.1.2.2", Protocol::Tcp, 80),
            ]
        );
    }

    #[test]
    fn ranges_expand_and_the_same_port_on_both_protocols_is_two_checks() {
        let s = segment(&["10.1.1.1", "::1"], &["8000-8002"], &["8000"]);
        let plan = plan_checks(&s, &BTreeMap::new());
        assert_eq!(plan.len(), 2 * 4);
        assert_eq!(plan[0], target("10.1.1.1", Protocol::Tcp, 8000));
        assert_eq!(plan[1], target("::1", Protocol::Tcp, 8000));
        assert_eq!(plan[5], target("::1", Protocol::Tcp, 8002));
        assert_eq!(plan[7], target("::1", Protocol::Udp, 8000));
    }

    #[test]
    fn unresolved_names_and_discovery_entries_give_no_checks() {
        let s = segment(
            &["jira.lanukcorp.com", "*.safemarch.com", "10.122.0.0/16"],
            &["80"],
            &[],
        );
        assert!(plan_checks(&s, &BTreeMap::new()).is_empty());
        // A resolution for an unrelated name does not leak in.
        let dns = resolved(&[("wiki.lanukcorp.com", &["10.9.9.9"])]);
        assert!(plan_checks(&s, &dns).is_empty());
    }

    #[test]
    fn cycle_time_at_the_rate_limit() {
        assert_eq!(cycle_time(6000, 20), Duration::from_secs(300));
        assert_eq!(cycle_time(20, 20), Duration::from_secs(1));
        assert_eq!(cycle_time(1, 20), Duration::from_millis(50));
        assert_eq!(cycle_time(30, 20), Duration::from_millis(1500));
        assert_eq!(cycle_time(0, 20), Duration::ZERO);
        assert_eq!(cycle_time(1, 3), Duration::from_nanos(333_333_333));
        // A rate of zero is treated as one, not a division by zero.
        assert_eq!(cycle_time(5, 0), Duration::from_secs(5));
        // No overflow at the extremes.
        assert_eq!(
            cycle_time(u64::MAX, u32::MAX),
            Duration::from_secs(u64::MAX / u64::from(u32::MAX))
                + Duration::from_nanos(
                    (u64::MAX % u64::from(u32::MAX)) * 1_000_000_000 / u64::from(u32::MAX)
                )
        );
    }

    #[test]
    fn the_effective_rate_is_the_imposed_one_held_to_the_ceiling_else_the_connectors_own() {
        // Imposed: it holds, up to the ceiling where one is known.
        assert_eq!(effective_rate(50, None, &[10]), 50);
        assert_eq!(effective_rate(15, Some(20), &[10]), 15);
        assert_eq!(effective_rate(20, Some(20), &[10]), 20);
        assert_eq!(effective_rate(10_000, Some(20), &[10]), 20);
        // Unset (0): the first known rate of the connector's own, in order.
        assert_eq!(effective_rate(0, Some(20), &[10]), 10);
        assert_eq!(effective_rate(0, None, &[0, 12, 30]), 12);
        assert_eq!(effective_rate(0, None, &[7, 12]), 7);
        // The ceiling bounds only what the CA imposes, not the own rate.
        assert_eq!(effective_rate(0, Some(20), &[50]), 50);
        // Nothing known: the default.
        assert_eq!(effective_rate(0, None, &[0, 0]), DEFAULT_CHECKS_PER_SECOND);
        assert_eq!(effective_rate(0, Some(5), &[]), DEFAULT_CHECKS_PER_SECOND);
    }

    #[test]
    fn the_budget_warns_above_not_at_its_limit() {
        let at = estimate_budget(6000, 20, 6000);
        assert!(!at.over_budget);
        assert_eq!(at.cycle, Duration::from_secs(300));
        assert_eq!(at.checks_per_cycle, 6000);
        let over = estimate_budget(6001, 20, 6000);
        assert!(over.over_budget);
        assert_eq!(over.cycle, Duration::from_millis(300_050));
        // The budget is configurable.
        assert!(estimate_budget(101, 20, 100).over_budget);
        assert!(!estimate_budget(100, 20, 100).over_budget);
    }

    #[test]
    fn estimated_checks_counts_addresses_times_ports() {
        let s = segment(
            &["jira.lanukcorp.com", "10.1.1.1", "*.safemarch.com"],
            &["80", "8000-8001"],
            &["3389"],
        );
        // (2 per FQDN + 1 IP + 0 wildcard) x 4 ports.
        assert_eq!(estimated_checks(&s, 2), 12);
        assert_eq!(estimated_checks(&s, 0), 4);
    }
}
