//! Validation: turns operator input (`PolicySpec`, as read from TOML or the
//! wire) into a `Policy`, collecting *every* error with the segment, the field
//! and the rule it breaks, so an operator fixes a config in one pass.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::model::{
    AppEntry, ConnectorGroup, HealthReporting, Policy, PortRange, Protocol, Segment,
};

/// Limits that validation enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most ports (TCP and UDP together, ranges counted port by port) a
    /// continuous segment may have.
    pub max_continuous_ports: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_continuous_ports: 10,
        }
    }
}

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
}

/// A connector group as written by an operator.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSpec {
    /// Unique name.
    pub name: String,
}

/// A whole policy as written by an operator.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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

/// Validates a whole policy with the default limits.
pub fn validate(spec: &PolicySpec) -> Result<Policy, ValidationErrors> {
    validate_with(spec, Limits::default())
}

/// Validates a whole policy, collecting every error.
pub fn validate_with(spec: &PolicySpec, limits: Limits) -> Result<Policy, ValidationErrors> {
    let mut errors = Vec::new();

    let mut groups = Vec::new();
    let mut group_names = HashSet::new();
    for (i, g) in spec.connector_groups.iter().enumerate() {
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
            groups.push(ConnectorGroup {
                name: g.name.clone(),
            });
        }
    }

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

    if errors.is_empty() {
        Ok(Policy {
            connector_groups: groups,
            segments,
        })
    } else {
        Err(ValidationErrors(errors))
    }
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

    // Applications.
    let mut applications = Vec::new();
    let mut seen = HashSet::new();
    if spec.applications.is_empty() {
        err(
            "applications",
            "applications is empty (at least one FQDN, IP, wildcard or subnet is required)".into(),
        );
    }
    for raw in &spec.applications {
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

    // Ports.
    let tcp_ports = parse_ports(&spec.tcp_ports, Protocol::Tcp, &mut err);
    let udp_ports = parse_ports(&spec.udp_ports, Protocol::Udp, &mut err);
    if spec.tcp_ports.is_empty() && spec.udp_ports.is_empty() {
        err(
            "tcp_ports",
            "tcp_ports and udp_ports are both empty (at least one port is required)".into(),
        );
    }

    // Mode.
    let mode_text = spec.health_reporting.as_deref().unwrap_or("continuous");
    let health_reporting = match mode_text.parse::<HealthReporting>() {
        Ok(m) => Some(m),
        Err(m) => {
            err("health_reporting", format!("health_reporting has {m}"));
            None
        }
    };

    // Interval.
    let report_interval = match (spec.report_interval_ms, spec.report_interval_s) {
        (Some(0), _) => {
            err(
                "report_interval_ms",
                "report_interval_ms = 0 is not allowed (must be at least 1)".into(),
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
        (None, Some(s)) => Some(Duration::from_secs(s)),
        (None, None) => Some(DEFAULT_REPORT_INTERVAL),
    };

    // Groups.
    if spec.connector_groups.is_empty() {
        err(
            "connector_groups",
            "connector_groups is empty (at least one connector group must serve the segment)"
                .into(),
        );
    }
    let mut group_seen = HashSet::new();
    for g in &spec.connector_groups {
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

    // The seed's rules.
    let port_count: u32 = tcp_ports.iter().chain(&udp_ports).map(PortRange::len).sum();
    if health_reporting == Some(HealthReporting::Continuous) {
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
        }),
        _ => Err(errors),
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
    let lower = s.trim_end_matches('.').to_ascii_lowercase();
    if let Some(suffix) = lower.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err("has a wildcard outside the left-most label".into());
        }
        check_domain(suffix)?;
        if !suffix.contains('.') {
            return Err("is a wildcard over a top-level domain, which is too broad".into());
        }
        return Ok(AppEntry::Wildcard(suffix.to_owned()));
    }
    if lower.contains('*') {
        return Err(
            "has a wildcard that is not the whole left-most label (expected \"*.example.com\")"
                .into(),
        );
    }
    if lower.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err("is not a valid IP address".into());
    }
    check_domain(&lower)?;
    Ok(AppEntry::Fqdn(lower))
}

/// RFC 1035/1123 host name syntax: labels of 1-63 letters, digits and
/// hyphens (not at either end), 253 characters in all.
fn check_domain(name: &str) -> Result<(), String> {
    if name.len() > 253 {
        return Err(format!(
            "is not a valid domain name: {} characters long (max 253)",
            name.len()
        ));
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("is not a valid domain name: it has an empty label".into());
        }
        if label.len() > 63 {
            return Err(format!(
                "is not a valid domain name: label {label:?} is longer than 63 characters"
            ));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(format!(
                "is not a valid domain name: label {label:?} contains {c:?}"
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(format!(
                "is not a valid domain name: label {label:?} starts or ends with '-'"
            ));
        }
    }
    Ok(())
}
