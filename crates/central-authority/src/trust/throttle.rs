//! Throttled authentication: the API's bearer tokens and enrollments are
//! always compared first; only failures count in `state::limits::Throttle`,
//! and a failure over its source's allowance is answered "throttled" with a
//! retry delay, counted, and logged (one line per source per minute).

use std::net::IpAddr;

use crate::credentials::auth::{AuthError, Scope, authorize};
use crate::state::authority::Authority;
use crate::state::counters::ThrottleLabel;
use crate::state::limits::{Guarded, Refusal};

/// Counts a failed attempt at `what` from `source`. `Err` when it is
/// over the allowance: the caller answers "throttled" with the
/// refusal's retry delay. A refusal is counted in
/// `reach_ca_throttled_total` and logged at most once a minute per
/// source.
pub fn failed(authority: &Authority, what: Guarded, source: Option<IpAddr>) -> Result<(), Refusal> {
    authority
        .throttle(what)
        .failed(source)
        .inspect_err(|refused| {
            authority
                .metrics()
                .throttled
                .get_or_create(&ThrottleLabel {
                    what: what.as_str(),
                    scope: refused.scope.as_str(),
                })
                .inc();
            if let Some(count) = refused.log {
                log_throttled(what, source, count, refused);
            }
        })
}

/// `auth::authorize` for a caller at `source`: a valid token is never
/// refused, whatever its source sent before; an unknown or malformed
/// token over its source's allowance of failures is answered
/// `Throttled` (with when to retry) instead of `UnknownToken`.
pub fn authorize_from(
    authority: &Authority,
    source: Option<IpAddr>,
    header: Option<&str>,
    scope: Scope,
) -> Result<(), AuthError> {
    let state = authority.snapshot();
    let anonymous_read = state.settings().anonymous_read;
    let result = authorize(&state.config.tokens, anonymous_read, header, scope);
    // Guesses only: a missing token or a valid token without the scope
    // guesses nothing.
    if matches!(result, Err(AuthError::UnknownToken | AuthError::Malformed)) {
        failed(authority, Guarded::Token, source).map_err(|refused| AuthError::Throttled {
            retry_after_s: refused.retry_after_s,
        })?;
    }
    result
}

/// Logs the throttled sources that went quiet with refusals not yet
/// logged (called by housekeeping with `retain_recent`).
pub fn flush_throttle_logs(authority: &Authority) {
    for what in [Guarded::Token, Guarded::Enrollment, Guarded::Login] {
        for (source, count) in authority.throttle(what).retain_recent() {
            tracing::warn!(
                what = what.as_str(),
                source = %source,
                refused = count,
                "failed attempts throttled (since the last line for this source)"
            );
        }
    }
}

/// The rate-limited log line of a throttled source.
fn log_throttled(what: Guarded, source: Option<IpAddr>, count: u64, refused: &Refusal) {
    let source = source.map_or_else(|| "unknown".to_owned(), |s| s.to_string());
    tracing::warn!(
        what = what.as_str(),
        source = %source,
        scope = refused.scope.as_str(),
        refused = count,
        retry_after_s = refused.retry_after_s,
        "failed attempts throttled (since the last line for this source; next line in a minute at most)"
    );
}
