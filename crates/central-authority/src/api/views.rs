//! Read models of the health table and the connector registry, shared by
//! the JSON API, the gRPC `HealthQuery` service and the dashboard.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use policy::{AddressResult, AppKey, HealthReporting, Method, Protocol, Segment, Status};
use protocol::v1;
use serde::Serialize;

use crate::api::listing::Row;
use crate::ground::clock::unix_ms;
use crate::state::authority::Authority;
use crate::state::health::{Report, Transition, UnknownCause};
use crate::state::policy_state::PolicyState;
use crate::state::registry::{ConnSnap, ConnSnaps};

/// The schema of why a connector's status is unknown.
fn unknown_cause() -> utoipa::openapi::schema::Object {
    use UnknownCause as C;
    let mut values: Vec<String> = [
        C::Disconnected,
        C::WindowExpired,
        C::Stale,
        C::NotInFullState,
        C::Reported,
        C::Unsolicited,
    ]
    .iter()
    .map(|c| c.as_str().to_owned())
    .collect();
    values.push("no_report".to_owned());
    crate::ground::schema::string_enum(
        values,
        "why the status is unknown (null when it is not)",
        true,
    )
}

/// One connector's view of one application.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ConnectorHealthView {
    /// Connector name.
    pub connector: String,
    /// Its group.
    pub group: String,
    /// Effective status.
    #[schema(schema_with = crate::ground::schema::status)]
    pub status: Status,
    /// Why it is Unknown, when it is (`disconnected`, `stale`,
    /// `window_expired`, `not_in_full_state`, `reported`, `unsolicited`,
    /// `no_report`).
    #[schema(schema_with = unknown_cause)]
    pub unknown_cause: Option<&'static str>,
    /// When the CA received the latest report, Unix milliseconds.
    pub reported_at: Option<u64>,
    /// Age of that report in milliseconds.
    pub report_age_ms: Option<u64>,
    /// Age in milliseconds of the check behind the status: the report's
    /// age plus the age the connector gave it when sending (staleness is
    /// judged on this).
    pub checked_age_ms: Option<u64>,
    /// When the connector finished the check round (its clock), Unix ms.
    pub checked_at: Option<i64>,
    /// Per-address results.
    pub addresses: Vec<AddressView>,
    /// The resolver's reason when DNS failed.
    pub dns_error: Option<String>,
    /// The connector's smoothed RTT to the application in milliseconds
    /// (what the `nearest` strategy compares), once it reported one.
    #[serde(rename = "smoothed_rtt_ms", serialize_with = "millis")]
    #[schema(value_type = Option<f64>)]
    pub smoothed_rtt: Option<Duration>,
}

/// One address's result.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct AddressView {
    /// The address.
    pub address: String,
    /// `up` or `down`.
    #[schema(schema_with = crate::ground::schema::address_status)]
    pub status: Status,
    /// `tcp`, `icmp` or `tcp_fallback`.
    #[schema(schema_with = crate::ground::schema::method)]
    pub method: Method,
    /// Round-trip time in milliseconds (`null` when the check failed).
    #[serde(rename = "rtt_ms", serialize_with = "millis")]
    #[schema(value_type = Option<f64>)]
    pub rtt: Option<Duration>,
    /// Why it failed (`"refused: connection refused"`), `null` when it did not.
    pub error: Option<String>,
    /// The failure kind alone (`timeout`, `refused`, `unreachable`, `dns`, `other`).
    #[schema(schema_with = crate::ground::schema::failure)]
    pub failure: Option<policy::FailureKind>,
    /// Why the segment's application-level check (`check` = `tls`, `http`,
    /// `https`) failed after the TCP handshake (`"http 503"`, `"tls:
    /// certificate expired"`), `null` when it passed or only TCP is checked.
    pub reason: Option<String>,
    /// The end of the validity (notAfter) of the TLS certificate a
    /// `tls`/`https` check found, Unix seconds; `null` without one.
    pub certificate_not_after: Option<i64>,
    /// A warning when that certificate expires within `[health]
    /// certificate_warn_days` (`"certificate expires in 3 days"`) or has
    /// expired; it does not change the status.
    pub certificate_warning: Option<String>,
}

/// The warning for a certificate valid until `not_after` (Unix seconds) at
/// `now_s`, when it expires within `warn`.
pub fn certificate_warning(not_after: i64, now_s: i64, warn: Duration) -> Option<String> {
    let left = not_after.saturating_sub(now_s);
    if left > 0 && left >= i64::try_from(warn.as_secs()).unwrap_or(i64::MAX) {
        return None;
    }
    Some(if left <= 0 {
        "certificate expired".to_owned()
    } else {
        match left / 86_400 {
            0 if left < 7200 => "certificate expires in 1 hour".to_owned(),
            0 => format!("certificate expires in {} hours", left / 3600),
            1 => "certificate expires in 1 day".to_owned(),
            days => format!("certificate expires in {days} days"),
        }
    })
}

impl From<&AddressResult> for AddressView {
    fn from(r: &AddressResult) -> Self {
        AddressView {
            address: r.address.to_string(),
            status: if r.reachable {
                Status::Up
            } else {
                Status::Down
            },
            method: r.method,
            rtt: r.reachable.then_some(r.rtt),
            error: r.failure.as_ref().map(|f| {
                if f.detail.is_empty() {
                    f.kind.to_string()
                } else {
                    format!("{}: {}", f.kind, f.detail)
                }
            }),
            failure: r.failure.as_ref().map(|f| f.kind),
            reason: r.check.as_ref().and_then(|c| c.reason.clone()),
            certificate_not_after: r.check.as_ref().and_then(|c| c.not_after),
            certificate_warning: None,
        }
    }
}

impl AddressView {
    /// The view of `r` with its certificate judged at `now_s` against the
    /// warning window `warn`.
    pub fn at(r: &AddressResult, now_s: i64, warn: Duration) -> Self {
        let mut view = AddressView::from(r);
        view.certificate_warning = view
            .certificate_not_after
            .and_then(|t| certificate_warning(t, now_s, warn));
        view
    }
}

