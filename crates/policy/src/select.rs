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
//! `Eligibility` is the one statement of that rule: `select` draws from it,
//! `explain` reports its verdict per candidate.
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

/// Why a candidate may or may not carry the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No live session: never eligible.
    NotConnected,
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
}

impl Verdict {
    /// Whether the candidate may be chosen.
    pub fn is_eligible(self) -> bool {
        match self {
            Verdict::AssumedReachable | Verdict::InEligibleGroup(_) => true,
            Verdict::Reports(status) => status.is_reachable(),
            Verdict::NotConnected | Verdict::GroupIneligible | Verdict::Down => false,
        }
    }

    /// The sentence an explanation shows for `c`.
    fn reason(self, c: &Candidate) -> String {
        match self {
            Verdict::NotConnected => "not connected".to_owned(),
            Verdict::AssumedReachable => {
                "segment has health_reporting = \"none\": assumed reachable".to_owned()
            }
            Verdict::Reports(status) => format!("reports the application {status}"),
            Verdict::GroupIneligible => format!(
                "group {:?} has no connector reporting the application reachable",
                c.group
            ),
            Verdict::Down => "reports the application down".to_owned(),
            Verdict::InEligibleGroup(status) => format!(
                "group {:?} is eligible and this connector reports {status}",
                c.group
            ),
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
}

impl<'a> Eligibility<'a> {
    /// The eligibility rule for `candidates` of a segment in `mode`.
    pub fn new(candidates: &'a [Candidate], mode: HealthReporting, strategy: Strategy) -> Self {
        let mut groups: Vec<&str> = Vec::new();
        if strategy == Strategy::Group {
            for c in candidates {
                if reachable(c, mode) && !groups.contains(&c.group.as_str()) {
                    groups.push(&c.group);
                }
            }
        }
        Eligibility {
            mode,
            strategy,
            groups,
        }
    }

    /// Whether and why `c` may be chosen.
    pub fn verdict(&self, c: &Candidate) -> Verdict {
        if !c.connected {
            return Verdict::NotConnected;
        }
        match self.strategy {
            // In a `none` segment every connected group is eligible too.
            _ if self.mode == HealthReporting::None => Verdict::AssumedReachable,
            Strategy::Healthy => Verdict::Reports(c.status),
            Strategy::Group if !self.groups.contains(&c.group.as_str()) => Verdict::GroupIneligible,
            Strategy::Group if c.status == Status::Down => Verdict::Down,
            Strategy::Group => Verdict::InEligibleGroup(c.status),
        }
    }

    /// Whether `c` may be chosen.
    pub fn is_eligible(&self, c: &Candidate) -> bool {
        self.verdict(c).is_eligible()
    }

    /// Group strategy: the eligible groups, in first-seen order.
    pub fn groups(&self) -> &[&'a str] {
        &self.groups
    }
}

/// Chooses a connector for a request: uniformly among the eligible
/// candidates (healthy), or a random eligible group and then uniformly
/// among its eligible candidates (group).
pub fn select<R: Rng + ?Sized>(
    candidates: &[Candidate],
    mode: HealthReporting,
    strategy: Strategy,
    rng: &mut R,
) -> Decision {
    let eligibility = Eligibility::new(candidates, mode, strategy);
    let group = match strategy {
        Strategy::Healthy => None,
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

/// Explains which candidates were eligible and why (by the rule `select`
/// draws from).
pub fn explain(candidates: &[Candidate], mode: HealthReporting, strategy: Strategy) -> Explanation {
    let eligibility = Eligibility::new(candidates, mode, strategy);
    let notes = candidates
        .iter()
        .map(|c| {
            let verdict = eligibility.verdict(c);
            CandidateNote {
                connector: c.connector.clone(),
                group: c.group.clone(),
                connected: c.connected,
                status: if verdict == Verdict::AssumedReachable {
                    Status::Up
                } else {
                    c.status
                },
                eligible: verdict.is_eligible(),
                reason: verdict.reason(c),
            }
        })
        .collect();
    Explanation {
        strategy,
        mode,
        candidates: notes,
        eligible_groups: eligibility
            .groups()
            .iter()
            .map(|g| (*g).to_owned())
            .collect(),
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
