//! Application status: per-address check results and the status of an
//! application (Up / Unhealthy / Down / Unknown) that they add up to.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Status of an application as one connector (or the CA) sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Every address reachable.
    Up,
    /// Some addresses reachable, some not; users can still reach it.
    Unhealthy,
    /// No address reachable, or DNS failed.
    Down,
    /// No current result.
    Unknown,
}

impl Status {
    /// Up and Unhealthy count as reachable for selection.
    pub fn is_reachable(self) -> bool {
        matches!(self, Status::Up | Status::Unhealthy)
    }

    /// The lower-case name used in JSON and on the dashboard.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Up => "up",
            Status::Unhealthy => "unhealthy",
            Status::Down => "down",
            Status::Unknown => "unknown",
        }
    }

    /// Rank for "best of": Up > Unhealthy > Down > Unknown.
    fn rank(self) -> u8 {
        match self {
            Status::Up => 3,
            Status::Unhealthy => 2,
            Status::Down => 1,
            Status::Unknown => 0,
        }
    }

    /// The overall status of an application over its connectors: the best
    /// any connector reports (users are routed to that one), Unknown when
    /// there are none.
    pub fn best(statuses: impl IntoIterator<Item = Status>) -> Status {
        statuses
            .into_iter()
            .max_by_key(|s| s.rank())
            .unwrap_or(Status::Unknown)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "up" => Ok(Status::Up),
            "unhealthy" => Ok(Status::Unhealthy),
            "down" => Ok(Status::Down),
            "unknown" => Ok(Status::Unknown),
            other => Err(format!("unknown status {other:?}")),
        }
    }
}

/// How an address was checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// TCP handshake to a TCP port.
    Tcp,
    /// ICMP echo (UDP port).
    Icmp,
    /// TCP attempt after ICMP failed (UDP port).
    TcpFallback,
}

impl Method {
    /// The name used in JSON (`tcp`, `icmp`, `tcp_fallback`).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Tcp => "tcp",
            Method::Icmp => "icmp",
            Method::TcpFallback => "tcp_fallback",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a check failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// No answer within the timeout.
    Timeout,
    /// Connection refused (TCP reset).
    Refused,
    /// Network or host unreachable.
    Unreachable,
    /// DNS resolution failed.
    Dns,
    /// Any other local error.
    Other,
    /// The connector refused to probe the address: it is outside the
    /// connector's `--allow-networks`. Nothing was sent.
    NotAllowed,
}

impl FailureKind {
    /// The name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Timeout => "timeout",
            FailureKind::Refused => "refused",
            FailureKind::Unreachable => "unreachable",
            FailureKind::Dns => "dns",
            FailureKind::Other => "other",
            FailureKind::NotAllowed => "not_allowed",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure with its detail (OS error text, resolver reason).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Failure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// Human-readable detail.
    pub detail: String,
}

/// The result of checking one address.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AddressResult {
    /// The address checked.
    pub address: IpAddr,
    /// Whether it was reachable.
    pub reachable: bool,
    /// How it was checked (the last method tried).
    pub method: Method,
    /// Round-trip time of the successful probe (zero when it failed).
    pub rtt: Duration,
    /// Why it failed, when it did.
    pub failure: Option<Failure>,
    /// What an application-level check (a segment's `check`) learned: the
    /// reason it failed, the certificate's expiry (`None` for a bare
    /// handshake; boxed, since nearly every result has none).
    pub check: Option<Box<crate::check::CheckDetail>>,
}

/// The status of an application from its per-address results: Down when DNS
/// failed or no address is reachable, Up when every address is, Unhealthy
/// when some are, Unknown when there is no result yet.
pub fn application_status(results: &[AddressResult], dns_failed: bool) -> Status {
    if dns_failed {
        return Status::Down;
    }
    let reachable = results.iter().filter(|r| r.reachable).count();
    match (reachable, results.len()) {
        (_, 0) => Status::Unknown,
        (0, _) => Status::Down,
        (r, n) if r == n => Status::Up,
        _ => Status::Unhealthy,
    }
}

/// How old a result may be before `effective_status` calls it Unknown
/// (it is, once older than this).
pub fn stale_limit(
    report_interval: Duration,
    stale_after_intervals: u32,
    cycle: Duration,
) -> Duration {
    report_interval
        .saturating_mul(stale_after_intervals)
        .saturating_add(cycle)
}

