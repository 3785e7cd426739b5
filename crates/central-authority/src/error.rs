//! Error types of the CA and the one place where they become gRPC statuses.

use axum::http::StatusCode;
use protocol::WireError;
use protocol::release::Incompatible;
use tonic::Code;

use crate::credentials::auth::AuthError;
use crate::store::{EnrollRefusal, RenewRefusal};

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
    /// `Hello.release` is outside the compatibility policy (or not a
    /// release): the connector is too old or too new for this CA.
    #[error(transparent)]
    Release(#[from] protocol::release::Incompatible),
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
    /// The CA is shutting down (its blocking pool no longer runs work).
    #[error("the CA is shutting down")]
    ShuttingDown,
    /// The store (database) could not be reached: the change was not
    /// made. Access decisions do not need the store and go on.
    #[error(
        "the CA's store (database) does not answer: nothing was changed; retry once it is back"
    )]
    StoreUnavailable,
}

impl From<WireError> for ApiError {
    fn from(e: WireError) -> Self {
        ApiError::InvalidRequest(e.to_string())
    }
}

/// How one kind of error answers on each surface: the HTTP status with the
/// `reason` of its error body (`{"error":{"reason","message"}}`), and the
/// gRPC status code. Each error kind has one table of these, so the two
/// surfaces cannot drift apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status.
    pub http: StatusCode,
    /// The error body's `reason`.
    pub reason: &'static str,
    /// The gRPC status code.
    pub grpc: Code,
}

impl Answer {
    const fn new(http: StatusCode, reason: &'static str, grpc: Code) -> Self {
        Answer { http, reason, grpc }
    }

    /// The gRPC status with `message`.
    pub fn status(self, message: impl Into<String>) -> tonic::Status {
        tonic::Status::new(self.grpc, message)
    }
}

impl AuthError {
    /// How this refusal answers over HTTP and gRPC.
    pub fn answer(&self) -> Answer {
        const UNAUTHENTICATED: Answer = Answer::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            Code::Unauthenticated,
        );
        match self {
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
            | AuthError::CertificateExpired(_)
            | AuthError::UntrustedRoot(_)
            | AuthError::SessionEnded => UNAUTHENTICATED,
            AuthError::Csrf => Answer::new(StatusCode::FORBIDDEN, "csrf", Code::PermissionDenied),
            AuthError::MissingScope { .. } | AuthError::PersonMissingScope { .. } => {
                Answer::new(StatusCode::FORBIDDEN, "forbidden", Code::PermissionDenied)
            }
            // Connector credentials: refused over gRPC only; an HTTP
            // caller gets them as unauthorized.
            AuthError::UnknownGroup(_)
            | AuthError::KeyRevoked(_)
            | AuthError::ConnectorDisabled(_) => Answer::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                Code::PermissionDenied,
            ),
            AuthError::Unavailable => {
                Answer::new(StatusCode::UNAUTHORIZED, "unauthorized", Code::Unavailable)
            }
            AuthError::Throttled { .. } => Answer::new(
                StatusCode::TOO_MANY_REQUESTS,
                "throttled",
                Code::ResourceExhausted,
            ),
        }
    }
}

impl AuthError {
    /// When to retry, for a throttled failure (HTTP `Retry-After`, gRPC
    /// metadata `retry-after`, whole seconds).
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            AuthError::Throttled { retry_after_s } => Some(*retry_after_s),
            _ => None,
        }
    }
}

/// The gRPC metadata entry that carries a retry delay in whole seconds
/// (as HTTP's `Retry-After`).
pub const RETRY_AFTER: &str = "retry-after";

/// `status` with its retry delay in the `retry-after` metadata entry.
fn with_retry_after(mut status: tonic::Status, retry_after_s: Option<u64>) -> tonic::Status {
    if let Some(s) = retry_after_s {
        status
            .metadata_mut()
            .insert(RETRY_AFTER, tonic::metadata::MetadataValue::from(s));
    }
    status
}

impl From<AuthError> for tonic::Status {
    fn from(e: AuthError) -> Self {
        with_retry_after(e.answer().status(e.to_string()), e.retry_after_s())
    }
}

