//! Validation: turns operator input (`PolicySpec`, as read from TOML or the
//! wire) into a `Policy`, collecting *every* error with the segment, the field
//! and the rule it breaks, so an operator fixes a config in one pass.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::check::{AppCheck, CheckKind, StatusRanges, count_pem_certificates};
use crate::damping::{Damping, MAX_THRESHOLD};
use crate::host::Host;
use crate::location::{Location, LocationSpec};
use crate::model::{
    AppEntry, ConnectorGroup, DnsResolution, HealthReporting, Policy, PortRange, Protocol, Segment,
    Strategy,
};

/// Limits that validation enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most ports (TCP and UDP together, ranges counted port by port) a
    /// continuous segment may have.
    pub max_continuous_ports: u32,
    /// Shortest IPv4 subnet prefix an application entry may have: a wider
    /// subnet lets a policy turn connectors into scanners of large address
    /// ranges. `/0` is refused whatever this says.
    pub min_subnet_prefix_v4: u8,
    /// Shortest IPv6 subnet prefix (`/0` is always refused).
    pub min_subnet_prefix_v6: u8,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_continuous_ports: 10,
            min_subnet_prefix_v4: DEFAULT_MIN_SUBNET_PREFIX_V4,
            min_subnet_prefix_v6: DEFAULT_MIN_SUBNET_PREFIX_V6,
        }
    }
}

/// Default shortest IPv4 subnet prefix (`10.0.0.0/8` is the widest private
/// range, and the widest entry the examples use).
pub const DEFAULT_MIN_SUBNET_PREFIX_V4: u8 = 8;
/// Default shortest IPv6 subnet prefix (`fd00::/8`, the unique-local range).
pub const DEFAULT_MIN_SUBNET_PREFIX_V6: u8 = 8;

/// A port as written by an operator: `80`, `"80"` or `"8000-8100"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PortSpec {
    /// A bare number.
    Number(i64),
    /// A port or range as text.
    Text(String),
}

impl fmt::Display for PortSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortSpec::Number(n) => write!(f, "{n}"),
            PortSpec::Text(t) => write!(f, "{t:?}"),
        }
    }
}

impl From<&str> for PortSpec {
    fn from(s: &str) -> Self {
        PortSpec::Text(s.to_owned())
    }
}

/// A segment as written by an operator; every field is checked by `validate`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentSpec {
    /// Unique name.
    pub name: String,
    /// FQDN, IP address, `*.wildcard` or CIDR subnet entries.
    #[serde(default)]
    pub applications: Vec<String>,
    /// TCP ports and ranges.
    #[serde(default)]
    pub tcp_ports: Vec<PortSpec>,
    /// UDP ports and ranges.
    #[serde(default)]
    pub udp_ports: Vec<PortSpec>,
    /// `continuous` (default), `on_access` or `none`.
    #[serde(default)]
    pub health_reporting: Option<String>,
    /// Report interval in seconds (default 60).
    #[serde(default)]
    pub report_interval_s: Option<u64>,
    /// Report interval in milliseconds; overrides `report_interval_s`
    /// (for tests and demos that need short intervals).
    #[serde(default)]
    pub report_interval_ms: Option<u64>,
    /// Inclusive matching (default false).
    #[serde(default)]
    pub multimatch: bool,
    /// Hide from the Health dashboard and API (default false).
    #[serde(default)]
    pub client_hostname_validation: bool,
    /// Connector groups serving the segment.
    #[serde(default)]
    pub connector_groups: Vec<String>,
    /// Flap damping: consecutive reachable results before a connector
    /// shows the application reachable again (default 1).
    #[serde(default)]
    pub rise: Option<u32>,
    /// Flap damping: consecutive failed results before a connector shows
    /// the application Down (or Unhealthy) (default 1).
    #[serde(default)]
    pub fall: Option<u32>,
    /// Selection strategy for this segment (`healthy`, `group`, `nearest`);
    /// absent: the CA's `[selection] strategy`.
    #[serde(default)]
    pub strategy: Option<String>,
    /// What a TCP port's check does after the handshake: `tcp` (default),
    /// `tls`, `http` or `https`.
    #[serde(default)]
    pub check: Option<String>,
    /// The path an `http`/`https` check requests (default `/`).
    #[serde(default)]
    pub check_path: Option<String>,
    /// The statuses an `http`/`https` check accepts (default `200-399`).
    #[serde(default)]
    pub check_expect: Option<String>,
    /// The PEM roots a `tls`/`https` check verifies the server with
    /// (absent: no verification). Validation reads no file: the caller puts
    /// its content in `check_ca_pem`.
    #[serde(default)]
    pub check_ca_file: Option<String>,
    /// The content of `check_ca_file` as the caller read it, or why it
    /// could not (from the wire: the PEM the CA sent, without a file name).
    #[serde(skip)]
    pub check_ca_pem: Option<Result<String, String>>,
}

/// A connector group as written by an operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupSpec {
    /// Unique name.
    pub name: String,
    /// `ipv4`, `ipv6` or `dual` (default).
    #[serde(default)]
    pub dns_resolution: Option<String>,
    /// Where its connectors are (`{ latitude, longitude }`, degrees);
    /// optional.
    #[serde(default)]
    pub location: Option<LocationSpec>,
}

/// A whole policy as written by an operator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicySpec {
    /// Connector groups.
    #[serde(default)]
    pub connector_groups: Vec<GroupSpec>,
    /// Application segments.
    #[serde(default)]
    pub segments: Vec<SegmentSpec>,
}

/// What an error is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Subject {
    /// A segment, by name (or `#index` when it has none).
    Segment(String),
    /// A connector group, by name (or `#index`).
    ConnectorGroup(String),
}

/// One broken rule: the subject, the field, and a sentence saying what is
/// wrong. Displays as `segment "jira": health_reporting = "continuous" is not
/// allowed with 12 ports (max 10)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ValidationError {
    /// Which segment or group.
    pub subject: Subject,
    /// The field at fault (`tcp_ports`, `health_reporting`, …).
    pub field: &'static str,
    /// The rule, as a sentence that starts with the field.
    pub message: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.subject {
            Subject::Segment(name) => write!(f, "segment {name:?}: {}", self.message),
            Subject::ConnectorGroup(name) => {
                write!(f, "connector group {name:?}: {}", self.message)
            }
        }
    }
}

/// Every error found in a policy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Default report interval when a segment does not set one.
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(60);

/// Longest report interval a segment may set: one day. Health that is
/// reported less often than daily is no health reporting, and the bound keeps
/// the interval representable on the wire (`uint32` seconds and
/// milliseconds) and in staleness arithmetic.
pub const MAX_REPORT_INTERVAL: Duration = Duration::from_secs(86_400);

/// Validates a whole policy with the default limits.
pub fn validate(spec: &PolicySpec) -> Result<Policy, ValidationErrors> {
    validate_with(spec, Limits::default())
}

/// Validates a whole policy, collecting every error.
pub fn validate_with(spec: &PolicySpec, limits: Limits) -> Result<Policy, ValidationErrors> {
    let mut errors = Vec::new();
    let groups = validate_groups(&spec.connector_groups, &mut errors);
    let segments = validate_segments(spec, limits, &mut errors);
    if errors.is_empty() {
        Ok(Policy {
            connector_groups: groups,
            segments,
        })
    } else {
        Err(ValidationErrors(errors))
    }
}

