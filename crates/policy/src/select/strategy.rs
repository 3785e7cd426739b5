//! Each strategy's draw: `select` takes uniformly among the candidates
//! `Eligibility` admits (for `group`, first a random eligible group), and
//! says why when it admits none (`RefusalReason`).

use rand::{Rng, RngExt};

use crate::model::HealthReporting;
use crate::select::eligibility::{Eligibility, Proximity, Tolerance};
use crate::select::{Candidate, Decision, RefusalReason, Strategy};
use crate::status::Status;

/// Chooses a connector for a request: uniformly among the eligible
/// candidates (healthy), or a random eligible group and then uniformly
/// among its eligible candidates (group).
pub fn select<R: Rng + ?Sized>(
    candidates: &[Candidate],
    mode: HealthReporting,
    strategy: Strategy,
    rng: &mut R,
) -> Decision {
    select_with(candidates, mode, strategy, Tolerance::default(), rng)
}

/// `select` with the nearest strategy's `proximity` (a `Tolerance`, and the
/// user's location if the request names one): uniformly among the
/// eligible candidates, which for `Nearest` are the reachable ones within
/// the tolerance of the best score.
pub fn select_with<R: Rng + ?Sized>(
    candidates: &[Candidate],
    mode: HealthReporting,
    strategy: Strategy,
    proximity: impl Into<Proximity>,
    rng: &mut R,
) -> Decision {
    let eligibility = Eligibility::with_tolerance(candidates, mode, strategy, proximity);
    let group = match strategy {
        Strategy::Healthy | Strategy::Nearest => None,
        Strategy::Group => {
            let groups = eligibility.groups();
            if groups.is_empty() {
                return Decision::Refused(refusal(candidates, mode));
            }
            Some(groups[rng.random_range(0..groups.len())])
        }
    };
    let pool = |c: &&Candidate| group.is_none_or(|g| c.group == g) && eligibility.is_eligible(c);
    let n = candidates.iter().filter(pool).count();
    if n == 0 {
        return Decision::Refused(refusal(candidates, mode));
    }
    let k = rng.random_range(0..n);
    match candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| pool(c))
        .nth(k)
    {
        Some((index, _)) => Decision::Selected { index },
        None => Decision::Refused(refusal(candidates, mode)),
    }
}

