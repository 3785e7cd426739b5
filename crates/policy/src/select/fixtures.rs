//! What the selection tests share: candidates by status, group, RTT and
//! place, and the draws they make over a seeded RNG.

use std::collections::BTreeSet;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use crate::location::Location;
use crate::model::HealthReporting;
use crate::select::{
    Candidate, Decision, Proximity, RefusalReason, Strategy, Tolerance, select, select_with,
};
use crate::status::Status;

pub(super) fn c(connector: &str, group: &str, connected: bool, status: Status) -> Candidate {
    Candidate {
        connector: connector.into(),
        group: group.into(),
        connected,
        drained: false,
        status,
        rtt: None,
        location: None,
    }
}

/// `c(…)`, drained.
pub(super) fn drained(connector: &str, group: &str, status: Status) -> Candidate {
    Candidate {
        drained: true,
        ..c(connector, group, true, status)
    }
}

/// The set of connectors `select` chooses over many draws; panics on a
/// refusal.
pub(super) fn chosen(
    candidates: &[Candidate],
    mode: HealthReporting,
    strategy: Strategy,
) -> BTreeSet<String> {
    let mut rng = SmallRng::seed_from_u64(7);
    (0..2000)
        .map(|_| match select(candidates, mode, strategy, &mut rng) {
            Decision::Selected { index } => candidates[index].connector.clone(),
            Decision::Refused(r) => panic!("refused: {r}"),
        })
        .collect()
}

pub(super) fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|&n| n.to_owned()).collect()
}

pub(super) fn refusal_of(
    candidates: &[Candidate],
    mode: HealthReporting,
    strategy: Strategy,
) -> RefusalReason {
    let mut rng = SmallRng::seed_from_u64(7);
    match select(candidates, mode, strategy, &mut rng) {
        Decision::Refused(r) => r,
        Decision::Selected { index } => panic!("selected {:?}", candidates[index]),
    }
}

pub(super) fn near(connector: &str, status: Status, rtt_ms: Option<f64>) -> Candidate {
    Candidate {
        rtt: rtt_ms.map(|ms| Duration::from_secs_f64(ms / 1000.0)),
        ..c(connector, "g", true, status)
    }
}

/// How often each candidate is chosen over `n` seeded draws.
pub(super) fn counts(
    candidates: &[Candidate],
    proximity: impl Into<Proximity>,
    n: usize,
) -> Vec<usize> {
    let proximity = proximity.into();
    let mut rng = SmallRng::seed_from_u64(16);
    let mut counts = vec![0; candidates.len()];
    for _ in 0..n {
        match select_with(
            candidates,
            HealthReporting::Continuous,
            Strategy::Nearest,
            proximity,
            &mut rng,
        ) {
            Decision::Selected { index } => counts[index] += 1,
            Decision::Refused(r) => panic!("refused: {r}"),
        }
    }
    counts
}

/// Pearson's chi-square of `got` against a uniform draw of `n`.
pub(super) fn chi_square_uniform(got: &[usize], n: usize) -> f64 {
    let expected = n as f64 / got.len() as f64;
    got.iter()
        .map(|&o| (o as f64 - expected).powi(2) / expected)
        .sum()
}

pub(super) const PARIS: (f64, f64) = (48.8566, 2.3522);
pub(super) const LONDON: (f64, f64) = (51.5074, -0.1278);
pub(super) const FRANKFURT: (f64, f64) = (50.1109, 8.6821);
pub(super) const NEW_YORK: (f64, f64) = (40.7128, -74.0060);

pub(super) fn place((lat, lon): (f64, f64)) -> Location {
    Location::new(lat, lon).expect("valid")
}

/// An Up candidate of `group`, which is at `at`, with an RTT of `rtt_ms`.
pub(super) fn located(
    connector: &str,
    group: &str,
    rtt_ms: f64,
    at: Option<(f64, f64)>,
) -> Candidate {
    Candidate {
        group: group.into(),
        location: at.map(place),
        ..near(connector, Status::Up, Some(rtt_ms))
    }
}

/// The user in Paris.
pub(super) fn from_paris() -> Proximity {
    Proximity {
        tolerance: Tolerance::default(),
        user: Some(place(PARIS)),
    }
}

/// The set `select_with` chooses over many draws with `proximity`.
pub(super) fn chosen_near(candidates: &[Candidate], proximity: Proximity) -> BTreeSet<String> {
    counts(candidates, proximity, 2000)
        .iter()
        .zip(candidates)
        .filter(|(n, _)| **n > 0)
        .map(|(_, c)| c.connector.clone())
        .collect()
}
