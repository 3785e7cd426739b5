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
//!   `Healthy`. When the request names the user's location and every
//!   reachable candidate's group has one, a candidate's score is its RTT
//!   plus the round trip the user→group distance costs at least
//!   (`location::estimated_rtt`), and the band is taken over scores.
//!
//! For `none` segments every connected candidate counts as Up.
//!
//! A drained candidate (`Candidate::drained`: an administrator drained it,
//! or it drains itself while it shuts down) is selected for no new access
//! in every strategy and mode: it counts as neither reachable nor
//! connected for the rules above, and when every connected candidate is
//! drained the refusal says so (`AllDrained`).
//!
//! `Eligibility` is the one statement of that rule: `select` draws from it,
//! `explain` reports its verdict per candidate.
//!
//! `select` allocates nothing on the healthy path and returns an index;
//! `explain` builds the per-candidate explanation when a caller wants it.

use std::fmt;
use std::time::Duration;

use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

use crate::location::{Location, estimated_rtt};
use crate::model::HealthReporting;
pub use crate::model::Strategy;
use crate::status::Status;

/// A connector of one of the matched segment's groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Connector name.
    pub connector: String,
    /// Its group.
    pub group: String,
    /// Whether it has a live session.
    pub connected: bool,
    /// Whether it is drained: it keeps its session and reports but carries
    /// no new access.
    pub drained: bool,
    /// Its effective status for the requested application.
    pub status: Status,
    /// Its smoothed round-trip time to the application (`smooth_rtt` over
    /// its reports), if it has reported one.
    pub rtt: Option<Duration>,
    /// Its group's configured location, if the group has one.
    pub location: Option<Location>,
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

/// Weight of a new sample in the smoothed RTT (an exponentially weighted
/// moving average): 0.3 follows a lasting change within a few reports
/// without letting one slow handshake move a connector out of the band.
pub const RTT_WEIGHT: f64 = 0.3;

/// The smoothed RTT after `sample`: the sample itself when there was none
/// before, else `RTT_WEIGHT` of it plus the rest of `previous`.
pub fn smooth_rtt(previous: Option<Duration>, sample: Duration) -> Duration {
    match previous {
        None => sample,
        // In integer nanoseconds: `mul_f64` goes through `from_secs_f64`,
        // whose checks were a visible share of the CA's CPU per report
        // (the CA smooths on every report it stores). The result is the
        // exact weighted mean rounded down; the float one differs from it
        // by a nanosecond or two.
        Some(p) => {
            let tenths =
                p.as_nanos() * (10 - RTT_WEIGHT_TENTHS) + sample.as_nanos() * RTT_WEIGHT_TENTHS;
            u64::try_from(tenths / 10).map_or(Duration::from_nanos(u64::MAX), Duration::from_nanos)
        }
    }
}

