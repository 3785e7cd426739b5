//! The admin API's other resources: provisioning keys
//! (`/api/v1/provisioning_keys`), people's sessions (`/api/v1/sessions`)
//! and the log receivers' state (`/api/v1/log_receivers`).

use crate::trust;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::api::route::{
    Auth, Method, Op, Route, error_ref, json_body, name_param, not_found, route,
};
use crate::credentials::auth::Scope;

use super::Shared;
use super::audited::audited;
use super::extract::{Caller, RequireScope, scope};
use super::respond::{admin, found_or_404};

/// `GET /api/v1/provisioning_keys`, served by `keys`, and its document.
pub(super) fn keys_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/provisioning_keys",
            auth: Auth::Scope(Scope::Admin),
            spec: json!({
                "operationId": "listProvisioningKeys",
                "summary": "Each group's provisioning key: uses, expiry, revocation (never the key)",
                "tags": ["admin"],
                "responses": {
                    "200": {"description": "one entry per connector group",
                        "content": json_body("ProvisioningKeysBody", json!({"provisioning_keys": [{
                            "group": "dc-east", "uses": 1, "max_uses": 10, "expires_at": null,
                            "revoked_at": null, "last_used_at": 1_764_000_000_000u64, "usable": true}]}))},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        keys,
    )
}

pub(super) async fn keys(State(a): State<Shared>, _: RequireScope<scope::Admin>) -> Response {
    match admin(&a, trust::enroll::provisioning_keys).await {
        Ok(keys) => axum::Json(json!({ "provisioning_keys": keys })).into_response(),
        Err(response) => response,
    }
}

/// `POST /api/v1/provisioning_keys/{group}/revoke`, served by `revoke_key`, and its document.
pub(super) fn revoke_key_route() -> Route {
    route(
        Op {
            method: Method::Post,
            path: "/api/v1/provisioning_keys/{group}/revoke",
            auth: Auth::Scope(Scope::Admin),
            spec: json!({
                "operationId": "revokeProvisioningKey",
                "summary": "Revoke a group's provisioning key (no more enrollments with it)",
                "tags": ["admin"],
                "parameters": [name_param("group", "connector group")],
                "responses": {
                    "200": {"description": "revoked",
                        "content": json_body("KeyRevokedBody", json!({"group": "dc-east", "revoked": true}))},
                    "404": not_found("connector group"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        revoke_key,
    )
}

pub(super) async fn revoke_key(
    State(a): State<Shared>,
    Path(group): Path<String>,
    caller: Caller,
) -> Response {
    let revoke = group.clone();
    let answer = json!({ "group": group, "revoked": true });
    let done = audited(
        &a,
        caller,
        "provisioning_key.revoke",
        group.clone(),
        move |a| {
            trust::enroll::revoke_provisioning_key(a, &revoke).map(|found| found.then_some(answer))
        },
    )
    .await;
    found_or_404(
        done,
        format!(
            "no connector group {:?}",
            group.chars().take(128).collect::<String>()
        ),
    )
}

/// `GET /api/v1/sessions`, served by `sessions`, and its document.
pub(super) fn sessions_route() -> Route {
    let session = json!({"type": "object", "properties": {
        "id": {"type": "string", "description": "SHA-256 (hex) of the session id; not a credential"},
        "person": {"type": "string"}, "provider": {"type": "string"},
        "subject": {"type": "string", "description": "the person's `sub` at the provider (empty for a session a 0.1.0 CA opened)"},
        "scopes": {"type": "array", "items": {"type": "string"}, "description": "what the person's roles map to now"},
        "created_at": {"type": "integer", "description": "Unix ms"},
        "expires_at": {"type": "integer", "description": "Unix ms"},
        "checked_at": {"type": "integer", "description": "Unix ms: when the provider last confirmed it"}}});
    let example = json!({"id": "5f1c…", "person": "alice", "provider": "corp",
        "subject": "248289761001", "scopes": ["admin"], "created_at": 1_764_000_000_000u64,
        "expires_at": 1_764_028_800_000u64, "checked_at": 1_764_000_300_000u64});
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/sessions",
            auth: Auth::Scope(Scope::Admin),
            spec: json!({
                "operationId": "listSessions",
                "summary": "People's live sessions, newest first",
                "description": "Every replica's: sessions are kept in the store. Each is confirmed with its provider every `[[oidc]] revalidate_s` at its next request; `scopes` are its roles claim's values mapped by the roles as configured now.",
                "tags": ["admin"],
                "responses": {
                    "200": {"description": "the live sessions",
                        "content": {"application/json": {"schema": {"type": "object", "properties": {
                            "sessions": {"type": "array", "items": session}}},
                            "example": {"sessions": [example]}}}},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        sessions,
    )
}

/// `GET /api/v1/sessions`: people's live sessions, newest first, with
/// the scopes their roles map to now.
pub(super) async fn sessions(State(a): State<Shared>, _: RequireScope<scope::Admin>) -> Response {
    let now = crate::ground::clock::now_ms();
    let records = match admin(&a, move |a| a.store().sessions(now)).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    let snapshot = a.snapshot();
    let providers = &snapshot.config.oidc;
    let rows: Vec<serde_json::Value> = records
        .iter()
        .map(|r| {
            let scopes: Vec<&str> = providers
                .iter()
                .find(|p| p.name == r.provider)
                .map(|p| crate::api::sessions::scopes_of(p, r))
                .unwrap_or_default()
                .iter()
                .map(|s| s.as_str())
                .collect();
            json!({
                "id": r.id_sha256,
                "person": r.person,
                "provider": r.provider,
                "subject": r.subject,
                "scopes": scopes,
                "created_at": r.created_ms,
                "expires_at": r.expires_ms,
                "checked_at": r.checked_ms,
            })
        })
        .collect();
    axum::Json(json!({ "sessions": rows })).into_response()
}

/// `DELETE /api/v1/sessions/{id}`, served by `end_session`, and its document.
pub(super) fn end_session_route() -> Route {
    route(
        Op {
            method: Method::Delete,
            path: "/api/v1/sessions/{id}",
            auth: Auth::Scope(Scope::Admin),
            spec: json!({
                "operationId": "endSession",
                "summary": "End a person's session on every replica; its next request is refused (401)",
                "description": "Recorded in the audit trail (`session.end`), also when refused or not found.",
                "tags": ["admin"],
                "parameters": [{"name": "id", "in": "path", "required": true,
                    "description": "the session's `id` from `GET /api/v1/sessions`",
                    "schema": {"type": "string"}}],
                "responses": {
                    "200": {"description": "ended",
                        "content": {"application/json": {"schema": {"type": "object", "properties": {
                            "id": {"type": "string"}, "person": {"type": "string"}, "ended": {"type": "boolean"}}},
                            "example": {"id": "5f1c…", "person": "bob", "ended": true}}}},
                    "404": {"description": "no such live session (reason `not_found`)",
                        "content": json_body("Error", json!({"error": {"reason": "not_found",
                            "message": "no live session \"x\""}}))},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        end_session,
    )
}

/// `DELETE /api/v1/sessions/{id}`: ends a person's session on every
/// replica (audited `session.end`).
pub(super) async fn end_session(
    State(a): State<Shared>,
    Path(id): Path<String>,
    caller: Caller,
) -> Response {
    let shown: String = id.chars().take(128).collect();
    let target = shown.clone();
    let now = crate::ground::clock::now_ms();
    let done = audited(&a, caller, "session.end", target, move |a| {
        let Some(r) = a.store().session(&id)? else {
            return Ok(None);
        };
        let ended = a.store().revoke_session(&id, now)?;
        Ok(ended.then(|| json!({ "id": id, "person": r.person, "ended": true })))
    })
    .await;
    found_or_404(done, format!("no live session {shown:?}"))
}

/// `GET /api/v1/log_receivers`, served by `log_receivers`, and its document.
pub(super) fn log_receivers_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/log_receivers",
            auth: Auth::Scope(Scope::Admin),
            spec: json!({
                "operationId": "listLogReceivers",
                "summary": "The log receivers (`[[log_receivers]]`) this replica streams to: connection, spool, records sent and dropped, last error",
                "description": "Each replica streams the records it wrote itself (its access decisions, the transitions it appended to the history, its sessions' connector status, its audit entries) to every receiver, so each replica answers for its own streams. Counters start at 0 when the replica starts; a record sent again after a broken connection counts again.",
                "tags": ["operations"],
                "responses": {
                    "200": {"description": "every receiver in force, in configuration order",
                        "content": json_body("LogReceiversBody", json!({"replica": "ca-1", "log_receivers": [{
                            "name": "siem", "destination": "tls://siem.example:6514", "format": "syslog",
                            "types": ["connector_status", "health", "access", "audit"],
                            "connected": true, "spool_bytes": 4096, "spool_records": 12,
                            "sent_total": 1520, "dropped_total": 0, "last_error": null,
                            "last_error_unix_ms": null, "last_sent_unix_ms": 1_764_000_005_000u64}]}))},
                },
            }),
        },
        log_receivers,
    )
}

/// `GET /api/v1/log_receivers`: this replica's log receivers and their
/// state.
pub(super) async fn log_receivers(
    State(a): State<Shared>,
    _: RequireScope<scope::Admin>,
) -> Response {
    axum::Json(crate::api::openapi::LogReceiversBody {
        replica: a.replica_id().map(str::to_owned),
        log_receivers: a
            .log_stream()
            .states()
            .into_iter()
            .map(crate::api::openapi::LogReceiverView::from)
            .collect(),
    })
    .into_response()
}
