//! What makes several CA processes sharing one store behave as replicas of
//! one CA: each registers itself in the store with a heartbeat (listed by
//! `GET /api/v1/replicas`), and each reconciles its live connector sessions
//! against the store, so a revocation, disable or delete made on any
//! replica closes the affected sessions on every replica, and reads the
//! administrators' drains from it, so a drain made on any replica holds on
//! every replica.
//!
//! The reconcile runs every `RECONCILE_EVERY` and, on PostgreSQL, at once
//! when another replica's `NOTIFY` arrives (`Store::changes`); the periodic
//! pass covers a lost notification and CA processes sharing one SQLite
//! file. Replicas never talk to each other: the store is the only shared
//! state, and each builds its own health table from the reports its
//! connectors send it.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::access;
use crate::state::authority::Authority;
use crate::state::policy_state::PolicyState;
use crate::store::{ReplicaRecord, StoreError};
use crate::trust;

/// How often a replica checks its live sessions against the store.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(1);

/// How often a replica records its heartbeat.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);

/// A replica is listed `live` while its last heartbeat is younger than this
/// (three heartbeats).
pub const LIVE_WITHIN: Duration = Duration::from_secs(15);

/// A replica silent for this long is removed from the store.
const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);

/// This process as a replica: what its heartbeat records.
#[derive(Clone, Debug)]
pub struct Me {
    /// Replica id.
    pub id: String,
    /// Advertised addresses.
    pub addresses: Vec<String>,
    /// Started at, Unix ms.
    pub started_ms: i64,
}

impl Me {
    /// This replica: `[replica] id` (default: the host name and the gRPC
    /// port) and `[replica] advertise` (default: the bound gRPC and HTTP
    /// addresses, the host name standing in for a wildcard address).
    pub fn new(state: &PolicyState, grpc: std::net::SocketAddr, http: std::net::SocketAddr) -> Me {
        let s = state.settings();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        let id = s
            .replica_id
            .clone()
            .unwrap_or_else(|| format!("{host}:{}", grpc.port()));
        // A wildcard listen address says nothing about where the replica
        // is reached: the host name does.
        let shown = |a: std::net::SocketAddr| {
            if a.ip().is_unspecified() {
                format!("{host}:{}", a.port())
            } else {
                a.to_string()
            }
        };
        let addresses = if s.advertise.is_empty() {
            vec![shown(grpc), shown(http)]
        } else {
            s.advertise.clone()
        };
        Me {
            id,
            addresses,
            started_ms: crate::ground::clock::now_ms(),
        }
    }
}

/// A replica as `GET /api/v1/replicas` shows it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ReplicaView {
    /// Replica id.
    pub id: String,
    /// Addresses it advertises.
    pub addresses: Vec<String>,
    /// Its version.
    pub version: String,
    /// Started at, Unix ms.
    pub started_at: i64,
    /// Last heartbeat, Unix ms.
    pub last_heartbeat: i64,
    /// Hash of the policy it serves.
    pub policy_hash: String,
    /// Heard from within `LIVE_WITHIN`.
    pub live: bool,
    /// The replica that answered.
    pub this: bool,
}

/// A short hash of the policy (segments and connector groups, no secrets):
/// replicas serving the same policy file show the same hash.
/// Computed once per policy version (a heartbeat every few seconds would
/// otherwise format the whole policy each time: ~4 M instructions at the
/// bench's 100 segments).
pub fn policy_hash(state: &PolicyState) -> String {
    state
        .hash_with(|state| {
            let digest =
                crate::ground::digest::sha256_hex(format!("{:?}", state.config.policy).as_bytes());
            digest.chars().take(16).collect()
        })
        .to_owned()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Records this replica's heartbeat.
pub fn replica_heartbeat(authority: &Authority, me: &Me) -> Result<(), StoreError> {
    let now = crate::ground::clock::now_ms();
    let record = ReplicaRecord {
        id: me.id.clone(),
        addresses: me.addresses.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        started_ms: me.started_ms,
        heartbeat_ms: now,
        policy_hash: policy_hash(&authority.snapshot()),
    };
    authority
        .store()
        .heartbeat(&record, now.saturating_sub(millis(FORGET_AFTER)))
}

/// Every replica the store knows (`this` marks `me`).
pub fn replicas(authority: &Authority, me: Option<&str>) -> Result<Vec<ReplicaView>, StoreError> {
    let now = crate::ground::clock::now_ms();
    Ok(authority
        .store()
        .replicas()?
        .into_iter()
        .map(|r| ReplicaView {
            live: now.saturating_sub(r.heartbeat_ms) < millis(LIVE_WITHIN),
            this: me == Some(r.id.as_str()),
            id: r.id,
            addresses: r.addresses,
            version: r.version,
            started_at: r.started_ms,
            last_heartbeat: r.heartbeat_ms,
            policy_hash: r.policy_hash,
        })
        .collect())
}

/// Heartbeats and reconciles until `stop` resolves, then removes this
/// replica from the store.
pub async fn run(authority: Arc<Authority>, me: Me, stop: impl Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let mut changes = authority.store().changes();
    let mut reconcile = tokio::time::interval(RECONCILE_EVERY);
    let mut heartbeat = tokio::time::interval(HEARTBEAT_EVERY);
    reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let notified = async {
            match changes.as_mut() {
                Some(rx) => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut stop => break,
            _ = reconcile.tick() => reconcile_now(&authority).await,
            () = notified => reconcile_now(&authority).await,
            _ = heartbeat.tick() => {
                let me = me.clone();
                // It keeps the store's status fresh too; an outage is
                // logged once, by the store.
                if let Some(Err(e)) = authority.blocking(move |a| replica_heartbeat(a, &me)).await
                    && !e.is_unavailable()
                {
                    tracing::warn!(error = %e, "cannot record this replica's heartbeat");
                }
            }
        }
    }
    let id = me.id.clone();
    if let Some(Err(e)) = authority
        .blocking(move |a| a.store().remove_replica(&id))
        .await
    {
        tracing::warn!(error = %e, "cannot remove this replica from the store");
    }
}

async fn reconcile_now(authority: &Arc<Authority>) {
    if let Some(closed) = authority.blocking(trust::enroll::reconcile_sessions).await
        && closed > 0
    {
        tracing::info!(
            closed,
            "sessions closed: their standing changed in the store"
        );
    }
    // An outage is logged once, by the store; the drains read last stand.
    if let Some(Err(e)) = authority.blocking(access::drain::refresh_drains).await
        && !e.is_unavailable()
    {
        tracing::warn!(error = %e, "cannot read the drained connectors from the store");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::state::policy_state::one_segment as state;

    /// The hash is kept per policy version: the same state gives the same
    /// hash as computed afresh, and another policy another hash.
    #[test]
    fn the_policy_hash_is_kept_per_policy_version() {
        let (a, b) = (state(443), state(8443));
        let first = policy_hash(&a);
        assert_eq!(first.len(), 16);
        assert_eq!(policy_hash(&a), first);
        assert_eq!(policy_hash(&state(443)), first, "same policy, same hash");
        assert_ne!(policy_hash(&b), first, "another policy, another hash");
    }
}
