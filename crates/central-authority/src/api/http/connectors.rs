//! Connectors: `GET /api/v1/connectors`, `GET /api/v1/load` and the admin
//! actions `POST /api/v1/connectors/{name}/{disable,enable,revoke,allow-reenroll}`
//! and `DELETE /api/v1/connectors/{name}`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api::body::{ConnectorsBody, LoadBody, error_body};
use crate::state::authority::Authority;

use super::Shared;
use super::audited::audited;
use super::extract::{Caller, RequireScope, caller_is_admin, scope};
use super::respond::{found_or_404, shutting_down};

pub(super) async fn connectors(
    State(a): State<Shared>,
    headers: axum::http::HeaderMap,
    _: RequireScope<scope::Read>,
) -> Response {
    let admin = caller_is_admin(&a, &headers).await;
    // Enrolled connectors come from the database: off the async workers.
    match a.blocking(Authority::connectors).await {
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

/// `GET /api/v1/load`: each connector's check-load estimate over the last
/// day against the budget.
pub(super) async fn load(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
    axum::Json(LoadBody {
        check_budget: a.snapshot().settings().check_budget,
        connectors: a.load_series(),
    })
    .into_response()
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
                a.set_connector_disabled(&name, true)
                    .map(|found| found.then(|| json!({ "name": body, "disabled": true })))
            })
            .await
        }
        "enable" => {
            audited(&a, caller, "connector.enable", target, move |a| {
                a.set_connector_disabled(&name, false)
                    .map(|found| found.then(|| json!({ "name": body, "disabled": false })))
            })
            .await
        }
        "revoke" => {
            audited(&a, caller, "connector.revoke", target, move |a| {
                a.revoke_connector(&name)
                    .map(|n| n.map(|n| json!({ "name": body, "certificates_revoked": n })))
            })
            .await
        }
        "allow-reenroll" => {
            audited(&a, caller, "connector.allow-reenroll", target, move |a| {
                a.allow_reenroll(&name).map(|found| {
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
        a.delete_connector(&name).map(|n| {
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
