//! Enrollment and what it records: the certificates (`certificates`),
//! renewed ones' grace (`certificate_grace`) and the provisioning keys'
//! uses and revocations (`provisioning_keys`).

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::SqliteStore;
use crate::ground::sync::lock;
use crate::store::rules::{self, KeyRow, NameClaim, NameRow};
use crate::store::{
    CertHistory, CertRecord, EnrollRefusal, KeyUsage, NewCertificate, RenewRefusal, Renewal,
    StoreError,
};

/// The record of certificate `serial` (with its connector's standing), if
/// the CA issued it: one query for session checks and renewals alike.
fn cert_record(conn: &Connection, serial: &str) -> rusqlite::Result<Option<CertRecord>> {
    conn.query_row(
        "SELECT c.connector, c.grp, c.not_after_ms, c.revoked_ms, c.revoked_reason, n.disabled,
                c.fingerprint
         FROM certificates c JOIN connectors n ON n.name = c.connector WHERE c.serial = ?1",
        params![serial],
        |r| {
            let revoked_ms: Option<i64> = r.get(3)?;
            let reason: Option<String> = r.get(4)?;
            Ok(CertRecord {
                connector: r.get(0)?,
                group: r.get(1)?,
                not_after_ms: r.get(2)?,
                revoked: revoked_ms.map(|t| (t, reason.unwrap_or_default())),
                disabled: r.get(5)?,
                fingerprint: r.get(6)?,
            })
        },
    )
    .optional()
}

/// The rows the rules of enrollment read (`rules::decide`): `c`'s
/// provisioning key and the connector row of its name.
fn enrollment_rows(
    tx: &rusqlite::Transaction<'_>,
    c: &NewCertificate<'_>,
) -> rusqlite::Result<(Option<KeyRow>, Option<NameRow>)> {
    let key = tx
        .query_row(
            "SELECT uses, revoked_ms FROM provisioning_keys WHERE grp = ?1 AND key_sha256 = ?2",
            params![c.group, c.key_sha256],
            |r| {
                Ok(KeyRow {
                    uses: r.get(0)?,
                    revoked: r.get::<_, Option<i64>>(1)?.is_some(),
                })
            },
        )
        .optional()?;
    let existing = tx
        .query_row(
            "SELECT grp, disabled, reenroll_until_ms, deleted_ms,
                    (SELECT COUNT(*) FROM certificates
                     WHERE connector = ?1 AND revoked_ms IS NULL AND not_after_ms > ?2)
             FROM connectors WHERE name = ?1",
            params![c.name, c.now_ms],
            |r| {
                Ok(NameRow {
                    group: r.get(0)?,
                    disabled: r.get(1)?,
                    reenroll_until_ms: r.get(2)?,
                    deleted: r.get::<_, Option<i64>>(3)?.is_some(),
                    valid_certificate: r.get::<_, i64>(4)? > 0,
                })
            },
        )
        .optional()?;
    Ok((key, existing))
}

/// Writes what `claim` does to the row of `c`'s name.
fn claim_name(
    tx: &rusqlite::Transaction<'_>,
    c: &NewCertificate<'_>,
    claim: NameClaim,
) -> rusqlite::Result<()> {
    match claim {
        // `enrolled_ms` is the name's latest enrollment: an operator looks
        // for enrollments since a provisioning key leaked.
        NameClaim::Keep => {
            tx.execute(
                "UPDATE connectors SET enrolled_ms = ?2 WHERE name = ?1",
                params![c.name, c.now_ms],
            )?;
        }
        NameClaim::Insert => {
            tx.execute(
                "INSERT INTO connectors (name, grp, disabled, enrolled_ms, changed_ms) VALUES (?1, ?2, 0, ?3, ?3)",
                params![c.name, c.group, c.now_ms],
            )?;
        }
        NameClaim::ReuseDeleted => {
            tx.execute(
                "UPDATE connectors SET grp = ?2, disabled = 0, enrolled_ms = ?3, changed_ms = ?3,
                 reenroll_until_ms = NULL, deleted_ms = NULL WHERE name = ?1",
                params![c.name, c.group, c.now_ms],
            )?;
        }
        NameClaim::UseLeave => {
            tx.execute(
                "UPDATE connectors SET reenroll_until_ms = NULL, enrolled_ms = ?2, changed_ms = ?2 WHERE name = ?1",
                params![c.name, c.now_ms],
            )?;
        }
    }
    Ok(())
}

