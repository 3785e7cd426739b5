//! Connector selection: which connected connector carries a request.
//!
//! - `Healthy` (default): uniformly at random among connected candidates
//!   whose status for the application is reachable (Up or Unhealthy).
//! - `Group` (the seed's literal rule): a group is eligible when at least
//!   one of its connected connectors reports the application reachable; a
//!   random eligible group is picked, then a random connected connector of it
//!   that has not reported the application Down.
//!
//! For `none` segments every connected candidate counts as Up.
//!
//! `select` allocates nothing on the healthy path and returns an index;
//! `explain` builds the per-candidate explanation when a caller wants it.

use std::fmt;
use std::str::FromStr;

use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

use crate::model::HealthReporting;
use crate::status::Status;

/// Selection strategy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Random among connectors reporting the application reachable.
    #[default]
    Healthy,
    /// Random eligible group, then a random non-Down connector of it.
    Group,
}

impl Strategy {
    /// The name used in config and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Healthy => "healthy",
            Strategy::Group => "group",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "healthy" => Ok(Strategy::Healthy),
            "group" => Ok(Strategy::Group),
            other => Err(format!(
                "unknown strategy {other:?} (expected \"healthy\" or \"group\")"
            )),
        }
    }
}

/// A connector of one of the matched segment's groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Connector name.
    pub connector: String,
    /// Its group.
    pub group: String,
    /// Whether it has a live session.
    pub connected: bool,
    /// Its effective status for the requested application.
    pub status: Status,
}

/// Why a request got no connector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    /// No segment matches the host.
    NoSegment,
    /// The deciding segment does not include the protocol/port.
    PortNotInSegment,
    /// No connector of the segment's groups is connected.
    NoConnector,
    /// Every connected candidate reports the application Down.
    AllDown,
    /// Connected candidates have no current report (and the segment is not
    /// on-access, or the caller has not waited for discovery).
    NoHealthReport,
    /// On-access discovery found nothing reachable in time.
    DiscoveryTimeout,
}

impl RefusalReason {
    /// The snake_case name used in the JSON API.
    pub fn as_str(self) -> &'static str {
        match self {
            RefusalReason::NoSegment => "no_segment",
            RefusalReason::PortNotInSegment => "port_not_in_segment",
            RefusalReason::NoConnector => "no_connector",
            RefusalReason::AllDown => "all_down",
            RefusalReason::NoHealthReport => "no_health_report",
            RefusalReason::DiscoveryTimeout => "discovery_timeout",
        }
    }
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of `select`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// `candidates[index]` was chosen.
    Selected {
        /// Index into the candidate slice.
        index: usize,
    },
    /// Nothing could be chosen.
    Refused(RefusalReason),
}

/// Whether a candidate's status counts as reachable in this mode.
fn reachable(c: &Candidate, mode: HealthReporting) -> bool {
    c.connected && (mode == HealthReporting::None || c.status.is_reachable())
}

/// Chooses a connector for a request.
pub fn select<R: Rng + ?Sized>(
    candidates: &[Candidate],
    mode: HealthReporting,
    strategy: Strategy,
    rng: &mut R,
) -> Decision {
    match strategy {
        Strategy::Healthy => {
            let n = candidates.iter().filter(|c| reachable(c, mode)).count();
            if n == 0 {
                return Decision::Refused(refusal(candidates, mode));
            }
            let k = rng.random_range(0..n);
            match candidates
                .iter()
                .enumerate()
                .filter(|(_, c)| reachable(c, mode))
                .nth(k)
            {
                Some((index, _)) => Decision::Selected { index },
                None => Decision::Refused(refusal(candidates, mode)),
            }
        }
        Strategy::Group => {
            let groups = eligible_groups(candidates, mode);
            if groups.is_empty() {
                return Decision::Refused(refusal(candidates, mode));
            }
            let group = groups[rng.random_range(0..groups.len())];
            let in_group = |c: &&Candidate| {
                c.group == group
                    && c.connected
                    && (mode == HealthReporting::None || c.status != Status::Down)
            };
            let n = candidates.iter().filter(in_group).count();
            let k = rng.random_range(0..n.max(1));
            match candidates
                .iter()
                .enumerate()
                .filter(|(_, c)| in_group(c))
                .nth(k)
            {
                Some((index, _)) => Decision::Selected { index },
                None => Decision::Refused(refusal(candidates, mode)),
            }
        }
    }
}

