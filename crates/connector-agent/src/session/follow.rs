//! Which replica's assignment the connector follows. Every CA session
//! hands in the assignment (segments and `ConnectorSettings`) of its
//! `Welcome` and each later `PolicyUpdate`; all replicas serve one policy,
//! so normally they agree. When they do not (mid-rollout of a new policy
//! file, or a replica with a stale file), the rule is: **the connector
//! follows the session that has been connected longest** (welcomed first
//! among the live ones). It moves to the next-longest when that session
//! ends, and follows a `PolicyUpdate` only from the session it follows.
//! The disagreement shows in the metrics (`reach_agent_ca_assignments`,
//! `reach_agent_policy_disagreement`) and in every heartbeat
//! (`Heartbeat.replicas`), so each replica's `GET /api/v1/connectors` shows
//! it.
//!
//! An assignment is identified by its hash: the first 16 hex digits of the
//! SHA-256 of the encoded `PolicyUpdate {segments, settings}`; replicas
//! that build it from the same policy file encode it identically.
//!
//! Settings that are one replica's own stay per session: the heartbeat
//! interval and the report entry limits (each replica flow-controls its
//! own session). The followed assignment sets the segments, the on-access
//! window, the rate and the probe timeout.

use std::collections::BTreeMap;
use std::sync::Mutex;

use prost::Message;
use protocol::v1;

use crate::metrics::Metrics;

/// One session's assignment.
#[derive(Clone, Debug)]
struct Member {
    /// When it was first welcomed, as a sequence number (smaller = longer
    /// connected).
    order: u64,
    hash: String,
    segments: Vec<v1::Segment>,
    settings: Option<v1::ConnectorSettings>,
}

/// The sessions' assignments and which one is in force.
#[derive(Debug, Default)]
struct State {
    members: BTreeMap<u64, Member>,
    next_order: u64,
    /// The session and hash whose assignment is applied.
    applied: Option<(u64, String)>,
}

/// Every session's assignment and the rule which one is applied. One per
/// connector.
#[derive(Debug, Default)]
pub struct Assignments {
    state: Mutex<State>,
    /// Serialises applying, so assignments are applied in the order chosen.
    applying: tokio::sync::Mutex<()>,
}