/// A round-trip time as the JSON API shows it: (fractional) milliseconds.
/// Inside the CA it stays a `Duration`.
fn millis<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&d.map(|d| d.as_secs_f64() * 1000.0), s)
}

/// A status transition for the dashboard.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct TransitionView {
    /// Unix milliseconds.
    pub at: u64,
    /// Connector.
    pub connector: String,
    /// Before.
    #[schema(schema_with = crate::ground::schema::status)]
    pub from: Status,
    /// After.
    #[schema(schema_with = crate::ground::schema::status)]
    pub to: Status,
    /// Why.
    #[schema(schema_with = crate::ground::schema::transition_cause)]
    pub cause: &'static str,
}

/// One application with its status per connector.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ApplicationView {
    /// Segment.
    pub segment: String,
    /// Host (FQDN or IP).
    pub host: String,
    /// Protocol.
    #[schema(schema_with = crate::ground::schema::protocol)]
    pub protocol: Protocol,
    /// Port.
    pub port: u16,
    /// Health reporting mode of the segment.
    #[schema(schema_with = crate::ground::schema::health_reporting)]
    pub health_reporting: HealthReporting,
    /// Overall status: the best over its connectors.
    #[schema(schema_with = crate::ground::schema::status)]
    pub status: Status,
    /// Per connector of the segment's groups.
    pub connectors: Vec<ConnectorHealthView>,
    /// Latest status transitions, oldest first.
    pub transitions: Vec<TransitionView>,
    /// Why the application has no checked status: `checked_on_access` (an
    /// on-access application nobody accessed lately, or a wildcard/subnet
    /// entry whose hosts are known only once accessed) or `not_checked`
    /// (mode `none`: assumed reachable). Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'static str>,
    /// For the row of a wildcard or subnet entry (`port` is 0 there): its
    /// ports as configured, e.g. `tcp 80, 443; udp 53`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<String>,
    /// The segment's flap damping when it is not the default 1/1: each
    /// connector's status (and so every transition listed) changes only
    /// after this many consecutive results.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub damping: Option<DampingView>,
    /// When no connector of the segment's groups is known to this process
    /// (none attached since it started): how many enrolled, enabled
    /// connectors of those groups are not connected. Absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enrolled_unconnected: Option<u32>,
}

/// A segment's flap damping (`rise`/`fall`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DampingView {
    /// Consecutive better results before a status improves (e.g. to Up).
    pub rise: u32,
    /// Consecutive worse results before a status degrades (e.g. to Down).
    pub fall: u32,
}

impl DampingView {
    /// `segment`'s damping, unless it is the default (every result shows).
    fn of(segment: &Segment) -> Option<DampingView> {
        let d = segment.damping;
        (d != policy::Damping::default()).then_some(DampingView {
            rise: d.rise(),
            fall: d.fall(),
        })
    }
}

/// A connector as the CA sees it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ConnectorView {
    /// Name.
    pub name: String,
    /// Group.
    pub group: String,
    /// Whether it has a live session.
    pub connected: bool,
    /// Session id of the live session (admin only: omitted otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Software version from its Hello, sanitized (admin only: omitted
    /// otherwise).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// The CA's estimate of checks per cycle (continuous targets plus live
    /// on-access applications, or the connector's own count when larger).
    pub checks_per_cycle: u64,
    /// Cycle time at its rate limit, seconds.
    pub cycle_seconds: f64,
    /// Whether `checks_per_cycle` exceeds the budget.
    pub over_budget: bool,
    /// The configured budget.
    pub check_budget: u64,
    /// The connector's own latest load report.
    pub load: Option<LoadView>,
    /// How the connector sees the CA replicas it reports to (its latest
    /// heartbeat to this replica); `None` before one arrived.
    pub replicas: Option<ReplicasView>,
    /// Its software, host and resource use, from its latest heartbeat of
    /// its latest session (admin only: omitted otherwise, and before a
    /// heartbeat with a status arrived, as from connectors that send none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusView>,
    /// When the live session started, Unix ms.
    pub connected_since: Option<u64>,
    /// When the CA last heard from it, Unix ms.
    pub last_seen: Option<u64>,
    /// Whether it is enrolled (holds a certificate the CA issued).
    pub enrolled: bool,
    /// When its name was last enrolled with a provisioning key, Unix ms
    /// (renewals do not count).
    pub enrolled_at: Option<i64>,
    /// Whether an administrator disabled it.
    pub disabled: bool,
    /// Its drain, when it is drained (selected for no new access while it
    /// keeps its session and reports): an administrator's, or its own
    /// while it shuts down; null when it is not.
    pub drained: Option<crate::access::drain::DrainView>,
    /// Serial of its current certificate (admin only: omitted otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate_serial: Option<String>,
    /// End of that certificate's validity, Unix ms.
    pub certificate_not_after: Option<i64>,
    /// Its certificates, newest first (at most `CERTIFICATES_SHOWN`): each
    /// renewal adds one.
    pub certificates: Vec<CertificateView>,
}

/// One connector's smoothed RTT to one application over time: the latest
/// of each interval, from the oldest kept interval with a value to the
/// newest.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct RttSeriesView {
    /// Connector name.
    pub connector: String,
    /// Start of the first interval, Unix milliseconds.
    pub start: i64,
    /// Length of an interval in milliseconds: value `i` is of the
    /// interval starting at `start + i * interval_ms`.
    pub interval_ms: i64,
    /// The smoothed RTT in milliseconds at the end of each interval
    /// (`null`: no reachable result in it), oldest first.
    pub rtt_ms: Vec<Option<f64>>,
}

/// One address an application has had.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct AddressHistoryView {
    /// The address.
    pub address: String,
    /// Its latest result, `up` or `down` (also once it left: its last).
    #[schema(schema_with = crate::ground::schema::address_status)]
    pub status: Status,
    /// When a connector's answer first had it (again, after it left and
    /// came back), Unix ms.
    pub appeared: i64,
    /// When it left the last connector's answer that had it, Unix ms;
    /// `null` while an answer has it.
    pub left: Option<i64>,
    /// When its latest result was received, Unix ms.
    pub last_seen: i64,
    /// The connector of that result.
    pub connector: String,
}