impl SessionError {
    /// The gRPC code a session ends with (sessions are served over gRPC
    /// only); `None` for a broken stream, whose own status is passed on.
    pub fn code(&self) -> Option<Code> {
        Some(match self {
            SessionError::Auth(a) => a.answer().grpc,
            SessionError::Stream(_) => return None,
            SessionError::ExpectedHello | SessionError::HelloMismatch { .. } => {
                Code::InvalidArgument
            }
            // Only an upgrade on one side changes the answer: not a wire
            // error, and nothing a retry soon could fix.
            SessionError::Release(Incompatible::TooOld { .. } | Incompatible::TooNew { .. }) => {
                Code::FailedPrecondition
            }
            SessionError::Release(Incompatible::Malformed(_)) => Code::InvalidArgument,
            SessionError::HelloTimeout(_) | SessionError::Idle(_) => Code::DeadlineExceeded,
            SessionError::ClosedBeforeHello => Code::PermissionDenied,
            SessionError::CertificateExpired => Code::Unauthenticated,
        })
    }
}

impl From<SessionError> for tonic::Status {
    fn from(e: SessionError) -> Self {
        match e {
            SessionError::Stream(s) => s,
            e => tonic::Status::new(e.code().unwrap_or(Code::Unknown), e.to_string()),
        }
    }
}

impl ApiError {
    /// How this error answers over HTTP and gRPC.
    pub fn answer(&self) -> Answer {
        match self {
            ApiError::Auth(a) => a.answer(),
            ApiError::InvalidRequest(_) => Answer::new(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                Code::InvalidArgument,
            ),
            ApiError::ShuttingDown => Answer::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                Code::Unavailable,
            ),
            ApiError::StoreUnavailable => Answer::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                Code::Unavailable,
            ),
        }
    }

    /// The message shown with it (an invalid request's own words).
    pub fn message(&self) -> String {
        match self {
            ApiError::InvalidRequest(m) => m.clone(),
            _ => self.to_string(),
        }
    }
}

impl ApiError {
    /// When to retry, for a throttled failure (whole seconds).
    pub fn retry_after_s(&self) -> Option<u64> {
        match self {
            ApiError::Auth(a) => a.retry_after_s(),
            _ => None,
        }
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let retry_after_s = e.retry_after_s();
        with_retry_after(e.answer().status(e.message()), retry_after_s)
    }
}

/// Why an enrollment was refused.
#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    /// The CA serves no TLS, so it cannot issue certificates.
    #[error("this CA runs without TLS and does not enroll connectors")]
    NoTls,
    /// A failed enrollment over its source address's allowance of
    /// failures; a valid key is never answered this.
    #[error("too many failed enrollment attempts from this address; retry in {retry_after_s} s")]
    RateLimited {
        /// When the source's allowance refills (whole seconds).
        retry_after_s: u64,
    },
    /// Name or key is wrong.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A group the policy does not have: answered exactly as a wrong key,
    /// so that group names cannot be found by trying them (the CA's log
    /// and metrics still tell the two apart).
    #[error("wrong provisioning key for connector group {0:?}")]
    NoSuchGroup(String),
    /// The key's expiry passed.
    #[error("the provisioning key of connector group {0:?} has expired")]
    KeyExpired(String),
    /// The database refused it (uses, revocation, disabled, other group).
    #[error(transparent)]
    Refused(#[from] EnrollRefusal),
    /// The CSR is unusable.
    #[error("{0}")]
    Csr(String),
    /// Something failed inside the CA (logged there).
    #[error("enrollment failed inside the CA; see its log")]
    Internal,
}

impl EnrollError {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            EnrollError::NoTls => "no_tls",
            EnrollError::RateLimited { .. } => "rate_limited",
            EnrollError::Auth(AuthError::WrongKey(_)) => "wrong_key",
            EnrollError::Auth(AuthError::UnknownGroup(_)) | EnrollError::NoSuchGroup(_) => {
                "unknown_group"
            }
            EnrollError::Auth(_) => "invalid",
            EnrollError::KeyExpired(_) => "key_expired",
            EnrollError::Refused(EnrollRefusal::KeyRevoked(_)) => "key_revoked",
            EnrollError::Refused(EnrollRefusal::KeyExhausted { .. }) => "key_exhausted",
            EnrollError::Refused(EnrollRefusal::Disabled(_)) => "disabled",
            EnrollError::Refused(EnrollRefusal::OtherGroup { .. }) => "other_group",
            EnrollError::Refused(EnrollRefusal::NameTaken(_)) => "name_taken",
            EnrollError::Csr(_) => "invalid_csr",
            EnrollError::Internal => "internal",
        }
    }
}

