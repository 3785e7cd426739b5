//! The health listing's query: filters, natural sort, paging and counts by
//! status over the applications `views` builds (`GET /api/v1/health` and
//! the dashboard's list). Pure functions on values: the handler parses the
//! query string once (`ListQuery::parse`), then `run` answers it.

use std::cmp::Ordering;
use std::net::IpAddr;

use policy::{HealthReporting, Status};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::views::ApplicationView;

/// Most rows one page may hold.
pub const MAX_PER_PAGE: usize = 1000;
/// Rows per page when `page` is given without `per_page`.
pub const DEFAULT_PER_PAGE: usize = 50;

/// The query string as sent (every field optional, all text).
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RawQuery {
    /// Comma-separated statuses (`down,unhealthy`).
    pub status: Option<String>,
    /// Exact segment name.
    pub segment: Option<String>,
    /// Exact connector group name.
    pub group: Option<String>,
    /// Exact connector name.
    pub connector: Option<String>,
    /// `continuous`, `on_access` or `none`.
    pub mode: Option<String>,
    /// Case-insensitive substring of the host.
    pub q: Option<String>,
    /// Page number, from 1.
    pub page: Option<String>,
    /// Rows per page (1 to `MAX_PER_PAGE`).
    pub per_page: Option<String>,
    /// Column to sort by.
    pub sort: Option<String>,
    /// `asc` or `desc`.
    pub order: Option<String>,
}

/// A column the listing sorts by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// Host (IP addresses numerically, then names naturally), then port.
    Host,
    /// Segment, then host.
    Segment,
    /// Status by severity (down, unhealthy, unknown, up), then host.
    Status,
    /// Port, then host.
    Port,
    /// Protocol, then host.
    Protocol,
    /// Health reporting mode, then host.
    Mode,
    /// Time of the latest status transition (never changed first), then host.
    Changed,
}

impl SortKey {
    fn parse(s: &str) -> Result<Self, ApiError> {
        Ok(match s {
            "host" => SortKey::Host,
            "segment" => SortKey::Segment,
            "status" => SortKey::Status,
            "port" => SortKey::Port,
            "protocol" => SortKey::Protocol,
            "mode" => SortKey::Mode,
            "changed" => SortKey::Changed,
            other => {
                return Err(invalid(format!(
                    "sort: {:?} is not a column (host, segment, status, port, protocol, mode, changed)",
                    shorten(other)
                )));
            }
        })
    }
}

/// A parsed, validated listing query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListQuery {
    /// Statuses to keep (empty: all).
    pub statuses: Vec<Status>,
    /// Segment to keep.
    pub segment: Option<String>,
    /// Keep applications one of whose connectors is of this group.
    pub group: Option<String>,
    /// Keep applications this connector serves.
    pub connector: Option<String>,
    /// Keep applications of segments in this mode.
    pub mode: Option<HealthReporting>,
    /// Lower-case host substring.
    pub q: Option<String>,
    /// `(page, per_page)`; `None`: every row (the pre-paging behaviour).
    pub paging: Option<(usize, usize)>,
    /// Sort column.
    pub sort: SortKey,
    /// Descending.
    pub descending: bool,
}

fn invalid(m: String) -> ApiError {
    ApiError::InvalidRequest(m)
}

/// At most 64 characters of untrusted input, for error messages.
fn shorten(s: &str) -> String {
    s.chars().take(64).collect()
}

/// An empty parameter (`?status=`) means "not given", as forms send it.
fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

fn number(name: &str, v: &str, max: usize) -> Result<usize, ApiError> {
    match v.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(invalid(format!(
            "{name}: {:?} is not a whole number from 1 to {max}",
            shorten(v)
        ))),
    }
}

/// Parses a status name.
pub fn parse_status(s: &str) -> Option<Status> {
    match s {
        "up" => Some(Status::Up),
        "unhealthy" => Some(Status::Unhealthy),
        "down" => Some(Status::Down),
        "unknown" => Some(Status::Unknown),
        _ => None,
    }
}

