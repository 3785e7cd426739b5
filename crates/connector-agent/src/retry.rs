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

/// First retry delay after the CA refused the connector's credentials for
/// good (revoked, unknown, expired: re-enrollment needed): nothing changes
/// until an operator acts, so the connector asks rarely.
pub const REFUSED_BACKOFF_MIN: Duration = Duration::from_secs(60);

/// Longest such delay.
pub const REFUSED_BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

/// The delay before retry `attempt` (0-based) after such a refusal: one
/// minute doubling to 15, no jitter below half of it.
pub fn refused_backoff(attempt: u32, rng: &mut impl rand::Rng) -> Duration {
    let cap = REFUSED_BACKOFF_MIN
        .saturating_mul(2u32.saturating_pow(attempt.min(16)))
        .min(REFUSED_BACKOFF_MAX);
    let half = u64::try_from(cap.as_millis() / 2).unwrap_or(u64::MAX);
    Duration::from_millis(half + rng.random_range(0..=half))
}

/// What to do about a TLS error that refuses the CA's certificate: it does
/// not name the name the connector dialled (the CA's `[tls]
/// server_names`), or it does not chain to the root the connector trusts
/// (the `--ca-cert` file). `None` for any other error.
pub fn tls_hint(error: &str, ca_cert: Option<&std::path::Path>) -> Option<String> {
    name_hint(error).or_else(|| chain_hint(error, ca_cert))
}

/// rustls' "certificate not valid for name "NAME"; certificate is only
/// valid for …" (`NotValidForName`): the name dialled is in quotes.
fn name_hint(error: &str) -> Option<String> {
    const MARK: &str = "not valid for name ";
    if !error.contains(MARK) && !error.contains("NotValidForName") {
        return None;
    }
    let name = error
        .split_once(MARK)
        .and_then(|(_, rest)| rest.strip_prefix('"')?.split_once('"'))
        .map(|(name, _)| name)
        .filter(|name| !name.is_empty());
    Some(build_info::hints::name(name, "--ca"))
}

/// The certificate does not chain to the root in `--ca-cert`.
fn chain_hint(error: &str, ca_cert: Option<&std::path::Path>) -> Option<String> {
    let untrusted = [
        "UnknownIssuer",
        "BadSignature",
        "unknown issuer",
        "bad signature",
    ]
    .iter()
    .any(|m| error.contains(m));
    untrusted.then(|| build_info::hints::chain(ca_cert))
}

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
    fn refused_backoff_is_minutes() {
        let mut rng = rand::rng();
        for attempt in 0..20 {
            let d = refused_backoff(attempt, &mut rng);
            assert!(
                d >= REFUSED_BACKOFF_MIN / 2 && d <= REFUSED_BACKOFF_MAX,
                "{d:?}"
            );
        }
        assert!(refused_backoff(10, &mut rng) >= REFUSED_BACKOFF_MAX / 2);
    }

    #[test]
    fn an_untrusted_ca_certificate_names_the_file() {
        let path = std::path::Path::new("/etc/reach/ca.pem");
        let hint = tls_hint("invalid peer certificate: UnknownIssuer", Some(path));
        let hint = hint.expect("a hint");
        assert!(hint.contains("/etc/reach/ca.pem"), "{hint}");
        let see = build_info::hints::see(build_info::hints::CHAIN);
        assert!(hint.ends_with(&see), "{hint}");
        assert_eq!(tls_hint("connection refused", Some(path)), None);
    }

    #[test]
    fn a_certificate_for_other_names_names_the_name_dialled_and_server_names() {
        let path = std::path::Path::new("/etc/reach/ca.pem");
        // As tonic's transport error spells rustls' refusal.
        let error = "cannot reach the CA: https://10.77.0.1:7443: transport error: invalid peer certificate: certificate not valid for name \"10.77.0.1\"; certificate is only valid for IpAddress(127.0.0.1), IpAddress(0::1) or DnsName(\"localhost\")";
        let hint = tls_hint(error, Some(path)).expect("a hint");
        assert!(
            hint.contains("add \"10.77.0.1\" to [tls] server_names on the CA"),
            "{hint}"
        );
        assert!(!hint.contains("ca.pem"), "not the root's fault: {hint}");
        let see = build_info::hints::see(build_info::hints::NAME);
        assert!(hint.ends_with(&see), "{hint}");
        let by_name = "invalid peer certificate: certificate not valid for name \"reach-ca.example.test\"; certificate is only valid for DnsName(\"localhost\")";
        let hint = tls_hint(by_name, None).expect("a hint");
        assert!(
            hint.contains("add \"reach-ca.example.test\" to [tls] server_names on the CA"),
            "{hint}"
        );
        // rustls' error kind without the name.
        let hint = tls_hint("invalid peer certificate: NotValidForName", None).expect("a hint");
        assert!(hint.contains("[tls] server_names"), "{hint}");
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
