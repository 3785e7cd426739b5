//! The policy in force as the CA uses it (`PolicyState`): the validated
//! configuration, the matching index, and per segment the report hosts in
//! a form cheap to test, plus the rule deciding which applications a
//! connector group may report (`app_allowed`). Replaced whole on reload.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use policy::{AppEntry, AppKey, HealthReporting, Policy, Protocol, Segment, SegmentIndex};
use protocol::v1;

use crate::config::{Config, Settings};

/// The policy and settings in force; replaced whole on reload, so readers
/// see one consistent version by cloning the `Arc`.
#[derive(Debug)]
pub struct PolicyState {
    /// The configuration.
    pub config: Config,
    /// Matching index over `config.policy.segments`.
    pub index: SegmentIndex,
    /// Each segment's position in `config.policy.segments` and its report
    /// hosts, by segment name (report intake looks every entry up here).
    segments: FastMap<String, (usize, SegmentHosts)>,
    /// The policy's hash as replicas show it (`replicas::policy_hash`),
    /// computed on first use: it formats the whole policy, which every
    /// replica heartbeat would otherwise redo.
    hash: std::sync::OnceLock<String>,
    /// Checks per cycle of each group's continuous segments (one address
    /// per host), computed on first use in one pass over the segments:
    /// every session registration asks for its group's figure, and a
    /// per-group walk of every segment made a start with thousands of
    /// groups and segments quadratic.
    group_checks: std::sync::OnceLock<FastMap<String, u64>>,
}

/// A hash map with foldhash (seeded per process) for the maps every report
/// entry is looked up in: several times faster than std's SipHash on short
/// names, and the keys are the operator's policy, not a peer's choice.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type FastSet<T> = HashSet<T, foldhash::fast::RandomState>;

/// The hosts a segment takes reports for, in a form that is cheap to test:
/// exact names and IPs in hash sets, discovery entries (wildcards, subnets)
/// in a list. Built once per policy version.
#[derive(Debug, Default)]
struct SegmentHosts {
    names: FastSet<String>,
    ips: FastSet<IpAddr>,
    discovery: Vec<AppEntry>,
}

impl SegmentHosts {
    fn new(segment: &Segment) -> Self {
        let mut hosts = SegmentHosts::default();
        for entry in &segment.applications {
            match entry {
                AppEntry::Fqdn(name) => {
                    hosts.names.insert(name.clone());
                }
                AppEntry::Ip(ip) => {
                    hosts.ips.insert(*ip);
                }
                AppEntry::Wildcard(_) | AppEntry::Subnet(_) => hosts.discovery.push(entry.clone()),
            }
        }
        hosts
    }

    /// Whether `host` (lower-case name or canonical IP text; `ip` is its
    /// parse) is an application of the segment: what `host_in_segment`
    /// answers, without scanning the exact entries.
    fn contains(&self, host: &str, ip: Option<IpAddr>) -> bool {
        let exact = match ip {
            Some(ip) => self.ips.contains(&ip),
            None => self.names.contains(host),
        };
        exact || self.discovery.iter().any(|entry| entry.matches(host, ip))
    }
}

impl PolicyState {
    /// Builds the matching index and the report-host sets for a
    /// configuration.
    pub fn new(config: Config) -> Self {
        let index = SegmentIndex::new(&config.policy.segments);
        let mut segments = FastMap::with_capacity_and_hasher(
            config.policy.segments.len(),
            foldhash::fast::RandomState::default(),
        );
        for (i, seg) in config.policy.segments.iter().enumerate() {
            // Names are unique after validation; the first one wins, as
            // with `Policy::segment`.
            segments
                .entry(seg.name.clone())
                .or_insert_with(|| (i, SegmentHosts::new(seg)));
        }
        PolicyState {
            config,
            index,
            segments,
            hash: std::sync::OnceLock::new(),
            group_checks: std::sync::OnceLock::new(),
        }
    }

    /// Checks per cycle `group`'s continuous segments ask of one of its
    /// connectors (each host counted once per port, as
    /// `policy::estimated_checks` with one address per name).
    pub fn group_checks(&self, group: &str) -> u64 {
        self.group_checks
            .get_or_init(|| {
                let mut per_group = FastMap::default();
                for seg in &self.policy().segments {
                    if seg.health_reporting != policy::HealthReporting::Continuous {
                        continue;
                    }
                    let n = policy::estimated_checks(seg, 1);
                    // A group named twice in one segment serves it once.
                    let mut seen: FastSet<&str> = FastSet::default();
                    for g in &seg.connector_groups {
                        if seen.insert(g.as_str()) {
                            *per_group.entry(g.clone()).or_insert(0u64) += n;
                        }
                    }
                }
                per_group
            })
            .get(group)
            .copied()
            .unwrap_or(0)
    }

