//! Conversions between wire messages (`crate::v1`) and `policy` types.
//! Wire → policy is `TryFrom` with a typed `WireError`; policy → wire is
//! `From` and cannot fail.

use std::net::IpAddr;
use std::time::Duration;

use policy::report::{MAX_ACCESS_ID_BYTES, MAX_ADDRESSES_PER_ENTRY, MAX_DETAIL_CHARS};
use policy::validate::{PortSpec, SegmentSpec};
use policy::{
    AddressResult, AppKey, ApplicationReport, CandidateNote, DnsResolution, Failure, FailureKind,
    HealthReporting, Host, Method, Protocol, RefusalReason, Segment, Status, ValidationError,
};

use crate::v1;

/// A wire message that cannot become a policy value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A required field is absent.
    #[error("missing field `{0}`")]
    MissingField(&'static str),
    /// An enum field holds an unspecified or unknown value.
    #[error("field `{field}` has invalid value {value}")]
    InvalidEnum {
        /// Field name.
        field: &'static str,
        /// The raw value.
        value: i32,
    },
    /// A port is 0 or above 65535.
    #[error("field `{field}` has port {value} outside 1-65535")]
    InvalidPort {
        /// Field name.
        field: &'static str,
        /// The raw value.
        value: u64,
    },
    /// A text field that must hold an IP address does not.
    #[error("field `{field}` is not an IP address: {value:?}")]
    InvalidAddress {
        /// Field name.
        field: &'static str,
        /// The raw text (truncated to 64 characters).
        value: String,
    },
    /// A string field is empty or too long.
    #[error("field `{field}` {problem}")]
    InvalidText {
        /// Field name.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A repeated field holds more items than the protocol allows.
    #[error("field `{field}` has {count} items (max {max})")]
    TooMany {
        /// Field name.
        field: &'static str,
        /// How many it holds.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A segment breaks validation rules.
    #[error("invalid segment {name:?}: {}", join(errors))]
    InvalidSegment {
        /// Segment name.
        name: String,
        /// Every rule it breaks.
        errors: Vec<ValidationError>,
    },
}

fn join(errors: &[ValidationError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl From<WireError> for tonic::Status {
    fn from(e: WireError) -> Self {
        tonic::Status::invalid_argument(e.to_string())
    }
}

fn truncated(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Longest segment name accepted on the wire (hosts follow `policy::Host`).
const MAX_NAME: usize = 253;

/// Whether `s` passes [`text`].
pub(crate) fn text_ok(s: &str) -> bool {
    if s.is_empty() || s.len() > MAX_NAME {
        return false;
    }
    // An ASCII character is neither a control character nor white space
    // exactly when it is printable and not a space: checked byte by byte
    // for the names a connector sends, by character otherwise.
    if s.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return true;
    }
    !s.chars().any(|c| c.is_control() || c.is_whitespace())
}

fn text(field: &'static str, s: String) -> Result<String, WireError> {
    if s.is_empty() {
        Err(WireError::InvalidText {
            field,
            problem: "is empty".into(),
        })
    } else if s.len() > MAX_NAME {
        Err(WireError::InvalidText {
            field,
            problem: format!("is {} bytes long (max {MAX_NAME})", s.len()),
        })
    } else if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
        // Names and hosts end up in logs, metrics labels and the dashboard.
        Err(WireError::InvalidText {
            field,
            problem: "contains whitespace or a control character".into(),
        })
    } else {
        Ok(s)
    }
}

/// A host by `policy::Host`'s rules; what is wrong completes the field's
/// sentence ("field `app.host` is empty").
fn host(field: &'static str, s: String) -> Result<Host, WireError> {
    Host::parse_owned(s).map_err(|e| WireError::InvalidText {
        field,
        problem: e.to_string(),
    })
}

/// `s` cut to `MAX_DETAIL_CHARS` characters; reuses its buffer (the
/// common case, a short text, costs nothing).
pub(crate) fn bounded(mut s: String) -> String {
    if let Some((at, _)) = s.char_indices().nth(MAX_DETAIL_CHARS) {
        s.truncate(at);
    }
    s
}

pub(crate) fn port(field: &'static str, value: u32) -> Result<u16, WireError> {
    match u16::try_from(value) {
        Ok(p) if p >= 1 => Ok(p),
        _ => Err(WireError::InvalidPort {
            field,
            value: u64::from(value),
        }),
    }
}

// ---- enums ----

impl From<Protocol> for v1::Protocol {
    fn from(p: Protocol) -> Self {
        match p {
            Protocol::Tcp => v1::Protocol::Tcp,
            Protocol::Udp => v1::Protocol::Udp,
        }
    }
}

/// Decodes a wire protocol value.
pub fn protocol_from_wire(field: &'static str, value: i32) -> Result<Protocol, WireError> {
    match v1::Protocol::try_from(value) {
        Ok(v1::Protocol::Tcp) => Ok(Protocol::Tcp),
        Ok(v1::Protocol::Udp) => Ok(Protocol::Udp),
        _ => Err(WireError::InvalidEnum { field, value }),
    }
}

impl From<Status> for v1::HealthStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Up => v1::HealthStatus::Up,
            Status::Unhealthy => v1::HealthStatus::Unhealthy,
            Status::Down => v1::HealthStatus::Down,
            Status::Unknown => v1::HealthStatus::Unknown,
        }
    }
}

/// Decodes a wire health status.
pub fn status_from_wire(field: &'static str, value: i32) -> Result<Status, WireError> {
    match v1::HealthStatus::try_from(value) {
        Ok(v1::HealthStatus::Up) => Ok(Status::Up),
        Ok(v1::HealthStatus::Unhealthy) => Ok(Status::Unhealthy),
        Ok(v1::HealthStatus::Down) => Ok(Status::Down),
        Ok(v1::HealthStatus::Unknown) => Ok(Status::Unknown),
        _ => Err(WireError::InvalidEnum { field, value }),
    }
}

impl From<Method> for v1::CheckMethod {
    fn from(m: Method) -> Self {
        match m {
            Method::Tcp => v1::CheckMethod::Tcp,
            Method::Icmp => v1::CheckMethod::Icmp,
            Method::TcpFallback => v1::CheckMethod::TcpFallback,
        }
    }
}

/// Decodes a wire check method.
pub fn method_from_wire(field: &'static str, value: i32) -> Result<Method, WireError> {
    match v1::CheckMethod::try_from(value) {
        Ok(v1::CheckMethod::Tcp) => Ok(Method::Tcp),
        Ok(v1::CheckMethod::Icmp) => Ok(Method::Icmp),
        Ok(v1::CheckMethod::TcpFallback) => Ok(Method::TcpFallback),
        _ => Err(WireError::InvalidEnum { field, value }),
    }
}

