//! Authentication: API tokens with scopes (for the access and read APIs) and
//! connector provisioning keys, all compared in constant time and never
//! printed.

use std::fmt;
use std::str::FromStr;

use crate::ground::secret::Secret;

/// What an API token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Resolve access requests (`POST /api/v1/access`, gRPC `Access`).
    Access,
    /// Read the dashboard, the JSON APIs, metrics and gRPC `HealthQuery`.
    Read,
    /// Everything: implies `access` and `read`.
    Admin,
}

impl Scope {
    /// The name used in config and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Access => "access",
            Scope::Read => "read",
            Scope::Admin => "admin",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "access" => Ok(Scope::Access),
            "read" => Ok(Scope::Read),
            "admin" => Ok(Scope::Admin),
            other => Err(format!(
                "unknown scope {other:?} (expected \"access\", \"read\" or \"admin\")"
            )),
        }
    }
}

/// An API token from the config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiToken {
    /// Name for logs (the token itself is never logged).
    pub name: String,
    /// The token.
    pub secret: Secret,
    /// What it may do.
    pub scopes: Vec<Scope>,
}

impl ApiToken {
    /// Whether this token grants `scope` (`admin` grants everything).
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope) || self.scopes.contains(&Scope::Admin)
    }
}

/// Why a caller or a connector was not let in.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `authorization` header / metadata.
    #[error("missing credentials: send `authorization: Bearer TOKEN`")]
    MissingToken,
    /// The header is not `Bearer TOKEN`.
    #[error("malformed authorization (expected `Bearer TOKEN`)")]
    Malformed,
    /// No configured token matches.
    #[error("unknown API token")]
    UnknownToken,
    /// A failed attempt over its source address's allowance of failures
    /// (`trust::throttle`); a valid token is never answered this.
    #[error(
        "too many failed attempts from this address; retry in {retry_after_s} s (a valid token is always accepted)"
    )]
    Throttled {
        /// When the source's allowance refills (whole seconds).
        retry_after_s: u64,
    },
    /// The token is valid but lacks the scope.
    #[error("API token {token:?} lacks the {scope:?} scope")]
    MissingScope {
        /// Token name.
        token: String,
        /// The scope the request needs.
        scope: &'static str,
    },
    /// The session cookie names a session that is unknown, revoked
    /// (signed out) or over.
    #[error("the session ended (signed out, revoked or expired): sign in again")]
    SessionEnded,
    /// A state change with a session cookie but without the session's
    /// CSRF token.
    #[error(
        "missing or wrong X-CSRF-Token: a state change with a session cookie must carry the session's CSRF token (GET /auth/session)"
    )]
    Csrf,
    /// A signed-in person whose roles do not grant the scope.
    #[error("{person:?} (signed in) lacks the {scope:?} scope")]
    PersonMissingScope {
        /// Who.
        person: String,
        /// The scope the request needs.
        scope: &'static str,
    },
    /// A connector left out a required metadata entry.
    #[error("missing or non-ASCII metadata `{0}`")]
    MissingMetadata(&'static str),
    /// A connector named a group the policy does not have.
    #[error("unknown connector group {0:?}")]
    UnknownGroup(String),
    /// A connector's provisioning key does not match its group's.
    #[error("wrong provisioning key for connector group {0:?}")]
    WrongKey(String),
    /// The group's provisioning key was revoked (metadata authentication,
    /// `[tls] enabled = false`).
    #[error("the provisioning key of connector group {0:?} was revoked")]
    KeyRevoked(String),
    /// A connector name that cannot be used.
    #[error("invalid connector name: {0}")]
    InvalidName(String),
    /// A session without a client certificate.
    #[error(
        "a client certificate is required: enroll first (`connector-agent enroll`) and connect with it"
    )]
    NoClientCertificate,
    /// The certificate names no connector.
    #[error("{0}")]
    BadCertificate(crate::credentials::pki::IdentityError),
    /// The CA has no record of this certificate.
    #[error("certificate {0} is not one this CA issued and recorded")]
    UnknownCertificate(String),
    /// The certificate was revoked.
    #[error("certificate {serial} was revoked ({reason}); enroll again")]
    CertificateRevoked {
        /// Serial.
        serial: String,
        /// Why.
        reason: String,
    },
    /// The certificate's validity ended.
    #[error("certificate {0} has expired; enroll again")]
    CertificateExpired(String),
    /// The certificate chains to no root the CA trusts now (a root was
    /// retired, or replaced after a compromise).
    #[error(
        "certificate {0} is from a root this CA no longer trusts; enroll again with a provisioning key"
    )]
    UntrustedRoot(String),
    /// An administrator disabled the connector.
    #[error("connector {0:?} is disabled")]
    ConnectorDisabled(String),
    /// The CA could not check the connector's state (its database failed);
    /// it refuses rather than let in a connector it cannot vouch for.
    #[error(
        "the CA's store (database) does not answer, so it cannot check this connector's certificate and state now; retry later"
    )]
    Unavailable,
}

