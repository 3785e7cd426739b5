//! What every CA session shares: who the connector is and how it proves it
//! ([`SessionOptions`]), the parts the sessions drive ([`Parts`]: one
//! scheduler, one pacer, one prober, one resolver however many replicas),
//! and how the assignment in force is applied to those parts (segments to
//! the scheduler; the CA's rate, probe timeout and DNS mode held to the
//! local ceilings).

use std::sync::Arc;
use std::time::Duration;

use policy::Segment;
use protocol::v1;
use tokio::sync::watch;

use crate::ca::enroll::Enrollment;
use crate::checks::pacer::Pacer;
use crate::checks::probe::Prober;
use crate::config::{Ceilings, ProvisioningKey};
use crate::metrics::Metrics;
use crate::resolver::Resolver;
use crate::schedule::{DEFAULT_WINDOW, Scheduler};
use crate::session::follow::Assignments;

/// Who the connector is: the name and group its `Hello` states (and, with
/// TLS, its certificate already proves).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Connector name, unique in the deployment.
    pub name: String,
    /// Connector group.
    pub group: String,
}

/// How a session proves the connector's identity to the CA.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// Mutual TLS with the client certificate from `Enrollment.Enroll`: the
    /// normal case, an `https://` CA.
    Certificate(Enrollment),
    /// The group's provisioning key in `x-reach-provisioning-key` metadata
    /// on every session, over plain text: only a CA run with
    /// `[tls] enabled = false` (local experiments) accepts it.
    ProvisioningKey(ProvisioningKey),
}

/// What a session needs besides the CA's address: who the connector is,
/// how it proves it, and the connector's own check settings.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// Name and group.
    pub identity: Identity,
    /// Certificate or (plain text only) provisioning key.
    pub credentials: Credentials,
    /// The connector's own rate limit: announced in `Hello`, and in force
    /// whenever the CA's `ConnectorSettings` leave it at 0.
    pub checks_per_second: u32,
    /// The connector's own probe timeout, in force whenever the CA's
    /// `ConnectorSettings` leave it at 0.
    pub check_timeout: Duration,
    /// Renewed certificates, when a renewal task runs: each one replaces
    /// `credentials` and the session moves onto it.
    pub renewals: Option<watch::Receiver<Enrollment>>,
    /// The most the CA may ask for (`--max-checks-per-second`,
    /// `--max-check-timeout-ms`).
    pub ceilings: Ceilings,
    /// Longest reconnect backoff: [`crate::retry::BACKOFF_MAX`], or
    /// [`crate::retry::REPLICA_BACKOFF_MAX`] for one of several replicas.
    pub reconnect_max: Duration,
    /// `--ca-cert`, named when a TLS error says the CA's certificate does
    /// not chain to it.
    pub ca_cert: Option<std::path::PathBuf>,
}

/// Everything the sessions drive.
#[derive(Clone, Debug)]
pub struct Parts {
    /// The scheduler.
    pub scheduler: Scheduler,
    /// The pacer (rate overrides, load).
    pub pacer: Pacer,
    /// The prober (timeout overrides, ICMP capability).
    pub prober: Arc<Prober>,
    /// Metrics.
    pub metrics: Metrics,
    /// The resolver (the group's `dns_resolution`).
    pub resolver: Resolver,
    /// Every session's assignment and which one is in force.
    pub assignments: Arc<Assignments>,
    /// `Some(when)` once the connector drains before it stops: it closes
    /// its sessions at `when`; each session tells its CA replica
    /// (`v1::Drain`).
    pub draining: watch::Receiver<Option<std::time::Instant>>,
}

impl Parts {
    /// Session `id` was welcomed with, or updated to, this assignment;
    /// returns once the assignment in force reflects it ([`Assignments`]).
    pub async fn assigned(
        &self,
        id: u64,
        segments: Vec<v1::Segment>,
        settings: Option<v1::ConnectorSettings>,
        options: &SessionOptions,
    ) {
        self.assignments
            .assigned(
                id,
                segments,
                settings,
                &self.metrics,
                |segments, settings| self.apply(segments, settings, options),
            )
            .await;
    }

    /// Session `id` ended; the assignment in force may change.
    pub async fn left(&self, id: u64, options: &SessionOptions) {
        self.assignments
            .left(id, &self.metrics, |segments, settings| {
                self.apply(segments, settings, options)
            })
            .await;
    }

    /// Puts the followed assignment in force: its settings, then its
    /// segments.
    async fn apply(
        &self,
        segments: Vec<v1::Segment>,
        settings: Option<v1::ConnectorSettings>,
        options: &SessionOptions,
    ) {
        let window = apply_settings(settings.as_ref(), options, self);
        self.scheduler.apply(self::segments(segments), window).await;
    }
}

