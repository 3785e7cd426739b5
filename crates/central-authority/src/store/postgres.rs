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

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures::StreamExt;
use rustls::pki_types::pem::PemObject;
use tokio::sync::watch;
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, IsolationLevel, Row, Transaction};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::ends::{Ends, LatestRow};
use super::migrations::{Migration, migrations};
use super::rules::{self, KeyRow, NameClaim, NameRow};
use super::{
    AddressEventRecord, AuditFilter, AuditRecord, CertHistory, CertRecord, ConnectorRecord,
    DrainRecord, EnrollRefusal, EventFilter, EventRecord, EventValue, HistoryRow, KeyUsage,
    LoginRecord, NewCertificate, RenewRefusal, Renewal, ReplicaRecord, SessionRecord, StoreError,
    fresh_rows,
};
use crate::ground::clock::now_ms;
use crate::ground::secret::Secret;
use crate::ground::sync::lock;

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
/// last file of `MIGRATIONS`.
pub(super) const SCHEMA_VERSION: usize = 17;
const _: () = assert!(MIGRATIONS.len() == SCHEMA_VERSION);

/// The columns [`session_row`] reads, in its order.
const SESSION_COLUMNS: &str = "id_sha256, person, provider, scopes, created_ms, expires_ms, \
     revoked_ms, subject, sid, roles, checked_ms, refresh_sealed";

fn session_row(r: &tokio_postgres::Row) -> SessionRecord {
    SessionRecord {
        id_sha256: r.get(0),
        person: r.get(1),
        provider: r.get(2),
        scopes: r.get(3),
        created_ms: r.get(4),
        expires_ms: r.get(5),
        revoked_ms: r.get(6),
        subject: r.get(7),
        sid: r.get(8),
        roles: r.get(9),
        checked_ms: r.get(10),
        refresh_sealed: r.get(11),
    }
}

/// A history row's first nine columns (the status and the address
/// history select them alike).
fn event_row(r: &tokio_postgres::Row) -> EventRecord {
    EventRecord {
        at_ms: r.get(0),
        segment: r.get(1),
        host: r.get(2),
        protocol: r.get(3),
        port: r.get(4),
        connector: r.get(5),
        from: r.get(6),
        to: r.get(7),
        cause: r.get(8),
    }
}

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

/// `e` naming the `sslmode` when TLS is what failed: the operator's fix is
/// a server that offers TLS, the right root, or the mode.
fn tls_refused(e: StoreError, link: Link) -> StoreError {
    let text = e.to_string();
    if link.mode == "disable" || !(text.contains("TLS") || text.contains("certificate")) {
        return e;
    }
    StoreError::Pool(format!(
        "{text} (sslmode={}: the server must offer TLS with a certificate for its name from \
         the sslrootcert root or the system's; sslmode=disable only on a trusted network)",
        link.mode
    ))
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

/// The `sslmode` a link gets, and whether it may run in plain text to a
/// host off loopback (an attacker on the path could then read and alter
/// sessions, connectors and the audit trail: warned about).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    /// The mode in force, as libpq names it.
    pub(crate) mode: &'static str,
    /// A host is off loopback and the mode lets the link be plain text
    /// (`disable`, `allow`, `prefer`: each only by the operator's choice).
    pub(crate) plaintext_remote: bool,
}

/// Whether `host` (a URL's host: a name, an address or a unix socket
/// directory) is this machine.
fn is_local(host: &tokio_postgres::config::Host) -> bool {
    match host {
        tokio_postgres::config::Host::Unix(_) => true,
        tokio_postgres::config::Host::Tcp(name) => {
            let bare = name.trim_start_matches('[').trim_end_matches(']');
            policy::host::Host::parse(bare).is_ok_and(|h| match h.ip() {
                Some(ip) => is_loopback(ip),
                None => h.as_str() == "localhost",
            })
        }
    }
}

/// Whether `ip` is a loopback address (IPv4-mapped ones too).
fn is_loopback(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
        v4 => v4.is_loopback(),
    }
}

/// The link for `hosts` (and their `hostaddr`s) with the URL's own
/// `sslmode`, if any: without one, `verify-full` when a root is given
/// (`sslrootcert`), else `require` if any host or address is off loopback,
/// and `prefer` on loopback and unix sockets.
pub(crate) fn link(
    (hosts, addrs): (&[tokio_postgres::config::Host], &[std::net::IpAddr]),
    explicit: Option<&str>,
    root: bool,
) -> Result<Link, String> {
    let remote = hosts.iter().any(|h| !is_local(h)) || addrs.iter().any(|a| !is_loopback(*a));
    let mode = match explicit {
        Some("disable") => "disable",
        Some("allow") => "allow",
        Some("prefer") => "prefer",
        Some("require") => "require",
        Some("verify-ca") => "verify-ca",
        Some("verify-full") => "verify-full",
        Some(other) => {
            return Err(format!(
                "url: sslmode {other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            ));
        }
        None if root => "verify-full",
        None if remote => "require",
        None => "prefer",
    };
    Ok(Link {
        mode,
        plaintext_remote: remote && matches!(mode, "disable" | "allow" | "prefer"),
    })
}

/// The driver's `SslMode` for a libpq mode name: every mode that uses TLS
/// verifies the server's certificate, name included (`require` and
/// `verify-ca` are as strict as `verify-full`).
fn driver_mode(mode: &str) -> SslMode {
    match mode {
        "disable" => SslMode::Disable,
        "allow" | "prefer" => SslMode::Prefer,
        _ => SslMode::Require,
    }
}

/// `url` without its `sslmode` and `sslrootcert` (which the driver does not
/// take), parsed, with the link it gets and its root file.
pub(crate) fn parse_url(
    url: &str,
) -> Result<(tokio_postgres::Config, Link, Option<std::path::PathBuf>), StoreError> {
    let bad = |m: String| StoreError::Config(m);
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(bad(format!(
            "url {:?} is neither a file path nor a postgres:// URL",
            super::redact_url(url)
        )));
    }
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept = Vec::new();
    let mut explicit = None;
    let mut root = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "sslmode" => explicit = Some(v),
            "sslrootcert" => root = Some(std::path::PathBuf::from(v)),
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    let config: tokio_postgres::Config = rest
        .parse()
        .map_err(|e| bad(format!("url {}: {e}", super::redact_url(url))))?;
    let hosts = (config.get_hosts(), config.get_hostaddrs());
    let link = link(hosts, explicit, root.is_some()).map_err(bad)?;
    Ok((config, link, root))
}

/// The driver's configuration and TLS connector for `url`: `sslmode`
/// (default: [`link`]) and `sslrootcert` (a PEM file; default the system's
/// roots) are read here. The server's certificate is always verified, name
/// included.
fn parse(
    url: &str,
    password: Option<&Secret>,
) -> Result<(tokio_postgres::Config, MakeRustlsConnect, Link), StoreError> {
    let bad = |m: String| StoreError::Config(m);
    let (mut config, link, root) = parse_url(url)?;
    let mode = driver_mode(link.mode);
    config.ssl_mode(mode);
    if config.get_password().is_none()
        && let Some(p) = password
    {
        config.password(p.expose());
    }
    if config.get_application_name().is_none() {
        config.application_name("reach-central-authority");
    }
    config.connect_timeout(Duration::from_secs(10));
    let roots = root_store(root.as_deref(), mode)?;
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| bad(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok((config, MakeRustlsConnect::new(tls), link))
}

/// The roots the server's certificate is verified against: the PEM file
/// `root` (`sslrootcert`), or the system's unless TLS is off.
fn root_store(
    root: Option<&std::path::Path>,
    mode: SslMode,
) -> Result<rustls::RootCertStore, StoreError> {
    let bad = |m: String| StoreError::Config(m);
    let mut roots = rustls::RootCertStore::empty();
    match root {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| bad(format!("sslrootcert {}: {e}", path.display())))?;
            let certs = rustls::pki_types::CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(format!("sslrootcert {}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(bad(format!(
                    "sslrootcert {}: no certificate in it",
                    path.display()
                )));
            }
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| bad(format!("sslrootcert {}: {e}", path.display())))?;
            }
        }
        None if mode != SslMode::Disable => {
            let found = rustls_native_certs::load_native_certs();
            for c in found.certs {
                let _ = roots.add(c);
            }
        }
        None => {}
    }
    Ok(roots)
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