impl AuthError {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            AuthError::MissingToken | AuthError::Malformed | AuthError::UnknownToken => "token",
            AuthError::MissingScope { .. } | AuthError::PersonMissingScope { .. } => "scope",
            AuthError::SessionEnded => "session",
            AuthError::Csrf => "csrf",
            AuthError::MissingMetadata(_) => "missing_metadata",
            AuthError::UnknownGroup(_) => "unknown_group",
            AuthError::WrongKey(_) => "wrong_key",
            AuthError::KeyRevoked(_) => "key_revoked",
            AuthError::InvalidName(_) => "invalid_name",
            AuthError::NoClientCertificate => "no_certificate",
            AuthError::BadCertificate(_) => "bad_certificate",
            AuthError::UnknownCertificate(_) => "unknown_certificate",
            AuthError::CertificateRevoked { .. } => "certificate_revoked",
            AuthError::CertificateExpired(_) => "certificate_expired",
            AuthError::UntrustedRoot(_) => "untrusted_root",
            AuthError::ConnectorDisabled(_) => "disabled",
            AuthError::Unavailable => "unavailable",
            AuthError::Throttled { .. } => "throttled",
        }
    }
}

/// The authorization rule of both APIs (HTTP and gRPC): reading is open to
/// anyone when `anonymous_read` is set; everything else needs a bearer
/// token (`header`, the `authorization` value) that grants `scope`.
pub fn authorize(
    tokens: &[ApiToken],
    anonymous_read: bool,
    header: Option<&str>,
    scope: Scope,
) -> Result<(), AuthError> {
    if scope == Scope::Read && anonymous_read {
        return Ok(());
    }
    bearer(tokens, header, scope).map(|_| ())
}

/// Checks a caller's `authorization` value for `scope`. Returns the token's
/// name for logs. Every configured token is compared (in constant time), so
/// the time taken does not depend on which token matched.
pub fn bearer<'a>(
    tokens: &'a [ApiToken],
    header: Option<&str>,
    scope: Scope,
) -> Result<&'a str, AuthError> {
    let header = header.ok_or(AuthError::MissingToken)?.trim();
    let (scheme, token) = header.split_once(' ').ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::Malformed);
    }
    let token = token.trim().as_bytes();
    let mut found = None;
    for t in tokens {
        if t.secret.matches(token) {
            found = Some(t);
        }
    }
    let t = found.ok_or(AuthError::UnknownToken)?;
    if t.allows(scope) {
        Ok(&t.name)
    } else {
        Err(AuthError::MissingScope {
            token: t.name.clone(),
            scope: scope.as_str(),
        })
    }
}

/// Connector names follow the policy's naming rule: 1..=128 of
/// `[A-Za-z0-9._-]`, not starting with '.' or '-' (safe in logs, URLs and
/// metric labels).
pub fn check_connector_name(name: &str) -> Result<(), AuthError> {
    if name.is_empty() || name.len() > 128 {
        return Err(AuthError::InvalidName(format!(
            "must be 1-128 characters, got {}",
            name.len()
        )));
    }
    if name
        .chars()
        .any(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        || name.starts_with(['.', '-'])
    {
        return Err(AuthError::InvalidName(
            "allowed are letters, digits, '.', '_', '-' (not first: '.', '-')".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens() -> Vec<ApiToken> {
        vec![
            ApiToken {
                name: "ops".into(),
                secret: Secret::new("s3cret-ops"),
                scopes: vec![Scope::Read],
            },
            ApiToken {
                name: "root".into(),
                secret: Secret::new("s3cret-root"),
                scopes: vec![Scope::Admin],
            },
        ]
    }

    #[test]
    fn bearer_tokens_and_scopes() {
        let t = tokens();
        assert_eq!(bearer(&t, None, Scope::Read), Err(AuthError::MissingToken));
        assert_eq!(
            bearer(&t, Some("Basic abc"), Scope::Read),
            Err(AuthError::Malformed)
        );
        assert_eq!(
            bearer(&t, Some("Bearer nope"), Scope::Read),
            Err(AuthError::UnknownToken)
        );
        assert_eq!(
            bearer(&t, Some("Bearer s3cret-ops"), Scope::Read),
            Ok("ops")
        );
        assert!(matches!(
            bearer(&t, Some("bearer s3cret-ops"), Scope::Access),
            Err(AuthError::MissingScope { .. })
        ));
        assert_eq!(
            bearer(&t, Some("Bearer s3cret-root"), Scope::Access),
            Ok("root")
        );
    }

    #[test]
    fn anonymous_read_opens_reading_only() {
        let t = tokens();
        assert_eq!(authorize(&t, true, None, Scope::Read), Ok(()));
        assert_eq!(
            authorize(&t, false, None, Scope::Read),
            Err(AuthError::MissingToken)
        );
        for scope in [Scope::Access, Scope::Admin] {
            assert_eq!(
                authorize(&t, true, None, scope),
                Err(AuthError::MissingToken)
            );
        }
        assert_eq!(
            authorize(&t, true, Some("Bearer s3cret-root"), Scope::Admin),
            Ok(())
        );
        assert!(matches!(
            authorize(&t, true, Some("Bearer s3cret-ops"), Scope::Admin),
            Err(AuthError::MissingScope { .. })
        ));
    }

    #[test]
    fn connector_names() {
        assert!(check_connector_name("c1.dc-east_2").is_ok());
        assert!(check_connector_name("").is_err());
        assert!(check_connector_name("-x").is_err());
        assert!(check_connector_name("a b").is_err());
    }
}