impl From<FailureKind> for v1::FailureKind {
    fn from(k: FailureKind) -> Self {
        match k {
            FailureKind::Timeout => v1::FailureKind::Timeout,
            FailureKind::Refused => v1::FailureKind::Refused,
            FailureKind::Unreachable => v1::FailureKind::Unreachable,
            FailureKind::Dns => v1::FailureKind::Dns,
            FailureKind::Other => v1::FailureKind::Other,
            FailureKind::NotAllowed => v1::FailureKind::NotAllowed,
        }
    }
}

/// Decodes a wire failure kind; unspecified means "no failure".
pub fn failure_kind_from_wire(
    field: &'static str,
    value: i32,
) -> Result<Option<FailureKind>, WireError> {
    match v1::FailureKind::try_from(value) {
        Ok(v1::FailureKind::Unspecified) => Ok(None),
        Ok(v1::FailureKind::Timeout) => Ok(Some(FailureKind::Timeout)),
        Ok(v1::FailureKind::Refused) => Ok(Some(FailureKind::Refused)),
        Ok(v1::FailureKind::Unreachable) => Ok(Some(FailureKind::Unreachable)),
        Ok(v1::FailureKind::Dns) => Ok(Some(FailureKind::Dns)),
        Ok(v1::FailureKind::Other) => Ok(Some(FailureKind::Other)),
        Ok(v1::FailureKind::NotAllowed) => Ok(Some(FailureKind::NotAllowed)),
        Err(_) => Err(WireError::InvalidEnum { field, value }),
    }
}

impl From<HealthReporting> for v1::HealthReporting {
    fn from(m: HealthReporting) -> Self {
        match m {
            HealthReporting::Continuous => v1::HealthReporting::Continuous,
            HealthReporting::OnAccess => v1::HealthReporting::OnAccess,
            HealthReporting::None => v1::HealthReporting::None,
        }
    }
}

impl From<DnsResolution> for v1::DnsResolution {
    fn from(d: DnsResolution) -> Self {
        match d {
            DnsResolution::Ipv4 => v1::DnsResolution::Ipv4,
            DnsResolution::Ipv6 => v1::DnsResolution::Ipv6,
            DnsResolution::Dual => v1::DnsResolution::Dual,
        }
    }
}

/// Decodes a wire DNS resolution choice: unspecified (an older CA) and
/// values this build does not know (a newer CA) mean `Dual`, which asks
/// for everything rather than hide addresses.
pub fn dns_resolution_from_wire(value: i32) -> DnsResolution {
    match v1::DnsResolution::try_from(value) {
        Ok(v1::DnsResolution::Ipv4) => DnsResolution::Ipv4,
        Ok(v1::DnsResolution::Ipv6) => DnsResolution::Ipv6,
        Ok(v1::DnsResolution::Dual | v1::DnsResolution::Unspecified) | Err(_) => {
            DnsResolution::Dual
        }
    }
}

/// Decodes a wire health reporting mode.
pub fn mode_from_wire(field: &'static str, value: i32) -> Result<HealthReporting, WireError> {
    match v1::HealthReporting::try_from(value) {
        Ok(v1::HealthReporting::Continuous) => Ok(HealthReporting::Continuous),
        Ok(v1::HealthReporting::OnAccess) => Ok(HealthReporting::OnAccess),
        Ok(v1::HealthReporting::None) => Ok(HealthReporting::None),
        _ => Err(WireError::InvalidEnum { field, value }),
    }
}

impl From<RefusalReason> for v1::RefusalReason {
    fn from(r: RefusalReason) -> Self {
        match r {
            RefusalReason::NoSegment => v1::RefusalReason::NoSegment,
            RefusalReason::PortNotInSegment => v1::RefusalReason::PortNotInSegment,
            RefusalReason::NoConnector => v1::RefusalReason::NoConnector,
            RefusalReason::AllDown => v1::RefusalReason::AllDown,
            RefusalReason::NoHealthReport => v1::RefusalReason::NoHealthReport,
            RefusalReason::DiscoveryTimeout => v1::RefusalReason::DiscoveryTimeout,
            RefusalReason::AllDrained => v1::RefusalReason::AllDrained,
        }
    }
}

/// Decodes a wire refusal reason.
pub fn refusal_from_wire(field: &'static str, value: i32) -> Result<RefusalReason, WireError> {
    match v1::RefusalReason::try_from(value) {
        Ok(v1::RefusalReason::NoSegment) => Ok(RefusalReason::NoSegment),
        Ok(v1::RefusalReason::PortNotInSegment) => Ok(RefusalReason::PortNotInSegment),
        Ok(v1::RefusalReason::NoConnector) => Ok(RefusalReason::NoConnector),
        Ok(v1::RefusalReason::AllDown) => Ok(RefusalReason::AllDown),
        Ok(v1::RefusalReason::NoHealthReport) => Ok(RefusalReason::NoHealthReport),
        Ok(v1::RefusalReason::DiscoveryTimeout) => Ok(RefusalReason::DiscoveryTimeout),
        Ok(v1::RefusalReason::AllDrained) => Ok(RefusalReason::AllDrained),
        _ => Err(WireError::InvalidEnum { field, value }),
    }
}

// ---- messages ----

impl From<&AppKey> for v1::ApplicationKey {
    fn from(k: &AppKey) -> Self {
        v1::ApplicationKey {
            segment: k.segment.clone(),
            host: k.host.to_string(),
            protocol: v1::Protocol::from(k.protocol) as i32,
            port: u32::from(k.port),
        }
    }
}

impl TryFrom<v1::ApplicationKey> for AppKey {
    type Error = WireError;
    /// The host is normalised (`policy::Host`), so "::0001" and "::1" are
    /// one application, and an IP literal is parsed here, once
    /// (`key.host.ip()`).
    fn try_from(k: v1::ApplicationKey) -> Result<Self, WireError> {
        Ok(AppKey {
            segment: text("app.segment", k.segment)?,
            host: host("app.host", k.host)?,
            protocol: protocol_from_wire("app.protocol", k.protocol)?,
            port: port("app.port", k.port)?,
        })
    }
}

impl From<&AddressResult> for v1::AddressResult {
    fn from(r: &AddressResult) -> Self {
        v1::AddressResult {
            reason: r.check.as_ref().and_then(|c| c.reason.clone()),
            certificate_not_after_unix_s: r.check.as_ref().and_then(|c| c.not_after),
            address: r.address.to_string(),
            status: if r.reachable {
                v1::HealthStatus::Up
            } else {
                v1::HealthStatus::Down
            } as i32,
            method: v1::CheckMethod::from(r.method) as i32,
            rtt_us: u64::try_from(r.rtt.as_micros()).unwrap_or(u64::MAX),
            failure: r
                .failure
                .as_ref()
                .map_or(v1::FailureKind::Unspecified, |f| f.kind.into())
                as i32,
            detail: r
                .failure
                .as_ref()
                .map(|f| f.detail.clone())
                .unwrap_or_default(),
        }
    }
}

