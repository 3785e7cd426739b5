//! The PostgreSQL backend of the store, which several CA replicas share:
//! tokio-postgres with a deadpool pool, TLS through rustls.
//!
//! The store's API is synchronous (the trust checks call it from the
//! blocking pool, like SQLite); this backend runs the async driver on a
//! small runtime of its own and waits for each call on the calling thread,
//! so a call works from any thread and never nests one runtime's
//! `block_on` in another.
//!
//! Every transaction runs `SERIALIZABLE` and is retried (with jitter) on a
//! serialization failure or deadlock (SQLSTATE 40001, 40P01): two replicas
//! enrolling on a key with one use left cannot both succeed. Changes that
//! may end sessions `NOTIFY reach_trust` in their transaction and bump
//! `changes` when it commits; a dedicated connection `LISTEN`s and bumps
//! `changes` on other replicas' notifications (and again after every
//! reconnect, since notifications sent while it was away are lost).
//! Migrations (`MIGRATIONS`, the version in table `reach_schema`) run at
//! start in one transaction under an advisory lock, so replicas starting
//! together migrate once.

mod audit;
mod certificates;
mod connectors;
mod history;
mod link;
mod replicas;
mod sessions;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures::StreamExt;
use tokio::sync::watch;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Transaction};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::ends::Ends;
use super::migrations::{Migration, migrations};
use super::{EventValue, StoreError};
use crate::ground::secret::Secret;
use crate::ground::sync::lock;
use link::{Link, parse, tls_refused};

/// The channel changes that may end sessions are announced on.
const CHANNEL: &str = "reach_trust";

/// The schema steps, in order: `postgres/migrations/NNNN_<what>.sql`, all SQL
/// (`store::migrations`). Never edit one that has shipped; add more.
/// (The same tables as SQLite's, in PostgreSQL's types; `seq` orders
/// certificates issued in the same millisecond, as SQLite's rowid does.)
pub(super) const MIGRATIONS: &[Migration] = migrations!("postgres":
    "0001_connectors_certificates_keys_replicas",
    "0002_health_events",
    "0003_shared_secrets",
    "0004_health_events_latest_index",
    "0005_health_latest",
    "0006_admin_audit",
    "0007_health_events_by_segment",
    "0008_address_history",
    "0009_auth_sessions_logins",
    "0010_byte_collation_fillfactor",
    "0011_history_ends",
    "0012_text_hashes",
    "0013_connector_drains",
    "0014_certificate_root",
    "0015_audit_subject",
    "0016_session_revalidation",
    "0017_address_events_by_app_address",
);

/// The schema version a migrated database is at: the number of the
/// last file of `MIGRATIONS` (the files are numbered from 1 without a gap).
pub(super) const SCHEMA_VERSION: usize = MIGRATIONS.len();

/// How often a transaction is tried before its serialization failure is
/// returned.
const ATTEMPTS: u32 = 30;

/// Connections in the pool (per replica).
const POOL_SIZE: usize = 16;

/// How far the latest tables may lag behind the histories: a starting
/// replica reads the rows appended since (at 1,000 transitions a second,
/// 600,000 rows), and a key that changed in that time is written there
/// once, however often it changed.
const CHECKPOINT_EVERY_MS: i64 = 10 * 60 * 1000;

/// The PostgreSQL database.
pub(crate) struct PgStore {
    pool: Pool,
    /// Drives the driver's connections; `None` only while dropping.
    rt: Option<tokio::runtime::Runtime>,
    changes: watch::Sender<u64>,
    /// Whether the listener listens: while it does not, another replica's
    /// announcement would go unheard, so `standing` is not trusted.
    listening: Arc<AtomicBool>,
    /// What the store last read about sessions' standing.
    standing: Mutex<Standing>,
    /// Where the status history ends, as this replica knows it; held for
    /// the whole of its turn as a writer.
    health_ends: Box<tokio::sync::Mutex<Ends>>,
    /// Where the address history ends.
    address_ends: Box<tokio::sync::Mutex<Ends>>,
    /// `CHECKPOINT_EVERY_MS`, which tests shorten.
    checkpoint_every_ms: AtomicI64,
    /// The URL without its password, for `Debug`.
    shown: String,
    /// How the link is protected.
    link: Link,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("url", &self.shown).finish()
    }
}

