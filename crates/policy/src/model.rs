//! The validated policy model: connector groups, application segments, their
//! application entries and ports. Values of these types are always valid;
//! `validate` is the only way to build them from operator input.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use crate::check::AppCheck;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::damping::Damping;
use crate::host::Host;
use crate::location::Location;

/// Transport protocol of an application port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// Checked with a TCP three-way handshake.
    Tcp,
    /// Checked with an ICMP echo, then a TCP fallback.
    Udp,
}

impl Protocol {
    /// The lower-case name used in config, JSON and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Protocol::Tcp),
            "udp" => Ok(Protocol::Udp),
            other => Err(format!(
                "unknown protocol {other:?} (expected \"tcp\" or \"udp\")"
            )),
        }
    }
}

/// An inclusive port range; a single port has `start == end`.
/// Invariant: `1 <= start <= end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRange {
    start: u16,
    end: u16,
}

impl PortRange {
    /// A range, or `None` when it would be empty, inverted or include port 0.
    pub fn new(start: u16, end: u16) -> Option<Self> {
        (start >= 1 && start <= end).then_some(PortRange { start, end })
    }

    /// A single port (`None` for port 0).
    pub fn single(port: u16) -> Option<Self> {
        Self::new(port, port)
    }

    /// First port.
    pub fn start(&self) -> u16 {
        self.start
    }

    /// Last port (inclusive).
    pub fn end(&self) -> u16 {
        self.end
    }

    /// Number of ports in the range.
    pub fn len(&self) -> u32 {
        u32::from(self.end - self.start) + 1
    }

    /// Never empty; present for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether `port` lies in the range.
    pub fn contains(&self, port: u16) -> bool {
        self.start <= port && port <= self.end
    }

    /// Whether two ranges share a port.
    pub fn overlaps(&self, other: &PortRange) -> bool {
        self.start <= other.end && other.start <= self.end
    }

    /// Every port of the range.
    pub fn ports(&self) -> std::ops::RangeInclusive<u16> {
        self.start..=self.end
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.start)
        } else {
            write!(f, "{}-{}", self.start, self.end)
        }
    }
}

/// One application entry of a segment.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AppEntry {
    /// A fully qualified domain name, lower-case, without trailing dot.
    Fqdn(String),
    /// An IP address.
    Ip(IpAddr),
    /// `*.suffix`: matches every name below `suffix` (stored lower-case,
    /// without the `*.`). Makes the segment an application discovery segment.
    Wildcard(String),
    /// An IP subnet (host bits zero). Makes the segment an application
    /// discovery segment.
    Subnet(IpNet),
}

impl AppEntry {
    /// Whether this entry makes its segment an application discovery segment.
    pub fn is_discovery(&self) -> bool {
        matches!(self, AppEntry::Wildcard(_) | AppEntry::Subnet(_))
    }

    /// The host that health checks and the dashboard name (FQDN or IP
    /// literal); `None` for discovery entries, which name no single host
    /// (and for an FQDN that is no host name, which validation never
    /// builds).
    pub fn host(&self) -> Option<Host> {
        match self {
            AppEntry::Fqdn(name) => Host::parse(name).ok(),
            AppEntry::Ip(ip) => Some(Host::from(*ip)),
            AppEntry::Wildcard(_) | AppEntry::Subnet(_) => None,
        }
    }
}

impl AppEntry {
    /// Whether `host` (a lower-case name without trailing dot, or an IP
    /// literal whose parse is `ip`) is this entry or lies under it: an FQDN
    /// or IP matches itself, a wildcard every name at any depth below its
    /// suffix (not the suffix itself), a subnet every address in it. The rule
    /// `SegmentIndex` applies with hash lookups, for one entry.
    pub fn matches(&self, host: &str, ip: Option<IpAddr>) -> bool {
        match (self, ip) {
            (AppEntry::Fqdn(name), None) => name == host,
            (AppEntry::Wildcard(suffix), None) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (AppEntry::Ip(a), Some(b)) => *a == b,
            (AppEntry::Subnet(net), Some(b)) => net.contains(&b),
            _ => false,
        }
    }
}

impl fmt::Display for AppEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppEntry::Fqdn(name) => f.write_str(name),
            AppEntry::Ip(ip) => write!(f, "{ip}"),
            AppEntry::Wildcard(suffix) => write!(f, "*.{suffix}"),
            AppEntry::Subnet(net) => write!(f, "{net}"),
        }
    }
}

