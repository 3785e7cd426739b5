//! Small statistics: percentiles of latencies, the busiest one-second
//! window of a series of start times.

use std::time::Duration;

/// The `q`-quantile (0..=1) of `sorted` (nearest rank), or zero when empty.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Milliseconds as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The largest number of `times` (sorted, seconds) inside any half-open
/// window `[t, t + width)`.
pub fn max_in_window(times: &[f64], width: f64) -> usize {
    let mut best = 0;
    let mut lo = 0;
    for hi in 0..times.len() {
        while times[hi] - times[lo] >= width {
            lo += 1;
        }
        best = best.max(hi - lo + 1);
    }
    best
}

/// The median of `xs` (the mean of the middle two for an even count; NaN
/// for none).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median over `runs` (one per trial) of `f`.
pub fn median_of<T>(runs: &[T], f: impl Fn(&T) -> f64) -> f64 {
    median(&runs.iter().map(f).collect::<Vec<_>>())
}

/// `f` of each of `runs`, two decimals, comma-separated: the per-trial
/// values a figure's note lists.
pub fn per_trial<T>(runs: &[T], f: impl Fn(&T) -> f64) -> String {
    runs.iter()
        .map(|r| format!("{:.2}", f(r)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&v, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn windows() {
        // Milliseconds, so every time is exact in binary.
        let t: Vec<f64> = (0..100).map(|k| k as f64 * 50.0).collect();
        assert_eq!(max_in_window(&t, 1000.0), 20);
        let mut t2 = t.clone();
        t2[20] = 999.5;
        assert_eq!(max_in_window(&t2, 1000.0), 21);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
        let runs = [(1, 10.0), (2, 30.0), (3, 20.0)];
        assert_eq!(median_of(&runs, |r| r.1), 20.0);
        assert_eq!(per_trial(&runs, |r| r.1 / 4.0), "2.50, 7.50, 5.00");
    }
}