impl ListQuery {
    /// Validates the raw query; the error names the parameter and the rule.
    pub fn parse(raw: &RawQuery) -> Result<ListQuery, ApiError> {
        let mut statuses = Vec::new();
        if let Some(list) = given(&raw.status) {
            for s in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let status = parse_status(s).ok_or_else(|| {
                    invalid(format!(
                        "status: {:?} is not a status (up, unhealthy, down, unknown)",
                        shorten(s)
                    ))
                })?;
                if !statuses.contains(&status) {
                    statuses.push(status);
                }
            }
        }
        let mode = match given(&raw.mode) {
            None => None,
            Some("continuous") => Some(HealthReporting::Continuous),
            Some("on_access") => Some(HealthReporting::OnAccess),
            Some("none") => Some(HealthReporting::None),
            Some(other) => {
                return Err(invalid(format!(
                    "mode: {:?} is not a health reporting mode (continuous, on_access, none)",
                    shorten(other)
                )));
            }
        };
        let page = given(&raw.page)
            .map(|p| number("page", p, usize::MAX))
            .transpose()?;
        let per_page = given(&raw.per_page)
            .map(|p| number("per_page", p, MAX_PER_PAGE))
            .transpose()?;
        let paging = match (page, per_page) {
            (None, None) => None,
            (p, n) => Some((p.unwrap_or(1), n.unwrap_or(DEFAULT_PER_PAGE))),
        };
        let sort = given(&raw.sort)
            .map(SortKey::parse)
            .transpose()?
            .unwrap_or(SortKey::Host);
        let descending = match given(&raw.order) {
            None | Some("asc") => false,
            Some("desc") => true,
            Some(other) => {
                return Err(invalid(format!(
                    "order: {:?} is neither asc nor desc",
                    shorten(other)
                )));
            }
        };
        Ok(ListQuery {
            statuses,
            segment: given(&raw.segment).map(str::to_owned),
            group: given(&raw.group).map(str::to_owned),
            connector: given(&raw.connector).map(str::to_owned),
            mode,
            q: given(&raw.q).map(str::to_lowercase),
            paging,
            sort,
            descending,
        })
    }

    /// Whether `a` passes every filter but the status one (the counts by
    /// status are taken over these, so each shows what choosing it gives).
    fn keeps(&self, a: &ApplicationView) -> bool {
        self.segment.as_ref().is_none_or(|s| *s == a.segment)
            && self
                .group
                .as_ref()
                .is_none_or(|g| a.connectors.iter().any(|c| c.group == *g))
            && self
                .connector
                .as_ref()
                .is_none_or(|n| a.connectors.iter().any(|c| c.connector == *n))
            && self.mode.is_none_or(|m| m == a.health_reporting)
            && self
                .q
                .as_ref()
                .is_none_or(|q| a.host.to_lowercase().contains(q.as_str()))
    }
}

/// How many applications have each status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Counts {
    /// Up.
    pub up: usize,
    /// Unhealthy (some addresses reachable).
    pub unhealthy: usize,
    /// Down.
    pub down: usize,
    /// Unknown (including not-yet-accessed on-access and `none` applications).
    pub unknown: usize,
}

impl Counts {
    /// Counts `apps` by status.
    pub fn of<'a>(apps: impl IntoIterator<Item = &'a ApplicationView>) -> Counts {
        let mut c = Counts::default();
        for a in apps {
            match a.status {
                Status::Up => c.up += 1,
                Status::Unhealthy => c.unhealthy += 1,
                Status::Down => c.down += 1,
                Status::Unknown => c.unknown += 1,
            }
        }
        c
    }
}

/// One answer of the listing.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Listing {
    /// The rows of the page (every row when no paging was asked for).
    pub applications: Vec<ApplicationView>,
    /// Rows matching every filter.
    pub total: usize,
    /// The page shown, from 1.
    pub page: usize,
    /// Rows per page (`total` when no paging was asked for).
    pub per_page: usize,
    /// Number of pages (at least 1).
    pub pages: usize,
    /// Matching rows by status, before the status filter.
    pub counts: Counts,
}

/// Filters, sorts and pages `apps`.
pub fn run(apps: Vec<ApplicationView>, q: &ListQuery) -> Listing {
    let mut kept: Vec<ApplicationView> = apps.into_iter().filter(|a| q.keeps(a)).collect();
    let counts = Counts::of(&kept);
    if !q.statuses.is_empty() {
        kept.retain(|a| q.statuses.contains(&a.status));
    }
    kept.sort_by(|a, b| {
        let o = compare(a, b, q.sort);
        if q.descending { o.reverse() } else { o }
    });
    let total = kept.len();
    let (page, per_page) = q.paging.unwrap_or((1, total.max(1)));
    let pages = total.div_ceil(per_page).max(1);
    let applications: Vec<ApplicationView> = kept
        .into_iter()
        .skip(page.saturating_sub(1).saturating_mul(per_page))
        .take(per_page)
        .collect();
    Listing {
        applications,
        total,
        page,
        per_page,
        pages,
        counts,
    }
}

/// Severity order: what needs attention first.
fn severity(s: Status) -> u8 {
    match s {
        Status::Down => 0,
        Status::Unhealthy => 1,
        Status::Unknown => 2,
        Status::Up => 3,
    }
}

