//! Certificate renewal: when to renew (pure, time and randomness passed in)
//! and the task that renews, stores the new credentials and hands them to
//! the session, which moves onto them.
//!
//! A certificate is renewed at about two thirds of its lifetime (from
//! receipt to `notAfter`), with a uniformly random jitter of ±10 % of the
//! lifetime so that connectors enrolled together do not renew together. A
//! failed attempt is retried with backoff until the certificate expires;
//! then only enrolling again helps, which needs the provisioning key.

use std::path::PathBuf;
use std::time::Duration;

use rand::RngExt;
use tokio::sync::watch;

use crate::ca::dial::Dialer;
use crate::ca::enroll::{self, Enrollment};
use crate::config::ProvisioningKey;
use crate::retry::{backoff, stopped};

/// Fraction of the lifetime after which a certificate is renewed.
pub const RENEW_AT: (i64, i64) = (2, 3);
/// Jitter, as a fraction of the lifetime, either way.
pub const JITTER: (i64, i64) = (1, 10);

/// When to renew a certificate received at `issued_ms` that expires at
/// `not_after_ms` (Unix ms): two thirds into its lifetime, ± a tenth of it
/// at random, never before it was received nor after it expires.
pub fn renew_at(issued_ms: i64, not_after_ms: i64, rng: &mut impl rand::Rng) -> i64 {
    let lifetime = not_after_ms.saturating_sub(issued_ms).max(0);
    let base = issued_ms.saturating_add(lifetime / RENEW_AT.1 * RENEW_AT.0);
    let spread = lifetime / JITTER.1 * JITTER.0;
    let jitter = if spread > 0 {
        rng.random_range(-spread..=spread)
    } else {
        0
    };
    base.saturating_add(jitter)
        .clamp(issued_ms, not_after_ms.max(issued_ms))
}

/// When to renew certificate `serial` scheduled for `at_ms`: earlier when
/// the CA asked for it (an ask about another certificate is moot).
pub fn due(at_ms: i64, ask: Option<&crate::ca::trust::RenewAsk>, serial: &str) -> i64 {
    match ask {
        Some(a) if a.serial == serial => a.at_ms.min(at_ms),
        _ => at_ms,
    }
}

/// How long to wait from `now_ms` until `at_ms` (zero when it passed).
pub fn delay_until(now_ms: i64, at_ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(at_ms.saturating_sub(now_ms)).unwrap_or(0))
}

/// The wait before retry `attempt` of a failed renewal: the session's
/// backoff, but never past the certificate's expiry (one last attempt
/// just before it).
pub fn retry_delay(
    attempt: u32,
    now_ms: i64,
    not_after_ms: i64,
    rng: &mut impl rand::Rng,
) -> Duration {
    backoff(attempt, rng).min(delay_until(now_ms, not_after_ms))
}

/// What the renewal task needs.
#[derive(Clone, Debug)]
pub struct Renewer {
    /// The CA replicas (any one renews: they share the database).
    pub ca: Dialer,
    /// The state directory the credentials live in.
    pub state_dir: PathBuf,
    /// Connector name.
    pub name: String,
    /// Connector group.
    pub group: String,
    /// The provisioning key, if the connector was given one: used only
    /// when the certificate expired before it could be renewed.
    pub provisioning_key: Option<ProvisioningKey>,
}

impl Renewer {
    /// Renews `current` whenever due (or earlier when the CA asks, in a
    /// root rotation), for ever (until `stop`), publishing every new
    /// enrollment on `tx`.
    pub async fn run(
        self,
        mut current: Enrollment,
        tx: watch::Sender<Enrollment>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut asks = current.trust.asks();
        loop {
            let at = renew_at(current.issued_ms, current.not_after_ms, &mut rand::rng());
            let wait = delay_until(enroll::now_ms(), at);
            tracing::info!(serial = %current.serial, renew_in_ms = wait.as_millis(), "certificate renewal scheduled");
            loop {
                let due = due(at, asks.borrow_and_update().as_ref(), &current.serial);
                tokio::select! {
                    () = tokio::time::sleep(delay_until(enroll::now_ms(), due)) => break,
                    changed = asks.changed() => if changed.is_err() {
                        // No more asks: the scheduled time stands.
                        tokio::select! {
                            () = tokio::time::sleep(delay_until(enroll::now_ms(), at)) => break,
                            () = stopped(&mut stop) => return,
                        }
                    },
                    () = stopped(&mut stop) => return,
                }
            }
            let renewed = tokio::select! {
                r = self.renew(&current) => r,
                () = stopped(&mut stop) => return,
            };
            let Some(next) = renewed else { return };
            current = next;
            // The session moves onto the new certificate.
            tx.send_replace(current.clone());
        }
    }

