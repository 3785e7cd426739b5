//! Request matching: which segment a user request (host, protocol, port)
//! falls under.
//!
//! A host name matches FQDN and wildcard entries, an IP literal matches IP
//! and subnet entries. Specificity: an exact name beats any wildcard, a longer
//! wildcard suffix beats a shorter one; an exact IP beats any subnet, a longer
//! prefix beats a shorter one.
//!
//! - Exclusive (the default): the most specific match decides. If the most
//!   specific tier holds a non-multimatch segment, the request belongs to it;
//!   if it does not include the protocol/port, the request is refused with
//!   `PortNotInSegment`, even when a less specific segment has the port.
//! - Inclusive: when the most specific tier holds only multimatch segments,
//!   every multimatch segment whose domain matches is considered, most specific
//!   first, and the first that includes the protocol/port decides.
//! - Ties within a tier (the same entry in two segments) go to a segment that
//!   includes the port, then to the segment listed first in the policy.
//!
//! `SegmentIndex` answers in time independent of the number of segments
//! (hash lookups per label and per prefix length), so 10,000 segments cost
//! no more per request than 10.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::model::{AppEntry, Protocol, Segment};

/// A user request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    /// FQDN or IP literal.
    pub host: String,
    /// Protocol.
    pub protocol: Protocol,
    /// Destination port.
    pub port: u16,
}

/// A matched segment with the entry that matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    /// Index of the segment in the slice the index was built from.
    pub segment: usize,
    /// Index of the matching entry in the segment's `applications`.
    pub entry: usize,
}

/// The outcome of matching a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchOutcome {
    /// The request belongs to this segment.
    Matched(Match),
    /// No segment's applications match the host.
    NoSegment,
    /// The deciding segment does not include the protocol/port.
    PortNotInSegment(Match),
}

/// A (segment, entry) pair.
type Hit = (u32, u32);

/// An index over segments' application entries for fast matching.
#[derive(Clone, Debug, Default)]
pub struct SegmentIndex {
    exact_names: HashMap<String, Vec<Hit>>,
    wildcards: HashMap<String, Vec<Hit>>,
    exact_ips: HashMap<IpAddr, Vec<Hit>>,
    /// Subnets grouped by prefix length, longest first.
    subnets: Vec<(u8, HashMap<IpNet, Vec<Hit>>)>,
    /// Per segment: (multimatch, tcp ranges, udp ranges) copied for lookups.
    segments: Vec<SegmentPorts>,
}

#[derive(Clone, Debug)]
struct SegmentPorts {
    multimatch: bool,
    tcp: Vec<(u16, u16)>,
    udp: Vec<(u16, u16)>,
}

impl SegmentPorts {
    fn includes(&self, protocol: Protocol, port: u16) -> bool {
        let ranges = match protocol {
            Protocol::Tcp => &self.tcp,
            Protocol::Udp => &self.udp,
        };
        ranges.iter().any(|&(a, b)| a <= port && port <= b)
    }
}

impl SegmentIndex {
    /// Builds the index. `Match::segment` values index into `segments`.
    pub fn new(segments: &[Segment]) -> Self {
        let mut index = SegmentIndex::default();
        let mut subnets: HashMap<u8, HashMap<IpNet, Vec<Hit>>> = HashMap::new();
        for (si, segment) in segments.iter().enumerate() {
            index.segments.push(SegmentPorts {
                multimatch: segment.multimatch,
                tcp: segment
                    .tcp_ports
                    .iter()
                    .map(|r| (r.start(), r.end()))
                    .collect(),
                udp: segment
                    .udp_ports
                    .iter()
                    .map(|r| (r.start(), r.end()))
                    .collect(),
            });
            for (ei, entry) in segment.applications.iter().enumerate() {
                let hit = (si as u32, ei as u32);
                match entry {
                    AppEntry::Fqdn(name) => {
                        index.exact_names.entry(name.clone()).or_default().push(hit)
                    }
                    AppEntry::Wildcard(suffix) => {
                        index.wildcards.entry(suffix.clone()).or_default().push(hit)
                    }
                    AppEntry::Ip(ip) => index.exact_ips.entry(*ip).or_default().push(hit),
                    AppEntry::Subnet(net) => subnets
                        .entry(net.prefix_len())
                        .or_default()
                        .entry(*net)
                        .or_default()
                        .push(hit),
                }
            }
        }
        let mut subnets: Vec<_> = subnets.into_iter().collect();
        subnets.sort_by_key(|s| std::cmp::Reverse(s.0));
        index.subnets = subnets;
        index
    }

    /// Matches a request. Host names are compared case-insensitively and a
    /// trailing dot is ignored.
    pub fn match_request(&self, request: &Request) -> MatchOutcome {
        let mut tiers: Vec<&[Hit]> = Vec::new();
        let host = request.host.trim_end_matches('.');
        if let Ok(ip) = host.parse::<IpAddr>() {
            self.ip_tiers(ip, &mut tiers);
        } else if host.bytes().any(|b| b.is_ascii_uppercase()) {
            self.name_tiers(&host.to_ascii_lowercase(), &mut tiers);
        } else {
            self.name_tiers(host, &mut tiers);
        }
        self.decide(&tiers, request.protocol, request.port)
    }

    fn name_tiers<'a>(&'a self, host: &str, tiers: &mut Vec<&'a [Hit]>) {
        if let Some(hits) = self.exact_names.get(host) {
            tiers.push(hits);
        }
        // Wildcard suffixes from the longest (one label stripped) down.
        let mut rest = host;
        while let Some((_, suffix)) = rest.split_once('.') {
            if let Some(hits) = self.wildcards.get(suffix) {
                tiers.push(hits);
            }
            rest = suffix;
        }
    }

    fn ip_tiers<'a>(&'a self, ip: IpAddr, tiers: &mut Vec<&'a [Hit]>) {
        if let Some(hits) = self.exact_ips.get(&ip) {
            tiers.push(hits);
        }
        for (len, nets) in &self.subnets {
            if let Ok(net) = IpNet::new(ip, *len)
                && let Some(hits) = nets.get(&net.trunc())
            {
                tiers.push(hits);
            }
        }
    }

    fn decide(&self, tiers: &[&[Hit]], protocol: Protocol, port: u16) -> MatchOutcome {
        let Some(top) = tiers.first() else {
            return MatchOutcome::NoSegment;
        };
        let to_match = |&(s, e): &Hit| Match {
            segment: s as usize,
            entry: e as usize,
        };
        let seg = |&(s, _): &Hit| &self.segments[s as usize];
        // Hits are in segment order, so the first qualifying hit is the
        // segment listed first in the policy.
        if let Some(first_exclusive) = top.iter().find(|h| !seg(h).multimatch) {
            return match top
                .iter()
                .find(|h| !seg(h).multimatch && seg(h).includes(protocol, port))
            {
                Some(h) => MatchOutcome::Matched(to_match(h)),
                None => MatchOutcome::PortNotInSegment(to_match(first_exclusive)),
            };
        }
        for tier in tiers {
            if let Some(h) = tier
                .iter()
                .find(|h| seg(h).multimatch && seg(h).includes(protocol, port))
            {
                return MatchOutcome::Matched(to_match(h));
            }
        }
        MatchOutcome::PortNotInSegment(to_match(&top[0]))
    }
}
