//! Enrollment and what it records: the certificates (`certificates`),
//! renewed ones' grace (`certificate_grace`) and the provisioning keys'
//! uses and revocations (`provisioning_keys`).

use super::{PgStore, notify, serializable, to_u32, to_usize};
use crate::store::rules::{self, KeyRow, NameClaim, NameRow};
use crate::store::{
    CertHistory, CertRecord, EnrollRefusal, KeyUsage, NewCertificate, RenewRefusal, Renewal,
    StoreError,
};
use std::collections::HashMap;
use std::time::Instant;
use tokio_postgres::{Row, Transaction};

/// The record of certificate `serial` (with its connector's standing).
async fn cert_record(tx: &Transaction<'_>, serial: &str) -> Result<Option<CertRecord>, StoreError> {
    let row = tx
        .query_opt(
            "SELECT c.connector, c.grp, c.not_after_ms, c.revoked_ms, c.revoked_reason,
                    n.disabled, c.fingerprint
             FROM certificates c JOIN connectors n ON n.name = c.connector WHERE c.serial = $1",
            &[&serial],
        )
        .await?;
    Ok(row.map(|r| cert_from_row(&r)))
}

fn cert_from_row(r: &Row) -> CertRecord {
    let revoked_ms: Option<i64> = r.get(3);
    let reason: Option<String> = r.get(4);
    CertRecord {
        connector: r.get(0),
        group: r.get(1),
        not_after_ms: r.get(2),
        revoked: revoked_ms.map(|t| (t, reason.unwrap_or_default())),
        disabled: r.get(5),
        fingerprint: r.get(6),
    }
}

/// The enrollment transaction's body (see `Store::enroll`).
async fn enroll(
    tx: &Transaction<'_>,
    c: &NewCertificate<'_>,
) -> Result<Result<(), EnrollRefusal>, StoreError> {
    let (name, group, key) = (c.name.to_owned(), c.group.to_owned(), c.key_sha256);
    let (serial, fingerprint, root) = (c.serial, c.fingerprint, c.root_sha256);
    let (now_ms, not_after_ms) = (c.now_ms, c.not_after_ms);
    let (key_row, existing) = enrollment_rows(tx, c).await?;
    let claim = match rules::decide(c.name, c.group, c.max_uses, now_ms, key_row, existing) {
        Ok(claim) => claim,
        Err(refused) => return Ok(Err(refused)),
    };
    claim_name(tx, c, claim).await?;
    tx.execute(
        "INSERT INTO provisioning_keys (grp, key_sha256, uses, last_used_ms) VALUES ($1, $2, 1, $3)
             ON CONFLICT (grp, key_sha256)
             DO UPDATE SET uses = provisioning_keys.uses + 1, last_used_ms = $3",
        &[&group, &key, &now_ms],
    )
    .await?;
    let superseded = tx
        .execute(
            "UPDATE certificates SET revoked_ms = $2,
                     revoked_reason = 'superseded by a new enrollment'
                 WHERE connector = $1 AND revoked_ms IS NULL",
            &[&name, &now_ms],
        )
        .await?;
    tx.execute(
        "INSERT INTO certificates (serial, connector, grp, fingerprint, issued_ms, not_after_ms, root_sha256)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[&serial, &name, &group, &fingerprint, &now_ms, &not_after_ms, &root],
    )
    .await?;
    if superseded > 0 {
        notify(tx, &name).await?;
    }
    Ok(Ok(()))
}

/// The rows the rules of enrollment read (`rules::decide`): `c`'s
/// provisioning key and the connector row of its name.
async fn enrollment_rows(
    tx: &Transaction<'_>,
    c: &NewCertificate<'_>,
) -> Result<(Option<KeyRow>, Option<NameRow>), StoreError> {
    let key = tx
        .query_opt(
            "SELECT uses, revoked_ms FROM provisioning_keys WHERE grp = $1 AND key_sha256 = $2",
            &[&c.group, &c.key_sha256],
        )
        .await?
        .map(|r| KeyRow {
            uses: to_u32(r.get(0)),
            revoked: r.get::<_, Option<i64>>(1).is_some(),
        });
    let existing = tx
        .query_opt(
            "SELECT grp, disabled, reenroll_until_ms, deleted_ms,
                    (SELECT COUNT(*) FROM certificates
                     WHERE connector = $1 AND revoked_ms IS NULL AND not_after_ms > $2)
             FROM connectors WHERE name = $1",
            &[&c.name, &c.now_ms],
        )
        .await?
        .map(|r| NameRow {
            group: r.get(0),
            disabled: r.get(1),
            reenroll_until_ms: r.get(2),
            deleted: r.get::<_, Option<i64>>(3).is_some(),
            valid_certificate: r.get::<_, i64>(4) > 0,
        });
    Ok((key, existing))
}