/// One connector's check load over time.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct LoadSeriesView {
    /// Connector name.
    pub connector: String,
    /// Start of the first interval, Unix milliseconds.
    pub start: i64,
    /// Length of an interval in milliseconds: value `i` is of the
    /// interval starting at `start + i * interval_ms`.
    pub interval_ms: i64,
    /// The highest estimate of checks per cycle in each interval
    /// (`null`: none made, e.g. while the CA was down), oldest first.
    pub checks_per_cycle: Vec<Option<u32>>,
}

/// What `summary` finds in the health table for one application.
struct Summary {
    status: Status,
    changed: u64,
    group_hit: bool,
    connector_hit: bool,
}

fn row(
    key: &AppKey,
    segment: &Segment,
    status: Status,
    changed: u64,
    noted: bool,
    item: RowItem,
) -> Row<RowItem> {
    let host = key.host.to_string();
    Row {
        segment: key.segment.clone(),
        ip: host.parse().ok(),
        host,
        protocol: key.protocol,
        port: key.port,
        mode: segment.health_reporting,
        status,
        changed,
        noted,
        item,
    }
}

/// How many certificates of a connector the views list.
pub const CERTIFICATES_SHOWN: usize = 10;

/// One certificate of a connector, as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct CertificateView {
    /// Serial, lower-case hex.
    pub serial: String,
    /// Issued at, Unix ms.
    pub issued_at: i64,
    /// End of validity, Unix ms.
    pub not_after: i64,
    /// Revoked at, Unix ms.
    pub revoked_at: Option<i64>,
    /// Superseded by a renewal: revoked at this time, Unix ms.
    pub grace_until: Option<i64>,
    /// `current` (the newest valid one), `grace` (superseded, still
    /// accepted until `grace_until`), `revoked` or `expired`.
    #[schema(schema_with = crate::ground::schema::certificate_state)]
    pub state: &'static str,
}

impl CertificateView {
    fn new(h: crate::store::CertHistory, current: Option<&str>, now_ms: i64) -> Self {
        let state = if h.revoked_ms.is_some() {
            "revoked"
        } else if h.not_after_ms <= now_ms {
            "expired"
        } else if current == Some(h.serial.as_str()) {
            "current"
        } else if h.grace_until_ms.is_some() {
            "grace"
        } else {
            // Unrevoked, unexpired, not the newest and never superseded:
            // cannot happen (enrollment revokes, renewal starts a grace).
            "current"
        };
        CertificateView {
            serial: h.serial,
            issued_at: h.issued_ms,
            not_after: h.not_after_ms,
            revoked_at: h.revoked_ms,
            grace_until: h.grace_until_ms,
            state,
        }
    }
}

/// A connector's self-reported load.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct LoadView {
    /// Distinct targets scheduled.
    pub targets: u32,
    /// Checks per full cycle.
    pub checks_per_cycle: u32,
    /// Cycle time, seconds.
    pub cycle_seconds: f64,
    /// Checks waiting for the rate limiter.
    pub queue_depth: u32,
    /// Checks started per second recently.
    pub checks_per_second: f64,
    /// Checks in flight.
    pub in_flight: u32,
    /// The connector's rate limit.
    pub rate_limit: u32,
}

/// A connector's own status (`v1::ConnectorStatus`, sanitized). Figures
/// the connector could not measure are 0 or empty; times it could not
/// tell are null.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct StatusView {
    /// When the CA received it (the heartbeat), Unix ms.
    pub reported_at: u64,
    /// Software version as the connector reports it.
    pub version: String,
    /// Operating system (`linux`, ...).
    pub os: String,
    /// CPU architecture (`x86_64`, `aarch64`, ...).
    pub arch: String,
    /// When its process started, Unix ms (connector's clock).
    pub process_started_at: Option<i64>,
    /// When its host booted, Unix ms (connector's clock).
    pub host_booted_at: Option<i64>,
    /// CPU its process used over its last heartbeat interval, percent of
    /// one core.
    pub process_cpu_percent: f64,
    /// Busy share of the host's CPUs over that interval, percent of all
    /// cores.
    pub host_cpu_percent: f64,
    /// Its process's resident memory, bytes.
    pub process_memory_bytes: u64,
    /// The host's memory, bytes.
    pub host_memory_total_bytes: u64,
    /// The host's memory available without swapping, bytes.
    pub host_memory_available_bytes: u64,
    /// Applications it serves (entries of its assignment's segments).
    pub applications: u32,
    /// Interface of its host's IPv4 default route.
    pub default_route_interface: String,
    /// DNS servers it resolves with (`IP` or `IP:PORT`), at most 8.
    pub dns_resolvers: Vec<String>,
    /// Bytes it sent to this CA replica over its session's connection.
    pub bytes_sent: u64,
    /// Bytes it received from this CA replica over that connection.
    pub bytes_received: u64,
}

impl StatusView {
    /// The view of `s` (already sanitized by the registry), received at
    /// `at`.
    pub fn of(s: &v1::ConnectorStatus, at: std::time::SystemTime) -> Self {
        let known = |t: i64| (t > 0).then_some(t);
        StatusView {
            reported_at: unix_ms(at),
            version: s.version.clone(),
            os: s.os.clone(),
            arch: s.arch.clone(),
            process_started_at: known(s.process_start_unix_ms),
            host_booted_at: known(s.host_boot_unix_ms),
            process_cpu_percent: s.process_cpu_percent,
            host_cpu_percent: s.host_cpu_percent,
            process_memory_bytes: s.process_memory_bytes,
            host_memory_total_bytes: s.host_memory_total_bytes,
            host_memory_available_bytes: s.host_memory_available_bytes,
            applications: s.applications,
            default_route_interface: s.default_route_interface.clone(),
            dns_resolvers: s.dns_resolvers.clone(),
            bytes_sent: s.bytes_sent,
            bytes_received: s.bytes_received,
        }
    }
}

