//! Drains: `POST /api/v1/connectors/{name}/{drain,undrain}` and what
//! draining would do, `GET /api/v1/whatif`.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::api::body::error_body;
use crate::error::ApiError;

use super::Shared;
use super::audited::{Acted, audited, audited_as};
use super::extract::{Caller, RequireScope, caller_is_admin, scope};
use super::respond::{found_or_404, shutting_down, storage};

/// `?force=` of `POST /api/v1/connectors/{name}/drain`.
#[derive(Debug, Deserialize)]
pub(super) struct DrainQuery {
    force: Option<String>,
}

/// `POST /api/v1/connectors/{name}/drain`: the connector is selected for
/// no new access on every replica (its session and reports go on); refused
/// (409 `last_healthy_connector`, with what it would strand) when an
/// application would be left without a healthy, undrained connector,
/// unless `force=true`.
pub(super) async fn drain_connector(
    State(a): State<Shared>,
    Path(name): Path<String>,
    Query(q): Query<DrainQuery>,
    caller: Caller,
) -> Response {
    use crate::access::drain::DrainAnswer;
    let force = match q.force.as_deref() {
        None | Some("" | "false") => false,
        Some("true") => true,
        Some(other) => {
            return ApiError::InvalidRequest(format!(
                "force: {:?} is neither true nor false",
                other.chars().take(16).collect::<String>()
            ))
            .into_response();
        }
    };
    let shown: String = name.chars().take(128).collect();
    let (actor, body, target) = (caller.actor.clone(), shown.clone(), name.clone());
    let done = audited_as(&a, caller, "connector.drain", target, move |a| {
        Ok(match a.drain_connector(&name, &actor, force)? {
            DrainAnswer::NotFound => Acted::NotFound,
            DrainAnswer::Refused(whatif) => drain_refused(&body, whatif),
            DrainAnswer::Drained {
                record,
                already,
                whatif,
            } => Acted::Done(json!({
                "name": body,
                "drained": true,
                "already": already,
                "since": record.since_ms,
                "by": {"kind": record.actor_kind, "name": record.actor},
                "forced": force && whatif.stranded > 0,
                "stranded": whatif.stranded,
            })),
        })
    })
    .await;
    admin_answer(done, &shown)
}

/// A drain declined because it would leave applications without a
/// healthy, undrained connector: 409 naming them, with the whole answer
/// of `GET /api/v1/whatif` for the connector.
fn drain_refused(name: &str, whatif: crate::access::drain::WhatIfView) -> Acted {
    let lines = crate::access::drain::stranded_lines(&whatif);
    let message = format!(
        "draining {name:?} would leave {} application(s) without a healthy, undrained connector: {}; force it (CLI --force, API ?force=true) to drain anyway",
        whatif.stranded,
        lines.join("; ")
    );
    let answer = (
        StatusCode::CONFLICT,
        axum::Json(json!({
            "error": {"reason": "last_healthy_connector", "message": message},
            "whatif": whatif,
        })),
    )
        .into_response();
    Acted::Declined(answer, message)
}

/// `POST /api/v1/connectors/{name}/undrain`: ends an administrator's
/// drain on every replica.
pub(super) async fn undrain_connector(
    State(a): State<Shared>,
    Path(name): Path<String>,
    caller: Caller,
) -> Response {
    let shown: String = name.chars().take(128).collect();
    let (body, target) = (shown.clone(), name.clone());
    let done = audited(&a, caller, "connector.undrain", target, move |a| {
        a.undrain_connector(&name)
            .map(|was| was.map(|was| json!({"name": body, "drained": false, "was_drained": was})))
    })
    .await;
    admin_answer(done, &shown)
}

/// The answer of a drain or undrain: its fields, or 404 for a connector
/// this CA does not know.
fn admin_answer(done: Result<Option<serde_json::Value>, Response>, shown: &str) -> Response {
    found_or_404(
        done,
        format!("no connector {shown:?} (enrolled, or connected since this CA started)"),
    )
}

/// `?without=` of `GET /api/v1/whatif`.
#[derive(Debug, Deserialize)]
pub(super) struct WhatIfQuery {
    without: Option<String>,
}

/// `GET /api/v1/whatif?without=NAME[,NAME…]`: which applications would
/// lose their last healthy, undrained connector without the named
/// connectors (a group's name: every connector of it). Changes nothing.
pub(super) async fn whatif(
    State(a): State<Shared>,
    headers: axum::http::HeaderMap,
    _: RequireScope<scope::Read>,
    Query(q): Query<WhatIfQuery>,
) -> Response {
    use crate::access::drain::WithoutError;
    let admin = caller_is_admin(&a, &headers).await;
    let Some(spec) = q.without.filter(|w| !w.trim().is_empty()) else {
        return ApiError::InvalidRequest(
            "without: name a connector or connector group (?without=NAME[,NAME…])".into(),
        )
        .into_response();
    };
    let answer = a
        .blocking(move |a| {
            a.resolve_without(&spec)
                .map(|r| r.map(|without| a.what_if(&without, admin)))
        })
        .await;
    match answer {
        Some(Ok(Ok(view))) => axum::Json(view).into_response(),
        Some(Ok(Err(e @ WithoutError::Unknown(_)))) => {
            error_body(StatusCode::NOT_FOUND, "not_found", &e.to_string(), None)
        }
        Some(Ok(Err(e))) => ApiError::InvalidRequest(e.to_string()).into_response(),
        Some(Err(e)) => storage(e),
        None => shutting_down(),
    }
}
