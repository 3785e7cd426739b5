//! Connector selection: which connected connector carries a request.
//!
//! - `Healthy` (default): uniformly at random among connected candidates
//!   whose status for the application is reachable (Up or Unhealthy).
//! - `Group` (the seed's literal rule): a group is eligible when at least
//!   one of its connected connectors reports the application reachable; a
//!   random eligible group is picked, then a random connected connector of it
//!   that has not reported the application Down.
//!
//! - `Nearest`: among the candidates `Healthy` would take, those whose
//!   smoothed connector→application RTT is within a tolerance of the best
//!   (`Tolerance`: a percentage or an absolute margin, whichever is
//!   larger); uniformly at random among them. Candidates without an RTT
//!   come after any with one; when no reachable candidate has an RTT it is
//!   `Healthy`.
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
use std::time::Duration;

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
    /// Random among the reachable connectors nearest to the application
    /// (smoothed RTT within a tolerance of the best).
    Nearest,
}

impl Strategy {
    /// The name used in config and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Healthy => "healthy",
            Strategy::Group => "group",
            Strategy::Nearest => "nearest",
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
            "nearest" => Ok(Strategy::Nearest),
            other => Err(format!(
                "unknown strategy {other:?} (expected \"healthy\", \"group\" or \"nearest\")"
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
    /// Its smoothed round-trip time to the application (`smooth_rtt` over
    /// its reports), if it has reported one.
    pub rtt: Option<Duration>,
}

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

/// Weight of a new sample in the smoothed RTT (an exponentially weighted
/// moving average): 0.3 follows a lasting change within a few reports
/// without letting one slow handshake move a connector out of the band.
pub const RTT_WEIGHT: f64 = 0.3;

/// The smoothed RTT after `sample`: the sample itself when there was none
/// before, else `RTT_WEIGHT` of it plus the rest of `previous`.
pub fn smooth_rtt(previous: Option<Duration>, sample: Duration) -> Duration {
    match previous {
        None => sample,
        Some(p) => p.mul_f64(1.0 - RTT_WEIGHT) + sample.mul_f64(RTT_WEIGHT),
    }
}

/// One report's RTT sample: the mean over its reachable addresses (`None`
/// when none was reachable: a failure says nothing about distance).
pub fn rtt_sample(addresses: &[crate::status::AddressResult]) -> Option<Duration> {
    let reachable = addresses.iter().filter(|a| a.reachable);
    let n = u32::try_from(reachable.clone().count()).ok()?;
    (n > 0).then(|| reachable.map(|a| a.rtt).sum::<Duration>() / n)
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
    /// Nearest strategy: reachable, and its RTT is within the tolerance of
    /// the best reachable candidate's.
    Near {
        /// Its status (reachable).
        status: Status,
        /// Its smoothed RTT.
        rtt: Duration,
        /// The best reachable candidate's smoothed RTT.
        best: Duration,
        /// The largest RTT within the tolerance.
        threshold: Duration,
    },
    /// Nearest strategy: reachable, but a reachable candidate is nearer by
    /// more than the tolerance.
    Farther {
        /// Its smoothed RTT.
        rtt: Duration,
        /// The best reachable candidate's smoothed RTT.
        best: Duration,
        /// The largest RTT within the tolerance.
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
            | Verdict::GroupIneligible
            | Verdict::Down
            | Verdict::Farther { .. }
            | Verdict::NoRtt => false,
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
            Verdict::Near {
                status,
                rtt,
                best,
                threshold,
            } => format!(
                "reports the application {status}; rtt {} is within the tolerance of the nearest ({} best, up to {}): drawn at random among these",
                ms(rtt),
                ms(best),
                ms(threshold)
            ),
            Verdict::Farther {
                rtt,
                best,
                threshold,
            } => format!(
                "reports the application reachable, but rtt {} is beyond {} (best {} plus tolerance): a nearer connector is reachable",
                ms(rtt),
                ms(threshold),
                ms(best)
            ),
            Verdict::NoRtt => {
                "reports the application reachable but no rtt yet, and reachable connectors with one are preferred".to_owned()
            }
        }
    }
}

/// A duration as milliseconds with three decimals.
fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
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
    /// Nearest strategy: the best reachable candidate's RTT and the largest
    /// RTT within the tolerance (None: no reachable candidate has an RTT).
    nearest: Option<(Duration, Duration)>,
}