impl TryFrom<v1::AddressResult> for AddressResult {
    type Error = WireError;
    fn try_from(r: v1::AddressResult) -> Result<Self, WireError> {
        let address: IpAddr = r.address.parse().map_err(|_| WireError::InvalidAddress {
            field: "address",
            value: truncated(&r.address),
        })?;
        let reachable = match status_from_wire("address.status", r.status)? {
            Status::Up => true,
            Status::Down => false,
            _ => {
                return Err(WireError::InvalidEnum {
                    field: "address.status",
                    value: r.status,
                });
            }
        };
        let failure = failure_kind_from_wire("address.failure", r.failure)?.map(|kind| Failure {
            kind,
            detail: bounded(r.detail),
        });
        Ok(AddressResult {
            address,
            reachable,
            method: method_from_wire("address.method", r.method)?,
            rtt: Duration::from_micros(r.rtt_us),
            failure,
            check: check_detail(r.reason, r.certificate_not_after_unix_s),
        })
    }
}

/// The application-level check's detail of a wire result (`None` when it
/// carries neither field); the reason is bounded like a failure's detail.
pub(crate) fn check_detail(
    reason: Option<String>,
    not_after: Option<i64>,
) -> Option<Box<policy::CheckDetail>> {
    (reason.is_some() || not_after.is_some()).then(|| {
        Box::new(policy::CheckDetail {
            reason: reason.map(bounded),
            not_after,
        })
    })
}

impl From<&ApplicationReport> for v1::ApplicationHealth {
    fn from(r: &ApplicationReport) -> Self {
        v1::ApplicationHealth {
            app: Some(v1::ApplicationKey::from(&r.key)),
            status: v1::HealthStatus::from(r.status) as i32,
            addresses: r.addresses.iter().map(v1::AddressResult::from).collect(),
            checked_at_unix_ms: r.checked_at_unix_ms,
            dns_error: r.dns_error.clone().unwrap_or_default(),
            expired: r.expired,
            age_ms: u64::try_from(r.age.as_millis()).unwrap_or(u64::MAX),
            access_id: r.access_id.clone().unwrap_or_default(),
        }
    }
}

impl From<ApplicationReport> for v1::ApplicationHealth {
    fn from(r: ApplicationReport) -> Self {
        v1::ApplicationHealth::from(&r)
    }
}

impl TryFrom<v1::ApplicationHealth> for ApplicationReport {
    type Error = WireError;
    /// Every field is checked; the resolver's reason is kept up to
    /// `MAX_DETAIL_CHARS` characters (empty means none).
    fn try_from(app: v1::ApplicationHealth) -> Result<Self, WireError> {
        let key = AppKey::try_from(app.app.ok_or(WireError::MissingField("app"))?)?;
        let status = status_from_wire("status", app.status)?;
        if app.addresses.len() > MAX_ADDRESSES_PER_ENTRY {
            return Err(WireError::TooMany {
                field: "addresses",
                count: app.addresses.len(),
                max: MAX_ADDRESSES_PER_ENTRY,
            });
        }
        let addresses = app
            .addresses
            .into_iter()
            .map(AddressResult::try_from)
            .collect::<Result<Vec<_>, _>>()?;
        let dns_error = (!app.dns_error.is_empty()).then(|| bounded(app.dns_error));
        if app.access_id.len() > MAX_ACCESS_ID_BYTES {
            return Err(WireError::InvalidText {
                field: "access_id",
                problem: format!(
                    "has {} bytes (max {MAX_ACCESS_ID_BYTES})",
                    app.access_id.len()
                ),
            });
        }
        let access_id = (!app.access_id.is_empty()).then_some(app.access_id);
        Ok(ApplicationReport {
            key,
            status,
            addresses,
            checked_at_unix_ms: app.checked_at_unix_ms,
            dns_error,
            expired: app.expired,
            age: Duration::from_millis(app.age_ms),
            access_id,
        })
    }
}

/// A duration in whole microseconds (saturating).
fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl From<&policy::UserLocationNote> for v1::UserLocationExplanation {
    fn from(u: &policy::UserLocationNote) -> Self {
        v1::UserLocationExplanation {
            location: Some(v1::GeoLocation {
                latitude: u.latitude,
                longitude: u.longitude,
            }),
            used: u.used,
            reason: u.reason.clone(),
        }
    }
}

impl From<&CandidateNote> for v1::CandidateExplanation {
    fn from(c: &CandidateNote) -> Self {
        Self::from(c.clone())
    }
}

/// The owned form moves the note's strings instead of copying them (the
/// access path builds one per candidate per decision).
impl From<CandidateNote> for v1::CandidateExplanation {
    fn from(c: CandidateNote) -> Self {
        v1::CandidateExplanation {
            connector: c.connector,
            group: c.group,
            connected: c.connected,
            status: v1::HealthStatus::from(c.status) as i32,
            eligible: c.eligible,
            reason: c.reason,
            rtt_us: c.rtt.map(micros),
            distance_km: c.distance_km,
            user_rtt_us: c.user_rtt.map(micros),
            score_us: c.score.map(micros),
        }
    }
}

impl From<&Segment> for v1::Segment {
    fn from(s: &Segment) -> Self {
        let ranges = |rs: &[policy::PortRange]| {
            rs.iter()
                .map(|r| v1::PortRange {
                    start: u32::from(r.start()),
                    end: u32::from(r.end()),
                })
                .collect()
        };
        let ms = s.report_interval.as_millis();
        v1::Segment {
            name: s.name.clone(),
            applications: s.applications.iter().map(ToString::to_string).collect(),
            tcp_ports: ranges(&s.tcp_ports),
            udp_ports: ranges(&s.udp_ports),
            health_reporting: v1::HealthReporting::from(s.health_reporting) as i32,
            report_interval_s: u32::try_from(s.report_interval.as_secs()).unwrap_or(u32::MAX),
            multimatch: s.multimatch,
            client_hostname_validation: s.client_hostname_validation,
            connector_groups: s.connector_groups.clone(),
            report_interval_ms: if ms.is_multiple_of(1000) {
                0
            } else {
                u32::try_from(ms).unwrap_or(u32::MAX)
            },
            rise: s.damping.rise(),
            fall: s.damping.fall(),
            strategy: s
                .strategy
                .map(|st| st.as_str().to_owned())
                .unwrap_or_default(),
            check: if s.check.kind == policy::CheckKind::Tcp {
                String::new()
            } else {
                s.check.kind.as_str().to_owned()
            },
            check_path: if s.check.kind.uses_http() {
                s.check.path.clone()
            } else {
                String::new()
            },
            check_expect: if s.check.kind.uses_http() {
                s.check.expect.to_string()
            } else {
                String::new()
            },
            check_ca_pem: s.check.ca_pem.as_deref().unwrap_or_default().to_owned(),
        }
    }
}

