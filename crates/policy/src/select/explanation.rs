//! How a decision was reached, for an answer to carry: `explain` notes
//! each candidate with its verdict under `Eligibility` and the sentence
//! that says why, lists at most `EXPLAINED_CANDIDATES` of them, and counts
//! the rest.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::HealthReporting;
use crate::select::eligibility::{Eligibility, LocationUse, Proximity, Tolerance, Verdict};
use crate::select::{Candidate, Strategy};
use crate::status::Status;

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
    let nearest = eligibility.scores();
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

impl Verdict {
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

impl LocationUse<'_> {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::location::estimated_rtt;
    use crate::select::fixtures::*;
    use HealthReporting::{Continuous, None as NoChecks, OnAccess};
    use Status::{Down, Unhealthy, Unknown, Up};

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
}
