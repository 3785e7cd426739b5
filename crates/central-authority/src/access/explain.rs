//! How an access decision was reached (`ExplanationView`): policy's
//! explanation of who was eligible plus what the CA did around it, and its
//! JSON, written by hand on the HTTP access path (`json`) with the same
//! bytes serde writes.

use policy::{CandidateNote, Explanation, HealthReporting, Strategy, UserLocationNote};
use serde::Serialize;

/// How a decision was reached: policy's explanation of who was eligible
/// plus what the CA did around it (matching, forwarding, discovery).
#[derive(Clone, Debug, PartialEq)]
pub struct ExplanationView {
    /// Matched segment, if any.
    pub segment: Option<String>,
    /// The segment entry that matched (FQDN, IP, wildcard or subnet).
    pub matched_entry: Option<String>,
    /// Strategy in force (shown also when no segment matched).
    pub strategy: Strategy,
    /// Who was eligible and why, once a segment matched.
    pub selection: Option<Explanation>,
    /// Group strategy: the group chosen first.
    pub chosen_group: Option<String>,
    /// Connectors this access was forwarded to (on-access; after coalescing).
    pub forwarded_to: Vec<String>,
    /// Whether the CA waited for on-access discovery.
    pub discovery_waited: bool,
    /// How long it waited, in milliseconds.
    pub discovery_ms: u64,
    /// When the request was matched to a segment (or found none): the
    /// access log record's `match_us` ends there. Not shown.
    pub matched_at: Option<std::time::Instant>,
}

impl ExplanationView {
    /// Nothing matched yet, under `strategy`.
    pub(crate) fn new(strategy: Strategy) -> Self {
        ExplanationView {
            segment: None,
            matched_entry: None,
            strategy,
            selection: None,
            chosen_group: None,
            forwarded_to: Vec::new(),
            discovery_waited: false,
            discovery_ms: 0,
            matched_at: None,
        }
    }
}

/// The JSON shape of an explanation (the book's HTTP API chapter): policy's fields
/// inline, `mode` and `user_location` null and the lists empty before a
/// segment matched.
#[derive(Serialize)]
struct ExplanationJson<'a> {
    segment: &'a Option<String>,
    matched_entry: &'a Option<String>,
    strategy: Strategy,
    mode: Option<HealthReporting>,
    candidates: &'a [CandidateNote],
    candidates_total: usize,
    candidates_eligible: usize,
    candidates_connected: usize,
    eligible_groups: &'a [String],
    user_location: Option<&'a UserLocationNote>,
    chosen_group: &'a Option<String>,
    forwarded_to: &'a [String],
    discovery_waited: bool,
    discovery_ms: u64,
}

impl Serialize for ExplanationView {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let selection = self.selection.as_ref();
        ExplanationJson {
            segment: &self.segment,
            matched_entry: &self.matched_entry,
            strategy: self.strategy,
            mode: selection.map(|e| e.mode),
            candidates: selection.map_or(&[], |e| &e.candidates),
            candidates_total: selection.map_or(0, |e| e.candidates_total),
            candidates_eligible: selection.map_or(0, |e| e.candidates_eligible),
            candidates_connected: selection.map_or(0, |e| e.candidates_connected),
            eligible_groups: selection.map_or(&[], |e| &e.eligible_groups),
            user_location: selection.and_then(|e| e.user_location.as_ref()),
            chosen_group: &self.chosen_group,
            forwarded_to: &self.forwarded_to,
            discovery_waited: self.discovery_waited,
            discovery_ms: self.discovery_ms,
        }
        .serialize(s)
    }
}

