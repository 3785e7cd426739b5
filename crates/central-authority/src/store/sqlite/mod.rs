//! The SQLite backend of the store (the default: `reach.db` in the data
//! directory, nothing to install). One connection behind a mutex; every
//! change is one `IMMEDIATE` transaction, so several CA processes sharing
//! the file (on one host) serialise their writes through SQLite's lock.
//! The schema is versioned with `PRAGMA user_version`; `MIGRATIONS[i]`
//! takes it from version `i` to `i + 1`, each step in an `EXCLUSIVE`
//! transaction of its own.

mod audit;
mod certificates;
mod connectors;
mod history;
mod replicas;
mod sessions;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, TransactionBehavior};

use super::migrations::{Migration, migrations};
use super::{EventValue, StoreError};
use crate::ground::sync::lock;
use history::{
    ADDRESS_COLUMNS, ADDRESS_EVENTS_INSERT, EVENT_COLUMNS, EVENTS_INSERT, INSERT_CHUNK,
    LatestStatuses, insert_sql,
};

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
/// last file of `MIGRATIONS` (the files are numbered from 1 without a gap).
pub(super) const SCHEMA_VERSION: usize = MIGRATIONS.len();

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
            tracing::info!(version = i + 1, step = migration.file, "database migrated");
        }
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            latest: Mutex::default(),
            insert_sql: insert_sql(EVENTS_INSERT, EVENT_COLUMNS, INSERT_CHUNK),
            insert_address_sql: insert_sql(ADDRESS_EVENTS_INSERT, ADDRESS_COLUMNS, INSERT_CHUNK),
        })
    }

    /// Drops the tables, so every later query fails (tests of how callers
    /// handle a failing database).
    #[cfg(test)]
    pub(crate) fn break_for_tests(&self) {
        let conn = lock(&self.conn);
        let dropped = conn.execute_batch("DROP TABLE certificates; DROP TABLE connectors;");
        assert!(dropped.is_ok(), "{dropped:?}");
    }

    /// Removes replica `id` (it stopped cleanly).
    /// A trivial query (the file is open; it answers unless broken).
    pub(crate) fn ping(&self) -> Result<(), StoreError> {
        lock(&self.conn).query_row("SELECT 1", [], |_| Ok(()))?;
        Ok(())
    }
}