/// The status the CA acts on: a report older than `stale_after_intervals`
/// report intervals plus the connector's cycle time is Unknown. A report
/// exactly at that age is still current. The limit saturates instead of
/// overflowing, so absurd intervals mean "never stale", not a panic.
pub fn effective_status(
    reported: Status,
    age: Duration,
    report_interval: Duration,
    stale_after_intervals: u32,
    cycle: Duration,
) -> Status {
    if age > stale_limit(report_interval, stale_after_intervals, cycle) {
        Status::Unknown
    } else {
        reported
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(address: &str, reachable: bool) -> AddressResult {
        AddressResult {
            check: None,
            address: address.parse().unwrap(),
            reachable,
            method: Method::Tcp,
            rtt: if reachable {
                Duration::from_millis(3)
            } else {
                Duration::ZERO
            },
            failure: (!reachable).then(|| Failure {
                kind: FailureKind::Refused,
                detail: "connection refused".into(),
            }),
        }
    }

    #[test]
    fn every_address_reachable_is_up() {
        let r = [result("10.1.2.1", true), result("10.1.2.2", true)];
        assert_eq!(application_status(&r, false), Status::Up);
        assert_eq!(application_status(&r[..1], false), Status::Up);
    }

    #[test]
    fn some_addresses_reachable_is_unhealthy() {
        let r = [
            result("10.1.2.1", true),
            result("10.1.2.2", false),
            result("10.1.2.3", false),
        ];
        assert_eq!(application_status(&r, false), Status::Unhealthy);
        let r = [result("10.1.2.1", false), result("10.1.2.2", true)];
        assert_eq!(application_status(&r, false), Status::Unhealthy);
    }

    #[test]
    fn no_address_reachable_is_down() {
        let r = [result("10.1.2.1", false), result("10.1.2.2", false)];
        assert_eq!(application_status(&r, false), Status::Down);
    }

    #[test]
    fn no_result_is_unknown() {
        assert_eq!(application_status(&[], false), Status::Unknown);
    }

    #[test]
    fn a_dns_failure_is_down_whatever_the_stale_results_say() {
        assert_eq!(application_status(&[], true), Status::Down);
        let r = [result("10.1.2.1", true)];
        assert_eq!(application_status(&r, true), Status::Down);
    }

    #[test]
    fn up_and_unhealthy_count_as_reachable() {
        assert!(Status::Up.is_reachable());
        assert!(Status::Unhealthy.is_reachable());
        assert!(!Status::Down.is_reachable());
        assert!(!Status::Unknown.is_reachable());
    }

    #[test]
    fn a_report_goes_stale_after_three_intervals_plus_the_cycle() {
        let interval = Duration::from_secs(60);
        let cycle = Duration::from_secs(300);
        let limit = Duration::from_secs(3 * 60 + 300);
        let at = |age| effective_status(Status::Up, age, interval, 3, cycle);
        assert_eq!(at(Duration::ZERO), Status::Up);
        assert_eq!(at(limit - Duration::from_nanos(1)), Status::Up);
        assert_eq!(at(limit), Status::Up, "exactly at the limit is current");
        assert_eq!(at(limit + Duration::from_nanos(1)), Status::Unknown);
        // Without a cycle the limit is the intervals alone.
        let bare = |age| effective_status(Status::Down, age, interval, 3, Duration::ZERO);
        assert_eq!(bare(Duration::from_secs(180)), Status::Down);
        assert_eq!(bare(Duration::from_secs(181)), Status::Unknown);
        // The number of intervals is configurable.
        assert_eq!(
            effective_status(
                Status::Up,
                Duration::from_secs(61),
                interval,
                1,
                Duration::ZERO
            ),
            Status::Unknown
        );
    }

    #[test]
    fn staleness_arithmetic_saturates_instead_of_panicking() {
        let s = effective_status(
            Status::Unhealthy,
            Duration::MAX,
            Duration::MAX,
            u32::MAX,
            Duration::MAX,
        );
        assert_eq!(s, Status::Unhealthy);
    }

    #[test]
    fn best_prefers_up_then_unhealthy_then_down_then_unknown() {
        use Status::*;
        assert_eq!(Status::best([]), Unknown);
        assert_eq!(Status::best([Unknown]), Unknown);
        assert_eq!(Status::best([Unknown, Down]), Down);
        assert_eq!(Status::best([Down, Unhealthy, Unknown]), Unhealthy);
        assert_eq!(Status::best([Unhealthy, Up, Down]), Up);
        assert_eq!(Status::best([Up, Unknown]), Up);
    }

    #[test]
    fn status_names_round_trip() {
        for s in [Status::Up, Status::Unhealthy, Status::Down, Status::Unknown] {
            assert_eq!(s.as_str().parse::<Status>(), Ok(s));
            assert_eq!(s.to_string(), s.as_str());
        }
        assert!("UP".parse::<Status>().is_err());
        assert_eq!(Method::TcpFallback.as_str(), "tcp_fallback");
    }
}