/// The reason nothing is eligible: judged over the connected candidates
/// that are not drained.
fn refusal(candidates: &[Candidate], mode: HealthReporting) -> RefusalReason {
    let mut connected = candidates
        .iter()
        .filter(|c| c.connected && !c.drained)
        .peekable();
    if connected.peek().is_none() {
        if candidates.iter().any(|c| c.connected) {
            RefusalReason::AllDrained
        } else {
            RefusalReason::NoConnector
        }
    } else if mode != HealthReporting::None && connected.all(|c| c.status == Status::Down) {
        RefusalReason::AllDown
    } else {
        RefusalReason::NoHealthReport
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;
    use crate::select::fixtures::*;
    use HealthReporting::{Continuous, None as NoChecks, OnAccess};
    use Status::{Down, Unhealthy, Unknown, Up};

    #[test]
    fn healthy_picks_only_connected_reachable_candidates() {
        let candidates = [
            c("up", "g1", true, Up),
            c("up-gone", "g1", false, Up),
            c("down", "g1", true, Down),
            c("unknown", "g2", true, Unknown),
            c("unhealthy", "g2", true, Unhealthy),
            c("unhealthy-gone", "g2", false, Unhealthy),
        ];
        for mode in [Continuous, OnAccess] {
            assert_eq!(
                chosen(&candidates, mode, Strategy::Healthy),
                set(&["up", "unhealthy"])
            );
        }
    }

    #[test]
    fn a_single_reachable_candidate_is_always_chosen() {
        let candidates = [c("a", "g", true, Down), c("b", "g", true, Unhealthy)];
        let mut rng = SmallRng::seed_from_u64(1);
        for _ in 0..100 {
            assert_eq!(
                select(&candidates, Continuous, Strategy::Healthy, &mut rng),
                Decision::Selected { index: 1 }
            );
        }
    }

    #[test]
    fn none_mode_treats_every_connected_candidate_as_up() {
        let candidates = [
            c("down", "g1", true, Down),
            c("unknown", "g1", true, Unknown),
            c("gone", "g2", false, Up),
            c("up", "g2", true, Up),
        ];
        for strategy in [Strategy::Healthy, Strategy::Group] {
            assert_eq!(
                chosen(&candidates, NoChecks, strategy),
                set(&["down", "unknown", "up"]),
                "{strategy}"
            );
        }
    }

    #[test]
    fn refusals_say_why() {
        for strategy in [Strategy::Healthy, Strategy::Group] {
            for mode in [Continuous, OnAccess, NoChecks] {
                assert_eq!(refusal_of(&[], mode, strategy), RefusalReason::NoConnector);
                let gone = [c("a", "g", false, Up), c("b", "g", false, Unhealthy)];
                assert_eq!(
                    refusal_of(&gone, mode, strategy),
                    RefusalReason::NoConnector
                );
            }
            for mode in [Continuous, OnAccess] {
                // A disconnected connector's old Up does not count.
                let down = [c("a", "g", true, Down), c("b", "h", false, Up)];
                assert_eq!(refusal_of(&down, mode, strategy), RefusalReason::AllDown);
                let unknown = [c("a", "g", true, Unknown), c("b", "g", true, Unknown)];
                assert_eq!(
                    refusal_of(&unknown, mode, strategy),
                    RefusalReason::NoHealthReport
                );
                let mixed = [c("a", "g", true, Down), c("b", "g", true, Unknown)];
                assert_eq!(
                    refusal_of(&mixed, mode, strategy),
                    RefusalReason::NoHealthReport
                );
            }
        }
    }

    #[test]
    fn group_strategy_follows_the_seeds_literal_rule() {
        let candidates = [
            // g1 is eligible (a3 reports Up); a1 reported Down.
            c("a1", "g1", true, Down),
            c("a2", "g1", true, Unknown),
            c("a3", "g1", true, Up),
            c("a4", "g1", false, Unknown),
            // g2 has nobody reporting reachable.
            c("b1", "g2", true, Unknown),
            c("b2", "g2", true, Down),
            // g3's only reachable report comes from a disconnected connector.
            c("c1", "g3", false, Up),
            c("c2", "g3", true, Unknown),
        ];
        assert_eq!(
            chosen(&candidates, Continuous, Strategy::Group),
            set(&["a2", "a3"])
        );
        // Healthy would only take a3.
        assert_eq!(
            chosen(&candidates, Continuous, Strategy::Healthy),
            set(&["a3"])
        );
    }

    #[test]
    fn group_strategy_picks_among_every_eligible_group() {
        let candidates = [
            c("a1", "g1", true, Unhealthy),
            c("b1", "g2", true, Up),
            c("b2", "g2", true, Unknown),
            c("x1", "g3", true, Down),
        ];
        assert_eq!(
            chosen(&candidates, OnAccess, Strategy::Group),
            set(&["a1", "b1", "b2"])
        );
    }

    #[test]
    fn nearest_takes_a_slower_connector_only_when_no_near_one_is_reachable() {
        let t = Tolerance::default();
        let fast = near("fast", Up, Some(1.0));
        let slow = near("slow", Up, Some(40.0));
        let both = [fast.clone(), slow.clone()];
        assert_eq!(chosen(&both, Continuous, Strategy::Nearest), set(&["fast"]));
        // The near one Down, Unknown or disconnected: the slow one carries.
        for gone in [
            near("fast", Down, Some(1.0)),
            near("fast", Unknown, Some(1.0)),
            Candidate {
                connected: false,
                ..fast.clone()
            },
        ] {
            let cs = [gone, slow.clone()];
            assert_eq!(chosen(&cs, OnAccess, Strategy::Nearest), set(&["slow"]));
        }
        // Unhealthy is reachable: the near one still wins.
        let cs = [near("fast", Unhealthy, Some(1.0)), slow.clone()];
        assert_eq!(counts(&cs, t, 500), vec![500, 0]);
        // Candidates without an RTT come after those with one ...
        let cs = [near("new", Up, None), slow.clone()];
        assert_eq!(chosen(&cs, Continuous, Strategy::Nearest), set(&["slow"]));
        // ... and with no RTT anywhere nearest is healthy.
        let cs = [
            near("a", Up, None),
            near("b", Unhealthy, None),
            near("c", Down, None),
        ];
        assert_eq!(chosen(&cs, Continuous, Strategy::Nearest), set(&["a", "b"]));
        // Refusals are healthy's.
        let cs = [near("a", Down, Some(1.0)), near("b", Down, Some(2.0))];
        assert_eq!(
            refusal_of(&cs, Continuous, Strategy::Nearest),
            RefusalReason::AllDown
        );
        // none segments: every connected candidate, RTT or not.
        let cs = [
            near("a", Unknown, Some(1.0)),
            near("b", Unknown, Some(50.0)),
        ];
        assert_eq!(chosen(&cs, NoChecks, Strategy::Nearest), set(&["a", "b"]));
    }

    #[test]
    fn the_tolerance_is_a_percentage_or_an_absolute_margin_whichever_is_larger() {
        let t = Tolerance::default();
        let ms = Duration::from_millis;
        assert_eq!(t.threshold(ms(100)), ms(120));
        assert_eq!(t.threshold(ms(1)), ms(3));
        assert_eq!(t.threshold(ms(10)), ms(12));
        let cs = [
            near("best", Up, Some(100.0)),
            near("in", Up, Some(120.0)),
            near("out", Up, Some(120.5)),
        ];
        assert_eq!(
            chosen(&cs, Continuous, Strategy::Nearest),
            set(&["best", "in"])
        );
        let strict = Tolerance {
            percent: 0,
            absolute: Duration::ZERO,
        };
        assert_eq!(counts(&cs, strict, 200), vec![200, 0, 0]);
    }

    /// The draw among near-equals is uniform: Pearson's chi-square over a
    /// seeded RNG against equal shares, at p = 0.001 (df = 3: 16.266).
    #[test]
    fn nearest_draws_uniformly_among_near_equals() {
        let cs = [
            near("a", Up, Some(1.0)),
            near("b", Unhealthy, Some(1.5)),
            near("c", Up, Some(2.0)),
            near("d", Up, Some(2.9)),
            near("far", Up, Some(10.0)),
            near("down", Down, Some(0.5)),
        ];
        let n = 40_000;
        let got = counts(&cs, Tolerance::default(), n);
        assert_eq!(&got[4..], &[0, 0], "{got:?}");
        let chi2 = chi_square_uniform(&got[..4], n);
        assert!(chi2 < 16.266, "chi-square {chi2:.2} over {got:?}");
    }

    #[test]
    fn with_equal_rtts_the_group_nearer_the_user_wins() {
        let cs = [
            located("ny-1", "us-east", 1.0, Some(NEW_YORK)),
            located("fra-1", "eu-central", 1.0, Some(FRANKFURT)),
        ];
        // Without a location the two are near-equals ...
        assert_eq!(
            chosen_near(&cs, Tolerance::default().into()),
            set(&["ny-1", "fra-1"])
        );
        // ... from Paris Frankfurt (478 km, ~4.8 ms) beats New York
        // (5,837 km, ~58 ms).
        assert_eq!(chosen_near(&cs, from_paris()), set(&["fra-1"]));
    }

    #[test]
    fn the_user_distance_can_outweigh_a_lower_application_rtt() {
        let cs = [
            located("ny-1", "us-east", 1.0, Some(NEW_YORK)),
            located("fra-1", "eu-central", 5.0, Some(FRANKFURT)),
        ];
        assert_eq!(
            chosen_near(&cs, Tolerance::default().into()),
            set(&["ny-1"])
        );
        assert_eq!(chosen_near(&cs, from_paris()), set(&["fra-1"]));
        // The band is over the combined score: London (343 km, 3.4 ms + 1)
        // and Frankfurt (4.8 ms + 1) are within 2 ms of each other.
        let cs = [
            located("lon-1", "uk", 1.0, Some(LONDON)),
            located("fra-1", "eu-central", 1.0, Some(FRANKFURT)),
            located("ny-1", "us-east", 1.0, Some(NEW_YORK)),
        ];
        assert_eq!(chosen_near(&cs, from_paris()), set(&["lon-1", "fra-1"]));
        // … and the draw among them stays uniform (chi-square, df = 1,
        // p = 0.001: 10.828).
        let n = 20_000;
        let got = counts(&cs, from_paris(), n);
        assert_eq!(got[2], 0);
        let chi2 = chi_square_uniform(&got[..2], n);
        assert!(chi2 < 10.828, "chi-square {chi2:.2} over {got:?}");
    }
}