/// Counts the key's use and records `c`'s certificate, superseding the
/// connector's earlier ones.
fn record_enrollment(
    tx: &rusqlite::Transaction<'_>,
    c: &NewCertificate<'_>,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO provisioning_keys (grp, key_sha256, uses, last_used_ms) VALUES (?1, ?2, 1, ?3)
         ON CONFLICT (grp, key_sha256) DO UPDATE SET uses = uses + 1, last_used_ms = ?3",
        params![c.group, c.key_sha256, c.now_ms],
    )?;
    tx.execute(
        "UPDATE certificates SET revoked_ms = ?2, revoked_reason = 'superseded by a new enrollment'
         WHERE connector = ?1 AND revoked_ms IS NULL",
        params![c.name, c.now_ms],
    )?;
    tx.execute(
        "INSERT INTO certificates (serial, connector, grp, fingerprint, issued_ms, not_after_ms, root_sha256)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            c.serial,
            c.name,
            c.group,
            c.fingerprint,
            c.now_ms,
            c.not_after_ms,
            c.root_sha256
        ],
    )?;
    Ok(())
}

impl SqliteStore {
    /// Records an enrollment if the key has uses left and is not revoked,
    /// and the connector is not disabled or of another group; supersedes
    /// the connector's earlier certificates. All or nothing.
    pub(crate) fn enroll(
        &self,
        c: &NewCertificate<'_>,
    ) -> Result<Result<(), EnrollRefusal>, StoreError> {
        let mut conn = lock(&self.conn);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let (key, existing) = enrollment_rows(&tx, c)?;
        let claim = match rules::decide(c.name, c.group, c.max_uses, c.now_ms, key, existing) {
            Ok(claim) => claim,
            Err(refused) => return Ok(Err(refused)),
        };
        claim_name(&tx, c, claim)?;
        record_enrollment(&tx, c)?;
        tx.commit()?;
        Ok(Ok(()))
    }

    /// The record of certificate `serial`, if the CA issued it.
    pub(crate) fn certificate(&self, serial: &str) -> Result<Option<CertRecord>, StoreError> {
        Ok(cert_record(&lock(&self.conn), serial)?)
    }

    /// Revokes every unrevoked certificate of a connector; returns how
    /// many, `None` if it is not enrolled.
    pub(crate) fn revoke_certificates(
        &self,
        name: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<Option<usize>, StoreError> {
        let mut conn = lock(&self.conn);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let enrolled = tx
            .query_row(
                "SELECT 1 FROM connectors WHERE name = ?1 AND deleted_ms IS NULL",
                params![name],
                |_| Ok(()),
            )
            .optional()?;
        if enrolled.is_none() {
            return Ok(None);
        }
        let n = tx.execute(
            "UPDATE certificates SET revoked_ms = ?2, revoked_reason = ?3
             WHERE connector = ?1 AND revoked_ms IS NULL",
            params![name, now_ms, reason],
        )?;
        tx.commit()?;
        Ok(Some(n))
    }

    /// Revokes a provisioning key (by fingerprint) of a group.
    pub(crate) fn revoke_key(
        &self,
        group: &str,
        key_sha256: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        conn.execute(
            "INSERT INTO provisioning_keys (grp, key_sha256, uses, revoked_ms) VALUES (?1, ?2, 0, ?3)
             ON CONFLICT (grp, key_sha256) DO UPDATE SET revoked_ms = COALESCE(revoked_ms, ?3)",
            params![group, key_sha256, now_ms],
        )?;
        Ok(())
    }

    /// Use count and revocation of a key.
    pub(crate) fn key_revoked(&self, group: &str, key_sha256: &str) -> Result<bool, StoreError> {
        Ok(self.key_usage(group, key_sha256)?.revoked_ms.is_some())
    }

    pub(crate) fn key_usage(&self, group: &str, key_sha256: &str) -> Result<KeyUsage, StoreError> {
        let conn = lock(&self.conn);
        Ok(conn
            .query_row(
                "SELECT uses, revoked_ms, last_used_ms FROM provisioning_keys WHERE grp = ?1 AND key_sha256 = ?2",
                params![group, key_sha256],
                |r| {
                    Ok(KeyUsage {
                        uses: r.get(0)?,
                        revoked_ms: r.get(1)?,
                        last_used_ms: r.get(2)?,
                    })
                },
            )
            .optional()?
            .unwrap_or_default())
    }

    /// Records a renewal: checks, in one transaction, that `old_serial` was
    /// issued to `name` of `group`, is neither revoked nor expired and that
    /// the connector is not disabled; records the new certificate and puts
    /// every other unrevoked certificate of the connector in grace until
    /// `revoke_old_at_ms` (an earlier grace is kept, never extended).
    pub(crate) fn renew(&self, r: &Renewal<'_>) -> Result<Result<(), RenewRefusal>, StoreError> {
        let mut conn = lock(&self.conn);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let old = cert_record(&tx, r.old_serial)?;
        if let Err(refused) = crate::store::renewable(old, r.name, r.group, r.old_serial, r.now_ms)
        {
            return Ok(Err(refused));
        }
        tx.execute(
            "INSERT OR IGNORE INTO certificate_grace (serial, connector, superseded_ms, revoke_at_ms)
             SELECT serial, connector, ?2, ?3 FROM certificates
             WHERE connector = ?1 AND revoked_ms IS NULL",
            params![r.name, r.now_ms, r.revoke_old_at_ms],
        )?;
        tx.execute(
            "INSERT INTO certificates (serial, connector, grp, fingerprint, issued_ms, not_after_ms, root_sha256)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                r.serial,
                r.name,
                r.group,
                r.fingerprint,
                r.now_ms,
                r.not_after_ms,
                r.root_sha256
            ],
        )?;
        tx.commit()?;
        Ok(Ok(()))
    }