/// The valid connector groups of `specs`; every error goes to `errors`.
fn validate_groups(specs: &[GroupSpec], errors: &mut Vec<ValidationError>) -> Vec<ConnectorGroup> {
    let mut groups = Vec::new();
    let mut group_names = HashSet::new();
    for (i, g) in specs.iter().enumerate() {
        let subject = Subject::ConnectorGroup(display_name(&g.name, i));
        if let Err(message) = check_name(&g.name) {
            errors.push(ValidationError {
                subject,
                field: "name",
                message,
            });
        } else if !group_names.insert(g.name.as_str()) {
            errors.push(ValidationError {
                subject,
                field: "name",
                message: "name is used by another connector group".into(),
            });
        } else {
            match validate_group(g, &subject) {
                Ok(group) => groups.push(group),
                Err(mut e) => errors.append(&mut e),
            }
        }
    }
    groups
}

/// One connector group whose name is valid and unique.
fn validate_group(
    g: &GroupSpec,
    subject: &Subject,
) -> Result<ConnectorGroup, Vec<ValidationError>> {
    let dns_resolution = g
        .dns_resolution
        .as_deref()
        .map_or(Ok(DnsResolution::Dual), str::parse)
        .map_err(|m| ValidationError {
            subject: subject.clone(),
            field: "dns_resolution",
            message: format!("dns_resolution has {m}"),
        });
    let location = g
        .location
        .map(Location::try_from)
        .transpose()
        .map_err(|e| ValidationError {
            subject: subject.clone(),
            field: "location",
            message: format!("location.{e}"),
        });
    match (dns_resolution, location) {
        (Ok(dns_resolution), Ok(location)) => Ok(ConnectorGroup {
            name: g.name.clone(),
            dns_resolution,
            location,
        }),
        (dns_resolution, location) => Err(dns_resolution
            .err()
            .into_iter()
            .chain(location.err())
            .collect()),
    }
}

/// The valid segments of `spec`; every error goes to `errors`.
fn validate_segments(
    spec: &PolicySpec,
    limits: Limits,
    errors: &mut Vec<ValidationError>,
) -> Vec<Segment> {
    let mut segments = Vec::new();
    let mut segment_names = HashSet::new();
    for (i, s) in spec.segments.iter().enumerate() {
        let subject = Subject::Segment(display_name(&s.name, i));
        if !s.name.is_empty() && !segment_names.insert(s.name.as_str()) {
            errors.push(ValidationError {
                subject: subject.clone(),
                field: "name",
                message: "name is used by another segment".into(),
            });
        }
        for group in &s.connector_groups {
            if !group.is_empty() && !spec.connector_groups.iter().any(|g| &g.name == group) {
                errors.push(ValidationError {
                    subject: subject.clone(),
                    field: "connector_groups",
                    message: format!("connector_groups names unknown connector group {group:?}"),
                });
            }
        }
        match validate_segment_with(s, i, limits) {
            Ok(segment) => segments.push(segment),
            Err(mut e) => errors.append(&mut e),
        }
    }
    segments
}

/// Validates one segment on its own (every rule except that its connector
/// groups exist, which needs the whole policy).
pub fn validate_segment(spec: &SegmentSpec) -> Result<Segment, Vec<ValidationError>> {
    validate_segment_with(spec, 0, Limits::default())
}

fn display_name(name: &str, index: usize) -> String {
    if name.is_empty() {
        format!("#{}", index + 1)
    } else {
        name.to_owned()
    }
}

/// Names of segments and groups: 1..=128 of `[A-Za-z0-9._-]`, not starting
/// with a dot or hyphen. Kept conservative so names are safe in logs, URLs
/// and metrics labels.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("name is empty".into());
    }
    if name.len() > 128 {
        return Err(format!("name is {} characters long (max 128)", name.len()));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "name {name:?} contains {c:?} (allowed: letters, digits, '.', '_', '-')"
        ));
    }
    if name.starts_with(['.', '-']) {
        return Err(format!("name {name:?} must not start with '.' or '-'"));
    }
    Ok(())
}

fn validate_segment_with(
    spec: &SegmentSpec,
    index: usize,
    limits: Limits,
) -> Result<Segment, Vec<ValidationError>> {
    let subject = Subject::Segment(display_name(&spec.name, index));
    let mut errors = Vec::new();
    let mut err = |field: &'static str, message: String| {
        errors.push(ValidationError {
            subject: subject.clone(),
            field,
            message,
        })
    };

    if let Err(m) = check_name(&spec.name) {
        err("name", m);
    }
    let applications = parse_applications(&spec.applications, &mut err);
    check_subnet_widths(&applications, limits, &mut err);
    let tcp_ports = parse_ports(&spec.tcp_ports, Protocol::Tcp, &mut err);
    let udp_ports = parse_ports(&spec.udp_ports, Protocol::Udp, &mut err);
    if spec.tcp_ports.is_empty() && spec.udp_ports.is_empty() {
        err(
            "tcp_ports",
            "tcp_ports and udp_ports are both empty (at least one port is required)".into(),
        );
    }
    let mode_text = spec.health_reporting.as_deref().unwrap_or("continuous");
    let health_reporting = match mode_text.parse::<HealthReporting>() {
        Ok(m) => Some(m),
        Err(m) => {
            err("health_reporting", format!("health_reporting has {m}"));
            None
        }
    };
    let report_interval = parse_report_interval(spec, &mut err);
    check_groups(&spec.connector_groups, &mut err);
    let damping = parse_damping(spec, &mut err);
    let strategy = match spec.strategy.as_deref().map(str::parse::<Strategy>) {
        None => None,
        Some(Ok(s)) => Some(s),
        Some(Err(m)) => {
            err("strategy", format!("strategy has {m}"));
            None
        }
    };
    let check = parse_check(spec, &mut err);
    if health_reporting == Some(HealthReporting::Continuous) {
        let port_count: u32 = tcp_ports.iter().chain(&udp_ports).map(PortRange::len).sum();
        check_continuous(spec, &applications, port_count, limits, &mut err);
    }

    match (health_reporting, report_interval) {
        (Some(health_reporting), Some(report_interval)) if errors.is_empty() => Ok(Segment {
            name: spec.name.clone(),
            applications,
            tcp_ports,
            udp_ports,
            health_reporting,
            report_interval,
            multimatch: spec.multimatch,
            client_hostname_validation: spec.client_hostname_validation,
            connector_groups: spec.connector_groups.clone(),
            damping,
            strategy,
            check: check.unwrap_or_default(),
        }),
        _ => Err(errors),
    }
}

