//! People's sessions kept true to their provider (`api::auth` opens them):
//! a session's scopes are its roles claim's values mapped by the
//! provider's `roles` as configured at each request; every `revalidate_s`
//! its next request asks the provider again (`credentials::oidc`), and a refusal
//! ends it on every replica. `POST /auth/backchannel-logout` takes the
//! provider's logout token (OpenID Connect Back-Channel Logout 1.0) and
//! ends the sessions it names.
//!
//! The refresh (or access) token a session is re-validated with is stored
//! sealed (AES-256-GCM) with a key derived from the session id, which the
//! store never holds: a copy of the database gives no provider token, and
//! only a request carrying the cookie can use it.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::json;

use crate::api::route::{Auth, Method, Op, Route, error_ref, route};
use crate::credentials::auth::{AuthError, Scope};
use crate::credentials::oidc::{Credential, ProviderConfig, Verdict};
use crate::state::authority::Authority;
use crate::store::SessionRecord;
use crate::trust;

type Shared = Arc<Authority>;

/// The back-channel logout endpoint's path (the guard lets its form body
/// through).
pub const BACKCHANNEL_PATH: &str = "/auth/backchannel-logout";

/// Session `r` (live, presented with id `id`) as it stands: its record and
/// scopes now, re-validated with its provider when that is due; `None`
/// when it ended (refused by the provider, its provider no longer
/// configured, or no role of it mapped to a scope).
pub async fn standing(
    a: &Shared,
    id: &str,
    mut r: SessionRecord,
) -> Result<Option<(SessionRecord, Vec<Scope>)>, AuthError> {
    let provider = a
        .snapshot()
        .config
        .oidc
        .iter()
        .find(|p| p.name == r.provider)
        .cloned();
    let Some(p) = provider else {
        return Ok(None);
    };
    let now = crate::ground::clock::now_ms();
    let every = i64::try_from(p.revalidate_ms).unwrap_or(i64::MAX);
    if now.saturating_sub(r.checked_ms) >= every && !revalidate(a, &p, id, &mut r, now).await? {
        return Ok(None);
    }
    let scopes = scopes_of(&p, &r);
    if scopes.is_empty() {
        return Ok(None);
    }
    Ok(Some((r, scopes)))
}

/// The scopes session `r`'s roles are granted by provider `p`'s mapping.
pub fn scopes_of(p: &ProviderConfig, r: &SessionRecord) -> Vec<Scope> {
    let roles: Vec<String> = r
        .roles
        .as_deref()
        .and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_default();
    crate::credentials::oidc::scopes_for(&p.roles, &roles)
}

/// Asks the provider about session `r` (one replica and request does, the
/// one whose claim of the check wins; the others go on with the session as
/// it is); false when it refused and the session was ended.
async fn revalidate(
    a: &Shared,
    p: &ProviderConfig,
    id: &str,
    r: &mut SessionRecord,
    now: i64,
) -> Result<bool, AuthError> {
    let (hash, seen) = (r.id_sha256.clone(), r.checked_ms);
    match a
        .blocking(move |a| a.store().claim_session_check(&hash, seen, now))
        .await
    {
        Some(Ok(true)) => r.checked_ms = now,
        Some(Ok(false)) => return Ok(true),
        _ => return Err(AuthError::Unavailable),
    }
    let credential = r
        .refresh_sealed
        .as_deref()
        .and_then(|s| open(id, s))
        .and_then(|t| Credential::from_text(&t));
    let verdict = match credential {
        Some(c) if !r.subject.is_empty() => a.oidc().revalidate(p, &r.subject, &c).await,
        _ => Ok(Verdict::Refused(
            "the session holds no provider token to re-validate it with".into(),
        )),
    };
    match verdict {
        Ok(Verdict::Confirmed { roles, credential }) => {
            let roles = serde_json::Value::from(roles).to_string();
            let sealed = credential.and_then(|c| seal(id, &c.to_text()));
            r.roles = Some(roles.clone());
            let hash = r.id_sha256.clone();
            let stored = a
                .blocking(move |a| {
                    a.store()
                        .session_refreshed(&hash, &roles, sealed.as_deref())
                })
                .await;
            match stored {
                Some(Ok(())) => Ok(true),
                _ => Err(AuthError::Unavailable),
            }
        }
        Ok(Verdict::Refused(why)) => {
            end(a, r, &p.name, why).await?;
            Ok(false)
        }
        Err(e) => {
            // Not a refusal: the session stands until the next try.
            tracing::warn!(person = %r.person, provider = %p.name, error = %e,
                "session not re-validated: the provider did not answer");
            Ok(true)
        }
    }
}

