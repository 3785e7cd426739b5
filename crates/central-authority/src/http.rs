//! The HTTP surface (axum): the Health dashboard at `/`, the JSON API
//! (`/api/v1/health`, `/api/v1/connectors`, `POST /api/v1/access`),
//! `/metrics` and `/healthz`.
//!
//! Refusal reasons map to statuses as follows (also in docs/decisions.md):
//! `invalid_request` 400, `unauthorized` 401, `forbidden` 403,
//! `port_not_in_segment` 403, `no_segment` 404, and `no_connector`,
//! `all_down`, `no_health_report`, `discovery_timeout` 503.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use policy::{Protocol, RefusalReason};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;

use crate::access::{AccessRequest, ExplanationView, Refusal};
use crate::auth::{AuthError, Scope, authorize};
use crate::error::ApiError;
use crate::state::Authority;
use crate::views::{ApplicationView, ConnectorView};

type Shared = Arc<Authority>;

/// The router over shared state.
pub fn router(authority: Arc<Authority>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/api/v1/health", get(health))
        .route("/api/v1/connectors", get(connectors))
        .route("/api/v1/access", post(access))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .with_state(authority)
}

/// Serves the router on `listener` until `shutdown` resolves.
pub async fn serve(
    authority: Arc<Authority>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), crate::RunError> {
    axum::serve(listener, router(authority))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(crate::RunError::Http)
}

/// The HTTP status of a refusal reason.
pub fn refusal_status(reason: RefusalReason) -> StatusCode {
    match reason {
        RefusalReason::NoSegment => StatusCode::NOT_FOUND,
        RefusalReason::PortNotInSegment => StatusCode::FORBIDDEN,
        RefusalReason::NoConnector
        | RefusalReason::AllDown
        | RefusalReason::NoHealthReport
        | RefusalReason::DiscoveryTimeout => StatusCode::SERVICE_UNAVAILABLE,
    }
}

fn error_body(
    status: StatusCode,
    reason: &str,
    message: &str,
    extra: Option<serde_json::Value>,
) -> Response {
    let mut body = json!({"error": {"reason": reason, "message": message}});
    if let (Some(extra), Some(obj)) = (extra, body.as_object_mut()) {
        obj.insert("explanation".into(), extra);
    }
    (status, axum::Json(body)).into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let message = self.to_string();
        match self {
            ApiError::InvalidRequest(m) => {
                error_body(StatusCode::BAD_REQUEST, "invalid_request", &m, None)
            }
            ApiError::Auth(AuthError::MissingScope { .. }) => {
                error_body(StatusCode::FORBIDDEN, "forbidden", &message, None)
            }
            ApiError::Auth(_) => {
                let mut r = error_body(StatusCode::UNAUTHORIZED, "unauthorized", &message, None);
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer"),
                );
                r
            }
        }
    }
}

fn check(authority: &Authority, headers: &HeaderMap, scope: Scope) -> Result<(), ApiError> {
    let state = authority.snapshot();
    if scope == Scope::Read && state.settings().anonymous_read {
        return Ok(());
    }
    let header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    authorize(&state.config.tokens, header, scope)?;
    Ok(())
}

#[derive(Debug, Deserialize)]
struct SegmentFilter {
    segment: Option<String>,
}

#[derive(Serialize)]
struct HealthBody {
    applications: Vec<ApplicationView>,
}

async fn health(
    State(a): State<Shared>,
    headers: HeaderMap,
    Query(filter): Query<SegmentFilter>,
) -> Result<axum::Json<HealthBody>, ApiError> {
    check(&a, &headers, Scope::Read)?;
    Ok(axum::Json(HealthBody {
        applications: a.applications(filter.segment.as_deref()),
    }))
}

#[derive(Serialize)]
struct ConnectorsBody {
    connectors: Vec<ConnectorView>,
    check_budget: u64,
}

async fn connectors(
    State(a): State<Shared>,
    headers: HeaderMap,
) -> Result<axum::Json<ConnectorsBody>, ApiError> {
    check(&a, &headers, Scope::Read)?;
    Ok(axum::Json(ConnectorsBody {
        connectors: a.connectors(),
        check_budget: a.snapshot().settings().check_budget,
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AccessBody {
    host: String,
    protocol: String,
    port: i64,
}

#[derive(Serialize)]
struct SelectedBody {
    connector: String,
    group: String,
    segment: String,
    explanation: ExplanationView,
}

async fn access(State(a): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    match access_inner(&a, &headers, &body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn access_inner(
    a: &Authority,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    check(a, headers, Scope::Access)?;
    let body: AccessBody =
        serde_json::from_slice(body).map_err(|e| ApiError::InvalidRequest(format!("body: {e}")))?;
    let protocol = body
        .protocol
        .parse::<Protocol>()
        .map_err(|m| ApiError::InvalidRequest(format!("protocol: {m}")))?;
    let port = u32::try_from(body.port)
        .map_err(|_| ApiError::InvalidRequest(format!("port {} is outside 1-65535", body.port)))?;
    let outcome = a
        .resolve(AccessRequest {
            host: body.host,
            protocol,
            port,
        })
        .await?;
    Ok(match outcome.decision {
        Ok(s) => axum::Json(SelectedBody {
            connector: s.connector,
            group: s.group,
            segment: s.segment,
            explanation: outcome.explanation,
        })
        .into_response(),
        Err(Refusal { reason, message }) => error_body(
            refusal_status(reason),
            reason.as_str(),
            &message,
            serde_json::to_value(&outcome.explanation).ok(),
        ),
    })
}

async fn metrics(State(a): State<Shared>, headers: HeaderMap) -> Result<Response, ApiError> {
    check(&a, &headers, Scope::Read)?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        a.metrics().render(),
    )
        .into_response())
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn dashboard(State(a): State<Shared>, headers: HeaderMap) -> Result<Html<String>, ApiError> {
    check(&a, &headers, Scope::Read)?;
    Ok(Html(crate::dashboard::render(
        &a.applications(None),
        &a.connectors(),
        a.snapshot().settings().check_budget,
    )))
}
