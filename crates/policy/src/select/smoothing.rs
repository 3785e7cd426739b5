//! The smoothed connector→application RTT the nearest strategy compares:
//! one sample per report (`rtt_sample`), folded into an exponentially
//! weighted moving average (`smooth_rtt`).

use std::time::Duration;

use crate::status::AddressResult;

/// Weight of a new sample in the smoothed RTT (an exponentially weighted
/// moving average): 0.3 follows a lasting change within a few reports
/// without letting one slow handshake move a connector out of the band.
pub const RTT_WEIGHT: f64 = 0.3;

/// The smoothed RTT after `sample`: the sample itself when there was none
/// before, else `RTT_WEIGHT` of it plus the rest of `previous`.
pub fn smooth_rtt(previous: Option<Duration>, sample: Duration) -> Duration {
    match previous {
        None => sample,
        // In integer nanoseconds: `mul_f64` goes through `from_secs_f64`,
        // whose checks were a visible share of the CA's CPU per report
        // (the CA smooths on every report it stores). The result is the
        // exact weighted mean rounded down; the float one differs from it
        // by a nanosecond or two.
        Some(p) => {
            let tenths =
                p.as_nanos() * (10 - RTT_WEIGHT_TENTHS) + sample.as_nanos() * RTT_WEIGHT_TENTHS;
            u64::try_from(tenths / 10).map_or(Duration::from_nanos(u64::MAX), Duration::from_nanos)
        }
    }
}

/// `RTT_WEIGHT` in tenths, which `smooth_rtt` computes with.
const RTT_WEIGHT_TENTHS: u128 = 3;

/// One report's RTT sample: the mean over its reachable addresses (`None`
/// when none was reachable: a failure says nothing about distance).
pub fn rtt_sample(addresses: &[AddressResult]) -> Option<Duration> {
    let reachable = addresses.iter().filter(|a| a.reachable);
    let n = u32::try_from(reachable.clone().count()).ok()?;
    (n > 0).then(|| reachable.map(|a| a.rtt).sum::<Duration>() / n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_is_smoothed_per_report_from_reachable_addresses() {
        use crate::status::{AddressResult, Method};
        let ms = Duration::from_millis;
        assert_eq!(smooth_rtt(None, ms(10)), ms(10));
        let s = smooth_rtt(Some(ms(10)), ms(20));
        assert!((s.as_secs_f64() - 0.013).abs() < 1e-9, "{s:?}");
        // The integer arithmetic is the weight's, within a nanosecond.
        assert_eq!(RTT_WEIGHT_TENTHS as f64 / 10.0, RTT_WEIGHT);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (p, n) = (
                Duration::from_nanos(x % 10_000_000_000),
                Duration::from_nanos((x >> 20) % 10_000_000_000),
            );
            let float = p.mul_f64(1.0 - RTT_WEIGHT) + n.mul_f64(RTT_WEIGHT);
            let int = smooth_rtt(Some(p), n);
            let apart = int.abs_diff(float);
            assert!(
                apart <= Duration::from_nanos(2),
                "{p:?} {n:?}: {int:?} vs {float:?}"
            );
        }
        // Beyond what nanoseconds in a u64 hold (a broken peer's RTT), no
        // overflow.
        assert_eq!(
            smooth_rtt(Some(Duration::MAX), Duration::MAX),
            Duration::from_nanos(u64::MAX)
        );
        // A lasting change is followed within a few reports.
        let mut rtt = ms(1);
        for _ in 0..10 {
            rtt = smooth_rtt(Some(rtt), ms(50));
        }
        assert!(rtt > ms(48), "{rtt:?}");
        let addr = |ip: &str, reachable: bool, rtt_ms: u64| AddressResult {
            check: None,
            address: ip.parse().expect("ip"),
            reachable,
            method: Method::Tcp,
            rtt: ms(rtt_ms),
            failure: None,
        };
        assert_eq!(
            rtt_sample(&[addr("10.0.0.1", true, 2), addr("10.0.0.2", true, 4)]),
            Some(ms(3))
        );
        assert_eq!(
            rtt_sample(&[addr("10.0.0.1", true, 2), addr("10.0.0.2", false, 0)]),
            Some(ms(2))
        );
        assert_eq!(rtt_sample(&[addr("10.0.0.1", false, 0)]), None);
        assert_eq!(rtt_sample(&[]), None);
    }
}
