//! How the connector retries what fails and stops what runs: reconnect
//! and retry delays (exponential backoff with full jitter), errors spelled
//! out with their sources for the logs, and the stop flag every loop
//! watches. Sessions, enrollment and renewal all retry this way.

use std::time::Duration;

use rand::RngExt;
use tokio::sync::watch;

/// First reconnect delay (before jitter).
pub const BACKOFF_MIN: Duration = Duration::from_millis(500);

/// Longest reconnect delay (before jitter).
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Longest reconnect delay (before jitter) to one of several CA replicas:
/// a replica that restarts must have every connector back within seconds
/// (its table is whole within two report intervals), and retrying one
/// address of several every few seconds costs little.
pub const REPLICA_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// An error with its sources (tonic's transport errors say only
/// "transport error" at the top).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

/// The backoff before reconnect attempt `attempt` (0-based), before jitter:
/// 0.5 s doubling to 30 s.
pub fn backoff_cap(attempt: u32) -> Duration {
    BACKOFF_MIN
        .saturating_mul(2u32.saturating_pow(attempt.min(16)))
        .min(BACKOFF_MAX)
}

/// Full jitter: a uniformly random delay up to the cap.
pub fn backoff(attempt: u32, rng: &mut impl rand::Rng) -> Duration {
    backoff_within(attempt, BACKOFF_MAX, rng)
}

/// Full jitter up to the cap, the cap held to `max`.
pub fn backoff_within(attempt: u32, max: Duration, rng: &mut impl rand::Rng) -> Duration {
    let cap = u64::try_from(backoff_cap(attempt).min(max).as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rng.random_range(0..=cap))
}

/// Completes when the stop flag turns true (or its sender is gone).
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_half_a_second_to_thirty() {
        let caps: Vec<u64> = (0..10).map(|a| backoff_cap(a).as_millis() as u64).collect();
        assert_eq!(
            caps,
            [
                500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000
            ]
        );
        assert_eq!(backoff_cap(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn jitter_stays_within_the_cap() {
        let mut rng = rand::rng();
        for attempt in 0..8 {
            for _ in 0..100 {
                assert!(backoff(attempt, &mut rng) <= backoff_cap(attempt));
            }
        }
    }
}