/// How a segment's applications are health checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthReporting {
    /// Connectors keep checking every target and report every interval.
    Continuous,
    /// Checks start on a user's access and last for the on-access window.
    OnAccess,
    /// No checks; every connected connector counts as reaching it.
    None,
}

impl HealthReporting {
    /// The name used in config and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthReporting::Continuous => "continuous",
            HealthReporting::OnAccess => "on_access",
            HealthReporting::None => "none",
        }
    }
}

impl fmt::Display for HealthReporting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for HealthReporting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "continuous" => Ok(HealthReporting::Continuous),
            "on_access" => Ok(HealthReporting::OnAccess),
            "none" => Ok(HealthReporting::None),
            other => Err(format!(
                "unknown value {other:?} (expected \"continuous\", \"on_access\" or \"none\"){}",
                did_you_mean(other, ["continuous", "on_access", "none"])
            )),
        }
    }
}

/// Selection strategy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Random among connectors reporting the application reachable.
    #[default]
    Healthy,
    /// Random eligible group, then a random non-Down connector of it.
    Group,
    /// Random among the reachable connectors nearest to the application
    /// (smoothed RTT within a tolerance of the best).
    Nearest,
}

impl Strategy {
    /// The name used in config and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Healthy => "healthy",
            Strategy::Group => "group",
            Strategy::Nearest => "nearest",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "healthy" => Ok(Strategy::Healthy),
            "group" => Ok(Strategy::Group),
            "nearest" => Ok(Strategy::Nearest),
            other => Err(format!(
                "unknown strategy {other:?} (expected \"healthy\", \"group\" or \"nearest\"){}",
                did_you_mean(other, ["healthy", "group", "nearest"])
            )),
        }
    }
}

/// The candidate closest to `word` by edit distance, when it is close
/// enough to be a typo of it (at most a third of its letters, at least
/// one, changed): what "did you mean" offers for an unknown key or value.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let most = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, _)| *d <= most)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// `; did you mean "x"?` for the closest candidate, or nothing.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    closest(word, candidates).map_or_else(String::new, |c| format!("; did you mean {c:?}?"))
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// A validated application segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Unique name.
    pub name: String,
    /// Application entries, in configuration order, without duplicates.
    pub applications: Vec<AppEntry>,
    /// TCP ports, sorted, non-overlapping.
    pub tcp_ports: Vec<PortRange>,
    /// UDP ports, sorted, non-overlapping.
    pub udp_ports: Vec<PortRange>,
    /// Health reporting mode.
    pub health_reporting: HealthReporting,
    /// How often connectors report (and re-check) this segment's applications.
    pub report_interval: Duration,
    /// Inclusive (multimatch) matching.
    pub multimatch: bool,
    /// Hidden from the Health dashboard and API.
    pub client_hostname_validation: bool,
    /// Connector groups serving this segment (all exist in the policy).
    pub connector_groups: Vec<String>,
    /// Flap damping: consecutive results a connector needs before it shows
    /// a change of the application's status (`Damping::default()` = 1 / 1,
    /// every result shows at once).
    pub damping: Damping,
    /// The selection strategy for this segment; `None` follows the CA's
    /// `[selection] strategy`.
    pub strategy: Option<Strategy>,
    /// What a check of a TCP port does after the handshake (UDP ports are
    /// checked as always).
    pub check: AppCheck,
}

impl Segment {
    /// The ranges of one protocol.
    pub fn ports(&self, protocol: Protocol) -> &[PortRange] {
        match protocol {
            Protocol::Tcp => &self.tcp_ports,
            Protocol::Udp => &self.udp_ports,
        }
    }

    /// Ports counted port by port across TCP and UDP.
    pub fn port_count(&self) -> u32 {
        self.tcp_ports
            .iter()
            .chain(&self.udp_ports)
            .map(PortRange::len)
            .sum()
    }

    /// Whether the segment includes `port` on `protocol`.
    pub fn includes(&self, protocol: Protocol, port: u16) -> bool {
        self.ports(protocol).iter().any(|r| r.contains(port))
    }

    /// Whether the segment has a wildcard or subnet entry.
    pub fn is_discovery(&self) -> bool {
        self.applications.iter().any(AppEntry::is_discovery)
    }

    /// Whether `group` serves this segment.
    pub fn served_by(&self, group: &str) -> bool {
        self.connector_groups.iter().any(|g| g == group)
    }

