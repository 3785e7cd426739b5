//! Readiness warm-up: a CA that has just started (a restarted replica) has
//! an empty health table, and would answer `no_connector` to users a load
//! balancer sends it. `/readyz` says not ready until the table is warm:
//! every connector the store knows that may attach (enrolled before this
//! process started, still enrolled, not disabled, holding a valid
//! certificate, in a group of the policy) has re-attached and sent its full
//! state, or `[health] warmup_ms` has passed since the start, whichever
//! comes first, so that connectors that are really gone cannot keep a
//! replica out of service for ever. Once warm, it stays warm: connectors
//! coming and going later is ordinary operation, not a warm-up.
//!
//! This module only keeps the state and decides; the caller (`/readyz`
//! in `api::http::operations`) reads the expected connectors from the
//! store and passes the time in.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::ground::sync::lock;

/// How many of the connectors still awaited a not-ready answer names.
pub const NAMED_AT_MOST: usize = 10;

/// The warm-up state of one CA process.
#[derive(Debug)]
pub struct Warmup {
    /// When the process started (the bound counts from here).
    started: Instant,
    /// The same moment on the wall clock, Unix ms: connectors enrolled
    /// after it were never attached to the previous run.
    started_ms: i64,
    /// Latched: set once warm, never cleared.
    warm: AtomicBool,
    /// Connectors that sent a full-state report since the start (emptied
    /// once warm).
    reported: Mutex<BTreeSet<String>>,
}

/// Whether the health table is warm, and if not, how far along.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Warmth {
    /// Ready as far as the warm-up goes.
    Warm,
    /// Still warming up.
    Warming {
        /// Expected connectors that have reported their full state.
        reported: usize,
        /// Connectors expected.
        expected: usize,
        /// The first (by name) of those not yet reported, at most
        /// [`NAMED_AT_MOST`].
        waiting_for: Vec<String>,
        /// Time left until the bound makes the CA ready regardless.
        left: Duration,
    },
}

impl Warmth {
    /// The reason a not-ready answer gives.
    pub fn message(&self) -> String {
        match self {
            Warmth::Warm => "warm".to_owned(),
            Warmth::Warming {
                reported,
                expected,
                waiting_for,
                left,
            } => {
                let more = expected.saturating_sub(*reported);
                let named = if waiting_for.len() < more {
                    format!("{}, …", waiting_for.join(", "))
                } else {
                    waiting_for.join(", ")
                };
                format!(
                    "warming up: {reported} of {expected} connectors re-attached and reported their state (waiting for {named}); ready in at most {} s regardless ([health] warmup_ms)",
                    left.as_secs().max(1)
                )
            }
        }
    }
}

impl Warmup {
    /// A warm-up starting at `started` (`started_ms` on the wall clock).
    pub fn new(started: Instant, started_ms: i64) -> Self {
        Warmup {
            started,
            started_ms,
            warm: AtomicBool::new(false),
            reported: Mutex::new(BTreeSet::new()),
        }
    }

    /// When the process started, Unix ms.
    pub fn started_ms(&self) -> i64 {
        self.started_ms
    }

    /// Whether the warm-up is over (cheap: one atomic load).
    pub fn is_warm(&self) -> bool {
        self.warm.load(Ordering::Acquire)
    }

    /// Records that `connector` sent its full state (after its report was
    /// taken into the table).
    pub fn full_state(&self, connector: &str) {
        if self.is_warm() {
            return;
        }
        let mut reported = lock(&self.reported);
        if !reported.contains(connector) {
            reported.insert(connector.to_owned());
        }
    }

