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
//!
//! Its parts: `eligibility` (who may carry a request:
//! `Eligibility`, its `Verdict` per candidate, whether the user's location
//! counts, the nearest strategy's `Tolerance`), `strategy` (`select`: each
//! strategy's draw from the eligible, and the refusal when none is),
//! `smoothing` (the smoothed RTT the nearest strategy compares) and
//! `explanation` (`explain`: the notes and sentences an answer carries).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::location::Location;
pub use crate::model::Strategy;
use crate::status::Status;

mod eligibility;
mod explanation;
#[cfg(test)]
mod fixtures;
mod smoothing;
mod strategy;

pub use eligibility::{Eligibility, LocationUse, Proximity, Tolerance, Verdict};
pub use explanation::{
    CandidateNote, EXPLAINED_CANDIDATES, Explanation, UserLocationNote, explain, explain_owned,
    explain_with,
};
pub(crate) use explanation::{judge, user_location_note};
pub use smoothing::{RTT_WEIGHT, rtt_sample, smooth_rtt};
pub use strategy::{select, select_with};

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

#[cfg(test)]
mod tests {
    use super::*;

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