impl TryFrom<v1::Segment> for Segment {
    type Error = WireError;
    /// Segments from the wire pass the same validation as configuration,
    /// except that connector groups need not exist (a connector knows only
    /// its own).
    fn try_from(s: v1::Segment) -> Result<Self, WireError> {
        let mode = mode_from_wire("segment.health_reporting", s.health_reporting)?;
        // A wire port that does not fit a port number is malformed input,
        // rejected here; empty, inverted and overlapping ranges are rules
        // that validation reports.
        let ranges =
            |field: &'static str, rs: Vec<v1::PortRange>| -> Result<Vec<PortSpec>, WireError> {
                rs.into_iter()
                    .map(|r| {
                        let start = port(field, r.start)?;
                        let end = port(field, r.end)?;
                        Ok(if start == end {
                            PortSpec::Number(i64::from(start))
                        } else {
                            PortSpec::Text(format!("{start}-{end}"))
                        })
                    })
                    .collect()
            };
        let spec = SegmentSpec {
            name: s.name.clone(),
            applications: s.applications,
            tcp_ports: ranges("segment.tcp_ports", s.tcp_ports)?,
            udp_ports: ranges("segment.udp_ports", s.udp_ports)?,
            health_reporting: Some(mode.as_str().to_owned()),
            report_interval_s: Some(u64::from(s.report_interval_s)),
            report_interval_ms: (s.report_interval_ms != 0)
                .then_some(u64::from(s.report_interval_ms)),
            multimatch: s.multimatch,
            client_hostname_validation: s.client_hostname_validation,
            connector_groups: s.connector_groups,
            // 0: a CA that predates damping, i.e. 1.
            rise: (s.rise != 0).then_some(s.rise),
            fall: (s.fall != 0).then_some(s.fall),
            // Informational on this side: a strategy a newer CA knows and
            // this build does not must not make the segment invalid.
            strategy: s
                .strategy
                .parse::<policy::Strategy>()
                .ok()
                .map(|st| st.as_str().to_owned()),
            check: (!s.check.is_empty()).then_some(s.check),
            check_path: (!s.check_path.is_empty()).then_some(s.check_path),
            check_expect: (!s.check_expect.is_empty()).then_some(s.check_expect),
            check_ca_file: None,
            check_ca_pem: (!s.check_ca_pem.is_empty()).then_some(Ok(s.check_ca_pem)),
        };
        policy::validate_segment(&spec).map_err(|errors| WireError::InvalidSegment {
            name: truncated(&s.name),
            errors,
        })
    }
}

