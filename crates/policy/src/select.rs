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
