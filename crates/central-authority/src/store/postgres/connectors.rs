//! The enrolled connectors (`connectors`): their standing, deletion and
//! re-enrollment, and the drained ones (`connector_drains`).

use super::{PgStore, notify, serializable, to_usize};
use crate::store::{ConnectorRecord, DrainRecord, StoreError};
use std::collections::HashSet;
use std::time::Instant;
use tokio_postgres::Row;

/// A `connector_drains` row (connector, since_ms, actor_kind, actor).
fn drain_from_row(r: &Row) -> DrainRecord {
    DrainRecord {
        connector: r.get(0),
        since_ms: r.get(1),
        actor_kind: r.get(2),
        actor: r.get(3),
    }
}

impl PgStore {
    pub(crate) fn set_disabled(
        &self,
        name: &str,
        disabled: bool,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.block(async {
            serializable!(self, |tx| {
                let n = tx
                    .execute(
                        "UPDATE connectors SET disabled = $2, changed_ms = $3
                         WHERE name = $1 AND deleted_ms IS NULL",
                        &[&name, &disabled, &now_ms],
                    )
                    .await?;
                // Enabling ends no session, but is announced too: the
                // other replicas' standing readings must not keep the
                // connector disabled.
                if n > 0 {
                    notify(tx, name).await?;
                }
                Ok(n > 0)
            })
        })
    }

    pub(crate) fn allow_reenroll(
        &self,
        name: &str,
        until_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.block(async {
            serializable!(self, |tx| {
                let n = tx
                    .execute(
                        "UPDATE connectors SET reenroll_until_ms = $2, changed_ms = $3
                         WHERE name = $1 AND deleted_ms IS NULL",
                        &[&name, &until_ms, &now_ms],
                    )
                    .await?;
                Ok(n > 0)
            })
        })
    }

    pub(crate) fn delete_connector(
        &self,
        name: &str,
        now_ms: i64,
    ) -> Result<Option<usize>, StoreError> {
        self.block(async {
            serializable!(self, |tx| {
                let n = tx
                    .execute(
                        "UPDATE connectors SET deleted_ms = $2, changed_ms = $2, disabled = FALSE,
                             reenroll_until_ms = NULL
                         WHERE name = $1 AND deleted_ms IS NULL",
                        &[&name, &now_ms],
                    )
                    .await?;
                if n == 0 {
                    return Ok(None);
                }
                let revoked = tx
                    .execute(
                        "UPDATE certificates SET revoked_ms = $2,
                             revoked_reason = 'connector deleted by an administrator'
                         WHERE connector = $1 AND revoked_ms IS NULL",
                        &[&name, &now_ms],
                    )
                    .await?;
                tx.execute(
                    "DELETE FROM connector_drains WHERE connector = $1",
                    &[&name],
                )
                .await?;
                notify(tx, name).await?;
                Ok(Some(to_usize(revoked)))
            })
        })
    }

    pub(crate) fn drain(&self, r: &DrainRecord) -> Result<DrainRecord, StoreError> {
        self.block(async {
            serializable!(self, |tx| {
                let inserted = tx
                    .execute(
                        "INSERT INTO connector_drains (connector, since_ms, actor_kind, actor)
                         VALUES ($1, $2, $3, $4) ON CONFLICT (connector) DO NOTHING",
                        &[&r.connector, &r.since_ms, &r.actor_kind, &r.actor],
                    )
                    .await?;
                let kept = tx
                    .query_one(
                        "SELECT connector, since_ms, actor_kind, actor FROM connector_drains
                         WHERE connector = $1",
                        &[&r.connector],
                    )
                    .await?;
                if inserted > 0 {
                    notify(tx, &r.connector).await?;
                }
                Ok(drain_from_row(&kept))
            })
        })
    }

    pub(crate) fn undrain(&self, connector: &str) -> Result<bool, StoreError> {
        self.block(async {
            serializable!(self, |tx| {
                let n = tx
                    .execute(
                        "DELETE FROM connector_drains WHERE connector = $1",
                        &[&connector],
                    )
                    .await?;
                if n > 0 {
                    notify(tx, connector).await?;
                }
                Ok(n > 0)
            })
        })
    }

    pub(crate) fn drains(&self) -> Result<Vec<DrainRecord>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT connector, since_ms, actor_kind, actor FROM connector_drains
                     ORDER BY connector",
                    &[],
                )
                .await?;
            Ok(rows.iter().map(drain_from_row).collect())
        })
    }

    /// Whether `name` is disabled: reads every disabled connector (few)
    /// and remembers them for the admissions after it (`known_disabled`).
    pub(crate) fn is_disabled(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.disabled_connectors()?.contains(name))
    }

    /// Every disabled connector, remembered for admissions
    /// (`known_disabled`; the reconcile reads this every second).
    pub(crate) fn disabled_connectors(&self) -> Result<HashSet<String>, StoreError> {
        let (at, read) = (self.announced(), Instant::now());
        let disabled: HashSet<String> = self.block(async {
            let client = self.client().await?;
            let rows = client
                .query("SELECT name FROM connectors WHERE disabled", &[])
                .await?;
            Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
        })?;
        self.remember(at, |s| s.disabled = Some((read, disabled.clone())));
        Ok(disabled)
    }

    pub(crate) fn connectors(&self) -> Result<Vec<ConnectorRecord>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT n.name, n.grp, n.disabled, n.enrolled_ms, cur.serial, cur.not_after_ms,
                            cur.root_sha256
                     FROM connectors n
                     LEFT JOIN LATERAL (
                         SELECT serial, not_after_ms, root_sha256 FROM certificates c
                         WHERE c.connector = n.name AND c.revoked_ms IS NULL
                         ORDER BY issued_ms DESC, seq DESC LIMIT 1
                     ) cur ON TRUE
                     WHERE n.deleted_ms IS NULL ORDER BY n.name",
                    &[],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| ConnectorRecord {
                    name: r.get(0),
                    group: r.get(1),
                    disabled: r.get(2),
                    enrolled_ms: r.get(3),
                    serial: r.get(4),
                    not_after_ms: r.get(5),
                    root_sha256: r.get(6),
                })
                .collect())
        })
    }
}