/// Groups with at least one connected connector reporting reachable, in
/// first-seen order.
fn eligible_groups(candidates: &[Candidate], mode: HealthReporting) -> Vec<&str> {
    let mut groups: Vec<&str> = Vec::new();
    for c in candidates {
        if reachable(c, mode) && !groups.contains(&c.group.as_str()) {
            groups.push(&c.group);
        }
    }
    groups
}

/// The reason nothing is eligible.
fn refusal(candidates: &[Candidate], mode: HealthReporting) -> RefusalReason {
    let mut connected = candidates.iter().filter(|c| c.connected).peekable();
    if connected.peek().is_none() {
        RefusalReason::NoConnector
    } else if mode != HealthReporting::None && connected.all(|c| c.status == Status::Down) {
        RefusalReason::AllDown
    } else {
        RefusalReason::NoHealthReport
    }
}

/// One candidate in an explanation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CandidateNote {
    /// Connector name.
    pub connector: String,
    /// Its group.
    pub group: String,
    /// Whether it has a live session.
    pub connected: bool,
    /// Its effective status (Up for every connected candidate of a `none` segment).
    pub status: Status,
    /// Whether it could have been chosen.
    pub eligible: bool,
    /// Why (not).
    pub reason: String,
}

/// How a decision was reached.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explanation {
    /// Strategy used.
    pub strategy: Strategy,
    /// Segment mode.
    pub mode: HealthReporting,
    /// Every candidate and its eligibility.
    pub candidates: Vec<CandidateNote>,
    /// Group strategy: the groups that were eligible.
    pub eligible_groups: Vec<String>,
}