impl Drop for PgStore {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which tokio forbids inside an async
        // context (where the last `Arc<Authority>` may go).
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Whether `e` is a serialization failure or deadlock (try again).
fn retryable(e: &StoreError) -> bool {
    match e {
        StoreError::Postgres(e) => e.code().is_some_and(|c| {
            *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
        }),
        _ => false,
    }
}

fn to_u32(v: i64) -> u32 {
    u32::try_from(v.max(0)).unwrap_or(u32::MAX)
}

fn to_usize(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

tokio::task_local! {
    /// Whether the transaction `serializable!` is running announced a
    /// change (`notify`).
    static NOTIFIED: std::cell::Cell<bool>;
}

/// Announces (on commit) a change that may end sessions of `connector`:
/// to the other replicas by `NOTIFY`, and to this one's `changes` as soon
/// as the transaction commits (its own `NOTIFY` comes back to its `LISTEN`
/// only after a round trip, and a `Hello` in between must not skip its
/// standing check).
async fn notify(tx: &Transaction<'_>, connector: &str) -> Result<(), StoreError> {
    tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &connector])
        .await?;
    let _ = NOTIFIED.try_with(|n| n.set(true));
    Ok(())
}

/// Runs `$body` in a `SERIALIZABLE` transaction bound to `$tx`, committing
/// when it evaluates to `Ok`; a `return` from it rolls back. A committed
/// transaction that announced a change (`notify`) bumps `changes` at once.
/// Tried again, after a jittered pause, on serialization failures.
macro_rules! serializable {
    ($self:ident, |$tx:ident| $body:block) => {{
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let result: Result<_, $crate::store::StoreError> = $crate::store::postgres::NOTIFIED
                .scope(std::cell::Cell::new(false), async {
                    let mut client = $self.client().await?;
                    let txn = client
                        .build_transaction()
                        .isolation_level(tokio_postgres::IsolationLevel::Serializable)
                        .start()
                        .await?;
                    let $tx: &tokio_postgres::Transaction<'_> = &txn;
                    let out: Result<_, $crate::store::StoreError> = $body;
                    let out = out?;
                    txn.commit().await?;
                    if $crate::store::postgres::NOTIFIED.with(std::cell::Cell::get) {
                        $self.changes.send_modify(|v| *v = v.wrapping_add(1));
                    }
                    Ok(out)
                })
                .await;
            match result {
                Err(e)
                    if $crate::store::postgres::retryable(&e)
                        && attempt < $crate::store::postgres::ATTEMPTS =>
                {
                    $crate::store::postgres::backoff(attempt).await
                }
                other => break other,
            }
        }
    }};
}
use serializable;

/// A random pause before try `attempt + 1`, growing with `attempt`.
async fn backoff(attempt: u32) {
    let ceiling = 2u64 << attempt.min(7);
    let pause = 1 + rand::random::<u64>() % ceiling;
    tokio::time::sleep(Duration::from_millis(pause)).await;
}