    /// `compute` of this version's policy, the first time; then that value.
    pub(crate) fn hash_with(&self, compute: impl FnOnce(&Self) -> String) -> &str {
        self.hash.get_or_init(|| compute(self))
    }

    /// The segment named `name` (what `Policy::segment` finds, by hash).
    pub fn segment(&self, name: &str) -> Option<&Segment> {
        let (i, _) = self.segments.get(name)?;
        self.policy().segments.get(*i)
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.config.settings
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.config.policy
    }

    /// What a connector of `group` is told: its segments and settings.
    pub fn assignment(&self, group: &str) -> (Vec<v1::Segment>, v1::ConnectorSettings) {
        let s = self.settings();
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        (
            self.policy()
                .segments_for_group(group)
                .map(v1::Segment::from)
                .collect(),
            v1::ConnectorSettings {
                on_access_window_ms: millis(s.on_access_window),
                heartbeat_interval_ms: millis(s.heartbeat_interval),
                checks_per_second: s.connector_checks_per_second,
                check_timeout_ms: s.connector_check_timeout_ms,
                max_entries_per_second: s.limits.connector_entries_per_second,
                max_entries_burst: s.limits.connector_entries_burst,
                // Any report of at most the burst can be taken.
                max_report_entries: s.limits.connector_entries_burst.min(MAX_REPORT_ENTRIES),
                dns_resolution: v1::DnsResolution::from(
                    self.policy()
                        .group(group)
                        .map(|g| g.dns_resolution)
                        .unwrap_or_default(),
                ) as i32,
            },
        )
    }
}

/// Entries per report a connector is asked not to exceed (about 200 kB
/// encoded at a typical entry size, well inside the 4 MiB message limit).
pub const MAX_REPORT_ENTRIES: u32 = 2_000;

/// Whether a connector of `group` may report `key`: the segment exists, the
/// group serves it, the port is in it, and the host is one of its entries
/// (for on-access segments also a name under a wildcard or an IP inside a
/// subnet, since users may access those). Returns the segment.
pub(crate) fn app_allowed<'a>(
    state: &'a PolicyState,
    group: &str,
    key: &AppKey,
) -> Result<&'a Segment, crate::error::ReportError> {
    app_allowed_ip(state, group, key, key.host.ip())
}

/// [`app_allowed`] for a key whose host was parsed already (`ip` is
/// `key.host` as an address, `None` for a name), as the wire conversion
/// hands it out.
pub(crate) fn app_allowed_ip<'a>(
    state: &'a PolicyState,
    group: &str,
    key: &AppKey,
    ip: Option<IpAddr>,
) -> Result<&'a Segment, crate::error::ReportError> {
    app_allowed_parts(
        state,
        group,
        (&key.segment, &key.host),
        ip,
        key.protocol,
        key.port,
    )
}

/// [`app_allowed_ip`] for a key given by its parts (`names`: segment and
/// normalised host), as the report intake reads them from the message.
pub(crate) fn app_allowed_parts<'a>(
    state: &'a PolicyState,
    group: &str,
    (segment_name, host): (&str, &str),
    ip: Option<IpAddr>,
    protocol: Protocol,
    port: u16,
) -> Result<&'a Segment, crate::error::ReportError> {
    use crate::error::ReportError;
    let (segment, hosts) = state
        .segments
        .get(segment_name)
        .and_then(|(i, hosts)| Some((state.policy().segments.get(*i)?, hosts)))
        .ok_or_else(|| ReportError::UnknownSegment(segment_name.to_owned()))?;
    if !segment.served_by(group) {
        return Err(ReportError::NotServed {
            group: group.to_owned(),
            segment: segment_name.to_owned(),
        });
    }
    if segment.health_reporting == HealthReporting::None {
        return Err(ReportError::NotInSegment(format!(
            "segment {:?} has health_reporting = \"none\" and takes no reports",
            segment.name
        )));
    }
    if !segment.includes(protocol, port) {
        return Err(ReportError::NotInSegment(format!(
            "segment {:?} does not include {}/{}",
            segment.name, protocol, port
        )));
    }
    if !hosts.contains(host, ip) {
        return Err(ReportError::NotInSegment(format!(
            "host {:?} is not an application of segment {:?}",
            host, segment.name
        )));
    }
    Ok(segment)
}

/// Whether `host` (lower-case name or canonical IP text) is an application
/// of `segment`, by scanning its entries: the reference `SegmentHosts`
/// must agree with.
#[cfg(test)]
fn host_in_segment(segment: &Segment, host: &str) -> bool {
    let ip = host.parse::<IpAddr>().ok();
    segment
        .applications
        .iter()
        .any(|entry| entry.matches(host, ip))
}

