//! Who may carry a request: the one statement of the eligibility rule
//! (`Eligibility`), each candidate's `Verdict` under it, whether the
//! user's location counts (`LocationUse`), and the nearest strategy's
//! band (`Tolerance`, `Proximity`). `select` draws from it; `explain`
//! reports it.

use std::time::Duration;

use crate::location::{Location, estimated_rtt};
use crate::model::HealthReporting;
use crate::select::{Candidate, Strategy};
use crate::status::Status;

/// How far from the best RTT a candidate may be and still count as
/// nearest: `percent` of the best or `absolute`, whichever is larger (a
/// percentage alone would split hairs between two sub-millisecond paths).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tolerance {
    /// Margin as a percentage of the best RTT.
    pub percent: u32,
    /// Margin as an absolute time.
    pub absolute: Duration,
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance {
            percent: 20,
            absolute: Duration::from_millis(2),
        }
    }
}

impl Tolerance {
    /// The largest RTT that counts as near when the best is `best`.
    pub fn threshold(self, best: Duration) -> Duration {
        let relative = best.saturating_mul(self.percent) / 100;
        best.saturating_add(relative.max(self.absolute))
    }
}

/// What the nearest strategy measures candidates by besides their RTT: the
/// band's tolerance and, when the access request names one, the user's
/// location.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Proximity {
    /// How far above the best score a candidate may be.
    pub tolerance: Tolerance,
    /// Where the user is, if the request says.
    pub user: Option<Location>,
}

impl From<Tolerance> for Proximity {
    fn from(tolerance: Tolerance) -> Self {
        Proximity {
            tolerance,
            user: None,
        }
    }
}

/// Whether a candidate's status counts as reachable in this mode (a
/// drained candidate never does).
fn reachable(c: &Candidate, mode: HealthReporting) -> bool {
    c.connected && !c.drained && (mode == HealthReporting::None || c.status.is_reachable())
}

/// Why a candidate may or may not carry the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No live session: never eligible.
    NotConnected,
    /// Drained (by an administrator, or shutting down): never eligible.
    Drained,
    /// A `none` segment: every connected candidate is assumed reachable.
    AssumedReachable,
    /// Healthy strategy: eligible when the status is reachable.
    Reports(Status),
    /// Group strategy: no connector of its group reports reachable.
    GroupIneligible,
    /// Group strategy: its group is eligible but it reports Down.
    Down,
    /// Group strategy: its group is eligible and it does not report Down.
    InEligibleGroup(Status),
    /// Nearest strategy: reachable, and its score (RTT, plus the user's
    /// estimated RTT when the location counts: `Eligibility::user_rtt`) is
    /// within the tolerance of the best reachable candidate's.
    Near {
        /// Its status (reachable).
        status: Status,
        /// Its smoothed RTT.
        rtt: Duration,
        /// The best reachable candidate's score.
        best: Duration,
        /// The largest score within the tolerance.
        threshold: Duration,
    },
    /// Nearest strategy: reachable, but a reachable candidate is nearer by
    /// more than the tolerance.
    Farther {
        /// Its smoothed RTT.
        rtt: Duration,
        /// The best reachable candidate's score.
        best: Duration,
        /// The largest score within the tolerance.
        threshold: Duration,
    },
    /// Nearest strategy: reachable, but it has reported no RTT while other
    /// reachable candidates have.
    NoRtt,
}

impl Verdict {
    /// Whether the candidate may be chosen.
    pub fn is_eligible(self) -> bool {
        match self {
            Verdict::AssumedReachable | Verdict::InEligibleGroup(_) | Verdict::Near { .. } => true,
            Verdict::Reports(status) => status.is_reachable(),
            Verdict::NotConnected
            | Verdict::Drained
            | Verdict::GroupIneligible
            | Verdict::Down
            | Verdict::Farther { .. }
            | Verdict::NoRtt => false,
        }
    }
}

/// Whether the user's location counted in a nearest decision, and if not,
/// why not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocationUse<'a> {
    /// The request named no location.
    NotGiven,
    /// Each reachable candidate's score includes its estimated user RTT.
    Used,
    /// The strategy is not `nearest`.
    OtherStrategy(Strategy),
    /// A `none` segment measures nothing to add a distance to.
    NothingMeasured,
    /// No reachable candidate has reported an RTT (nearest is healthy).
    NoRtt,
    /// No connected candidate reports the application reachable.
    NoneReachable,
    /// This reachable candidate's group has no location: distances would
    /// not compare fairly, so none counts.
    GroupWithout {
        /// The group without a location.
        group: &'a str,
        /// One of its reachable connectors.
        connector: &'a str,
    },
}