/// Listens for other replicas' changes and bumps `changes` on each (and
/// once after every (re)connection), reconnecting after failures.
async fn listen(
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    changes: watch::Sender<u64>,
    listening: Arc<AtomicBool>,
) {
    let bump = |v: &mut u64| *v = v.wrapping_add(1);
    loop {
        match config.connect(tls.clone()).await {
            Ok((client, mut connection)) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(m) = messages.next().await {
                        match m {
                            Ok(AsyncMessage::Notification(_)) => {
                                if tx.send(()).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(error = %e, "database notification connection failed");
                                return;
                            }
                        }
                    }
                });
                match client.batch_execute(&format!("LISTEN {CHANNEL}")).await {
                    Ok(()) => {
                        listening.store(true, Ordering::Release);
                        changes.send_modify(bump);
                        while rx.recv().await.is_some() {
                            changes.send_modify(bump);
                        }
                        listening.store(false, Ordering::Release);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot LISTEN for other replicas' changes")
                    }
                }
                driver.abort();
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot connect to listen for other replicas' changes")
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What this replica last read about sessions' standing, when, and the
/// announcement count (`PgStore::announced`) it read it at. A session's
/// admission asks it instead of the database while nothing was announced
/// since, the listener listens and the reading is younger than
/// `STANDING_FOR`: every change to it is announced (a disable, an enable,
/// a key's revocation), as the Hello's check of a session already relies
/// on. In a reconnect storm this took the two statements of each session's
/// admission off PostgreSQL.
#[derive(Debug, Default)]
struct Standing {
    at: u64,
    /// Every disabled connector.
    disabled: Option<(Instant, HashSet<String>)>,
    /// Per group, whether each of its keys asked about is revoked.
    revoked: HashMap<String, HashMap<String, (Instant, bool)>>,
}

/// How long a standing reading answers. A replica cut off from the
/// database hears no announcement, and may not notice at once that its
/// listener is cut off too: for at most this long after its last reading
/// it admits sessions as that reading says, then it asks the database
/// and, getting no answer, refuses them. The session reconcile reads the
/// disabled connectors every second, which keeps that reading fresh.
const STANDING_FOR: Duration = Duration::from_secs(2);

/// One page of a filtered listing (the history, the audit trail): `count`
/// and `rows` take the same `values`; each row becomes a `T` by `row`.
/// Returns the page and how many match in all.
async fn page<T>(
    client: &tokio_postgres::Client,
    count: &str,
    rows: &str,
    values: Vec<EventValue>,
    row: impl Fn(&tokio_postgres::Row) -> T,
) -> Result<(Vec<T>, u64), StoreError> {
    type Param = Box<dyn tokio_postgres::types::ToSql + Sync + Send>;
    let values: Vec<Param> = values
        .into_iter()
        .map(|v| -> Param {
            match v {
                EventValue::Text(t) => Box::new(t),
                EventValue::Int(i) => Box::new(i),
            }
        })
        .collect();
    let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = values
        .iter()
        .map(|v| v.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let total: i64 = client.query_one(count, &params).await?.get(0);
    let page = client.query(rows, &params).await?.iter().map(row).collect();
    Ok((page, u64::try_from(total).unwrap_or(0)))
}

impl PgStore {
    /// Connects to `url` and migrates the database.
    pub(crate) fn open(url: &str, password: Option<&Secret>) -> Result<PgStore, StoreError> {
        let (config, tls, link) = parse(url, password)?;
        if link.plaintext_remote {
            tracing::warn!(
                url = %super::redact_url(url),
                sslmode = link.mode,
                "the link to the database may run in plain text to a host off loopback: anyone on the path can read and alter sessions, connectors and the audit trail (drop sslmode for require, or give sslrootcert for verify-full)"
            );
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("reach-store")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Pool(format!("cannot start the driver's runtime: {e}")))?;
        let manager = Manager::from_config(
            config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(15)))
            .create_timeout(Some(Duration::from_secs(15)))
            .build()
            .map_err(|e| StoreError::Pool(e.to_string()))?;
        let (changes, _) = watch::channel(0);
        let store = PgStore {
            pool,
            rt: Some(rt),
            changes,
            listening: Arc::default(),
            standing: Mutex::default(),
            health_ends: Box::default(),
            address_ends: Box::default(),
            checkpoint_every_ms: AtomicI64::new(CHECKPOINT_EVERY_MS),
            shown: super::redact_url(url),
            link,
        };
        store
            .block(store.migrate())
            .map_err(|e| tls_refused(e, link))?;
        if let Some(rt) = &store.rt {
            rt.spawn(listen(
                config,
                tls,
                store.changes.clone(),
                store.listening.clone(),
            ));
        }
        Ok(store)
    }

    /// Runs `f` to completion on the calling thread, with the driver's
    /// connections served by this store's runtime.
    fn block<T>(&self, f: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        let Some(rt) = &self.rt else {
            return Err(StoreError::Pool("the store is shutting down".into()));
        };
        let _entered = rt.enter();
        futures::executor::block_on(f)
    }

    /// What is wrong with the link to the database, if anything: plain
    /// text to a host off loopback.
    pub(crate) fn link_warning(&self) -> Option<String> {
        self.link.plaintext_remote.then(|| {
            format!(
                "the link to the database may run in plain text to a host off loopback \
                 (sslmode={}): anyone on the path can read and alter sessions, connectors and \
                 the audit trail",
                self.link.mode
            )
        })
    }

    /// How many changes were announced (and listens begun) so far.
    pub(crate) fn announced(&self) -> u64 {
        *self.changes.borrow()
    }

    /// What `f` finds in the standing readings, if it was read at the
    /// current announcement count, less than `STANDING_FOR` before `now`,
    /// and the listener listens; `None` (ask the database) otherwise.
    fn standing<R>(
        &self,
        now: Instant,
        f: impl FnOnce(&Standing) -> Option<(Instant, R)>,
    ) -> Option<R> {
        if !self.listening.load(Ordering::Acquire) {
            return None;
        }
        let at = self.announced();
        let standing = lock(&self.standing);
        if standing.at != at {
            return None;
        }
        let (read, found) = f(&standing)?;
        (now.saturating_duration_since(read) < STANDING_FOR).then_some(found)
    }

    /// Keeps `f`'s reading, taken at announcement count `at`, unless
    /// something was announced since.
    fn remember(&self, at: u64, f: impl FnOnce(&mut Standing)) {
        let mut standing = lock(&self.standing);
        if self.announced() != at {
            return;
        }
        if standing.at != at {
            *standing = Standing {
                at,
                ..Standing::default()
            };
        }
        f(&mut standing);
    }

    /// Whether connector `name` is disabled at `now`, by the last reading
    /// of the disabled connectors, if it still holds (`standing`).
    pub(crate) fn known_disabled(&self, name: &str, now: Instant) -> Option<bool> {
        self.standing(now, |s| {
            let (read, disabled) = s.disabled.as_ref()?;
            Some((*read, disabled.contains(name)))
        })
    }

    /// Whether `group`'s key `key_sha256` is revoked at `now`, by the last
    /// reading of it, if it still holds (`standing`).
    pub(crate) fn known_revoked(
        &self,
        group: &str,
        key_sha256: &str,
        now: Instant,
    ) -> Option<bool> {
        self.standing(now, |s| s.revoked.get(group)?.get(key_sha256).copied())
    }

    /// Whether the listener listens (tests).
    #[cfg(test)]
    pub(crate) fn listens(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// A receiver woken on every change this replica commits and every
    /// `NOTIFY` of another replica's.
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => StoreError::Postgres(e),
            other => StoreError::Pool(other.to_string()),
        })
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // One replica migrates; the others wait here, then find it done.
        tx.execute("SELECT pg_advisory_xact_lock(7265636801)", &[])
            .await?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS reach_schema (version BIGINT NOT NULL);")
            .await?;
        let version: Option<i64> = tx
            .query_opt("SELECT version FROM reach_schema", &[])
            .await?
            .map(|r| r.get(0));
        if version.is_none() {
            tx.execute("INSERT INTO reach_schema (version) VALUES (0)", &[])
                .await?;
        }
        let version = version.unwrap_or(0);
        let known = SCHEMA_VERSION;
        if version > known as i64 {
            return Err(StoreError::TooNew {
                found: version,
                known,
            });
        }
        for (i, migration) in MIGRATIONS.iter().enumerate().skip(version.max(0) as usize) {
            tx.batch_execute(migration.sql).await?;
            tx.execute("UPDATE reach_schema SET version = $1", &[&((i + 1) as i64)])
                .await?;
            tracing::info!(version = i + 1, step = migration.file, "database migrated");
        }
        tx.commit().await?;
        Ok(())
    }

    /// A trivial query on a pooled connection (a dead pooled connection
    /// or a stopped server is an error).
    pub(crate) fn ping(&self) -> Result<(), StoreError> {
        self.block(async {
            let client = self.client().await?;
            client.simple_query("SELECT 1").await?;
            Ok(())
        })
    }

    #[cfg(test)]
    pub(crate) fn break_for_tests(&self) {
        // As if the tables had gone longer ago than a standing reading lasts.
        *lock(&self.standing) = Standing::default();
        let dropped = self.block(async {
            let client = self.client().await?;
            client
                .batch_execute(
                    "DROP TABLE certificate_grace; DROP TABLE certificates; DROP TABLE connectors;",
                )
                .await?;
            Ok(())
        });
        assert!(dropped.is_ok(), "{dropped:?}");
    }
}