impl StatusView {
    /// The wire form (`v1::ConnectorStatus`): a time it could not tell
    /// is 0 again.
    pub fn to_wire(&self) -> v1::ConnectorStatus {
        v1::ConnectorStatus {
            version: self.version.clone(),
            os: self.os.clone(),
            arch: self.arch.clone(),
            process_start_unix_ms: self.process_started_at.unwrap_or(0),
            host_boot_unix_ms: self.host_booted_at.unwrap_or(0),
            process_cpu_percent: self.process_cpu_percent,
            host_cpu_percent: self.host_cpu_percent,
            process_memory_bytes: self.process_memory_bytes,
            host_memory_total_bytes: self.host_memory_total_bytes,
            host_memory_available_bytes: self.host_memory_available_bytes,
            applications: self.applications,
            default_route_interface: self.default_route_interface.clone(),
            dns_resolvers: self.dns_resolvers.clone(),
            bytes_sent: self.bytes_sent,
            bytes_received: self.bytes_received,
        }
    }
}

/// How a connector attached to several CA replicas sees them (one session
/// per replica; see the connector's `follow` module for the rule).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ReplicasView {
    /// Its live CA sessions (one per replica).
    pub sessions: u32,
    /// Distinct assignments among them.
    pub assignments: u32,
    /// True when the replicas hand it different assignments (policy
    /// files differ, e.g. mid-rollout).
    pub disagreement: bool,
    /// Whether it follows this replica's assignment (the session connected
    /// longest is followed).
    pub follows_this_replica: bool,
    /// Whether this replica's assignment equals the one it follows.
    pub agrees_with_followed: bool,
    /// Hash of this replica's assignment as the connector computed it.
    pub assignment_hash: String,
    /// Hash of the assignment it follows.
    pub followed_assignment_hash: String,
}

impl From<&v1::ReplicaAttachment> for ReplicasView {
    fn from(r: &v1::ReplicaAttachment) -> Self {
        // Hashes are 16 hex digits; anything else from a peer is cut short.
        let hash = |h: &str| {
            h.chars()
                .take(64)
                .filter(char::is_ascii_alphanumeric)
                .collect()
        };
        ReplicasView {
            sessions: r.sessions,
            assignments: r.assignments,
            disagreement: r.assignments > 1,
            follows_this_replica: r.follows_this_session,
            agrees_with_followed: r.agrees_with_followed,
            assignment_hash: hash(&r.assignment_hash),
            followed_assignment_hash: hash(&r.followed_assignment_hash),
        }
    }
}

