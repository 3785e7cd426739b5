//! Certificate renewal (`Enrollment.Renew`): a connector exchanges its
//! current, valid certificate for a new one over a new key, with no
//! provisioning key, and the CA revokes the superseded certificate after a
//! grace (`[tls] renewal_grace_s`) so that a live session can move over.
//!
//! **Invariant:** the identity renewed is the one of the client certificate
//! on the TLS connection, never anything in the request; only the CSR's
//! public key is taken from it.

use std::sync::Arc;
use std::time::Duration;

use protocol::v1;
use tonic::{Request, Response, Status};

use crate::auth::AuthError;
use crate::authority::Authority;
use crate::metrics::Metrics;
use crate::pki::PkiError;
use crate::store::{RenewRefusal, Renewal, StoreError};
use crate::trust::now_ms;

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
            RenewError::Internal => "renew_internal",
        }
    }
}

impl From<RenewError> for Status {
    fn from(e: RenewError) -> Self {
        let message = e.to_string();
        match e {
            RenewError::Auth(a) => a.into(),
            RenewError::NoTls => Status::failed_precondition(message),
            RenewError::Refused(RenewRefusal::Unknown(_)) => Status::unauthenticated(message),
            RenewError::Refused(_) => Status::permission_denied(message),
            RenewError::Csr(_) => Status::invalid_argument(message),
            RenewError::Internal => Status::internal(message),
        }
    }
}

/// A completed renewal.
#[derive(Debug)]
pub struct Renewed {
    /// What goes back to the connector.
    pub response: v1::EnrollResponse,
    /// The connector renewed.
    pub name: String,
    /// The serial it presented.
    pub old_serial: String,
}

/// Serves `Enrollment.Renew`: the peer's certificate chain comes from the
/// TLS connection the request arrived on.
pub(crate) async fn serve(
    authority: &Arc<Authority>,
    request: Request<v1::RenewRequest>,
) -> Result<Response<v1::EnrollResponse>, Status> {
    let peer = request.remote_addr();
    let certs = request.peer_certs();
    let r = request.into_inner();
    // Signing and the database write run off the async workers.
    let renewed = authority
        .blocking(move |a| a.renew(certs.as_deref().map(Vec::as_slice), &r))
        .await
        .unwrap_or(Err(RenewError::Internal));
    match renewed {
        Ok(done) => {
            Metrics::count(&authority.metrics().enrollments, "renewed");
            tracing::info!(
                connector = %done.name,
                old_serial = %done.old_serial,
                serial = %done.response.serial,
                peer = ?peer,
                "certificate renewed"
            );
            Ok(Response::new(done.response))
        }
        Err(e) => {
            Metrics::count(&authority.metrics().enrollments, e.label());
            tracing::warn!(peer = ?peer, error = %e, "renewal refused");
            Err(e.into())
        }
    }
}

impl Authority {
    /// Renews the certificate presented as `certs` (the TLS peer chain,
    /// already verified against the root and its validity by TLS): checks
    /// its standing, signs the CSR's key into a certificate for the same
    /// connector, records it and starts the grace of the old one.
    pub fn renew(
        &self,
        certs: Option<&[impl AsRef<[u8]>]>,
        r: &v1::RenewRequest,
    ) -> Result<Renewed, RenewError> {
        let pki = self.pki().ok_or(RenewError::NoTls)?;
        let leaf = certs
            .and_then(|c| c.first())
            .ok_or(AuthError::NoClientCertificate)?;
        let id = crate::pki::identity_of(leaf.as_ref()).map_err(AuthError::BadCertificate)?;
        let state = self.snapshot();
        if !state.policy().has_group(&id.group) {
            return Err(AuthError::UnknownGroup(id.group).into());
        }
        let grace = state.settings().renewal_grace;
        drop(state);
        let issued = pki
            .issue(&id.name, &id.group, &r.csr_pem)
            .map_err(|e| match e {
                PkiError::InvalidCsr(m) => RenewError::Csr(format!("invalid CSR: {m}")),
                other => {
                    tracing::error!(error = %other, "cannot sign a client certificate");
                    RenewError::Internal
                }
            })?;
        let now = now_ms();
        self.store()
            .renew(&Renewal {
                name: &id.name,
                group: &id.group,
                old_serial: &id.serial,
                serial: &issued.serial,
                fingerprint: &issued.fingerprint,
                not_after_ms: issued.not_after_ms,
                now_ms: now,
                revoke_old_at_ms: now.saturating_add(millis(grace)),
            })
            .map_err(internal)??;
        Ok(Renewed {
            response: v1::EnrollResponse {
                certificate_pem: issued.pem,
                issuer_pem: pki.issuer_pem.clone(),
                serial: issued.serial,
                not_after_unix_ms: issued.not_after_ms,
                identity_uri: issued.identity_uri,
            },
            name: id.name,
            old_serial: id.serial,
        })
    }

    /// Revokes the superseded certificates whose grace has passed (run by
    /// housekeeping); a session still on one is refused at its next
    /// connect.
    pub fn revoke_superseded(&self) {
        match self.store().revoke_after_grace(now_ms()) {
            Ok(revoked) => {
                for (connector, serial) in revoked {
                    tracing::info!(%connector, %serial, "superseded certificate revoked after its grace");
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot revoke superseded certificates"),
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn internal(e: StoreError) -> RenewError {
    tracing::error!(error = %e, "renewal could not be recorded");
    RenewError::Internal
}
