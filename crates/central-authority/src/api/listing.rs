//! The health listing's query: filters, natural sort, paging and counts by
//! status (`GET /api/v1/health` and the dashboard's list). Pure functions
//! on values: the handler parses the query string once (`ListQuery::parse`),
//! `api::views` gives one cheap [`Row`] per application (its sort and filter
//! keys, no per-connector detail), `run` filters, counts, sorts and pages
//! them, and only the rows of the page are built into full views.

use std::cmp::Ordering;
use std::net::IpAddr;

use policy::{HealthReporting, Protocol, Status};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// Most rows one page may hold.
pub const MAX_PER_PAGE: usize = 1000;
/// Highest page number the listing and the history take (a higher one
/// would be empty anyway).
pub const MAX_PAGE: usize = 1_000_000;
/// Most transitions one page of `GET /api/v1/events` holds.
pub const MAX_EVENTS_PER_PAGE: u32 = 1000;
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
    /// `full` (default) or `summary`: per connector only its status and
    /// cause (no per-address results, no DNS error), and only the latest
    /// transition per application: what the dashboard's list shows, at a
    /// fraction of the bytes when many connectors report each application.
    pub view: Option<String>,
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
    /// The rows' views without per-address results, with the latest
    /// transition only (`view=summary`).
    pub summary: bool,
}

fn invalid(m: String) -> ApiError {
    ApiError::InvalidRequest(m)
}

/// At most 64 characters of untrusted input, for error messages.
fn shorten(s: &str) -> String {
    s.chars().take(64).collect()
}