impl From<&v1::CheckLoad> for LoadView {
    fn from(l: &v1::CheckLoad) -> Self {
        LoadView {
            targets: l.targets,
            checks_per_cycle: l.checks_per_cycle,
            cycle_seconds: l.cycle_seconds,
            queue_depth: l.queue_depth,
            checks_per_second: l.checks_per_second,
            in_flight: l.in_flight,
            rate_limit: l.rate_limit,
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What builds a listing row's view: an application of the policy or the
/// health table, or a wildcard/subnet entry's row (built already: it has
/// no state of its own).
#[derive(Clone, Debug)]
pub enum RowItem {
    /// An application.
    App(AppKey),
    /// A wildcard or subnet entry.
    Entry(Box<ApplicationView>),
}

/// The listing's filters that need the registry (judged while the rows are
/// made); `None` keeps everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct RowFilter<'a> {
    /// Only this segment.
    pub segment: Option<&'a str>,
    /// Only applications one of whose connectors is of this group.
    pub group: Option<&'a str>,
    /// Only applications this connector serves.
    pub connector: Option<&'a str>,
}

/// One read of the policy and the registry, shared by the rows and views
/// of one request.
struct Ctx {
    state: Arc<PolicyState>,
    conns: ConnSnaps,
    now: Instant,
}

fn ctx(authority: &Authority) -> Ctx {
    Ctx {
        state: authority.snapshot(),
        conns: authority.registry().snapshot(),
        now: Instant::now(),
    }
}

/// Every visible application (segments with client hostname validation
/// are hidden), optionally of one segment: every FQDN/IP × port of
/// continuous segments, plus every application any connector reported
/// (on-access). Sorted by segment, host, protocol, port.
pub fn applications(authority: &Authority, segment_filter: Option<&str>) -> Vec<ApplicationView> {
    let filter = RowFilter {
        segment: segment_filter,
        ..RowFilter::default()
    };
    let ctx = ctx(authority);
    let rows = rows_in(authority, &ctx, &filter);
    views_in(authority, &ctx, rows.into_iter().map(|r| r.item))
}

/// The views of `items`, in their order (an application that vanished
/// since its row was made is left out).
pub fn views(
    authority: &Authority,
    items: impl IntoIterator<Item = RowItem>,
) -> Vec<ApplicationView> {
    views_in(authority, &ctx(authority), items)
}

/// The listing's rows of every visible application that passes
/// `filter`, in the order of `applications`: status and latest change
/// per application, without building its per-connector views (what
/// makes a filtered page cheap at 10,000 applications).
pub fn rows(authority: &Authority, filter: &RowFilter<'_>) -> Vec<Row<RowItem>> {
    rows_in(authority, &ctx(authority), filter)
}

fn rows_in(authority: &Authority, ctx: &Ctx, filter: &RowFilter<'_>) -> Vec<Row<RowItem>> {
    let policy = ctx.state.policy();
    let segments: HashMap<&str, &Segment> = policy
        .segments
        .iter()
        .filter(|s| filter.segment.is_none_or(|f| f == s.name))
        .filter(|s| !s.client_hostname_validation)
        .map(|s| (s.name.as_str(), s))
        .collect();
    let keys = listed_keys(authority, &policy.segments, &segments);
    let served = served_by_registry(ctx, &segments, filter);

    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let Some(segment) = segments.get(key.segment.as_str()) else {
            continue;
        };
        let (group_ok, conn_ok) = served
            .get(key.segment.as_str())
            .copied()
            .unwrap_or((false, false));
        let unchecked = segment.health_reporting == HealthReporting::None;
        if unchecked && (filter.group.is_some() || filter.connector.is_some()) {
            // A `none` application lists no connector, so none matches.
            continue;
        }
        let Some(summary) = summary(authority, ctx, segment, &key, filter) else {
            // No report: only the registry's connectors count.
            if !(group_ok && conn_ok) {
                continue;
            }
            // The view's note: `none` is never checked, and an
            // on-access application nobody accessed has no report.
            let noted = segment.health_reporting != HealthReporting::Continuous;
            out.push(row(
                &key,
                segment,
                Status::Unknown,
                0,
                noted,
                RowItem::App(key.clone()),
            ));
            continue;
        };
        if !(group_ok || summary.group_hit) || !(conn_ok || summary.connector_hit) {
            continue;
        }
        let status = if unchecked {
            Status::Unknown
        } else {
            summary.status
        };
        out.push(row(
            &key,
            segment,
            status,
            summary.changed,
            unchecked,
            RowItem::App(key.clone()),
        ));
    }
    if filter.group.is_none() && filter.connector.is_none() {
        out.extend(entry_rows(&policy.segments, &segments));
    }
    out
}

/// The applications listed of the `shown` segments: every exact host ×
/// port of every mode (on-access ones nobody accessed and `none` ones
/// too, with a note), and whatever the health table holds.
fn listed_keys(
    authority: &Authority,
    all: &[Segment],
    shown: &HashMap<&str, &Segment>,
) -> BTreeSet<AppKey> {
    let mut keys: BTreeSet<AppKey> = BTreeSet::new();
    for s in all {
        if shown.contains_key(s.name.as_str()) && !listed_per_entry(s) {
            keys.extend(s.applications());
        }
    }
    keys.extend(
        authority
            .health()
            .keys()
            .into_iter()
            .filter(|k| shown.contains_key(k.segment.as_str())),
    );
    keys
}

/// The overall status and latest change of `key` from its reports
/// (`None` when no connector reported it), and whether a reporting
/// connector passes the group / connector filter.
fn summary(
    authority: &Authority,
    ctx: &Ctx,
    segment: &Segment,
    key: &AppKey,
    filter: &RowFilter<'_>,
) -> Option<Summary> {
    let on_access = segment.health_reporting == HealthReporting::OnAccess;
    // On-access windows are another lock: their reports are copied out
    // and judged after the shard's lock is released.
    let mut pending: Vec<(String, Status, Duration)> = Vec::new();
    let mut summary = authority.health().inspect(key, |reports, last| {
        let mut best = Vec::with_capacity(reports.len());
        let mut group_hit = false;
        let mut connector_hit = false;
        for (name, r) in reports {
            let conn = ctx.conns.get(name);
            // The group shown for a reporter: the registry's when it
            // serves the segment, else the one it reported with.
            let group = conn
                .filter(|c| segment.served_by(&c.group))
                .map_or(&*r.group, |c| c.group.as_str());
            group_hit |= filter.group == Some(group);
            connector_hit |= filter.connector == Some(name);
            let age = ctx.now.saturating_duration_since(r.checked_at);
            if on_access {
                pending.push((name.to_owned(), r.status, age));
            } else {
                best.push(
                    Authority::effective(
                        &ctx.state,
                        segment,
                        r.status,
                        age,
                        conn.map(ConnSnap::link),
                        true,
                    )
                    .0,
                );
            }
        }
        Summary {
            status: Status::best(best),
            changed: last.map_or(0, |t| unix_ms(t.at)),
            group_hit,
            connector_hit,
        }
    })?;
    if on_access {
        summary.status = Status::best(pending.into_iter().map(|(name, stored, age)| {
            let live = authority.on_access().is_live(key, &name, ctx.now);
            let conn = ctx.conns.get(&name).map(ConnSnap::link);
            Authority::effective(&ctx.state, segment, stored, age, conn, live).0
        }));
    }
    Some(summary)
}

fn views_in(
    authority: &Authority,
    ctx: &Ctx,
    items: impl IntoIterator<Item = RowItem>,
) -> Vec<ApplicationView> {
    let policy = ctx.state.policy();
    items
        .into_iter()
        .filter_map(|item| match item {
            RowItem::Entry(v) => Some(*v),
            RowItem::App(key) => {
                let segment = policy.segment(&key.segment)?;
                Some(view(authority, ctx, segment, key))
            }
        })
        .collect()
}

/// The full view of one application.
fn view(authority: &Authority, ctx: &Ctx, segment: &Segment, key: AppKey) -> ApplicationView {
    let conns = &ctx.conns;
    let (reports, transitions) = authority.health().app(&key).unwrap_or_default();
    // Every known connector of the segment's groups, plus any that
    // reported (it may have changed group since).
    let mut names: BTreeMap<&str, &str> = conns
        .iter()
        .filter(|(_, c)| segment.served_by(&c.group))
        .map(|(n, c)| (n.as_str(), c.group.as_str()))
        .collect();
    for (n, r) in &reports {
        names.entry(n).or_insert(&*r.group);
    }
    let mut connectors = Vec::new();
    for (name, group) in names {
        let view = match reports.get(name) {
            Some(r) => reported_view(authority, ctx, segment, &key, (name, group), r),
            None => unreported_view(name, group, conns.get(name).is_some_and(|c| c.connected)),
        };
        connectors.push(view);
    }
    let note = match segment.health_reporting {
        HealthReporting::Continuous => None,
        HealthReporting::OnAccess => reports.is_empty().then_some("checked_on_access"),
        HealthReporting::None => {
            // Nothing is checked: per-connector Unknowns would only
            // look like a fault.
            connectors.clear();
            Some("not_checked")
        }
    };
    ApplicationView {
        note,
        ports: None,
        damping: DampingView::of(segment),
        enrolled_unconnected: None,
        status: Status::best(connectors.iter().map(|c| c.status)),
        segment: key.segment,
        host: key.host.into_string(),
        protocol: key.protocol,
        port: key.port,
        health_reporting: segment.health_reporting,
        connectors,
        transitions: transitions.iter().map(transition_view).collect(),
    }
}

/// One connector's view of an application it reported on.
fn reported_view(
    authority: &Authority,
    ctx: &Ctx,
    segment: &Segment,
    key: &AppKey,
    (name, group): (&str, &str),
    r: &Report,
) -> ConnectorHealthView {
    let (state, conns, now) = (&ctx.state, &ctx.conns, ctx.now);
    let live = segment.health_reporting != HealthReporting::OnAccess
        || authority.on_access().is_live(key, name, now);
    let age = now.saturating_duration_since(r.checked_at);
    let (status, cause) = Authority::effective(
        state,
        segment,
        r.status,
        age,
        conns.get(name).map(ConnSnap::link),
        live,
    );
    // A result no verified access asked for is listed,
    // with why no decision rests on it.
    let cause = match cause {
        Some(UnknownCause::WindowExpired)
            if authority.on_access().is_unsolicited(key, name, now) =>
        {
            Some(UnknownCause::Unsolicited)
        }
        other => other,
    };
    let cause = cause.or(r.unknown_cause);
    ConnectorHealthView {
        connector: name.to_owned(),
        group: group.to_owned(),
        status,
        unknown_cause: (status == Status::Unknown)
            .then(|| cause.map_or("no_report", |c| c.as_str())),
        reported_at: Some(unix_ms(r.received_wall)),
        report_age_ms: Some(ms(now.saturating_duration_since(r.received_at))),
        checked_age_ms: Some(ms(age)),
        checked_at: (r.checked_at_unix_ms > 0).then_some(r.checked_at_unix_ms),
        addresses: if status == Status::Unknown {
            Vec::new()
        } else {
            let warn = state.settings().certificate_warn;
            let now_s = crate::ground::clock::now_ms() / 1000;
            r.addresses
                .iter()
                .map(|a| AddressView::at(a, now_s, warn))
                .collect()
        },
        dns_error: r.dns_error.clone(),
        smoothed_rtt: r.rtt,
    }
}

/// Sets `enrolled_unconnected` on the `views` that have no connector
/// (and no note): a CA that has just started knows no connector until
/// one attaches, while the store knows every enrolled one. Reads the
/// store once, and only when a view needs it.
pub fn note_unconnected(authority: &Authority, views: &mut [ApplicationView]) {
    if !views.iter().any(ApplicationView::lacks_connectors) {
        return;
    }
    let records = match authority.store().connectors() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot list enrolled connectors");
            return;
        }
    };
    let state = authority.snapshot();
    let policy = state.policy();
    let conns = authority.registry().snapshot();
    for v in views.iter_mut().filter(|v| v.lacks_connectors()) {
        let Some(segment) = policy.segment(&v.segment) else {
            continue;
        };
        let n = records
            .iter()
            .filter(|r| !r.disabled && segment.served_by(&r.group))
            .filter(|r| !conns.get(&r.name).is_some_and(|c| c.connected))
            .count();
        v.enrolled_unconnected = (n > 0).then(|| u32::try_from(n).unwrap_or(u32::MAX));
    }
}