/// The CA's rate limit and probe timeout held to the local ceilings; a 0
/// from the CA means the connector's own value. Returns the effective pair
/// and whether anything was clamped.
pub fn effective_limits(
    ca_checks_per_second: u32,
    ca_check_timeout_ms: u32,
    options: &SessionOptions,
) -> (u32, Duration, bool) {
    let ceilings = options.ceilings;
    let rate = policy::effective_rate(
        ca_checks_per_second,
        Some(ceilings.checks_per_second),
        &[options.checks_per_second],
    );
    let timeout = match ca_check_timeout_ms {
        0 => options.check_timeout,
        ms => Duration::from_millis(u64::from(ms)).min(ceilings.check_timeout),
    };
    let clamped = ca_checks_per_second > ceilings.checks_per_second
        || Duration::from_millis(u64::from(ca_check_timeout_ms)) > ceilings.check_timeout;
    (rate, timeout, clamped)
}

/// Applies the followed assignment's `ConnectorSettings` (rate and probe
/// timeout, held to the ceilings); returns the on-access window.
pub(crate) fn apply_settings(
    settings: Option<&v1::ConnectorSettings>,
    options: &SessionOptions,
    parts: &Parts,
) -> Duration {
    let s = settings.cloned().unwrap_or_default();
    let window = match s.on_access_window_ms {
        0 => DEFAULT_WINDOW,
        ms => Duration::from_millis(ms),
    };
    let (rate, timeout, clamped) =
        effective_limits(s.checks_per_second, s.check_timeout_ms, options);
    if clamped {
        tracing::warn!(
            ca_checks_per_second = s.checks_per_second,
            ca_check_timeout_ms = s.check_timeout_ms,
            checks_per_second = rate,
            check_timeout_ms = timeout.as_millis(),
            "the CA asks for more than --max-checks-per-second / --max-check-timeout-ms allow; clamped"
        );
    }
    // The heartbeat's `rate_limit` and the metrics read the pacer, so they
    // show the effective (clamped) rate.
    parts.pacer.set_rate(rate);
    parts.prober.set_timeout(timeout);
    parts
        .resolver
        .set_dns_resolution(protocol::convert::dns_resolution_from_wire(
            s.dns_resolution,
        ));
    window
}

/// Segments from the wire; an invalid one is logged and skipped, never
/// fatal.
pub(crate) fn segments(wire: Vec<v1::Segment>) -> Vec<Segment> {
    wire.into_iter()
        .filter_map(|s| match Segment::try_from(s) {
            Ok(segment) => Some(segment),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring an invalid segment from the CA");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retry::BACKOFF_MAX;

    #[test]
    fn options_never_print_the_provisioning_key() {
        let options = SessionOptions {
            identity: Identity {
                name: "c1".into(),
                group: "g".into(),
            },
            credentials: Credentials::ProvisioningKey(ProvisioningKey::new("s3cret-key")),
            checks_per_second: 20,
            check_timeout: Duration::from_secs(1),
            renewals: None,
            ceilings: Ceilings::default(),
            reconnect_max: BACKOFF_MAX,
            ca_cert: None,
        };
        let printed = format!("{options:?}");
        assert!(printed.contains("c1"), "{printed}");
        assert!(!printed.contains("s3cret-key"), "{printed}");
    }

    fn options(rate: u32, timeout_ms: u64, max_rate: u32, max_timeout_ms: u64) -> SessionOptions {
        SessionOptions {
            identity: Identity {
                name: "c1".into(),
                group: "g".into(),
            },
            credentials: Credentials::ProvisioningKey(ProvisioningKey::new("k")),
            checks_per_second: rate,
            check_timeout: Duration::from_millis(timeout_ms),
            renewals: None,
            ceilings: Ceilings {
                checks_per_second: max_rate,
                check_timeout: Duration::from_millis(max_timeout_ms),
            },
            reconnect_max: BACKOFF_MAX,
            ca_cert: None,
        }
    }

    #[test]
    fn the_cas_rate_and_timeout_are_held_to_the_local_ceilings() {
        let o = options(10, 1000, 20, 5000);
        // A CA asking for a fast scan gets the ceiling.
        assert_eq!(
            effective_limits(10_000, 60_000, &o),
            (20, Duration::from_secs(5), true)
        );
        // Within the ceilings the CA's values hold.
        assert_eq!(
            effective_limits(15, 2000, &o),
            (15, Duration::from_secs(2), false)
        );
        // 0 means the connector's own.
        assert_eq!(
            effective_limits(0, 0, &o),
            (10, Duration::from_secs(1), false)
        );
    }
}
