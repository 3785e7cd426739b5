//! The enrolled connectors (`connectors`): their standing, deletion and
//! re-enrollment, and the drained ones (`connector_drains`).

use std::collections::HashSet;

use rusqlite::{OptionalExtension, TransactionBehavior, params};

use super::SqliteStore;
use crate::ground::sync::lock;
use crate::store::{ConnectorRecord, DrainRecord, StoreError};

/// A `connector_drains` row (connector, since_ms, actor_kind, actor).
fn drain_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<DrainRecord> {
    Ok(DrainRecord {
        connector: r.get(0)?,
        since_ms: r.get(1)?,
        actor_kind: r.get(2)?,
        actor: r.get(3)?,
    })
}

impl SqliteStore {
    /// Disables or enables a connector; `false` if it is not enrolled.
    pub(crate) fn set_disabled(
        &self,
        name: &str,
        disabled: bool,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        let n = conn.execute(
            "UPDATE connectors SET disabled = ?2, changed_ms = ?3 WHERE name = ?1 AND deleted_ms IS NULL",
            params![name, disabled, now_ms],
        )?;
        Ok(n > 0)
    }

    /// Allows the next enrollment of `name` (a connector of the same group,
    /// with a valid certificate) until `until_ms`, once; `false` if it is
    /// not enrolled.
    pub(crate) fn allow_reenroll(
        &self,
        name: &str,
        until_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        let n = conn.execute(
            "UPDATE connectors SET reenroll_until_ms = ?2, changed_ms = ?3
             WHERE name = ?1 AND deleted_ms IS NULL",
            params![name, until_ms, now_ms],
        )?;
        Ok(n > 0)
    }

    /// Deletes an enrolled connector: revokes its certificates (they stay
    /// recorded, so they stay refused) and frees its name for any group.
    /// `None` if it is not enrolled, else how many certificates were revoked.
    pub(crate) fn delete_connector(
        &self,
        name: &str,
        now_ms: i64,
    ) -> Result<Option<usize>, StoreError> {
        let mut conn = lock(&self.conn);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = tx.execute(
            "UPDATE connectors SET deleted_ms = ?2, changed_ms = ?2, disabled = 0, reenroll_until_ms = NULL
             WHERE name = ?1 AND deleted_ms IS NULL",
            params![name, now_ms],
        )?;
        if n == 0 {
            return Ok(None);
        }
        let revoked = tx.execute(
            "UPDATE certificates SET revoked_ms = ?2, revoked_reason = 'connector deleted by an administrator'
             WHERE connector = ?1 AND revoked_ms IS NULL",
            params![name, now_ms],
        )?;
        tx.execute(
            "DELETE FROM connector_drains WHERE connector = ?1",
            params![name],
        )?;
        tx.commit()?;
        Ok(Some(revoked))
    }

    pub(crate) fn drain(&self, r: &DrainRecord) -> Result<DrainRecord, StoreError> {
        let mut conn = lock(&self.conn);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT INTO connector_drains (connector, since_ms, actor_kind, actor)
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (connector) DO NOTHING",
            params![r.connector, r.since_ms, r.actor_kind, r.actor],
        )?;
        let kept = tx.query_row(
            "SELECT connector, since_ms, actor_kind, actor FROM connector_drains
             WHERE connector = ?1",
            params![r.connector],
            drain_row,
        )?;
        tx.commit()?;
        Ok(kept)
    }

    pub(crate) fn undrain(&self, connector: &str) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        let n = conn.execute(
            "DELETE FROM connector_drains WHERE connector = ?1",
            params![connector],
        )?;
        Ok(n > 0)
    }

    pub(crate) fn drains(&self) -> Result<Vec<DrainRecord>, StoreError> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare_cached(
            "SELECT connector, since_ms, actor_kind, actor FROM connector_drains
             ORDER BY connector",
        )?;
        let rows = stmt
            .query_map([], drain_row)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// Whether connector `name` is disabled (`false` when it is not
    /// enrolled): one keyed lookup.
    pub(crate) fn is_disabled(&self, name: &str) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        Ok(conn
            .query_row(
                "SELECT disabled FROM connectors WHERE name = ?1",
                params![name],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(false))
    }

    pub(crate) fn disabled_connectors(&self) -> Result<HashSet<String>, StoreError> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare_cached("SELECT name FROM connectors WHERE disabled")?;
        let names = stmt
            .query_map([], |r| r.get::<_, String>(0))?
            .collect::<Result<HashSet<String>, _>>()?;
        Ok(names)
    }

    /// Every enrolled connector with its current certificate.
    pub(crate) fn connectors(&self) -> Result<Vec<ConnectorRecord>, StoreError> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare(
            "SELECT n.name, n.grp, n.disabled, n.enrolled_ms,
                    (SELECT serial FROM certificates c WHERE c.connector = n.name AND c.revoked_ms IS NULL ORDER BY issued_ms DESC LIMIT 1),
                    (SELECT not_after_ms FROM certificates c WHERE c.connector = n.name AND c.revoked_ms IS NULL ORDER BY issued_ms DESC LIMIT 1),
                    (SELECT root_sha256 FROM certificates c WHERE c.connector = n.name AND c.revoked_ms IS NULL ORDER BY issued_ms DESC LIMIT 1)
             FROM connectors n WHERE n.deleted_ms IS NULL ORDER BY n.name",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(ConnectorRecord {
                name: r.get(0)?,
                group: r.get(1)?,
                disabled: r.get(2)?,
                enrolled_ms: r.get(3)?,
                serial: r.get(4)?,
                not_after_ms: r.get(5)?,
                root_sha256: r.get(6)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}