/// A `connector_drains` row (connector, since_ms, actor_kind, actor).
fn drain_from_row(r: &Row) -> DrainRecord {
    DrainRecord {
        connector: r.get(0),
        since_ms: r.get(1),
        actor_kind: r.get(2),
        actor: r.get(3),
    }
}

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
            let result: Result<_, StoreError> = NOTIFIED
                .scope(std::cell::Cell::new(false), async {
                    let mut client = $self.client().await?;
                    let txn = client
                        .build_transaction()
                        .isolation_level(IsolationLevel::Serializable)
                        .start()
                        .await?;
                    let $tx: &Transaction<'_> = &txn;
                    let out: Result<_, StoreError> = $body;
                    let out = out?;
                    txn.commit().await?;
                    if NOTIFIED.with(std::cell::Cell::get) {
                        $self.changes.send_modify(|v| *v = v.wrapping_add(1));
                    }
                    Ok(out)
                })
                .await;
            match result {
                Err(e) if retryable(&e) && attempt < ATTEMPTS => backoff(attempt).await,
                other => break other,
            }
        }
    }};
}

/// A random pause before try `attempt + 1`, growing with `attempt`.
async fn backoff(attempt: u32) {
    let ceiling = 2u64 << attempt.min(7);
    let pause = 1 + rand::random::<u64>() % ceiling;
    tokio::time::sleep(Duration::from_millis(pause)).await;
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

    pub(crate) fn record_events(
        &self,
        events: &[EventRecord],
    ) -> Result<Vec<EventRecord>, StoreError> {
        self.record(events)
    }

    /// Appends the rows of `events` not yet recorded, in one writer's turn
    /// (the status and the address history alike); the rows this turn
    /// appended (not those another replica appended first).
    fn record<R: Appended + Clone>(&self, events: &[R]) -> Result<Vec<R>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        self.block(async {
            let mut ends = R::ends(self).lock().await;
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            // Every replica sees every transition (each connector reports to
            // each replica) and records it: a transition to the status the
            // history already ends with for this (application, connector)
            // is a copy and is skipped. Writers take turns (a transaction
            // lock), and each first reads the rows the others appended
            // since its last turn. Four statements per batch, whatever its
            // size, and the checkpoint's when it is due.
            tx.batch_execute(HISTORY_TURN).await?;
            let due = catch_up(&tx, &R::HISTORY, &mut ends, self.checkpoint_every()).await?;
            let mut latest = ends.latest_for(events);
            let (rows, last) = fresh_rows(events, &mut latest);
            let written = match rows.is_empty() {
                true => None,
                false => Some(R::insert(&tx, &rows).await?),
            };
            let checkpoint = match due {
                true => Some(checkpoint(&tx, &R::HISTORY, &ends).await?),
                false => None,
            };
            tx.commit().await?;
            settle(&mut ends, written, &last, checkpoint);
            Ok(rows.into_iter().cloned().collect())
        })
    }

    /// How far the latest tables may lag behind the histories.
    fn checkpoint_every(&self) -> i64 {
        self.checkpoint_every_ms.load(Ordering::Relaxed)
    }

    /// Writes the latest tables at every turn (tests).
    #[cfg(test)]
    pub(crate) fn checkpoint_always(&self) {
        self.checkpoint_every_ms.store(0, Ordering::Relaxed);
    }

    pub(crate) fn events(
        &self,
        f: &EventFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<EventRecord>, u64), StoreError> {
        let (count, rows, values) = History::STATUSES.listing(f, limit, offset);
        self.block(async {
            let client = self.client().await?;
            page(&client, &count, &rows, values, event_row).await
        })
    }

    /// Appends the address changes not yet recorded (see
    /// `Store::record_address_events`), as the status history's rows are.
    pub(crate) fn record_address_events(
        &self,
        events: &[AddressEventRecord],
    ) -> Result<(), StoreError> {
        self.record(events).map(drop)
    }

    /// One page of the address history matching `f`, newest first.
    pub(crate) fn address_events(
        &self,
        f: &EventFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<AddressEventRecord>, u64), StoreError> {
        let (count, rows, values) = History::ADDRESSES.listing(f, limit, offset);
        self.block(async {
            let client = self.client().await?;
            page(&client, &count, &rows, values, |r| AddressEventRecord {
                event: event_row(r),
                address: r.get(9),
            })
            .await
        })
    }

    pub(crate) fn prune_events(&self, before_ms: i64) -> Result<usize, StoreError> {
        self.block(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            // In the writers' turn, so that no checkpoint writes back an
            // end this removes.
            tx.batch_execute(HISTORY_TURN).await?;
            let n = tx
                .execute("DELETE FROM health_events WHERE at_ms < $1", &[&before_ms])
                .await?;
            // A key whose last row is older than the retention: no copy of
            // that row can still be on its way from another replica.
            tx.execute("DELETE FROM health_latest WHERE at_ms < $1", &[&before_ms])
                .await?;
            // The address history is kept as long.
            tx.execute("DELETE FROM address_events WHERE at_ms < $1", &[&before_ms])
                .await?;
            tx.execute("DELETE FROM address_latest WHERE at_ms < $1", &[&before_ms])
                .await?;
            // Every replica, this one too, forgets those ends at its next
            // turn (`catch_up`).
            tx.execute(
                "UPDATE history_ends SET pruned_ms = GREATEST(pruned_ms, $1)",
                &[&before_ms],
            )
            .await?;
            tx.commit().await?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }

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
        Ok(super::renewable(old, name, group, serial, now_ms))
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

    pub(crate) fn heartbeat(
        &self,
        r: &ReplicaRecord,
        forget_before_ms: i64,
    ) -> Result<(), StoreError> {
        let addresses = r.addresses.join(",");
        self.block(async {
            let client = self.client().await?;
            client
                .execute(
                    "INSERT INTO replicas (id, addresses, version, started_ms, heartbeat_ms, policy_hash)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (id) DO UPDATE SET addresses = $2, version = $3,
                         started_ms = $4, heartbeat_ms = $5, policy_hash = $6",
                    &[
                        &r.id,
                        &addresses,
                        &r.version,
                        &r.started_ms,
                        &r.heartbeat_ms,
                        &r.policy_hash,
                    ],
                )
                .await?;
            client
                .execute(
                    "DELETE FROM replicas WHERE heartbeat_ms < $1",
                    &[&forget_before_ms],
                )
                .await?;
            Ok(())
        })
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

    pub(crate) fn create_session(&self, r: &SessionRecord) -> Result<(), StoreError> {
        self.block(async {
            let client = self.client().await?;
            client
                .execute(
                    "DELETE FROM auth_sessions WHERE expires_ms < $1",
                    &[&r.created_ms],
                )
                .await?;
            client
                .execute(
                    "INSERT INTO auth_sessions
                         (id_sha256, person, provider, scopes, created_ms, expires_ms,
                          subject, sid, roles, checked_ms, refresh_sealed)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                    &[
                        &r.id_sha256,
                        &r.person,
                        &r.provider,
                        &r.scopes,
                        &r.created_ms,
                        &r.expires_ms,
                        &r.subject,
                        &r.sid,
                        &r.roles,
                        &r.checked_ms,
                        &r.refresh_sealed,
                    ],
                )
                .await?;
            Ok(())
        })
    }

    pub(crate) fn session(&self, id_sha256: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    &format!("SELECT {SESSION_COLUMNS} FROM auth_sessions WHERE id_sha256 = $1"),
                    &[&id_sha256],
                )
                .await?;
            Ok(row.as_ref().map(session_row))
        })
    }

    pub(crate) fn sessions(&self, now_ms: i64) -> Result<Vec<SessionRecord>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    &format!(
                        "SELECT {SESSION_COLUMNS} FROM auth_sessions
                         WHERE revoked_ms IS NULL AND expires_ms > $1 ORDER BY created_ms DESC"
                    ),
                    &[&now_ms],
                )
                .await?;
            Ok(rows.iter().map(session_row).collect())
        })
    }

    pub(crate) fn claim_session_check(
        &self,
        id_sha256: &str,
        seen_checked_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let n = client
                .execute(
                    "UPDATE auth_sessions SET checked_ms = $3
                     WHERE id_sha256 = $1 AND checked_ms = $2",
                    &[&id_sha256, &seen_checked_ms, &now_ms],
                )
                .await?;
            Ok(n > 0)
        })
    }

    pub(crate) fn session_refreshed(
        &self,
        id_sha256: &str,
        roles: &str,
        refresh_sealed: Option<&str>,
    ) -> Result<(), StoreError> {
        self.block(async {
            let client = self.client().await?;
            client
                .execute(
                    "UPDATE auth_sessions
                     SET roles = $2, refresh_sealed = COALESCE($3, refresh_sealed)
                     WHERE id_sha256 = $1",
                    &[&id_sha256, &roles, &refresh_sealed],
                )
                .await?;
            Ok(())
        })
    }

    pub(crate) fn revoke_provider_sessions(
        &self,
        provider: &str,
        sid: Option<&str>,
        sub: Option<&str>,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        self.block(async {
            let client = self.client().await?;
            Ok(client
                .execute(
                    "UPDATE auth_sessions SET revoked_ms = $4
                     WHERE provider = $1 AND revoked_ms IS NULL
                       AND (($2::TEXT IS NOT NULL AND sid = $2)
                            OR ($2::TEXT IS NULL AND subject = $3))",
                    &[&provider, &sid, &sub, &now_ms],
                )
                .await?)
        })
    }

    pub(crate) fn logout_token_once(
        &self,
        provider: &str,
        jti: &str,
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.block(async {
            let client = self.client().await?;
            client
                .execute(
                    "DELETE FROM auth_logout_tokens WHERE expires_ms < $1",
                    &[&now_ms],
                )
                .await?;
            let n = client
                .execute(
                    "INSERT INTO auth_logout_tokens (provider, jti, expires_ms) VALUES ($1, $2, $3)
                     ON CONFLICT (provider, jti) DO NOTHING",
                    &[&provider, &jti, &expires_ms],
                )
                .await?;
            Ok(n > 0)
        })
    }

    pub(crate) fn revoke_session(&self, id_sha256: &str, now_ms: i64) -> Result<bool, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let n = client
                .execute(
                    "UPDATE auth_sessions SET revoked_ms = $2
                     WHERE id_sha256 = $1 AND revoked_ms IS NULL",
                    &[&id_sha256, &now_ms],
                )
                .await?;
            Ok(n > 0)
        })
    }

    pub(crate) fn put_login(&self, r: &LoginRecord, now_ms: i64) -> Result<(), StoreError> {
        self.block(async {
            let client = self.client().await?;
            client
                .execute("DELETE FROM auth_logins WHERE expires_ms < $1", &[&now_ms])
                .await?;
            client
                .execute(
                    "INSERT INTO auth_logins
                         (state_sha256, provider, verifier, nonce, next, expires_ms)
                     VALUES ($1, $2, $3, $4, $5, $6)",
                    &[
                        &r.state_sha256,
                        &r.provider,
                        &r.verifier,
                        &r.nonce,
                        &r.next,
                        &r.expires_ms,
                    ],
                )
                .await?;
            Ok(())
        })
    }

    pub(crate) fn take_login(
        &self,
        state_sha256: &str,
        now_ms: i64,
    ) -> Result<Option<LoginRecord>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "DELETE FROM auth_logins WHERE state_sha256 = $1
                     RETURNING state_sha256, provider, verifier, nonce, next, expires_ms",
                    &[&state_sha256],
                )
                .await?;
            Ok(row
                .map(|r| LoginRecord {
                    state_sha256: r.get(0),
                    provider: r.get(1),
                    verifier: r.get(2),
                    nonce: r.get(3),
                    next: r.get(4),
                    expires_ms: r.get(5),
                })
                .filter(|l| l.expires_ms >= now_ms))
        })
    }

    pub(crate) fn remove_replica(&self, id: &str) -> Result<(), StoreError> {
        self.block(async {
            let client = self.client().await?;
            client
                .execute("DELETE FROM replicas WHERE id = $1", &[&id])
                .await?;
            Ok(())
        })
    }

    pub(crate) fn shared_secret(
        &self,
        name: &str,
        candidate: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            // One statement: concurrent first uses agree on one value.
            client
                .execute(
                    "INSERT INTO shared_secrets (name, value) VALUES ($1, $2)
                     ON CONFLICT (name) DO NOTHING",
                    &[&name, &candidate],
                )
                .await?;
            let row = client
                .query_one("SELECT value FROM shared_secrets WHERE name = $1", &[&name])
                .await?;
            Ok(row.get(0))
        })
    }

    pub(crate) fn replicas(&self) -> Result<Vec<ReplicaRecord>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT id, addresses, version, started_ms, heartbeat_ms, policy_hash
                     FROM replicas ORDER BY id",
                    &[],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| ReplicaRecord {
                    id: r.get(0),
                    addresses: super::split_addresses(r.get(1)),
                    version: r.get(2),
                    started_ms: r.get(3),
                    heartbeat_ms: r.get(4),
                    policy_hash: r.get(5),
                })
                .collect())
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
    if let Err(refused) = super::renewable(old, &name, &group, &old_serial, now_ms) {
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

/// What a history writer runs first in its transaction: its turn. Writers
/// take turns on one transaction lock, so each reads every row the ones
/// before it committed, and the `seq` order of the rows is the order they
/// were committed in (the rows after the last one a replica read are the
/// ones it has not seen).
const HISTORY_TURN: &str = "SELECT pg_advisory_xact_lock(7265636802)";

/// Brings `ends` up to the history's last row, at the start of a writer's
/// turn: the checkpoint the first time (the latest table), then the rows
/// appended since it last looked (`seq` above `seen`), the others'
/// checkpoints and prunes. Whether this writer should write the checkpoint
/// (`every_ms` after the last).
async fn catch_up(
    tx: &Transaction<'_>,
    history: &History,
    ends: &mut Ends,
    every_ms: i64,
) -> Result<bool, StoreError> {
    let row = tx
        .query_one(
            "SELECT seq, at_ms, pruned_ms FROM history_ends WHERE name = $1",
            &[&history.name],
        )
        .await?;
    let (seq, at_ms, pruned_ms): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    match ends.seen {
        None => {
            let rows = tx.query(history.load, &[]).await?;
            ends.load(rows.iter().map(|r| latest_row(r, 0)), seq);
        }
        Some(_) => ends.checkpointed(seq),
    }
    ends.forget_before(pruned_ms);
    loop {
        let since = ends.seen.unwrap_or(seq);
        let rows = tx.query(history.since, &[&since]).await?;
        for r in &rows {
            ends.apply(r.get(0), latest_row(r, 1));
        }
        if rows.len() < SINCE_PAGE {
            return Ok(now_ms().saturating_sub(at_ms) >= every_ms);
        }
    }
}

/// Rows a writer reads at a time when it catches up (`History::since`,
/// whose `LIMIT` it is). A page this small also keeps the plan a walk of
/// the primary key from the last row read: on a table without statistics
/// yet PostgreSQL guesses a third of the table after it, and with no limit
/// or one of 10,000 it chose a sequential or bitmap scan and a sort, at
/// every turn (as long as the insert itself).
const SINCE_PAGE: usize = 1_000;

/// A latest row from columns `at`.. of `r`: host, port, subject, segment,
/// protocol, status, time.
fn latest_row(r: &Row, at: usize) -> LatestRow {
    LatestRow {
        host: r.get(at),
        port: r.get(at + 1),
        subject: r.get(at + 2),
        segment: r.get(at + 3),
        protocol: r.get(at + 4),
        to: r.get(at + 5),
        at_ms: r.get(at + 6),
    }
}

/// Writes the ends changed since the checkpoint to the latest table, in
/// chunks, and moves the checkpoint to the rows `ends` has seen. Returns
/// that `seq`.
async fn checkpoint(
    tx: &Transaction<'_>,
    history: &History,
    ends: &Ends,
) -> Result<i64, StoreError> {
    let dirty: Vec<&LatestRow> = ends.dirty().collect();
    for chunk in dirty.chunks(10_000) {
        let column = |f: fn(&LatestRow) -> &str| chunk.iter().map(|r| f(r)).collect::<Vec<&str>>();
        let ports: Vec<i64> = chunk.iter().map(|r| r.port).collect();
        let at: Vec<i64> = chunk.iter().map(|r| r.at_ms).collect();
        tx.execute(
            history.upsert,
            &[
                &column(|r| &r.host),
                &ports,
                &column(|r| &r.subject),
                &column(|r| &r.segment),
                &column(|r| &r.protocol),
                &column(|r| &r.to),
                &at,
            ],
        )
        .await?;
    }
    let seq = ends.seen.unwrap_or(0);
    tx.execute(
        "UPDATE history_ends SET seq = $2, at_ms = $3 WHERE name = $1",
        &[&history.name, &seq, &now_ms()],
    )
    .await?;
    Ok(seq)
}

/// After a writer's turn committed: its own rows (`last`, the last per
/// key, the batch's highest `seq` `written`) and its checkpoint are part of
/// what it knows.
fn settle<R: HistoryRow>(
    ends: &mut Ends,
    written: Option<i64>,
    last: &[&R],
    checkpoint: Option<i64>,
) {
    if let Some(seq) = written {
        for r in last {
            ends.apply(seq, LatestRow::of(*r));
        }
    }
    if let Some(seq) = checkpoint {
        ends.checkpointed(seq);
    }
}

/// Appends `new` to `history` (one statement; `address` the address
/// history's tenth column); the highest `seq` given.
async fn append(
    tx: &Transaction<'_>,
    history: &History,
    new: &Columns<'_>,
    address: Option<&[&str]>,
) -> Result<i64, StoreError> {
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
        &new.at_ms,
        &new.segment,
        &new.host,
        &new.protocol,
        &new.port,
        &new.connector,
        &new.from,
        &new.to,
        &new.cause,
    ];
    if let Some(address) = &address {
        params.push(address);
    }
    Ok(tx.query_one(history.append, &params).await?.get(0))
}

