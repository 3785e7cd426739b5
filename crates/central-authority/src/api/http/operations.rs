//! What operators and their tools read: `/metrics`, `/livez`, `/readyz`
//! (`/healthz`), the OpenAPI document, `/api/v1/replicas` and
//! `/api/v1/root`.

use std::time::Instant;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api::body::error_body;
use crate::api::route::{Auth, Method, Op, Route, error_ref, json_body, route};
use crate::credentials::auth::Scope;
use crate::replicas;
use crate::state::authority::Authority;
use crate::state::warmup::Warmth;
use crate::trust;

use super::Shared;
use super::extract::{RequireScope, scope};
use super::respond::{admin, found_or_404, shutting_down, storage};

/// `GET /metrics`, served by `metrics`, and its document.
pub(super) fn metrics_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/metrics",
            auth: Auth::Scope(Scope::Read),
            spec: json!({
                "operationId": "metrics",
                "summary": "Prometheus metrics (OpenMetrics text)",
                "description": "OpenMetrics; the classic Prometheus text format (0.0.4) when `Accept` names `text/plain` and not OpenMetrics.",
                "tags": ["operations"],
                "responses": {"200": {"description": "the metrics",
                    "content": {"application/openmetrics-text": {"schema": {"type": "string"},
                        "example": "# TYPE reach_ca_connectors_connected gauge\nreach_ca_connectors_connected 1\n# EOF\n"},
                        "text/plain": {"schema": {"type": "string"},
                        "example": "# HELP reach_ca_reports_received_total Application health results accepted from connectors.\n# TYPE reach_ca_reports_received_total counter\nreach_ca_reports_received_total 1\n"}}}},
            }),
        },
        metrics,
    )
}

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

/// `GET /livez`, served by `livez`, and its document.
pub(super) fn livez_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/livez",
            auth: Auth::None,
            spec: json!({
                "operationId": "livez",
                "summary": "Liveness: `ok` while the process serves HTTP",
                "description": "Neither the store nor the health table is consulted: restart a CA only when this stops answering.",
                "tags": ["operations"],
                "responses": {"200": {"description": "alive",
                    "content": {"text/plain": {"schema": {"type": "string", "const": "ok\n"},
                        "example": "ok\n"}}}},
            }),
        },
        livez,
    )
}

/// `GET /livez`: liveness. `ok` while the process serves HTTP, whatever
/// its store or health table do: only a CA that stopped answering is to
/// be restarted.
pub(super) async fn livez() -> Response {
    "ok\n".into_response()
}

/// What `/readyz` (and `/healthz`) answer, for their documents.
const READYZ_DESCRIPTION: &str = "After a start, not ready (`warming_up`) until every connector the store knows (enrolled before the start, not disabled, with a valid certificate) has re-attached and sent its full state, or `[health] warmup_ms` (default 30 s) has passed; then ready for good as far as the warm-up goes. The message says how many connectors reported and names the first ones awaited. A store outage after the warm-up does not make a replica unready: access decisions need no store (see `store` in `/api/v1/replicas` and `reach_ca_store_up`). `unavailable` while the CA shuts down.";

/// `GET /readyz`, served by `readyz`, and its document.
pub(super) fn readyz_route() -> Route {
    readiness_route(
        "/readyz",
        "readyz",
        "Readiness: `ok` while this replica decides access (policy loaded, health table warm)",
    )
}

/// `GET /healthz`, served by `readyz`, and its document.
pub(super) fn healthz_route() -> Route {
    readiness_route(
        "/healthz",
        "healthz",
        "`/readyz` under its older name (kept for existing probes)",
    )
}

/// A readiness route at `path`, served by `readyz`: its document differs
/// from the other's only by its id and summary.
fn readiness_route(path: &'static str, id: &str, summary: &str) -> Route {
    route(
        Op {
            method: Method::Get,
            path,
            auth: Auth::None,
            spec: json!({
                "operationId": id,
                "summary": summary,
                "description": READYZ_DESCRIPTION,
                "tags": ["operations"],
                "responses": {"200": {"description": "ready",
                    "content": {"text/plain": {"schema": {"type": "string", "const": "ok\n"},
                        "example": "ok\n"}}},
                    "503": error_ref("NotReady")},
            }),
        },
        readyz,
    )
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

/// `GET /api/v1/openapi.json`, served by `openapi`, and its document.
pub(super) fn openapi_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/openapi.json",
            auth: Auth::None,
            spec: json!({
                "operationId": "openapi",
                "summary": "This document",
                "tags": ["operations"],
                "responses": {"200": {"description": "the OpenAPI 3.1 document",
                    "content": {"application/json": {"schema": {"type": "object"}}}}},
            }),
        },
        openapi,
    )
}

