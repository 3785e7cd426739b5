//! What operators and their tools read: `/metrics`, `/livez`, `/readyz`
//! (`/healthz`), the OpenAPI document, `/api/v1/replicas` and
//! `/api/v1/root`.

use std::time::Instant;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api::body::error_body;
use crate::state::authority::Authority;
use crate::state::warmup::Warmth;

use super::Shared;
use super::extract::{RequireScope, scope};
use super::respond::{admin, found_or_404, shutting_down, storage};

/// `GET /metrics`: OpenMetrics, or the classic Prometheus text format
/// (0.0.4) to a client whose `Accept` asks for `text/plain` and not
/// OpenMetrics (`promtool check metrics`, older scrapers).
pub(super) async fn metrics(
    State(a): State<Shared>,
    _: RequireScope<scope::Read>,
    headers: axum::http::HeaderMap,
) -> Response {
    let text = crate::api::metrics::scrape(&a);
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if crate::api::metrics::wants_classic_text(accept) {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            crate::api::metrics::classic_text(&text),
        )
            .into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response()
    }
}

/// `GET /livez`: liveness. `ok` while the process serves HTTP, whatever
/// its store or health table do: only a CA that stopped answering is to
/// be restarted.
pub(super) async fn livez() -> Response {
    "ok\n".into_response()
}

/// `GET /readyz` (and `/healthz`, its older name): readiness, whether this
/// replica decides access. `ok` once its policy is loaded (it is, from the
/// start) and its health table is warm. 503 `warming_up` after a start
/// until the connectors the store knows have re-attached and reported, at
/// most `[health] warmup_ms` (`state::warmup`): until then this replica
/// would answer `no_connector`. 503 `unavailable` while shutting down.
/// Once warm, a store outage does not make it unready: access decisions
/// need no store (its state shows in `/api/v1/replicas` and
/// `reach_ca_store_up`).
pub(super) async fn readyz(State(a): State<Shared>) -> Response {
    let now = Instant::now();
    match a.blocking(move |a: &Authority| warmth(a, now)).await {
        Some(Ok(Warmth::Warm)) => "ok\n".into_response(),
        Some(Ok(warming)) => error_body(
            StatusCode::SERVICE_UNAVAILABLE,
            "warming_up",
            &format!("not ready: {}", warming.message()),
            None,
        ),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "not ready: warming up, and the store does not answer");
            error_body(
                StatusCode::SERVICE_UNAVAILABLE,
                "warming_up",
                "not ready: warming up, and the store (database) that names the connectors to wait for does not answer",
                None,
            )
        }
        None => shutting_down(),
    }
}

/// Whether the health table is warm at `now` (see the module doc). Reads
/// the enrolled connectors from the store while warming up, never after.
fn warmth(a: &Authority, now: Instant) -> Result<Warmth, crate::store::StoreError> {
    let warmup = a.warmup();
    if warmup.is_warm() {
        return Ok(Warmth::Warm);
    }
    let state = a.snapshot();
    let policy = state.policy();
    let wall = crate::ground::clock::now_ms();
    let known = a.store().connectors()?;
    let expected = known.iter().filter(|c| {
        c.enrolled_ms < warmup.started_ms()
            && !c.disabled
            && c.serial.is_some()
            && c.not_after_ms.is_some_and(|t| t > wall)
            && policy.has_group(&c.group)
    });
    Ok(warmup.check(
        expected.map(|c| c.name.as_str()),
        state.settings().warmup,
        now,
    ))
}

/// `GET /api/v1/openapi.json`: the document (no token: it is public).
pub(super) async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::api::openapi::document_text(),
    )
        .into_response()
}

/// `GET /api/v1/replicas`: the CA replicas sharing this one's store, with
/// their last heartbeat and policy hash.
pub(super) async fn replicas(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
    // The store's state is what an administrator looks here for during an
    // outage: answered without the list when the store does not answer.
    let replicas = match a.blocking(|a| a.replicas(a.replica_id())).await {
        Some(Ok(replicas)) => replicas,
        Some(Err(e)) if e.is_unavailable() => Vec::new(),
        Some(Err(e)) => return storage(e),
        None => return shutting_down(),
    };
    axum::Json(json!({
        "this": a.replica_id(),
        "store": a.store().status(),
        "replicas": replicas,
    }))
    .into_response()
}

/// `GET /api/v1/root`: where a rotation of the issuing root stands.
pub(super) async fn root(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
    found_or_404(
        admin(&a, Authority::root_status).await,
        "this CA runs without TLS ([tls] enabled = false): it has no roots",
    )
}