/// `RTT_WEIGHT` in tenths, which `smooth_rtt` computes with.
const RTT_WEIGHT_TENTHS: u128 = 3;

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
    /// Every connected candidate is drained (an administrator's drain, or
    /// connectors shutting down).
    AllDrained,
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
            RefusalReason::AllDrained => "all_drained",
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

    /// The sentence an explanation shows for `c`, whose group is `km` from
    /// the user, a round trip of `user`, when the user's location counts.
    fn reason(self, c: &Candidate, user: Option<(f64, Duration)>) -> String {
        match self {
            Verdict::NotConnected => "not connected".to_owned(),
            Verdict::Drained => "drained: selected for no new access".to_owned(),
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
                "reports the application {status}; {} is within the tolerance of the nearest ({} best, up to {}): drawn at random among these",
                score_terms(rtt, user),
                ms(best),
                ms(threshold)
            ),
            Verdict::Farther {
                rtt,
                best,
                threshold,
            } => format!(
                "reports the application reachable, but {} is beyond {} (best {} plus tolerance): a nearer connector is reachable",
                score_terms(rtt, user),
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

/// What a nearest score is made of: `rtt 1.000 ms`, or with the user's
/// location `rtt 1.000 ms + 3.436 ms from the user (343.6 km) = score
/// 4.436 ms`.
fn score_terms(rtt: Duration, user: Option<(f64, Duration)>) -> String {
    match user {
        None => format!("rtt {}", ms(rtt)),
        Some((km, u)) => format!(
            "rtt {} + {} from the user ({km:.1} km) = score {}",
            ms(rtt),
            ms(u),
            ms(rtt.saturating_add(u))
        ),
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

    /// The sentence an explanation shows.
    fn reason(self) -> String {
        match self {
            LocationUse::NotGiven => "the request names no location".to_owned(),
            LocationUse::Used => format!(
                "used: each candidate's score is its rtt plus the round trip from the user to its group's location (1 ms per {} km of great-circle distance)",
                crate::location::KM_PER_RTT_MS
            ),
            LocationUse::OtherStrategy(s) => {
                format!("not used: strategy {s} does not weigh distance")
            }
            LocationUse::NothingMeasured => {
                "not used: the segment has health_reporting = \"none\", so no rtt is measured to add it to".to_owned()
            }
            LocationUse::NoRtt => {
                "not used: no reachable connector has reported an rtt yet".to_owned()
            }
            LocationUse::NoneReachable => "not used: no connector is reachable".to_owned(),
            LocationUse::GroupWithout { group, connector } => format!(
                "not used: group {group:?} (of reachable connector {connector:?}) has no location, so distances would not compare fairly"
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

/// One candidate in an explanation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// Nearest strategy, when the user's location counts: the great-circle
    /// distance from the user to its group's location, in kilometres.
    #[serde(default)]
    pub distance_km: Option<f64>,
    /// … and the round trip that distance costs at least (JSON:
    /// `user_rtt_ms`).
    #[serde(rename = "user_rtt_ms", with = "millis", default)]
    pub user_rtt: Option<Duration>,
    /// Nearest strategy: what it was compared by, its RTT plus its user
    /// RTT when that counts (JSON: `score_ms`; null without an RTT or for
    /// other strategies).
    #[serde(rename = "score_ms", with = "millis", default)]
    pub score: Option<Duration>,
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

/// How many candidates an explanation lists at most (`Explanation`): the
/// chosen one, then eligible ones, then connected ones, then the rest, each
/// in candidate order. Past this the list would cost more than the decision
/// (a note and its sentence per candidate, on every answer) and tell an
/// operator nothing a count does not.
pub const EXPLAINED_CANDIDATES: usize = 32;

/// How a decision was reached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// Strategy used.
    pub strategy: Strategy,
    /// Segment mode.
    pub mode: HealthReporting,
    /// The candidates and their eligibility, in candidate order: all of
    /// them up to `EXPLAINED_CANDIDATES`, else that many, the chosen one
    /// first to be kept, then eligible, then connected ones.
    pub candidates: Vec<CandidateNote>,
    /// How many candidates there were (listed or not).
    #[serde(default)]
    pub candidates_total: usize,
    /// How many of them were eligible.
    #[serde(default)]
    pub candidates_eligible: usize,
    /// How many of them were connected.
    #[serde(default)]
    pub candidates_connected: usize,
    /// Group strategy: the groups that were eligible.
    pub eligible_groups: Vec<String>,
    /// The user's location when the request named one, and whether it
    /// counted.
    #[serde(default)]
    pub user_location: Option<UserLocationNote>,
}

/// The user's location in an explanation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UserLocationNote {
    /// Degrees north.
    pub latitude: f64,
    /// Degrees east.
    pub longitude: f64,
    /// Whether it counted in the scores.
    pub used: bool,
    /// Why (not).
    pub reason: String,
}

/// Explains which candidates were eligible and why (by the rule `select`
/// draws from).
pub fn explain(candidates: &[Candidate], mode: HealthReporting, strategy: Strategy) -> Explanation {
    explain_with(candidates, mode, strategy, Tolerance::default())
}

/// `explain` with the nearest strategy's `proximity` (see `select_with`).
pub fn explain_with(
    candidates: &[Candidate],
    mode: HealthReporting,
    strategy: Strategy,
    proximity: impl Into<Proximity>,
) -> Explanation {
    explain_owned(candidates.to_vec(), None, mode, strategy, proximity)
}

/// `explain_with`, taking the candidates and the index of the chosen one
/// (always listed): the listed names move into the notes instead of being
/// copied (a caller that explains every decision, as the CA does, saves
/// two strings per candidate).
pub fn explain_owned(
    candidates: Vec<Candidate>,
    chosen: Option<usize>,
    mode: HealthReporting,
    strategy: Strategy,
    proximity: impl Into<Proximity>,
) -> Explanation {
    let proximity = proximity.into();
    let eligibility = Eligibility::with_tolerance(&candidates, mode, strategy, proximity);
    let location = eligibility.location_use();
    let verdicts: Vec<Verdict> = candidates.iter().map(|c| eligibility.verdict(c)).collect();
    let listed = listed(&verdicts, chosen);
    let judged: Vec<_> = candidates
        .iter()
        .zip(&verdicts)
        .zip(&listed)
        .filter(|(_, keep)| **keep)
        .map(|((c, verdict), _)| judge(&eligibility, c, *verdict))
        .collect();
    let eligible_groups = eligibility
        .groups()
        .iter()
        .map(|g| (*g).to_owned())
        .collect();
    let user_location = user_location_note(proximity, location);
    let candidates_total = candidates.len();
    let candidates_eligible = verdicts.iter().filter(|v| v.is_eligible()).count();
    let candidates_connected = verdicts
        .iter()
        .filter(|v| **v != Verdict::NotConnected)
        .count();
    let notes = candidates
        .into_iter()
        .zip(listed)
        .filter_map(|(c, keep)| keep.then_some(c))
        .zip(judged)
        .map(|(c, j)| CandidateNote {
            connector: c.connector,
            group: c.group,
            connected: c.connected,
            status: j.status,
            eligible: j.eligible,
            reason: j.reason,
            rtt: c.rtt,
            distance_km: j.distance_km,
            user_rtt: j.user_rtt,
            score: j.score,
        })
        .collect();
    Explanation {
        strategy,
        mode,
        candidates: notes,
        candidates_total,
        candidates_eligible,
        candidates_connected,
        eligible_groups,
        user_location,
    }
}

/// The user's location in an explanation, when the request names one.
pub(crate) fn user_location_note(
    proximity: Proximity,
    location: LocationUse<'_>,
) -> Option<UserLocationNote> {
    proximity.user.map(|u| UserLocationNote {
        latitude: u.latitude(),
        longitude: u.longitude(),
        used: location == LocationUse::Used,
        reason: location.reason(),
    })
}

/// Which candidates an explanation lists: every one up to
/// `EXPLAINED_CANDIDATES`, else the chosen one, then eligible, then
/// connected, then the rest, each in candidate order, until that many.
fn listed(verdicts: &[Verdict], chosen: Option<usize>) -> Vec<bool> {
    if verdicts.len() <= EXPLAINED_CANDIDATES {
        return vec![true; verdicts.len()];
    }
    let rank = |i: usize, v: Verdict| {
        if Some(i) == chosen {
            0
        } else if v.is_eligible() {
            1
        } else if v != Verdict::NotConnected {
            2
        } else {
            3
        }
    };
    let mut keep = vec![false; verdicts.len()];
    let mut left = EXPLAINED_CANDIDATES;
    for wanted in 0..=3 {
        for (i, v) in verdicts.iter().enumerate() {
            if left == 0 {
                return keep;
            }
            if !keep[i] && rank(i, *v) == wanted {
                keep[i] = true;
                left -= 1;
            }
        }
    }
    keep
}

/// One listed candidate's note, apart from what moves out of it.
pub(crate) struct Judged {
    status: Status,
    eligible: bool,
    reason: String,
    distance_km: Option<f64>,
    user_rtt: Option<Duration>,
    score: Option<Duration>,
}

impl Judged {
    /// The note of `c`, judged so, its names copied.
    pub(crate) fn note(self, c: &Candidate) -> CandidateNote {
        CandidateNote {
            connector: c.connector.clone(),
            group: c.group.clone(),
            connected: c.connected,
            status: self.status,
            eligible: self.eligible,
            reason: self.reason,
            rtt: c.rtt,
            distance_km: self.distance_km,
            user_rtt: self.user_rtt,
            score: self.score,
        }
    }
}

/// The note of `c`, judged `verdict` under `eligibility`.
pub(crate) fn judge(eligibility: &Eligibility<'_>, c: &Candidate, verdict: Verdict) -> Judged {
    let used = eligibility.location_use() == LocationUse::Used;
    let nearest =
        eligibility.strategy == Strategy::Nearest && eligibility.mode != HealthReporting::None;
    let distance_km = eligibility.user_distance(c);
    let user_rtt = eligibility.user_rtt(c);
    let status = if verdict == Verdict::AssumedReachable {
        Status::Up
    } else {
        c.status
    };
    // Without a location of its own while the user's counts, an
    // (unreachable) candidate has no comparable score.
    let score = c
        .rtt
        .and_then(|rtt| match (used, user_rtt) {
            (false, _) => Some(rtt),
            (true, u) => Some(rtt.saturating_add(u?)),
        })
        .filter(|_| nearest);
    Judged {
        status,
        eligible: verdict.is_eligible(),
        reason: verdict.reason(c, distance_km.zip(user_rtt)),
        distance_km,
        user_rtt,
        score,
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
            drained: false,
            status,
            rtt: None,
            location: None,
        }
    }

    /// `c(…)`, drained.
    fn drained(connector: &str, group: &str, status: Status) -> Candidate {
        Candidate {
            drained: true,
            ..c(connector, group, true, status)
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
    fn a_large_explanation_lists_the_chosen_then_eligible_then_connected_and_counts_all() {
        // 40 disconnected, 40 connected Down, 20 Up; the chosen is Up.
        let cs: Vec<Candidate> = (0..100)
            .map(|i| {
                let (connected, status) = match i {
                    0..40 => (false, Up),
                    40..80 => (true, Down),
                    _ => (true, Up),
                };
                c(&format!("c{i:03}"), "g", connected, status)
            })
            .collect();
        let names = |e: &Explanation| -> Vec<String> {
            e.candidates.iter().map(|n| n.connector.clone()).collect()
        };
        let expected: Vec<String> = (40..52)
            .chain(80..100)
            .map(|i| format!("c{i:03}"))
            .collect();
        let e = explain_owned(
            cs.clone(),
            Some(90),
            Continuous,
            Strategy::Healthy,
            Tolerance::default(),
        );
        assert_eq!(
            names(&e),
            expected,
            "eligible first, then connected, in order"
        );
        assert_eq!(e.candidates.len(), EXPLAINED_CANDIDATES);
        assert_eq!(
            (
                e.candidates_total,
                e.candidates_eligible,
                e.candidates_connected
            ),
            (100, 20, 60)
        );
        assert!(e.candidates.iter().filter(|n| n.eligible).count() == 20);
        // More eligible than fit: the chosen one is kept even when it is
        // not among the first eligible ones.
        let ups: Vec<Candidate> = (0..50)
            .map(|i| c(&format!("u{i:02}"), "g", true, Up))
            .collect();
        let e = explain_owned(
            ups.clone(),
            Some(49),
            Continuous,
            Strategy::Healthy,
            Tolerance::default(),
        );
        let listed = names(&e);
        assert_eq!(listed.len(), EXPLAINED_CANDIDATES);
        assert_eq!(listed.last().map(String::as_str), Some("u49"));
        assert_eq!(
            listed[..31],
            names(&explain(&ups[..31], Continuous, Strategy::Healthy))[..]
        );
        assert_eq!(
            (
                e.candidates_total,
                e.candidates_eligible,
                e.candidates_connected
            ),
            (50, 50, 50)
        );
        // Up to the bound every candidate is listed, in order.
        let e = explain(&cs[..EXPLAINED_CANDIDATES], Continuous, Strategy::Healthy);
        assert_eq!(e.candidates.len(), EXPLAINED_CANDIDATES);
        assert_eq!(e.candidates_total, EXPLAINED_CANDIDATES);
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
    fn counts(candidates: &[Candidate], proximity: impl Into<Proximity>, n: usize) -> Vec<usize> {
        let proximity = proximity.into();
        let mut rng = SmallRng::seed_from_u64(16);
        let mut counts = vec![0; candidates.len()];
        for _ in 0..n {
            match select_with(
                candidates,
                Continuous,
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
    fn chi_square_uniform(got: &[usize], n: usize) -> f64 {
        let expected = n as f64 / got.len() as f64;
        got.iter()
            .map(|&o| (o as f64 - expected).powi(2) / expected)
            .sum()
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

    const PARIS: (f64, f64) = (48.8566, 2.3522);
    const LONDON: (f64, f64) = (51.5074, -0.1278);
    const FRANKFURT: (f64, f64) = (50.1109, 8.6821);
    const NEW_YORK: (f64, f64) = (40.7128, -74.0060);

    fn place((lat, lon): (f64, f64)) -> Location {
        Location::new(lat, lon).expect("valid")
    }

    /// An Up candidate of `group`, which is at `at`, with an RTT of `rtt_ms`.
    fn located(connector: &str, group: &str, rtt_ms: f64, at: Option<(f64, f64)>) -> Candidate {
        Candidate {
            group: group.into(),
            location: at.map(place),
            ..near(connector, Up, Some(rtt_ms))
        }
    }

    /// The user in Paris.
    fn from_paris() -> Proximity {
        Proximity {
            tolerance: Tolerance::default(),
            user: Some(place(PARIS)),
        }
    }

    /// The set `select_with` chooses over many draws with `proximity`.
    fn chosen_near(candidates: &[Candidate], proximity: Proximity) -> BTreeSet<String> {
        counts(candidates, proximity, 2000)
            .iter()
            .zip(candidates)
            .filter(|(n, _)| **n > 0)
            .map(|(_, c)| c.connector.clone())
            .collect()
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

    #[test]
    fn explain_shows_each_candidates_distance_user_rtt_and_score() {
        let cs = [
            located("ny-1", "us-east", 1.0, Some(NEW_YORK)),
            located("fra-1", "eu-central", 5.0, Some(FRANKFURT)),
        ];
        let e = explain_with(&cs, Continuous, Strategy::Nearest, from_paris());
        let u = e.user_location.as_ref().expect("noted");
        assert_eq!((u.latitude, u.longitude, u.used), (PARIS.0, PARIS.1, true));
        assert!(u.reason.contains("1 ms per 100 km"), "{}", u.reason);
        let (ny, fra) = (&e.candidates[0], &e.candidates[1]);
        let km = |n: &CandidateNote| n.distance_km.expect("distance");
        assert!((km(ny) - 5837.0).abs() < 10.0, "{ny:?}");
        assert!((km(fra) - 478.0).abs() < 5.0, "{fra:?}");
        assert_eq!(fra.user_rtt, Some(estimated_rtt(km(fra))));
        assert_eq!(
            fra.score,
            Some(Duration::from_millis(5) + estimated_rtt(km(fra)))
        );
        assert!(fra.eligible && !ny.eligible);
        assert_eq!(
            fra.reason,
            "reports the application up; rtt 5.000 ms + 4.779 ms from the user (477.9 km) = score 9.779 ms is within the tolerance of the nearest (9.779 ms best, up to 11.779 ms): drawn at random among these"
        );
        assert!(
            ny.reason.starts_with(
                "reports the application reachable, but rtt 1.000 ms + 58."
            ) && ny
                .reason
                .ends_with("is beyond 11.779 ms (best 9.779 ms plus tolerance): a nearer connector is reachable"),
            "{}",
            ny.reason
        );
        // Without the user's location the score is the RTT.
        let e = explain_with(&cs, Continuous, Strategy::Nearest, Tolerance::default());
        assert_eq!(e.candidates[1].score, Some(Duration::from_millis(5)));
        assert_eq!(e.candidates[1].distance_km, None);
        assert_eq!(e.candidates[1].user_rtt, None);
        // Eligibility in the explanation agrees with what select chooses.
        let e = explain_with(&cs, Continuous, Strategy::Nearest, from_paris());
        let eligible: BTreeSet<String> = e
            .candidates
            .iter()
            .filter(|n| n.eligible)
            .map(|n| n.connector.clone())
            .collect();
        assert_eq!(eligible, chosen_near(&cs, from_paris()));
    }

    #[test]
    fn rtt_is_smoothed_per_report_from_reachable_addresses() {
        use crate::status::{AddressResult, Method};
        let ms = Duration::from_millis;
        assert_eq!(smooth_rtt(None, ms(10)), ms(10));
        let s = smooth_rtt(Some(ms(10)), ms(20));
        assert!((s.as_secs_f64() - 0.013).abs() < 1e-9, "{s:?}");
        // The integer arithmetic is the weight's, within a nanosecond.
        assert_eq!(RTT_WEIGHT_TENTHS as f64 / 10.0, RTT_WEIGHT);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (p, n) = (
                Duration::from_nanos(x % 10_000_000_000),
                Duration::from_nanos((x >> 20) % 10_000_000_000),
            );
            let float = p.mul_f64(1.0 - RTT_WEIGHT) + n.mul_f64(RTT_WEIGHT);
            let int = smooth_rtt(Some(p), n);
            let apart = int.abs_diff(float);
            assert!(
                apart <= Duration::from_nanos(2),
                "{p:?} {n:?}: {int:?} vs {float:?}"
            );
        }
        // Beyond what nanoseconds in a u64 hold (a broken peer's RTT), no
        // overflow.
        assert_eq!(
            smooth_rtt(Some(Duration::MAX), Duration::MAX),
            Duration::from_nanos(u64::MAX)
        );
        // A lasting change is followed within a few reports.
        let mut rtt = ms(1);
        for _ in 0..10 {
            rtt = smooth_rtt(Some(rtt), ms(50));
        }
        assert!(rtt > ms(48), "{rtt:?}");
        let addr = |ip: &str, reachable: bool, rtt_ms: u64| AddressResult {
            check: None,
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
