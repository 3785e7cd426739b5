//! Pacing precision at 20 checks/s: the agent's pacer (governor on an ideal
//! timeline plus a one-second window) starting real checks, next to a bare
//! governor `until_ready` loop with burst 1 run at the same time. From the
//! start times (the instant each probe began, as the pacer reports it): the
//! long-run rate, the wall time 6,000 checks would take, and the largest
//! number of starts in any one-second window.

use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use connector_agent::IcmpPreference;
use connector_agent::metrics::Metrics;
use connector_agent::pacer::{Pacer, Priority};
use connector_agent::probe::Prober;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use governor::{Quota, RateLimiter};
use policy::{CheckTarget, Protocol};

use super::Spec;
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::stats::max_in_window;

const RATE: u32 = 20;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "pacing_long_run_rate",
        unit: "checks/s",
        goal: Goal::Within {
            target: 20.0,
            tolerance: 0.05,
        },
    },
    Spec {
        name: "pacing_6000_checks_wall_s",
        unit: "s",
        goal: Goal::Within {
            target: 300.0,
            tolerance: 0.75,
        },
    },
    Spec {
        name: "pacing_max_starts_in_1s",
        unit: "checks",
        goal: Goal::AtMost { limit: 20.0 },
    },
];

/// Long-run rate of sorted start times (seconds): intervals / span.
fn rate(starts: &[f64]) -> f64 {
    match (starts.first(), starts.last()) {
        (Some(a), Some(b)) if b > a => (starts.len() - 1) as f64 / (b - a),
        _ => 0.0,
    }
}

/// The shortest time 21 consecutive starts took (below 1 s means some
/// one-second window held 21).
fn min_span_21(starts: &[f64]) -> f64 {
    starts
        .windows(RATE as usize + 1)
        .map(|w| w[RATE as usize] - w[0])
        .fold(f64::INFINITY, f64::min)
}

async fn reach(checks: usize) -> Vec<f64> {
    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_secs(1)));
    let (pacer, task) = Pacer::spawn(prober, RATE, 256, Metrics::new());
    let t0 = Instant::now();
    // Distinct targets (the pacer merges checks of one target); nothing
    // listens on 127.3.x.y:9, so each check is a refused handshake. The
    // time recorded is when the probe started, not when it completed, so the
    // handshake's own latency does not blur the windows.
    let mut pending: FuturesUnordered<_> = (0..checks)
        .map(|k| {
            let target = CheckTarget {
                address: IpAddr::V4(Ipv4Addr::new(127, 3, (k / 250) as u8, (k % 250) as u8 + 1)),
                protocol: Protocol::Tcp,
                port: 9,
            };
            let pacer = pacer.clone();
            async move {
                let (_, started) = pacer
                    .check_timed(target, Priority::Continuous, Duration::ZERO)
                    .await;
                started
                    .map(tokio::time::Instant::into_std)
                    .unwrap_or_else(Instant::now)
                    .duration_since(t0)
                    .as_secs_f64()
            }
        })
        .collect();
    let mut times = Vec::with_capacity(checks);
    while let Some(t) = pending.next().await {
        times.push(t);
    }
    task.abort();
    times.sort_by(f64::total_cmp);
    times
}

async fn bare(checks: usize) -> Vec<f64> {
    let limiter = RateLimiter::direct(
        Quota::per_second(NonZeroU32::new(RATE).unwrap_or(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::MIN),
    );
    let t0 = Instant::now();
    let mut times = Vec::with_capacity(checks);
    for _ in 0..checks {
        limiter.until_ready().await;
        times.push(t0.elapsed().as_secs_f64());
    }
    times
}

/// Runs both for the mode's duration, side by side.
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let seconds = mode.pick(2usize, 30);
    let checks = seconds * RATE as usize + 1;
    let (r, b) = tokio::join!(reach(checks), bare(checks));
    let (rr, br) = (rate(&r), rate(&b));
    let (rw, bw) = (max_in_window(&r, 1.0), max_in_window(&b, 1.0));
    let span = |s: &[f64]| s.last().copied().unwrap_or(0.0) - s.first().copied().unwrap_or(0.0);
    Ok(vec![
        SPECS[0].figure(
            rr,
            Some(br),
            format!(
                "{checks} checks started by the agent's Pacer at {RATE}/s (first to last start \
                 {:.3} s) vs a bare governor Quota::per_second({RATE}), burst 1, until_ready loop \
                 ({:.3} s), run side by side",
                span(&r),
                span(&b)
            ),
        ),
        SPECS[1].figure(
            6000.0 / rr.max(f64::MIN_POSITIVE),
            Some(6000.0 / br.max(f64::MIN_POSITIVE)),
            "6,000 periods at the measured long-run rate (6,000 / rate)",
        ),
        SPECS[2].figure(
            rw as f64,
            Some(bw as f64),
            format!(
                "busiest half-open 1-s window of start times (check completion, refused \
                 handshake); shortest span of {} consecutive starts: {:.4} s (reach), {:.4} s (bare)",
                RATE + 1,
                min_span_21(&r),
                min_span_21(&b)
            ),
        ),
    ])
}
