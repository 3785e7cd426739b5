//! The indexed selection (`Roster`) against the selection over a slice
//! (`select_with`, `explain_owned`) as the reference: over generated groups
//! and updates, with the same random numbers, the same decision and the
//! same explanation; and its random choice uniform.

use std::time::Duration;

use policy::{
    Candidate, Decision, HealthReporting, Location, Proximity, Roster, Status, Strategy as Pick,
    Tolerance, explain_owned, select_with,
};
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;

fn status() -> impl Strategy<Value = Status> {
    prop_oneof![
        Just(Status::Up),
        Just(Status::Unhealthy),
        Just(Status::Down),
        Just(Status::Unknown)
    ]
}

/// Up to 120 candidates in runs of up to four groups (a group may come
/// back after another), with RTTs and locations for `nearest`.
fn candidates() -> impl Strategy<Value = Vec<Candidate>> {
    prop::collection::vec(
        (
            0usize..4,
            1usize..40,
            any::<bool>(),
            0u8..5,
            status(),
            prop::option::of(1u64..50),
        ),
        0..6,
    )
    .prop_map(|runs| {
        let mut out = Vec::new();
        for (group, len, with_place, drain, status, rtt) in runs {
            for k in 0..len {
                let i = out.len();
                out.push(Candidate {
                    connector: format!("c{i:03}"),
                    group: format!("g{group}"),
                    connected: (i + k) % 7 != 3,
                    drained: drain == 0 && k % 2 == 0,
                    status: if k % 3 == 1 { Status::Down } else { status },
                    rtt: rtt.map(|ms| Duration::from_millis(ms + (i as u64 % 5))),
                    location: with_place
                        .then(|| Location::new(40.0 + group as f64, 2.0).ok())
                        .flatten(),
                });
            }
        }
        out
    })
}

/// An update: a candidate's index, its new status, or instead its new
/// link state (connected, drained).
type Update = (usize, Status, Option<(bool, bool)>);

fn updates() -> impl Strategy<Value = Vec<Update>> {
    prop::collection::vec(
        (
            0usize..200,
            status(),
            prop::option::of((any::<bool>(), any::<bool>())),
        ),
        0..40,
    )
}

fn mode() -> impl Strategy<Value = HealthReporting> {
    prop_oneof![
        Just(HealthReporting::Continuous),
        Just(HealthReporting::OnAccess),
        Just(HealthReporting::None)
    ]
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![Just(Pick::Healthy), Just(Pick::Group), Just(Pick::Nearest)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_roster_decides_and_explains_as_the_slice_does(
        mut cs in candidates(),
        updates in updates(),
        mode in mode(),
        pick in pick(),
        located in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let mut roster = Roster::new(cs.clone());
        for (i, status, link) in updates {
            let Some(c) = cs.get_mut(i) else {
                prop_assert!(!roster.set_status(i, status));
                continue;
            };
            match link {
                None => {
                    c.status = status;
                    prop_assert!(roster.set_status(i, status));
                }
                Some((connected, drained)) => {
                    (c.connected, c.drained) = (connected, drained);
                    prop_assert!(roster.set_link(i, connected, drained));
                }
            }
        }
        prop_assert_eq!(roster.counts(), roster.recount());
        prop_assert_eq!(roster.candidates(), &cs[..]);
        let proximity = Proximity {
            tolerance: Tolerance::default(),
            user: if located { Location::new(48.8, 2.3).ok() } else { None },
        };
        for draw in 0..8 {
            let mut a = SmallRng::seed_from_u64(seed.wrapping_add(draw));
            let mut b = SmallRng::seed_from_u64(seed.wrapping_add(draw));
            let want = select_with(&cs, mode, pick, proximity, &mut a);
            let got = roster.select_with(mode, pick, proximity, &mut b);
            prop_assert_eq!(got, want);
            let chosen = match want {
                Decision::Selected { index } => Some(index),
                Decision::Refused(_) => None,
            };
            prop_assert_eq!(
                roster.explain(chosen, mode, pick, proximity),
                explain_owned(cs.clone(), chosen, mode, pick, proximity)
            );
        }
    }
}

/// Chi-square statistic of `got` against a uniform spread of `n` draws.
fn chi_square_uniform(got: &[usize], n: usize) -> f64 {
    let expected = n as f64 / got.len() as f64;
    got.iter()
        .map(|&o| (o as f64 - expected).powi(2) / expected)
        .sum()
}

/// 1,000 candidates, 40 of them reachable and scattered over four groups
/// (some after updates): each is chosen about as often, and nobody else.
#[test]
fn the_rosters_choice_is_uniform_among_the_reachable() {
    let cs: Vec<Candidate> = (0..1000)
        .map(|i| Candidate {
            connector: format!("c{i:04}"),
            group: format!("g{}", i / 250),
            connected: true,
            drained: false,
            status: if i % 25 == 0 {
                Status::Up
            } else {
                Status::Down
            },
            rtt: None,
            location: None,
        })
        .collect();
    let mut roster = Roster::new(cs);
    // Swap ten of the reachable for ten others.
    for k in 0..10 {
        roster.set_status(k * 25, Status::Unknown);
        roster.set_status(k * 25 + 7, Status::Unhealthy);
    }
    let reachable: Vec<usize> = roster
        .candidates()
        .iter()
        .enumerate()
        .filter(|(_, c)| c.status.is_reachable())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(reachable.len(), 40);
    let mut seen = vec![0usize; 1000];
    let mut rng = SmallRng::seed_from_u64(11);
    let n = 40_000;
    for _ in 0..n {
        match roster.select_with(
            HealthReporting::Continuous,
            Pick::Healthy,
            Tolerance::default(),
            &mut rng,
        ) {
            Decision::Selected { index } => seen[index] += 1,
            Decision::Refused(r) => panic!("refused: {r}"),
        }
    }
    let got: Vec<usize> = reachable.iter().map(|i| seen[*i]).collect();
    assert_eq!(got.iter().sum::<usize>(), n, "only reachable ones chosen");
    // 39 degrees of freedom: 72.05 is the 0.001 critical value.
    let chi = chi_square_uniform(&got, n);
    assert!(chi < 72.05, "chi-square {chi:.1} over {got:?}");
}