/// The segment's application-level check: its kind, and the keys that
/// kind uses (a key the kind does not use is an error, not ignored).
fn parse_check(spec: &SegmentSpec, err: &mut impl FnMut(&'static str, String)) -> Option<AppCheck> {
    let kind = match spec.check.as_deref().map(str::parse::<CheckKind>) {
        None => CheckKind::Tcp,
        Some(Ok(k)) => k,
        Some(Err(m)) => {
            err("check", format!("check has {m}"));
            return None;
        }
    };
    let mut check = AppCheck {
        kind,
        ..AppCheck::default()
    };
    let mut ok = true;
    let mut refuse = |field: &'static str, message: String| {
        ok = false;
        err(field, message);
    };
    let unused = |key: &str, uses: &str| {
        format!("{key} is set but check = \"{kind}\" does not use it (only {uses} do)")
    };
    if let Some(path) = &spec.check_path {
        if !kind.uses_http() {
            refuse("check_path", unused("check_path", "\"http\" and \"https\""));
        } else if !path.starts_with('/') || path.chars().any(|c| c.is_control() || c == ' ') {
            refuse(
                "check_path",
                format!(
                    "check_path {path:?} must start with '/' and hold no spaces or control characters"
                ),
            );
        } else {
            check.path.clone_from(path);
        }
    }
    if let Some(expect) = &spec.check_expect {
        if !kind.uses_http() {
            refuse(
                "check_expect",
                unused("check_expect", "\"http\" and \"https\""),
            );
        } else {
            match expect.parse::<StatusRanges>() {
                Ok(r) => check.expect = r,
                Err(m) => refuse("check_expect", format!("check_expect {expect:?}: {m}")),
            }
        }
    }
    if spec.check_ca_file.is_some() || spec.check_ca_pem.is_some() {
        let name = spec.check_ca_file.as_deref().unwrap_or("(sent by the CA)");
        if !kind.uses_tls() {
            refuse(
                "check_ca_file",
                unused("check_ca_file", "\"tls\" and \"https\""),
            );
        } else {
            match &spec.check_ca_pem {
                None => refuse(
                    "check_ca_file",
                    format!("check_ca_file {name:?} was not read"),
                ),
                Some(Err(e)) => refuse(
                    "check_ca_file",
                    format!("check_ca_file {name:?} cannot be read: {e}"),
                ),
                Some(Ok(pem)) => match count_pem_certificates(pem) {
                    Ok(_) => check.ca_pem = Some(pem.as_str().into()),
                    Err(m) => refuse("check_ca_file", format!("check_ca_file {name:?} {m}")),
                },
            }
        }
    }
    ok.then_some(check)
}