impl<'a> LocationUse<'a> {
    /// Whether a given user location counts among the reachable
    /// candidates `pool` of a measured segment under `nearest`: only when
    /// every one has a group location and one has an RTT.
    fn among(pool: impl Iterator<Item = &'a Candidate> + Clone) -> Self {
        if pool.clone().next().is_none() {
            LocationUse::NoneReachable
        } else if let Some(c) = pool.clone().find(|c| c.location.is_none()) {
            LocationUse::GroupWithout {
                group: &c.group,
                connector: &c.connector,
            }
        } else if pool.clone().all(|c| c.rtt.is_none()) {
            LocationUse::NoRtt
        } else {
            LocationUse::Used
        }
    }
}

/// Who may carry a request: the one place the eligibility rule is written.
/// `select` draws from it and `explain` reports it, so the two cannot
/// disagree.
#[derive(Clone, Debug)]
pub struct Eligibility<'a> {
    mode: HealthReporting,
    strategy: Strategy,
    /// Group strategy: groups with at least one connected connector
    /// reporting reachable, in first-seen order (empty, and not allocated,
    /// for the healthy strategy).
    groups: Vec<&'a str>,
    /// Nearest strategy: the best reachable candidate's score and the
    /// largest score within the tolerance (None: no reachable candidate
    /// has an RTT).
    nearest: Option<(Duration, Duration)>,
    /// Nearest strategy, when the user's location counts (`Used`): each
    /// distinct group location of a candidate with its distance
    /// from the user (km) and estimated RTT, computed once per decision
    /// (groups are few; candidates many).
    places: Vec<(Location, f64, Duration)>,
    /// Whether and why (not) the user's location counts.
    location: LocationUse<'a>,
}

impl<'a> Eligibility<'a> {
    /// The eligibility rule for `candidates` of a segment in `mode`, with
    /// the default `Tolerance` for the nearest strategy.
    pub fn new(candidates: &'a [Candidate], mode: HealthReporting, strategy: Strategy) -> Self {
        Self::with_tolerance(candidates, mode, strategy, Proximity::default())
    }

    /// The eligibility rule, with `proximity` (tolerance and the user's
    /// location) for the nearest strategy. The user's location counts only
    /// when every reachable candidate's group has one: a candidate without
    /// would otherwise be compared on half its path.
    pub fn with_tolerance(
        candidates: &'a [Candidate],
        mode: HealthReporting,
        strategy: Strategy,
        proximity: impl Into<Proximity>,
    ) -> Self {
        let proximity = proximity.into();
        let mut groups: Vec<&str> = Vec::new();
        let mut nearest = None;
        let mut places = Vec::new();
        let mut location = match proximity.user {
            None => LocationUse::NotGiven,
            Some(_) if strategy != Strategy::Nearest => LocationUse::OtherStrategy(strategy),
            Some(_) if mode == HealthReporting::None => LocationUse::NothingMeasured,
            Some(_) => LocationUse::Used,
        };
        match strategy {
            Strategy::Group => {
                for c in candidates {
                    if reachable(c, mode) && !groups.contains(&c.group.as_str()) {
                        groups.push(&c.group);
                    }
                }
            }
            Strategy::Nearest if mode != HealthReporting::None => {
                let pool = candidates.iter().filter(|c| reachable(c, mode));
                if location == LocationUse::Used {
                    location = LocationUse::among(pool.clone());
                }
                if let (LocationUse::Used, Some(user)) = (location, proximity.user) {
                    // Every candidate's, so the explanation shows the
                    // distance of unreachable ones too.
                    for place in candidates.iter().filter_map(|c| c.location) {
                        if !places.iter().any(|(p, _, _)| *p == place) {
                            let km = user.distance_km(place);
                            places.push((place, km, estimated_rtt(km)));
                        }
                    }
                }
                let best = if places.is_empty() {
                    pool.filter_map(|c| c.rtt).min()
                } else {
                    pool.filter_map(|c| Some(c.rtt?.saturating_add(user_rtt(&places, c)?)))
                        .min()
                };
                nearest = best.map(|best| (best, proximity.tolerance.threshold(best)));
            }
            Strategy::Nearest | Strategy::Healthy => {}
        }
        Eligibility {
            mode,
            strategy,
            groups,
            nearest,
            places,
            location,
        }
    }

    /// The rule for a strategy and mode that measure no distance (every
    /// one but `nearest` over a measured segment), from what a `Roster`
    /// keeps counted: the group strategy's eligible `groups` in first-seen
    /// order, and whether the user's location counts (`location`).
    pub(crate) fn unmeasured(
        mode: HealthReporting,
        strategy: Strategy,
        groups: Vec<&'a str>,
        location: LocationUse<'a>,
    ) -> Self {
        Eligibility {
            mode,
            strategy,
            groups,
            nearest: None,
            places: Vec::new(),
            location,
        }
    }

