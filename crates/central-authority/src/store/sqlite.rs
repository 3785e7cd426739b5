//! The SQLite backend of the store (the default: `reach.db` in the data
//! directory, nothing to install). One connection behind a mutex; every
//! change is one `IMMEDIATE` transaction, so several CA processes sharing
//! the file (on one host) serialise their writes through SQLite's lock.
//! The schema is versioned with `PRAGMA user_version`; `MIGRATIONS[i]`
//! takes it from version `i` to `i + 1`, each step in an `EXCLUSIVE`
//! transaction of its own.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::migrations::{Migration, migrations};
use super::rules::{self, KeyRow, NameClaim, NameRow};
use super::{
    AddressEventRecord, AuditFilter, AuditRecord, CertHistory, CertRecord, ConnectorRecord,
    DrainRecord, EnrollRefusal, EventFilter, EventRecord, EventValue, HistoryRow, KeyMap, KeyUsage,
    LoginRecord, NewCertificate, RenewRefusal, Renewal, ReplicaRecord, SessionRecord, StoreError,
    fresh_rows,
};
use crate::ground::sync::lock;

/// The schema steps, in order: `sqlite/migrations/NNNN_<what>.sql`, all SQL
/// (`store::migrations`). Never edit one that has shipped; add more.
pub(super) const MIGRATIONS: &[Migration] = migrations!("sqlite":
    "0001_connectors_certificates_keys",
    "0002_certificate_grace",
    "0003_reenroll_and_delete",
    "0004_replicas",
    "0005_health_events",
    "0006_shared_secrets",
    "0007_health_events_latest_index",
    "0008_health_latest",
    "0009_admin_audit",
    "0010_health_events_by_segment",
    "0011_address_history",
    "0012_auth_sessions_logins",
    "0013_connector_drains",
    "0014_certificate_root",
    "0015_audit_subject",
    "0016_session_revalidation",
    "0017_address_events_by_app_address",
);

/// The schema version a migrated database is at: the number of the
/// last file of `MIGRATIONS`.
pub(super) const SCHEMA_VERSION: usize = 17;
const _: () = assert!(MIGRATIONS.len() == SCHEMA_VERSION);

/// The columns [`session_row`] reads, in its order.
const SESSION_COLUMNS: &str = "id_sha256, person, provider, scopes, created_ms, expires_ms, \
     revoked_ms, subject, sid, roles, checked_ms, refresh_sealed";

fn session_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRecord> {
    Ok(SessionRecord {
        id_sha256: r.get(0)?,
        person: r.get(1)?,
        provider: r.get(2)?,
        scopes: r.get(3)?,
        created_ms: r.get(4)?,
        expires_ms: r.get(5)?,
        revoked_ms: r.get(6)?,
        subject: r.get(7)?,
        sid: r.get(8)?,
        roles: r.get(9)?,
        checked_ms: r.get(10)?,
        refresh_sealed: r.get(11)?,
    })
}

/// A history row's first nine columns (the status and the address
/// history select them alike).
fn event_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<EventRecord> {
    Ok(EventRecord {
        at_ms: r.get(0)?,
        segment: r.get(1)?,
        host: r.get(2)?,
        protocol: r.get(3)?,
        port: r.get(4)?,
        connector: r.get(5)?,
        from: r.get(6)?,
        to: r.get(7)?,
        cause: r.get(8)?,
    })
}

/// A `connector_drains` row (connector, since_ms, actor_kind, actor).
fn drain_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<DrainRecord> {
    Ok(DrainRecord {
        connector: r.get(0)?,
        since_ms: r.get(1)?,
        actor_kind: r.get(2)?,
        actor: r.get(3)?,
    })
}

/// How many history rows match `filter` (a `WHERE …` from `EventFilter`).
fn events_count_sql(filter: &str) -> String {
    format!("SELECT COUNT(*) FROM health_events{filter}")
}

/// One page of the history rows matching `filter`, newest first.
fn events_page_sql(filter: &str, limit: u32, offset: u64) -> String {
    format!(
        "SELECT at_ms, segment, host, protocol, port, connector, from_status, to_status, cause
         FROM health_events{filter} ORDER BY at_ms DESC LIMIT {limit} OFFSET {offset}"
    )
}

/// How many address history rows match `filter`.
fn address_events_count_sql(filter: &str) -> String {
    format!("SELECT COUNT(*) FROM address_events{filter}")
}

/// One page of the address history rows matching `filter`, newest first.
fn address_events_page_sql(filter: &str, limit: u32, offset: u64) -> String {
    format!(
        "SELECT at_ms, segment, host, protocol, port, connector, from_status, to_status,
             cause, address
         FROM address_events{filter} ORDER BY at_ms DESC, rowid DESC
         LIMIT {limit} OFFSET {offset}"
    )
}