fn compare(a: &ApplicationView, b: &ApplicationView, key: SortKey) -> Ordering {
    let by_host = || {
        natural_host_cmp(&a.host, &b.host)
            .then(a.port.cmp(&b.port))
            .then(a.protocol.as_str().cmp(b.protocol.as_str()))
            .then_with(|| natural_cmp(&a.segment, &b.segment))
    };
    let first = match key {
        SortKey::Host => Ordering::Equal,
        SortKey::Segment => natural_cmp(&a.segment, &b.segment),
        SortKey::Status => severity(a.status).cmp(&severity(b.status)),
        SortKey::Port => a.port.cmp(&b.port),
        SortKey::Protocol => a.protocol.as_str().cmp(b.protocol.as_str()),
        SortKey::Mode => a.health_reporting.as_str().cmp(b.health_reporting.as_str()),
        SortKey::Changed => last_change(a).cmp(&last_change(b)),
    };
    first.then_with(by_host)
}

fn last_change(a: &ApplicationView) -> u64 {
    a.transitions.last().map_or(0, |t| t.at)
}

/// Host order: IP addresses first, numerically (IPv4 before IPv6), then
/// names in natural order (`web2` before `web10`).
pub fn natural_host_cmp(a: &str, b: &str) -> Ordering {
    let ip = |s: &str| s.parse::<IpAddr>().ok();
    match (ip(a), ip(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => natural_cmp(a, b),
    }
}

/// Natural order: runs of digits compare as numbers, everything else
/// case-insensitively; ties fall back to the plain byte order so the order
/// is total.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    loop {
        match (x.first(), y.first()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(p), Some(q)) if p.is_ascii_digit() && q.is_ascii_digit() => {
                let (dx, rx) = digits(x);
                let (dy, ry) = digits(y);
                // Leading zeros do not count; a longer number is larger.
                let (tx, ty) = (trim_zeros(dx), trim_zeros(dy));
                let o = tx.len().cmp(&ty.len()).then_with(|| tx.cmp(ty));
                if o != Ordering::Equal {
                    return o;
                }
                (x, y) = (rx, ry);
            }
            (Some(p), Some(q)) => {
                let o = p.to_ascii_lowercase().cmp(&q.to_ascii_lowercase());
                if o != Ordering::Equal {
                    return o;
                }
                (x, y) = (&x[1..], &y[1..]);
            }
        }
    }
}

fn digits(s: &[u8]) -> (&[u8], &[u8]) {
    let n = s.iter().take_while(|c| c.is_ascii_digit()).count();
    s.split_at(n)
}

fn trim_zeros(s: &[u8]) -> &[u8] {
    let n = s.iter().take_while(|c| **c == b'0').count();
    &s[n..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<&str>) -> Vec<&str> {
        v.sort_by(|a, b| natural_host_cmp(a, b));
        v
    }

    #[test]
    fn addresses_sort_numerically_then_names_naturally() {
        assert_eq!(
            sorted(vec![
                "web10.example",
                "10.0.0.10",
                "::1",
                "Web2.example",
                "10.0.0.2",
                "9.255.0.1",
                "web2.example",
                "app.example",
            ]),
            vec![
                "9.255.0.1",
                "10.0.0.2",
                "10.0.0.10",
                "::1",
                "app.example",
                "Web2.example",
                "web2.example",
                "web10.example",
            ]
        );
    }

    #[test]
    fn natural_order_is_total_and_ignores_leading_zeros() {
        assert_eq!(natural_cmp("a02", "a2"), "a02".cmp("a2"));
        assert_eq!(natural_cmp("a2b", "a02c"), Ordering::Less);
        assert_eq!(
            natural_cmp("a99999999999999999999999", "a1"),
            Ordering::Greater
        );
        assert_eq!(natural_cmp("", "a"), Ordering::Less);
        assert_eq!(natural_cmp("x", "x"), Ordering::Equal);
    }

    #[test]
    fn bad_parameters_are_named() {
        let q = |raw: RawQuery| match ListQuery::parse(&raw) {
            Err(ApiError::InvalidRequest(m)) => m,
            other => panic!("{other:?}"),
        };
        let m = q(RawQuery {
            status: Some("down,sideways".into()),
            ..Default::default()
        });
        assert!(m.starts_with("status: \"sideways\""), "{m}");
        let m = q(RawQuery {
            per_page: Some("0".into()),
            ..Default::default()
        });
        assert!(m.starts_with("per_page:"), "{m}");
        let m = q(RawQuery {
            sort: Some("colour".into()),
            ..Default::default()
        });
        assert!(m.starts_with("sort:"), "{m}");
        let ok = ListQuery::parse(&RawQuery {
            status: Some(String::new()),
            page: Some("2".into()),
            ..Default::default()
        })
        .expect("valid");
        assert_eq!(ok.paging, Some((2, DEFAULT_PER_PAGE)));
        assert!(ok.statuses.is_empty());
    }
}
