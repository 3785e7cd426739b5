//! `central-authority backup`: what a new CA needs to take over from this
//! one without its connectors enrolling again, written into a directory
//! while the CA runs.
//!
//! - The issuing root and its key (`ca.pem`, `ca.key`): the generated ones
//!   from the data directory, or the `[tls] issuer_cert_file` /
//!   `issuer_key_file` the configuration names. Connectors trust the root
//!   and their certificates chain to it; a new root means enrolling again.
//!   The server certificate is not needed: every start issues it anew from
//!   the root.
//! - With the SQLite store, the database (`reach.db`), copied by SQLite's
//!   `VACUUM INTO` in one read transaction: a consistent snapshot of a
//!   running CA (enrolled connectors, certificates and revocations, key
//!   uses, the on-access id key, history, audit). A PostgreSQL store is
//!   dumped with `pg_dump` (the book's "Backup and restore" section);
//!   this command then copies the key files only and says so.
//!
//! Restoring is copying: the files into a new data directory (mode 0700),
//! and for PostgreSQL `pg_restore` into an empty database.

use std::path::{Path, PathBuf};

use crate::Config;
use crate::credentials::pki::{ROOT_CERT_FILE, ROOT_KEY_FILE};
use crate::store::StoreLocation;

/// The database file's name in a backup (and in a data directory).
pub const DATABASE_FILE: &str = "reach.db";

/// What a backup wrote.
#[derive(Debug)]
pub struct Backup {
    /// Files written, in order.
    pub files: Vec<PathBuf>,
    /// Set when the store is PostgreSQL: the database is not in the
    /// backup and must be dumped with `pg_dump`.
    pub database_not_included: Option<String>,
}

/// Why a backup failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The SQLite copy failed.
    #[error("copying the database {path}: {source}")]
    Sqlite {
        /// The database.
        path: PathBuf,
        /// Why.
        source: rusqlite::Error,
    },
    /// There is nothing to back up at the configured place.
    #[error("{0}")]
    Missing(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BackupError + '_ {
    move |source| BackupError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Backs up the CA of `config` into `out` (created with mode 0700; files
/// already there with the backup's names are refused, never overwritten).
pub fn run(config: &Config, out: &Path) -> Result<Backup, BackupError> {
    let s = &config.settings;
    private_files::create_private_dir(out).map_err(io(out))?;
    let mut files = Vec::new();
    let issuer = match (&s.tls.issuer_cert_file, &s.tls.issuer_key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => (
            s.data_dir.join(ROOT_CERT_FILE),
            s.data_dir.join(ROOT_KEY_FILE),
        ),
    };
    for (from, name) in [(&issuer.0, ROOT_CERT_FILE), (&issuer.1, ROOT_KEY_FILE)] {
        if !from.exists() {
            return Err(BackupError::Missing(format!(
                "{} does not exist: has this CA started with TLS?",
                from.display()
            )));
        }
        let text = std::fs::read_to_string(from).map_err(io(from))?;
        let to = out.join(name);
        refuse_existing(&to)?;
        private_files::write_atomic(&to, &text).map_err(io(&to))?;
        files.push(to);
    }
    let database_not_included = match s.store.resolve(&s.data_dir) {
        StoreLocation::Sqlite(path) => {
            let to = out.join(DATABASE_FILE);
            copy_sqlite(&path, &to)?;
            files.push(to);
            None
        }
        other => Some(other.to_string()),
    };
    Ok(Backup {
        files,
        database_not_included,
    })
}

fn refuse_existing(path: &Path) -> Result<(), BackupError> {
    if path.exists() {
        return Err(BackupError::Missing(format!(
            "{} exists already: back up into a new directory",
            path.display()
        )));
    }
    Ok(())
}

/// `VACUUM INTO`: one read transaction, so the copy is consistent while
/// the CA writes (WAL readers do not block writers). The copy is made
/// under a temporary name with mode 0600 and renamed into place.
fn copy_sqlite(from: &Path, to: &Path) -> Result<(), BackupError> {
    if !from.exists() {
        return Err(BackupError::Missing(format!(
            "{}: no database there",
            from.display()
        )));
    }
    refuse_existing(to)?;
    let sqlite = |source| BackupError::Sqlite {
        path: from.to_owned(),
        source,
    };
    let tmp = to.with_extension("db.partial");
    let _ = std::fs::remove_file(&tmp);
    // An empty file of mode 0600 first: SQLite writes into it and keeps
    // its mode, so the copy is never readable by others.
    private_files::write_atomic(&tmp, "").map_err(io(&tmp))?;
    let conn =
        rusqlite::Connection::open_with_flags(from, rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE)
            .map_err(sqlite)?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(sqlite)?;
    let target = tmp.to_string_lossy().into_owned();
    let copied = conn
        .execute("VACUUM INTO ?1", [&target])
        .map_err(sqlite)
        .and_then(|_| std::fs::rename(&tmp, to).map_err(io(to)));
    if copied.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    copied
}