/// The `applications` entries, each parsed once; at least one, none twice.
fn parse_applications(
    raws: &[String],
    err: &mut impl FnMut(&'static str, String),
) -> Vec<AppEntry> {
    let mut applications = Vec::new();
    let mut seen = HashSet::new();
    if raws.is_empty() {
        err(
            "applications",
            "applications is empty (at least one FQDN, IP, wildcard or subnet is required)".into(),
        );
    }
    for raw in raws {
        match parse_entry(raw) {
            Ok(entry) => {
                if seen.insert(entry.clone()) {
                    applications.push(entry);
                } else {
                    err(
                        "applications",
                        format!("applications lists {raw:?} more than once"),
                    );
                }
            }
            Err(m) => err("applications", format!("applications entry {raw:?} {m}")),
        }
    }
    applications
}

/// Subnet entries no wider than the limits allow, and never a catch-all
/// (`0.0.0.0/0`, `::/0`).
fn check_subnet_widths(
    applications: &[AppEntry],
    limits: Limits,
    err: &mut impl FnMut(&'static str, String),
) {
    for entry in applications {
        let AppEntry::Subnet(net) = entry else {
            continue;
        };
        let min = match net {
            IpNet::V4(_) => limits.min_subnet_prefix_v4,
            IpNet::V6(_) => limits.min_subnet_prefix_v6,
        };
        if net.prefix_len() == 0 {
            err(
                "applications",
                format!(
                    "applications entry \"{net}\" covers every address, which is never allowed"
                ),
            );
        } else if net.prefix_len() < min {
            err(
                "applications",
                format!(
                    "applications entry \"{net}\" is wider than /{min} (the CA's [health] min_subnet_prefix_{})",
                    if net.addr().is_ipv4() { "v4" } else { "v6" }
                ),
            );
        }
    }
}

/// The report interval: `report_interval_ms`, else `report_interval_s`,
/// else the default; at least 1 and at most `MAX_REPORT_INTERVAL`.
fn parse_report_interval(
    spec: &SegmentSpec,
    err: &mut impl FnMut(&'static str, String),
) -> Option<Duration> {
    match (spec.report_interval_ms, spec.report_interval_s) {
        (Some(0), _) => {
            err(
                "report_interval_ms",
                "report_interval_ms = 0 is not allowed (must be at least 1)".into(),
            );
            None
        }
        (Some(ms), _) if Duration::from_millis(ms) > MAX_REPORT_INTERVAL => {
            err(
                "report_interval_ms",
                format!(
                    "report_interval_ms = {ms} is too long (max {})",
                    MAX_REPORT_INTERVAL.as_millis()
                ),
            );
            None
        }
        (Some(ms), _) => Some(Duration::from_millis(ms)),
        (None, Some(0)) => {
            err(
                "report_interval_s",
                "report_interval_s = 0 is not allowed (must be at least 1)".into(),
            );
            None
        }
        (None, Some(s)) if Duration::from_secs(s) > MAX_REPORT_INTERVAL => {
            err(
                "report_interval_s",
                format!(
                    "report_interval_s = {s} is too long (max {})",
                    MAX_REPORT_INTERVAL.as_secs()
                ),
            );
            None
        }
        (None, Some(s)) => Some(Duration::from_secs(s)),
        (None, None) => Some(DEFAULT_REPORT_INTERVAL),
    }
}

/// `rise` and `fall`: each 1..=`MAX_THRESHOLD` (default 1).
fn parse_damping(spec: &SegmentSpec, err: &mut impl FnMut(&'static str, String)) -> Damping {
    let mut check = |field: &'static str, value: Option<u32>| match value {
        None => 1,
        Some(n) if (1..=MAX_THRESHOLD).contains(&n) => n,
        Some(n) => {
            err(
                field,
                format!("{field} = {n} is out of range (1-{MAX_THRESHOLD} consecutive results)"),
            );
            1
        }
    };
    let rise = check("rise", spec.rise);
    let fall = check("fall", spec.fall);
    Damping::new(rise, fall).unwrap_or_default()
}

/// The segment's `connector_groups`: at least one, none empty, none twice
/// (whether each exists is checked against the whole policy).
fn check_groups(groups: &[String], err: &mut impl FnMut(&'static str, String)) {
    if groups.is_empty() {
        err(
            "connector_groups",
            "connector_groups is empty (at least one connector group must serve the segment)"
                .into(),
        );
    }
    let mut group_seen = HashSet::new();
    for g in groups {
        if g.is_empty() {
            err(
                "connector_groups",
                "connector_groups has an empty name".into(),
            );
        } else if !group_seen.insert(g.as_str()) {
            err(
                "connector_groups",
                format!("connector_groups lists {g:?} more than once"),
            );
        }
    }
}

/// The seed's rules for a continuous segment: at most
/// `limits.max_continuous_ports` ports, no application discovery (wildcard
/// or subnet) entry, no multimatch.
fn check_continuous(
    spec: &SegmentSpec,
    applications: &[AppEntry],
    port_count: u32,
    limits: Limits,
    err: &mut impl FnMut(&'static str, String),
) {
    if port_count > limits.max_continuous_ports {
        err(
            "health_reporting",
            format!(
                "health_reporting = \"continuous\" is not allowed with {port_count} ports (max {})",
                limits.max_continuous_ports
            ),
        );
    }
    if let Some(d) = applications.iter().find(|a| a.is_discovery()) {
        let kind = match d {
            AppEntry::Wildcard(_) => "wildcard",
            _ => "subnet",
        };
        err(
            "health_reporting",
            format!(
                "health_reporting = \"continuous\" is not allowed for an application discovery segment ({kind} \"{d}\")"
            ),
        );
    }
    if spec.multimatch {
        err(
            "multimatch",
            "multimatch = true requires health_reporting = \"on_access\" or \"none\" (not \"continuous\")".into(),
        );
    }
}

fn parse_ports(
    specs: &[PortSpec],
    protocol: Protocol,
    err: &mut impl FnMut(&'static str, String),
) -> Vec<PortRange> {
    let field = match protocol {
        Protocol::Tcp => "tcp_ports",
        Protocol::Udp => "udp_ports",
    };
    let mut ranges: Vec<PortRange> = Vec::new();
    for spec in specs {
        match parse_port(spec) {
            Ok(range) => {
                if let Some(other) = ranges.iter().find(|r| r.overlaps(&range)) {
                    err(field, format!("{field} entry {spec} overlaps \"{other}\""));
                } else {
                    ranges.push(range);
                }
            }
            Err(m) => err(field, format!("{field} entry {spec} {m}")),
        }
    }
    ranges.sort();
    ranges
}

fn parse_port(spec: &PortSpec) -> Result<PortRange, String> {
    fn number(n: i64) -> Result<u16, String> {
        if n == 0 {
            Err("is port 0, which is not allowed (ports are 1-65535)".into())
        } else if !(1..=65535).contains(&n) {
            Err(format!("is out of range: {n} (ports are 1-65535)"))
        } else {
            u16::try_from(n).map_err(|_| format!("is out of range: {n} (ports are 1-65535)"))
        }
    }
    fn text(t: &str) -> Result<i64, String> {
        let t = t.trim();
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("is not a port number or range ({t:?})"));
        }
        t.parse::<i64>()
            .map_err(|_| format!("is out of range: {t} (ports are 1-65535)"))
    }
    match spec {
        PortSpec::Number(n) => {
            let p = number(*n)?;
            PortRange::single(p).ok_or_else(|| "is port 0".into())
        }
        PortSpec::Text(t) => {
            if let Some((a, b)) = t.split_once('-') {
                let start = number(text(a)?)?;
                let end = number(text(b)?)?;
                PortRange::new(start, end)
                    .ok_or_else(|| format!("is an inverted range ({start} > {end})"))
            } else {
                let p = number(text(t)?)?;
                PortRange::single(p).ok_or_else(|| "is port 0".into())
            }
        }
    }
}

/// Parses one application entry; the error completes the sentence
/// `applications entry "…" {error}`.
pub fn parse_entry(raw: &str) -> Result<AppEntry, String> {
    let s = raw.trim();
    if s.is_empty() {
        return Err("is empty".into());
    }
    if s.contains('/') {
        let net: IpNet = s
            .parse()
            .map_err(|_| "is not a valid subnet (expected CIDR like 10.122.0.0/16)".to_owned())?;
        if net.trunc() != net {
            return Err(format!(
                "has host bits set (did you mean \"{}\"?)",
                net.trunc()
            ));
        }
        return Ok(AppEntry::Subnet(net));
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(AppEntry::Ip(ip));
    }
    let name = s.trim_end_matches('.');
    if let Some(suffix) = name.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err("has a wildcard outside the left-most label".into());
        }
        let suffix = domain(suffix)?;
        if !suffix.contains('.') {
            return Err("is a wildcard over a top-level domain, which is too broad".into());
        }
        return Ok(AppEntry::Wildcard(suffix));
    }
    if name.contains('*') {
        return Err(
            "has a wildcard that is not the whole left-most label (expected \"*.example.com\")"
                .into(),
        );
    }
    if name.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err("is not a valid IP address".into());
    }
    domain(name).map(AppEntry::Fqdn)
}

/// A domain name by `Host`'s rules (RFC 1035/1123 syntax, 253 characters,
/// labels of 1-63), normalised. An entry that is meant as a name and
/// happens to read as an IP literal (`*.10.1.1.1`) keeps its text.
fn domain(name: &str) -> Result<String, String> {
    match Host::parse(name) {
        Ok(host) if !matches!(host.ip(), Some(IpAddr::V6(_))) => Ok(host.into_string()),
        Ok(_) => Err("is not a valid domain name: it is an IPv6 address".into()),
        Err(e) => Err(format!("is not a valid domain name: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid continuous segment served by `dc-east`; tests break one field.
    fn seg(name: &str) -> SegmentSpec {
        SegmentSpec {
            name: name.into(),
            applications: vec!["jira.lanukcorp.com".into(), "10.1.1.1".into()],
            tcp_ports: vec!["80".into()],
            udp_ports: vec!["3389".into()],
            health_reporting: Some("continuous".into()),
            report_interval_s: Some(60),
            connector_groups: vec!["dc-east".into()],
            ..SegmentSpec::default()
        }
    }

    fn policy(segments: Vec<SegmentSpec>) -> PolicySpec {
        PolicySpec {
            connector_groups: vec![GroupSpec {
                name: "dc-east".into(),
                ..GroupSpec::default()
            }],
            segments,
        }
    }

    fn ports(specs: &[&str]) -> Vec<PortSpec> {
        specs.iter().map(|&p| p.into()).collect()
    }

    /// The displayed errors of an invalid policy.
    fn errors(spec: &PolicySpec) -> Vec<String> {
        match validate(spec) {
            Ok(p) => panic!("expected errors, got a valid policy: {p:?}"),
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    /// The errors of one invalid segment, as (field, displayed error).
    fn seg_errors(spec: &SegmentSpec) -> Vec<(&'static str, String)> {
        match validate_segment(spec) {
            Ok(s) => panic!("expected errors, got a valid segment: {s:?}"),
            Err(e) => e.iter().map(|e| (e.field, e.to_string())).collect(),
        }
    }

    /// Asserts exactly one error, on `field`, whose display contains `needle`.
    fn assert_one_error(spec: &SegmentSpec, field: &str, needle: &str) {
        let errs = seg_errors(spec);
        assert_eq!(errs.len(), 1, "{errs:#?}");
        assert_eq!(errs[0].0, field, "{errs:#?}");
        assert!(
            errs[0].1.contains(needle),
            "{:?} lacks {needle:?}",
            errs[0].1
        );
    }

    #[test]
    fn a_valid_segment_is_normalised() {
        let mut spec = seg("jira");
        spec.applications = vec![
            "JIRA.LanukCorp.com.".into(),
            "10.1.1.1".into(),
            "*.SafeMarch.com".into(),
            "10.122.0.0/16".into(),
            "fd00::1".into(),
            "fd00::/8".into(),
        ];
        spec.tcp_ports = ports(&["8000-8100", "80"]);
        spec.health_reporting = Some("on_access".into());
        spec.report_interval_s = None;
        let s = validate_segment(&spec).expect("valid");
        assert_eq!(
            s.applications,
            vec![
                AppEntry::Fqdn("jira.lanukcorp.com".into()),
                AppEntry::Ip("10.1.1.1".parse().unwrap()),
                AppEntry::Wildcard("safemarch.com".into()),
                AppEntry::Subnet("10.122.0.0/16".parse().unwrap()),
                AppEntry::Ip("fd00::1".parse().unwrap()),
                AppEntry::Subnet("fd00::/8".parse().unwrap()),
            ]
        );
        // Sorted, whatever the configuration order.
        assert_eq!(
            s.tcp_ports,
            vec![
                PortRange::single(80).unwrap(),
                PortRange::new(8000, 8100).unwrap()
            ]
        );
        assert_eq!(s.udp_ports, vec![PortRange::single(3389).unwrap()]);
        assert_eq!(s.report_interval, DEFAULT_REPORT_INTERVAL);
        assert_eq!(s.port_count(), 103);
        assert!(s.is_discovery());
    }

    #[test]
    fn catch_all_and_too_wide_subnets_are_refused() {
        let on_access = |apps: &[&str]| {
            let mut spec = seg("wide");
            spec.applications = apps.iter().map(|&a| a.into()).collect();
            spec.health_reporting = Some("on_access".into());
            spec
        };
        for all in ["0.0.0.0/0", "::/0"] {
            assert_one_error(&on_access(&[all]), "applications", "covers every address");
        }
        assert_one_error(&on_access(&["10.0.0.0/7"]), "applications", "wider than /8");
        assert_one_error(&on_access(&["fc00::/7"]), "applications", "wider than /8");
        // The limits are configurable; /0 stays refused even at 0.
        let strict = Limits {
            min_subnet_prefix_v4: 16,
            min_subnet_prefix_v6: 64,
            ..Limits::default()
        };
        let one = |apps: &[&str], limits| validate_segment_with(&on_access(apps), 0, limits);
        assert!(one(&["10.122.0.0/16", "fd00::/64"], strict).is_ok());
        assert!(one(&["10.0.0.0/15"], strict).is_err());
        assert!(one(&["fd00::/63"], strict).is_err());
        let lax = Limits {
            min_subnet_prefix_v4: 0,
            min_subnet_prefix_v6: 0,
            ..Limits::default()
        };
        assert!(one(&["0.0.0.0/1"], lax).is_ok());
        assert!(one(&["0.0.0.0/0"], lax).is_err());
        assert!(one(&["::/0"], lax).is_err());
    }

    #[test]
    fn health_reporting_defaults_to_continuous() {
        let mut spec = seg("jira");
        spec.health_reporting = None;
        assert_eq!(
            validate_segment(&spec).unwrap().health_reporting,
            HealthReporting::Continuous
        );
    }

    // ---- continuous: at most 10 ports, TCP and UDP together, port by port ----

    #[test]
    fn continuous_allows_exactly_ten_ports_across_tcp_and_udp() {
        let mut spec = seg("jira");
        spec.tcp_ports = ports(&["80", "8000-8004"]); // 6
        spec.udp_ports = ports(&["53", "3389-3391"]); // 4
        let s = validate_segment(&spec).expect("10 ports is allowed");
        assert_eq!(s.port_count(), 10);
    }

    #[test]
    fn continuous_rejects_eleven_ports_across_tcp_and_udp() {
        let mut spec = seg("jira");
        spec.tcp_ports = ports(&["80", "8000-8004"]); // 6
        spec.udp_ports = ports(&["53", "3389-3392"]); // 5
        assert_eq!(
            seg_errors(&spec),
            vec![(
                "health_reporting",
                r#"segment "jira": health_reporting = "continuous" is not allowed with 11 ports (max 10)"#
                    .to_owned()
            )]
        );
    }

    #[test]
    fn continuous_port_limit_message_is_exactly_the_contracts() {
        let mut spec = seg("jira");
        spec.tcp_ports = ports(&["1-12"]);
        spec.udp_ports = vec![];
        assert_eq!(
            errors(&policy(vec![spec])),
            vec![
                r#"segment "jira": health_reporting = "continuous" is not allowed with 12 ports (max 10)"#
            ]
        );
    }

    #[test]
    fn a_range_counts_each_of_its_ports() {
        let mut spec = seg("jira");
        spec.udp_ports = vec![];
        spec.tcp_ports = ports(&["1-10"]);
        assert!(validate_segment(&spec).is_ok());
        spec.tcp_ports = ports(&["1-11"]);
        assert_one_error(&spec, "health_reporting", "with 11 ports (max 10)");
        spec.tcp_ports = ports(&["1-65535"]);
        assert_one_error(&spec, "health_reporting", "with 65535 ports (max 10)");
    }

    #[test]
    fn the_port_limit_only_applies_to_continuous() {
        for mode in ["on_access", "none"] {
            let mut spec = seg("jira");
            spec.health_reporting = Some(mode.into());
            spec.tcp_ports = ports(&["1-1000"]);
            assert!(validate_segment(&spec).is_ok(), "{mode}");
        }
    }

    #[test]
    fn the_port_limit_is_configurable() {
        let mut spec = seg("jira");
        spec.tcp_ports = ports(&["1-12"]);
        let limits = Limits {
            max_continuous_ports: 13,
            ..Limits::default()
        };
        assert!(validate_with(&policy(vec![spec.clone()]), limits).is_ok());
        let limits = Limits {
            max_continuous_ports: 12,
            ..Limits::default()
        };
        let e = validate_with(&policy(vec![spec]), limits).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"segment "jira": health_reporting = "continuous" is not allowed with 13 ports (max 12)"#
        );
    }

    #[test]
    fn continuous_is_rejected_for_discovery_segments() {
        for (entry, kind) in [("*.safemarch.com", "wildcard"), ("10.122.0.0/16", "subnet")] {
            let mut spec = seg("disc");
            spec.applications = vec!["jira.lanukcorp.com".into(), entry.into()];
            assert_one_error(
                &spec,
                "health_reporting",
                &format!(
                    r#"health_reporting = "continuous" is not allowed for an application discovery segment ({kind} "{entry}")"#
                ),
            );
            spec.health_reporting = Some("on_access".into());
            assert!(validate_segment(&spec).is_ok(), "{entry} on_access");
            spec.health_reporting = Some("none".into());
            assert!(validate_segment(&spec).is_ok(), "{entry} none");
        }
    }

    #[test]
    fn multimatch_requires_on_access_or_none() {
        let mut spec = seg("mm");
        spec.multimatch = true;
        assert_one_error(&spec, "multimatch", "multimatch = true requires");
        spec.health_reporting = None; // the default is continuous
        assert_one_error(&spec, "multimatch", "multimatch = true requires");
        for mode in ["on_access", "none"] {
            spec.health_reporting = Some(mode.into());
            assert!(validate_segment(&spec).unwrap().multimatch, "{mode}");
        }
    }

    // ---- ports ----

    #[test]
    fn bad_ports_are_rejected_with_the_field_and_the_entry() {
        let cases: &[(PortSpec, &str)] = &[
            (PortSpec::Number(0), "entry 0 is port 0"),
            ("0".into(), r#"entry "0" is port 0"#),
            (PortSpec::Number(65536), "is out of range: 65536"),
            (PortSpec::Number(-1), "is out of range: -1"),
            ("70000".into(), "is out of range: 70000"),
            (
                "99999999999999999999999".into(),
                "is out of range: 99999999999999999999999",
            ),
            ("8100-8000".into(), "is an inverted range (8100 > 8000)"),
            ("0-10".into(), "is port 0"),
            ("10-65536".into(), "is out of range: 65536"),
            ("http".into(), "is not a port number or range"),
            ("".into(), "is not a port number or range"),
            ("80-".into(), "is not a port number or range"),
            ("-80".into(), "is not a port number or range"),
            ("1-2-3".into(), "is not a port number or range"),
            ("+80".into(), "is not a port number or range"),
        ];
        for (port, needle) in cases {
            let mut spec = seg("jira");
            spec.tcp_ports = vec![port.clone()];
            assert_one_error(&spec, "tcp_ports", needle);
            // The same rule holds for UDP, under its own field name.
            let mut spec = seg("jira");
            spec.udp_ports = vec![port.clone()];
            assert_one_error(&spec, "udp_ports", needle);
        }
    }

    #[test]
    fn the_largest_port_is_allowed() {
        let mut spec = seg("jira");
        spec.tcp_ports = vec![PortSpec::Number(65535)];
        spec.udp_ports = ports(&["65530-65535"]);
        assert!(validate_segment(&spec).is_ok());
    }

    #[test]
    fn overlapping_ranges_are_rejected() {
        for list in [
            &["8000-8100", "8050"][..],
            &["8050", "8000-8100"],
            &["80", "80"],
            &["1-5", "5-9"],
            &["10-20", "1-30"],
        ] {
            let mut spec = seg("jira");
            spec.health_reporting = Some("on_access".into());
            spec.tcp_ports = ports(list);
            assert_one_error(&spec, "tcp_ports", "overlaps");
        }
    }

    #[test]
    fn the_same_port_on_tcp_and_udp_does_not_overlap() {
        let mut spec = seg("jira");
        spec.tcp_ports = ports(&["53"]);
        spec.udp_ports = ports(&["53"]);
        assert_eq!(validate_segment(&spec).unwrap().port_count(), 2);
    }

    #[test]
    fn a_segment_needs_a_port() {
        let mut spec = seg("jira");
        spec.tcp_ports = vec![];
        spec.udp_ports = vec![];
        assert_one_error(&spec, "tcp_ports", "tcp_ports and udp_ports are both empty");
        // UDP alone is enough.
        spec.udp_ports = ports(&["3389"]);
        assert!(validate_segment(&spec).is_ok());
    }

    // ---- applications ----

    #[test]
    fn a_segment_needs_an_application() {
        let mut spec = seg("jira");
        spec.applications = vec![];
        assert_one_error(&spec, "applications", "applications is empty");
    }

    #[test]
    fn malformed_application_entries_are_rejected() {
        let cases = [
            ("", "is empty"),
            ("   ", "is empty"),
            ("a.*.com", "wildcard that is not the whole left-most label"),
            ("*foo.com", "wildcard that is not the whole left-most label"),
            ("foo*.com", "wildcard that is not the whole left-most label"),
            ("*.*.com", "wildcard outside the left-most label"),
            ("*.com", "too broad"),
            ("*.", "wildcard that is not the whole left-most label"),
            ("exa mple.com", "contains ' '"),
            ("a..b.com", "empty label"),
            ("-a.com", "starts or ends with '-'"),
            ("a-.com", "starts or ends with '-'"),
            ("jira.lanukcorp.com:80", "contains ':'"),
            ("http://jira", "is not a valid subnet"),
            ("10.1.1", "is not a valid IP address"),
            ("10.1.1.256", "is not a valid IP address"),
            ("10.0.0.0/33", "is not a valid subnet"),
            (
                "10.0.0.1/8",
                "has host bits set (did you mean \"10.0.0.0/8\"?)",
            ),
            ("fd00::1/8", "has host bits set"),
            ("::1::2", "contains ':'"),
            ("ünïcode.com", "contains 'ü'"),
        ];
        for (entry, needle) in cases {
            let mut spec = seg("jira");
            spec.applications = vec![entry.into()];
            assert_one_error(&spec, "applications", needle);
            // The message names the entry as written.
            let errs = seg_errors(&spec);
            assert!(
                errs[0].1.contains(&format!("applications entry {entry:?}")),
                "{errs:?}"
            );
        }
        let long_label = format!("{}.com", "a".repeat(64));
        assert!(
            parse_entry(&long_label)
                .unwrap_err()
                .contains("longer than 63")
        );
        let long_name = format!("{}com", "abcdefghi.".repeat(26));
        assert!(parse_entry(&long_name).unwrap_err().contains("max 253"));
    }

    #[test]
    fn duplicate_application_entries_are_rejected_after_normalising() {
        let mut spec = seg("jira");
        spec.applications = vec!["jira.lanukcorp.com".into(), "JIRA.lanukcorp.com.".into()];
        assert_one_error(&spec, "applications", "more than once");
    }

    // ---- names, groups, intervals, modes ----

    #[test]
    fn malformed_segment_names_are_rejected() {
        for (name, needle) in [
            ("", "name is empty"),
            ("bad name", "contains ' '"),
            ("-jira", "must not start"),
            (".jira", "must not start"),
            ("jira/x", "contains '/'"),
        ] {
            assert_one_error(&seg(name), "name", needle);
        }
        assert_one_error(&seg(&"a".repeat(129)), "name", "(max 128)");
        assert!(validate_segment(&seg(&"a".repeat(128))).is_ok());
        assert!(validate_segment(&seg("Jira_2.prod-east")).is_ok());
    }

    #[test]
    fn an_unnamed_segment_is_named_by_position() {
        let spec = policy(vec![seg("ok"), seg("")]);
        assert_eq!(errors(&spec), vec![r##"segment "#2": name is empty"##]);
    }

    #[test]
    fn malformed_and_duplicate_group_names_are_rejected() {
        let mut spec = policy(vec![seg("jira")]);
        spec.connector_groups.push(GroupSpec {
            name: "dc-east".into(),
            ..GroupSpec::default()
        });
        spec.connector_groups.push(GroupSpec {
            name: "bad group".into(),
            ..GroupSpec::default()
        });
        let errs = errors(&spec);
        assert_eq!(errs.len(), 2, "{errs:#?}");
        assert_eq!(
            errs[0],
            r#"connector group "dc-east": name is used by another connector group"#
        );
        assert!(
            errs[1].starts_with(r#"connector group "bad group": name "bad group" contains ' '"#)
        );
    }

    #[test]
    fn duplicate_segment_names_are_rejected() {
        let errs = errors(&policy(vec![seg("jira"), seg("wiki"), seg("jira")]));
        assert_eq!(
            errs,
            vec![r#"segment "jira": name is used by another segment"#]
        );
    }

    #[test]
    fn rise_and_fall_default_to_one_and_are_bounded() {
        let s = validate_segment(&seg("jira")).expect("valid");
        assert_eq!(s.damping, Damping::default());
        let mut spec = seg("jira");
        spec.rise = Some(2);
        spec.fall = Some(3);
        let s = validate_segment(&spec).expect("valid");
        assert_eq!((s.damping.rise(), s.damping.fall()), (2, 3));
        spec.fall = Some(0);
        assert_one_error(
            &spec,
            "fall",
            "fall = 0 is out of range (1-100 consecutive results)",
        );
        spec.fall = Some(3);
        spec.rise = Some(101);
        assert_one_error(&spec, "rise", "rise = 101 is out of range");
        let toml_spec: PolicySpec = toml::from_str(
            "[[segments]]\nname = \"a\"\napplications = [\"a.test\"]\ntcp_ports = [\"80\"]\nconnector_groups = [\"g\"]\nrise = 2\nfall = 4\nstrategy = \"nearest\"\n",
        )
        .expect("toml");
        let s = validate_segment(&toml_spec.segments[0]).expect("valid");
        assert_eq!(s.damping, Damping::new(2, 4).expect("valid"));
        assert_eq!(s.strategy, Some(Strategy::Nearest));
    }

    #[test]
    fn a_segment_may_choose_its_strategy() {
        assert_eq!(
            validate_segment(&seg("jira")).expect("valid").strategy,
            None
        );
        let mut spec = seg("jira");
        spec.strategy = Some("group".into());
        assert_eq!(
            validate_segment(&spec).expect("valid").strategy,
            Some(Strategy::Group)
        );
        spec.strategy = Some("closest".into());
        assert_one_error(
            &spec,
            "strategy",
            r#"strategy has unknown strategy "closest""#,
        );
    }

    #[test]
    fn dns_resolution_defaults_to_dual_and_is_checked() {
        let mut spec = policy(vec![seg("jira")]);
        let p = validate(&spec).expect("valid");
        assert_eq!(p.connector_groups[0].dns_resolution, DnsResolution::Dual);
        spec.connector_groups[0].dns_resolution = Some("ipv6".into());
        let p = validate(&spec).expect("valid");
        assert_eq!(
            p.group("dc-east").map(|g| g.dns_resolution),
            Some(DnsResolution::Ipv6)
        );
        spec.connector_groups[0].dns_resolution = Some("v6".into());
        assert_eq!(
            errors(&spec),
            vec![
                r#"connector group "dc-east": dns_resolution has unknown value "v6" (expected "ipv4", "ipv6" or "dual")"#
            ]
        );
    }

    #[test]
    fn group_locations_are_optional_and_checked() {
        let mut spec = policy(vec![seg("jira")]);
        assert_eq!(
            validate(&spec).expect("valid").connector_groups[0].location,
            None
        );
        spec.connector_groups[0].location = Some(LocationSpec {
            latitude: 48.85,
            longitude: 2.35,
        });
        let p = validate(&spec).expect("valid");
        assert_eq!(
            p.group("dc-east").and_then(|g| g.location),
            Location::new(48.85, 2.35).ok()
        );
        for (latitude, longitude, message) in [
            (
                90.5,
                2.35,
                "location.latitude 90.5 is not a number of degrees in -90..=90",
            ),
            (
                f64::NAN,
                2.35,
                "location.latitude NaN is not a number of degrees in -90..=90",
            ),
            (
                48.85,
                -180.5,
                "location.longitude -180.5 is not a number of degrees in -180..=180",
            ),
        ] {
            spec.connector_groups[0].location = Some(LocationSpec {
                latitude,
                longitude,
            });
            assert_eq!(
                errors(&spec),
                vec![format!(r#"connector group "dc-east": {message}"#)]
            );
        }
        // Both of a group's fields are reported in one pass.
        spec.connector_groups[0].dns_resolution = Some("v6".into());
        assert_eq!(errors(&spec).len(), 2, "{:?}", errors(&spec));
    }

    #[test]
    fn unknown_connector_groups_are_rejected() {
        let mut s = seg("jira");
        s.connector_groups = vec!["dc-east".into(), "dc-west".into()];
        assert_eq!(
            errors(&policy(vec![s])),
            vec![r#"segment "jira": connector_groups names unknown connector group "dc-west""#]
        );
    }

    #[test]
    fn connector_groups_must_be_present_and_distinct() {
        let mut s = seg("jira");
        s.connector_groups = vec![];
        assert_one_error(&s, "connector_groups", "connector_groups is empty");
        s.connector_groups = vec!["dc-east".into(), "dc-east".into()];
        assert_one_error(&s, "connector_groups", "more than once");
        s.connector_groups = vec![String::new()];
        assert_one_error(&s, "connector_groups", "empty name");
    }

    #[test]
    fn a_zero_report_interval_is_rejected() {
        let mut s = seg("jira");
        s.report_interval_s = Some(0);
        assert_one_error(
            &s,
            "report_interval_s",
            "report_interval_s = 0 is not allowed",
        );
        s.report_interval_s = Some(60);
        s.report_interval_ms = Some(0);
        assert_one_error(
            &s,
            "report_interval_ms",
            "report_interval_ms = 0 is not allowed",
        );
    }

    #[test]
    fn report_interval_ms_overrides_seconds() {
        let mut s = seg("jira");
        s.report_interval_s = Some(0);
        s.report_interval_ms = Some(250);
        assert_eq!(
            validate_segment(&s).unwrap().report_interval,
            Duration::from_millis(250)
        );
    }

    #[test]
    fn an_absurd_report_interval_is_rejected() {
        let mut s = seg("jira");
        s.report_interval_s = Some(86_400);
        assert!(validate_segment(&s).is_ok());
        s.report_interval_s = Some(86_401);
        assert_one_error(&s, "report_interval_s", "is too long (max 86400)");
        s.report_interval_s = Some(u64::MAX);
        assert_one_error(&s, "report_interval_s", "is too long");
        s.report_interval_s = None;
        s.report_interval_ms = Some(u64::MAX);
        assert_one_error(&s, "report_interval_ms", "is too long (max 86400000)");
    }

    #[test]
    fn an_unknown_health_reporting_value_is_rejected() {
        for value in ["sometimes", "", "Continuous", "on-access"] {
            let mut s = seg("jira");
            s.health_reporting = Some(value.into());
            assert_one_error(
                &s,
                "health_reporting",
                &format!("health_reporting has unknown value {value:?}"),
            );
        }
    }

    // ---- application-level checks ----

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    #[test]
    fn the_check_defaults_to_the_tcp_handshake() {
        let s = validate_segment(&seg("jira")).expect("valid");
        assert_eq!(s.check, AppCheck::default());
        assert_eq!(s.check.kind, CheckKind::Tcp);
        assert_eq!(s.check.path, "/");
        assert!(s.check.expect.contains(200) && !s.check.expect.contains(404));
    }

    #[test]
    fn an_https_check_keeps_its_path_statuses_and_roots() {
        let spec = SegmentSpec {
            check: Some("https".into()),
            check_path: Some("/healthz".into()),
            check_expect: Some("200,204,300-399".into()),
            check_ca_file: Some("roots.pem".into()),
            check_ca_pem: Some(Ok(PEM.into())),
            ..seg("jira")
        };
        let s = validate_segment(&spec).expect("valid");
        assert_eq!(s.check.kind, CheckKind::Https);
        assert_eq!(s.check.path, "/healthz");
        assert_eq!(s.check.expect.to_string(), "200,204,300-399");
        assert_eq!(s.check.ca_pem.as_deref(), Some(PEM));
        // From TOML, as the CA reads a segment (the file is read by the CA).
        let toml_spec: SegmentSpec =
            toml::from_str("name = \"a\"\ncheck = \"tls\"\ncheck_ca_file = \"/etc/ca.pem\"\n")
                .expect("toml");
        assert_eq!(toml_spec.check.as_deref(), Some("tls"));
        assert_eq!(toml_spec.check_ca_file.as_deref(), Some("/etc/ca.pem"));
        assert_eq!(toml_spec.check_ca_pem, None);
    }

    #[test]
    fn bad_check_keys_are_refused_naming_segment_and_key() {
        let http = |f: fn(&mut SegmentSpec)| {
            let mut s = SegmentSpec {
                check: Some("http".into()),
                ..seg("jira")
            };
            f(&mut s);
            s
        };
        let cases: Vec<(SegmentSpec, &str, &str)> = vec![
            (
                SegmentSpec {
                    check: Some("grpc".into()),
                    ..seg("jira")
                },
                "check",
                "unknown check \"grpc\"",
            ),
            (
                http(|s| s.check_path = Some("healthz".into())),
                "check_path",
                "must start with '/'",
            ),
            (
                http(|s| s.check_path = Some("/a b".into())),
                "check_path",
                "must start with '/'",
            ),
            (
                http(|s| s.check_expect = Some("200-700".into())),
                "check_expect",
                "\"700\" is no HTTP status within 100-599",
            ),
            (
                http(|s| s.check_expect = Some("abc".into())),
                "check_expect",
                "check_expect \"abc\"",
            ),
            (
                SegmentSpec {
                    check_path: Some("/x".into()),
                    ..seg("jira")
                },
                "check_path",
                "check = \"tcp\" does not use it",
            ),
            (
                http(|s| s.check_ca_file = Some("a.pem".into())),
                "check_ca_file",
                "check = \"http\" does not use it",
            ),
            (
                SegmentSpec {
                    check: Some("tls".into()),
                    check_expect: Some("200".into()),
                    ..seg("jira")
                },
                "check_expect",
                "check = \"tls\" does not use it",
            ),
            (
                SegmentSpec {
                    check: Some("tls".into()),
                    check_ca_file: Some("a.pem".into()),
                    check_ca_pem: Some(Err("No such file".into())),
                    ..seg("jira")
                },
                "check_ca_file",
                "check_ca_file \"a.pem\" cannot be read: No such file",
            ),
            (
                SegmentSpec {
                    check: Some("tls".into()),
                    check_ca_file: Some("a.pem".into()),
                    check_ca_pem: Some(Ok("hello".into())),
                    ..seg("jira")
                },
                "check_ca_file",
                "check_ca_file \"a.pem\" holds no PEM certificate",
            ),
        ];
        for (spec, field, needle) in cases {
            assert_one_error(&spec, field, needle);
            let shown = &seg_errors(&spec)[0].1;
            assert!(shown.starts_with("segment \"jira\": "), "{shown}");
        }
    }

    #[test]
    fn discovery_segments_may_check_on_access() {
        let spec = SegmentSpec {
            applications: vec!["*.corp.test".into(), "10.9.0.0/24".into()],
            health_reporting: Some("on_access".into()),
            check: Some("https".into()),
            ..seg("wild")
        };
        assert_eq!(
            validate_segment(&spec).expect("valid").check.kind,
            CheckKind::Https
        );
    }

    // ---- every error is collected ----

    #[test]
    fn every_error_of_every_segment_is_listed() {
        let mut too_many_ports = seg("jira");
        too_many_ports.tcp_ports = ports(&["1-12"]);
        let mut bad_everything = seg("wiki");
        bad_everything.applications = vec!["a.*.com".into(), "10.1.1".into()];
        bad_everything.tcp_ports = ports(&["0", "8100-8000"]);
        bad_everything.udp_ports = ports(&["70000"]);
        bad_everything.report_interval_s = Some(0);
        bad_everything.connector_groups = vec!["nowhere".into()];
        let mut bad_mode = seg("chat");
        bad_mode.health_reporting = Some("sometimes".into());
        let mut multi = seg("mm");
        multi.multimatch = true;
        multi.applications = vec!["*.safemarch.com".into()];
        let spec = PolicySpec {
            connector_groups: vec![
                GroupSpec {
                    name: "dc-east".into(),
                    ..GroupSpec::default()
                },
                GroupSpec {
                    name: "dc east".into(),
                    ..GroupSpec::default()
                },
            ],
            segments: vec![seg("fine"), too_many_ports, bad_everything, bad_mode, multi],
        };
        let errs = validate(&spec).unwrap_err().0;
        let listed: Vec<(String, &str)> = errs
            .iter()
            .map(|e| {
                let who = match &e.subject {
                    Subject::Segment(n) | Subject::ConnectorGroup(n) => n.clone(),
                };
                (who, e.field)
            })
            .collect();
        let expected: Vec<(String, &str)> = [
            ("dc east", "name"),
            ("jira", "health_reporting"),
            ("wiki", "connector_groups"),
            ("wiki", "applications"),
            ("wiki", "applications"),
            ("wiki", "tcp_ports"),
            ("wiki", "tcp_ports"),
            ("wiki", "udp_ports"),
            ("wiki", "report_interval_s"),
            ("chat", "health_reporting"),
            ("mm", "health_reporting"),
            ("mm", "multimatch"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_owned(), b))
        .collect();
        assert_eq!(listed, expected, "{errs:#?}");
        // The combined display lists one error per line.
        let text = ValidationErrors(errs).to_string();
        assert_eq!(text.lines().count(), expected.len());
    }

    // ---- TOML ----

    #[test]
    fn toml_ports_may_be_strings_numbers_or_both() {
        let text = r#"
            [[connector_groups]]
            name = "dc-east"

            [[segments]]
            name = "jira"
            applications = ["jira.lanukcorp.com", "10.1.1.1"]
            tcp_ports = ["80", "8000-8100"]
            udp_ports = [3389]
            health_reporting = "on_access"
            report_interval_s = 30
            multimatch = true
            client_hostname_validation = true
            connector_groups = ["dc-east"]

            [[segments]]
            name = "wiki"
            applications = ["wiki.lanukcorp.com"]
            tcp_ports = [80]
            connector_groups = ["dc-east"]

            [[segments]]
            name = "mixed"
            applications = ["10.9.9.9"]
            tcp_ports = [443, "8443-8444"]
            connector_groups = ["dc-east"]
        "#;
        let spec: PolicySpec = toml::from_str(text).expect("parses");
        assert_eq!(
            spec.segments[0].tcp_ports,
            vec![
                PortSpec::Text("80".into()),
                PortSpec::Text("8000-8100".into())
            ]
        );
        assert_eq!(spec.segments[0].udp_ports, vec![PortSpec::Number(3389)]);
        assert_eq!(spec.segments[1].tcp_ports, vec![PortSpec::Number(80)]);
        let p = validate(&spec).expect("valid");
        let jira = p.segment("jira").unwrap();
        assert_eq!(
            jira.tcp_ports,
            vec![
                PortRange::single(80).unwrap(),
                PortRange::new(8000, 8100).unwrap()
            ]
        );
        assert_eq!(jira.udp_ports, vec![PortRange::single(3389).unwrap()]);
        assert_eq!(jira.health_reporting, HealthReporting::OnAccess);
        assert_eq!(jira.report_interval, Duration::from_secs(30));
        assert!(jira.multimatch && jira.client_hostname_validation);
        let wiki = p.segment("wiki").unwrap();
        assert_eq!(wiki.tcp_ports, vec![PortRange::single(80).unwrap()]);
        assert_eq!(wiki.health_reporting, HealthReporting::Continuous);
        assert_eq!(wiki.report_interval, DEFAULT_REPORT_INTERVAL);
        assert_eq!(p.segment("mixed").unwrap().port_count(), 3);
        assert_eq!(p.segments_for_group("dc-east").count(), 3);
    }

    #[test]
    fn toml_rejects_unknown_segment_fields() {
        let text = r#"
            [[segments]]
            name = "jira"
            tcp_port = ["80"]
        "#;
        let e = toml::from_str::<PolicySpec>(text).unwrap_err();
        assert!(e.to_string().contains("tcp_port"), "{e}");
    }

    #[test]
    fn toml_port_errors_surface_in_validation() {
        let text = r#"
            [[connector_groups]]
            name = "dc-east"
            [[segments]]
            name = "jira"
            applications = ["jira.lanukcorp.com"]
            tcp_ports = [0, "70000", "9-1"]
            connector_groups = ["dc-east"]
        "#;
        let spec: PolicySpec = toml::from_str(text).expect("parses");
        assert_eq!(
            errors(&spec),
            vec![
                r#"segment "jira": tcp_ports entry 0 is port 0, which is not allowed (ports are 1-65535)"#,
                r#"segment "jira": tcp_ports entry "70000" is out of range: 70000 (ports are 1-65535)"#,
                r#"segment "jira": tcp_ports entry "9-1" is an inverted range (9 > 1)"#,
            ]
        );
    }
}