/// A history (`health_events`, `address_events`) and its latest table
/// (`health_latest`, `address_latest`): the statements a writer's turn
/// reads and writes them with.
struct History {
    /// Its row in `history_ends`.
    name: &'static str,
    /// The history's table.
    table: &'static str,
    /// The columns a listing reads: the nine of an `EventRecord`, then the
    /// address (the address history).
    columns: &'static str,
    /// Its text columns indexed by their hash (`{column}_hash`).
    hashed: &'static [&'static str],
    /// The latest table: host, port, subject, segment, protocol, status,
    /// time.
    load: &'static str,
    /// The history's next rows after `seq` `$1` (`SINCE_PAGE` of them at
    /// most, which bounds a starting replica's reads), in order: `seq`,
    /// then the latest table's columns.
    since: &'static str,
    /// Inserts or updates latest rows by key: `$1`..`$5` the key, `$6` the
    /// statuses, `$7` the times.
    upsert: &'static str,
    /// Appends rows in the order given: `$1`..`$9` the columns of
    /// `Columns`, `$10` the addresses (the address history); the highest
    /// `seq` comes back.
    append: &'static str,
}

/// A history's columns: the nine of an `EventRecord` in `event_row`'s
/// order, then `$column` (the address history's address).
macro_rules! history_columns {
    ($column:literal) => {
        concat!(
            "at_ms, segment, host, protocol, port, connector, from_status, to_status, cause",
            $column
        )
    };
}

