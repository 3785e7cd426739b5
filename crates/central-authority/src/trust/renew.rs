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

use crate::credentials::auth::AuthError;
use crate::credentials::pki::PkiError;
use crate::error::RenewError;
use crate::ground::clock::now_ms;
use crate::state::authority::Authority;
use crate::state::counters::Metrics;
use crate::store::{Renewal, StoreError};

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
        .blocking(move |a| renew(a, certs.as_deref().map(Vec::as_slice), &r))
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

/// Renews the certificate presented as `certs` (the TLS peer chain,
/// already verified against the root and its validity by TLS): checks
/// its standing, signs the CSR's key into a certificate for the same
/// connector, records it and starts the grace of the old one.
pub fn renew(
    authority: &Authority,
    certs: Option<&[impl AsRef<[u8]>]>,
    r: &v1::RenewRequest,
) -> Result<Renewed, RenewError> {
    let pki = authority.pki().ok_or(RenewError::NoTls)?;
    let leaf = certs
        .and_then(|c| c.first())
        .ok_or(AuthError::NoClientCertificate)?;
    let id =
        crate::credentials::pki::identity_of(leaf.as_ref()).map_err(AuthError::BadCertificate)?;
    // A connection from before a reload that removed its root renews
    // nothing.
    if pki.root_of(leaf.as_ref()).is_none() {
        return Err(AuthError::UntrustedRoot(id.serial).into());
    }
    let state = authority.snapshot();
    if !state.policy().has_group(&id.group) {
        return Err(AuthError::UnknownGroup(id.group).into());
    }
    let grace = state.settings().renewal_grace;
    drop(state);
    // Refuse a certificate that cannot renew before signing anything,
    // and before it counts against the connector's allowance (a revoked
    // certificate's holder cannot use up the live connector's).
    authority
        .store()
        .renewable(&id.name, &id.group, &id.serial, now_ms())
        .map_err(internal)??;
    authority.renew_limit().admit(&id.name)?;
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
    authority
        .store()
        .renew(&Renewal {
            name: &id.name,
            group: &id.group,
            old_serial: &id.serial,
            serial: &issued.serial,
            fingerprint: &issued.fingerprint,
            not_after_ms: issued.not_after_ms,
            now_ms: now,
            revoke_old_at_ms: now.saturating_add(millis(grace)),
            root_sha256: &issued.root,
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
/// housekeeping, which logs a failure: `housekeeping::Repeated`); a
/// session still on one is refused at its next connect.
pub fn revoke_superseded(authority: &Authority) -> Result<(), StoreError> {
    for (connector, serial) in authority.store().revoke_after_grace(now_ms())? {
        tracing::info!(%connector, %serial, "superseded certificate revoked after its grace");
    }
    Ok(())
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn internal(e: StoreError) -> RenewError {
    tracing::error!(error = %e, "renewal could not be recorded");
    RenewError::Internal
}
