//! The CA replicas sharing the database (`replicas`) and their shared
//! secrets (`shared_secrets`).

use rusqlite::{TransactionBehavior, params};

use super::SqliteStore;
use crate::ground::sync::lock;
use crate::store::{ReplicaRecord, StoreError};

impl SqliteStore {
    /// Records replica `r`'s heartbeat (inserting it on its first) and
    /// forgets replicas silent for longer than `forget_before_ms`.
    pub(crate) fn heartbeat(
        &self,
        r: &ReplicaRecord,
        forget_before_ms: i64,
    ) -> Result<(), StoreError> {
        let mut conn = lock(&self.conn);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT INTO replicas (id, addresses, version, started_ms, heartbeat_ms, policy_hash)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (id) DO UPDATE SET addresses = ?2, version = ?3, started_ms = ?4,
                 heartbeat_ms = ?5, policy_hash = ?6",
            params![
                r.id,
                r.addresses.join(","),
                r.version,
                r.started_ms,
                r.heartbeat_ms,
                r.policy_hash
            ],
        )?;
        tx.execute(
            "DELETE FROM replicas WHERE heartbeat_ms < ?1",
            params![forget_before_ms],
        )?;
        tx.commit()?;
        Ok(())
    }

    pub(crate) fn remove_replica(&self, id: &str) -> Result<(), StoreError> {
        lock(&self.conn).execute("DELETE FROM replicas WHERE id = ?1", params![id])?;
        Ok(())
    }

    /// The shared secret `name`: `candidate` if none was stored yet (it is
    /// stored then), else the stored one.
    pub(crate) fn shared_secret(
        &self,
        name: &str,
        candidate: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        let mut conn = lock(&self.conn);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT INTO shared_secrets (name, value) VALUES (?1, ?2) ON CONFLICT (name) DO NOTHING",
            params![name, candidate],
        )?;
        let value: Vec<u8> = tx.query_row(
            "SELECT value FROM shared_secrets WHERE name = ?1",
            params![name],
            |r| r.get(0),
        )?;
        tx.commit()?;
        Ok(value)
    }

    /// Every replica the database knows, by id.
    pub(crate) fn replicas(&self) -> Result<Vec<ReplicaRecord>, StoreError> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare(
            "SELECT id, addresses, version, started_ms, heartbeat_ms, policy_hash
             FROM replicas ORDER BY id",
        )?;
        let rows = stmt.query_map([], |r| {
            let addresses: String = r.get(1)?;
            Ok(ReplicaRecord {
                id: r.get(0)?,
                addresses: crate::store::split_addresses(&addresses),
                version: r.get(2)?,
                started_ms: r.get(3)?,
                heartbeat_ms: r.get(4)?,
                policy_hash: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}