/// The statements of history `$events` and latest table `$latest`, whose
/// key's third column is `$subject`; the history has `$column` (its
/// `$param`) beside the nine columns both have (the two differ in nothing
/// else).
macro_rules! history {
    ($name:literal, $events:literal, $latest:literal, $subject:literal, $column:literal, $param:literal, $hashed:expr) => {
        History {
            name: $name,
            table: $events,
            columns: history_columns!($column),
            hashed: $hashed,
            load: concat!(
                "SELECT host, port, ", $subject, ", segment, protocol, to_status, at_ms FROM ", $latest
            ),
            since: concat!(
                "SELECT seq, host, port, ", $subject, ", segment, protocol, to_status, at_ms
                 FROM ", $events, " WHERE seq > $1 ORDER BY seq LIMIT 1000"
            ),
            upsert: concat!(
                "INSERT INTO ", $latest, " (host, port, ", $subject, ", segment, protocol, to_status, at_ms)
                 SELECT * FROM unnest($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::TEXT[], $5::TEXT[],
                                      $6::TEXT[], $7::BIGINT[])
                 ON CONFLICT (host, port, ", $subject, ", segment, protocol)
                 DO UPDATE SET to_status = EXCLUDED.to_status, at_ms = EXCLUDED.at_ms"
            ),
            append: concat!(
                "WITH i AS (INSERT INTO ", $events, " (", history_columns!($column), ")
                 SELECT ", history_columns!($column), "
                 FROM unnest($1::BIGINT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::BIGINT[],
                             $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::TEXT[]", $param, ")
                      WITH ORDINALITY AS r(", history_columns!($column), ", n)
                 ORDER BY n
                 RETURNING seq)
                 SELECT max(seq) FROM i"
            ),
        }
    };
}