    /// Every application (host × protocol × port) a continuous segment
    /// reports: FQDN and IP entries crossed with every port, ranges expanded.
    /// Discovery entries name no host and yield nothing.
    pub fn applications(&self) -> Vec<AppKey> {
        let hosts: Vec<Host> = self
            .applications
            .iter()
            .filter_map(AppEntry::host)
            .collect();
        let mut out = Vec::new();
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            for range in self.ports(protocol) {
                for port in range.ports() {
                    for host in &hosts {
                        out.push(AppKey {
                            segment: self.name.clone(),
                            host: host.clone(),
                            protocol,
                            port,
                        });
                    }
                }
            }
        }
        out
    }
}

/// Which address families a connector group's connectors resolve
/// application names to (the commercial product's per-group "DNS
/// resolution" choice): a connector host without IPv6 asks only A records,
/// so a dual-stack application does not show Unhealthy there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DnsResolution {
    /// A records only.
    Ipv4,
    /// AAAA records only.
    Ipv6,
    /// A and AAAA records (the default).
    #[default]
    Dual,
}

impl DnsResolution {
    /// The name used in config and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            DnsResolution::Ipv4 => "ipv4",
            DnsResolution::Ipv6 => "ipv6",
            DnsResolution::Dual => "dual",
        }
    }

    /// Whether addresses of `ip`'s family are asked for.
    pub fn wants(self, ip: IpAddr) -> bool {
        match self {
            DnsResolution::Ipv4 => ip.is_ipv4(),
            DnsResolution::Ipv6 => ip.is_ipv6(),
            DnsResolution::Dual => true,
        }
    }
}

impl fmt::Display for DnsResolution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DnsResolution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ipv4" => Ok(DnsResolution::Ipv4),
            "ipv6" => Ok(DnsResolution::Ipv6),
            "dual" => Ok(DnsResolution::Dual),
            other => Err(format!(
                "unknown value {other:?} (expected \"ipv4\", \"ipv6\" or \"dual\")"
            )),
        }
    }
}

/// A connector group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectorGroup {
    /// Unique name.
    pub name: String,
    /// Which DNS records its connectors ask for.
    pub dns_resolution: DnsResolution,
    /// Where its connectors are, if configured: `nearest` adds the round
    /// trip from the user's location to it (see `select`).
    pub location: Option<Location>,
}

/// A validated policy: every segment's groups exist and names are unique.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Connector groups, in configuration order.
    pub connector_groups: Vec<ConnectorGroup>,
    /// Segments, in configuration order.
    pub segments: Vec<Segment>,
}

impl Policy {
    /// The segment named `name`.
    pub fn segment(&self, name: &str) -> Option<&Segment> {
        self.segments.iter().find(|s| s.name == name)
    }

    /// Whether a group named `name` exists.
    pub fn has_group(&self, name: &str) -> bool {
        self.connector_groups.iter().any(|g| g.name == name)
    }

    /// The group named `name`.
    pub fn group(&self, name: &str) -> Option<&ConnectorGroup> {
        self.connector_groups.iter().find(|g| g.name == name)
    }

    /// The segments `group` serves.
    pub fn segments_for_group<'a>(&'a self, group: &'a str) -> impl Iterator<Item = &'a Segment> {
        self.segments.iter().filter(move |s| s.served_by(group))
    }
}

/// Identifies one application: a host of a segment on one protocol and port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AppKey {
    /// Segment name.
    pub segment: String,
    /// FQDN or IP literal, normalised.
    pub host: Host,
    /// Protocol.
    pub protocol: Protocol,
    /// Port.
    pub port: u16,
}

