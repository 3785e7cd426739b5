//! Connectors: `GET /api/v1/connectors`, `GET /api/v1/load` and the admin
//! actions `POST /api/v1/connectors/{name}/{disable,enable,revoke,allow-reenroll}`
//! and `DELETE /api/v1/connectors/{name}`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api;
use crate::api::body::{ConnectorsBody, LoadBody, error_body};
use crate::api::route::{
    Auth, Method, Op, Route, error_ref, json_body, name_param, not_found, route,
};
use crate::credentials::auth::Scope;
use crate::trust;

use super::Shared;
use super::audited::audited;
use super::extract::{Caller, RequireScope, caller_is_admin, scope};
use super::respond::{found_or_404, shutting_down};

/// `GET /api/v1/connectors`, served by `connectors`, and its document.
pub(super) fn connectors_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/connectors",
            auth: Auth::Scope(Scope::Read),
            spec: json!({
                "operationId": "listConnectors",
                "summary": "Every known connector: session, check load, budget, enrollment, drain",
                "description": "`session_id`, `version` and `certificate_serial` only for an `admin` token.",
                "tags": ["connectors"],
                "responses": {"200": {"description": "the connectors, sorted by name",
                    "content": json_body("ConnectorsBody", json!({"check_budget": 6000, "connectors": [{
                        "name": "c1", "group": "dc-east", "connected": true,
                        "checks_per_cycle": 6, "cycle_seconds": 0.3, "over_budget": false,
                        "check_budget": 6000, "load": null, "connected_since": 1_764_000_000_000u64,
                        "last_seen": 1_764_000_005_000u64, "enrolled": true, "disabled": false,
                        "drained": {"since": 1_764_000_003_000u64, "by": {"kind": "token", "name": "ops"}, "until": null},
                        "certificate_not_after": 1_795_536_000_000u64, "certificates": []}]}))}},
            }),
        },
        connectors,
    )
}

pub(super) async fn connectors(
    State(a): State<Shared>,
    headers: axum::http::HeaderMap,
    _: RequireScope<scope::Read>,
) -> Response {
    let admin = caller_is_admin(&a, &headers).await;
    // Enrolled connectors come from the database: off the async workers.
    match a.blocking(api::views::connectors).await {
        Some(connectors) => axum::Json(ConnectorsBody {
            connectors: connectors
                .into_iter()
                .map(|c| if admin { c } else { c.without_admin_fields() })
                .collect(),
            check_budget: a.snapshot().settings().check_budget,
        })
        .into_response(),
        None => shutting_down(),
    }
}

/// `GET /api/v1/load`, served by `load`, and its document.
pub(super) fn load_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/load",
            auth: Auth::Scope(Scope::Read),
            spec: json!({
                "operationId": "getLoad",
                "summary": "Each connector's check-load estimate over the last day against the budget",
                "description": "One value per five minutes (the highest estimate of checks per cycle in it), at most 288 per connector, kept in memory by this CA process since it started.",
                "tags": ["connectors"],
                "responses": {"200": {"description": "the series, sorted by connector name",
                    "content": json_body("LoadBody", json!({"check_budget": 6000, "connectors": [{
                        "connector": "c1", "start": 1_764_000_000_000u64, "interval_ms": 300_000,
                        "checks_per_cycle": [6, 6, null, 8]}]}))}},
            }),
        },
        load,
    )
}

/// `GET /api/v1/load`: each connector's check-load estimate over the last
/// day against the budget.
pub(super) async fn load(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
    axum::Json(LoadBody {
        check_budget: a.snapshot().settings().check_budget,
        connectors: api::views::load_series(&a),
    })
    .into_response()
}

