//! The status history: `GET /api/v1/events`, its filter and the paging
//! and time parameters the history listings share.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::api::listing::MAX_EVENTS_PER_PAGE;
use crate::api::route::{Auth, Method, Op, Route, error_ref, or_empty, query_param, route};
use crate::credentials::auth::Scope;
use crate::error::ApiError;

use super::Shared;
use super::extract::{RequireScope, scope};
use super::respond::admin;

#[derive(Debug, Deserialize)]
pub(super) struct EventsQuery {
    app: Option<String>,
    segment: Option<String>,
    host: Option<String>,
    protocol: Option<String>,
    port: Option<String>,
    connector: Option<String>,
    address: Option<String>,
    since: Option<String>,
    until: Option<String>,
    page: Option<String>,
    per_page: Option<String>,
}

/// An events filter's address: an IP address (in its normal form), or `*`
/// for every address.
fn event_address(a: &str) -> Result<String, ApiError> {
    if a == "*" {
        return Ok(a.to_owned());
    }
    a.parse::<policy::Host>()
        .ok()
        .and_then(|h| h.ip())
        .map(|ip| ip.to_string())
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "address: {:?} is neither an IP address nor *",
                a.chars().take(64).collect::<String>()
            ))
        })
}

/// A time parameter: Unix milliseconds or RFC 3339.
pub(super) fn parse_time(name: &str, v: &str) -> Result<i64, ApiError> {
    if let Ok(ms) = v.parse::<i64>() {
        return Ok(ms);
    }
    time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc3339)
        .map(|t| i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX))
        .map_err(|_| {
            ApiError::InvalidRequest(format!(
                "{name}: {:?} is neither Unix milliseconds nor an RFC 3339 time",
                v.chars().take(64).collect::<String>()
            ))
        })
}

/// An events filter's port: 0-65535.
fn event_port(p: &str) -> Result<i64, ApiError> {
    p.parse::<u16>().map(i64::from).map_err(|_| {
        ApiError::InvalidRequest(format!(
            "port: {:?} is not a port (0-65535)",
            p.chars().take(16).collect::<String>()
        ))
    })
}

/// Parses `GET /api/v1/events`' query into a filter and paging.
fn events_query(q: EventsQuery) -> Result<(crate::store::EventFilter, u64, u32), ApiError> {
    let given = |v: Option<String>| v.filter(|s| !s.is_empty());
    let mut f = crate::store::EventFilter {
        segment: given(q.segment),
        host: given(q.host).map(|h| policy::host::lookup_key(&h)),
        protocol: given(q.protocol),
        connector: given(q.connector),
        address: given(q.address).map(|a| event_address(&a)).transpose()?,
        ..Default::default()
    };
    let mut port = given(q.port);
    // Each parameter is checked as sent, even when `app` then replaces it.
    if let Some(p) = &f.protocol {
        crate::api::body::api_protocol(p)?;
    }
    if let Some(p) = &port {
        event_port(p)?;
    }
    if let Some(app) = given(q.app) {
        // segment/host/protocol/port; a subnet host has a '/' of its own.
        let mut tail = app.rsplitn(3, '/');
        let (p, proto, rest) = (tail.next(), tail.next(), tail.next());
        let (Some(p), Some(proto), Some((segment, host))) =
            (p, proto, rest.and_then(|r| r.split_once('/')))
        else {
            return Err(ApiError::InvalidRequest(
                "app: expected segment/host/protocol/port".into(),
            ));
        };
        f.segment = Some(segment.to_owned());
        f.host = Some(policy::host::lookup_key(host));
        f.protocol = Some(proto.to_owned());
        port = Some(p.to_owned());
    }
    if let Some(p) = &f.protocol {
        crate::api::body::api_protocol(p)?;
    }
    if let Some(p) = port {
        f.port = Some(event_port(&p)?);
    }
    f.since_ms = given(q.since)
        .map(|v| parse_time("since", &v))
        .transpose()?;
    f.until_ms = given(q.until)
        .map(|v| parse_time("until", &v))
        .transpose()?;
    let (page, per_page) = history_paging(q.page, q.per_page)?;
    Ok((f, page, per_page))
}