impl fmt::Display for AppKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}/{} (segment {:?})",
            self.host, self.port, self.protocol, self.segment
        )
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn entries_match_their_hosts_and_what_lies_under_them() {
        let m = |entry: AppEntry, host: &str| entry.matches(host, host.parse().ok());
        assert!(m(AppEntry::Fqdn("a.example.com".into()), "a.example.com"));
        assert!(!m(AppEntry::Fqdn("a.example.com".into()), "b.example.com"));
        let wild = || AppEntry::Wildcard("example.com".into());
        assert!(m(wild(), "a.example.com"));
        assert!(m(wild(), "x.y.example.com"));
        assert!(!m(wild(), "example.com"));
        assert!(!m(wild(), "aexample.com"));
        assert!(!m(wild(), ".example.com"));
        let net = || AppEntry::Subnet("10.122.0.0/16".parse().expect("net"));
        assert!(m(net(), "10.122.9.9"));
        assert!(!m(net(), "10.123.0.1"));
        assert!(m(AppEntry::Ip("10.1.1.1".parse().expect("ip")), "10.1.1.1"));
        // A name never matches an IP entry and an IP never a name entry.
        assert!(!m(net(), "10.122.example.com"));
        assert!(!m(AppEntry::Fqdn("10.1.1.1".into()), "10.1.1.1"));
    }
    use super::*;

    #[test]
    fn closest_offers_a_near_candidate_only() {
        let c = ["healthy", "group", "nearest"];
        assert_eq!(closest("neareast", c), Some("nearest"));
        assert_eq!(closest("grop", c), Some("group"));
        assert_eq!(closest("fastest", c), None);
        assert_eq!(
            closest("strategyy", ["strategy", "discovery_timeout_ms"]),
            Some("strategy")
        );
        assert!(
            "neareast"
                .parse::<Strategy>()
                .is_err_and(|e| e.ends_with("; did you mean \"nearest\"?"))
        );
    }
    use crate::validate::{SegmentSpec, validate_segment};

    #[test]
    fn port_ranges_are_never_empty_inverted_or_zero() {
        assert_eq!(PortRange::new(0, 10), None);
        assert_eq!(PortRange::single(0), None);
        assert_eq!(PortRange::new(10, 9), None);
        let r = PortRange::new(8000, 8100).unwrap();
        assert_eq!((r.start(), r.end(), r.len()), (8000, 8100, 101));
        assert_eq!(PortRange::new(1, 65535).unwrap().len(), 65535);
        assert!(r.contains(8000) && r.contains(8100) && !r.contains(8101));
        assert!(r.overlaps(&PortRange::single(8100).unwrap()));
        assert!(!r.overlaps(&PortRange::new(8101, 9000).unwrap()));
        assert_eq!(r.to_string(), "8000-8100");
        assert_eq!(PortRange::single(80).unwrap().to_string(), "80");
    }

    #[test]
    fn a_segment_lists_one_application_per_host_protocol_and_port() {
        let s = validate_segment(&SegmentSpec {
            name: "jira".into(),
            applications: vec![
                "jira.lanukcorp.com".into(),
                "10.1.1.1".into(),
                "*.safemarch.com".into(),
            ],
            tcp_ports: vec!["80-81".into()],
            udp_ports: vec!["3389".into()],
            health_reporting: Some("on_access".into()),
            connector_groups: vec!["dc-east".into()],
            ..SegmentSpec::default()
        })
        .unwrap();
        let keys: Vec<String> = s
            .applications()
            .iter()
            .map(|k| format!("{}:{}/{}", k.host, k.port, k.protocol))
            .collect();
        assert_eq!(
            keys,
            vec![
                "jira.lanukcorp.com:80/tcp",
                "10.1.1.1:80/tcp",
                "jira.lanukcorp.com:81/tcp",
                "10.1.1.1:81/tcp",
                "jira.lanukcorp.com:3389/udp",
                "10.1.1.1:3389/udp",
            ]
        );
        assert!(s.applications().iter().all(|k| k.segment == "jira"));
        assert!(s.includes(Protocol::Tcp, 81) && !s.includes(Protocol::Udp, 81));
        assert!(s.served_by("dc-east") && !s.served_by("dc-west"));
    }

    #[test]
    fn names_parse_and_print() {
        assert_eq!("TCP".parse::<Protocol>(), Ok(Protocol::Tcp));
        assert_eq!("udp".parse::<Protocol>(), Ok(Protocol::Udp));
        assert!("icmp".parse::<Protocol>().is_err());
        for m in [
            HealthReporting::Continuous,
            HealthReporting::OnAccess,
            HealthReporting::None,
        ] {
            assert_eq!(m.as_str().parse::<HealthReporting>(), Ok(m));
        }
        assert_eq!(
            AppEntry::Wildcard("safemarch.com".into()).to_string(),
            "*.safemarch.com"
        );
        assert_eq!(AppEntry::Wildcard("safemarch.com".into()).host(), None);
        assert_eq!(
            AppEntry::Ip("fd00::1".parse().unwrap()).host().as_deref(),
            Some("fd00::1")
        );
    }
}
