//! The CA replicas sharing the database (`replicas`) and their shared
//! secrets (`shared_secrets`).

use super::PgStore;
use crate::store::{ReplicaRecord, StoreError};

impl PgStore {
    pub(crate) fn heartbeat(
        &self,
        r: &ReplicaRecord,
        forget_before_ms: i64,
    ) -> Result<(), StoreError> {
        let addresses = r.addresses.join(",");
        self.block(async {
            let client = self.client().await?;
            client
                .execute(
                    "INSERT INTO replicas (id, addresses, version, started_ms, heartbeat_ms, policy_hash)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (id) DO UPDATE SET addresses = $2, version = $3,
                         started_ms = $4, heartbeat_ms = $5, policy_hash = $6",
                    &[
                        &r.id,
                        &addresses,
                        &r.version,
                        &r.started_ms,
                        &r.heartbeat_ms,
                        &r.policy_hash,
                    ],
                )
                .await?;
            client
                .execute(
                    "DELETE FROM replicas WHERE heartbeat_ms < $1",
                    &[&forget_before_ms],
                )
                .await?;
            Ok(())
        })
    }

    pub(crate) fn remove_replica(&self, id: &str) -> Result<(), StoreError> {
        self.block(async {
            let client = self.client().await?;
            client
                .execute("DELETE FROM replicas WHERE id = $1", &[&id])
                .await?;
            Ok(())
        })
    }

    pub(crate) fn shared_secret(
        &self,
        name: &str,
        candidate: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            // One statement: concurrent first uses agree on one value.
            client
                .execute(
                    "INSERT INTO shared_secrets (name, value) VALUES ($1, $2)
                     ON CONFLICT (name) DO NOTHING",
                    &[&name, &candidate],
                )
                .await?;
            let row = client
                .query_one("SELECT value FROM shared_secrets WHERE name = $1", &[&name])
                .await?;
            Ok(row.get(0))
        })
    }

    pub(crate) fn replicas(&self) -> Result<Vec<ReplicaRecord>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT id, addresses, version, started_ms, heartbeat_ms, policy_hash
                     FROM replicas ORDER BY id",
                    &[],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| ReplicaRecord {
                    id: r.get(0),
                    addresses: crate::store::split_addresses(r.get(1)),
                    version: r.get(2),
                    started_ms: r.get(3),
                    heartbeat_ms: r.get(4),
                    policy_hash: r.get(5),
                })
                .collect())
        })
    }
}