/// Writes what `claim` does to the row of `c`'s name.
async fn claim_name(
    tx: &Transaction<'_>,
    c: &NewCertificate<'_>,
    claim: NameClaim,
) -> Result<(), StoreError> {
    let (name, group, now_ms) = (c.name, c.group, c.now_ms);
    match claim {
        // `enrolled_ms` is the name's latest enrollment: an operator looks
        // for enrollments since a provisioning key leaked.
        NameClaim::Keep => {
            tx.execute(
                "UPDATE connectors SET enrolled_ms = $2 WHERE name = $1",
                &[&name, &now_ms],
            )
            .await?;
        }
        NameClaim::Insert => {
            tx.execute(
                "INSERT INTO connectors (name, grp, disabled, enrolled_ms, changed_ms)
                     VALUES ($1, $2, FALSE, $3, $3)",
                &[&name, &group, &now_ms],
            )
            .await?;
        }
        NameClaim::ReuseDeleted => {
            tx.execute(
                "UPDATE connectors SET grp = $2, disabled = FALSE, enrolled_ms = $3,
                         changed_ms = $3, reenroll_until_ms = NULL, deleted_ms = NULL
                     WHERE name = $1",
                &[&name, &group, &now_ms],
            )
            .await?;
        }
        NameClaim::UseLeave => {
            tx.execute(
                "UPDATE connectors SET reenroll_until_ms = NULL, enrolled_ms = $2, changed_ms = $2
                     WHERE name = $1",
                &[&name, &now_ms],
            )
            .await?;
        }
    }
    Ok(())
}

/// The renewal transaction's body (see `Store::renew`).
async fn renew(
    tx: &Transaction<'_>,
    r: &Renewal<'_>,
) -> Result<Result<(), RenewRefusal>, StoreError> {
    let (name, group, old_serial) = (
        r.name.to_owned(),
        r.group.to_owned(),
        r.old_serial.to_owned(),
    );
    let (serial, fingerprint, root) = (r.serial, r.fingerprint, r.root_sha256);
    let (now_ms, not_after_ms, revoke_old_at_ms) = (r.now_ms, r.not_after_ms, r.revoke_old_at_ms);
    let old = cert_record(tx, &old_serial).await?;
    if let Err(refused) = crate::store::renewable(old, &name, &group, &old_serial, now_ms) {
        return Ok(Err(refused));
    }
    tx.execute(
        "INSERT INTO certificate_grace (serial, connector, superseded_ms, revoke_at_ms)
             SELECT serial, connector, $2, $3 FROM certificates
             WHERE connector = $1 AND revoked_ms IS NULL
             ON CONFLICT (serial) DO NOTHING",
        &[&name, &now_ms, &revoke_old_at_ms],
    )
    .await?;
    tx.execute(
        "INSERT INTO certificates (serial, connector, grp, fingerprint, issued_ms, not_after_ms, root_sha256)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[&serial, &name, &group, &fingerprint, &now_ms, &not_after_ms, &root],
    )
    .await?;
    Ok(Ok(()))
}

impl PgStore {
    pub(crate) fn enroll(
        &self,
        c: &NewCertificate<'_>,
    ) -> Result<Result<(), EnrollRefusal>, StoreError> {
        self.block(async { serializable!(self, |tx| { enroll(tx, c).await }) })
    }

