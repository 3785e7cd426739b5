//! Conversions between wire messages (`crate::v1`) and `policy` types.
//! Wire → policy is `TryFrom` with a typed `WireError`; policy → wire is
//! `From` and cannot fail.

use std::net::IpAddr;
use std::time::Duration;

use policy::validate::{PortSpec, SegmentSpec};
use policy::{
    AddressResult, AppKey, Failure, FailureKind, HealthReporting, Method, Protocol, RefusalReason,
    Segment, Status, ValidationError,
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

/// Longest host name or segment name accepted on the wire.
const MAX_NAME: usize = 253;

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
    } else {
        Ok(s)
    }
}

fn port(field: &'static str, value: u32) -> Result<u16, WireError> {
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
        _ => Err(WireError::InvalidEnum { field, value }),
    }
}

// ---- messages ----

impl From<&AppKey> for v1::ApplicationKey {
    fn from(k: &AppKey) -> Self {
        v1::ApplicationKey {
            segment: k.segment.clone(),
            host: k.host.clone(),
            protocol: v1::Protocol::from(k.protocol) as i32,
            port: u32::from(k.port),
        }
    }
}

impl TryFrom<v1::ApplicationKey> for AppKey {
    type Error = WireError;
    fn try_from(k: v1::ApplicationKey) -> Result<Self, WireError> {
        Ok(AppKey {
            segment: text("app.segment", k.segment)?,
            host: text("app.host", k.host)?.to_ascii_lowercase(),
            protocol: protocol_from_wire("app.protocol", k.protocol)?,
            port: port("app.port", k.port)?,
        })
    }
}

impl From<&AddressResult> for v1::AddressResult {
    fn from(r: &AddressResult) -> Self {
        v1::AddressResult {
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
            detail: r.detail.chars().take(512).collect(),
        });
        Ok(AddressResult {
            address,
            reachable,
            method: method_from_wire("address.method", r.method)?,
            rtt: Duration::from_micros(r.rtt_us),
            failure,
        })
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
        };
        policy::validate_segment(&spec).map_err(|errors| WireError::InvalidSegment {
            name: truncated(&s.name),
            errors,
        })
    }
}