/// Ends session `r` (on every replica), recording why in the audit trail.
async fn end(a: &Shared, r: &SessionRecord, provider: &str, why: String) -> Result<(), AuthError> {
    tracing::info!(person = %r.person, provider, reason = %why, "session ended: the provider refused it");
    let (hash, person) = (r.id_sha256.clone(), r.person.clone());
    let now = crate::ground::clock::now_ms();
    let provider = provider.to_owned();
    let done = a
        .blocking(move |a| {
            let result = a.store().revoke_session(&hash, now);
            let recorded = trust::audit::record(
                a,
                &crate::trust::audit::AdminAction {
                    actor: &crate::trust::audit::Actor::system(format!("oidc:{provider}")),
                    source: None,
                    action: "session.end",
                    target: &person,
                    outcome: outcome(result.is_ok()),
                    detail: format!("session {hash}: {why}"),
                },
            );
            // The session is ended either way; unrecorded, the request is
            // answered as failed.
            result.and(recorded)
        })
        .await;
    match done {
        Some(Ok(_)) => Ok(()),
        _ => Err(AuthError::Unavailable),
    }
}

fn outcome(ok: bool) -> crate::trust::audit::Outcome {
    if ok {
        crate::trust::audit::Outcome::Ok
    } else {
        crate::trust::audit::Outcome::Failed
    }
}

/// The sealing key of session `id`: SHA-256 of it under a label of its
/// own (the store keys sessions by the bare SHA-256, so it cannot derive
/// this one).
fn key(id: &str) -> Option<ring::aead::LessSafeKey> {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("reach-session-seal:{id}").as_bytes(),
    );
    let key = ring::aead::UnboundKey::new(&ring::aead::AES_256_GCM, digest.as_ref()).ok()?;
    Some(ring::aead::LessSafeKey::new(key))
}

const AAD: &[u8] = b"reach-session-credential";

/// `plain` sealed for session `id`: base64url of nonce, ciphertext, tag.
pub fn seal(id: &str, plain: &str) -> Option<String> {
    let nonce_bytes: [u8; 12] = rand::random();
    let mut buf = plain.as_bytes().to_vec();
    key(id)?
        .seal_in_place_append_tag(
            ring::aead::Nonce::assume_unique_for_key(nonce_bytes),
            ring::aead::Aad::from(AAD),
            &mut buf,
        )
        .ok()?;
    let mut out = nonce_bytes.to_vec();
    out.extend_from_slice(&buf);
    Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(out))
}

/// What [`seal`] sealed for session `id`; `None` for another id or a
/// changed text.
pub fn open(id: &str, sealed: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(sealed)
        .ok()?;
    let (nonce, rest) = bytes.split_at_checked(12)?;
    let nonce = ring::aead::Nonce::try_assume_unique_for_key(nonce).ok()?;
    let mut buf = rest.to_vec();
    let plain = key(id)?
        .open_in_place(nonce, ring::aead::Aad::from(AAD), &mut buf)
        .ok()?;
    String::from_utf8(plain.to_vec()).ok()
}