/// Explains which candidates were eligible and why.
pub fn explain(candidates: &[Candidate], mode: HealthReporting, strategy: Strategy) -> Explanation {
    let groups: Vec<String> = match strategy {
        Strategy::Group => eligible_groups(candidates, mode)
            .into_iter()
            .map(str::to_owned)
            .collect(),
        Strategy::Healthy => Vec::new(),
    };
    let notes = candidates
        .iter()
        .map(|c| {
            let status = if mode == HealthReporting::None && c.connected {
                Status::Up
            } else {
                c.status
            };
            let (eligible, reason) = if !c.connected {
                (false, "not connected".to_owned())
            } else if mode == HealthReporting::None {
                (
                    true,
                    "segment has health_reporting = \"none\": assumed reachable".to_owned(),
                )
            } else {
                match strategy {
                    Strategy::Healthy => {
                        if c.status.is_reachable() {
                            (true, format!("reports the application {}", c.status))
                        } else {
                            (false, format!("reports the application {}", c.status))
                        }
                    }
                    Strategy::Group => {
                        if !groups.contains(&c.group) {
                            (
                                false,
                                format!(
                                    "group {:?} has no connector reporting the application reachable",
                                    c.group
                                ),
                            )
                        } else if c.status == Status::Down {
                            (false, "reports the application down".to_owned())
                        } else {
                            (
                                true,
                                format!(
                                    "group {:?} is eligible and this connector reports {}",
                                    c.group, c.status
                                ),
                            )
                        }
                    }
                }
            };
            CandidateNote {
                connector: c.connector.clone(),
                group: c.group.clone(),
                connected: c.connected,
                status,
                eligible,
                reason,
            }
        })
        .collect();
    Explanation {
        strategy,
        mode,
        candidates: notes,
        eligible_groups: groups,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;
    use HealthReporting::{Continuous, None as NoChecks, OnAccess};
    use Status::{Down, Unhealthy, Unknown, Up};

    fn c(connector: &str, group: &str, connected: bool, status: Status) -> Candidate {
        Candidate {
            connector: connector.into(),
            group: group.into(),
            connected,
            status,
        }
    }

    /// The set of connectors `select` chooses over many draws; panics on a
    /// refusal.
    fn chosen(
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

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|&n| n.to_owned()).collect()
    }

    fn refusal_of(
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
    fn explain_notes_every_candidate_healthy() {
        let candidates = [
            c("up", "g1", true, Up),
            c("gone", "g1", false, Up),
            c("down", "g2", true, Down),
            c("unknown", "g2", true, Unknown),
            c("unhealthy", "g2", true, Unhealthy),
        ];
        let e = explain(&candidates, Continuous, Strategy::Healthy);
        assert_eq!(e.strategy, Strategy::Healthy);
        assert_eq!(e.mode, Continuous);
        assert!(e.eligible_groups.is_empty());
        let notes: Vec<(&str, bool, &str)> = e
            .candidates
            .iter()
            .map(|n| (n.connector.as_str(), n.eligible, n.reason.as_str()))
            .collect();
        assert_eq!(
            notes,
            vec![
                ("up", true, "reports the application up"),
                ("gone", false, "not connected"),
                ("down", false, "reports the application down"),
                ("unknown", false, "reports the application unknown"),
                ("unhealthy", true, "reports the application unhealthy"),
            ]
        );
        // Eligibility in the explanation agrees with what select chooses.
        let eligible: BTreeSet<String> = e
            .candidates
            .iter()
            .filter(|n| n.eligible)
            .map(|n| n.connector.clone())
            .collect();
        assert_eq!(eligible, chosen(&candidates, Continuous, Strategy::Healthy));
    }

    #[test]
    fn explain_notes_every_candidate_group() {
        let candidates = [
            c("a1", "g1", true, Down),
            c("a2", "g1", true, Unknown),
            c("a3", "g1", true, Up),
            c("b1", "g2", true, Unknown),
            c("c1", "g3", false, Up),
        ];
        let e = explain(&candidates, OnAccess, Strategy::Group);
        assert_eq!(e.eligible_groups, vec!["g1".to_owned()]);
        let notes: Vec<(&str, bool)> = e
            .candidates
            .iter()
            .map(|n| (n.connector.as_str(), n.eligible))
            .collect();
        assert_eq!(
            notes,
            vec![
                ("a1", false),
                ("a2", true),
                ("a3", true),
                ("b1", false),
                ("c1", false)
            ]
        );
        assert_eq!(e.candidates[0].reason, "reports the application down");
        assert!(
            e.candidates[3]
                .reason
                .contains(r#"group "g2" has no connector"#)
        );
        assert_eq!(e.candidates[4].reason, "not connected");
        let eligible: BTreeSet<String> = e
            .candidates
            .iter()
            .filter(|n| n.eligible)
            .map(|n| n.connector.clone())
            .collect();
        assert_eq!(eligible, chosen(&candidates, OnAccess, Strategy::Group));
    }

    #[test]
    fn explain_shows_none_segments_as_up() {
        let candidates = [c("a", "g", true, Unknown), c("b", "g", false, Unknown)];
        let e = explain(&candidates, NoChecks, Strategy::Healthy);
        assert_eq!(e.candidates[0].status, Up);
        assert!(e.candidates[0].eligible);
        assert!(e.candidates[0].reason.contains("assumed reachable"));
        assert_eq!(e.candidates[1].status, Unknown);
        assert!(!e.candidates[1].eligible);
    }

    #[test]
    fn names_parse_and_print() {
        assert_eq!("healthy".parse::<Strategy>(), Ok(Strategy::Healthy));
        assert_eq!("group".parse::<Strategy>(), Ok(Strategy::Group));
        assert!("random".parse::<Strategy>().is_err());
        assert_eq!(Strategy::default(), Strategy::Healthy);
        assert_eq!(
            RefusalReason::PortNotInSegment.to_string(),
            "port_not_in_segment"
        );
        assert_eq!(
            RefusalReason::DiscoveryTimeout.as_str(),
            "discovery_timeout"
        );
    }
}
