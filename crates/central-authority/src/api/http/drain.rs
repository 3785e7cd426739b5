//! Drains: `POST /api/v1/connectors/{name}/{drain,undrain}` and what
//! draining would do, `GET /api/v1/whatif`.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::access;
use crate::api::body::error_body;
use crate::api::route::{
    Auth, Method, Op, Route, error_ref, json_body, name_param, not_found, route,
};
use crate::credentials::auth::Scope;
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

/// `POST /api/v1/connectors/{name}/drain`, served by `drain_connector`, and its document.
pub(super) fn drain_connector_route() -> Route {
    route(
        Op {
            method: Method::Post,
            path: "/api/v1/connectors/{name}/drain",
            auth: Auth::Scope(Scope::Admin),
            spec: json!({
                "operationId": "drainConnector",
                "summary": "Drain a connector before maintenance: selected for no new access, on every replica",
                "description": "The connector keeps its session and reports; access decisions skip it (reason `drained` in their explanations) and on-access accesses are no longer forwarded to it. The drain is kept in the store: in force on this replica at once, on the others within a second (on PostgreSQL at once). Refused with 409 `last_healthy_connector` when an application would be left without a healthy (Up or Unhealthy), undrained connector by this replica's health table, naming them, unless `force=true`. Draining a drained connector changes nothing (`already`). Recorded in the audit trail (`connector.drain`), also when refused.",
                "tags": ["admin"],
                "parameters": [
                    name_param("name", "connector: enrolled, or connected since this CA started"),
                    {"name": "force", "in": "query", "required": false,
                     "description": "`true`: drain although applications are left without a healthy, undrained connector",
                     "schema": {"type": "string", "enum": ["true", "false", ""]}},
                ],
                "responses": {
                    "200": {"description": "drained",
                        "content": json_body("DrainedBody", json!({"name": "c1", "drained": true,
                            "already": false, "since": 1_764_000_000_000u64,
                            "by": {"kind": "token", "name": "ops"}, "forced": false, "stranded": 0}))},
                    "400": error_ref("InvalidRequest"),
                    "404": not_found("connector"),
                    "409": {"description": "not drained: applications would be left without a healthy, undrained connector (reason `last_healthy_connector`)",
                        "content": json_body("DrainRefusedBody", json!({
                            "error": {"reason": "last_healthy_connector",
                                "message": "draining \"c1\" would leave 1 application(s) without a healthy, undrained connector: jira: jira.lanukcorp.com:80/tcp; force it (CLI --force, API ?force=true) to drain anyway"},
                            "whatif": {"without": ["c1"], "stranded": 1, "hidden_stranded": 0,
                                "applications": [{"segment": "jira", "host": "jira.lanukcorp.com",
                                    "protocol": "tcp", "port": 80, "health_reporting": "continuous",
                                    "losing": ["c1"], "left": [], "stranded": true}]}}))},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        drain_connector,
    )
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
        Ok(
            match access::drain::drain_connector(a, &name, &actor, force)? {
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
            },
        )
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

/// `POST /api/v1/connectors/{name}/undrain`, served by `undrain_connector`, and its document.
pub(super) fn undrain_connector_route() -> Route {
    route(
        Op {
            method: Method::Post,
            path: "/api/v1/connectors/{name}/undrain",
            auth: Auth::Scope(Scope::Admin),
            spec: json!({
                "operationId": "undrainConnector",
                "summary": "End an administrator's drain of a connector, on every replica",
                "description": "A connector's own drain while it shuts down ends with its session, not here. Recorded in the audit trail (`connector.undrain`).",
                "tags": ["admin"],
                "parameters": [name_param("name", "connector: enrolled, drained, or connected since this CA started")],
                "responses": {
                    "200": {"description": "not drained (any more)",
                        "content": json_body("UndrainedBody",
                            json!({"name": "c1", "drained": false, "was_drained": true}))},
                    "404": not_found("connector"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        undrain_connector,
    )
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
        access::drain::undrain_connector(a, &name)
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

/// `GET /api/v1/whatif`, served by `whatif`, and its document.
pub(super) fn whatif_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/whatif",
            auth: Auth::Scope(Scope::Read),
            spec: json!({
                "operationId": "whatIf",
                "summary": "Which applications would lose their last healthy connector without these connectors",
                "description": "Changes nothing: the check to run before a maintenance window. `without` names connectors and connector groups (a group: every connector of it this replica knows), comma-separated; a name that is both says `connector:NAME` or `group:NAME`. An application counts when one of the named connectors carries it now: connected, undrained, Up or Unhealthy by this replica's health table (on-access applications while their window is live; a `none` segment's applications as one row, carried by every connected connector of its groups). Applications of segments with `client_hostname_validation = true` are listed only for callers with the `admin` scope, counted for everyone.",
                "tags": ["connectors"],
                "parameters": [
                    {"name": "without", "in": "query", "required": true,
                     "description": "connector or group names, comma-separated (at most 100)",
                     "schema": {"type": "string", "pattern": "^((connector:|group:)?[A-Za-z0-9_][A-Za-z0-9._-]{0,127})(,(connector:|group:)?[A-Za-z0-9_][A-Za-z0-9._-]{0,127})*$"}},
                ],
                "responses": {
                    "200": {"description": "what taking them away would do",
                        "content": json_body("WhatIfView", json!({"without": ["c1", "c2"],
                            "stranded": 1, "hidden_stranded": 0, "applications": [
                                {"segment": "jira", "host": "jira.lanukcorp.com", "protocol": "tcp",
                                 "port": 80, "health_reporting": "continuous",
                                 "losing": ["c1", "c2"], "left": [], "stranded": true},
                                {"segment": "legacy", "host": null, "protocol": null, "port": null,
                                 "health_reporting": "none", "losing": ["c1"], "left": ["c3"],
                                 "stranded": false}]}))},
                    "400": error_ref("InvalidRequest"),
                    "404": not_found("connector or connector group"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        whatif,
    )
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
            access::drain::resolve_without(a, &spec)
                .map(|r| r.map(|without| access::drain::what_if(a, &without, admin)))
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
