//! The health listing: `GET /api/v1/health`, `/api/v1/application` and
//! `/api/v1/overview`.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::IntoParams;
use utoipa::openapi::path::ParameterIn;

use crate::api;
use crate::api::body::{ApplicationBody, HealthBody, error_body};
use crate::api::route::{
    Auth, Method, Op, Route, error_ref, json_body, not_found, or_empty, query_param, query_schema,
    route,
};
use crate::credentials::auth::Scope;
use crate::error::ApiError;

use super::Shared;
use super::extract::{RequireScope, scope};
use super::respond::shutting_down;

/// `views` with `enrolled_unconnected` set (`api::views::note_unconnected`,
/// off the async workers: it reads the store), or as they are when none
/// needs it; `None` when the runtime is shutting down.
async fn noted_unconnected(
    a: &Shared,
    mut views: Vec<crate::api::views::ApplicationView>,
) -> Option<Vec<crate::api::views::ApplicationView>> {
    if !views
        .iter()
        .any(crate::api::views::ApplicationView::lacks_connectors)
    {
        return Some(views);
    }
    a.blocking(move |a| {
        api::views::note_unconnected(a, &mut views);
        views
    })
    .await
}

/// The query parameters of `GET /api/v1/health` (`listing::RawQuery`),
/// each typed by `query_schema`.
fn health_params() -> Vec<Value> {
    crate::api::listing::RawQuery::into_params(|| Some(ParameterIn::Query))
        .into_iter()
        .filter_map(|p| serde_json::to_value(p).ok())
        .map(|mut p| {
            let name = p["name"].as_str().unwrap_or_default().to_owned();
            let per_page = json!({"type": "integer", "minimum": 1,
                "maximum": crate::api::listing::MAX_PER_PAGE});
            match (name.as_str(), query_schema(&name)) {
                ("per_page", _) => p["schema"] = or_empty(per_page),
                (_, Some(schema)) => p["schema"] = or_empty(schema),
                _ => {}
            }
            p
        })
        .collect()
}

/// `GET /api/v1/health`, served by `health`, and its document.
pub(super) fn health_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/health",
            auth: Auth::Scope(Scope::Read),
            spec: json!({
                "operationId": "listHealth",
                "summary": "Every visible application with its status per connector and address",
                "description": "Applications of segments with `client_hostname_validation = true` are not listed. Filtered by the parameters; sorted naturally (IP addresses numerically, then names); paged when `page` or `per_page` is given (else every row). `counts` are taken before the status filter.",
                "tags": ["health"],
                "parameters": health_params(),
                "responses": {"200": {"description": "the health table",
                    "content": json_body("HealthBody", json!({"applications": [{
                        "segment": "jira", "host": "jira.lanukcorp.com", "protocol": "tcp",
                        "port": 80, "health_reporting": "continuous", "status": "up",
                        "connectors": [{"connector": "c1", "group": "dc-east", "status": "up",
                            "unknown_cause": null, "reported_at": 1_764_000_000_000u64,
                            "report_age_ms": 1200, "checked_age_ms": 1300,
                            "checked_at": 1_763_999_999_900u64,
                            "addresses": [{"address": "10.1.2.1", "status": "up",
                                "method": "tcp", "rtt_ms": 0.8, "error": null, "failure": null}],
                            "dns_error": null}],
                        "transitions": []}],
                        "total": 1, "page": 1, "per_page": 1, "pages": 1,
                        "counts": {"up": 1, "unhealthy": 0, "down": 0, "unknown": 0},
                        "version": 0, "epoch": "5f0c2a9e41d7b3c8"}))},
                    "400": error_ref("InvalidRequest")},
            }),
        },
        health,
    )
}

/// `GET /api/v1/health`: filtered, sorted and (when `page` or `per_page`
/// is given) paged; without them every row, as before paging existed.
pub(super) async fn health(
    State(a): State<Shared>,
    _: RequireScope<scope::Read>,
    Query(raw): Query<crate::api::listing::RawQuery>,
) -> Response {
    let q = match crate::api::listing::ListQuery::parse(&raw) {
        Ok(q) => q,
        Err(e) => return e.into_response(),
    };
    // Read before the table: a transition after it shows in the stream.
    let version = a.history().version();
    let epoch = a.history().epoch_text();
    // Cheap rows first; views only for the page's rows.
    let rows = api::views::rows(
        &a,
        &crate::api::views::RowFilter {
            segment: q.segment.as_deref(),
            group: q.group.as_deref(),
            connector: q.connector.as_deref(),
        },
    );
    let mut page = crate::api::listing::run(rows, &q);
    let views = api::views::views(
        &a,
        std::mem::take(&mut page.rows).into_iter().map(|r| r.item),
    );
    let Some(mut views) = noted_unconnected(&a, views).await else {
        return shutting_down();
    };
    if q.summary {
        for v in &mut views {
            v.summarise();
        }
    }
    axum::Json(HealthBody {
        listing: crate::api::body::Listing::new(page, views),
        version,
        epoch,
    })
    .into_response()
}

#[derive(Debug, Deserialize)]
pub(super) struct AppQuery {
    segment: Option<String>,
    host: Option<String>,
    protocol: Option<String>,
    port: Option<String>,
}