impl History {
    const STATUSES: History = history!(
        "health",
        "health_events",
        "health_latest",
        "connector",
        "",
        "",
        &["host", "segment"]
    );
    const ADDRESSES: History = history!(
        "address",
        "address_events",
        "address_latest",
        "address",
        ", address",
        ", $10::TEXT[]",
        &["host", "address"]
    );

    /// One page of the history matching `f`, newest first: how many match,
    /// the page, and the values both take.
    fn listing(
        &self,
        f: &EventFilter,
        limit: u32,
        offset: u64,
    ) -> (String, String, Vec<EventValue>) {
        let (filter, values) = f.to_sql_hashed(|n| format!("${n}"), self.hashed);
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        let (table, columns) = (self.table, self.columns);
        (
            format!("SELECT COUNT(*) FROM {table}{filter}"),
            format!(
                "SELECT {columns} FROM {table}{filter}
                 ORDER BY at_ms DESC, seq DESC LIMIT {limit} OFFSET {offset}"
            ),
            values,
        )
    }
}

/// A row of one of the two histories as a writer's turn appends it: the
/// history's statements, where a store knows it ends, and its insert.
trait Appended: HistoryRow + Sized {
    const HISTORY: History;
    fn ends(store: &PgStore) -> &tokio::sync::Mutex<Ends>;
    /// Appends `rows` (one statement); the highest `seq` given.
    async fn insert(tx: &Transaction<'_>, rows: &[&Self]) -> Result<i64, StoreError>;
}

impl Appended for EventRecord {
    const HISTORY: History = History::STATUSES;
    fn ends(store: &PgStore) -> &tokio::sync::Mutex<Ends> {
        &store.health_ends
    }
    async fn insert(tx: &Transaction<'_>, rows: &[&Self]) -> Result<i64, StoreError> {
        append(tx, &Self::HISTORY, &Columns::of(rows.iter().copied()), None).await
    }
}

impl Appended for AddressEventRecord {
    const HISTORY: History = History::ADDRESSES;
    fn ends(store: &PgStore) -> &tokio::sync::Mutex<Ends> {
        &store.address_ends
    }
    async fn insert(tx: &Transaction<'_>, rows: &[&Self]) -> Result<i64, StoreError> {
        let new = Columns::of(rows.iter().map(|r| &r.event));
        let addresses: Vec<&str> = rows.iter().map(|r| r.address.as_str()).collect();
        append(tx, &Self::HISTORY, &new, Some(&addresses)).await
    }
}

/// History rows as one array per column, for `unnest` (one statement per
/// batch instead of one per row).
#[derive(Default)]
struct Columns<'a> {
    at_ms: Vec<i64>,
    segment: Vec<&'a str>,
    host: Vec<&'a str>,
    protocol: Vec<&'a str>,
    port: Vec<i64>,
    connector: Vec<&'a str>,
    from: Vec<&'a str>,
    to: Vec<&'a str>,
    cause: Vec<&'a str>,
}

impl<'a> Columns<'a> {
    fn of(rows: impl Iterator<Item = &'a EventRecord>) -> Columns<'a> {
        let mut c = Columns::default();
        for e in rows {
            c.at_ms.push(e.at_ms);
            c.segment.push(&e.segment);
            c.host.push(&e.host);
            c.protocol.push(&e.protocol);
            c.port.push(e.port);
            c.connector.push(&e.connector);
            c.from.push(&e.from);
            c.to.push(&e.to);
            c.cause.push(&e.cause);
        }
        c
    }
}

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

#[cfg(test)]
mod tests {
    use crate::store::{AddressEventRecord, EventFilter, Store, pg_backend, suite::event};