/// The hash of an assignment (see the module comment).
pub fn assignment_hash(
    segments: &[v1::Segment],
    settings: Option<&v1::ConnectorSettings>,
) -> String {
    let encoded = v1::PolicyUpdate {
        segments: segments.to_vec(),
        settings: settings.cloned(),
    }
    .encode_to_vec();
    let digest = ring::digest::digest(&ring::digest::SHA256, &encoded);
    digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Assignments {
    /// A new, empty set.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Session `id` was welcomed with, or updated to, this assignment;
    /// returns once the assignment in force reflects it (put in force with
    /// `apply` when the connector follows `id`).
    pub async fn assigned<F: Future<Output = ()>>(
        &self,
        id: u64,
        segments: Vec<v1::Segment>,
        settings: Option<v1::ConnectorSettings>,
        metrics: &Metrics,
        apply: impl FnOnce(Vec<v1::Segment>, Option<v1::ConnectorSettings>) -> F,
    ) {
        {
            let mut state = self.lock();
            let hash = assignment_hash(&segments, settings.as_ref());
            let order = match state.members.get(&id) {
                Some(m) => m.order,
                None => {
                    state.next_order += 1;
                    state.next_order
                }
            };
            state.members.insert(
                id,
                Member {
                    order,
                    hash,
                    segments,
                    settings,
                },
            );
        }
        self.enforce(metrics, apply).await;
    }

    /// Session `id` ended; when it was followed, the next-longest
    /// connected one is (put in force with `apply`).
    pub async fn left<F: Future<Output = ()>>(
        &self,
        id: u64,
        metrics: &Metrics,
        apply: impl FnOnce(Vec<v1::Segment>, Option<v1::ConnectorSettings>) -> F,
    ) {
        if self.lock().members.remove(&id).is_none() {
            return;
        }
        self.enforce(metrics, apply).await;
    }

    /// The followed member: the one welcomed first.
    fn followed(state: &State) -> Option<(u64, &Member)> {
        state
            .members
            .iter()
            .min_by_key(|(_, m)| m.order)
            .map(|(id, m)| (*id, m))
    }

    /// Applies the followed session's assignment with `apply` if it is not
    /// in force.
    async fn enforce<F: Future<Output = ()>>(
        &self,
        metrics: &Metrics,
        apply: impl FnOnce(Vec<v1::Segment>, Option<v1::ConnectorSettings>) -> F,
    ) {
        let _applying = self.applying.lock().await;
        let chosen = {
            let mut state = self.lock();
            let view = self.view_locked(&state, None);
            metrics.ca_sessions.set(i64::from(view.sessions));
            metrics.ca_assignments.set(i64::from(view.assignments));
            metrics
                .policy_disagreement
                .set(i64::from(view.assignments > 1));
            metrics.set_session_state(if view.sessions > 0 {
                "connected"
            } else {
                "connecting"
            });
            match Self::followed(&state) {
                Some((id, m)) => {
                    let key = (id, m.hash.clone());
                    let same = state
                        .applied
                        .as_ref()
                        .is_some_and(|(_, hash)| *hash == m.hash);
                    let pick = (!same).then(|| (m.segments.clone(), m.settings));
                    if view.assignments > 1 {
                        tracing::warn!(
                            followed = %m.hash,
                            assignments = view.assignments,
                            "the CA replicas hand out different assignments; following the session connected longest"
                        );
                    }
                    state.applied = Some(key);
                    pick
                }
                None => None,
            }
        };
        // Identical assignments (the normal case when the followed session
        // changes) are not applied again.
        if let Some((segments, settings)) = chosen {
            apply(segments, settings).await;
        }
    }

    /// The applications the connector serves: the entries of every
    /// segment of the followed session's assignment.
    pub fn applications(&self) -> u32 {
        let state = self.lock();
        let count: usize = Self::followed(&state)
            .map(|(_, m)| m.segments.iter().map(|s| s.applications.len()).sum())
            .unwrap_or(0);
        u32::try_from(count).unwrap_or(u32::MAX)
    }

    /// How the replicas look from session `id` (for its heartbeat).
    pub fn view(&self, id: u64) -> v1::ReplicaAttachment {
        let state = self.lock();
        self.view_locked(&state, Some(id))
    }

    fn view_locked(&self, state: &State, id: Option<u64>) -> v1::ReplicaAttachment {
        let mut hashes: Vec<&str> = state.members.values().map(|m| m.hash.as_str()).collect();
        hashes.sort_unstable();
        hashes.dedup();
        let followed = Self::followed(state);
        let mine = id.and_then(|id| state.members.get(&id));
        v1::ReplicaAttachment {
            sessions: u32::try_from(state.members.len()).unwrap_or(u32::MAX),
            assignments: u32::try_from(hashes.len()).unwrap_or(u32::MAX),
            follows_this_session: followed.is_some_and(|(f, _)| Some(f) == id),
            agrees_with_followed: match (mine, followed) {
                (Some(m), Some((_, f))) => m.hash == f.hash,
                _ => false,
            },
            assignment_hash: mine.map(|m| m.hash.clone()).unwrap_or_default(),
            followed_assignment_hash: followed.map(|(_, f)| f.hash.clone()).unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_changes_with_the_assignment_and_only_then() {
        let settings = v1::ConnectorSettings {
            heartbeat_interval_ms: 1000,
            ..Default::default()
        };
        let a = assignment_hash(&[], Some(&settings));
        assert_eq!(a.len(), 16);
        assert_eq!(a, assignment_hash(&[], Some(&settings.clone())));
        let other = v1::ConnectorSettings {
            heartbeat_interval_ms: 2000,
            ..Default::default()
        };
        assert_ne!(a, assignment_hash(&[], Some(&other)));
        let segment = v1::Segment {
            name: "s".into(),
            ..Default::default()
        };
        assert_ne!(a, assignment_hash(&[segment], Some(&settings)));
    }

    #[test]
    fn the_longest_connected_session_is_followed_and_disagreement_counted() {
        let a = Assignments::new();
        let member = |order, hash: &str| Member {
            order,
            hash: hash.into(),
            segments: Vec::new(),
            settings: None,
        };
        {
            let mut s = a.lock();
            s.members.insert(7, member(2, "bbbb"));
            s.members.insert(3, member(1, "aaaa"));
            s.members.insert(9, member(3, "aaaa"));
        }
        let v = a.view(3);
        assert!(v.follows_this_session && v.agrees_with_followed);
        assert_eq!((v.sessions, v.assignments), (3, 2));
        let v = a.view(7);
        assert!(!v.follows_this_session && !v.agrees_with_followed);
        assert_eq!(v.followed_assignment_hash, "aaaa");
        assert_eq!(v.assignment_hash, "bbbb");
        // The followed session leaves: the next-longest connected (order 2) leads.
        a.lock().members.remove(&3);
        let v = a.view(7);
        assert!(v.follows_this_session && v.agrees_with_followed);
        assert!(!a.view(9).agrees_with_followed);
    }
}
