//! Throttled authentication: the API's bearer tokens and enrollments are
//! admitted only while their source has attempts left in
//! `state::limits::Throttle`, and each refusal is counted.

use std::net::IpAddr;

use crate::state::authority::Authority;
use crate::state::counters::ThrottleLabel;
use crate::state::limits::{Guarded, Refused};
use crate::trust::auth::{AuthError, Scope, authorize};

impl Authority {
    /// Whether an attempt at `what` from `source` may be evaluated; a
    /// refusal is counted in `reach_ca_throttled_total`.
    pub fn admit(&self, what: Guarded, source: Option<IpAddr>) -> Result<(), Refused> {
        self.throttle(what).admit(source).inspect_err(|refused| {
            self.metrics()
                .throttled
                .get_or_create(&ThrottleLabel {
                    what: what.as_str(),
                    scope: refused.as_str(),
                })
                .inc();
        })
    }

    /// `auth::authorize` for a caller at `source`, throttled: a source that
    /// sent too many unknown or malformed tokens is refused (`Throttled`)
    /// before its token is compared, and each such failure is counted.
    pub fn authorize_from(
        &self,
        source: Option<IpAddr>,
        header: Option<&str>,
        scope: Scope,
    ) -> Result<(), AuthError> {
        let state = self.snapshot();
        let anonymous_read = state.settings().anonymous_read;
        if scope == Scope::Read && anonymous_read {
            return Ok(());
        }
        // No token guesses nothing: it is answered 401 (authenticate) even
        // from a throttled source, which learns nothing from it.
        if header.is_none() {
            return Err(AuthError::MissingToken);
        }
        self.admit(Guarded::Token, source)
            .map_err(|_| AuthError::Throttled)?;
        let result = authorize(&state.config.tokens, anonymous_read, header, scope);
        // Guesses only: a missing token or a valid token without the scope
        // guesses nothing.
        if matches!(result, Err(AuthError::UnknownToken | AuthError::Malformed)) {
            self.throttle(Guarded::Token).failed(source);
        }
        result
    }
}