    /// A runtime for a test's own clients.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    /// A fresh database with the store's tables.
    fn migrated() -> String {
        let url = test_support::Postgres::shared()
            .fresh_database()
            .expect("database");
        drop(super::super::postgres_store(&url));
        url
    }

    /// A client of `url` on the current runtime.
    async fn connect(url: &str) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        client
    }

    /// The sizes of the latest tables' primary keys, in bytes.
    async fn key_sizes(client: &tokio_postgres::Client) -> (i64, i64) {
        let row = client
            .query_one(
                "SELECT pg_relation_size('health_latest_pkey'), pg_relation_size('address_latest_pkey')",
                &[],
            )
            .await
            .expect("sizes");
        (row.get(0), row.get(1))
    }

    /// Checkpoints move each key's latest row within its page (HOT
    /// updates): the latest tables' primary keys gain no entry however
    /// often the same keys flip, and each key ends with its last status.
    /// A checkpoint may update keys and insert new ones at once.
    #[test]
    fn checkpoints_move_the_latest_rows_in_place() {
        // A server of its own: a transaction open in another database of a
        // shared server can keep PostgreSQL from pruning old row versions
        // as it goes (vacuum removes them later), and an update that finds
        // its page full then moves its row.
        let pg = test_support::Postgres::start().expect("PostgreSQL");
        let url = pg.fresh_database().expect("database");
        let store = super::super::postgres_store(&url);
        pg_backend(&store).checkpoint_always();
        let keys = 2_000;
        let batch = |round: i64, n: usize| -> (Vec<_>, Vec<_>) {
            let to = if round % 2 == 0 { "up" } else { "down" };
            let statuses: Vec<_> = (0..n)
                .map(|k| {
                    event(
                        round * 10_000 + k as i64,
                        &format!("a{}.test", k % 100),
                        &format!("c{k}"),
                        to,
                    )
                })
                .collect();
            let addresses = statuses
                .iter()
                .enumerate()
                .map(|(k, e)| AddressEventRecord {
                    event: e.clone(),
                    address: format!("10.0.{}.{}", k / 200, k % 200),
                })
                .collect();
            (statuses, addresses)
        };
        let rt = runtime();
        rt.block_on(async {
            let client = connect(&url).await;
            // No autovacuum ANALYZE of these tables meanwhile: its snapshot
            // keeps the old row versions from being pruned, and an update
            // that finds its page full moves its row, as under any long
            // transaction.
            client
                .batch_execute(
                    "ALTER TABLE health_events SET (autovacuum_enabled = false);
                     ALTER TABLE health_latest SET (autovacuum_enabled = false);
                     ALTER TABLE address_events SET (autovacuum_enabled = false);
                     ALTER TABLE address_latest SET (autovacuum_enabled = false);",
                )
                .await
                .expect("autovacuum off");
            // Each turn's checkpoint writes the turns before it: half the
            // keys first, then the other half beside updates of the first.
            for round in 0..3 {
                let (statuses, addresses) = batch(round, if round == 0 { keys / 2 } else { keys });
                store.record_events(&statuses).expect("recorded");
                store.record_address_events(&addresses).expect("recorded");
            }
            let before = key_sizes(&client).await;
            for round in 3..13 {
                let (statuses, addresses) = batch(round, keys);
                store.record_events(&statuses).expect("recorded");
                store.record_address_events(&addresses).expect("recorded");
            }
            assert_eq!(key_sizes(&client).await, before, "the primary keys grew: updates that were not HOT");
            for table in ["health_latest", "address_latest"] {
                let row = client
                    .query_one(
                        &format!(
                            "SELECT count(*), count(*) FILTER (WHERE to_status = 'down'), min(at_ms) FROM {table}"
                        ),
                        &[],
                    )
                    .await
                    .expect("latest");
                let (n, down, oldest): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
                assert_eq!((n, down, oldest), (keys as i64, keys as i64, 110_000), "{table}");
            }
        });
        // Every transition is in the history once: the first half's Up,
        // then twelve flips of every key (the other half's first one Down).
        let (_, total) = store.events(&EventFilter::default(), 1, 0).expect("read");
        assert_eq!(total, (keys / 2 + 12 * keys) as u64);
    }

    /// The latest tables' key columns compare bytes, whatever the
    /// database's locale (strcoll made a transition cost about 35 % more
    /// in a C.UTF-8 database), and the histories' indexes hold no text
    /// (each text's hash).
    #[test]
    fn the_histories_keys_compare_bytes_in_any_locale() {
        let pg = test_support::Postgres::shared();
        let url = pg.fresh_database_in("C.UTF-8").expect("database");
        drop(super::super::postgres_store(&url));
        let rt = runtime();
        rt.block_on(async {
            let client = connect(&url).await;
            let locale: String = client
                .query_one("SELECT datcollate FROM pg_database WHERE datname = current_database()", &[])
                .await
                .expect("locale")
                .get(0);
            assert_eq!(locale, "C.UTF-8");
            // Every text column of every index of the four tables.
            let rows = client
                .query(
                    "SELECT c.relname || '.' || a.attname, coalesce(l.collname, 'default')
                     FROM pg_index i
                     JOIN pg_class c ON c.oid = i.indrelid
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                     LEFT JOIN pg_collation l ON l.oid = a.attcollation
                     WHERE c.relname IN ('health_events', 'health_latest', 'address_events', 'address_latest')
                       AND a.atttypid = 'text'::regtype
                     ORDER BY 1",
                    &[],
                )
                .await
                .expect("columns");
            let columns: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
            assert_eq!(columns.len(), 8, "{columns:?}");
            assert!(
                columns.iter().all(|(c, _)| c.contains("_latest.")),
                "{columns:?}"
            );
            for (column, collation) in &columns {
                assert_eq!(collation, "C", "{column}");
            }
        });
    }

    /// The latest tables and their checkpoint row, read with `client`:
    /// each key's status (host/connector), and the `seq` they hold the
    /// status history up to.
    async fn checkpoint_of(client: &tokio_postgres::Client) -> (Vec<(String, String)>, i64) {
        let rows = client
            .query(
                "SELECT host || '/' || connector, to_status FROM health_latest ORDER BY 1",
                &[],
            )
            .await
            .expect("latest");
        let seq = client
            .query_one("SELECT seq FROM history_ends WHERE name = 'health'", &[])
            .await
            .expect("checkpoint")
            .get(0);
        (rows.iter().map(|r| (r.get(0), r.get(1))).collect(), seq)
    }

