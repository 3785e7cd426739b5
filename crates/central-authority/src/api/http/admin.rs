//! The admin API's other resources: provisioning keys
//! (`/api/v1/provisioning_keys`), people's sessions (`/api/v1/sessions`)
//! and the log receivers' state (`/api/v1/log_receivers`).

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::Shared;
use super::audited::audited;
use super::extract::{Caller, RequireScope, scope};
use super::respond::{admin, found_or_404};

pub(super) async fn keys(State(a): State<Shared>, _: RequireScope<scope::Admin>) -> Response {
    match admin(&a, |a| a.provisioning_keys()).await {
        Ok(keys) => axum::Json(json!({ "provisioning_keys": keys })).into_response(),
        Err(response) => response,
    }
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
            a.revoke_provisioning_key(&revoke)
                .map(|found| found.then_some(answer))
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