/// `POST /auth/backchannel-logout`, served by `backchannel_logout`, and its document.
pub(crate) fn backchannel_logout_route() -> Route {
    route(
        Op {
            method: Method::Post,
            path: "/auth/backchannel-logout",
            auth: Auth::None,
            spec: json!({
                "operationId": "backchannelLogout",
                "summary": "OpenID Connect Back-Channel Logout 1.0: the provider ends a person's sessions",
                "description": "Register `https://CA/auth/backchannel-logout` as the client's `backchannel_logout_uri` at the provider. The logout token must be signed with a key of the provider's JWKS, name this CA's client id in `aud`, be recent (`iat`), carry the back-channel logout event and `sid` or `sub`, and no `nonce`; its `jti` is accepted once. Ends the sessions of the provider session `sid`, else every session of `sub`.",
                "tags": ["sign-in"],
                "requestBody": {"required": true, "content": {"application/x-www-form-urlencoded": {
                    "schema": {"type": "object", "required": ["logout_token"],
                        "properties": {"logout_token": {"type": "string", "description": "a signed JWT"}}}}}},
                "responses": {
                    "200": {"description": "valid; its sessions ended",
                        "content": {"application/json": {"schema": {"type": "object", "properties": {
                            "sessions_ended": {"type": "integer"}}}, "example": {"sessions_ended": 1}}}},
                    "400": {"description": "refused (`invalid_request`), with why",
                        "content": {"application/json": {"schema": {"type": "object", "properties": {
                            "error": {"type": "string"}, "error_description": {"type": "string"}}},
                            "example": {"error": "invalid_request", "error_description": "this logout token was used already (jti)"}}}},
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        backchannel_logout,
    )
}

/// `POST /auth/backchannel-logout`: the provider's logout token ends the
/// sessions of the provider session (`sid`) or person (`sub`) it names;
/// 200 when it is valid (also when no session was open), 400 with
/// `invalid_request` when not (a replayed `jti` too).
pub async fn backchannel_logout(State(a): State<Shared>, body: axum::body::Bytes) -> Response {
    let refuse = |why: String| {
        tracing::warn!(reason = %why, "back-channel logout refused");
        let body = json!({ "error": "invalid_request", "error_description": why });
        (
            StatusCode::BAD_REQUEST,
            [(header::CACHE_CONTROL, "no-store")],
            axum::Json(body),
        )
            .into_response()
    };
    let token = url::form_urlencoded::parse(&body)
        .find(|(k, _)| k == "logout_token")
        .map(|(_, v)| v.into_owned());
    let Some(token) = token else {
        return refuse("no logout_token".into());
    };
    let providers = a.snapshot().config.oidc.clone();
    let now = crate::ground::clock::now_ms();
    let logout = match a.oidc().logout_token(&providers, &token, now).await {
        Ok(l) => l,
        Err(why) => return refuse(format!("the logout token was refused: {why}")),
    };
    let done = a.blocking(move |a| logged_out(a, &logout, now)).await;
    match done {
        Some(Ok(Some(n))) => (
            StatusCode::OK,
            [(header::CACHE_CONTROL, "no-store")],
            axum::Json(json!({ "sessions_ended": n })),
        )
            .into_response(),
        Some(Ok(None)) => refuse("this logout token was used already (jti)".into()),
        _ => crate::error::ApiError::Auth(AuthError::Unavailable).into_response(),
    }
}

/// Records `l`'s `jti` and ends its sessions, in the audit trail: how
/// many; `None` for a replay.
fn logged_out(
    a: &Authority,
    l: &crate::credentials::oidc::Logout,
    now: i64,
) -> Result<Option<u64>, crate::store::StoreError> {
    if !a
        .store()
        .logout_token_once(&l.provider, &l.jti, l.remember_until_ms, now)?
    {
        return Ok(None);
    }
    let sub = if l.sid.is_none() {
        l.sub.as_deref()
    } else {
        None
    };
    let result = a
        .store()
        .revoke_provider_sessions(&l.provider, l.sid.as_deref(), sub, now);
    let named = match (&l.sid, &l.sub) {
        (Some(sid), _) => format!("provider session {sid}"),
        (None, sub) => format!("subject {}", sub.as_deref().unwrap_or("")),
    };
    let recorded = trust::audit::record(
        a,
        &crate::trust::audit::AdminAction {
            actor: &crate::trust::audit::Actor::system(format!("oidc:{}", l.provider)),
            source: None,
            action: "session.backchannel_logout",
            target: &named,
            outcome: outcome(result.is_ok()),
            detail: match &result {
                Ok(n) => format!("{n} sessions ended"),
                Err(e) => e.to_string(),
            },
        },
    );
    result.and_then(|n| recorded.map(|()| Some(n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_credential_opens_only_with_its_session_id() {
        let sealed = seal("id-1", "refresh:tok").expect("sealed");
        assert!(!sealed.contains("tok"));
        assert_eq!(open("id-1", &sealed).as_deref(), Some("refresh:tok"));
        assert_eq!(open("id-2", &sealed), None);
        let mut bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&sealed)
            .expect("b64");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let changed = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        assert_eq!(open("id-1", &changed), None);
        assert_ne!(seal("id-1", "refresh:tok"), Some(sealed));
    }
}