    /// A turn writes only the history until the checkpoint is due; the
    /// checkpoint holds the rows before that turn. A replica started later
    /// compares its copies with the checkpoint and the rows after it, and
    /// forgets what another replica pruned.
    #[test]
    fn ends_are_checkpointed_read_back_by_a_later_replica_and_pruned() {
        let url = test_support::Postgres::shared()
            .fresh_database()
            .expect("database");
        let a = super::super::postgres_store(&url);
        let rt = runtime();
        let client = rt.block_on(connect(&url));
        let total = |s: &Store| s.events(&EventFilter::default(), 1, 0).expect("read").1;
        let up = |k: &str| event(1_000, "a.test", k, "up");
        a.record_events(&[up("c1"), up("c2"), up("c3")])
            .expect("recorded");
        assert_eq!(rt.block_on(checkpoint_of(&client)), (vec![], 0), "not due");
        pg_backend(&a).checkpoint_always();
        a.record_events(&[event(2_000, "a.test", "c1", "down")])
            .expect("recorded");
        let ends = |v: [(&str, &str); 3]| {
            v.iter()
                .map(|(k, to)| (format!("a.test/{k}"), to.to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            rt.block_on(checkpoint_of(&client)),
            (ends([("c1", "up"), ("c2", "up"), ("c3", "up")]), 3),
            "the rows before the turn"
        );
        a.record_events(&[event(3_000, "a.test", "c2", "down")])
            .expect("recorded");
        assert_eq!(total(&a), 5);

        // Another replica, started now: the checkpoint (c1 down at seq 4)
        // and the row after it (c2 down).
        let b = super::super::postgres_store(&url);
        let appended = b
            .record_events(&[
                event(3_001, "a.test", "c1", "down"),
                event(3_001, "a.test", "c2", "down"),
                event(3_001, "a.test", "c3", "up"),
                event(3_002, "a.test", "c3", "down"),
            ])
            .expect("recorded");
        assert_eq!(total(&b), 6, "three copies skipped, c3's change kept");
        assert_eq!(
            appended,
            [event(3_002, "a.test", "c3", "down")],
            "the rows it appended, the ones a log receiver is sent"
        );
        // And the first replica reads the second's row before its own.
        let copy = a
            .record_events(&[event(3_003, "a.test", "c3", "down")])
            .expect("recorded");
        assert!(copy.is_empty(), "{copy:?}");
        assert_eq!(total(&a), 6, "a copy of the second replica's row");

        // Pruned by the first; the second then records c1 afresh.
        assert_eq!(a.prune_events(10_000).expect("pruned"), 6);
        b.record_events(&[event(11_000, "a.test", "c1", "down")])
            .expect("recorded");
        assert_eq!(
            total(&b),
            1,
            "past the retention, the status is recorded afresh"
        );
    }

    /// A writer catches up by walking each history's primary key from the
    /// last row it read, in pages, also on a table PostgreSQL has no
    /// statistics of yet (where it guessed a third of the table and chose a
    /// sequential scan).
    #[test]
    fn catching_up_walks_the_primary_key() {
        let url = migrated();
        let rt = runtime();
        rt.block_on(async {
            let mut client = connect(&url).await;
            for history in [super::History::STATUSES, super::History::ADDRESSES] {
                assert!(
                    history
                        .since
                        .ends_with(&format!("LIMIT {}", super::SINCE_PAGE)),
                    "{}",
                    history.since
                );
                let table = if history.name == "health" {
                    "health_events"
                } else {
                    "address_events"
                };
                client
                    .batch_execute(&format!(
                        "ALTER TABLE {table} SET (autovacuum_enabled = false);
                         INSERT INTO {table} (at_ms, segment, host, protocol, port, connector,
                                              from_status, to_status, cause{address})
                         SELECT i, 's', 'app-' || (i % 1000) || '.test', 'tcp', 80, 'c', 'up',
                                'down', 'report'{value}
                         FROM generate_series(1, 100000) i;",
                        address = if table == "address_events" {
                            ", address"
                        } else {
                            ""
                        },
                        value = if table == "address_events" {
                            ", '10.0.0.1'"
                        } else {
                            ""
                        },
                    ))
                    .await
                    .expect("filled");
                let tx = client.transaction().await.expect("transaction");
                tx.batch_execute(super::HISTORY_TURN).await.expect("turn");
                let plan: Vec<String> = tx
                    .query(&format!("EXPLAIN {}", history.since), &[&99_000_i64])
                    .await
                    .expect("explained")
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                tx.commit().await.expect("committed");
                let plan = plan.join("\n");
                assert!(
                    plan.contains(&format!("Index Scan using {table}_pkey")),
                    "{plan}"
                );
                assert!(
                    !plan.contains("Seq Scan") && !plan.contains("Sort"),
                    "{plan}"
                );
            }
        });
    }

    /// A listing by host, segment or address searches the index of the
    /// text's hash (an insert compares integers on its way down those
    /// indexes, not texts), and still compares the text itself.
    #[test]
    fn listings_search_the_indexes_of_the_texts_hashes() {
        let url = migrated();
        let rt = runtime();
        rt.block_on(async {
            let client = connect(&url).await;
            client
                .batch_execute(
                    "INSERT INTO health_events (at_ms, segment, host, protocol, port, connector,
                                                from_status, to_status, cause)
                     SELECT i, 's' || (i % 50), 'app-' || (i % 1000) || '.test', 'tcp', 80, 'c',
                            'up', 'down', 'report'
                     FROM generate_series(1, 50000) i;
                     INSERT INTO address_events (at_ms, segment, host, protocol, port, connector,
                                                 from_status, to_status, cause, address)
                     SELECT i, 's', 'app-' || (i % 1000) || '.test', 'tcp', 80, 'c', 'up',
                            'down', 'report', '10.0.' || (i % 200) || '.1'
                     FROM generate_series(1, 50000) i;
                     ANALYZE health_events; ANALYZE address_events;",
                )
                .await
                .expect("filled");
            let by =
                |host: Option<&str>, segment: Option<&str>, address: Option<&str>| EventFilter {
                    host: host.map(str::to_owned),
                    segment: segment.map(str::to_owned),
                    address: address.map(str::to_owned),
                    ..EventFilter::default()
                };
            for (history, filter, index, columns) in [
                (
                    super::History::STATUSES,
                    by(Some("app-7.test"), None, None),
                    "health_events_by_app",
                    &["host"][..],
                ),
                (
                    super::History::STATUSES,
                    by(None, Some("s7"), None),
                    "health_events_by_segment",
                    &["segment"],
                ),
                (
                    super::History::ADDRESSES,
                    by(Some("app-7.test"), None, None),
                    "address_events_by_app",
                    &["host"],
                ),
                (
                    super::History::ADDRESSES,
                    by(Some("app-7.test"), None, Some("10.0.7.1")),
                    "address_events_by_app",
                    &["host", "address"],
                ),
            ] {
                let (_, rows, values) = history.listing(&filter, 100, 0);
                let texts: Vec<&String> = values
                    .iter()
                    .map(|v| match v {
                        super::EventValue::Text(t) => t,
                        super::EventValue::Int(_) => panic!("text values only: {rows}"),
                    })
                    .collect();
                let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = texts
                    .iter()
                    .map(|t| *t as &(dyn tokio_postgres::types::ToSql + Sync))
                    .collect();
                let found = client.query(&rows, &params).await.expect("listed");
                assert!(!found.is_empty(), "{rows}");
                let plan: Vec<String> = client
                    .query(&format!("EXPLAIN {rows}"), &params)
                    .await
                    .expect("explained")
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                let plan = plan.join("\n");
                assert!(plan.contains(&format!(" {index}")), "{plan}");
                for column in columns {
                    assert!(plan.contains(&format!("{column}_hash = ")), "{plan}");
                    assert!(plan.contains(&format!("({column} = ")), "{plan}");
                }
                assert!(!plan.contains("Seq Scan"), "{plan}");
            }
        });
    }

    /// Version 17 leaves a version-16 database's address history listed
    /// as it was, by application and address and across applications,
    /// through two indexes.
    #[test]
    fn a_version_16_address_history_stays_listed() {
        let url = test_support::Postgres::shared()
            .fresh_database()
            .expect("database");
        let rt = runtime();
        rt.block_on(async {
            let client = connect(&url).await;
            let mut schema = String::new();
            for m in &super::MIGRATIONS[..16] {
                schema.push_str(m.sql);
            }
            client.batch_execute(&schema).await.expect("schema");
            client
                .batch_execute(
                    "CREATE TABLE reach_schema (version BIGINT NOT NULL);
                     INSERT INTO reach_schema (version) VALUES (16);
                     INSERT INTO address_events (at_ms, segment, host, protocol, port, address,
                                                 connector, from_status, to_status, cause)
                     VALUES (1, 's', 'a.test', 'tcp', 80, '10.0.0.1', 'c1', 'unknown', 'up',
                             'appeared'),
                            (2, 's', 'a.test', 'tcp', 80, '10.0.0.1', 'c1', 'up', 'down',
                             'report'),
                            (3, 's', 'b.test', 'tcp', 80, '10.0.0.1', 'c1', 'unknown', 'up',
                             'appeared');",
                )
                .await
                .expect("v16 rows");
        });
        let store = super::super::postgres_store(&url);
        super::super::suite::version_16_address_rows_are_listed(|f| store.address_events(f, 10, 0));
        drop(store);
        rt.block_on(async {
            let client = connect(&url).await;
            let indexes: Vec<String> = client
                .query(
                    "SELECT indexname::TEXT FROM pg_indexes
                     WHERE tablename = 'address_events' ORDER BY indexname",
                    &[],
                )
                .await
                .expect("indexes")
                .iter()
                .map(|r| r.get(0))
                .collect();
            assert_eq!(
                indexes,
                [
                    "address_events_by_app",
                    "address_events_by_time",
                    "address_events_pkey"
                ]
            );
        });
    }
}

#[cfg(test)]
mod link_tests {
    use super::*;