impl EnrollError {
    /// The gRPC code of this refusal (enrollment is served over gRPC only).
    pub fn code(&self) -> Code {
        match self {
            EnrollError::Auth(a) => a.answer().grpc,
            EnrollError::NoSuchGroup(_) => Code::Unauthenticated,
            EnrollError::NoTls => Code::FailedPrecondition,
            EnrollError::RateLimited { .. } => Code::ResourceExhausted,
            // The name rules say what would make the enrollment go
            // through: renewal or an administrator's action.
            EnrollError::Refused(EnrollRefusal::NameTaken(_)) => Code::FailedPrecondition,
            EnrollError::Refused(EnrollRefusal::OtherGroup { .. }) => Code::AlreadyExists,
            EnrollError::KeyExpired(_) | EnrollError::Refused(_) => Code::PermissionDenied,
            EnrollError::Csr(_) => Code::InvalidArgument,
            EnrollError::Internal => Code::Internal,
        }
    }
}

impl From<EnrollError> for tonic::Status {
    fn from(e: EnrollError) -> Self {
        let retry_after_s = match &e {
            EnrollError::RateLimited { retry_after_s } => Some(*retry_after_s),
            EnrollError::Auth(a) => a.retry_after_s(),
            _ => None,
        };
        with_retry_after(tonic::Status::new(e.code(), e.to_string()), retry_after_s)
    }
}

/// Why a renewal was refused.
#[derive(Debug, thiserror::Error)]
pub enum RenewError {
    /// The CA serves no TLS, so it cannot issue certificates.
    #[error("this CA runs without TLS and does not renew certificates")]
    NoTls,
    /// No usable client certificate, or its group left the policy.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// The database refused it (unknown, revoked, expired, disabled).
    #[error(transparent)]
    Refused(#[from] RenewRefusal),
    /// The CSR is unusable.
    #[error("{0}")]
    Csr(String),
    /// The connector renewed too often (see `state::limits::RenewLimit`).
    #[error(
        "connector {name:?} renews too often: at most {burst} renewals, then one per {period_s} s; retry in {retry_after_s} s"
    )]
    TooFrequent {
        /// The connector.
        name: String,
        /// Renewals allowed in a burst.
        burst: u32,
        /// One more per this many seconds after the burst.
        period_s: u64,
        /// When the next one is allowed.
        retry_after_s: u64,
    },
    /// Something failed inside the CA (logged there).
    #[error("renewal failed inside the CA; see its log")]
    Internal,
}

impl RenewError {
    /// A short label for metrics (`enrollments` family, prefixed `renew_`).
    pub fn label(&self) -> &'static str {
        match self {
            RenewError::NoTls => "renew_no_tls",
            RenewError::Auth(AuthError::NoClientCertificate) => "renew_no_certificate",
            RenewError::Auth(_) => "renew_bad_certificate",
            RenewError::Refused(RenewRefusal::Unknown(_)) => "renew_unknown_certificate",
            RenewError::Refused(RenewRefusal::Revoked { .. }) => "renew_revoked",
            RenewError::Refused(RenewRefusal::Expired(_)) => "renew_expired",
            RenewError::Refused(RenewRefusal::Disabled(_)) => "renew_disabled",
            RenewError::Csr(_) => "renew_invalid_csr",
            RenewError::TooFrequent { .. } => "renew_rate_limited",
            RenewError::Internal => "renew_internal",
        }
    }
}

impl RenewError {
    /// The gRPC code of this refusal (renewal is served over gRPC only).
    pub fn code(&self) -> Code {
        match self {
            RenewError::Auth(a) => a.answer().grpc,
            RenewError::NoTls => Code::FailedPrecondition,
            RenewError::Refused(RenewRefusal::Unknown(_)) => Code::Unauthenticated,
            RenewError::Refused(_) => Code::PermissionDenied,
            RenewError::Csr(_) => Code::InvalidArgument,
            RenewError::TooFrequent { .. } => Code::ResourceExhausted,
            RenewError::Internal => Code::Internal,
        }
    }
}

impl From<RenewError> for tonic::Status {
    fn from(e: RenewError) -> Self {
        tonic::Status::new(e.code(), e.to_string())
    }
}

/// Why the CA's trust state could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Certificates or keys.
    #[error("TLS material: {0}")]
    Pki(#[from] crate::credentials::pki::PkiError),
    /// Certificates and keys that cannot serve TLS.
    #[error("TLS material: {0}")]
    Material(#[from] crate::credentials::tls::MaterialError),
    /// The database.
    #[error("store {location}: {source}")]
    Store {
        /// The database file or URL (without its password).
        location: String,
        /// Why.
        source: crate::store::StoreError,
    },
    /// The data directory.
    #[error("data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Why the CA stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The HTTP server failed.
    #[error("HTTP server: {0}")]
    Http(#[source] std::io::Error),
    /// The reflection service could not be built.
    #[error("gRPC reflection: {0}")]
    Reflection(String),
    /// The data directory, database or certificates could not be opened.
    #[error(transparent)]
    Trust(#[from] TrustError),
}