/// The `page` and `per_page` of a history listing (`/api/v1/events`,
/// `/api/v1/audit`), taken as sent (an empty value is not given): page
/// from 1, 1 to [`MAX_EVENTS_PER_PAGE`] rows, 100 unless given.
pub(super) fn history_paging(
    page: Option<String>,
    per_page: Option<String>,
) -> Result<(u64, u32), ApiError> {
    let given = |v: Option<String>| v.filter(|s| !s.is_empty());
    let page = match given(page) {
        None => 1,
        Some(p) => p
            .parse::<u64>()
            .ok()
            .filter(|p| (1..=crate::api::listing::MAX_PAGE as u64).contains(p))
            .ok_or_else(|| {
                ApiError::InvalidRequest(format!(
                    "page: not a whole number from 1 to {}",
                    crate::api::listing::MAX_PAGE
                ))
            })?,
    };
    let per_page = match given(per_page) {
        None => 100,
        Some(p) => p
            .parse::<u32>()
            .ok()
            .filter(|p| (1..=MAX_EVENTS_PER_PAGE).contains(p))
            .ok_or_else(|| {
                ApiError::InvalidRequest(format!(
                    "per_page: not a whole number from 1 to {MAX_EVENTS_PER_PAGE}"
                ))
            })?,
    };
    Ok((page, per_page))
}

/// `GET /api/v1/events`, served by `events`, and its document.
pub(super) fn events_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/events",
            auth: Auth::Scope(Scope::Read),
            spec: json!({
                "operationId": "listEvents",
                "summary": "The status history: every transition, newest first, paged",
                "tags": ["health"],
                "parameters": [
                    query_param("app", false, "segment/host/protocol/port in one (overrides those four)"),
                    query_param("segment", false, "segment name"),
                    query_param("host", false, "host (FQDN, IP, or the entry of a wildcard/subnet row)"),
                    query_param("protocol", false, "tcp or udp"),
                    query_param("port", false, "0-65535"),
                    query_param("connector", false, "connector name"),
                    query_param("address", false, "the address history instead: changes of this IP address of the application (appeared, its result changed where the status history does not show it, left), or `*` for every address"),
                    query_param("since", false, "Unix ms or RFC 3339"),
                    query_param("until", false, "Unix ms or RFC 3339"),
                    query_param("page", false, "page from 1"),
                    {"name": "per_page", "in": "query", "required": false, "description": "1-1000",
                        "schema": or_empty(json!({"type": "integer", "minimum": 1, "maximum": crate::api::listing::MAX_EVENTS_PER_PAGE}))},
                ],
                "responses": {
                    "200": {"description": "one page of transitions",
                        "content": {"application/json": {"schema": {"type": "object"}}}},
                    "400": error_ref("InvalidRequest"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        events,
    )
}

/// `GET /api/v1/events`: the stored status history, newest first.
pub(super) async fn events(
    State(a): State<Shared>,
    _: RequireScope<scope::Read>,
    Query(q): Query<EventsQuery>,
) -> Response {
    let (filter, page, per_page) = match events_query(q) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    match admin(&a, move |a| {
        crate::intake::transitions::events(a, filter, page, per_page)
    })
    .await
    {
        Ok(page) => axum::Json(page).into_response(),
        Err(response) => response,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `port` and `protocol` are refused when invalid even when `app`
    /// replaces them: a parameter is never silently dropped.
    #[test]
    fn events_query_checks_what_app_replaces() {
        let query = |port: Option<&str>, protocol: Option<&str>| EventsQuery {
            app: Some("s/h.test/tcp/80".into()),
            segment: None,
            host: None,
            protocol: protocol.map(Into::into),
            port: port.map(Into::into),
            connector: None,
            address: None,
            since: None,
            until: None,
            page: None,
            per_page: None,
        };
        assert!(matches!(
            events_query(query(Some("null"), None)),
            Err(ApiError::InvalidRequest(m)) if m.contains("port")
        ));
        assert!(matches!(
            events_query(query(None, Some("icmp"))),
            Err(ApiError::InvalidRequest(_))
        ));
        // An address is an IP address in its normal form, or `*`.
        let with = |a: &str| {
            events_query(EventsQuery {
                address: Some(a.into()),
                ..query(None, None)
            })
            .map(|(f, _, _)| f.address)
        };
        assert_eq!(
            with("2001:DB8:0::1").ok().flatten().as_deref(),
            Some("2001:db8::1")
        );
        assert_eq!(with("*").ok().flatten().as_deref(), Some("*"));
        assert!(matches!(
            with("web.test"),
            Err(ApiError::InvalidRequest(m)) if m.contains("address")
        ));
        let (f, _, _) = events_query(query(Some("81"), Some("udp"))).expect("valid");
        assert_eq!((f.port, f.protocol.as_deref()), (Some(80), Some("tcp")));
    }
}