/// One page of a filtered listing (the history, the audit trail): `count`
/// and `rows` take the same `values`; each row becomes a `T` by `row`.
/// Returns the page and how many match in all.
fn page<T>(
    conn: &Connection,
    count: &str,
    rows: &str,
    values: Vec<EventValue>,
    row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> Result<(Vec<T>, u64), StoreError> {
    let values: Vec<rusqlite::types::Value> = values
        .into_iter()
        .map(|v| match v {
            EventValue::Text(t) => rusqlite::types::Value::Text(t),
            EventValue::Int(i) => rusqlite::types::Value::Integer(i),
        })
        .collect();
    let total: i64 = conn.query_row(count, rusqlite::params_from_iter(values.iter()), |r| {
        r.get(0)
    })?;
    let mut stmt = conn.prepare(rows)?;
    let page = stmt
        .query_map(rusqlite::params_from_iter(values.iter()), row)?
        .collect::<Result<Vec<_>, _>>()?;
    Ok((page, u64::try_from(total).unwrap_or(0)))
}

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

/// A key's latest status, looked up once per key and batch while what this
/// connection knows may be stale.
const LATEST_STATUS: &str = "SELECT to_status FROM health_latest
     WHERE host = ?1 AND port = ?2 AND connector = ?3 AND segment = ?4 AND protocol = ?5";

/// History rows per `INSERT` statement (the rest of a batch one row per
/// statement): a statement's fixed cost (opening and closing a cursor per
/// tree, finding the table's last rowid, descending each index from its
/// root) is paid once per chunk, and the cursors stay where the last row
/// went. Eight: their 56 texts still fit SQLite's lookaside memory (93
/// small slots by default), so binding them does not go to `malloc`; 64
/// rows cost more per row in binding than they saved (docs/decisions.md
/// "Status history").
const INSERT_CHUNK: usize = 8;

/// Columns of one history row, in the order `bind_event` binds them.
const EVENT_COLUMNS: usize = 9;

/// At most this many keys' latest statuses are kept in memory (~150 B
/// each); past it the map starts afresh (its keys are looked up again).
const LATEST_KEYS: usize = 200_000;

/// The status each key's history ends with as this connection last read or
/// wrote it, trusted while no other connection committed to the file: the
/// `PRAGMA data_version` it was valid at (changed only by another
/// connection's commit). Saves a batch the lookup of each key when this
/// process is the only writer.
#[derive(Debug, Default)]
struct LatestStatuses {
    /// The `data_version` the statuses are valid at; `None`: not valid.
    version: Option<i64>,
    /// By encoded key ([`encode_key`]): the status, or `None` when the key
    /// has no history.
    statuses: std::collections::HashMap<Box<[u8]>, Option<Box<str>>, foldhash::fast::RandomState>,
}

/// `e`'s key as bytes, each text field prefixed by its length (so no two
/// keys encode alike), into `out`.
fn encode_key(e: &EventRecord, out: &mut Vec<u8>) {
    out.clear();
    for text in [&e.segment, &e.host, &e.protocol, &e.connector] {
        out.extend_from_slice(&(text.len() as u64).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    out.extend_from_slice(&e.port.to_le_bytes());
}

/// Binds `e` as the history row whose first placeholder is `first`.
fn bind_event(
    stmt: &mut rusqlite::CachedStatement<'_>,
    first: usize,
    e: &EventRecord,
) -> rusqlite::Result<()> {
    stmt.raw_bind_parameter(first, e.at_ms)?;
    stmt.raw_bind_parameter(first + 1, &e.segment)?;
    stmt.raw_bind_parameter(first + 2, &e.host)?;
    stmt.raw_bind_parameter(first + 3, &e.protocol)?;
    stmt.raw_bind_parameter(first + 4, e.port)?;
    stmt.raw_bind_parameter(first + 5, &e.connector)?;
    stmt.raw_bind_parameter(first + 6, &e.from)?;
    stmt.raw_bind_parameter(first + 7, &e.to)?;
    stmt.raw_bind_parameter(first + 8, &e.cause)
}

/// The status history's `INSERT`, before its rows' values (`bind_event`
/// binds each row's columns).
// `OR FAIL`: a row breaking a constraint ends the statement without undoing
// its earlier rows, so SQLite keeps no statement journal for a multi-row
// insert (an error rolls the whole batch back anyway).
const EVENTS_INSERT: &str = "INSERT OR FAIL INTO health_events
     (at_ms, segment, host, protocol, port, connector, from_status, to_status, cause) VALUES ";

/// The address history's (`bind_address_event`).
const ADDRESS_EVENTS_INSERT: &str = "INSERT OR FAIL INTO address_events
     (at_ms, segment, host, protocol, port, connector, from_status, to_status, cause, address)
     VALUES ";

/// Columns of one address history row.
const ADDRESS_COLUMNS: usize = EVENT_COLUMNS + 1;

/// `head` followed by `rows` rows of `columns` parameters each, and the
/// same for one row: a history's chunked and single-row inserts.
fn insert_sql(head: &str, columns: usize, rows: usize) -> (String, String) {
    let values = |rows: usize| {
        let mut sql = String::from(head);
        for r in 0..rows {
            sql.push_str(if r == 0 { "(" } else { ",(" });
            for c in 0..columns {
                if c > 0 {
                    sql.push(',');
                }
                sql.push_str(&format!("?{}", r * columns + c + 1));
            }
            sql.push(')');
        }
        sql
    };
    (values(rows), values(1))
}

/// Binds an address history row's columns from parameter `first` on.
fn bind_address_event(
    stmt: &mut rusqlite::CachedStatement<'_>,
    first: usize,
    r: &AddressEventRecord,
) -> rusqlite::Result<()> {
    bind_event(stmt, first, &r.event)?;
    stmt.raw_bind_parameter(first + EVENT_COLUMNS, &r.address)
}

/// Appends `rows` with `sql` (its chunked and single-row inserts), `bind`
/// binding each row's `columns` parameters.
fn append_rows<R>(
    tx: &rusqlite::Transaction<'_>,
    (many, one): &(String, String),
    rows: &[&R],
    columns: usize,
    bind: impl Fn(&mut rusqlite::CachedStatement<'_>, usize, &R) -> rusqlite::Result<()>,
) -> Result<(), StoreError> {
    let mut chunks = rows.chunks_exact(INSERT_CHUNK);
    let mut append = tx.prepare_cached(many)?;
    for chunk in &mut chunks {
        for (i, r) in chunk.iter().enumerate() {
            bind(&mut append, i * columns + 1, r)?;
        }
        append.raw_execute()?;
    }
    let mut append = tx.prepare_cached(one)?;
    for r in chunks.remainder() {
        bind(&mut append, 1, r)?;
        append.raw_execute()?;
    }
    Ok(())
}

/// The SQLite database.
#[derive(Debug)]
pub(crate) struct SqliteStore {
    conn: Mutex<Connection>,
    /// Locked after `conn`, only while `conn` is.
    latest: Mutex<LatestStatuses>,
    /// The status history's chunked and single-row inserts.
    insert_sql: (String, String),
    /// The address history's.
    insert_address_sql: (String, String),
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
    /// Opens (creating if needed) and migrates the database at `path`.
    pub(crate) fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        Self::init(Connection::open(path)?)
    }

    /// A database in memory (tests).
    pub(crate) fn in_memory() -> Result<SqliteStore, StoreError> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(mut conn: Connection) -> Result<SqliteStore, StoreError> {
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // WAL + FULL: a committed enrollment survives a crash or power loss.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        // A page cache that holds what one status-history batch touches (a
        // second of transitions: under report load tens of thousands of
        // rows, spread over the events table, its two indexes and
        // `health_latest`). With SQLite's default 2 MiB the batch spilled
        // pages to the WAL mid-transaction and read them back.
        // Negative: KiB, an upper bound; pages are allocated as used.
        conn.pragma_update(None, "cache_size", -32_768)?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let known = SCHEMA_VERSION;
        if version > known as i64 {
            return Err(StoreError::TooNew {
                found: version,
                known,
            });
        }
        for (i, migration) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Exclusive)?;
            tx.execute_batch(migration.sql)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
            tracing::info!(version = i + 1, "database migrated");
        }
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            latest: Mutex::default(),
            insert_sql: insert_sql(EVENTS_INSERT, EVENT_COLUMNS, INSERT_CHUNK),
            insert_address_sql: insert_sql(ADDRESS_EVENTS_INSERT, ADDRESS_COLUMNS, INSERT_CHUNK),
        })
    }

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

    /// Records a renewal: checks, in one transaction, that `old_serial` was
    /// issued to `name` of `group`, is neither revoked nor expired and that
    /// the connector is not disabled; records the new certificate and puts
    /// every other unrevoked certificate of the connector in grace until
    /// `revoke_old_at_ms` (an earlier grace is kept, never extended).
    pub(crate) fn renew(&self, r: &Renewal<'_>) -> Result<Result<(), RenewRefusal>, StoreError> {
        let mut conn = lock(&self.conn);
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let old = cert_record(&tx, r.old_serial)?;
        if let Err(refused) = super::renewable(old, r.name, r.group, r.old_serial, r.now_ms) {
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
        Ok(super::renewable(old, name, group, serial, now_ms))
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

    /// Drops the tables, so every later query fails (tests of how callers
    /// handle a failing database).
    #[cfg(test)]
    pub(crate) fn break_for_tests(&self) {
        let conn = lock(&self.conn);
        let dropped = conn.execute_batch("DROP TABLE certificates; DROP TABLE connectors;");
        assert!(dropped.is_ok(), "{dropped:?}");
    }

    /// Appends status transitions to the history, in one transaction.
    pub(crate) fn record_events(
        &self,
        events: &[EventRecord],
    ) -> Result<Vec<EventRecord>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = lock(&self.conn);
        let mut known = lock(&self.latest);
        // Immediate: the latest statuses read below stay the latest until
        // this commits (another CA process on the file waits).
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let version: i64 = tx.pragma_query_value(None, "data_version", |r| r.get(0))?;
        if known.version != Some(version) || known.statuses.len() > LATEST_KEYS {
            known.statuses.clear();
        }
        // Not valid until this commits.
        known.version = None;
        let mut buf = Vec::new();
        // Each key once, including keys with no history yet (a `latest`
        // miss would otherwise look them up again per row).
        let mut keys = KeyMap::default();
        for e in events {
            keys.entry(e.key()).or_insert(e);
        }
        let mut latest = KeyMap::default();
        {
            let mut get = tx.prepare_cached(LATEST_STATUS)?;
            for (key, e) in &keys {
                encode_key(e, &mut buf);
                let status = match known.statuses.get(buf.as_slice()) {
                    Some(status) => status.as_deref().map(str::to_owned),
                    None => get
                        .query_row(
                            params![e.host, e.port, e.connector, e.segment, e.protocol],
                            |r| r.get::<_, String>(0),
                        )
                        .optional()?,
                };
                if let Some(status) = status {
                    latest.insert(*key, status);
                }
            }
        }
        // From here on `latest` holds the statuses the batch's keys end
        // with once it is written.
        let (rows, last) = fresh_rows(events, &mut latest);
        self.write_events(&tx, &rows, &last)?;
        tx.commit()?;
        // Committed: what the file holds for these keys is known until
        // another connection commits (this one's commits leave
        // `data_version` as it was).
        for (key, e) in &keys {
            encode_key(e, &mut buf);
            let status = latest.get(key).map(|s| Box::<str>::from(s.as_str()));
            match known.statuses.get_mut(buf.as_slice()) {
                Some(held) => *held = status,
                None => {
                    known.statuses.insert(buf.as_slice().into(), status);
                }
            }
        }
        known.version = Some(version);
        Ok(rows.into_iter().cloned().collect())
    }

    /// Appends the `rows` not yet in the history (in chunks of
    /// `INSERT_CHUNK`) and moves each key's latest status to its `last` row.
    fn write_events(
        &self,
        tx: &rusqlite::Transaction<'_>,
        rows: &[&EventRecord],
        last: &[&EventRecord],
    ) -> Result<(), StoreError> {
        append_rows(tx, &self.insert_sql, rows, EVENT_COLUMNS, bind_event)?;
        let mut set = tx.prepare_cached(
            "INSERT INTO health_latest (host, port, connector, segment, protocol, to_status, at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (host, port, connector, segment, protocol)
             DO UPDATE SET to_status = excluded.to_status, at_ms = excluded.at_ms",
        )?;
        for e in last {
            set.execute(params![
                e.host,
                e.port,
                e.connector,
                e.segment,
                e.protocol,
                e.to,
                e.at_ms
            ])?;
        }
        Ok(())
    }

    /// One page of the history matching `f`, newest first, and how many
    /// match in all.
    pub(crate) fn events(
        &self,
        f: &EventFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<EventRecord>, u64), StoreError> {
        let (filter, values) = f.to_sql(|n| format!("?{n}"));
        page(
            &lock(&self.conn),
            &events_count_sql(&filter),
            &events_page_sql(&filter, limit, offset),
            values,
            event_row,
        )
    }

    /// Appends the address changes not yet recorded (see
    /// `Store::record_address_events`): one lookup per address in the
    /// batch, its rows in chunks, one `address_latest` write per address.
    pub(crate) fn record_address_events(
        &self,
        events: &[AddressEventRecord],
    ) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut conn = lock(&self.conn);
        // Immediate: the latest results read below stay the latest until
        // this commits.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut latest = KeyMap::default();
        {
            let mut get = tx.prepare_cached(
                "SELECT to_status FROM address_latest
                 WHERE host = ?1 AND port = ?2 AND address = ?3 AND segment = ?4 AND protocol = ?5",
            )?;
            // Each address once, including those with no history yet.
            let mut asked: KeyMap<'_, ()> = KeyMap::default();
            for r in events {
                let key = r.history_key();
                if asked.insert(key, ()).is_some() {
                    continue;
                }
                let (segment, host, protocol, port, address) = key;
                let status: Option<String> = get
                    .query_row(params![host, port, address, segment, protocol], |row| {
                        row.get(0)
                    })
                    .optional()?;
                if let Some(status) = status {
                    latest.insert(key, status);
                }
            }
        }
        let (rows, last) = fresh_rows(events, &mut latest);
        append_rows(
            &tx,
            &self.insert_address_sql,
            &rows,
            ADDRESS_COLUMNS,
            bind_address_event,
        )?;
        {
            let mut set = tx.prepare_cached(
                "INSERT INTO address_latest (host, port, address, segment, protocol, to_status, at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (host, port, address, segment, protocol)
                 DO UPDATE SET to_status = excluded.to_status, at_ms = excluded.at_ms",
            )?;
            for AddressEventRecord { event: e, address } in last {
                set.execute(params![
                    e.host, e.port, address, e.segment, e.protocol, e.to, e.at_ms
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// One page of the address history matching `f`, newest first.
    pub(crate) fn address_events(
        &self,
        f: &EventFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<AddressEventRecord>, u64), StoreError> {
        let (filter, values) = f.to_sql(|n| format!("?{n}"));
        page(
            &lock(&self.conn),
            &address_events_count_sql(&filter),
            &address_events_page_sql(&filter, limit, offset),
            values,
            |r| {
                Ok(AddressEventRecord {
                    event: event_row(r)?,
                    address: r.get(9)?,
                })
            },
        )
    }

    /// Deletes the history from before `before_ms`; returns how many went.
    pub(crate) fn prune_events(&self, before_ms: i64) -> Result<usize, StoreError> {
        let mut conn = lock(&self.conn);
        // Keys' latest statuses go below: what this store knew is stale.
        *lock(&self.latest) = LatestStatuses::default();
        let tx = conn.transaction()?;
        let n = tx.execute(
            "DELETE FROM health_events WHERE at_ms < ?1",
            params![before_ms],
        )?;
        // A key whose last row is older than the retention: no copy of that
        // row can still be on its way from another replica.
        tx.execute(
            "DELETE FROM health_latest WHERE at_ms < ?1",
            params![before_ms],
        )?;
        // The address history is kept as long.
        tx.execute(
            "DELETE FROM address_events WHERE at_ms < ?1",
            params![before_ms],
        )?;
        tx.execute(
            "DELETE FROM address_latest WHERE at_ms < ?1",
            params![before_ms],
        )?;
        tx.commit()?;
        Ok(n)
    }

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

    /// Removes replica `id` (it stopped cleanly).
    /// A trivial query (the file is open; it answers unless broken).
    pub(crate) fn ping(&self) -> Result<(), StoreError> {
        lock(&self.conn).query_row("SELECT 1", [], |_| Ok(()))?;
        Ok(())
    }

    /// Records a new session, forgetting those that ended before it.
    pub(crate) fn create_session(&self, r: &SessionRecord) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        conn.execute(
            "DELETE FROM auth_sessions WHERE expires_ms < ?1",
            params![r.created_ms],
        )?;
        conn.execute(
            "INSERT INTO auth_sessions (id_sha256, person, provider, scopes, created_ms, expires_ms,
                                        subject, sid, roles, checked_ms, refresh_sealed)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                r.id_sha256,
                r.person,
                r.provider,
                r.scopes,
                r.created_ms,
                r.expires_ms,
                r.subject,
                r.sid,
                r.roles,
                r.checked_ms,
                r.refresh_sealed
            ],
        )?;
        Ok(())
    }

    /// The session whose id hashes to `id_sha256`.
    pub(crate) fn session(&self, id_sha256: &str) -> Result<Option<SessionRecord>, StoreError> {
        let conn = lock(&self.conn);
        Ok(conn
            .query_row(
                &format!("SELECT {SESSION_COLUMNS} FROM auth_sessions WHERE id_sha256 = ?1"),
                params![id_sha256],
                session_row,
            )
            .optional()?)
    }

    /// The live sessions, newest first.
    pub(crate) fn sessions(&self, now_ms: i64) -> Result<Vec<SessionRecord>, StoreError> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare(&format!(
            "SELECT {SESSION_COLUMNS} FROM auth_sessions
             WHERE revoked_ms IS NULL AND expires_ms > ?1 ORDER BY created_ms DESC"
        ))?;
        let rows = stmt.query_map(params![now_ms], session_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Claims a session's re-validation (compare and set of `checked_ms`).
    pub(crate) fn claim_session_check(
        &self,
        id_sha256: &str,
        seen_checked_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        Ok(conn.execute(
            "UPDATE auth_sessions SET checked_ms = ?3 WHERE id_sha256 = ?1 AND checked_ms = ?2",
            params![id_sha256, seen_checked_ms, now_ms],
        )? > 0)
    }

    /// Records what a re-validation learnt.
    pub(crate) fn session_refreshed(
        &self,
        id_sha256: &str,
        roles: &str,
        refresh_sealed: Option<&str>,
    ) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        conn.execute(
            "UPDATE auth_sessions SET roles = ?2, refresh_sealed = COALESCE(?3, refresh_sealed)
             WHERE id_sha256 = ?1",
            params![id_sha256, roles, refresh_sealed],
        )?;
        Ok(())
    }

    /// Revokes a provider session's (or subject's) live sessions.
    pub(crate) fn revoke_provider_sessions(
        &self,
        provider: &str,
        sid: Option<&str>,
        sub: Option<&str>,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        let conn = lock(&self.conn);
        let n = conn.execute(
            "UPDATE auth_sessions SET revoked_ms = ?4
             WHERE provider = ?1 AND revoked_ms IS NULL
               AND ((?2 IS NOT NULL AND sid = ?2) OR (?2 IS NULL AND subject = ?3))",
            params![provider, sid, sub, now_ms],
        )?;
        Ok(n as u64)
    }

    /// Records a logout token's id; false when it was there.
    pub(crate) fn logout_token_once(
        &self,
        provider: &str,
        jti: &str,
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        conn.execute(
            "DELETE FROM auth_logout_tokens WHERE expires_ms < ?1",
            params![now_ms],
        )?;
        Ok(conn.execute(
            "INSERT INTO auth_logout_tokens (provider, jti, expires_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT (provider, jti) DO NOTHING",
            params![provider, jti, expires_ms],
        )? > 0)
    }

    /// Revokes a session; whether one was live.
    pub(crate) fn revoke_session(&self, id_sha256: &str, now_ms: i64) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        Ok(conn.execute(
            "UPDATE auth_sessions SET revoked_ms = ?2 WHERE id_sha256 = ?1 AND revoked_ms IS NULL",
            params![id_sha256, now_ms],
        )? > 0)
    }

    /// Records a sign-in on its way, forgetting those that expired.
    pub(crate) fn put_login(&self, r: &LoginRecord, now_ms: i64) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        conn.execute(
            "DELETE FROM auth_logins WHERE expires_ms < ?1",
            params![now_ms],
        )?;
        conn.execute(
            "INSERT INTO auth_logins (state_sha256, provider, verifier, nonce, next, expires_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                r.state_sha256,
                r.provider,
                r.verifier,
                r.nonce,
                r.next,
                r.expires_ms
            ],
        )?;
        Ok(())
    }

    /// Takes (once) the sign-in whose state hashes to `state_sha256`, if
    /// it has not expired.
    pub(crate) fn take_login(
        &self,
        state_sha256: &str,
        now_ms: i64,
    ) -> Result<Option<LoginRecord>, StoreError> {
        let conn = lock(&self.conn);
        Ok(conn
            .query_row(
                "DELETE FROM auth_logins WHERE state_sha256 = ?1
                 RETURNING state_sha256, provider, verifier, nonce, next, expires_ms",
                params![state_sha256],
                |r| {
                    Ok(LoginRecord {
                        state_sha256: r.get(0)?,
                        provider: r.get(1)?,
                        verifier: r.get(2)?,
                        nonce: r.get(3)?,
                        next: r.get(4)?,
                        expires_ms: r.get(5)?,
                    })
                },
            )
            .optional()?
            .filter(|l| l.expires_ms >= now_ms))
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
                addresses: super::split_addresses(&addresses),
                version: r.get(2)?,
                started_ms: r.get(3)?,
                heartbeat_ms: r.get(4)?,
                policy_hash: r.get(5)?,
            })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_cache_holds_a_history_batch() {
        let store = SqliteStore::in_memory().expect("store");
        let size: i64 = lock(&store.conn)
            .pragma_query_value(None, "cache_size", |r| r.get(0))
            .expect("cache_size");
        assert_eq!(size, -32_768);
    }

    /// The history filtered by segment (the dashboard's and
    /// `/api/v1/events?segment=`) is read through an index, counted and
    /// paged alike, not by scanning every row.
    #[test]
    fn events_by_segment_use_an_index() {
        let f = EventFilter {
            segment: Some("jira".into()),
            hidden_segments: vec!["secret".into()],
            ..EventFilter::default()
        };
        let (filter, _) = f.to_sql(|n| format!("?{n}"));
        assert_uses_index(
            [events_count_sql(&filter), events_page_sql(&filter, 50, 0)],
            "INDEX health_events_by_segment (segment=?",
        );
    }

    /// The address history is read through an index in every listing:
    /// of one application's address (the dashboard's `/api/v1/events?app=…
    /// &address=`), in the order of the index by application and address;
    /// of every address of one application, through its first columns and
    /// sorting that application's rows only; across applications, the page
    /// walks the index by time and the count the index by application.
    #[test]
    fn address_events_use_an_index() {
        let app = |address: &str| EventFilter {
            segment: Some("jira".into()),
            host: Some("jira.test".into()),
            protocol: Some("tcp".into()),
            port: Some(80),
            address: Some(address.into()),
            hidden_segments: vec!["secret".into()],
            ..EventFilter::default()
        };
        let everywhere = EventFilter {
            address: Some("10.0.0.1".into()),
            ..EventFilter::default()
        };
        let by_app = "INDEX address_events_by_app (host=? AND port=?";
        for (f, count, page, sorts) in [
            (app("10.0.0.1"), by_app, by_app, false),
            (app("*"), by_app, by_app, true),
            (
                everywhere,
                "INDEX address_events_by_app",
                "INDEX address_events_by_time",
                false,
            ),
        ] {
            let (filter, _) = f.to_sql(|n| format!("?{n}"));
            let count_plan = plan_of(&address_events_count_sql(&filter));
            assert!(
                count_plan.iter().any(|s| s.contains(count)),
                "{count_plan:?}"
            );
            let page_plan = plan_of(&address_events_page_sql(&filter, 50, 0));
            assert!(page_plan.iter().any(|s| s.contains(page)), "{page_plan:?}");
            assert_eq!(
                page_plan.iter().any(|s| s.contains("TEMP B-TREE")),
                sorts,
                "{page_plan:?}"
            );
        }
        let (filter, _) = app("10.0.0.1").to_sql(|n| format!("?{n}"));
        assert_uses_index(
            [
                address_events_count_sql(&filter),
                address_events_page_sql(&filter, 50, 0),
            ],
            "INDEX address_events_by_app (host=? AND port=? AND address=?",
        );
    }

    /// The steps of `sql`'s `EXPLAIN QUERY PLAN` on an empty store.
    fn plan_of(sql: &str) -> Vec<String> {
        let store = SqliteStore::in_memory().expect("store");
        let conn = lock(&store.conn);
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("plan");
        let n = stmt.parameter_count();
        stmt.query_map(
            rusqlite::params_from_iter(std::iter::repeat_n("jira", n)),
            |r| r.get::<_, String>(3),
        )
        .expect("plan rows")
        .collect::<Result<_, _>>()
        .expect("plan rows")
    }

    /// Each of `queries` is planned through `index` (a step of its `EXPLAIN
    /// QUERY PLAN` names it) and sorts nothing in a temporary tree.
    fn assert_uses_index(queries: [String; 2], index: &str) {
        for sql in queries {
            let plan = plan_of(&sql);
            assert!(
                plan.iter().any(|step| step.contains(index)),
                "{sql}: {plan:?}"
            );
            assert!(
                !plan.iter().any(|step| step.contains("TEMP B-TREE")),
                "{sql}: {plan:?}"
            );
        }
    }

    fn flap(at_ms: i64, connector: &str, to: &str) -> EventRecord {
        crate::store::suite::event(at_ms, "a.test", connector, to)
    }

    /// How many times this store's lookup of a key's latest status ran.
    fn latest_lookups(s: &SqliteStore) -> i32 {
        let conn = lock(&s.conn);
        let stmt = conn.prepare_cached(LATEST_STATUS).expect("statement");
        stmt.get_status(rusqlite::StatementStatus::Run)
    }

    fn two_stores(name: &str) -> (std::path::PathBuf, SqliteStore, SqliteStore) {
        let dir = std::env::temp_dir().join(format!("reach-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("reach.db");
        let a = SqliteStore::open(&path).expect("db");
        let b = SqliteStore::open(&path).expect("db");
        (dir, a, b)
    }

    /// While no other connection committed to the file (`PRAGMA
    /// data_version` unchanged), a batch takes its keys' latest statuses
    /// from what this store last wrote: no lookup. Once another store
    /// wrote, they are read again, so its transitions still dedupe.
    #[test]
    fn latest_statuses_are_read_again_only_after_another_store_wrote() {
        let (dir, a, b) = two_stores("latest-cache");
        a.record_events(&[flap(1_000, "c1", "up"), flap(1_001, "c2", "up")])
            .expect("recorded");
        let first = latest_lookups(&a);
        assert_eq!(first, 2, "a key with no history yet is looked up");
        a.record_events(&[flap(2_000, "c1", "down"), flap(2_001, "c1", "down")])
            .expect("recorded");
        assert_eq!(latest_lookups(&a), first, "nobody else wrote: no lookup");
        // Pruning through this store forgets what it knew: c2's latest
        // status went with its rows.
        assert_eq!(a.prune_events(1_500).expect("pruned"), 2);
        a.record_events(&[flap(2_500, "c2", "up")])
            .expect("recorded");
        assert_eq!(latest_lookups(&a), first + 1, "read again after a prune");
        // The other replica records c1 going up; this one's copy of it,
        // a moment later, is the same transition.
        let appended = b
            .record_events(&[flap(3_000, "c1", "up")])
            .expect("recorded");
        assert_eq!(appended, [flap(3_000, "c1", "up")], "b appended it");
        let copy = a
            .record_events(&[flap(3_007, "c1", "up")])
            .expect("recorded");
        assert!(copy.is_empty(), "a copy is not appended: {copy:?}");
        assert_eq!(latest_lookups(&a), first + 2, "read again after b wrote");
        let (rows, total) = a.events(&EventFilter::default(), 10, 0).expect("read");
        assert_eq!(
            rows.iter()
                .map(|e| (e.at_ms, e.connector.as_str(), e.to.as_str()))
                .collect::<Vec<_>>(),
            [
                (3_000, "c1", "up"),
                (2_500, "c2", "up"),
                (2_000, "c1", "down")
            ],
            "{total}"
        );
        drop((a, b));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A batch larger than one multi-row `INSERT` keeps its rows, in order,
    /// copies skipped wherever they fall.
    #[test]
    fn a_large_batch_keeps_every_transition_in_order() {
        let s = SqliteStore::in_memory().expect("db");
        let mut events = Vec::new();
        for i in 0..(3 * INSERT_CHUNK as i64 + 5) {
            let to = if i % 2 == 0 { "up" } else { "down" };
            events.push(flap(i * 10, "c1", to));
            // A copy of it, one ms later (another replica's).
            events.push(flap(i * 10 + 1, "c1", to));
        }
        s.record_events(&events).expect("recorded");
        let (rows, total) = s.events(&EventFilter::default(), 1_000, 0).expect("read");
        assert_eq!(total, 3 * INSERT_CHUNK as u64 + 5);
        let expected: Vec<(i64, &str)> = (0..(3 * INSERT_CHUNK as i64 + 5))
            .rev()
            .map(|i| (i * 10, if i % 2 == 0 { "up" } else { "down" }))
            .collect();
        assert_eq!(
            rows.iter()
                .map(|e| (e.at_ms, e.to.as_str()))
                .collect::<Vec<_>>(),
            expected
        );
        assert!(
            rows.iter()
                .all(|e| e.host == "a.test" && e.port == 80 && e.cause == "report")
        );
    }

    fn cert<'a>(name: &'a str, group: &'a str, serial: &'a str) -> NewCertificate<'a> {
        NewCertificate {
            name,
            group,
            key_sha256: "k1",
            max_uses: 2,
            serial,
            fingerprint: "f",
            not_after_ms: 10,
            now_ms: 1,
            root_sha256: "r",
        }
    }

    #[test]
    fn a_version_1_database_is_migrated_in_place() {
        let dir = std::env::temp_dir().join(format!("reach-store-v1-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("reach.db");
        {
            let conn = Connection::open(&path).expect("db");
            conn.execute_batch(MIGRATIONS[0].sql).expect("v1 schema");
            conn.pragma_update(None, "user_version", 1)
                .expect("version");
            conn.execute_batch(
                "INSERT INTO connectors (name, grp, disabled, enrolled_ms, changed_ms) VALUES ('c1', 'g', 0, 1, 1);
                 INSERT INTO certificates (serial, connector, grp, fingerprint, issued_ms, not_after_ms)
                 VALUES ('01', 'c1', 'g', 'f', 1, 10);",
            )
            .expect("v1 rows");
        }
        let s = SqliteStore::open(&path).expect("migrated");
        assert_eq!(s.connectors().expect("db")[0].serial.as_deref(), Some("01"));
        // A certificate recorded before roots were is of no known root.
        assert_eq!(s.connectors().expect("db")[0].root_sha256, None);
        assert_eq!(
            s.enroll(&cert("c1", "g", "02")).expect("db"),
            Err(EnrollRefusal::NameTaken("c1".into()))
        );
        drop(s);
        let conn = Connection::open(&path).expect("db");
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .expect("version");
        assert_eq!(version, SCHEMA_VERSION as i64);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Version 17 leaves a version-16 file's address history listed as it
    /// was, by application, by address and across applications, through
    /// two indexes.
    #[test]
    fn a_version_16_address_history_stays_listed() {
        let dir = std::env::temp_dir().join(format!("reach-store-v16-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("reach.db");
        {
            let conn = Connection::open(&path).expect("db");
            for m in &MIGRATIONS[..16] {
                conn.execute_batch(m.sql).expect("schema");
            }
            conn.pragma_update(None, "user_version", 16)
                .expect("version");
            conn.execute_batch(
                "INSERT INTO address_events VALUES
                     (1, 's', 'a.test', 'tcp', 80, '10.0.0.1', 'c1', 'unknown', 'up', 'appeared'),
                     (2, 's', 'a.test', 'tcp', 80, '10.0.0.1', 'c1', 'up', 'down', 'report'),
                     (3, 's', 'b.test', 'tcp', 80, '10.0.0.1', 'c1', 'unknown', 'up', 'appeared');",
            )
            .expect("v16 rows");
        }
        let s = SqliteStore::open(&path).expect("migrated");
        super::super::suite::version_16_address_rows_are_listed(|f| s.address_events(f, 10, 0));
        let indexes: Vec<String> = lock(&s.conn)
            .prepare(
                "SELECT name FROM sqlite_master
                 WHERE type = 'index' AND tbl_name = 'address_events' ORDER BY name",
            )
            .expect("indexes")
            .query_map([], |r| r.get(0))
            .expect("indexes")
            .collect::<Result<_, _>>()
            .expect("indexes");
        assert_eq!(indexes, ["address_events_by_app", "address_events_by_time"]);
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Version 8 fills `health_latest` from the history a version-7 file
    /// holds, so a copy of the last transition is still recognised.
    #[test]
    fn a_version_7_history_keeps_its_latest_statuses() {
        let dir = std::env::temp_dir().join(format!("reach-store-v7-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("reach.db");
        {
            let conn = Connection::open(&path).expect("db");
            for m in &MIGRATIONS[..7] {
                conn.execute_batch(m.sql).expect("schema");
            }
            conn.pragma_update(None, "user_version", 7)
                .expect("version");
            conn.execute_batch(
                "INSERT INTO health_events VALUES (1, 's', 'a.test', 'tcp', 80, 'c1', 'unknown', 'up', 'report');
                 INSERT INTO health_events VALUES (2, 's', 'a.test', 'tcp', 80, 'c1', 'up', 'down', 'report');",
            )
            .expect("v7 rows");
        }
        let s = SqliteStore::open(&path).expect("migrated");
        let event = |at_ms, to: &str| EventRecord {
            at_ms,
            segment: "s".into(),
            host: "a.test".into(),
            protocol: "tcp".into(),
            port: 80,
            connector: "c1".into(),
            from: "up".into(),
            to: to.into(),
            cause: "report".into(),
        };
        // Another replica's copy of the down, then a real change.
        s.record_events(&[event(3, "down"), event(4, "up")])
            .expect("recorded");
        let (rows, total) = s.events(&EventFilter::default(), 10, 0).expect("read");
        assert_eq!(total, 3, "{rows:?}");
        assert_eq!(rows.iter().map(|e| e.at_ms).collect::<Vec<_>>(), [4, 2, 1]);
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn state_survives_reopening_and_migrations_are_idempotent() {
        let dir = std::env::temp_dir().join(format!("reach-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("reach.db");
        {
            let s = SqliteStore::open(&path).expect("db");
            assert_eq!(s.enroll(&cert("c1", "g", "01")).expect("db"), Ok(()));
        }
        let s = SqliteStore::open(&path).expect("reopened");
        assert_eq!(s.connectors().expect("db")[0].serial.as_deref(), Some("01"));
        assert_eq!(s.key_usage("g", "k1").expect("db").uses, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