impl<'a> Eligibility<'a> {
    /// The eligibility rule for `candidates` of a segment in `mode`, with
    /// the default `Tolerance` for the nearest strategy.
    pub fn new(candidates: &'a [Candidate], mode: HealthReporting, strategy: Strategy) -> Self {
        Self::with_tolerance(candidates, mode, strategy, Tolerance::default())
    }

    /// The eligibility rule, with `tolerance` for the nearest strategy.
    pub fn with_tolerance(
        candidates: &'a [Candidate],
        mode: HealthReporting,
        strategy: Strategy,
        tolerance: Tolerance,
    ) -> Self {
        let mut groups: Vec<&str> = Vec::new();
        let mut nearest = None;
        match strategy {
            Strategy::Group => {
                for c in candidates {
                    if reachable(c, mode) && !groups.contains(&c.group.as_str()) {
                        groups.push(&c.group);
                    }
                }
            }
            Strategy::Nearest if mode != HealthReporting::None => {
                nearest = candidates
                    .iter()
                    .filter(|c| reachable(c, mode))
                    .filter_map(|c| c.rtt)
                    .min()
                    .map(|best| (best, tolerance.threshold(best)));
            }
            Strategy::Nearest | Strategy::Healthy => {}
        }
        Eligibility {
            mode,
            strategy,
            groups,
            nearest,
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
            Strategy::Nearest => match (self.nearest, c.rtt) {
                _ if !c.status.is_reachable() => Verdict::Reports(c.status),
                (None, _) => Verdict::Reports(c.status),
                (Some((best, threshold)), Some(rtt)) if rtt <= threshold => Verdict::Near {
                    status: c.status,
                    rtt,
                    best,
                    threshold,
                },
                (Some((best, threshold)), Some(rtt)) => Verdict::Farther {
                    rtt,
                    best,
                    threshold,
                },
                (Some(_), None) => Verdict::NoRtt,
            },
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
    select_with(candidates, mode, strategy, Tolerance::default(), rng)
}

/// `select` with the nearest strategy's `tolerance`: uniformly among the
/// eligible candidates, which for `Nearest` are the reachable ones within
/// the tolerance of the best RTT.
pub fn select_with<R: Rng + ?Sized>(
    candidates: &[Candidate],
    mode: HealthReporting,
    strategy: Strategy,
    tolerance: Tolerance,
    rng: &mut R,
) -> Decision {
    let eligibility = Eligibility::with_tolerance(candidates, mode, strategy, tolerance);
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
    /// Its smoothed RTT to the application (JSON: `rtt_ms`, a number of
    /// milliseconds, or null).
    #[serde(rename = "rtt_ms", with = "millis")]
    pub rtt: Option<Duration>,
}

/// `Option<Duration>` as a JSON number of milliseconds (or null).
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_f64(d.as_secs_f64() * 1000.0),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let ms = Option::<f64>::deserialize(d)?;
        Ok(ms.and_then(|ms| Duration::try_from_secs_f64(ms / 1000.0).ok()))
    }
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
    explain_with(candidates, mode, strategy, Tolerance::default())
}

