//! The health listing: `GET /api/v1/health`, `/api/v1/application` and
//! `/api/v1/overview`.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::api::body::{ApplicationBody, HealthBody, error_body};
use crate::error::ApiError;
use crate::state::authority::Authority;

use super::Shared;
use super::extract::{RequireScope, scope};
use super::respond::shutting_down;

/// `views` with `enrolled_unconnected` set (`Authority::note_unconnected`,
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
        a.note_unconnected(&mut views);
        views
    })
    .await
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
    let rows = a.rows(&crate::api::views::RowFilter {
        segment: q.segment.as_deref(),
        group: q.group.as_deref(),
        connector: q.connector.as_deref(),
    });
    let mut page = crate::api::listing::run(rows, &q);
    let views = a.views(std::mem::take(&mut page.rows).into_iter().map(|r| r.item));
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
    let row = a
        .rows(&crate::api::views::RowFilter {
            segment: Some(&segment),
            ..Default::default()
        })
        .into_iter()
        .find(|r| r.host == host && r.protocol == protocol && r.port == port);
    let key = match row.as_ref().map(|r| &r.item) {
        Some(crate::api::views::RowItem::App(key)) => Some(key.clone()),
        _ => None,
    };
    let views = row.map(|r| a.views([r.item])).unwrap_or_default();
    let Some(mut views) = noted_unconnected(&a, views).await else {
        return shutting_down();
    };
    match views.pop() {
        Some(application) => axum::Json(ApplicationBody {
            application,
            rtt_series: key.as_ref().map(|k| a.rtt_series(k)).unwrap_or_default(),
            address_history: key.map(|k| a.address_history(&k)).unwrap_or_default(),
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

/// `GET /api/v1/overview`: counts by status of every visible application
/// and of the connectors.
pub(super) async fn overview(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
    let Some(connectors) = a.blocking(Authority::connectors).await else {
        return shutting_down();
    };
    let version = a.history().version();
    let rows = a.rows(&crate::api::views::RowFilter::default());
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