    pub(crate) fn certificate(&self, serial: &str) -> Result<Option<CertRecord>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT c.connector, c.grp, c.not_after_ms, c.revoked_ms, c.revoked_reason,
                            n.disabled, c.fingerprint
                     FROM certificates c JOIN connectors n ON n.name = c.connector
                     WHERE c.serial = $1",
                    &[&serial],
                )
                .await?;
            Ok(row.map(|r| cert_from_row(&r)))
        })
    }

    pub(crate) fn certificates(
        &self,
        serials: &[String],
    ) -> Result<HashMap<String, CertRecord>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT c.connector, c.grp, c.not_after_ms, c.revoked_ms, c.revoked_reason,
                            n.disabled, c.fingerprint, c.serial
                     FROM certificates c JOIN connectors n ON n.name = c.connector
                     WHERE c.serial = ANY($1)",
                    &[&serials],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| (r.get::<_, String>(7), cert_from_row(r)))
                .collect())
        })
    }

    pub(crate) fn revoke_certificates(
        &self,
        name: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<Option<usize>, StoreError> {
        self.block(async {
            serializable!(self, |tx| {
                let enrolled = tx
                    .query_opt(
                        "SELECT 1 FROM connectors WHERE name = $1 AND deleted_ms IS NULL",
                        &[&name],
                    )
                    .await?;
                if enrolled.is_none() {
                    return Ok(None);
                }
                let n = tx
                    .execute(
                        "UPDATE certificates SET revoked_ms = $2, revoked_reason = $3
                         WHERE connector = $1 AND revoked_ms IS NULL",
                        &[&name, &now_ms, &reason],
                    )
                    .await?;
                if n > 0 {
                    notify(tx, name).await?;
                }
                Ok(Some(to_usize(n)))
            })
        })
    }

    pub(crate) fn revoke_key(
        &self,
        group: &str,
        key_sha256: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.block(async {
            serializable!(self, |tx| {
                tx.execute(
                    "INSERT INTO provisioning_keys (grp, key_sha256, uses, revoked_ms)
                     VALUES ($1, $2, 0, $3)
                     ON CONFLICT (grp, key_sha256) DO UPDATE
                     SET revoked_ms = COALESCE(provisioning_keys.revoked_ms, $3)",
                    &[&group, &key_sha256, &now_ms],
                )
                .await?;
                notify(tx, "").await?;
                Ok(())
            })
        })
    }

    pub(crate) fn key_usage(&self, group: &str, key_sha256: &str) -> Result<KeyUsage, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT uses, revoked_ms, last_used_ms FROM provisioning_keys
                     WHERE grp = $1 AND key_sha256 = $2",
                    &[&group, &key_sha256],
                )
                .await?;
            Ok(row.map_or_else(KeyUsage::default, |r| KeyUsage {
                uses: to_u32(r.get(0)),
                revoked_ms: r.get(1),
                last_used_ms: r.get(2),
            }))
        })
    }

    /// Whether `group`'s key `key_sha256` is revoked, remembered for the
    /// admissions after it (`known_revoked`).
    pub(crate) fn key_revoked(&self, group: &str, key_sha256: &str) -> Result<bool, StoreError> {
        let (at, read) = (self.announced(), Instant::now());
        let revoked = self.key_usage(group, key_sha256)?.revoked_ms.is_some();
        self.remember(at, |s| {
            s.revoked
                .entry(group.to_owned())
                .or_default()
                .insert(key_sha256.to_owned(), (read, revoked));
        });
        Ok(revoked)
    }

    pub(crate) fn renew(&self, r: &Renewal<'_>) -> Result<Result<(), RenewRefusal>, StoreError> {
        self.block(async { serializable!(self, |tx| { renew(tx, r).await }) })
    }

    pub(crate) fn renewable(
        &self,
        name: &str,
        group: &str,
        serial: &str,
        now_ms: i64,
    ) -> Result<Result<(), RenewRefusal>, StoreError> {
        let old = self.certificate(serial)?;
        Ok(crate::store::renewable(old, name, group, serial, now_ms))
    }

    pub(crate) fn revoke_after_grace(
        &self,
        now_ms: i64,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.block(async {
            serializable!(self, |tx| {
                let rows = tx
                    .query(
                        "UPDATE certificates c SET revoked_ms = $1,
                             revoked_reason = 'superseded by a renewal'
                         FROM certificate_grace g
                         WHERE g.serial = c.serial AND g.revoke_at_ms <= $1
                             AND c.revoked_ms IS NULL
                         RETURNING c.connector, c.serial",
                        &[&now_ms],
                    )
                    .await?;
                let due: Vec<(String, String)> =
                    rows.iter().map(|r| (r.get(0), r.get(1))).collect();
                for (connector, _) in &due {
                    notify(tx, connector).await?;
                }
                Ok(due)
            })
        })
    }

    pub(crate) fn certificate_history(
        &self,
        per_connector: usize,
    ) -> Result<HashMap<String, Vec<CertHistory>>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT c.connector, c.serial, c.issued_ms, c.not_after_ms, c.revoked_ms,
                            g.revoke_at_ms
                     FROM certificates c LEFT JOIN certificate_grace g ON g.serial = c.serial
                     ORDER BY c.connector, c.issued_ms DESC, c.seq DESC",
                    &[],
                )
                .await?;
            let mut out: HashMap<String, Vec<CertHistory>> = HashMap::new();
            for r in rows {
                let list = out.entry(r.get(0)).or_default();
                if list.len() < per_connector {
                    list.push(CertHistory {
                        serial: r.get(1),
                        issued_ms: r.get(2),
                        not_after_ms: r.get(3),
                        revoked_ms: r.get(4),
                        grace_until_ms: r.get(5),
                    });
                }
            }
            Ok(out)
        })
    }
}