    /// The link each URL gets: its own `sslmode`; else `verify-full` with a
    /// root, `require` off loopback, `prefer` on loopback and unix sockets;
    /// plain text possible to a host off loopback only when asked for.
    #[test]
    fn the_sslmode_follows_the_host_unless_the_url_names_one() {
        let root = "&sslrootcert=/etc/reach/db-ca.pem";
        for (url, mode, plaintext_remote) in [
            ("postgres://u@db.example.com/reach", "require", false),
            ("postgres://u@10.0.0.5:5432/reach", "require", false),
            ("postgres://u@[2001:db8::5]/reach", "require", false),
            (
                "postgres://u@192.168.1.20/reach?application_name=x",
                "require",
                false,
            ),
            (
                "postgres://u@db.example.com/reach?connect_timeout=5",
                "require",
                false,
            ),
            ("postgres://u@127.0.0.1/reach", "prefer", false),
            ("postgres://u@127.8.9.10:5433/reach", "prefer", false),
            ("postgres://u@[::1]/reach", "prefer", false),
            ("postgres://u@localhost/reach", "prefer", false),
            ("postgres://u@LOCALHOST./reach", "prefer", false),
            (
                "postgres://u@%2Fvar%2Frun%2Fpostgresql/reach",
                "prefer",
                false,
            ),
            (
                "postgres://u@localhost,db.example.com/reach",
                "require",
                false,
            ),
            (
                "postgres://u@db.example.com/reach?sslmode=disable",
                "disable",
                true,
            ),
            (
                "postgres://u@db.example.com/reach?sslmode=prefer",
                "prefer",
                true,
            ),
            (
                "postgres://u@db.example.com/reach?sslmode=allow",
                "allow",
                true,
            ),
            (
                "postgres://u@db.example.com/reach?sslmode=verify-ca",
                "verify-ca",
                false,
            ),
            (
                "postgres://u@127.0.0.1/reach?sslmode=disable",
                "disable",
                false,
            ),
            (
                "postgres://u@127.0.0.1/reach?sslmode=require",
                "require",
                false,
            ),
            ("postgres://u@db.localhost.example/reach", "require", false),
            ("postgres://u@127.0.0.1.example/reach", "require", false),
            (
                "postgres://u@localhost/reach?hostaddr=10.0.0.5",
                "require",
                false,
            ),
            (
                "postgres://u@localhost/reach?hostaddr=127.0.0.1",
                "prefer",
                false,
            ),
        ] {
            let (_, link, _) = parse_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(
                (link.mode, link.plaintext_remote),
                (mode, plaintext_remote),
                "{url}"
            );
        }
        // A root makes the default verify-full, on loopback too.
        for host in ["db.example.com", "127.0.0.1"] {
            let url = format!("postgres://u@{host}/reach?connect_timeout=5{root}");
            let (_, link, file) = parse_url(&url).expect("url");
            assert_eq!(link.mode, "verify-full", "{url}");
            assert!(file.is_some());
        }
        let Err(e) = parse_url("postgres://u@db.example.com/reach?sslmode=sometimes") else {
            panic!("an unknown sslmode is refused")
        };
        assert!(e.to_string().contains("sslmode \"sometimes\""), "{e}");
    }
}
