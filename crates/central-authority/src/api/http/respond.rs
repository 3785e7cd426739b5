//! Answers shared by the handlers: an `ApiError` as its JSON error,
//! hand-written JSON as a 200, store failures, missing targets, a runtime
//! that is shutting down, and the admin API's store work off the async
//! workers.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::api::body::error_body;
use crate::error::ApiError;
use crate::state::authority::Authority;

use super::Shared;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let answer = self.answer();
        let mut r = error_body(answer.http, answer.reason, &self.message(), None);
        if let Some(s) = self.retry_after_s() {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(s));
        }
        if answer.http == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

/// JSON `body` as a 200 response, as `axum::Json` answers it.
pub(super) fn json_response(body: Vec<u8>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

pub(super) fn storage(e: crate::store::StoreError) -> Response {
    if e.is_unavailable() {
        tracing::warn!(error = %e, "admin API: refused, the store does not answer");
        return ApiError::StoreUnavailable.into_response();
    }
    tracing::error!(error = %e, "admin API: database error");
    error_body(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "the CA's database failed; see its log",
        None,
    )
}

/// The answer to admin work that names a target: its body as JSON, 404
/// `not_found` saying `missing` when there was no such target, or the
/// refusal the work was answered with.
pub(super) fn found_or_404<T: serde::Serialize>(
    done: Result<Option<T>, Response>,
    missing: impl AsRef<str>,
) -> Response {
    match done {
        Ok(Some(body)) => axum::Json(body).into_response(),
        Ok(None) => error_body(StatusCode::NOT_FOUND, "not_found", missing.as_ref(), None),
        Err(response) => response,
    }
}

/// The answer to an action the audit trail could not record (503
/// `audit_unavailable`; `trust::audit::record` logged the failure).
pub(crate) fn trail_unavailable() -> Response {
    error_body(
        StatusCode::SERVICE_UNAVAILABLE,
        "audit_unavailable",
        "the audit trail could not record this action, so it is answered as failed; the CA's log says what it came to and why the trail failed",
        None,
    )
}

/// The admin API's database work, off the async workers (`None`: the
/// runtime is shutting down).
pub(super) async fn admin<T: Send + 'static>(
    a: &Shared,
    f: impl FnOnce(&Authority) -> Result<T, crate::store::StoreError> + Send + 'static,
) -> Result<T, Response> {
    match a.blocking(f).await {
        Some(Ok(t)) => Ok(t),
        Some(Err(e)) => Err(storage(e)),
        None => Err(shutting_down()),
    }
}

/// The answer when blocking work cannot run because the runtime stops.
pub(super) fn shutting_down() -> Response {
    ApiError::ShuttingDown.into_response()
}