/// `explain` with the nearest strategy's `tolerance`.
pub fn explain_with(
    candidates: &[Candidate],
    mode: HealthReporting,
    strategy: Strategy,
    tolerance: Tolerance,
) -> Explanation {
    let eligibility = Eligibility::with_tolerance(candidates, mode, strategy, tolerance);
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
                rtt: c.rtt,
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
            rtt: None,
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

    fn near(connector: &str, status: Status, rtt_ms: Option<f64>) -> Candidate {
        Candidate {
            rtt: rtt_ms.map(|ms| Duration::from_secs_f64(ms / 1000.0)),
            ..c(connector, "g", true, status)
        }
    }

    /// How often each candidate is chosen over `n` seeded draws.
    fn counts(candidates: &[Candidate], tolerance: Tolerance, n: usize) -> Vec<usize> {
        let mut rng = SmallRng::seed_from_u64(16);
        let mut counts = vec![0; candidates.len()];
        for _ in 0..n {
            match select_with(
                candidates,
                Continuous,
                Strategy::Nearest,
                tolerance,
                &mut rng,
            ) {
                Decision::Selected { index } => counts[index] += 1,
                Decision::Refused(r) => panic!("refused: {r}"),
            }
        }
        counts
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
        let expected = n as f64 / 4.0;
        let chi2: f64 = got[..4]
            .iter()
            .map(|&o| (o as f64 - expected).powi(2) / expected)
            .sum();
        assert!(chi2 < 16.266, "chi-square {chi2:.2} over {got:?}");
    }

    #[test]
    fn explain_shows_each_candidates_rtt_and_why_the_near_ones_won() {
        let cs = [
            near("a", Up, Some(1.0)),
            near("b", Up, Some(2.5)),
            near("far", Up, Some(30.0)),
            near("new", Up, None),
            near("down", Down, Some(0.2)),
        ];
        let e = explain(&cs, Continuous, Strategy::Nearest);
        assert_eq!(e.strategy, Strategy::Nearest);
        let notes: Vec<(&str, bool)> = e
            .candidates
            .iter()
            .map(|n| (n.connector.as_str(), n.eligible))
            .collect();
        assert_eq!(
            notes,
            vec![
                ("a", true),
                ("b", true),
                ("far", false),
                ("new", false),
                ("down", false)
            ]
        );
        assert_eq!(e.candidates[2].rtt, Some(Duration::from_millis(30)));
        assert_eq!(e.candidates[3].rtt, None);
        assert_eq!(
            e.candidates[0].reason,
            "reports the application up; rtt 1.000 ms is within the tolerance of the nearest (1.000 ms best, up to 3.000 ms): drawn at random among these"
        );
        assert!(
            e.candidates[2]
                .reason
                .contains("rtt 30.000 ms is beyond 3.000 ms"),
            "{}",
            e.candidates[2].reason
        );
        assert!(e.candidates[3].reason.contains("no rtt yet"));
        assert_eq!(e.candidates[4].reason, "reports the application down");
        let eligible: BTreeSet<String> = e
            .candidates
            .iter()
            .filter(|n| n.eligible)
            .map(|n| n.connector.clone())
            .collect();
        assert_eq!(eligible, chosen(&cs, Continuous, Strategy::Nearest));
        let json = serde_json_like(&e.candidates[1]);
        assert!(json.contains("rtt_ms = 2.5"), "{json}");
    }

    /// A candidate note through serde (TOML: no JSON dependency here).
    fn serde_json_like(note: &CandidateNote) -> String {
        toml::to_string(note).expect("serialize")
    }

    #[test]
    fn rtt_is_smoothed_per_report_from_reachable_addresses() {
        use crate::status::{AddressResult, Method};
        let ms = Duration::from_millis;
        assert_eq!(smooth_rtt(None, ms(10)), ms(10));
        let s = smooth_rtt(Some(ms(10)), ms(20));
        assert!((s.as_secs_f64() - 0.013).abs() < 1e-9, "{s:?}");
        // A lasting change is followed within a few reports.
        let mut rtt = ms(1);
        for _ in 0..10 {
            rtt = smooth_rtt(Some(rtt), ms(50));
        }
        assert!(rtt > ms(48), "{rtt:?}");
        let addr = |ip: &str, reachable: bool, rtt_ms: u64| AddressResult {
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

    #[test]
    fn names_parse_and_print() {
        assert_eq!("healthy".parse::<Strategy>(), Ok(Strategy::Healthy));
        assert_eq!("group".parse::<Strategy>(), Ok(Strategy::Group));
        assert_eq!("nearest".parse::<Strategy>(), Ok(Strategy::Nearest));
        assert_eq!(Strategy::Nearest.to_string(), "nearest");
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