#[cfg(test)]
mod tests {
    use policy::validate::validate_segment;
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// `text_ok`'s byte check for ASCII gives what the character rule
        /// gives, on every character class near the boundaries.
        #[test]
        fn text_ok_is_the_character_rule(s in "[\\x00-\\x7f]{0,8}|[ -~]{0,12}|.{0,6}|[a-z\u{85}\u{a0}\u{2028}\u{3000}\u{80}-\u{9f}é]{0,6}|x{250,256}") {
            let rule = !s.is_empty() && s.len() <= MAX_NAME && !s.chars().any(|c| c.is_control() || c.is_whitespace());
            prop_assert_eq!(text_ok(&s), rule, "{:?}", s);
        }
    }

    fn segment_spec() -> SegmentSpec {
        SegmentSpec {
            name: "jira".into(),
            applications: vec!["jira.lanukcorp.com".into(), "10.1.1.1".into()],
            tcp_ports: vec!["80".into()],
            udp_ports: vec!["3389".into()],
            health_reporting: Some("continuous".into()),
            report_interval_s: Some(60),
            connector_groups: vec!["dc-east".into()],
            ..SegmentSpec::default()
        }
    }

    fn wire_segment() -> v1::Segment {
        v1::Segment::from(&validate_segment(&segment_spec()).unwrap())
    }

    fn wire_key() -> v1::ApplicationKey {
        v1::ApplicationKey {
            segment: "jira".into(),
            host: "jira.lanukcorp.com".into(),
            protocol: v1::Protocol::Tcp as i32,
            port: 80,
        }
    }

    fn wire_result() -> v1::AddressResult {
        v1::AddressResult {
            reason: None,
            certificate_not_after_unix_s: None,
            address: "10.1.2.1".into(),
            status: v1::HealthStatus::Up as i32,
            method: v1::CheckMethod::Tcp as i32,
            rtt_us: 1500,
            failure: v1::FailureKind::Unspecified as i32,
            detail: String::new(),
        }
    }

    // ---- round trips: policy -> wire -> policy ----

    #[test]
    fn app_keys_round_trip() {
        for (host, protocol, port) in [
            ("jira.lanukcorp.com", Protocol::Tcp, 80),
            ("10.1.1.1", Protocol::Udp, 3389),
            ("fd00::1", Protocol::Tcp, 65535),
            ("x.safemarch.com", Protocol::Udp, 1),
        ] {
            let key = AppKey {
                segment: "jira".into(),
                host: host.parse().unwrap(),
                protocol,
                port,
            };
            let wire = v1::ApplicationKey::from(&key);
            assert_eq!(AppKey::try_from(wire), Ok(key));
        }
    }

    #[test]
    fn address_results_round_trip() {
        let up = AddressResult {
            check: None,
            address: "10.1.2.1".parse().unwrap(),
            reachable: true,
            method: Method::Icmp,
            rtt: Duration::from_micros(1234),
            failure: None,
        };
        let mut cases = vec![up.clone()];
        for method in [Method::Tcp, Method::Icmp, Method::TcpFallback] {
            for kind in [
                FailureKind::Timeout,
                FailureKind::Refused,
                FailureKind::Unreachable,
                FailureKind::Dns,
                FailureKind::Other,
                FailureKind::NotAllowed,
            ] {
                cases.push(AddressResult {
                    check: None,
                    address: "fd00::2".parse().unwrap(),
                    reachable: false,
                    method,
                    rtt: Duration::ZERO,
                    failure: Some(Failure {
                        kind,
                        detail: format!("{kind} via {method}"),
                    }),
                });
            }
        }
        // What an application-level check adds: a reason, an expiry.
        for (reason, not_after) in [
            (Some("http 503"), None),
            (Some("tls: certificate expired"), Some(1_600_000_000)),
            (None, Some(4_102_444_800)),
            (None, Some(-1)),
        ] {
            cases.push(AddressResult {
                reachable: reason.is_none(),
                failure: reason.map(|r| Failure {
                    kind: FailureKind::Other,
                    detail: r.to_owned(),
                }),
                check: Some(Box::new(policy::CheckDetail {
                    reason: reason.map(str::to_owned),
                    not_after,
                })),
                ..up.clone()
            });
        }
        for r in cases {
            let wire = v1::AddressResult::from(&r);
            assert_eq!(AddressResult::try_from(wire), Ok(r));
        }
    }

    #[test]
    fn segments_round_trip() {
        let mut specs = vec![segment_spec()];
        let mut discovery = segment_spec();
        discovery.name = "discovery".into();
        discovery.applications = vec![
            "*.safemarch.com".into(),
            "10.122.0.0/16".into(),
            "fd00::/8".into(),
            "fd00::1".into(),
            "JIRA.example.com.".into(),
        ];
        discovery.tcp_ports = vec!["80".into(), "8000-8100".into(), "65535".into()];
        discovery.udp_ports = vec![];
        discovery.health_reporting = Some("on_access".into());
        discovery.multimatch = true;
        discovery.client_hostname_validation = true;
        discovery.connector_groups = vec!["dc-east".into(), "dc-west".into()];
        discovery.check = Some("https".into());
        discovery.check_path = Some("/healthz?x=1".into());
        discovery.check_expect = Some("200,204,300-399".into());
        discovery.check_ca_file = Some("roots.pem".into());
        discovery.check_ca_pem = Some(Ok(
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".into(),
        ));
        specs.push(discovery);
        for check in ["tcp", "tls", "http"] {
            let mut spec = segment_spec();
            spec.check = Some(check.into());
            specs.push(spec);
        }
        for (mode, s, ms) in [
            ("none", None, Some(250)),
            ("on_access", None, Some(1500)),
            ("continuous", Some(86_400), None),
            ("continuous", None, Some(2000)),
            ("continuous", None, None),
        ] {
            let mut spec = segment_spec();
            spec.health_reporting = Some(mode.into());
            spec.report_interval_s = s;
            spec.report_interval_ms = ms;
            specs.push(spec);
        }
        for spec in specs {
            let segment = validate_segment(&spec).unwrap();
            let wire = v1::Segment::from(&segment);
            assert_eq!(Segment::try_from(wire), Ok(segment));
        }
    }

    #[test]
    fn enums_round_trip() {
        for p in [Protocol::Tcp, Protocol::Udp] {
            assert_eq!(protocol_from_wire("f", v1::Protocol::from(p) as i32), Ok(p));
        }
        for s in [Status::Up, Status::Unhealthy, Status::Down, Status::Unknown] {
            assert_eq!(
                status_from_wire("f", v1::HealthStatus::from(s) as i32),
                Ok(s)
            );
        }
        for m in [Method::Tcp, Method::Icmp, Method::TcpFallback] {
            assert_eq!(
                method_from_wire("f", v1::CheckMethod::from(m) as i32),
                Ok(m)
            );
        }
        for k in [
            FailureKind::Timeout,
            FailureKind::Refused,
            FailureKind::Unreachable,
            FailureKind::Dns,
            FailureKind::Other,
            FailureKind::NotAllowed,
        ] {
            assert_eq!(
                failure_kind_from_wire("f", v1::FailureKind::from(k) as i32),
                Ok(Some(k))
            );
        }
        assert_eq!(failure_kind_from_wire("f", 0), Ok(None));
        for h in [
            HealthReporting::Continuous,
            HealthReporting::OnAccess,
            HealthReporting::None,
        ] {
            assert_eq!(
                mode_from_wire("f", v1::HealthReporting::from(h) as i32),
                Ok(h)
            );
        }
        for r in [
            RefusalReason::NoSegment,
            RefusalReason::PortNotInSegment,
            RefusalReason::NoConnector,
            RefusalReason::AllDown,
            RefusalReason::NoHealthReport,
            RefusalReason::DiscoveryTimeout,
            RefusalReason::AllDrained,
        ] {
            assert_eq!(
                refusal_from_wire("f", v1::RefusalReason::from(r) as i32),
                Ok(r)
            );
        }
    }

    #[test]
    fn unspecified_and_unknown_enum_values_are_rejected() {
        for value in [0, 99, -1, i32::MIN, i32::MAX] {
            let bad = |field| WireError::InvalidEnum { field, value };
            assert_eq!(protocol_from_wire("p", value), Err(bad("p")));
            assert_eq!(status_from_wire("s", value), Err(bad("s")));
            assert_eq!(method_from_wire("m", value), Err(bad("m")));
            assert_eq!(mode_from_wire("h", value), Err(bad("h")));
            assert_eq!(refusal_from_wire("r", value), Err(bad("r")));
            if value != 0 {
                assert_eq!(
                    failure_kind_from_wire("f", value),
                    Err(WireError::InvalidEnum { field: "f", value })
                );
            }
        }
    }

    // ---- malformed application keys ----

    #[test]
    fn app_key_hosts_are_normalised() {
        for (wire, policy) in [
            ("JIRA.LanukCorp.com", "jira.lanukcorp.com"),
            ("jira.lanukcorp.com.", "jira.lanukcorp.com"),
            ("::0001", "::1"),
            ("FD00:0::1", "fd00::1"),
            ("10.1.1.1.", "10.1.1.1"),
            ("127.0.0.1", "127.0.0.1"),
            ("0.0.0.0", "0.0.0.0"),
            ("255.255.255.255", "255.255.255.255"),
            // Not IPv4 literals (leading zeros, too few parts): names.
            ("010.1.1.1", "010.1.1.1"),
            ("10.1.1", "10.1.1"),
            ("::FFFF:10.1.1.1", "::ffff:10.1.1.1"),
        ] {
            let k = v1::ApplicationKey {
                host: wire.into(),
                ..wire_key()
            };
            let key = AppKey::try_from(k).unwrap();
            assert_eq!(key.host, policy, "{wire}");
            // The parse handed out with the key is the key's host's.
            assert_eq!(key.host.ip(), key.host.parse::<IpAddr>().ok(), "{wire}");
        }
        // Every IPv4 address std parses is already in its canonical form.
        for text in ["1.2.3.4", "192.168.0.10", "10.0.100.200", "0.1.0.1"] {
            let ip: std::net::Ipv4Addr = text.parse().unwrap();
            assert_eq!(ip.to_string(), text);
        }
        for text in ["01.2.3.4", "1.2.3.04", "1.2.3", "1.2.3.4.5", "1.2.3.256"] {
            assert!(text.parse::<std::net::Ipv4Addr>().is_err(), "{text}");
        }
    }

    #[test]
    fn malformed_app_keys_are_rejected() {
        let cases: Vec<(v1::ApplicationKey, WireError)> = vec![
            (
                v1::ApplicationKey {
                    port: 0,
                    ..wire_key()
                },
                WireError::InvalidPort {
                    field: "app.port",
                    value: 0,
                },
            ),
            (
                v1::ApplicationKey {
                    port: 70000,
                    ..wire_key()
                },
                WireError::InvalidPort {
                    field: "app.port",
                    value: 70000,
                },
            ),
            (
                v1::ApplicationKey {
                    port: u32::MAX,
                    ..wire_key()
                },
                WireError::InvalidPort {
                    field: "app.port",
                    value: u64::from(u32::MAX),
                },
            ),
            (
                v1::ApplicationKey {
                    protocol: 0,
                    ..wire_key()
                },
                WireError::InvalidEnum {
                    field: "app.protocol",
                    value: 0,
                },
            ),
            (
                v1::ApplicationKey {
                    protocol: 7,
                    ..wire_key()
                },
                WireError::InvalidEnum {
                    field: "app.protocol",
                    value: 7,
                },
            ),
            (
                v1::ApplicationKey {
                    host: String::new(),
                    ..wire_key()
                },
                WireError::InvalidText {
                    field: "app.host",
                    problem: "is empty".into(),
                },
            ),
            (
                v1::ApplicationKey {
                    segment: String::new(),
                    ..wire_key()
                },
                WireError::InvalidText {
                    field: "app.segment",
                    problem: "is empty".into(),
                },
            ),
            (
                v1::ApplicationKey {
                    host: "..".into(),
                    ..wire_key()
                },
                WireError::InvalidText {
                    field: "app.host",
                    problem: "is only dots".into(),
                },
            ),
            (
                v1::ApplicationKey {
                    host: "jira\n.com".into(),
                    ..wire_key()
                },
                WireError::InvalidText {
                    field: "app.host",
                    problem: "contains whitespace or a control character".into(),
                },
            ),
            (
                v1::ApplicationKey {
                    segment: "ji ra".into(),
                    ..wire_key()
                },
                WireError::InvalidText {
                    field: "app.segment",
                    problem: "contains whitespace or a control character".into(),
                },
            ),
            (
                v1::ApplicationKey {
                    host: "a".repeat(254),
                    ..wire_key()
                },
                WireError::InvalidText {
                    field: "app.host",
                    problem: "is 254 bytes long (max 253)".into(),
                },
            ),
        ];
        for (wire, expected) in cases {
            assert_eq!(AppKey::try_from(wire.clone()), Err(expected), "{wire:?}");
        }
        // The longest allowed host passes (in labels of at most 63 bytes,
        // `policy::Host`'s rule since it is the one rule everywhere).
        let label = "a".repeat(63);
        let ok = v1::ApplicationKey {
            host: format!("{label}.{label}.{label}.{}", "a".repeat(61)),
            ..wire_key()
        };
        assert!(AppKey::try_from(ok).is_ok());
        // Hosts follow the DNS rules the configuration follows.
        for (host, problem) in [
            (
                format!("{label}a.com"),
                format!("label \"{label}a\" is longer than 63 characters"),
            ),
            (
                "jira*.com".to_owned(),
                "label \"jira*\" contains '*'".to_owned(),
            ),
            ("a..b".to_owned(), "has an empty label".to_owned()),
            (
                "-a.com".to_owned(),
                "label \"-a\" starts or ends with '-'".to_owned(),
            ),
        ] {
            let wire = v1::ApplicationKey { host, ..wire_key() };
            assert_eq!(
                AppKey::try_from(wire),
                Err(WireError::InvalidText {
                    field: "app.host",
                    problem
                })
            );
        }
    }

    // ---- malformed address results ----

    #[test]
    fn malformed_address_results_are_rejected() {
        for address in [
            "",
            "10.1.1",
            "10.1.1.256",
            "jira.lanukcorp.com",
            "10.1.1.1:80",
            " 10.1.1.1",
        ] {
            let wire = v1::AddressResult {
                reason: None,
                certificate_not_after_unix_s: None,
                address: address.into(),
                ..wire_result()
            };
            assert_eq!(
                AddressResult::try_from(wire),
                Err(WireError::InvalidAddress {
                    field: "address",
                    value: address.into()
                })
            );
        }
        // A hostile address is echoed back truncated, not whole.
        let long = "x".repeat(10_000);
        match AddressResult::try_from(v1::AddressResult {
            reason: None,
            certificate_not_after_unix_s: None,
            address: long,
            ..wire_result()
        }) {
            Err(WireError::InvalidAddress { value, .. }) => assert_eq!(value.len(), 64),
            other => panic!("{other:?}"),
        }
        // An address is Up or Down; anything else is an invalid status.
        for status in [
            v1::HealthStatus::Unspecified as i32,
            v1::HealthStatus::Unhealthy as i32,
            v1::HealthStatus::Unknown as i32,
            42,
        ] {
            let wire = v1::AddressResult {
                reason: None,
                certificate_not_after_unix_s: None,
                status,
                ..wire_result()
            };
            assert_eq!(
                AddressResult::try_from(wire),
                Err(WireError::InvalidEnum {
                    field: "address.status",
                    value: status
                })
            );
        }
        for method in [v1::CheckMethod::Unspecified as i32, 9] {
            let wire = v1::AddressResult {
                reason: None,
                certificate_not_after_unix_s: None,
                method,
                ..wire_result()
            };
            assert_eq!(
                AddressResult::try_from(wire),
                Err(WireError::InvalidEnum {
                    field: "address.method",
                    value: method
                })
            );
        }
        let wire = v1::AddressResult {
            reason: None,
            certificate_not_after_unix_s: None,
            failure: 77,
            ..wire_result()
        };
        assert_eq!(
            AddressResult::try_from(wire),
            Err(WireError::InvalidEnum {
                field: "address.failure",
                value: 77
            })
        );
    }

    #[test]
    fn failure_detail_is_bounded() {
        let wire = v1::AddressResult {
            reason: None,
            certificate_not_after_unix_s: None,
            status: v1::HealthStatus::Down as i32,
            failure: v1::FailureKind::Other as i32,
            detail: "é".repeat(5000),
            ..wire_result()
        };
        let r = AddressResult::try_from(wire).unwrap();
        assert_eq!(r.failure.unwrap().detail.chars().count(), 512);
    }

    // ---- application reports ----

    fn report() -> ApplicationReport {
        ApplicationReport {
            key: AppKey::try_from(wire_key()).unwrap(),
            status: Status::Unhealthy,
            addresses: vec![
                AddressResult::try_from(wire_result()).unwrap(),
                AddressResult {
                    check: None,
                    address: "10.1.2.2".parse().unwrap(),
                    reachable: false,
                    method: Method::Tcp,
                    rtt: Duration::ZERO,
                    failure: Some(Failure {
                        kind: FailureKind::Refused,
                        detail: "connection refused".into(),
                    }),
                },
            ],
            checked_at_unix_ms: 1_700_000_000_123,
            dns_error: None,
            expired: false,
            age: Duration::from_millis(1_250),
            access_id: Some("1.1700000000000.00ff".into()),
        }
    }

    #[test]
    fn application_reports_round_trip() {
        let expired = ApplicationReport {
            status: Status::Unknown,
            addresses: Vec::new(),
            expired: true,
            ..report()
        };
        let dns = ApplicationReport {
            status: Status::Down,
            addresses: Vec::new(),
            dns_error: Some("NXDOMAIN: jira.lanukcorp.com does not exist".into()),
            ..report()
        };
        for r in [report(), expired, dns] {
            let wire = v1::ApplicationHealth::from(r.clone());
            assert_eq!(ApplicationReport::try_from(wire), Ok(r));
        }
    }

    #[test]
    fn malformed_application_reports_are_rejected() {
        let wire = || v1::ApplicationHealth::from(report());
        let cases = [
            (
                v1::ApplicationHealth {
                    app: None,
                    ..wire()
                },
                WireError::MissingField("app"),
            ),
            (
                v1::ApplicationHealth {
                    status: 0,
                    ..wire()
                },
                WireError::InvalidEnum {
                    field: "status",
                    value: 0,
                },
            ),
            (
                v1::ApplicationHealth {
                    app: Some(v1::ApplicationKey {
                        host: "..".into(),
                        ..wire_key()
                    }),
                    ..wire()
                },
                WireError::InvalidText {
                    field: "app.host",
                    problem: "is only dots".into(),
                },
            ),
            (
                v1::ApplicationHealth {
                    addresses: vec![v1::AddressResult {
                        reason: None,
                        certificate_not_after_unix_s: None,
                        address: "nope".into(),
                        ..wire_result()
                    }],
                    ..wire()
                },
                WireError::InvalidAddress {
                    field: "address",
                    value: "nope".into(),
                },
            ),
            (
                v1::ApplicationHealth {
                    access_id: "x".repeat(MAX_ACCESS_ID_BYTES + 1),
                    ..wire()
                },
                WireError::InvalidText {
                    field: "access_id",
                    problem: format!(
                        "has {} bytes (max {MAX_ACCESS_ID_BYTES})",
                        MAX_ACCESS_ID_BYTES + 1
                    ),
                },
            ),
            (
                v1::ApplicationHealth {
                    addresses: vec![wire_result(); MAX_ADDRESSES_PER_ENTRY + 1],
                    ..wire()
                },
                WireError::TooMany {
                    field: "addresses",
                    count: MAX_ADDRESSES_PER_ENTRY + 1,
                    max: MAX_ADDRESSES_PER_ENTRY,
                },
            ),
        ];
        for (wire, expected) in cases {
            assert_eq!(ApplicationReport::try_from(wire), Err(expected));
        }
        // The limit itself is accepted.
        let full = v1::ApplicationHealth {
            addresses: vec![wire_result(); MAX_ADDRESSES_PER_ENTRY],
            ..wire()
        };
        assert_eq!(
            ApplicationReport::try_from(full).map(|r| r.addresses.len()),
            Ok(MAX_ADDRESSES_PER_ENTRY)
        );
        // The resolver's reason is bounded; an empty one is none.
        let long = v1::ApplicationHealth {
            dns_error: "é".repeat(5000),
            ..wire()
        };
        let r = ApplicationReport::try_from(long).unwrap();
        assert_eq!(r.dns_error.unwrap().chars().count(), MAX_DETAIL_CHARS);
        assert_eq!(ApplicationReport::try_from(wire()).unwrap().dns_error, None);
    }

    // ---- malformed segments ----

    fn segment_error(wire: v1::Segment) -> WireError {
        match Segment::try_from(wire) {
            Ok(s) => panic!("accepted {s:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn out_of_range_segment_ports_are_invalid_ports() {
        let range = |start, end| vec![v1::PortRange { start, end }];
        let cases = [
            (range(0, 0), "segment.tcp_ports", true, 0),
            (range(70000, 70000), "segment.tcp_ports", true, 70000),
            (range(0, 80), "segment.udp_ports", false, 0),
            (range(80, 70000), "segment.udp_ports", false, 70000),
            (range(1, u32::MAX), "segment.tcp_ports", true, u32::MAX),
        ];
        for (ranges, field, tcp, value) in cases {
            let mut wire = wire_segment();
            if tcp {
                wire.tcp_ports = ranges;
            } else {
                wire.udp_ports = ranges;
            }
            assert_eq!(
                segment_error(wire),
                WireError::InvalidPort {
                    field,
                    value: u64::from(value)
                }
            );
        }
    }

    #[test]
    fn an_unspecified_mode_is_rejected() {
        for value in [0, 17] {
            let wire = v1::Segment {
                health_reporting: value,
                ..wire_segment()
            };
            assert_eq!(
                segment_error(wire),
                WireError::InvalidEnum {
                    field: "segment.health_reporting",
                    value
                }
            );
        }
    }

    #[test]
    fn segments_that_break_validation_are_invalid_segments() {
        let fields = |e: WireError| match e {
            WireError::InvalidSegment { errors, .. } => {
                errors.iter().map(|e| e.field).collect::<Vec<_>>()
            }
            other => panic!("expected InvalidSegment, got {other:?}"),
        };
        let mut inverted = wire_segment();
        inverted.tcp_ports = vec![v1::PortRange {
            start: 8100,
            end: 8000,
        }];
        assert_eq!(fields(segment_error(inverted)), vec!["tcp_ports"]);

        let mut empty = wire_segment();
        empty.applications.clear();
        empty.tcp_ports.clear();
        empty.udp_ports.clear();
        assert_eq!(
            fields(segment_error(empty)),
            vec!["applications", "tcp_ports"]
        );

        let mut bad_name = wire_segment();
        bad_name.name = "no spaces please".into();
        assert_eq!(fields(segment_error(bad_name)), vec!["name"]);

        let mut no_interval = wire_segment();
        no_interval.report_interval_s = 0;
        no_interval.report_interval_ms = 0;
        assert_eq!(
            fields(segment_error(no_interval)),
            vec!["report_interval_s"]
        );

        let mut bad_app = wire_segment();
        bad_app.applications = vec!["a.*.com".into()];
        assert_eq!(fields(segment_error(bad_app)), vec!["applications"]);

        let mut too_many = wire_segment();
        too_many.tcp_ports = vec![v1::PortRange { start: 1, end: 11 }];
        let e = segment_error(too_many);
        assert_eq!(
            e.to_string(),
            r#"invalid segment "jira": segment "jira": health_reporting = "continuous" is not allowed with 12 ports (max 10)"#
        );
    }

    #[test]
    fn wire_errors_become_invalid_argument() {
        let status = tonic::Status::from(WireError::MissingField("app"));
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "missing field `app`");
    }

    // ---- arbitrary wire input never panics ----

    fn any_text() -> impl Strategy<Value = String> {
        prop_oneof![
            ".{0,40}",
            "[0-9.:/a-f]{0,20}",
            Just("10.1.1.1".to_owned()),
            Just("fd00::1".to_owned()),
            Just("jira.lanukcorp.com".to_owned()),
            Just("*.safemarch.com".to_owned()),
            Just("10.0.0.0/8".to_owned()),
        ]
    }

    fn any_enum() -> impl Strategy<Value = i32> {
        prop_oneof![0i32..8, any::<i32>()]
    }

    fn any_port() -> impl Strategy<Value = u32> {
        prop_oneof![0u32..70_000, any::<u32>()]
    }

    fn any_ranges() -> impl Strategy<Value = Vec<v1::PortRange>> {
        prop::collection::vec(
            (any_port(), any_port()).prop_map(|(start, end)| v1::PortRange { start, end }),
            0..5,
        )
    }

    /// Valid segments of every shape: entries of every kind, ranges, every
    /// mode and report intervals in seconds or milliseconds.
    fn valid_segment() -> impl Strategy<Value = Segment> {
        let entries = prop::collection::btree_set(
            prop_oneof![
                "[a-z][a-z0-9-]{0,8}[a-z0-9]\\.(com|net|example\\.org)",
                "\\*\\.[a-z][a-z0-9]{0,8}\\.(com|io)",
                any::<std::net::Ipv4Addr>().prop_map(|ip| ip.to_string()),
                any::<std::net::Ipv6Addr>().prop_map(|ip| ip.to_string()),
                (any::<u32>(), 0u32..=32).prop_map(|(ip, len)| {
                    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                    format!("{}/{len}", std::net::Ipv4Addr::from(ip & mask))
                }),
            ],
            1..5,
        );
        let ports = prop::collection::btree_set(1u16..=65535, 0..4).prop_map(|ps| {
            ps.into_iter()
                .map(|p| PortSpec::Number(i64::from(p)))
                .collect::<Vec<_>>()
        });
        let interval = prop_oneof![
            (1u64..=86_400).prop_map(|s| (Some(s), None)),
            (1u64..=86_400_000).prop_map(|ms| (None, Some(ms))),
        ];
        (
            entries,
            ports.clone(),
            ports,
            prop_oneof![Just("on_access"), Just("none")],
            interval,
            any::<bool>(),
            any::<bool>(),
        )
            .prop_filter_map(
                "a segment needs a port",
                |(apps, tcp, udp, mode, (s, ms), multimatch, chv)| {
                    validate_segment(&SegmentSpec {
                        name: "seg".into(),
                        applications: apps.into_iter().collect(),
                        tcp_ports: tcp,
                        udp_ports: udp,
                        health_reporting: Some(mode.into()),
                        report_interval_s: s,
                        report_interval_ms: ms,
                        multimatch,
                        client_hostname_validation: chv,
                        connector_groups: vec!["dc-east".into()],
                        rise: Some(u32::from(multimatch) + 1),
                        fall: Some(u32::from(chv) * 5 + 1),
                        strategy: multimatch.then(|| "nearest".into()),
                        check: chv.then(|| "http".into()),
                        check_expect: (chv && multimatch).then(|| "200,500-599".into()),
                        ..SegmentSpec::default()
                    })
                    .ok()
                },
            )
    }

    #[test]
    fn damping_strategy_and_dns_resolution_cross_the_wire() {
        let mut spec = segment_spec();
        spec.rise = Some(2);
        spec.fall = Some(3);
        spec.strategy = Some("nearest".into());
        let segment = validate_segment(&spec).unwrap();
        let wire = v1::Segment::from(&segment);
        assert_eq!((wire.rise, wire.fall), (2, 3));
        assert_eq!(wire.strategy, "nearest");
        assert_eq!(Segment::try_from(wire.clone()), Ok(segment));
        // An older CA (0, "") means 1 / 1 and the CA's strategy; a strategy
        // this build does not know is only informational here.
        let old = Segment::try_from(v1::Segment {
            rise: 0,
            fall: 0,
            strategy: "fastest-ever".into(),
            ..wire
        })
        .unwrap();
        assert_eq!(old.damping, policy::Damping::default());
        assert_eq!(old.strategy, None);
        for d in [
            DnsResolution::Ipv4,
            DnsResolution::Ipv6,
            DnsResolution::Dual,
        ] {
            assert_eq!(
                dns_resolution_from_wire(v1::DnsResolution::from(d) as i32),
                d
            );
        }
        assert_eq!(dns_resolution_from_wire(0), DnsResolution::Dual);
        assert_eq!(dns_resolution_from_wire(99), DnsResolution::Dual);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        #[test]
        fn valid_segments_round_trip(segment in valid_segment()) {
            let wire = v1::Segment::from(&segment);
            prop_assert_eq!(Segment::try_from(wire), Ok(segment));
        }

        #[test]
        fn arbitrary_address_results_never_panic(
            address in any_text(),
            status in any_enum(),
            method in any_enum(),
            rtt_us in any::<u64>(),
            failure in any_enum(),
            detail in ".{0,600}",
        ) {
            let wire = v1::AddressResult { address, status, method, rtt_us, failure, detail, reason: None, certificate_not_after_unix_s: None };
            if let Ok(r) = AddressResult::try_from(wire) {
                // What was accepted survives another trip unchanged.
                prop_assert_eq!(AddressResult::try_from(v1::AddressResult::from(&r)), Ok(r));
            }
        }

        #[test]
        fn arbitrary_app_keys_never_panic(
            segment in any_text(),
            host in any_text(),
            protocol in any_enum(),
            port in any_port(),
        ) {
            let wire = v1::ApplicationKey { segment, host, protocol, port };
            if let Ok(k) = AppKey::try_from(wire) {
                prop_assert!(k.port >= 1);
                prop_assert_eq!(AppKey::try_from(v1::ApplicationKey::from(&k)), Ok(k));
            }
        }

        #[test]
        fn arbitrary_segments_never_panic(
            name in prop_oneof![Just("jira".to_owned()), any_text()],
            applications in prop::collection::vec(any_text(), 0..4),
            tcp_ports in any_ranges(),
            udp_ports in any_ranges(),
            health_reporting in any_enum(),
            report_interval_s in any::<u32>(),
            report_interval_ms in prop_oneof![Just(0u32), any::<u32>()],
            multimatch in any::<bool>(),
            client_hostname_validation in any::<bool>(),
            connector_groups in prop::collection::vec(any_text(), 0..3),
            rise in prop_oneof![Just(0u32), any::<u32>()],
            fall in prop_oneof![Just(0u32), 1u32..=100],
            strategy in prop_oneof![Just(String::new()), Just("nearest".to_owned()), any_text()],
            check in prop_oneof![Just(String::new()), Just("https".to_owned()), Just("tcp".to_owned()), any_text()],
            check_path in prop_oneof![Just(String::new()), Just("/h".to_owned()), any_text()],
            check_expect in prop_oneof![Just(String::new()), Just("200-204".to_owned()), any_text()],
            check_ca_pem in prop_oneof![Just(String::new()), any_text()],
        ) {
            let wire = v1::Segment {
                check,
                check_path,
                check_expect,
                check_ca_pem,
                rise,
                fall,
                strategy,
                name,
                applications,
                tcp_ports,
                udp_ports,
                health_reporting,
                report_interval_s,
                multimatch,
                client_hostname_validation,
                connector_groups,
                report_interval_ms,
            };
            if let Ok(s) = Segment::try_from(wire) {
                prop_assert_eq!(Segment::try_from(v1::Segment::from(&s)), Ok(s));
            }
        }
    }
}
