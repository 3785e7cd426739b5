//! Error types of the CA and the one place where they become gRPC statuses.

use protocol::WireError;

use crate::auth::AuthError;

/// Why a connector session ended abnormally.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Authentication failed.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The connector's first message was not `Hello`.
    #[error("the first message of a session must be Hello")]
    ExpectedHello,
    /// `Hello` disagrees with who the session is authenticated as: the
    /// client certificate's identity (or, on a CA run with
    /// `[tls] enabled = false`, the metadata's).
    #[error(
        "Hello names connector {name:?} in group {group:?}, but the session is authenticated as {authenticated_name:?} in {authenticated_group:?}"
    )]
    HelloMismatch {
        /// Name in Hello.
        name: String,
        /// Group in Hello.
        group: String,
        /// Name the session is authenticated as (certificate, or metadata
        /// without TLS).
        authenticated_name: String,
        /// Group the session is authenticated as (certificate, or metadata
        /// without TLS).
        authenticated_group: String,
    },
    /// No `Hello` arrived in time.
    #[error("no Hello within {0:?}")]
    HelloTimeout(std::time::Duration),
    /// The connector sent nothing for longer than the idle timeout.
    #[error("no message for {0:?} (three heartbeat intervals)")]
    Idle(std::time::Duration),
    /// The stream broke.
    #[error("stream error: {0}")]
    Stream(#[from] tonic::Status),
    /// The CA closed the stream before it registered: its connector was
    /// disabled, revoked, re-enrolled or deleted meanwhile.
    #[error(
        "the stream was closed before it registered: its connector was disabled, revoked, re-enrolled or deleted"
    )]
    ClosedBeforeHello,
    /// The session's certificate expired (mapped to
    /// `AuthError::CertificateExpired` with its serial before it is shown).
    #[error("the session's certificate expired")]
    CertificateExpired,
}

/// Why one entry of a health report was rejected (the rest of the report and
/// the session go on).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The entry is malformed.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The segment does not exist.
    #[error("unknown segment {0:?}")]
    UnknownSegment(String),
    /// The connector's group does not serve the segment.
    #[error("connector group {group:?} does not serve segment {segment:?}")]
    NotServed {
        /// The connector's group.
        group: String,
        /// The segment.
        segment: String,
    },
    /// The host, protocol or port is not part of the segment.
    #[error("{0}")]
    NotInSegment(String),
}

/// Why an API request (HTTP or gRPC) could not be answered. Refusals are not
/// errors: they are answers (`access::Refusal`).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Missing or wrong credentials.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The request is malformed.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

impl From<WireError> for ApiError {
    fn from(e: WireError) -> Self {
        ApiError::InvalidRequest(e.to_string())
    }
}

impl From<AuthError> for tonic::Status {
    fn from(e: AuthError) -> Self {
        let message = e.to_string();
        match e {
            AuthError::MissingToken
            | AuthError::Malformed
            | AuthError::UnknownToken
            | AuthError::MissingMetadata(_)
            | AuthError::WrongKey(_)
            | AuthError::InvalidName(_)
            | AuthError::NoClientCertificate
            | AuthError::BadCertificate(_)
            | AuthError::UnknownCertificate(_)
            | AuthError::CertificateRevoked { .. }
            | AuthError::CertificateExpired(_) => tonic::Status::unauthenticated(message),
            AuthError::MissingScope { .. }
            | AuthError::UnknownGroup(_)
            | AuthError::KeyRevoked(_)
            | AuthError::ConnectorDisabled(_) => tonic::Status::permission_denied(message),
            AuthError::Unavailable => tonic::Status::unavailable(message),
            AuthError::Throttled => tonic::Status::resource_exhausted(message),
        }
    }
}

impl From<SessionError> for tonic::Status {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::Auth(a) => a.into(),
            SessionError::Stream(s) => s,
            SessionError::ExpectedHello | SessionError::HelloMismatch { .. } => {
                tonic::Status::invalid_argument(e.to_string())
            }
            SessionError::HelloTimeout(_) | SessionError::Idle(_) => {
                tonic::Status::deadline_exceeded(e.to_string())
            }
            SessionError::ClosedBeforeHello => tonic::Status::permission_denied(e.to_string()),
            SessionError::CertificateExpired => tonic::Status::unauthenticated(e.to_string()),
        }
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::Auth(a) => a.into(),
            ApiError::InvalidRequest(m) => tonic::Status::invalid_argument(m),
        }
    }
}