    /// Decides at `now`, given the connectors expected to re-attach and the
    /// bound. Latches `Warm`.
    pub fn check<'a>(
        &self,
        expected: impl IntoIterator<Item = &'a str>,
        bound: Duration,
        now: Instant,
    ) -> Warmth {
        if self.is_warm() {
            return Warmth::Warm;
        }
        let expected: BTreeSet<&str> = expected.into_iter().collect();
        let elapsed = now.saturating_duration_since(self.started);
        let mut reported = lock(&self.reported);
        let waiting: Vec<&str> = expected
            .iter()
            .copied()
            .filter(|c| !reported.contains(*c))
            .collect();
        if waiting.is_empty() || elapsed >= bound {
            self.warm.store(true, Ordering::Release);
            reported.clear();
            drop(reported);
            if expected.is_empty() {
                tracing::info!("warm: the store knows no connector to wait for");
            } else if waiting.is_empty() {
                tracing::info!(
                    connectors = expected.len(),
                    after_ms = elapsed.as_millis(),
                    "warm: every expected connector re-attached and reported"
                );
            } else {
                tracing::warn!(
                    missing = waiting.len(),
                    first = ?waiting.iter().take(NAMED_AT_MOST).collect::<Vec<_>>(),
                    bound_ms = bound.as_millis(),
                    "warm-up bound reached: ready although connectors known to the store did not re-attach"
                );
            }
            return Warmth::Warm;
        }
        Warmth::Warming {
            reported: expected.len() - waiting.len(),
            expected: expected.len(),
            waiting_for: waiting
                .iter()
                .take(NAMED_AT_MOST)
                .map(|c| (*c).to_owned())
                .collect(),
            left: bound - elapsed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(30);

    #[test]
    fn warm_once_every_expected_connector_reported_and_then_latched() {
        let t0 = Instant::now();
        let w = Warmup::new(t0, 0);
        let warming = w.check(["c1", "c2"], BOUND, t0);
        assert_eq!(
            warming,
            Warmth::Warming {
                reported: 0,
                expected: 2,
                waiting_for: vec!["c1".into(), "c2".into()],
                left: BOUND,
            }
        );
        assert!(
            warming.message().contains("0 of 2"),
            "{}",
            warming.message()
        );
        w.full_state("c1");
        // A connector the store does not expect does not count.
        w.full_state("stranger");
        let now = t0 + Duration::from_secs(1);
        match w.check(["c1", "c2"], BOUND, now) {
            Warmth::Warming {
                reported: 1,
                expected: 2,
                waiting_for,
                ..
            } => assert_eq!(waiting_for, ["c2"]),
            other => panic!("{other:?}"),
        }
        w.full_state("c2");
        assert_eq!(w.check(["c1", "c2"], BOUND, now), Warmth::Warm);
        assert!(w.is_warm());
        // Latched: a connector the store learns of later does not make a
        // warm CA unready.
        assert_eq!(w.check(["c1", "c2", "c3"], BOUND, now), Warmth::Warm);
    }

    #[test]
    fn the_bound_makes_it_warm_although_connectors_never_come_back() {
        let t0 = Instant::now();
        let w = Warmup::new(t0, 0);
        let just_before = t0 + BOUND - Duration::from_millis(1);
        assert!(matches!(
            w.check(["gone"], BOUND, just_before),
            Warmth::Warming { left, .. } if left == Duration::from_millis(1)
        ));
        assert_eq!(w.check(["gone"], BOUND, t0 + BOUND), Warmth::Warm);
        // A zero bound: warm at once.
        let w = Warmup::new(t0, 0);
        assert_eq!(w.check(["gone"], Duration::ZERO, t0), Warmth::Warm);
    }

    #[test]
    fn nothing_expected_is_warm_at_once() {
        let t0 = Instant::now();
        let w = Warmup::new(t0, 0);
        assert_eq!(w.check([], BOUND, t0), Warmth::Warm);
    }

    #[test]
    fn the_message_names_at_most_a_few_connectors() {
        let t0 = Instant::now();
        let w = Warmup::new(t0, 0);
        let names: Vec<String> = (0..25).map(|i| format!("c{i:02}")).collect();
        let warmth = w.check(names.iter().map(String::as_str), BOUND, t0);
        let message = warmth.message();
        assert!(message.contains("0 of 25"), "{message}");
        assert!(message.contains("c09, …"), "{message}");
        assert!(!message.contains("c10"), "{message}");
    }
}
