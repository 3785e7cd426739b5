//! The handlers' extractors: the scope a route requires
//! ([`RequireScope`]) and the caller of an admin action ([`Caller`]).

use std::marker::PhantomData;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use crate::error::ApiError;
use crate::trust;

use super::{Peer, Shared};

/// A handler argument that lets the request through only if its caller may
/// use scope `S` (`auth::authorize`; the rejection is the `ApiError`), so a
/// handler declares its scope in its signature.
#[derive(Debug)]
pub struct RequireScope<S>(PhantomData<S>);

/// The scopes as types, for [`RequireScope`].
pub mod scope {
    use crate::credentials::auth::Scope;

    /// A scope as a type.
    pub trait Required: Send + Sync + 'static {
        /// The scope.
        const SCOPE: Scope;
    }

    /// `Scope::Read`.
    #[derive(Debug)]
    pub struct Read;
    /// `Scope::Access`.
    #[derive(Debug)]
    pub struct Access;
    /// `Scope::Admin`.
    #[derive(Debug)]
    pub struct Admin;

    impl Required for Read {
        const SCOPE: Scope = Scope::Read;
    }
    impl Required for Access {
        const SCOPE: Scope = Scope::Access;
    }
    impl Required for Admin {
        const SCOPE: Scope = Scope::Admin;
    }
}

impl<S: scope::Required> FromRequestParts<Shared> for RequireScope<S> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, a: &Shared) -> Result<Self, ApiError> {
        // A person's session cookie (`api::auth`), when no token is sent.
        if let Some(s) =
            crate::api::auth::authorize_session(a, &parts.method, &parts.headers, S::SCOPE).await
        {
            return s.map(|_| RequireScope(PhantomData)).map_err(ApiError::from);
        }
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        // Guesses are throttled per source address (`trust::throttle`).
        let source = parts.extensions.get::<Peer>().map(|p| p.0.ip());
        trust::throttle::authorize_from(a, source, header, S::SCOPE)?;
        Ok(RequireScope(PhantomData))
    }
}

/// The caller of an admin action: who (the token's configured name) and
/// from where. A token without the `admin` scope is let through with its
/// refusal, so the handler records the refused action before it answers
/// 403; no, malformed, unknown or throttled tokens are rejected here
/// (nobody to attribute the attempt to: the last three are counted per
/// source and minute, `refused_token`).
#[derive(Debug)]
pub struct Caller {
    pub(super) actor: crate::trust::audit::Actor,
    pub(super) source: Option<std::net::IpAddr>,
    pub(super) refused: Option<ApiError>,
}

impl FromRequestParts<Shared> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, a: &Shared) -> Result<Self, ApiError> {
        use crate::credentials::auth::{AuthError, Scope};
        use crate::trust::audit::Actor;
        let source = parts.extensions.get::<Peer>().map(|p| p.0.ip());
        // A person's session cookie, when no token is sent.
        let session = match parts.headers.contains_key(header::AUTHORIZATION) {
            true => None,
            false => crate::api::auth::session_of(a, &parts.headers).await,
        };
        if let Some(s) = session {
            let s = s?;
            crate::api::auth::check_csrf(&parts.method, &parts.headers, &s)?;
            let refused = (!s.allows(Scope::Admin)).then(|| {
                ApiError::Auth(AuthError::PersonMissingScope {
                    person: s.person.clone(),
                    scope: Scope::Admin.as_str(),
                })
            });
            return Ok(Caller {
                actor: Actor::person(s.person, s.provider, s.subject),
                source,
                refused,
            });
        }
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match trust::throttle::authorize_from(a, source, header, Scope::Admin) {
            Ok(()) => {}
            Err(AuthError::MissingScope { token, scope }) => {
                return Ok(Caller {
                    actor: Actor::token(token.clone()),
                    source,
                    refused: Some(ApiError::Auth(AuthError::MissingScope { token, scope })),
                });
            }
            Err(e) => {
                if matches!(
                    e,
                    AuthError::UnknownToken | AuthError::Malformed | AuthError::Throttled { .. }
                ) {
                    refused_token(a, source).await;
                }
                return Err(e.into());
            }
        }
        let state = a.snapshot();
        let name = crate::credentials::auth::bearer(&state.config.tokens, header, Scope::Admin)?;
        Ok(Caller {
            actor: Actor::token(name),
            source,
            refused: None,
        })
    }
}

/// Counts an admin request refused for an unknown, malformed or throttled
/// token in the audit trail: one `token.refused` entry per source and
/// minute with the count (the throttle bounds how many come). The request
/// is refused either way; a count the store cannot write is logged.
async fn refused_token(a: &Shared, source: Option<std::net::IpAddr>) {
    let source = source.map(|s| s.to_string()).unwrap_or_default();
    let minute = crate::ground::clock::now_ms() / 60_000 * 60_000;
    let counted = a
        .blocking(move |a| a.store().count_refusal(&source, minute))
        .await;
    if let Some(Err(e)) = counted {
        tracing::error!(error = %e, "audit trail: a refused token could not be counted");
    }
}

/// Whether the caller of a read route (let through by its scope) also has
/// the `admin` scope: it then sees what only administrators see.
pub(super) async fn caller_is_admin(a: &Shared, headers: &axum::http::HeaderMap) -> bool {
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match crate::api::auth::session_of(a, headers).await {
        Some(Ok(s)) if header.is_none() => s.allows(crate::credentials::auth::Scope::Admin),
        _ => crate::credentials::auth::authorize(
            &a.snapshot().config.tokens,
            false,
            header,
            crate::credentials::auth::Scope::Admin,
        )
        .is_ok(),
    }
}
