//! Check planning: which (address, protocol, port) targets a segment needs,
//! how many checks a cycle holds, and how long a cycle takes at a rate limit.

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