/// Each connector's smoothed RTT to `key` over time, by connector
/// name; empty when none reported a reachable result.
pub fn rtt_series(authority: &Authority, key: &AppKey) -> Vec<RttSeriesView> {
    authority
        .health()
        .inspect(key, |reports, _| {
            reports
                .iter()
                .filter_map(|(name, _)| {
                    let v = reports
                        .rtt_series(name)?
                        .view(|us| f64::from(us) / 1000.0)?;
                    Some(RttSeriesView {
                        connector: name.to_owned(),
                        start: v.start,
                        interval_ms: v.interval_ms,
                        rtt_ms: v.values,
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every address `key` has had (at most
/// `state::addresses::MAX_ADDRESSES`): those in an answer now first,
/// then those that left, latest first.
pub fn address_history(authority: &Authority, key: &AppKey) -> Vec<AddressHistoryView> {
    let book = authority.health().address_book(key).unwrap_or_default();
    let mut out: Vec<AddressHistoryView> = book
        .entries()
        .iter()
        .map(|e| AddressHistoryView {
            address: e.address.to_string(),
            status: e.status,
            appeared: e.appeared_ms,
            left: e.left_ms,
            last_seen: e.last_seen_ms,
            connector: e.last_connector.to_string(),
        })
        .collect();
    out.sort_by_key(|v| v.left.map_or(i64::MIN, |l| -l));
    out
}

/// Each connector's check-load estimate over time, sorted by name.
pub fn load_series(authority: &Authority) -> Vec<LoadSeriesView> {
    let mut out: Vec<LoadSeriesView> = authority
        .registry()
        .list(|name, e| {
            e.load_series.view(|n| n).map(|v| LoadSeriesView {
                connector: name.to_owned(),
                start: v.start,
                interval_ms: v.interval_ms,
                checks_per_cycle: v.values,
            })
        })
        .into_iter()
        .flatten()
        .collect();
    out.sort_by(|a, b| a.connector.cmp(&b.connector));
    out
}

/// Every known connector, sorted by name.
pub fn connectors(authority: &Authority) -> Vec<ConnectorView> {
    use crate::access::drain::DrainView;
    let budget = authority.snapshot().settings().check_budget;
    let drains = authority.registry().drains();
    let mut out: Vec<ConnectorView> = authority.registry().list(|name, e| ConnectorView {
        name: name.to_owned(),
        group: e.group.clone(),
        connected: e.session.is_some(),
        session_id: e.session.as_ref().map(|s| s.label.clone()),
        version: e.version.clone(),
        checks_per_cycle: e.estimate.checks_per_cycle,
        cycle_seconds: e.estimate.cycle.as_secs_f64(),
        over_budget: e.estimate.over_budget,
        check_budget: budget,
        load: e.load.as_ref().map(LoadView::from),
        replicas: e.replicas.as_ref().map(ReplicasView::from),
        status: e.status.as_ref().map(|(s, at)| StatusView::of(s, *at)),
        connected_since: e.connected_since.map(unix_ms),
        last_seen: e.last_seen.map(unix_ms),
        enrolled: false,
        enrolled_at: None,
        disabled: false,
        // An administrator's drain outlasts the session's own.
        drained: e
            .drain
            .as_ref()
            .map(DrainView::of_record)
            .or_else(|| e.self_drain().map(|d| DrainView::of_session(name, d))),
        certificate_serial: None,
        certificate_not_after: None,
        certificates: Vec::new(),
    });
    add_enrolled(authority, &mut out, budget, &drains);
    match authority.store().certificate_history(CERTIFICATES_SHOWN) {
        Ok(mut history) => {
            let now = crate::ground::clock::now_ms();
            for view in &mut out {
                let current = view.certificate_serial.as_deref();
                view.certificates = history
                    .remove(&view.name)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|h| CertificateView::new(h, current, now))
                    .collect();
            }
        }
        Err(e) => tracing::error!(error = %e, "cannot list certificates"),
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Marks the enrolled connectors of `out` enrolled, with their standing
/// and certificate, and adds those that never connected here (with
/// their drain, when `drains` has one).
fn add_enrolled(
    authority: &Authority,
    out: &mut Vec<ConnectorView>,
    budget: u64,
    drains: &HashMap<String, crate::store::DrainRecord>,
) {
    let records = match authority.store().connectors() {
        Ok(records) => records,
        Err(e) => {
            tracing::error!(error = %e, "cannot list enrolled connectors");
            return;
        }
    };
    for r in records {
        let at = match out.iter().position(|v| v.name == r.name) {
            Some(at) => at,
            None => {
                out.push(ConnectorView {
                    name: r.name.clone(),
                    group: r.group.clone(),
                    connected: false,
                    session_id: None,
                    version: String::new(),
                    checks_per_cycle: 0,
                    cycle_seconds: 0.0,
                    over_budget: false,
                    check_budget: budget,
                    load: None,
                    replicas: None,
                    status: None,
                    connected_since: None,
                    last_seen: None,
                    enrolled: false,
                    disabled: false,
                    drained: drains
                        .get(&r.name)
                        .map(crate::access::drain::DrainView::of_record),
                    enrolled_at: None,
                    certificate_serial: None,
                    certificate_not_after: None,
                    certificates: Vec::new(),
                });
                out.len() - 1
            }
        };
        let view = &mut out[at];
        view.enrolled = true;
        view.enrolled_at = Some(r.enrolled_ms);
        view.disabled = r.disabled;
        view.certificate_serial = r.serial;
        view.certificate_not_after = r.not_after_ms;
    }
}

/// Per segment: whether a connector of the registry already makes it pass
/// the group / connector filter.
fn served_by_registry<'s>(
    ctx: &Ctx,
    segments: &HashMap<&'s str, &Segment>,
    filter: &RowFilter<'_>,
) -> HashMap<&'s str, (bool, bool)> {
    // The connector named by the filter, when it is in the registry.
    let named = filter.connector.and_then(|n| ctx.conns.get(n));
    segments
        .iter()
        .map(|(name, s)| {
            let group = filter
                .group
                .is_none_or(|g| s.served_by(g) && ctx.conns.values().any(|c| c.group == g));
            let conn = filter.connector.is_none() || named.is_some_and(|c| s.served_by(&c.group));
            (*name, (group, conn))
        })
        .collect()
}

/// The per-entry rows of the `shown` segments (`discovery_rows`).
fn entry_rows(all: &[Segment], shown: &HashMap<&str, &Segment>) -> Vec<Row<RowItem>> {
    let mut out = Vec::new();
    for s in all {
        if shown.contains_key(s.name.as_str()) {
            out.extend(discovery_rows(s).into_iter().map(|v| Row {
                segment: v.segment.clone(),
                ip: None,
                host: v.host.clone(),
                protocol: v.protocol,
                port: v.port,
                mode: v.health_reporting,
                status: v.status,
                changed: 0,
                noted: true,
                item: RowItem::Entry(Box::new(v)),
            }));
        }
    }
    out
}

/// The view of a connector that has no report on an application.
fn unreported_view(name: &str, group: &str, connected: bool) -> ConnectorHealthView {
    ConnectorHealthView {
        connector: name.to_owned(),
        group: group.to_owned(),
        status: Status::Unknown,
        unknown_cause: Some(if connected {
            "no_report"
        } else {
            "disconnected"
        }),
        reported_at: None,
        report_age_ms: None,
        checked_age_ms: None,
        checked_at: None,
        addresses: Vec::new(),
        dns_error: None,
        smoothed_rtt: None,
    }
}

/// Most ports an unchecked (on-access or `none`) segment is listed with
/// one row per host and port; past it, one row per entry (a range such as
/// `1-65535` would otherwise be 65,535 rows per host).
const PORTS_LISTED: usize = 10;

/// Whether `s`'s unchecked applications are listed one row per entry.
fn listed_per_entry(s: &policy::Segment) -> bool {
    let ports: usize = [Protocol::Tcp, Protocol::Udp]
        .into_iter()
        .flat_map(|p| s.ports(p))
        .map(|r| r.ports().count())
        .sum();
    s.health_reporting != HealthReporting::Continuous && ports > PORTS_LISTED
}

/// One row per wildcard or subnet entry of `s` (every entry when
/// `listed_per_entry`): hosts under them are known only when accessed, and
/// those then have rows of their own.
fn discovery_rows(s: &policy::Segment) -> Vec<ApplicationView> {
    let every_entry = listed_per_entry(s);
    let ports = |p: Protocol| {
        s.ports(p)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (tcp, udp) = (ports(Protocol::Tcp), ports(Protocol::Udp));
    let described = match (tcp.is_empty(), udp.is_empty()) {
        (false, false) => format!("tcp {tcp}; udp {udp}"),
        (false, true) => format!("tcp {tcp}"),
        (true, false) => format!("udp {udp}"),
        (true, true) => String::new(),
    };
    s.applications
        .iter()
        .filter(|e| every_entry || e.host().is_none())
        .map(|e| ApplicationView {
            segment: s.name.clone(),
            host: e.to_string(),
            protocol: if tcp.is_empty() && !udp.is_empty() {
                Protocol::Udp
            } else {
                Protocol::Tcp
            },
            port: 0,
            health_reporting: s.health_reporting,
            status: Status::Unknown,
            connectors: Vec::new(),
            transitions: Vec::new(),
            note: Some(if s.health_reporting == HealthReporting::None {
                "not_checked"
            } else {
                "checked_on_access"
            }),
            ports: Some(described.clone()),
            damping: DampingView::of(s),
            enrolled_unconnected: None,
        })
        .collect()
}

fn transition_view(t: &Transition) -> TransitionView {
    TransitionView {
        at: unix_ms(t.at),
        connector: t.connector.clone(),
        from: t.from,
        to: t.to,
        cause: t.cause,
    }
}

impl ApplicationView {
    /// Whether it is checked (no note) and lists no connector: the views
    /// `api::views::note_unconnected` looks at.
    pub fn lacks_connectors(&self) -> bool {
        self.note.is_none() && self.connectors.is_empty()
    }

    /// The listing's summary form (`view=summary`): per connector no
    /// per-address results and no DNS error, and the latest transition
    /// only. The dashboard's list shows no more; at 500 connectors a page
    /// of full views was over the first load's 200-KB budget.
    pub fn summarise(&mut self) {
        for c in &mut self.connectors {
            c.addresses = Vec::new();
            c.dns_error = None;
        }
        let n = self.transitions.len();
        self.transitions.drain(..n.saturating_sub(1));
    }

    /// The wire form.
    pub fn to_wire(&self) -> v1::ApplicationView {
        v1::ApplicationView {
            app: Some(v1::ApplicationKey {
                segment: self.segment.clone(),
                host: self.host.clone(),
                protocol: v1::Protocol::from(self.protocol) as i32,
                port: u32::from(self.port),
            }),
            status: v1::HealthStatus::from(self.status) as i32,
            enrolled_unconnected: self.enrolled_unconnected.unwrap_or(0),
            connectors: self
                .connectors
                .iter()
                .map(|c| v1::ConnectorHealth {
                    connector: c.connector.clone(),
                    group: c.group.clone(),
                    status: v1::HealthStatus::from(c.status) as i32,
                    reported_at_unix_ms: c
                        .reported_at
                        .map_or(0, |t| i64::try_from(t).unwrap_or(i64::MAX)),
                    addresses: c
                        .addresses
                        .iter()
                        .map(|a| v1::AddressResult {
                            reason: a.reason.clone(),
                            certificate_not_after_unix_s: a.certificate_not_after,
                            address: a.address.clone(),
                            status: v1::HealthStatus::from(a.status) as i32,
                            method: v1::CheckMethod::from(a.method) as i32,
                            rtt_us: a
                                .rtt
                                .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
                            failure: a
                                .failure
                                .map_or(v1::FailureKind::Unspecified, v1::FailureKind::from)
                                as i32,
                            detail: a.error.clone().unwrap_or_default(),
                        })
                        .collect(),
                    checked_age_ms: c.checked_age_ms.unwrap_or(0),
                })
                .collect(),
        }
    }
}

impl ConnectorView {
    /// The view for a caller without the `admin` scope: session id,
    /// version, status (platform, DNS servers, ...) and certificate serial
    /// are what an attacker would use to target one connector, so only
    /// administrators see them.
    pub fn without_admin_fields(mut self) -> Self {
        self.session_id = None;
        self.version = String::new();
        self.status = None;
        self.certificate_serial = None;
        self
    }

    /// The wire form.
    pub fn to_wire(&self) -> v1::ConnectorView {
        v1::ConnectorView {
            name: self.name.clone(),
            group: self.group.clone(),
            connected: self.connected,
            drained: self.drained.is_some(),
            drained_since_unix_ms: self.drained.as_ref().map_or(0, |d| d.since),
            drained_by: self
                .drained
                .as_ref()
                .map(|d| format!("{}:{}", d.by.kind, d.by.name))
                .unwrap_or_default(),
            load: self.load.as_ref().map(|l| v1::CheckLoad {
                targets: l.targets,
                checks_per_cycle: l.checks_per_cycle,
                cycle_seconds: l.cycle_seconds,
                queue_depth: l.queue_depth,
                checks_per_second: l.checks_per_second,
                in_flight: l.in_flight,
                rate_limit: l.rate_limit,
            }),
            checks_per_cycle: u32::try_from(self.checks_per_cycle).unwrap_or(u32::MAX),
            cycle_seconds: self.cycle_seconds,
            over_budget: self.over_budget,
            version: self.version.clone(),
            replicas: self.replicas.as_ref().map(|r| v1::ReplicaAttachment {
                sessions: r.sessions,
                assignments: r.assignments,
                follows_this_session: r.follows_this_replica,
                agrees_with_followed: r.agrees_with_followed,
                assignment_hash: r.assignment_hash.clone(),
                followed_assignment_hash: r.followed_assignment_hash.clone(),
            }),
            status: self.status.as_ref().map(StatusView::to_wire),
            status_received_unix_ms: self
                .status
                .as_ref()
                .map_or(0, |s| i64::try_from(s.reported_at).unwrap_or(i64::MAX)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_warned_about_within_the_window_only() {
        let (now, day) = (1_800_000_000, 86_400);
        let warn = Duration::from_secs(14 * 86_400);
        let w = |left: i64| certificate_warning(now + left, now, warn);
        assert_eq!(w(14 * day), None);
        assert_eq!(w(90 * day), None);
        assert_eq!(
            w(14 * day - 1).as_deref(),
            Some("certificate expires in 13 days")
        );
        assert_eq!(w(day + 5).as_deref(), Some("certificate expires in 1 day"));
        assert_eq!(w(7200).as_deref(), Some("certificate expires in 2 hours"));
        assert_eq!(w(10).as_deref(), Some("certificate expires in 1 hour"));
        assert_eq!(w(0).as_deref(), Some("certificate expired"));
        assert_eq!(w(-day).as_deref(), Some("certificate expired"));
        // A window of 0 days: only an expired certificate is warned about.
        assert_eq!(certificate_warning(now + 10, now, Duration::ZERO), None);
        assert_eq!(
            certificate_warning(now, now, Duration::ZERO).as_deref(),
            Some("certificate expired")
        );
    }
}