/// An empty parameter (`?status=`) means "not given", as forms send it.
/// Anything else is taken exactly as sent (the OpenAPI document's types).
fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().filter(|s| !s.is_empty())
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
            for s in list.split(',').filter(|s| !s.is_empty()) {
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
            .map(|p| number("page", p, MAX_PAGE))
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
        let summary = match given(&raw.view) {
            None | Some("full") => false,
            Some("summary") => true,
            Some(other) => {
                return Err(invalid(format!(
                    "view: {:?} is neither full nor summary",
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
            summary,
        })
    }

    /// Whether `r` passes the filters judged on the row alone (mode and
    /// search); segment, group and connector are judged where the rows are
    /// made (`api::views::rows`), since they need the registry.
    fn keeps<T>(&self, r: &Row<T>) -> bool {
        self.mode.is_none_or(|m| m == r.mode)
            && self
                .q
                .as_ref()
                .is_none_or(|q| contains_ignoring_case(&r.host, q))
    }
}

/// Whether `host` contains `needle` (already lower-case), ASCII letters
/// compared case-insensitively (hosts are ASCII: IDNs are punycode).
fn contains_ignoring_case(host: &str, needle: &str) -> bool {
    let (h, n) = (host.as_bytes(), needle.as_bytes());
    n.is_empty()
        || h.windows(n.len())
            .any(|w| w.iter().zip(n).all(|(a, b)| a.to_ascii_lowercase() == *b))
        || (!host.is_ascii() && host.to_lowercase().contains(needle))
}

/// What the listing knows of one application before its view is built:
/// the keys it filters, counts and sorts on. `item` says how to build the
/// view of a row that lands on the page.
#[derive(Clone, Debug)]
pub struct Row<T> {
    /// Segment.
    pub segment: String,
    /// Host (FQDN, IP, or a wildcard/subnet entry).
    pub host: String,
    /// The host as an IP address, parsed once (for the numeric sort).
    pub ip: Option<IpAddr>,
    /// Protocol.
    pub protocol: Protocol,
    /// Port (0 for a wildcard/subnet entry's row).
    pub port: u16,
    /// Health reporting mode of the segment.
    pub mode: HealthReporting,
    /// Overall status.
    pub status: Status,
    /// Time of the latest transition, Unix ms (0: never changed).
    pub changed: u64,
    /// The row's view carries a note: nothing is checked for it (a `none`
    /// application, an on-access one nobody accessed, a wildcard or subnet
    /// entry). Listed, but left out of the status gauges.
    pub noted: bool,
    /// What builds the row's view.
    pub item: T,
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
    /// Counts `statuses`.
    pub fn of(statuses: impl IntoIterator<Item = Status>) -> Counts {
        let mut c = Counts::default();
        for s in statuses {
            match s {
                Status::Up => c.up += 1,
                Status::Unhealthy => c.unhealthy += 1,
                Status::Down => c.down += 1,
                Status::Unknown => c.unknown += 1,
            }
        }
        c
    }
}

/// The rows of one page and the listing's totals.
#[derive(Debug)]
pub struct Page<T> {
    /// The rows of the page, in order.
    pub rows: Vec<Row<T>>,
    /// Rows matching every filter.
    pub total: usize,
    /// The page shown, from 1.
    pub page: usize,
    /// Rows per page.
    pub per_page: usize,
    /// Number of pages (at least 1).
    pub pages: usize,
    /// Matching rows by status, before the status filter.
    pub counts: Counts,
}

/// Filters, counts, sorts and pages `rows`. Only the page's rows are
/// sorted into their final place (a partial sort), so a page of 50 out
/// of 10,000 costs a selection, not a full sort.
pub fn run<T>(rows: Vec<Row<T>>, q: &ListQuery) -> Page<T> {
    let mut kept: Vec<Row<T>> = rows.into_iter().filter(|r| q.keeps(r)).collect();
    let counts = Counts::of(kept.iter().map(|r| r.status));
    if !q.statuses.is_empty() {
        kept.retain(|r| q.statuses.contains(&r.status));
    }
    let total = kept.len();
    let (page, per_page) = q.paging.unwrap_or((1, total.max(1)));
    let pages = total.div_ceil(per_page).max(1);
    let start = page.saturating_sub(1).saturating_mul(per_page).min(total);
    let end = start.saturating_add(per_page).min(total);
    let order = |a: &Row<T>, b: &Row<T>| {
        let o = compare(a, b, q.sort);
        if q.descending { o.reverse() } else { o }
    };
    // Everything before `start` ends up in front of it, everything after
    // `end` behind: only the window itself needs sorting.
    if start > 0 && start < total {
        kept.select_nth_unstable_by(start, order);
    }
    let window = &mut kept[start..];
    let len = end - start;
    if len > 0 && len < window.len() {
        window.select_nth_unstable_by(len - 1, order);
    }
    window[..len].sort_unstable_by(order);
    let rows: Vec<Row<T>> = kept.drain(start..end).collect();
    Page {
        rows,
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

/// The listing's order: the column, then host, port, protocol and segment
/// (a total order, so pages are stable).
fn compare<T>(a: &Row<T>, b: &Row<T>, key: SortKey) -> Ordering {
    let by_host = || {
        host_cmp(a.ip.as_ref(), &a.host, b.ip.as_ref(), &b.host)
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
        SortKey::Mode => a.mode.as_str().cmp(b.mode.as_str()),
        SortKey::Changed => a.changed.cmp(&b.changed),
    };
    first.then_with(by_host)
}

fn host_cmp(ip_a: Option<&IpAddr>, a: &str, ip_b: Option<&IpAddr>, b: &str) -> Ordering {
    match (ip_a, ip_b) {
        (Some(x), Some(y)) => x.cmp(y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => natural_cmp(a, b),
    }
}

/// Host order: IP addresses first, numerically (IPv4 before IPv6), then
/// names in natural order (`web2` before `web10`).
pub fn natural_host_cmp(a: &str, b: &str) -> Ordering {
    let ip = policy::host::parse_ip;
    host_cmp(ip(a).as_ref(), a, ip(b).as_ref(), b)
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

    fn rows(n: usize) -> Vec<Row<usize>> {
        (0..n)
            .map(|i| {
                // A scrambled order of hosts, statuses and change times.
                let j = (i * 7919) % n;
                let host = if j.is_multiple_of(3) {
                    format!("10.0.{}.{}", j / 250, j % 250)
                } else {
                    format!("web{j}.example")
                };
                Row {
                    segment: format!("s{}", j % 4),
                    ip: host.parse().ok(),
                    host,
                    protocol: Protocol::Tcp,
                    port: 443,
                    mode: HealthReporting::Continuous,
                    status: [Status::Up, Status::Down, Status::Unhealthy, Status::Unknown][j % 4],
                    changed: (j % 13) as u64,
                    noted: false,
                    item: i,
                }
            })
            .collect()
    }

    #[test]
    fn a_page_is_the_same_slice_of_the_full_sort() {
        for sort in [
            SortKey::Host,
            SortKey::Status,
            SortKey::Changed,
            SortKey::Segment,
        ] {
            for descending in [false, true] {
                let q = |paging| ListQuery {
                    statuses: Vec::new(),
                    segment: None,
                    group: None,
                    connector: None,
                    mode: None,
                    q: None,
                    paging,
                    sort,
                    descending,
                    summary: false,
                };
                let all: Vec<usize> = run(rows(1000), &q(None))
                    .rows
                    .iter()
                    .map(|r| r.item)
                    .collect();
                assert_eq!(all.len(), 1000);
                for (page, per_page) in [(1, 50), (2, 50), (7, 33), (20, 50), (21, 50), (1, 1000)] {
                    let p = run(rows(1000), &q(Some((page, per_page))));
                    let got: Vec<usize> = p.rows.iter().map(|r| r.item).collect();
                    let from = ((page - 1) * per_page).min(1000);
                    let to = (from + per_page).min(1000);
                    assert_eq!(got, all[from..to], "{sort:?} desc={descending} page {page}");
                    assert_eq!(p.total, 1000);
                    assert_eq!(p.pages, 1000usize.div_ceil(per_page));
                }
            }
        }
    }

    #[test]
    fn counts_are_taken_before_the_status_filter_and_search_ignores_case() {
        let q = ListQuery::parse(&RawQuery {
            status: Some("down".into()),
            q: Some("WEB1".into()),
            ..Default::default()
        })
        .expect("valid");
        let p = run(rows(100), &q);
        let matching: Vec<_> = rows(100)
            .into_iter()
            .filter(|r| r.host.contains("web1"))
            .collect();
        assert_eq!(p.counts, Counts::of(matching.iter().map(|r| r.status)));
        assert_eq!(p.total, p.counts.down);
        assert!(
            p.rows
                .iter()
                .all(|r| r.status == Status::Down && r.host.contains("web1"))
        );
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
