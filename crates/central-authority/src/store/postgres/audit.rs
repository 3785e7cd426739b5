//! The audit trail of admin actions (`admin_audit`).

use super::{PgStore, page, to_usize};
use crate::store::{AuditFilter, AuditRecord, StoreError};

impl PgStore {
    pub(crate) fn record_audit(&self, r: &AuditRecord) -> Result<(), StoreError> {
        self.block(async {
            let client = self.client().await?;
            client
                .execute(
                    "INSERT INTO admin_audit
                         (at_ms, actor_kind, actor, source, action, target, outcome, detail, provider, subject)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                    &[
                        &r.at_ms,
                        &r.actor_kind,
                        &r.actor,
                        &r.source,
                        &r.action,
                        &r.target,
                        &r.outcome,
                        &r.detail,
                        &r.provider,
                        &r.subject,
                    ],
                )
                .await?;
            Ok(())
        })
    }

    pub(crate) fn count_refusal(&self, source: &str, minute_ms: i64) -> Result<(), StoreError> {
        self.block(async {
            let client = self.client().await?;
            let n = client
                .execute(
                    "UPDATE admin_audit SET detail = 'refusals: ' || (substr(detail, 11)::BIGINT + 1)
                     WHERE at_ms = $1 AND action = 'token.refused' AND source = $2",
                    &[&minute_ms, &source],
                )
                .await?;
            if n == 0 {
                client
                    .execute(
                        "INSERT INTO admin_audit
                             (at_ms, actor_kind, actor, source, action, target, outcome, detail)
                         VALUES ($1, 'unknown', 'unknown token', $2, 'token.refused', '', 'refused', 'refusals: 1')",
                        &[&minute_ms, &source],
                    )
                    .await?;
            }
            Ok(())
        })
    }

    pub(crate) fn audit(
        &self,
        f: &AuditFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<AuditRecord>, u64), StoreError> {
        let (filter, values) = f.to_sql(|n| format!("${n}"));
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        self.block(async {
            let client = self.client().await?;
            page(
                &client,
                &format!("SELECT COUNT(*) FROM admin_audit{filter}"),
                &format!(
                    "SELECT at_ms, actor_kind, actor, source, action, target, outcome, detail, provider, subject
                     FROM admin_audit{filter} ORDER BY at_ms DESC, seq DESC LIMIT {limit} OFFSET {offset}"
                ),
                values,
                |r| AuditRecord {
                    at_ms: r.get(0),
                    actor_kind: r.get(1),
                    actor: r.get(2),
                    source: r.get(3),
                    action: r.get(4),
                    target: r.get(5),
                    outcome: r.get(6),
                    detail: r.get(7),
                    provider: r.get(8),
                    subject: r.get(9),
                },
            )
            .await
        })
    }

    pub(crate) fn prune_audit(&self, before_ms: i64) -> Result<usize, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let n = client
                .execute("DELETE FROM admin_audit WHERE at_ms < $1", &[&before_ms])
                .await?;
            Ok(to_usize(n))
        })
    }
}
