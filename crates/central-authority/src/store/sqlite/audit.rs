//! The audit trail of admin actions (`admin_audit`).

use rusqlite::params;

use super::{SqliteStore, page};
use crate::ground::sync::lock;
use crate::store::{AuditFilter, AuditRecord, StoreError};

impl SqliteStore {
    /// Appends one admin action to the audit trail.
    pub(crate) fn record_audit(&self, r: &AuditRecord) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        conn.execute(
            "INSERT INTO admin_audit (at_ms, actor_kind, actor, source, action, target, outcome, detail, provider, subject)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                r.at_ms,
                r.actor_kind,
                r.actor,
                r.source,
                r.action,
                r.target,
                r.outcome,
                r.detail,
                r.provider,
                r.subject
            ],
        )?;
        Ok(())
    }

    /// One page of the audit trail matching `f`, newest first (the later
    /// of one millisecond first), and how many match in all.
    pub(crate) fn audit(
        &self,
        f: &AuditFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<AuditRecord>, u64), StoreError> {
        let (filter, values) = f.to_sql(|n| format!("?{n}"));
        page(
            &lock(&self.conn),
            &format!("SELECT COUNT(*) FROM admin_audit{filter}"),
            &format!(
                "SELECT at_ms, actor_kind, actor, source, action, target, outcome, detail, provider, subject
                 FROM admin_audit{filter} ORDER BY at_ms DESC, rowid DESC LIMIT {limit} OFFSET {offset}"
            ),
            values,
            |r| {
                Ok(AuditRecord {
                    at_ms: r.get(0)?,
                    actor_kind: r.get(1)?,
                    actor: r.get(2)?,
                    source: r.get(3)?,
                    action: r.get(4)?,
                    target: r.get(5)?,
                    outcome: r.get(6)?,
                    detail: r.get(7)?,
                    provider: r.get(8)?,
                    subject: r.get(9)?,
                })
            },
        )
    }

    /// One more refusal of an unknown token from `source` in the minute
    /// `minute_ms` (`Store::count_refusal`).
    pub(crate) fn count_refusal(&self, source: &str, minute_ms: i64) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        let n = conn.execute(
            "UPDATE admin_audit SET detail = 'refusals: ' || (CAST(substr(detail, 11) AS INTEGER) + 1)
             WHERE at_ms = ?1 AND action = 'token.refused' AND source = ?2",
            params![minute_ms, source],
        )?;
        if n == 0 {
            conn.execute(
                "INSERT INTO admin_audit (at_ms, actor_kind, actor, source, action, target, outcome, detail)
                 VALUES (?1, 'unknown', 'unknown token', ?2, 'token.refused', '', 'refused', 'refusals: 1')",
                params![minute_ms, source],
            )?;
        }
        Ok(())
    }

    /// Deletes the audit trail from before `before_ms`; returns how many
    /// went.
    pub(crate) fn prune_audit(&self, before_ms: i64) -> Result<usize, StoreError> {
        let conn = lock(&self.conn);
        Ok(conn.execute(
            "DELETE FROM admin_audit WHERE at_ms < ?1",
            params![before_ms],
        )?)
    }
}