    /// One renewal, retried until it succeeds or the certificate expires
    /// (then enrolling again with the provisioning key, if there is one).
    /// `None` when nothing more can be done.
    async fn renew(&self, current: &Enrollment) -> Option<Enrollment> {
        let mut attempt = 0u32;
        while !current.expired(enroll::now_ms()) {
            let renewed = enroll::on_any(&self.ca, |target| async move {
                enroll::renew(&target, current, &self.state_dir, &self.name, &self.group).await
            })
            .await;
            match renewed {
                Ok(next) => return Some(next),
                Err(e) => {
                    let delay = retry_delay(
                        attempt,
                        enroll::now_ms(),
                        current.not_after_ms,
                        &mut rand::rng(),
                    );
                    attempt = attempt.saturating_add(1);
                    let (delay_ms, not_after_ms) = (delay.as_millis(), current.not_after_ms);
                    match crate::retry::tls_hint(&e.to_string(), None) {
                        Some(hint) => {
                            tracing::warn!(error = %e, %hint, delay_ms, not_after_ms, "certificate renewal failed; retrying")
                        }
                        None => {
                            tracing::warn!(error = %e, delay_ms, not_after_ms, "certificate renewal failed; retrying")
                        }
                    }
                    tokio::time::sleep(delay.max(Duration::from_millis(50))).await;
                }
            }
        }
        self.reenroll(current).await
    }

    /// The certificate expired unrenewed: enroll again, which needs the
    /// provisioning key.
    async fn reenroll(&self, current: &Enrollment) -> Option<Enrollment> {
        let Some(key) = &self.provisioning_key else {
            tracing::error!(
                serial = %current.serial,
                "the connector certificate expired before it could be renewed, and this connector has no provisioning key: it cannot reconnect until it is enrolled again (connector-agent enroll with --provisioning-key-file)"
            );
            return None;
        };
        tracing::warn!(serial = %current.serial, "the connector certificate expired before it could be renewed: enrolling again with the provisioning key");
        let mut attempt = 0u32;
        loop {
            let enrolled = enroll::on_any(&self.ca, |target| async move {
                enroll::enroll(
                    &target,
                    &current.trust,
                    &self.state_dir,
                    &self.name,
                    &self.group,
                    key,
                )
                .await
            })
            .await;
            match enrolled {
                Ok(next) => return Some(next),
                Err(e) if e.retryable() => {
                    let delay = backoff(attempt, &mut rand::rng());
                    attempt = attempt.saturating_add(1);
                    let delay_ms = delay.as_millis();
                    match crate::retry::tls_hint(&e.to_string(), None) {
                        Some(hint) => {
                            tracing::warn!(error = %e, %hint, delay_ms, "enrollment failed; retrying")
                        }
                        None => tracing::warn!(error = %e, delay_ms, "enrollment failed; retrying"),
                    }
                    tokio::time::sleep(delay).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "enrolling again was refused; the connector cannot reconnect");
                    return None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn rng(seed: u64) -> rand::rngs::SmallRng {
        rand::rngs::SmallRng::seed_from_u64(seed)
    }

    #[test]
    fn renewal_falls_at_two_thirds_of_the_lifetime_within_the_jitter() {
        let year = 365 * 86_400_000_i64;
        let issued = 1_700_000_000_000;
        let mut r = rng(7);
        let mut seen = Vec::new();
        for _ in 0..500 {
            let at = renew_at(issued, issued + year, &mut r);
            let offset = at - issued;
            assert!(
                (year * 2 / 3 - year / 10..=year * 2 / 3 + year / 10).contains(&offset),
                "{offset}"
            );
            seen.push(offset);
        }
        // Jittered: connectors enrolled together spread out.
        let (min, max) = (seen.iter().min(), seen.iter().max());
        assert!(
            max.zip(min).is_some_and(|(a, b)| a - b > year / 10),
            "{min:?}..{max:?}"
        );
    }

    #[test]
    fn a_lifetime_of_seconds_renews_within_it() {
        let mut r = rng(1);
        for _ in 0..100 {
            let at = renew_at(10_000, 16_000, &mut r);
            assert!((13_400..=14_600).contains(&at), "{at}");
        }
        // Degenerate certificates: never before receipt, never after expiry.
        assert_eq!(renew_at(10_000, 10_000, &mut r), 10_000);
        assert_eq!(renew_at(10_000, 9_000, &mut r), 10_000);
    }

    #[test]
    fn the_cas_ask_brings_renewal_forward_for_its_certificate_only() {
        let ask = |serial: &str, at_ms| crate::ca::trust::RenewAsk {
            serial: serial.into(),
            at_ms,
        };
        assert_eq!(due(14_000, None, "s1"), 14_000);
        assert_eq!(due(14_000, Some(&ask("s1", 11_000)), "s1"), 11_000);
        // Never later than scheduled.
        assert_eq!(due(14_000, Some(&ask("s1", 20_000)), "s1"), 14_000);
        // An ask about the certificate renewed since is moot.
        assert_eq!(due(14_000, Some(&ask("s0", 11_000)), "s1"), 14_000);
    }

    #[test]
    fn the_wait_follows_the_injected_clock() {
        // Renew at 14 s: at 10 s wait 4 s, at 14 s or later not at all.
        assert_eq!(delay_until(10_000, 14_000), Duration::from_secs(4));
        assert_eq!(delay_until(14_000, 14_000), Duration::ZERO);
        assert_eq!(delay_until(20_000, 14_000), Duration::ZERO);
        // Retries never wait past the expiry.
        let mut r = rng(3);
        for attempt in 0..20 {
            assert!(retry_delay(attempt, 15_900, 16_000, &mut r) <= Duration::from_millis(100));
        }
        assert_eq!(retry_delay(5, 17_000, 16_000, &mut r), Duration::ZERO);
    }
}