/// `GET /api/v1/application`, served by `application`, and its document.
pub(super) fn application_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/application",
            auth: Auth::Scope(Scope::Read),
            spec: json!({
                "operationId": "getApplication",
                "summary": "One row of the health listing (port 0 for a wildcard or subnet entry's row)",
                "tags": ["health"],
                "parameters": [
                    {"name": "segment", "in": "query", "required": true, "description": "segment name", "schema": {"type": "string", "minLength": 1}},
                    {"name": "host", "in": "query", "required": true, "description": "host (FQDN, IP, or the entry of a wildcard/subnet row)", "schema": {"type": "string", "minLength": 1}},
                    query_param("protocol", true, "tcp or udp"),
                    query_param("port", true, "0 for a wildcard or subnet entry's row"),
                ],
                "responses": {
                    "200": {"description": "the application, and each connector's smoothed RTT to it over the last hour",
                        "content": json_body("ApplicationBody", json!({"application": {
                            "segment": "jira", "host": "jira.example.com", "protocol": "tcp", "port": 443,
                            "health_reporting": "continuous", "status": "up", "connectors": [], "transitions": []},
                            "rtt_series": [{"connector": "c1", "start": 1_764_000_000_000u64, "interval_ms": 60000,
                                "rtt_ms": [4.2, null, 4.5]}],
                            "version": 12, "epoch": "5f0c2a9e41d7b3c8"}))},
                    "400": error_ref("InvalidRequest"),
                    "404": not_found("application"),
                },
            }),
        },
        application,
    )
}

/// `GET /api/v1/application?segment=&host=&protocol=&port=`: one row of
/// the listing (port 0 for a wildcard or subnet entry's row).
pub(super) async fn application(
    State(a): State<Shared>,
    _: RequireScope<scope::Read>,
    Query(q): Query<AppQuery>,
) -> Response {
    let missing = |name: &str| {
        ApiError::InvalidRequest(format!(
            "{name}: missing (segment, host, protocol and port are required)"
        ))
        .into_response()
    };
    let Some(segment) = q.segment.filter(|s| !s.is_empty()) else {
        return missing("segment");
    };
    let Some(host) = q.host.filter(|s| !s.is_empty()) else {
        return missing("host");
    };
    let Some(protocol) = q.protocol else {
        return missing("protocol");
    };
    let protocol = match crate::api::body::api_protocol(&protocol) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let Some(port) = q.port else {
        return missing("port");
    };
    let Ok(port) = port.parse::<u16>() else {
        return ApiError::InvalidRequest(format!(
            "port: {:?} is not a port (0-65535)",
            port.chars().take(16).collect::<String>()
        ))
        .into_response();
    };
    let host = policy::host::lookup_key(&host);
    // Read before the view: a transition after it shows in the stream.
    let version = a.history().version();
    let epoch = a.history().epoch_text();
    let row = api::views::rows(
        &a,
        &crate::api::views::RowFilter {
            segment: Some(&segment),
            ..Default::default()
        },
    )
    .into_iter()
    .find(|r| r.host == host && r.protocol == protocol && r.port == port);
    let key = match row.as_ref().map(|r| &r.item) {
        Some(crate::api::views::RowItem::App(key)) => Some(key.clone()),
        _ => None,
    };
    let views = row
        .map(|r| api::views::views(&a, [r.item]))
        .unwrap_or_default();
    let Some(mut views) = noted_unconnected(&a, views).await else {
        return shutting_down();
    };
    match views.pop() {
        Some(application) => axum::Json(ApplicationBody {
            application,
            rtt_series: key
                .as_ref()
                .map(|k| api::views::rtt_series(&a, k))
                .unwrap_or_default(),
            address_history: key
                .map(|k| api::views::address_history(&a, &k))
                .unwrap_or_default(),
            version,
            epoch,
        })
        .into_response(),
        None => error_body(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such application (or it is hidden)",
            None,
        ),
    }
}

#[derive(Serialize)]
struct ConnectorCounts {
    total: usize,
    connected: usize,
    disconnected: usize,
    over_budget: usize,
    disabled: usize,
    drained: usize,
}

/// `GET /api/v1/overview`, served by `overview`, and its document.
pub(super) fn overview_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/overview",
            auth: Auth::Scope(Scope::Read),
            spec: json!({
                "operationId": "getOverview",
                "summary": "Counts by status of the applications, and of the connectors",
                "tags": ["health"],
                "responses": {"200": {"description": "the counts",
                    "content": {"application/json": {"schema": {"type": "object"},
                        "example": {"applications": {"up": 3, "unhealthy": 0, "down": 1, "unknown": 2},
                            "applications_total": 6,
                            "connectors": {"total": 2, "connected": 2, "disconnected": 0, "over_budget": 0, "disabled": 0, "drained": 0},
                            "check_budget": 6000, "version": 12, "epoch": "5f0c2a9e41d7b3c8"}}}},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable")},
            }),
        },
        overview,
    )
}

/// `GET /api/v1/overview`: counts by status of every visible application
/// and of the connectors.
pub(super) async fn overview(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
    let Some(connectors) = a.blocking(api::views::connectors).await else {
        return shutting_down();
    };
    let version = a.history().version();
    let rows = api::views::rows(&a, &crate::api::views::RowFilter::default());
    axum::Json(json!({
        "applications": crate::api::listing::Counts::of(rows.iter().map(|r| r.status)),
        "applications_total": rows.len(),
        "connectors": ConnectorCounts {
            total: connectors.len(),
            connected: connectors.iter().filter(|c| c.connected).count(),
            disconnected: connectors.iter().filter(|c| !c.connected).count(),
            // Over budget now: a disconnected connector's load is as of
            // when it was last seen.
            over_budget: connectors.iter().filter(|c| c.connected && c.over_budget).count(),
            disabled: connectors.iter().filter(|c| c.disabled).count(),
            drained: connectors.iter().filter(|c| c.drained.is_some()).count(),
        },
        "check_budget": a.snapshot().settings().check_budget,
        "version": version,
        "epoch": a.history().epoch_text(),
    }))
    .into_response()
}