    /// Whether and why `c` may be chosen.
    #[inline]
    pub fn verdict(&self, c: &Candidate) -> Verdict {
        if !c.connected {
            return Verdict::NotConnected;
        }
        if c.drained {
            return Verdict::Drained;
        }
        match self.strategy {
            // In a `none` segment every connected group is eligible too.
            _ if self.mode == HealthReporting::None => Verdict::AssumedReachable,
            Strategy::Healthy => Verdict::Reports(c.status),
            Strategy::Nearest => match (self.nearest, c.rtt) {
                _ if !c.status.is_reachable() => Verdict::Reports(c.status),
                (None, _) => Verdict::Reports(c.status),
                (Some((best, threshold)), Some(rtt)) => {
                    // The common case, no location, stays a comparison.
                    let score = match self.user_rtt(c) {
                        None => rtt,
                        Some(u) => rtt.saturating_add(u),
                    };
                    if score <= threshold {
                        Verdict::Near {
                            status: c.status,
                            rtt,
                            best,
                            threshold,
                        }
                    } else {
                        Verdict::Farther {
                            rtt,
                            best,
                            threshold,
                        }
                    }
                }
                (Some(_), None) => Verdict::NoRtt,
            },
            Strategy::Group if !self.groups.contains(&c.group.as_str()) => Verdict::GroupIneligible,
            Strategy::Group if c.status == Status::Down => Verdict::Down,
            Strategy::Group => Verdict::InEligibleGroup(c.status),
        }
    }

    /// The estimated round trip from the user to `c`'s group, when the
    /// user's location counts.
    #[inline]
    pub fn user_rtt(&self, c: &Candidate) -> Option<Duration> {
        if self.places.is_empty() {
            return None;
        }
        self.place(c).map(|(_, _, rtt)| rtt)
    }

    /// The distance from the user to `c`'s group (km), when the user's
    /// location counts.
    pub fn user_distance(&self, c: &Candidate) -> Option<f64> {
        self.place(c).map(|(_, km, _)| km)
    }

    fn place(&self, c: &Candidate) -> Option<(Location, f64, Duration)> {
        let at = c.location?;
        self.places.iter().copied().find(|(p, _, _)| *p == at)
    }

    /// Whether and why (not) the user's location counts.
    pub fn location_use(&self) -> LocationUse<'a> {
        self.location
    }

    /// Whether `c` may be chosen.
    pub fn is_eligible(&self, c: &Candidate) -> bool {
        self.verdict(c).is_eligible()
    }

    /// Whether candidates are compared by score: the nearest strategy over
    /// a measured segment.
    pub(super) fn scores(&self) -> bool {
        self.strategy == Strategy::Nearest && self.mode != HealthReporting::None
    }

    /// Group strategy: the eligible groups, in first-seen order.
    pub fn groups(&self) -> &[&'a str] {
        &self.groups
    }
}