/// `GET /api/v1/openapi.json`: the document (no token: it is public).
pub(super) async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        super::openapi_text(),
    )
        .into_response()
}

/// `GET /api/v1/replicas`, served by `replicas`, and its document.
pub(super) fn replicas_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/replicas",
            auth: Auth::Scope(Scope::Read),
            spec: json!({
                "operationId": "listReplicas",
                "summary": "The CA replicas sharing this one's store: heartbeat, version, policy hash; and whether the store answers",
                "description": "Answers while the store does not: `store.up` is then false and `replicas` empty (this replica keeps deciding access; enrollment, renewal, new connector sessions and admin changes are refused with `store_unavailable` until the store is back). `reach_ca_store_up` is the same signal for Prometheus.",
                "tags": ["operations"],
                "responses": {
                    "200": {"description": "the store's state and every replica it knows",
                        "content": json_body("ReplicasBody", json!({"this": "ca-1",
                            "store": {"backend": "postgres", "up": true, "since": 1_764_000_000_000u64,
                                "checked_at": 1_764_000_005_000u64, "message": "the store answers"},
                            "replicas": [{
                            "id": "ca-1", "addresses": ["10.0.0.1:7443"], "version": "0.1.0",
                            "started_at": 1_764_000_000_000u64, "last_heartbeat": 1_764_000_005_000u64,
                            "policy_hash": "3f2a…", "live": true, "this": true}]}))},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        replicas,
    )
}

/// `GET /api/v1/replicas`: the CA replicas sharing this one's store, with
/// their last heartbeat and policy hash.
pub(super) async fn replicas(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
    // The store's state is what an administrator looks here for during an
    // outage: answered without the list when the store does not answer.
    let replicas = match a.blocking(|a| replicas::replicas(a, a.replica_id())).await {
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

/// `GET /api/v1/root`, served by `root`, and its document.
pub(super) fn root_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/root",
            auth: Auth::Scope(Scope::Read),
            spec: json!({
                "operationId": "rootRotation",
                "summary": "Where a rotation of the issuing root stands: the trusted roots, the phase, the connectors still on the old root",
                "description": "A rotation is three reloads of every replica's `[tls]`: introduce (`next_root_file`), switch (`issuer_*_file` name the new root, `previous_root_file` the old one) and retire (`previous_root_file` removed). `on_old_root` lists the enrolled connectors whose current certificate is not from the new root (from the store: the same on every replica); retire once it is empty. `without_trust_bundle` lists the connectors connected to this replica that do not keep the trust bundle the CA sends: the root file they trust must hold the new root before the switch.",
                "tags": ["operations"],
                "responses": {
                    "200": {"description": "the roots, the phase and the connectors still on the old root",
                        "content": json_body("RootStatus", json!({"phase": "switch",
                            "roots": [
                                {"role": "issuing", "fingerprint": "9b1c…", "subject": "O=reach, CN=reach central authority root", "not_after": 2_395_000_000_000u64},
                                {"role": "previous", "fingerprint": "41e7…", "subject": "O=reach, CN=reach central authority root", "not_after": 2_390_000_000_000u64}],
                            "on_old_root": [{"name": "c7", "group": "dc-east", "disabled": false,
                                "root": "41e7…", "certificate_not_after": 1_765_000_000_000u64}],
                            "without_trust_bundle": []}))},
                    "404": {"description": "the CA runs without TLS (reason `not_found`)",
                        "content": json_body("Error", json!({"error": {"reason": "not_found",
                            "message": "this CA runs without TLS ([tls] enabled = false): it has no roots"}}))},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        root,
    )
}

/// `GET /api/v1/root`: where a rotation of the issuing root stands.
pub(super) async fn root(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
    found_or_404(
        admin(&a, trust::rotation::root_status).await,
        "this CA runs without TLS ([tls] enabled = false): it has no roots",
    )
}