impl ExplanationView {
    /// Writes the JSON of [`Serialize`] (the same bytes) into `out`. The
    /// HTTP access answer is written this way: through serde, every key
    /// and string value went through serde_json's escaping loop, about a
    /// fifth of the CA's instructions per answer.
    pub(crate) fn write_json(&self, out: &mut Vec<u8>) {
        let selection = self.selection.as_ref();
        out.extend_from_slice(b"{\"segment\":");
        json::opt_str(out, self.segment.as_deref());
        out.extend_from_slice(b",\"matched_entry\":");
        json::opt_str(out, self.matched_entry.as_deref());
        out.extend_from_slice(b",\"strategy\":");
        json::str(out, self.strategy.as_str());
        out.extend_from_slice(b",\"mode\":");
        json::opt_str(out, selection.map(|e| e.mode.as_str()));
        out.extend_from_slice(b",\"candidates\":[");
        for (i, c) in selection
            .map_or(&[][..], |e| &e.candidates)
            .iter()
            .enumerate()
        {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"connector\":");
            json::str(out, &c.connector);
            out.extend_from_slice(b",\"group\":");
            json::str(out, &c.group);
            out.extend_from_slice(b",\"connected\":");
            json::bool(out, c.connected);
            out.extend_from_slice(b",\"status\":");
            json::str(out, c.status.as_str());
            out.extend_from_slice(b",\"eligible\":");
            json::bool(out, c.eligible);
            out.extend_from_slice(b",\"reason\":");
            json::str(out, &c.reason);
            out.extend_from_slice(b",\"rtt_ms\":");
            json::opt_millis(out, c.rtt);
            out.extend_from_slice(b",\"distance_km\":");
            json::opt_f64(out, c.distance_km);
            out.extend_from_slice(b",\"user_rtt_ms\":");
            json::opt_millis(out, c.user_rtt);
            out.extend_from_slice(b",\"score_ms\":");
            json::opt_millis(out, c.score);
            out.push(b'}');
        }
        out.extend_from_slice(b"],\"candidates_total\":");
        json::u64(out, count(selection.map_or(0, |e| e.candidates_total)));
        out.extend_from_slice(b",\"candidates_eligible\":");
        json::u64(out, count(selection.map_or(0, |e| e.candidates_eligible)));
        out.extend_from_slice(b",\"candidates_connected\":");
        json::u64(out, count(selection.map_or(0, |e| e.candidates_connected)));
        out.extend_from_slice(b",\"eligible_groups\":");
        json::strs(out, selection.map_or(&[][..], |e| &e.eligible_groups));
        out.extend_from_slice(b",\"user_location\":");
        match selection.and_then(|e| e.user_location.as_ref()) {
            Some(u) => {
                out.extend_from_slice(b"{\"latitude\":");
                json::f64(out, u.latitude);
                out.extend_from_slice(b",\"longitude\":");
                json::f64(out, u.longitude);
                out.extend_from_slice(b",\"used\":");
                json::bool(out, u.used);
                out.extend_from_slice(b",\"reason\":");
                json::str(out, &u.reason);
                out.push(b'}');
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"chosen_group\":");
        json::opt_str(out, self.chosen_group.as_deref());
        out.extend_from_slice(b",\"forwarded_to\":");
        json::strs(out, &self.forwarded_to);
        out.extend_from_slice(b",\"discovery_waited\":");
        json::bool(out, self.discovery_waited);
        out.extend_from_slice(b",\"discovery_ms\":");
        json::u64(out, self.discovery_ms);
        out.push(b'}');
    }
}

/// A count as JSON writes it (a `usize` always fits in a `u64` here).
fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// JSON values written by hand for the access answer (keys are literals
/// at the call sites). Strings that need no escaping are copied as they
/// are; everything else goes through serde_json, so the bytes are always
/// serde_json's (tests compare the two).
pub(crate) mod json {
    use std::time::Duration;

    /// A JSON string.
    pub fn str(out: &mut Vec<u8>, s: &str) {
        // serde_json escapes exactly these: control characters, `"`, `\`.
        if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
            out.reserve(s.len() + 2);
            out.push(b'"');
            out.extend_from_slice(s.as_bytes());
            out.push(b'"');
        } else {
            serde(out, s);
        }
    }

    /// A string or `null`.
    pub fn opt_str(out: &mut Vec<u8>, s: Option<&str>) {
        match s {
            Some(s) => str(out, s),
            None => out.extend_from_slice(b"null"),
        }
    }

    /// An array of strings.
    pub fn strs(out: &mut Vec<u8>, list: &[String]) {
        out.push(b'[');
        for (i, s) in list.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            str(out, s);
        }
        out.push(b']');
    }

    /// `true` or `false`.
    pub fn bool(out: &mut Vec<u8>, b: bool) {
        out.extend_from_slice(if b { b"true" } else { b"false" });
    }

    /// An unsigned integer.
    pub fn u64(out: &mut Vec<u8>, v: u64) {
        serde(out, &v);
    }

    /// A number (`null` when not finite, as serde_json writes it).
    pub fn f64(out: &mut Vec<u8>, v: f64) {
        serde(out, &v);
    }

    /// A number or `null`.
    pub fn opt_f64(out: &mut Vec<u8>, v: Option<f64>) {
        match v {
            Some(v) => f64(out, v),
            None => out.extend_from_slice(b"null"),
        }
    }

    /// A duration in milliseconds, or `null` (policy's `millis`).
    pub fn opt_millis(out: &mut Vec<u8>, d: Option<Duration>) {
        opt_f64(out, d.map(|d| d.as_secs_f64() * 1000.0));
    }

    fn serde<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
        // Writing a string or a number into a `Vec` cannot fail.
        let _ = serde_json::to_writer(&mut *out, v);
    }
}