/// For tests: a policy of one group `g` and one segment `s` serving
/// `app.test` on TCP `port`.
#[cfg(test)]
pub(crate) fn one_segment(port: u16) -> PolicyState {
    let text = format!(
        r#"
        [[connector_groups]]
        name = "g"
        provisioning_key = "k-DmYStD7TW9CYc4cdPkm9zUgy"
        [[segments]]
        name = "s"
        applications = ["app.test"]
        tcp_ports = ["{port}"]
        connector_groups = ["g"]
        "#
    );
    PolicyState::new(crate::Config::from_toml(&text, std::path::Path::new(".")).expect("valid"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::Protocol;

    const POLICY: &str = r#"
        [server]
        allow_short_secrets = true
        [[connector_groups]]
        name = "g"
        provisioning_key = "k"

        [[segments]]
        name = "exact"
        applications = ["a.example.test", "b.example.test", "127.0.0.10", "::1"]
        tcp_ports = ["80"]
        connector_groups = ["g"]

        [[segments]]
        name = "discovery"
        applications = ["*.corp.test", "10.122.0.0/16", "c.example.test", "127.0.0.11"]
        tcp_ports = ["443"]
        health_reporting = "on_access"
        connector_groups = ["g"]
    "#;

    #[test]
    fn group_checks_are_each_groups_continuous_segments_in_one_pass() {
        let toml = r#"
            [server]
            allow_short_secrets = true
            [[connector_groups]]
            name = "g"
            provisioning_key = "k"
            [[connector_groups]]
            name = "h"
            provisioning_key = "k2"
            [[connector_groups]]
            name = "idle"
            provisioning_key = "k3"

            [[segments]]
            name = "both"
            applications = ["a.example.test", "127.0.0.10"]
            tcp_ports = ["80", "443"]
            connector_groups = ["g", "h"]

            [[segments]]
            name = "g-only"
            applications = ["b.example.test"]
            tcp_ports = ["22"]
            udp_ports = ["53"]
            connector_groups = ["g"]

            [[segments]]
            name = "on-access"
            applications = ["c.example.test"]
            tcp_ports = ["8080"]
            health_reporting = "on_access"
            connector_groups = ["g", "h", "idle"]
        "#;
        let config = Config::from_toml(toml, std::path::Path::new(".")).expect("valid");
        let state = PolicyState::new(config);
        // What walking each group's segments gives, segment by segment.
        for group in ["g", "h", "idle", "unknown"] {
            let walked: u64 = state
                .policy()
                .segments_for_group(group)
                .filter(|s| s.health_reporting == policy::HealthReporting::Continuous)
                .map(|s| policy::estimated_checks(s, 1))
                .sum();
            assert_eq!(state.group_checks(group), walked, "group {group}");
        }
        // Two hosts × two ports; plus one host × (one TCP + one UDP port).
        assert_eq!(state.group_checks("g"), 4 + 2);
        assert_eq!(state.group_checks("h"), 4);
        assert_eq!(state.group_checks("idle"), 0);
    }

    #[test]
    fn host_sets_agree_with_scanning_the_entries() {
        let config = Config::from_toml(POLICY, std::path::Path::new(".")).expect("valid");
        let state = PolicyState::new(config);
        let hosts = [
            "a.example.test",
            "b.example.test",
            "c.example.test",
            "x.example.test",
            "127.0.0.10",
            "127.0.0.11",
            "127.0.0.12",
            "::1",
            "::2",
            "db.corp.test",
            "a.b.corp.test",
            "corp.test",
            ".corp.test",
            "xcorp.test",
            "10.122.3.4",
            "10.123.0.1",
        ];
        for segment in &state.policy().segments {
            let (_, set) = &state.segments[&segment.name];
            for host in hosts {
                let ip = host.parse::<IpAddr>().ok();
                assert_eq!(
                    set.contains(host, ip),
                    host_in_segment(segment, host),
                    "{host} in {}",
                    segment.name
                );
            }
        }
        let key = |segment: &str, host: &str, port| AppKey {
            segment: segment.into(),
            host: host.parse().expect("host"),
            protocol: Protocol::Tcp,
            port,
        };
        assert!(app_allowed(&state, "g", &key("exact", "127.0.0.10", 80)).is_ok());
        assert!(app_allowed(&state, "g", &key("discovery", "db.corp.test", 443)).is_ok());
        assert!(app_allowed(&state, "g", &key("exact", "127.0.0.11", 80)).is_err());
        assert!(app_allowed(&state, "g", &key("exact", "127.0.0.10", 443)).is_err());
        assert!(app_allowed(&state, "h", &key("exact", "127.0.0.10", 80)).is_err());
        assert!(app_allowed(&state, "g", &key("nope", "127.0.0.10", 80)).is_err());
        assert_eq!(
            state.segment("discovery").map(|s| s.name.as_str()),
            Some("discovery")
        );
        assert!(state.segment("nope").is_none());
    }
}
