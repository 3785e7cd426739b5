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

use crate::host::Host;
use crate::model::{AppEntry, Protocol, Segment};

/// A user request.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    /// FQDN or IP literal, normalised.
    pub host: Host,
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

    /// Matches a request. The host is normalised already (`Host`), so
    /// names compare case-insensitively and a trailing dot is ignored.
    pub fn match_request(&self, request: &Request) -> MatchOutcome {
        let mut tiers: Vec<&[Hit]> = Vec::new();
        match request.host.ip() {
            Some(ip) => self.ip_tiers(ip, &mut tiers),
            None => self.name_tiers(&request.host, &mut tiers),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::{SegmentSpec, validate_segment};

    /// An on-access segment (so multimatch and discovery entries are allowed).
    fn seg(name: &str, apps: &[&str], tcp: &[&str], udp: &[&str], multimatch: bool) -> Segment {
        validate_segment(&SegmentSpec {
            name: name.into(),
            applications: apps.iter().map(|&a| a.into()).collect(),
            tcp_ports: tcp.iter().map(|&p| p.into()).collect(),
            udp_ports: udp.iter().map(|&p| p.into()).collect(),
            health_reporting: Some("on_access".into()),
            multimatch,
            connector_groups: vec!["dc-east".into()],
            ..SegmentSpec::default()
        })
        .expect("valid segment")
    }

    fn tcp(host: &str, port: u16) -> Request {
        Request {
            host: host.parse().expect("host"),
            protocol: Protocol::Tcp,
            port,
        }
    }

    fn udp(host: &str, port: u16) -> Request {
        Request {
            protocol: Protocol::Udp,
            ..tcp(host, port)
        }
    }

    /// The name of the segment a request matched, or the outcome otherwise.
    fn decide(segments: &[Segment], request: &Request) -> Result<String, MatchOutcome> {
        match SegmentIndex::new(segments).match_request(request) {
            MatchOutcome::Matched(m) => Ok(segments[m.segment].name.clone()),
            other => Err(other),
        }
    }

    fn matched(segments: &[Segment], request: &Request) -> String {
        decide(segments, request).unwrap_or_else(|o| panic!("{request:?} did not match: {o:?}"))
    }

    /// The deciding segment's name for a `PortNotInSegment` refusal.
    fn port_refused(segments: &[Segment], request: &Request) -> String {
        match decide(segments, request) {
            Err(MatchOutcome::PortNotInSegment(m)) => segments[m.segment].name.clone(),
            other => panic!("{request:?}: expected PortNotInSegment, got {other:?}"),
        }
    }

    #[test]
    fn an_exact_name_beats_a_wildcard() {
        for segments in [
            vec![
                seg("wild", &["*.lanukcorp.com"], &["80", "443"], &[], false),
                seg("jira", &["jira.lanukcorp.com"], &["80"], &[], false),
            ],
            vec![
                seg("jira", &["jira.lanukcorp.com"], &["80"], &[], false),
                seg("wild", &["*.lanukcorp.com"], &["80", "443"], &[], false),
            ],
        ] {
            assert_eq!(matched(&segments, &tcp("jira.lanukcorp.com", 80)), "jira");
            assert_eq!(matched(&segments, &tcp("wiki.lanukcorp.com", 80)), "wild");
        }
    }

    #[test]
    fn the_longest_wildcard_suffix_wins() {
        for segments in [
            vec![
                seg("corp", &["*.lanukcorp.com"], &["80"], &[], false),
                seg("dev", &["*.dev.lanukcorp.com"], &["80"], &[], false),
            ],
            vec![
                seg("dev", &["*.dev.lanukcorp.com"], &["80"], &[], false),
                seg("corp", &["*.lanukcorp.com"], &["80"], &[], false),
            ],
        ] {
            assert_eq!(matched(&segments, &tcp("x.dev.lanukcorp.com", 80)), "dev");
            assert_eq!(matched(&segments, &tcp("a.b.dev.lanukcorp.com", 80)), "dev");
            assert_eq!(matched(&segments, &tcp("x.lanukcorp.com", 80)), "corp");
            // `dev.lanukcorp.com` itself is below `*.lanukcorp.com` only.
            assert_eq!(matched(&segments, &tcp("dev.lanukcorp.com", 80)), "corp");
            // A wildcard does not match its own apex.
            assert_eq!(
                decide(&segments, &tcp("lanukcorp.com", 80)),
                Err(MatchOutcome::NoSegment)
            );
            // A suffix must end on a label boundary.
            assert_eq!(
                decide(&segments, &tcp("xlanukcorp.com", 80)),
                Err(MatchOutcome::NoSegment)
            );
        }
    }

    #[test]
    fn an_exact_ip_beats_the_longest_prefix_v4() {
        let segments = [
            seg("slash8", &["10.0.0.0/8"], &["80"], &[], false),
            seg("slash24", &["10.1.1.0/24"], &["80"], &[], false),
            seg("exact", &["10.1.1.1"], &["80"], &[], false),
            seg("slash16", &["10.1.0.0/16"], &["80"], &[], false),
            seg("all", &["0.0.0.0/0"], &["80"], &[], false),
        ];
        assert_eq!(matched(&segments, &tcp("10.1.1.1", 80)), "exact");
        assert_eq!(matched(&segments, &tcp("10.1.1.2", 80)), "slash24");
        assert_eq!(matched(&segments, &tcp("10.1.2.1", 80)), "slash16");
        assert_eq!(matched(&segments, &tcp("10.2.0.1", 80)), "slash8");
        assert_eq!(matched(&segments, &tcp("192.0.2.1", 80)), "all");
        // An IPv4 catch-all does not match IPv6.
        assert_eq!(
            decide(&segments, &tcp("2001:db8::1", 80)),
            Err(MatchOutcome::NoSegment)
        );
    }

    #[test]
    fn an_exact_ip_beats_the_longest_prefix_v6() {
        let segments = [
            seg("slash16", &["fd00::/16"], &["80"], &[], false),
            seg("exact", &["fd00::1"], &["80"], &[], false),
            seg("slash64", &["fd00::/64"], &["80"], &[], false),
            seg("v4", &["10.0.0.0/8"], &["80"], &[], false),
        ];
        assert_eq!(matched(&segments, &tcp("fd00::1", 80)), "exact");
        assert_eq!(matched(&segments, &tcp("FD00::1", 80)), "exact");
        assert_eq!(matched(&segments, &tcp("fd00::2", 80)), "slash64");
        assert_eq!(matched(&segments, &tcp("fd00:0:0:1::1", 80)), "slash16");
        assert_eq!(
            decide(&segments, &tcp("fe80::1", 80)),
            Err(MatchOutcome::NoSegment)
        );
    }

    #[test]
    fn exclusive_refuses_when_the_most_specific_segment_lacks_the_port() {
        let segments = [
            seg(
                "broad",
                &["*.lanukcorp.com", "10.1.0.0/16"],
                &["80", "443"],
                &["53"],
                false,
            ),
            seg(
                "jira",
                &["jira.lanukcorp.com", "10.1.1.1"],
                &["80"],
                &[],
                false,
            ),
        ];
        assert_eq!(matched(&segments, &tcp("jira.lanukcorp.com", 80)), "jira");
        // `broad` has 443, but `jira` is more specific and decides.
        assert_eq!(
            port_refused(&segments, &tcp("jira.lanukcorp.com", 443)),
            "jira"
        );
        assert_eq!(port_refused(&segments, &tcp("10.1.1.1", 443)), "jira");
        // The protocol matters too.
        assert_eq!(
            port_refused(&segments, &udp("jira.lanukcorp.com", 80)),
            "jira"
        );
        assert_eq!(port_refused(&segments, &udp("10.1.1.1", 53)), "jira");
        // Less specific requests still reach `broad`.
        assert_eq!(matched(&segments, &tcp("wiki.lanukcorp.com", 443)), "broad");
        assert_eq!(matched(&segments, &udp("10.1.9.9", 53)), "broad");
        assert_eq!(port_refused(&segments, &tcp("10.1.9.9", 22)), "broad");
    }

    #[test]
    fn the_refusal_names_the_entry_that_matched() {
        let segments = [seg(
            "jira",
            &["wiki.lanukcorp.com", "jira.lanukcorp.com"],
            &["80"],
            &[],
            false,
        )];
        let index = SegmentIndex::new(&segments);
        assert_eq!(
            index.match_request(&tcp("jira.lanukcorp.com", 80)),
            MatchOutcome::Matched(Match {
                segment: 0,
                entry: 1
            })
        );
        assert_eq!(
            index.match_request(&tcp("jira.lanukcorp.com", 81)),
            MatchOutcome::PortNotInSegment(Match {
                segment: 0,
                entry: 1
            })
        );
    }

    #[test]
    fn multimatch_picks_the_most_specific_segment_with_the_port() {
        let segments = [
            seg("example", &["*.example.com"], &["443", "22"], &[], true),
            seg("corp", &["*.corp.example.com"], &["443", "8080"], &[], true),
            seg("jira", &["jira.corp.example.com"], &["80"], &[], true),
        ];
        let host = "jira.corp.example.com";
        assert_eq!(matched(&segments, &tcp(host, 80)), "jira");
        assert_eq!(matched(&segments, &tcp(host, 443)), "corp");
        assert_eq!(matched(&segments, &tcp(host, 8080)), "corp");
        assert_eq!(matched(&segments, &tcp(host, 22)), "example");
        assert_eq!(port_refused(&segments, &tcp(host, 25)), "jira");
        assert_eq!(matched(&segments, &tcp("x.example.com", 443)), "example");
        assert_eq!(
            port_refused(&segments, &tcp("x.example.com", 8080)),
            "example"
        );
    }

    #[test]
    fn multimatch_works_for_addresses_too() {
        let segments = [
            seg("net16", &["10.1.0.0/16"], &["22"], &[], true),
            seg("net24", &["10.1.1.0/24"], &["443"], &[], true),
            seg("host", &["10.1.1.1"], &["80"], &[], true),
        ];
        assert_eq!(matched(&segments, &tcp("10.1.1.1", 80)), "host");
        assert_eq!(matched(&segments, &tcp("10.1.1.1", 443)), "net24");
        assert_eq!(matched(&segments, &tcp("10.1.1.1", 22)), "net16");
        assert_eq!(port_refused(&segments, &tcp("10.1.1.1", 25)), "host");
    }

    #[test]
    fn an_exclusive_segment_in_the_top_tier_decides_alone() {
        let segments = [
            seg("wide", &["*.example.com"], &["443"], &[], true),
            seg("jira", &["jira.example.com"], &["80"], &[], false),
        ];
        assert_eq!(matched(&segments, &tcp("jira.example.com", 80)), "jira");
        assert_eq!(
            port_refused(&segments, &tcp("jira.example.com", 443)),
            "jira"
        );
    }

    #[test]
    fn inclusive_matching_skips_less_specific_exclusive_segments() {
        let segments = [
            seg("wide", &["*.example.com"], &["443"], &[], false),
            seg("jira", &["jira.example.com"], &["80"], &[], true),
        ];
        assert_eq!(matched(&segments, &tcp("jira.example.com", 80)), "jira");
        // `wide` is not multimatch, so it is not among the inclusive choices.
        assert_eq!(
            port_refused(&segments, &tcp("jira.example.com", 443)),
            "jira"
        );
    }

    #[test]
    fn ties_go_to_a_segment_with_the_port_then_to_the_first_listed() {
        let segments = [
            seg("first", &["jira.example.com"], &["80"], &[], false),
            seg("second", &["jira.example.com"], &["80", "443"], &[], false),
        ];
        assert_eq!(matched(&segments, &tcp("jira.example.com", 80)), "first");
        assert_eq!(matched(&segments, &tcp("jira.example.com", 443)), "second");
        assert_eq!(
            port_refused(&segments, &tcp("jira.example.com", 22)),
            "first"
        );
    }

    #[test]
    fn host_names_are_case_insensitive_and_ignore_a_trailing_dot() {
        let segments = [
            seg("jira", &["jira.lanukcorp.com"], &["80"], &[], false),
            seg("dev", &["*.dev.lanukcorp.com"], &["80"], &[], false),
            seg("ip", &["10.1.1.1"], &["80"], &[], false),
        ];
        for host in [
            "JIRA.LanukCorp.COM",
            "jira.lanukcorp.com.",
            "Jira.LANUKCORP.com.",
        ] {
            assert_eq!(matched(&segments, &tcp(host, 80)), "jira", "{host}");
        }
        for host in [
            "X.DEV.lanukcorp.com",
            "x.dev.lanukcorp.com.",
            "A.B.Dev.LanukCorp.Com.",
        ] {
            assert_eq!(matched(&segments, &tcp(host, 80)), "dev", "{host}");
        }
        assert_eq!(matched(&segments, &tcp("10.1.1.1.", 80)), "ip");
    }

    #[test]
    fn unmatched_hosts_have_no_segment() {
        let segments = [
            seg("jira", &["jira.lanukcorp.com"], &["80"], &[], false),
            seg("net", &["10.1.0.0/16"], &["80"], &[], false),
        ];
        for host in ["wiki.lanukcorp.com", "lanukcorp.com", "10.2.0.1", "::1"] {
            assert_eq!(
                decide(&segments, &tcp(host, 80)),
                Err(MatchOutcome::NoSegment),
                "{host:?}"
            );
        }
        // Texts that name no host never become a request.
        for host in ["", "."] {
            assert!(Host::parse(host).is_err(), "{host:?}");
        }
        assert_eq!(
            SegmentIndex::new(&[]).match_request(&tcp("jira.lanukcorp.com", 80)),
            MatchOutcome::NoSegment
        );
    }
}