    /// Whether the certificate `serial` could renew now (a read only).
    pub(crate) fn renewable(
        &self,
        name: &str,
        group: &str,
        serial: &str,
        now_ms: i64,
    ) -> Result<Result<(), RenewRefusal>, StoreError> {
        let old = cert_record(&lock(&self.conn), serial)?;
        Ok(crate::store::renewable(old, name, group, serial, now_ms))
    }

    /// Revokes every superseded certificate whose grace has passed; returns
    /// (connector, serial) of each one revoked now.
    pub(crate) fn revoke_after_grace(
        &self,
        now_ms: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut conn = lock(&self.conn);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let due: Vec<(String, String)> = {
            let mut stmt = tx.prepare(
                "SELECT g.connector, g.serial FROM certificate_grace g
                 JOIN certificates c ON c.serial = g.serial
                 WHERE g.revoke_at_ms <= ?1 AND c.revoked_ms IS NULL",
            )?;
            let rows = stmt.query_map(params![now_ms], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<Result<Vec<_>, _>>()?
        };
        for (_, serial) in &due {
            tx.execute(
                "UPDATE certificates SET revoked_ms = ?2, revoked_reason = 'superseded by a renewal'
                 WHERE serial = ?1 AND revoked_ms IS NULL",
                params![serial, now_ms],
            )?;
        }
        tx.commit()?;
        Ok(due)
    }

    /// Every connector's certificates, newest first, at most `per_connector`
    /// each.
    pub(crate) fn certificate_history(
        &self,
        per_connector: usize,
    ) -> Result<std::collections::HashMap<String, Vec<CertHistory>>, StoreError> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare(
            "SELECT c.connector, c.serial, c.issued_ms, c.not_after_ms, c.revoked_ms, g.revoke_at_ms
             FROM certificates c LEFT JOIN certificate_grace g ON g.serial = c.serial
             ORDER BY c.connector, c.issued_ms DESC, c.rowid DESC",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                CertHistory {
                    serial: r.get(1)?,
                    issued_ms: r.get(2)?,
                    not_after_ms: r.get(3)?,
                    revoked_ms: r.get(4)?,
                    grace_until_ms: r.get(5)?,
                },
            ))
        })?;
        let mut out: std::collections::HashMap<String, Vec<CertHistory>> = Default::default();
        for row in rows {
            let (connector, h) = row?;
            let list = out.entry(connector).or_default();
            if list.len() < per_connector {
                list.push(h);
            }
        }
        Ok(out)
    }

    /// The records of those of `serials` the CA issued (the reconcile's
    /// one look at every live session).
    pub(crate) fn certificates(
        &self,
        serials: &[String],
    ) -> Result<std::collections::HashMap<String, CertRecord>, StoreError> {
        // In chunks of at most 500 parameters (SQLite's limit is 32,766):
        // one statement per chunk instead of one per session.
        let conn = lock(&self.conn);
        let mut out = std::collections::HashMap::new();
        for chunk in serials.chunks(500) {
            let marks = vec!["?"; chunk.len()].join(",");
            let mut stmt = conn.prepare(&format!(
                "SELECT c.connector, c.grp, c.not_after_ms, c.revoked_ms, c.revoked_reason,
                        n.disabled, c.fingerprint, c.serial
                 FROM certificates c JOIN connectors n ON n.name = c.connector
                 WHERE c.serial IN ({marks})"
            ))?;
            let rows = stmt.query_map(rusqlite::params_from_iter(chunk), |r| {
                let revoked_ms: Option<i64> = r.get(3)?;
                let reason: Option<String> = r.get(4)?;
                Ok((
                    r.get::<_, String>(7)?,
                    CertRecord {
                        connector: r.get(0)?,
                        group: r.get(1)?,
                        not_after_ms: r.get(2)?,
                        revoked: revoked_ms.map(|t| (t, reason.unwrap_or_default())),
                        disabled: r.get(5)?,
                        fingerprint: r.get(6)?,
                    },
                ))
            })?;
            for row in rows {
                let (serial, record) = row?;
                out.insert(serial, record);
            }
        }
        Ok(out)
    }
}
