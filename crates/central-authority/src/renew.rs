//! Certificate renewal (`Enrollment.Renew`): a connector exchanges its
//! current, valid certificate for a new one over a new key, with no
//! provisioning key, and the CA revokes the superseded certificate after a
//! grace (`[tls] renewal_grace_s`) so that a live session can move over.
//!
//! **Invariant:** the identity renewed is the one of the client certificate
//! on the TLS connection, never anything in the request; only the CSR's
//! public key is taken from it.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::HashMapStateStore;
use governor::{Quota, RateLimiter};

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
    /// The connector renewed too often (see [`RenewLimit`]).
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

impl From<RenewError> for Status {
    fn from(e: RenewError) -> Self {
        let message = e.to_string();
        match e {
            RenewError::Auth(a) => a.into(),
            RenewError::NoTls => Status::failed_precondition(message),
            RenewError::Refused(RenewRefusal::Unknown(_)) => Status::unauthenticated(message),
            RenewError::Refused(_) => Status::permission_denied(message),
            RenewError::Csr(_) => Status::invalid_argument(message),
            RenewError::TooFrequent { .. } => Status::resource_exhausted(message),
            RenewError::Internal => Status::internal(message),
        }
    }
}

type Keyed<C> =
    RateLimiter<String, HashMapStateStore<String>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// How often one connector may renew: each renewal signs a certificate and
/// records it, so a connector (or a stolen certificate) renewing in a loop
/// would cost CPU and grow the store without end. A healthy connector renews
/// at two thirds of its lifetime (hours to months); the burst leaves room
/// for retries after a lost response and for tests with lifetimes of a
/// minute. Counted per connector name, whichever certificate it presents.
pub struct RenewLimit<C: Clock = DefaultClock> {
    limiter: Keyed<C>,
    clock: C,
    burst: u32,
    period: Duration,
}

impl<C: Clock> std::fmt::Debug for RenewLimit<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenewLimit")
            .field("burst", &self.burst)
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}

impl RenewLimit<DefaultClock> {
    /// Five renewals per connector, then one per minute.
    pub fn new() -> Self {
        Self::with_clock(5, Duration::from_secs(60), DefaultClock::default())
    }
}

impl Default for RenewLimit<DefaultClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock + Clone> RenewLimit<C> {
    /// `burst` renewals per connector, then one per `period`, on `clock`.
    pub fn with_clock(burst: u32, period: Duration, clock: C) -> Self {
        let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        let period = period.max(Duration::from_millis(1));
        let quota = Quota::with_period(period)
            .map(|q| q.allow_burst(burst))
            .unwrap_or_else(|| Quota::per_minute(burst));
        RenewLimit {
            limiter: RateLimiter::hashmap_with_clock(quota, clock.clone()),
            clock,
            burst: burst.get(),
            period,
        }
    }

    /// Takes one renewal of `name`'s allowance, or says when it refills.
    pub fn admit(&self, name: &str) -> Result<(), RenewError> {
        self.limiter
            .check_key(&name.to_owned())
            .map_err(|not_until| {
                let wait = not_until.wait_time_from(self.clock.now());
                RenewError::TooFrequent {
                    name: name.to_owned(),
                    burst: self.burst,
                    period_s: self.period.as_secs(),
                    retry_after_s: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
                }
            })
    }

    /// Forgets connectors whose allowance is full again (housekeeping).
    pub fn retain_recent(&self) {
        self.limiter.retain_recent();
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
        // Refuse a certificate that cannot renew before signing anything,
        // and before it counts against the connector's allowance (a revoked
        // certificate's holder cannot use up the live connector's).
        self.store()
            .renewable(&id.name, &id.group, &id.serial, now_ms())
            .map_err(internal)??;
        self.renew_limit().admit(&id.name)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use governor::clock::FakeRelativeClock;

    #[test]
    fn a_connector_renewing_in_a_loop_is_refused_after_its_burst_until_the_period_passes() {
        let clock = FakeRelativeClock::default();
        let limit = RenewLimit::with_clock(3, Duration::from_secs(60), clock.clone());
        for _ in 0..3 {
            limit.admit("c1").expect("within the burst");
        }
        let refused = limit.admit("c1").expect_err("past the burst");
        assert_eq!(refused.label(), "renew_rate_limited");
        let RenewError::TooFrequent { retry_after_s, .. } = &refused else {
            panic!("{refused:?}");
        };
        assert_eq!(*retry_after_s, 60);
        assert!(refused.to_string().contains("\"c1\""), "{refused}");
        assert_eq!(Status::from(refused).code(), tonic::Code::ResourceExhausted);
        // Another connector has its own allowance.
        limit.admit("c2").expect("another connector");
        clock.advance(Duration::from_secs(59));
        assert!(limit.admit("c1").is_err(), "not refilled yet");
        clock.advance(Duration::from_secs(1));
        limit.admit("c1").expect("one more after the period");
        assert!(limit.admit("c1").is_err(), "and only one");
    }
}