#[cfg(test)]
mod tests {
    use policy::{Candidate, Location, Proximity, Status};

    use super::*;

    /// The hand-written JSON is serde's, byte for byte: no segment, a
    /// selection with RTTs, distances and a user location, strings that
    /// need escaping, non-finite numbers.
    #[test]
    fn written_json_is_serdes() {
        let same = |view: &ExplanationView| {
            let mut written = Vec::new();
            view.write_json(&mut written);
            let serde = serde_json::to_vec(view).expect("json");
            assert_eq!(
                String::from_utf8_lossy(&written),
                String::from_utf8_lossy(&serde)
            );
        };
        same(&ExplanationView::new(Strategy::Healthy));
        let candidates = [
            Candidate {
                connector: "c\"1\\".into(),
                group: "g\u{1}é\n".into(),
                connected: true,
                drained: false,
                status: Status::Up,
                rtt: Some(std::time::Duration::from_micros(1500)),
                location: Some(Location::new(48.85, 2.35).expect("location")),
            },
            Candidate {
                connector: "c2".into(),
                group: "h".into(),
                connected: false,
                drained: false,
                status: Status::Down,
                rtt: None,
                location: None,
            },
        ];
        for strategy in [Strategy::Healthy, Strategy::Group, Strategy::Nearest] {
            for mode in [HealthReporting::Continuous, HealthReporting::OnAccess] {
                let mut view = ExplanationView::new(strategy);
                view.segment = Some("web \"x\"".into());
                view.matched_entry = Some("*.test".into());
                view.chosen_group = Some("g".into());
                view.forwarded_to = vec!["c1".into(), "c\t2".into()];
                view.discovery_waited = true;
                view.discovery_ms = 1234;
                view.selection = Some(policy::explain_with(
                    &candidates,
                    mode,
                    strategy,
                    Proximity {
                        tolerance: Default::default(),
                        user: Some(Location::new(52.52, 13.40).expect("location")),
                    },
                ));
                same(&view);
                if let Some(s) = view.selection.as_mut() {
                    s.user_location = None;
                    s.candidates[0].distance_km = Some(f64::NAN);
                }
                same(&view);
            }
        }
    }

    /// The JSON API's explanation keeps its shape whether or not a segment
    /// matched: policy's fields inline, `mode` null and lists empty before.
    #[test]
    fn explanation_json_has_one_shape() {
        let keys = |v: &serde_json::Value| {
            let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
            k.sort();
            k
        };
        let empty = serde_json::to_value(ExplanationView::new(Strategy::Group)).expect("json");
        assert_eq!(
            empty,
            serde_json::json!({
                "segment": null, "matched_entry": null, "strategy": "group", "mode": null,
                "candidates": [], "candidates_total": 0, "candidates_eligible": 0,
                "candidates_connected": 0, "eligible_groups": [], "user_location": null,
                "chosen_group": null,
                "forwarded_to": [], "discovery_waited": false, "discovery_ms": 0
            })
        );
        let candidates = [Candidate {
            connector: "c1".into(),
            group: "g".into(),
            connected: true,
            drained: false,
            status: Status::Up,
            rtt: None,
            location: None,
        }];
        let mut view = ExplanationView::new(Strategy::Group);
        view.segment = Some("jira".into());
        view.selection = Some(policy::explain(
            &candidates,
            HealthReporting::OnAccess,
            Strategy::Group,
        ));
        let full = serde_json::to_value(&view).expect("json");
        assert_eq!(keys(&full), keys(&empty));
        assert_eq!(full["mode"], "on_access");
        assert_eq!(full["eligible_groups"], serde_json::json!(["g"]));
        assert_eq!(full["candidates"][0]["eligible"], true);
        assert_eq!(
            full["candidates"][0]["reason"],
            "group \"g\" is eligible and this connector reports up"
        );
    }
}