/// `POST /api/v1/connectors/{name}/{action}`, served by `connector_action`, and its document.
pub(super) fn connector_action_route() -> Route {
    route(
        Op {
            method: Method::Post,
            path: "/api/v1/connectors/{name}/{action}",
            auth: Auth::Scope(Scope::Admin),
            spec: json!({
                "operationId": "connectorAction",
                "summary": "Disable, enable, revoke a connector, or allow it to re-enroll",
                "description": "`disable` ends its session; it can neither reconnect nor re-enroll. `enable` undoes that. `revoke` revokes its certificates and ends its session. `allow-reenroll`: the next enrollment of that name with its group's key is allowed although it holds a valid certificate (once, within 15 minutes).",
                "tags": ["admin"],
                "parameters": [
                    name_param("name", "enrolled connector"),
                    {"name": "action", "in": "path", "required": true,
                     "schema": {"type": "string", "enum": ["disable", "enable", "revoke", "allow-reenroll"]}},
                ],
                "responses": {
                    "200": {"description": "done; the fields depend on the action",
                        "content": json_body("ConnectorActionBody", json!({"name": "c1", "disabled": true}))},
                    "404": not_found("enrolled connector (or unknown action)"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        connector_action,
    )
}

pub(super) async fn connector_action(
    State(a): State<Shared>,
    Path((name, action)): Path<(String, String)>,
    caller: Caller,
) -> Response {
    let shown: String = name.chars().take(128).collect();
    let body = shown.clone();
    let target = name.clone();
    let result = match action.as_str() {
        _ if caller.refused.is_some() && !ACTIONS.contains(&action.as_str()) => {
            return caller
                .refused
                .map_or_else(shutting_down, IntoResponse::into_response);
        }
        "disable" => {
            audited(&a, caller, "connector.disable", target, move |a| {
                trust::enroll::set_connector_disabled(a, &name, true)
                    .map(|found| found.then(|| json!({ "name": body, "disabled": true })))
            })
            .await
        }
        "enable" => {
            audited(&a, caller, "connector.enable", target, move |a| {
                trust::enroll::set_connector_disabled(a, &name, false)
                    .map(|found| found.then(|| json!({ "name": body, "disabled": false })))
            })
            .await
        }
        "revoke" => {
            audited(&a, caller, "connector.revoke", target, move |a| {
                trust::enroll::revoke_connector(a, &name)
                    .map(|n| n.map(|n| json!({ "name": body, "certificates_revoked": n })))
            })
            .await
        }
        "allow-reenroll" => {
            audited(&a, caller, "connector.allow-reenroll", target, move |a| {
                trust::enroll::allow_reenroll(a, &name).map(|found| {
                    found.then(|| {
                    json!({
                        "name": body,
                        "reenroll_allowed_for_s": crate::trust::enroll::REENROLL_WINDOW.as_secs(),
                    })
                })
                })
            })
            .await
        }
        _ => {
            return error_body(
                StatusCode::NOT_FOUND,
                "not_found",
                "unknown action (expected disable, enable, revoke or allow-reenroll)",
                None,
            );
        }
    };
    found_or_404(result, format!("no enrolled connector {shown:?}"))
}

/// The actions of `POST /api/v1/connectors/{name}/{action}`.
const ACTIONS: [&str; 4] = ["disable", "enable", "revoke", "allow-reenroll"];

/// `DELETE /api/v1/connectors/{name}`, served by `delete_connector`, and its document.
pub(super) fn delete_connector_route() -> Route {
    route(
        Op {
            method: Method::Delete,
            path: "/api/v1/connectors/{name}",
            auth: Auth::Scope(Scope::Admin),
            spec: json!({
                "operationId": "deleteConnector",
                "summary": "Revoke a connector's certificates, end its session and forget it",
                "tags": ["admin"],
                "parameters": [name_param("name", "enrolled connector")],
                "responses": {
                    "200": {"description": "deleted; the name is free for any group",
                        "content": json_body("ConnectorDeletedBody",
                            json!({"name": "c1", "deleted": true, "certificates_revoked": 1}))},
                    "404": not_found("enrolled connector"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        delete_connector,
    )
}

/// `DELETE /api/v1/connectors/{name}`: revokes the connector's
/// certificates, ends its session and frees its name.
pub(super) async fn delete_connector(
    State(a): State<Shared>,
    Path(name): Path<String>,
    caller: Caller,
) -> Response {
    let shown: String = name.chars().take(128).collect();
    let body = shown.clone();
    let target = name.clone();
    let done = audited(&a, caller, "connector.delete", target, move |a| {
        trust::enroll::delete_connector(a, &name).map(|n| {
            n.map(|n| {
                json!({
                    "name": body,
                    "deleted": true,
                    "certificates_revoked": n,
                })
            })
        })
    })
    .await;
    found_or_404(done, format!("no enrolled connector {shown:?}"))
}