/// The estimated user RTT of `c`'s group among `places` (None when `c`'s
/// group has no location, which only unreachable candidates lack when the
/// user's location counts).
fn user_rtt(places: &[(Location, f64, Duration)], c: &Candidate) -> Option<Duration> {
    let at = c.location?;
    places
        .iter()
        .find(|(p, _, _)| *p == at)
        .map(|(_, _, rtt)| *rtt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::fixtures::*;
    use crate::select::{RefusalReason, explain, explain_with};
    use HealthReporting::{Continuous, None as NoChecks, OnAccess};
    use Status::{Down, Up};

    /// A drained candidate is chosen by no strategy in no mode, even as
    /// the only Up one, and its explanation says why.
    #[test]
    fn a_drained_candidate_is_never_chosen_and_explained_as_drained() {
        let mut candidates = vec![
            Candidate {
                rtt: Some(Duration::from_micros(100)),
                ..drained("near-drained", "g1", Up)
            },
            Candidate {
                rtt: Some(Duration::from_millis(40)),
                ..c("far", "g2", true, Up)
            },
            c("down", "g1", true, Down),
        ];
        for mode in [Continuous, OnAccess, NoChecks] {
            for strategy in [Strategy::Healthy, Strategy::Group, Strategy::Nearest] {
                let got = chosen(&candidates, mode, strategy);
                let want = if mode == NoChecks {
                    set(&["far", "down"])
                } else {
                    set(&["far"])
                };
                assert_eq!(got, want, "{mode} {strategy}");
                let e = explain(&candidates, mode, strategy);
                let note = &e.candidates[0];
                assert!(!note.eligible, "{mode} {strategy}: {note:?}");
                assert_eq!(note.reason, "drained: selected for no new access");
                assert!(note.connected, "a drained connector is still connected");
            }
        }
        // Group: the drained one does not make its group eligible; the
        // group's other member (Down) cannot carry it either.
        let e = explain(&candidates, Continuous, Strategy::Group);
        assert_eq!(e.eligible_groups, vec!["g2".to_owned()]);
        // Nearest: the band is over the undrained (40 ms is the best).
        let e = explain(&candidates, Continuous, Strategy::Nearest);
        assert!(e.candidates[1].eligible, "{:?}", e.candidates[1]);
        // Draining the last one that could carry it: refused as drained,
        // where it would be refused as down without the drain.
        candidates[1].drained = true;
        for strategy in [Strategy::Healthy, Strategy::Group, Strategy::Nearest] {
            assert_eq!(
                refusal_of(&candidates, Continuous, strategy),
                RefusalReason::AllDown,
                "an undrained Down candidate is left: {strategy}"
            );
        }
        candidates.pop();
        for mode in [Continuous, OnAccess, NoChecks] {
            for strategy in [Strategy::Healthy, Strategy::Group, Strategy::Nearest] {
                assert_eq!(
                    refusal_of(&candidates, mode, strategy),
                    RefusalReason::AllDrained,
                    "{mode} {strategy}"
                );
            }
        }
        candidates.iter_mut().for_each(|c| c.connected = false);
        assert_eq!(
            refusal_of(&candidates, Continuous, Strategy::Healthy),
            RefusalReason::NoConnector
        );
        assert_eq!(RefusalReason::AllDrained.as_str(), "all_drained");
    }

    #[test]
    fn the_location_counts_only_when_every_reachable_candidates_group_has_one() {
        // A reachable candidate without a group location: the location is
        // ignored and the RTTs alone decide.
        let cs = [
            located("ny-1", "us-east", 1.0, Some(NEW_YORK)),
            located("x-1", "unplaced", 5.0, None),
        ];
        assert_eq!(chosen_near(&cs, from_paris()), set(&["ny-1"]));
        let e = explain_with(&cs, Continuous, Strategy::Nearest, from_paris());
        let u = e.user_location.as_ref().expect("noted");
        assert!(!u.used);
        assert_eq!(
            u.reason,
            r#"not used: group "unplaced" (of reachable connector "x-1") has no location, so distances would not compare fairly"#
        );
        assert!(e.candidates.iter().all(|n| n.distance_km.is_none()));
        assert_eq!(
            e.candidates[0].reason,
            "reports the application up; rtt 1.000 ms is within the tolerance of the nearest (1.000 ms best, up to 3.000 ms): drawn at random among these"
        );
        // An unreachable one without a location is never compared: the
        // location still counts.
        let cs = [
            located("ny-1", "us-east", 1.0, Some(NEW_YORK)),
            located("fra-1", "eu-central", 5.0, Some(FRANKFURT)),
            Candidate {
                status: Down,
                ..located("x-1", "unplaced", 0.5, None)
            },
            Candidate {
                connected: false,
                ..located("x-2", "unplaced", 0.5, None)
            },
        ];
        assert_eq!(chosen_near(&cs, from_paris()), set(&["fra-1"]));
        let e = explain_with(&cs, Continuous, Strategy::Nearest, from_paris());
        assert_eq!(e.user_location.map(|u| u.used), Some(true));
        // The unplaced ones have no distance and no comparable score.
        assert_eq!(
            (e.candidates[2].distance_km, e.candidates[2].score),
            (None, None)
        );
        let cs_down = [
            located("fra-1", "eu-central", 5.0, Some(FRANKFURT)),
            Candidate {
                status: Down,
                ..located("ny-1", "us-east", 1.0, Some(NEW_YORK))
            },
        ];
        let e = explain_with(&cs_down, Continuous, Strategy::Nearest, from_paris());
        assert!(
            e.candidates[1].distance_km.is_some_and(|km| km > 5000.0),
            "an unreachable candidate's distance is shown too: {:?}",
            e.candidates[1]
        );
        // Other strategies and `none` segments do not weigh it.
        for (mode, strategy, why) in [
            (Continuous, Strategy::Healthy, "strategy healthy"),
            (NoChecks, Strategy::Nearest, "health_reporting = \"none\""),
        ] {
            let e = explain_with(&cs, mode, strategy, from_paris());
            let u = e.user_location.expect("noted");
            assert!(!u.used && u.reason.contains(why), "{}", u.reason);
        }
        // No location in the request: no note.
        let e = explain_with(&cs, Continuous, Strategy::Nearest, Tolerance::default());
        assert_eq!(e.user_location, None);
    }
}
