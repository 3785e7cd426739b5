//! The CA's persistent state: enrolled connectors (and whether they are
//! disabled), the drained connectors (since when, by whom), the certificates issued to them with their serials and
//! revocations, the use counts and revocations of provisioning keys, and
//! the CA replicas sharing the database, the status history and the audit
//! trail of admin actions. Health is not here: it is soft state each
//! replica rebuilds from reports.
//!
//! Two backends behind one API (`Store`): an embedded SQLite file in the
//! data directory (`sqlite`, the default) and PostgreSQL (`postgres`,
//! `[store] url = "postgres://…"`), which several CA replicas share. Keys
//! are stored only as SHA-256 fingerprints, never themselves. Every change
//! is one transaction (an enrollment checks and counts the key, records the
//! connector, supersedes its old certificates and records the new one
//! atomically); on PostgreSQL transactions run `SERIALIZABLE` and are
//! retried on serialization failures, so `max_uses`, revocation and disable
//! hold across replicas. Both backends migrate their versioned schema at
//! start. Who may enroll is decided once, in `rules`, from the rows a
//! backend read in its transaction; the backends only read and write.
//!
//! Changes that end sessions (revocations, disables, deletes,
//! re-enrollments) and drains are announced to the other replicas
//! (`changes`): on
//! PostgreSQL by `NOTIFY`; every replica also reconciles its live sessions
//! against the store periodically (`crate::replicas`), which covers a
//! missed notification and CA processes sharing one SQLite file.

mod ends;
mod migrations;
mod postgres;
mod rules;
mod sqlite;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

use tokio::sync::watch;

use postgres::PgStore;
use sqlite::SqliteStore;

/// Where the store lives (`[store]`).
#[derive(Clone, PartialEq)]
pub enum StoreLocation {
    /// `reach.db` in the data directory (the default).
    DataDir,
    /// An SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL database.
    Postgres {
        /// `postgres://…` URL (libpq style; `sslmode`, `sslrootcert`).
        url: String,
        /// The password, from `[store] password_file` or the
        /// `REACH_STORE_PASSWORD` environment variable, when the URL has
        /// none.
        password: Option<crate::ground::secret::Secret>,
    },
}

impl std::fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreLocation::DataDir => write!(f, "sqlite:reach.db in the data directory"),
            StoreLocation::Sqlite(p) => write!(f, "sqlite:{}", p.display()),
            StoreLocation::Postgres { url, .. } => write!(f, "{}", redact_url(url)),
        }
    }
}

impl std::fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

impl StoreLocation {
    /// The location with the default made concrete for `data_dir`.
    pub fn resolve(&self, data_dir: &std::path::Path) -> StoreLocation {
        match self {
            StoreLocation::DataDir => StoreLocation::Sqlite(data_dir.join("reach.db")),
            other => other.clone(),
        }
    }
}

/// `url` with any password replaced by `***` (for logs and errors).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// A PostgreSQL error with its server-side message and SQLSTATE.
fn postgres_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => {
            let mut s = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(inner) = source {
                s.push_str(": ");
                s.push_str(&inner.to_string());
                source = inner.source();
            }
            s
        }
    }
}

/// The standing a certificate needs to renew: known, of that connector and
/// group, unrevoked, unexpired, its connector not disabled.
fn renewable(
    old: Option<CertRecord>,
    name: &str,
    group: &str,
    serial: &str,
    now_ms: i64,
) -> Result<(), RenewRefusal> {
    let Some(old) = old else {
        return Err(RenewRefusal::Unknown(serial.to_owned()));
    };
    if old.connector != name || old.group != group {
        return Err(RenewRefusal::Unknown(serial.to_owned()));
    }
    if let Some((_, reason)) = old.revoked {
        return Err(RenewRefusal::Revoked {
            serial: serial.to_owned(),
            reason,
        });
    }
    if old.not_after_ms <= now_ms {
        return Err(RenewRefusal::Expired(serial.to_owned()));
    }
    if old.disabled {
        return Err(RenewRefusal::Disabled(name.to_owned()));
    }
    Ok(())
}

/// Addresses as stored (comma-separated) back into a list.
fn split_addresses(s: &str) -> Vec<String> {
    s.split(',')
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect()
}

/// One CA replica as the database knows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ReplicaRecord {
    /// Replica id (`[replica] id`, default host name and gRPC port).
    pub id: String,
    /// Addresses it advertises (gRPC and HTTP listeners).
    pub addresses: Vec<String>,
    /// The CA's version.
    pub version: String,
    /// Started at, Unix ms.
    pub started_ms: i64,
    /// Last heartbeat, Unix ms.
    pub heartbeat_ms: i64,
    /// Hash of the policy it serves (replicas of one deployment agree).
    pub policy_hash: String,
}

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL failed.
    #[error("database: {}", postgres_message(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// No PostgreSQL connection could be had from the pool.
    #[error("database connection: {0}")]
    Pool(String),
    /// `[store] url` (or its password or TLS material) is unusable.
    #[error("[store] {0}")]
    Config(String),
    /// The database is newer than this binary.
    #[error("database schema version {found} is newer than this binary's {known}")]
    TooNew {
        /// Version in the file.
        found: i64,
        /// Latest version this binary knows.
        known: usize,
    },
}

/// Why the store refused an enrollment (the checks that need its state).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnrollRefusal {
    /// The provisioning key was revoked.
    #[error("the provisioning key of connector group {0:?} was revoked")]
    KeyRevoked(String),
    /// The key has no uses left.
    #[error(
        "the provisioning key of connector group {group:?} is exhausted ({uses} of {max} uses)"
    )]
    KeyExhausted {
        /// Group.
        group: String,
        /// Uses so far.
        uses: u32,
        /// Maximum.
        max: u32,
    },
    /// The name belongs to a connector of another group.
    #[error(
        "connector {name:?} is enrolled in connector group {group:?}; an admin must delete it first (DELETE /api/v1/connectors/{name})"
    )]
    OtherGroup {
        /// Connector.
        name: String,
        /// Its group.
        group: String,
    },
    /// The connector is disabled.
    #[error("connector {0:?} is disabled")]
    Disabled(String),
    /// The name holds a valid (unexpired, unrevoked) certificate and no
    /// administrator allowed its re-enrollment: a provisioning key alone
    /// must not take a running connector's name.
    #[error(
        "connector {0:?} is enrolled with a valid certificate; renew with it, or an admin must allow re-enrollment (POST /api/v1/connectors/{0}/allow-reenroll)"
    )]
    NameTaken(String),
}

/// Why the store refused a renewal (the checks that need its state).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RenewRefusal {
    /// The presented serial was never issued to that connector.
    #[error("certificate {0} was not issued by this CA to that connector")]
    Unknown(String),
    /// The presented certificate is revoked.
    #[error("certificate {serial} is revoked: {reason}")]
    Revoked {
        /// Serial.
        serial: String,
        /// Why.
        reason: String,
    },
    /// The presented certificate has expired.
    #[error("certificate {0} has expired; enroll again with the provisioning key")]
    Expired(String),
    /// The connector is disabled.
    #[error("connector {0:?} is disabled")]
    Disabled(String),
}

/// What a renewal records.
#[derive(Clone, Debug)]
pub struct Renewal<'a> {
    /// Connector name (from the presented certificate).
    pub name: &'a str,
    /// Group (from the presented certificate).
    pub group: &'a str,
    /// Serial of the presented certificate.
    pub old_serial: &'a str,
    /// Serial of the new certificate.
    pub serial: &'a str,
    /// SHA-256 of the new certificate.
    pub fingerprint: &'a str,
    /// End of the new certificate's validity.
    pub not_after_ms: i64,
    /// Now.
    pub now_ms: i64,
    /// When the connector's older certificates are revoked.
    pub revoke_old_at_ms: i64,
    /// The fingerprint of the root that signed the new certificate.
    pub root_sha256: &'a str,
}

/// One certificate in a connector's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertHistory {
    /// Serial.
    pub serial: String,
    /// Issued at.
    pub issued_ms: i64,
    /// End of validity.
    pub not_after_ms: i64,
    /// Revoked at.
    pub revoked_ms: Option<i64>,
    /// Superseded by a renewal and revoked at this time unless already.
    pub grace_until_ms: Option<i64>,
}

/// What an enrollment records.
#[derive(Clone, Debug)]
pub struct NewCertificate<'a> {
    /// Connector name.
    pub name: &'a str,
    /// Group.
    pub group: &'a str,
    /// SHA-256 of the provisioning key used.
    pub key_sha256: &'a str,
    /// The key's maximum uses.
    pub max_uses: u32,
    /// Serial (hex).
    pub serial: &'a str,
    /// SHA-256 of the certificate.
    pub fingerprint: &'a str,
    /// End of validity.
    pub not_after_ms: i64,
    /// Now.
    pub now_ms: i64,
    /// The fingerprint of the root that signed it.
    pub root_sha256: &'a str,
}

/// A certificate as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertRecord {
    /// Connector name.
    pub connector: String,
    /// Group.
    pub group: String,
    /// End of validity.
    pub not_after_ms: i64,
    /// When and why it was revoked.
    pub revoked: Option<(i64, String)>,
    /// Whether the connector is disabled.
    pub disabled: bool,
    /// SHA-256 of the certificate's DER as issued (lower-case hex).
    pub fingerprint: String,
}

/// An enrolled connector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectorRecord {
    /// Name.
    pub name: String,
    /// Group.
    pub group: String,
    /// Disabled by an administrator.
    pub disabled: bool,
    /// Its latest enrollment (with a provisioning key), Unix ms.
    pub enrolled_ms: i64,
    /// The serial of its current (unrevoked) certificate.
    pub serial: Option<String>,
    /// Its end of validity.
    pub not_after_ms: Option<i64>,
    /// The fingerprint of the root that signed it (`None`: recorded before
    /// roots were).
    pub root_sha256: Option<String>,
}

/// A connector an administrator drained: it keeps its session and
/// reports but is selected for no new access, on every replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainRecord {
    /// The connector's name (enrolled or not: a CA without TLS drains the
    /// connectors it knows by their sessions).
    pub connector: String,
    /// When the drain began, Unix ms.
    pub since_ms: i64,
    /// Who drained it: `token` or `person` (`trust::audit::ActorKind`).
    pub actor_kind: String,
    /// The token's configured name, the person's user name.
    pub actor: String,
}

/// Use count and revocation of one provisioning key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyUsage {
    /// Enrollments so far.
    pub uses: u32,
    /// Revoked at.
    pub revoked_ms: Option<i64>,
    /// Last enrollment.
    pub last_used_ms: Option<i64>,
}

/// The database: one of the backends, same API and semantics.
#[derive(Debug)]
pub struct Store {
    backend: Backend,
    /// Whether the database answered its last call.
    status: Watched,
    /// How many calls of each kind it was asked.
    calls: Calls,
}

/// Store calls counted by method name (`reach_ca_store_calls_total`): what
/// an operator sizing the database multiplies by its rate, and what shows
/// which path asks the database how often. One atomic per call, no lock.
#[derive(Debug)]
struct Calls([AtomicU64; CALLS.len()]);

/// The store's calls, as `each!` names them (a call missing here does not
/// compile: `call_index` fails at compile time).
const CALLS: [&str; 44] = [
    "address_events",
    "allow_reenroll",
    "audit",
    "certificate",
    "certificate_history",
    "certificates",
    "claim_session_check",
    "connectors",
    "count_refusal",
    "create_session",
    "delete_connector",
    "disabled_connectors",
    "drain",
    "drains",
    "enroll",
    "events",
    "heartbeat",
    "is_disabled",
    "key_revoked",
    "key_usage",
    "logout_token_once",
    "ping",
    "prune_audit",
    "prune_events",
    "put_login",
    "record_address_events",
    "record_audit",
    "record_events",
    "remove_replica",
    "renew",
    "renewable",
    "replicas",
    "revoke_after_grace",
    "revoke_certificates",
    "revoke_key",
    "revoke_provider_sessions",
    "revoke_session",
    "session",
    "session_refreshed",
    "sessions",
    "set_disabled",
    "shared_secret",
    "take_login",
    "undrain",
];

/// The index of `name` in `CALLS`.
const fn call_index(name: &str) -> usize {
    let mut i = 0;
    while i < CALLS.len() {
        if const_eq(CALLS[i].as_bytes(), name.as_bytes()) {
            return i;
        }
        i += 1;
    }
    panic!("a store call missing from CALLS")
}

const fn const_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

impl Default for Calls {
    fn default() -> Self {
        Calls([const { AtomicU64::new(0) }; CALLS.len()])
    }
}

impl Calls {
    fn count(&self, index: usize) {
        if let Some(n) = self.0.get(index) {
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

/// Whether the database answers, as its calls found it: every call that
/// could not reach it marks it down, every call that returned marks it up
/// (the replica's heartbeat calls it every few seconds even when nothing
/// else does). The change is logged once each way, so an outage is one
/// warning, not one per call.
#[derive(Debug)]
struct Watched {
    up: std::sync::atomic::AtomicBool,
    /// When `up` last changed (the store's opening counts), Unix ms.
    since_ms: std::sync::atomic::AtomicI64,
    /// The last call's end, Unix ms.
    checked_ms: std::sync::atomic::AtomicI64,
}

/// The store as this replica last found it (`/api/v1/replicas`,
/// `reach_ca_store_up`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct StoreStatus {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Whether its last call reached the database.
    pub up: bool,
    /// Since when it has been up (or down), Unix ms.
    pub since: i64,
    /// When it was last called, Unix ms.
    pub checked_at: i64,
    /// What that means for this replica.
    pub message: &'static str,
    /// What is wrong with the link to the database, if anything (plain
    /// text to a host off loopback: `sslmode=disable`, `allow` or `prefer`
    /// given for it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

impl Watched {
    fn new() -> Watched {
        let now = crate::ground::clock::now_ms();
        Watched {
            up: true.into(),
            since_ms: now.into(),
            checked_ms: now.into(),
        }
    }

    fn observe<T>(&self, kind: &str, result: &Result<T, StoreError>) {
        use std::sync::atomic::Ordering::Relaxed;
        let up = match result {
            Ok(_) => true,
            Err(e) if e.is_unavailable() => false,
            // The database answered, with an error.
            Err(_) => true,
        };
        let now = crate::ground::clock::now_ms();
        self.checked_ms.store(now, Relaxed);
        if self.up.swap(up, Relaxed) == up {
            return;
        }
        let since = self.since_ms.swap(now, Relaxed);
        let for_s = now.saturating_sub(since) / 1000;
        match result {
            Err(e) => tracing::warn!(
                store = kind, error = %e, up_for_s = for_s,
                "the store does not answer: access decisions go on; enrollment, renewal, new sessions and admin changes are refused until it is back"
            ),
            Ok(_) => tracing::info!(store = kind, down_for_s = for_s, "the store answers again"),
        }
    }
}

impl StoreError {
    /// Whether the database could not be reached at all (no connection,
    /// a connection lost, the server shutting down or starting), as
    /// opposed to an answer that was an error.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Pool(_) => true,
            StoreError::Postgres(e) => match e.as_db_error() {
                // Class 08: connection exception; 57P01..57P03: the
                // server is shutting down, crashed or not yet accepting.
                Some(db) => {
                    let code = db.code().code();
                    code.starts_with("08") || ["57P01", "57P02", "57P03"].contains(&code)
                }
                None => true,
            },
            StoreError::Sqlite(_) | StoreError::Config(_) | StoreError::TooNew { .. } => false,
        }
    }
}

/// One status transition in the history (`health_events`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventRecord {
    /// When the CA saw it, Unix ms.
    pub at_ms: i64,
    /// Segment.
    pub segment: String,
    /// Host.
    pub host: String,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// Port.
    pub port: i64,
    /// Connector whose status changed.
    pub connector: String,
    /// Status before (`up`, `unhealthy`, `down`, `unknown`).
    pub from: String,
    /// Status after.
    pub to: String,
    /// Why (`report` or an Unknown cause).
    pub cause: String,
}

/// One change of one address of an application (it appeared in a
/// connector's answer, its result changed where the status history does
/// not show it, or it left every connector's answer), as stored in the
/// address history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressEventRecord {
    /// The change: `connector` is the one whose report showed it, `from`
    /// the result the address history last showed (`unknown` before it
    /// appeared), `to` the result after (`unknown` once it left), `cause`
    /// `appeared`, `report` or `left`.
    pub event: EventRecord,
    /// The address, in its normal text form.
    pub address: String,
}

/// What one history row is about: (segment, host, protocol, port,
/// connector), or the address in the connector's place for the address
/// history. Each history keeps, per key, the status its last row ended
/// with, which a new row is compared with (SQLite: `health_latest`,
/// `address_latest`; PostgreSQL: in memory, `store::ends`).
pub(crate) type EventKey<'a> = (&'a str, &'a str, &'a str, i64, &'a str);

/// A map by [`EventKey`] (foldhash: a batch hashes each row's five fields
/// a few times, and std's SipHash showed in the ingest profile).
pub(crate) type KeyMap<'a, V> =
    std::collections::HashMap<EventKey<'a>, V, foldhash::fast::RandomState>;

impl EventRecord {
    /// The (application, connector) this row is about.
    pub(crate) fn key(&self) -> EventKey<'_> {
        (
            &self.segment,
            &self.host,
            &self.protocol,
            self.port,
            &self.connector,
        )
    }
}

/// A row of a history that keeps, per key, the status its last row ended
/// with: the status history (per application and connector) and the
/// address history (per application and address).
pub(crate) trait HistoryRow {
    /// What the row is about; the address history puts the address where
    /// the status history has the connector.
    fn history_key(&self) -> EventKey<'_>;
    /// The status the row ends with.
    fn to_status(&self) -> &str;
    /// When, Unix ms.
    fn at_ms(&self) -> i64;
}

impl HistoryRow for EventRecord {
    fn history_key(&self) -> EventKey<'_> {
        self.key()
    }
    fn to_status(&self) -> &str {
        &self.to
    }
    fn at_ms(&self) -> i64 {
        self.at_ms
    }
}

impl HistoryRow for AddressEventRecord {
    fn history_key(&self) -> EventKey<'_> {
        let e = &self.event;
        (&e.segment, &e.host, &e.protocol, e.port, &self.address)
    }
    fn to_status(&self) -> &str {
        &self.event.to
    }
    fn at_ms(&self) -> i64 {
        self.event.at_ms
    }
}

/// The rows of `events` to append, in order, and the last of them per key
/// (the keys' new latest rows). `latest` holds the status the history ends
/// with for the keys that have one; a row whose status is the one its key
/// ends with (at that point of the batch) is another replica's copy of a
/// transition already recorded and is skipped (docs/decisions.md). On
/// return, `latest` holds the status each key ends with once the rows are
/// written. One rule for both backends: each reads `latest` in one go and
/// writes both lists in one go, instead of one comparison query per row.
pub(crate) fn fresh_rows<'a, R: HistoryRow>(
    events: &'a [R],
    latest: &mut KeyMap<'a, String>,
) -> (Vec<&'a R>, Vec<&'a R>) {
    let mut rows = Vec::new();
    // Per key, the index in `rows` of its last row.
    let mut last: KeyMap<'a, usize> = KeyMap::default();
    for e in events {
        let key = e.history_key();
        let to = e.to_status();
        match latest.get_mut(&key) {
            Some(status) if status == to => continue,
            Some(status) => {
                status.clear();
                status.push_str(to);
            }
            None => {
                latest.insert(key, to.to_owned());
            }
        }
        last.insert(key, rows.len());
        rows.push(e);
    }
    // In the order the rows were appended (a stable order for the writes).
    let mut at: Vec<usize> = last.into_values().collect();
    at.sort_unstable();
    let last = at.into_iter().map(|i| rows[i]).collect();
    (rows, last)
}

/// Which history to read (`None`: any).
#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    /// Segment.
    pub segment: Option<String>,
    /// Host.
    pub host: Option<String>,
    /// Protocol.
    pub protocol: Option<String>,
    /// Port.
    pub port: Option<i64>,
    /// Connector.
    pub connector: Option<String>,
    /// From this time on, Unix ms.
    pub since_ms: Option<i64>,
    /// Before this time, Unix ms.
    pub until_ms: Option<i64>,
    /// Segments never shown (client hostname validation).
    pub hidden_segments: Vec<String>,
    /// The address history instead of the status history: one address,
    /// or `*` for every address (only `Store::address_events` reads it).
    pub address: Option<String>,
}

/// A value an `EventFilter` condition compares with.
pub(crate) enum EventValue {
    /// A text column.
    Text(String),
    /// An integer column.
    Int(i64),
}

impl EventFilter {
    /// The filter as SQL: ` WHERE …` (empty when it keeps everything) with
    /// the `n`-th value's placeholder from `placeholder(n)` (1-based), and
    /// the values in order. One rule for both backends.
    pub(crate) fn to_sql(
        &self,
        placeholder: impl Fn(usize) -> String,
    ) -> (String, Vec<EventValue>) {
        self.to_sql_hashed(placeholder, &[])
    }

    /// `to_sql` where each text column in `hashed` is indexed by its
    /// 64-bit hash, `{column}_hash` (PostgreSQL's `hashtextextended`): its
    /// equality also names the hash, which the index is searched by.
    pub(crate) fn to_sql_hashed(
        &self,
        placeholder: impl Fn(usize) -> String,
        hashed: &[&str],
    ) -> (String, Vec<EventValue>) {
        use EventValue::{Int, Text};
        let mut conditions: Vec<(&str, &str, EventValue)> = Vec::new();
        let text = |v: &Option<String>| v.clone().map(Text);
        for (column, value) in [
            ("segment", text(&self.segment)),
            ("host", text(&self.host)),
            ("protocol", text(&self.protocol)),
            ("port", self.port.map(Int)),
            ("connector", text(&self.connector)),
            (
                "address",
                text(&self.address.clone().filter(|a| a.as_str() != "*")),
            ),
        ] {
            if let Some(v) = value {
                conditions.push((column, "=", v));
            }
        }
        if let Some(v) = self.since_ms {
            conditions.push(("at_ms", ">=", Int(v)));
        }
        if let Some(v) = self.until_ms {
            conditions.push(("at_ms", "<", Int(v)));
        }
        for hidden in &self.hidden_segments {
            conditions.push(("segment", "<>", Text(hidden.clone())));
        }
        let clauses: Vec<String> = conditions
            .iter()
            .enumerate()
            .map(|(i, (column, op, _))| {
                let p = placeholder(i + 1);
                match *op == "=" && hashed.contains(column) {
                    true => {
                        format!("{column}_hash = hashtextextended({p}::TEXT, 0) AND {column} = {p}")
                    }
                    false => format!("{column} {op} {p}"),
                }
            })
            .collect();
        let filter = if clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", clauses.join(" AND "))
        };
        (filter, conditions.into_iter().map(|(_, _, v)| v).collect())
    }
}

/// One admin action in the audit trail (`admin_audit`), as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRecord {
    /// When, Unix ms.
    pub at_ms: i64,
    /// What kind of identity acted: `token` (an API token, by its
    /// configured name), `person` (a signed-in person) or `system` (the CA
    /// itself, e.g. a configuration reload on SIGHUP).
    pub actor_kind: String,
    /// The identity's name (a token's `name`, never the token).
    pub actor: String,
    /// The address the request came from (empty when none, e.g. a reload).
    pub source: String,
    /// What was done (`connector.revoke`, `config.reload`, …).
    pub action: String,
    /// What it was done to (a connector, a group, the config file).
    pub target: String,
    /// `ok`, `not_found`, `refused` or `failed`.
    pub outcome: String,
    /// More words on the outcome (may be empty).
    pub detail: String,
    /// A person's OpenID provider (its `[[oidc]] name`); empty for others.
    pub provider: String,
    /// A person's subject (`sub`) at that provider; empty for others.
    pub subject: String,
}

/// A person's session (`auth_sessions`), as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRecord {
    /// SHA-256 (hex) of the session id the cookie holds.
    pub id_sha256: String,
    /// Who signed in.
    pub person: String,
    /// Through which `[[oidc]]` provider.
    pub provider: String,
    /// The scopes their roles granted, space-separated.
    pub scopes: String,
    /// When, Unix ms.
    pub created_ms: i64,
    /// When it ends, Unix ms.
    pub expires_ms: i64,
    /// When it was revoked (signed out), Unix ms.
    pub revoked_ms: Option<i64>,
    /// The person's subject (`sub`) at the provider.
    pub subject: String,
    /// The provider's session id (`sid`), when its ID token had one.
    pub sid: Option<String>,
    /// The roles claim's values, a JSON array of strings (mapped to scopes
    /// at each request).
    pub roles: Option<String>,
    /// When the provider last confirmed the session, Unix ms.
    pub checked_ms: i64,
    /// The refresh token, sealed with a key only the session id gives.
    pub refresh_sealed: Option<String>,
}

/// A sign-in on its way through the provider (`auth_logins`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginRecord {
    /// SHA-256 (hex) of the `state` sent to the provider.
    pub state_sha256: String,
    /// The `[[oidc]]` provider.
    pub provider: String,
    /// The PKCE verifier.
    pub verifier: String,
    /// The nonce the ID token must carry.
    pub nonce: String,
    /// Where to go once signed in (a path of this CA, or a CLI's
    /// loopback port as `cli:PORT`).
    pub next: String,
    /// When it expires, Unix ms.
    pub expires_ms: i64,
}

/// Which audit entries to read (`None`: any).
#[derive(Clone, Debug, Default)]
pub struct AuditFilter {
    /// From this time on, Unix ms.
    pub since_ms: Option<i64>,
    /// This action.
    pub action: Option<String>,
    /// This target.
    pub target: Option<String>,
    /// This actor's name.
    pub actor: Option<String>,
}

impl AuditFilter {
    /// The filter as SQL, as [`EventFilter::to_sql`] makes it.
    pub(crate) fn to_sql(
        &self,
        placeholder: impl Fn(usize) -> String,
    ) -> (String, Vec<EventValue>) {
        let mut conditions: Vec<(&str, &str, EventValue)> = Vec::new();
        if let Some(v) = self.since_ms {
            conditions.push(("at_ms", ">=", EventValue::Int(v)));
        }
        for (column, value) in [
            ("action", &self.action),
            ("target", &self.target),
            ("actor", &self.actor),
        ] {
            if let Some(v) = value {
                conditions.push((column, "=", EventValue::Text(v.clone())));
            }
        }
        let clauses: Vec<String> = conditions
            .iter()
            .enumerate()
            .map(|(i, (column, op, _))| format!("{column} {op} {}", placeholder(i + 1)))
            .collect();
        let filter = if clauses.is_empty() {
            String::new()
        } else {
            format!(" WHERE {}", clauses.join(" AND "))
        };
        (filter, conditions.into_iter().map(|(_, _, v)| v).collect())
    }
}

#[derive(Debug)]
enum Backend {
    Sqlite(SqliteStore),
    Postgres(PgStore),
}

/// Calls the same method on whichever backend is in use, counting the
/// call under the method's name (`Store::calls`).
macro_rules! each {
    ($self:ident, $s:ident => $t:ident.$m:ident($($a:expr),* $(,)?)) => {{
        $self.calls.count(const { call_index(stringify!($m)) });
        let result = match &$self.backend {
            Backend::Sqlite($s) => $t.$m($($a),*),
            Backend::Postgres($s) => $t.$m($($a),*),
        };
        $self.status.observe($self.kind(), &result);
        result
    }};
}

impl Store {
    /// Opens (creating if needed) and migrates the store at `location`.
    pub fn open(location: &StoreLocation) -> Result<Store, StoreError> {
        let backend = match location {
            StoreLocation::DataDir => {
                return Err(StoreError::Config(
                    "the data directory's database needs resolving first".into(),
                ));
            }
            StoreLocation::Sqlite(path) => Backend::Sqlite(SqliteStore::open(path)?),
            StoreLocation::Postgres { url, password } => {
                Backend::Postgres(PgStore::open(url, password.as_ref())?)
            }
        };
        Ok(Store {
            backend,
            status: Watched::new(),
            calls: Calls::default(),
        })
    }

    /// An SQLite database in memory (tests).
    pub fn in_memory() -> Result<Store, StoreError> {
        Ok(Store {
            backend: Backend::Sqlite(SqliteStore::in_memory()?),
            status: Watched::new(),
            calls: Calls::default(),
        })
    }

    /// Which backend this is (`sqlite` or `postgres`), for logs.
    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// A receiver woken when this replica committed, or another announced
    /// (PostgreSQL `NOTIFY`), a change that may end sessions; `None` on
    /// SQLite, where only the periodic reconcile sees other processes'
    /// changes.
    pub fn changes(&self) -> Option<watch::Receiver<u64>> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(p) => Some(p.changes()),
        }
    }

    /// How many calls of each kind (by method name) this store was asked
    /// since it opened.
    pub fn calls(&self) -> Vec<(&'static str, u64)> {
        CALLS
            .iter()
            .zip(&self.calls.0)
            .map(|(m, n)| (*m, n.load(std::sync::atomic::Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// A number that changes whenever this replica committed, or another
    /// announced, a change that may end sessions (`changes`); `None` on
    /// SQLite. Equal readings mean nothing was announced in between.
    pub fn announced(&self) -> Option<u64> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(p) => Some(p.announced()),
        }
    }

    /// The store as its calls last found it.
    pub fn status(&self) -> StoreStatus {
        use std::sync::atomic::Ordering::Relaxed;
        let up = self.status.up.load(Relaxed);
        StoreStatus {
            backend: self.kind(),
            up,
            since: self.status.since_ms.load(Relaxed),
            checked_at: self.status.checked_ms.load(Relaxed),
            message: if up {
                "the store answers"
            } else {
                "the store (database) does not answer: this replica still decides access; enrollment, renewal, new connector sessions and admin changes are refused until it is back"
            },
            warning: match &self.backend {
                Backend::Sqlite(_) => None,
                Backend::Postgres(p) => p.link_warning(),
            },
        }
    }

    /// Whether the database answers a trivial query (the replica's
    /// heartbeat loop keeps `status` fresh with it).
    pub fn ping(&self) -> Result<(), StoreError> {
        each!(self, s => s.ping())
    }

    /// Records an enrollment if the key has uses left and is not revoked,
    /// and the connector is not disabled or of another group; supersedes
    /// the connector's earlier certificates. All or nothing.
    pub fn enroll(&self, c: &NewCertificate<'_>) -> Result<Result<(), EnrollRefusal>, StoreError> {
        each!(self, s => s.enroll(c))
    }

    /// The record of certificate `serial`, if the CA issued it.
    pub fn certificate(&self, serial: &str) -> Result<Option<CertRecord>, StoreError> {
        each!(self, s => s.certificate(serial))
    }

    /// The records of those of `serials` the CA issued.
    pub fn certificates(
        &self,
        serials: &[String],
    ) -> Result<std::collections::HashMap<String, CertRecord>, StoreError> {
        each!(self, s => s.certificates(serials))
    }

    /// Disables or enables a connector; `false` if it is not enrolled.
    pub fn set_disabled(
        &self,
        name: &str,
        disabled: bool,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        each!(self, s => s.set_disabled(name, disabled, now_ms))
    }

    /// Revokes every unrevoked certificate of a connector; returns how
    /// many, `None` if it is not enrolled (never was, or deleted).
    pub fn revoke_certificates(
        &self,
        name: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<Option<usize>, StoreError> {
        each!(self, s => s.revoke_certificates(name, reason, now_ms))
    }

    /// Allows the next enrollment of `name` (a connector of the same group,
    /// with a valid certificate) until `until_ms`, once; `false` if it is
    /// not enrolled.
    pub fn allow_reenroll(
        &self,
        name: &str,
        until_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        each!(self, s => s.allow_reenroll(name, until_ms, now_ms))
    }

    /// Deletes an enrolled connector: revokes its certificates (they stay
    /// recorded, so they stay refused) and frees its name for any group.
    /// `None` if it is not enrolled, else how many certificates were revoked.
    pub fn delete_connector(&self, name: &str, now_ms: i64) -> Result<Option<usize>, StoreError> {
        each!(self, s => s.delete_connector(name, now_ms))
    }

    /// Revokes a provisioning key (by fingerprint) of a group.
    pub fn revoke_key(&self, group: &str, key_sha256: &str, now_ms: i64) -> Result<(), StoreError> {
        each!(self, s => s.revoke_key(group, key_sha256, now_ms))
    }

    /// Use count and revocation of a key.
    pub fn key_usage(&self, group: &str, key_sha256: &str) -> Result<KeyUsage, StoreError> {
        each!(self, s => s.key_usage(group, key_sha256))
    }

    /// Whether connector `name` is disabled (`false` when it is not
    /// enrolled). On PostgreSQL, answered from the last reading when
    /// nothing was announced since (no statement: see `PgStore`'s
    /// standing readings).
    pub fn is_disabled(&self, name: &str) -> Result<bool, StoreError> {
        if let Backend::Postgres(p) = &self.backend
            && let Some(disabled) = p.known_disabled(name, std::time::Instant::now())
        {
            return Ok(disabled);
        }
        each!(self, s => s.is_disabled(name))
    }

    /// Whether `group`'s provisioning key whose SHA-256 is `key_sha256` is
    /// revoked. On PostgreSQL, answered from the last reading when nothing
    /// was announced since, as `is_disabled`.
    pub fn key_revoked(&self, group: &str, key_sha256: &str) -> Result<bool, StoreError> {
        if let Backend::Postgres(p) = &self.backend
            && let Some(revoked) = p.known_revoked(group, key_sha256, std::time::Instant::now())
        {
            return Ok(revoked);
        }
        each!(self, s => s.key_revoked(group, key_sha256))
    }

    /// The names of every disabled connector: one query, whatever the
    /// number of sessions it is asked for (the session reconcile's view).
    pub fn disabled_connectors(&self) -> Result<std::collections::HashSet<String>, StoreError> {
        each!(self, s => s.disabled_connectors())
    }

    /// Records `r`'s drain unless its connector is drained already; returns
    /// the drain in force afterwards (the earlier one when there was one:
    /// a drain keeps when and by whom it began). On PostgreSQL the change
    /// is announced, so every replica reads the drains again at once.
    pub fn drain(&self, r: &DrainRecord) -> Result<DrainRecord, StoreError> {
        each!(self, s => s.drain(r))
    }

    /// Ends `connector`'s drain; `false` when it was not drained. Announced
    /// like `drain`.
    pub fn undrain(&self, connector: &str) -> Result<bool, StoreError> {
        each!(self, s => s.undrain(connector))
    }

    /// Every drained connector, by name: one query (each replica's
    /// reconcile reads it every second and on every announcement).
    pub fn drains(&self) -> Result<Vec<DrainRecord>, StoreError> {
        each!(self, s => s.drains())
    }

    /// Records a renewal: checks, in one transaction, that `old_serial` was
    /// issued to `name` of `group`, is neither revoked nor expired and that
    /// the connector is not disabled; records the new certificate and puts
    /// every other unrevoked certificate of the connector in grace until
    /// `revoke_old_at_ms` (an earlier grace is kept, never extended).
    pub fn renew(&self, r: &Renewal<'_>) -> Result<Result<(), RenewRefusal>, StoreError> {
        each!(self, s => s.renew(r))
    }

    /// Whether the certificate `serial` could renew now (a read only; the
    /// renewal itself checks again in its transaction): lets the CA refuse
    /// before it signs anything.
    pub fn renewable(
        &self,
        name: &str,
        group: &str,
        serial: &str,
        now_ms: i64,
    ) -> Result<Result<(), RenewRefusal>, StoreError> {
        each!(self, s => s.renewable(name, group, serial, now_ms))
    }

    /// Revokes every superseded certificate whose grace has passed; returns
    /// (connector, serial) of each one revoked now.
    pub fn revoke_after_grace(&self, now_ms: i64) -> Result<Vec<(String, String)>, StoreError> {
        each!(self, s => s.revoke_after_grace(now_ms))
    }

    /// Every connector's certificates, newest first, at most `per_connector`
    /// each.
    pub fn certificate_history(
        &self,
        per_connector: usize,
    ) -> Result<std::collections::HashMap<String, Vec<CertHistory>>, StoreError> {
        each!(self, s => s.certificate_history(per_connector))
    }

    /// Every enrolled connector with its current certificate.
    pub fn connectors(&self) -> Result<Vec<ConnectorRecord>, StoreError> {
        each!(self, s => s.connectors())
    }

    /// Appends status transitions to the history, in one transaction; the
    /// ones this call appended (a transition another replica appended
    /// first is a copy, skipped).
    pub fn record_events(&self, events: &[EventRecord]) -> Result<Vec<EventRecord>, StoreError> {
        each!(self, s => s.record_events(events))
    }

    /// Appends address changes to the address history, in one
    /// transaction: a change whose result is the one the address's
    /// history already ends with (another replica's copy) is skipped.
    pub fn record_address_events(&self, events: &[AddressEventRecord]) -> Result<(), StoreError> {
        each!(self, s => s.record_address_events(events))
    }

    /// One page of the address history matching `f` (its `address` one
    /// address or `*`), newest first, and how many match in all.
    pub fn address_events(
        &self,
        f: &EventFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<AddressEventRecord>, u64), StoreError> {
        each!(self, s => s.address_events(f, limit, offset))
    }

    /// One page of the history matching `f`, newest first, and how many
    /// match in all.
    pub fn events(
        &self,
        f: &EventFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<EventRecord>, u64), StoreError> {
        each!(self, s => s.events(f, limit, offset))
    }

    /// Deletes the history from before `before_ms`; returns how many went.
    pub fn prune_events(&self, before_ms: i64) -> Result<usize, StoreError> {
        each!(self, s => s.prune_events(before_ms))
    }

    /// Appends one admin action to the audit trail.
    pub fn record_audit(&self, r: &AuditRecord) -> Result<(), StoreError> {
        each!(self, s => s.record_audit(r))
    }

    /// One page of the audit trail matching `f`, newest first, and how
    /// many match in all.
    pub fn audit(
        &self,
        f: &AuditFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<AuditRecord>, u64), StoreError> {
        each!(self, s => s.audit(f, limit, offset))
    }

    /// Deletes the audit trail from before `before_ms`; returns how many
    /// went.
    pub fn prune_audit(&self, before_ms: i64) -> Result<usize, StoreError> {
        each!(self, s => s.prune_audit(before_ms))
    }

    /// Counts one admin request refused for an unknown, malformed or
    /// throttled token from `source` in the minute starting `minute_ms`:
    /// one `token.refused` entry per source and minute, its detail
    /// `refusals: N`.
    pub fn count_refusal(&self, source: &str, minute_ms: i64) -> Result<(), StoreError> {
        each!(self, s => s.count_refusal(source, minute_ms))
    }

    /// Records a person's new session (and forgets the ended ones).
    pub fn create_session(&self, r: &SessionRecord) -> Result<(), StoreError> {
        each!(self, s => s.create_session(r))
    }

    /// The session whose id hashes to `id_sha256`, revoked or not.
    pub fn session(&self, id_sha256: &str) -> Result<Option<SessionRecord>, StoreError> {
        each!(self, s => s.session(id_sha256))
    }

    /// The live sessions (neither revoked nor over at `now_ms`), newest
    /// first.
    pub fn sessions(&self, now_ms: i64) -> Result<Vec<SessionRecord>, StoreError> {
        each!(self, s => s.sessions(now_ms))
    }

    /// Claims the re-validation of a session whose last check is
    /// `seen_checked_ms`: true for one caller across replicas, which then
    /// asks the provider.
    pub fn claim_session_check(
        &self,
        id_sha256: &str,
        seen_checked_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        each!(self, s => s.claim_session_check(id_sha256, seen_checked_ms, now_ms))
    }

    /// What a re-validation learnt: the roles claim's values and the
    /// (rotated) sealed refresh token.
    pub fn session_refreshed(
        &self,
        id_sha256: &str,
        roles: &str,
        refresh_sealed: Option<&str>,
    ) -> Result<(), StoreError> {
        each!(self, s => s.session_refreshed(id_sha256, roles, refresh_sealed))
    }

    /// Revokes the live sessions of `provider` with provider session `sid`
    /// (or, without one, of subject `sub`); how many.
    pub fn revoke_provider_sessions(
        &self,
        provider: &str,
        sid: Option<&str>,
        sub: Option<&str>,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        each!(self, s => s.revoke_provider_sessions(provider, sid, sub, now_ms))
    }

    /// Records logout token `jti` of `provider` until `expires_ms`; false
    /// when it was seen already (a replay).
    pub fn logout_token_once(
        &self,
        provider: &str,
        jti: &str,
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        each!(self, s => s.logout_token_once(provider, jti, expires_ms, now_ms))
    }

    /// Revokes a session on every replica; whether it was live.
    pub fn revoke_session(&self, id_sha256: &str, now_ms: i64) -> Result<bool, StoreError> {
        each!(self, s => s.revoke_session(id_sha256, now_ms))
    }

    /// Records a sign-in on its way (and forgets the expired ones).
    pub fn put_login(&self, r: &LoginRecord, now_ms: i64) -> Result<(), StoreError> {
        each!(self, s => s.put_login(r, now_ms))
    }

    /// Takes a sign-in on its way, once, if it has not expired.
    pub fn take_login(
        &self,
        state_sha256: &str,
        now_ms: i64,
    ) -> Result<Option<LoginRecord>, StoreError> {
        each!(self, s => s.take_login(state_sha256, now_ms))
    }

    /// Records replica `r`'s heartbeat and forgets replicas whose last
    /// heartbeat is older than `forget_before_ms`.
    pub fn heartbeat(&self, r: &ReplicaRecord, forget_before_ms: i64) -> Result<(), StoreError> {
        each!(self, s => s.heartbeat(r, forget_before_ms))
    }

    /// Removes replica `id` (it stopped cleanly).
    pub fn remove_replica(&self, id: &str) -> Result<(), StoreError> {
        each!(self, s => s.remove_replica(id))
    }

    /// Every replica the database knows, by id.
    pub fn replicas(&self) -> Result<Vec<ReplicaRecord>, StoreError> {
        each!(self, s => s.replicas())
    }

    /// The secret `name` every replica sharing this store uses: the first
    /// caller's `candidate` (fresh random bytes) is stored and returned to
    /// every later caller, on any replica.
    pub fn shared_secret(&self, name: &str, candidate: &[u8]) -> Result<Vec<u8>, StoreError> {
        each!(self, s => s.shared_secret(name, candidate))
    }

    /// Drops the tables, so every later query fails (tests of how callers
    /// handle a failing database).
    #[cfg(test)]
    pub(crate) fn break_for_tests(&self) {
        match &self.backend {
            Backend::Sqlite(s) => s.break_for_tests(),
            Backend::Postgres(s) => s.break_for_tests(),
        }
    }
}

/// The store tests, written once and run on both backends (`suite!`).
#[cfg(test)]
mod suite {
    pub(super) use super::*;

    pub(super) fn cert<'a>(name: &'a str, group: &'a str, serial: &'a str) -> NewCertificate<'a> {
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

    /// What a version-16 address history lists once migrated (rows 1 and 2
    /// of `a.test:80`, 3 of `b.test:80`, all of 10.0.0.1): by application
    /// and address, and by address across applications, newest first.
    pub(super) fn version_16_address_rows_are_listed(
        list: impl Fn(&EventFilter) -> Result<(Vec<AddressEventRecord>, u64), StoreError>,
    ) {
        let listed = |f: EventFilter| {
            let (rows, total) = list(&f).expect("listed");
            let at: Vec<i64> = rows.iter().map(|r| r.event.at_ms).collect();
            (at, total)
        };
        let address = || Some("10.0.0.1".to_owned());
        let app = EventFilter {
            host: Some("a.test".into()),
            port: Some(80),
            address: address(),
            ..EventFilter::default()
        };
        assert_eq!(listed(app), (vec![2, 1], 2));
        let everywhere = EventFilter {
            address: address(),
            ..EventFilter::default()
        };
        assert_eq!(listed(everywhere), (vec![3, 2, 1], 3));
    }

    pub(super) fn a_shared_secret_is_created_once(a: &Store, b: &Store) {
        let first = a.shared_secret("access", &[1; 32]).expect("db");
        assert_eq!(first, vec![1; 32]);
        // Another replica's candidate loses: both use the first one.
        assert_eq!(b.shared_secret("access", &[2; 32]).expect("db"), first);
        assert_eq!(a.shared_secret("access", &[3; 32]).expect("db"), first);
        // Names are separate.
        assert_eq!(b.shared_secret("other", &[4; 32]).expect("db"), vec![4; 32]);
    }

    /// A drain made through one store is read through the other, keeps
    /// its first start when made again, ends with `undrain`, and goes with
    /// its connector's deletion.
    pub(super) fn drains_are_shared_kept_and_ended(a: &Store, b: &Store) {
        let drain = |name: &str, since_ms, actor: &str| DrainRecord {
            connector: name.to_owned(),
            since_ms,
            actor_kind: "token".to_owned(),
            actor: actor.to_owned(),
        };
        assert_eq!(a.drains().expect("db"), Vec::new());
        assert_eq!(
            a.drain(&drain("c1", 5, "ops")).expect("db"),
            drain("c1", 5, "ops")
        );
        // Again, elsewhere and later: the first drain stands.
        assert_eq!(
            b.drain(&drain("c1", 9, "root")).expect("db"),
            drain("c1", 5, "ops")
        );
        // A connector that never enrolled (a CA without TLS) drains too.
        assert_eq!(
            b.drain(&drain("plain", 7, "root")).expect("db"),
            drain("plain", 7, "root")
        );
        let mut all = b.drains().expect("db");
        all.sort_by(|x, y| x.connector.cmp(&y.connector));
        assert_eq!(all, vec![drain("c1", 5, "ops"), drain("plain", 7, "root")]);
        assert!(b.undrain("plain").expect("db"));
        assert!(!a.undrain("plain").expect("db"), "not drained any more");
        assert_eq!(a.drains().expect("db"), vec![drain("c1", 5, "ops")]);
        // Deleting the connector ends its drain: its name may come back as
        // another connector.
        assert_eq!(a.enroll(&cert("c1", "g", "01")).expect("db"), Ok(()));
        assert_eq!(b.delete_connector("c1", 20).expect("db"), Some(1));
        assert_eq!(a.drains().expect("db"), Vec::new());
    }

    pub(super) fn disabled_is_looked_up_by_name(s: &Store) {
        assert_eq!(s.enroll(&cert("c1", "g", "01")).expect("db"), Ok(()));
        assert_eq!(s.enroll(&cert("c2", "g", "02")).expect("db"), Ok(()));
        assert!(!s.is_disabled("c1").expect("db"));
        assert!(s.set_disabled("c1", true, 2).expect("db"));
        assert!(s.is_disabled("c1").expect("db"));
        assert!(
            !s.is_disabled("c2").expect("db"),
            "only the named connector"
        );
        assert!(!s.is_disabled("never-enrolled").expect("db"));
        let all = s.disabled_connectors().expect("db");
        assert_eq!(
            all.into_iter().collect::<Vec<_>>(),
            ["c1"],
            "only c1 is disabled"
        );
        assert!(s.set_disabled("c1", false, 3).expect("db"));
        assert!(!s.is_disabled("c1").expect("db"));
        assert!(s.disabled_connectors().expect("db").is_empty());
        s.break_for_tests();
        assert!(
            s.is_disabled("c1").is_err(),
            "a failing database is an error"
        );
    }

    pub(super) fn enrollment_counts_uses_and_supersedes_certificates(s: &Store) {
        assert_eq!(s.enroll(&cert("c1", "g", "01")).expect("db"), Ok(()));
        // "01" is still valid: re-enrolling takes an administrator's leave.
        assert!(s.allow_reenroll("c1", 5, 1).expect("db"));
        assert_eq!(s.enroll(&cert("c1", "g", "02")).expect("db"), Ok(()));
        let old = s.certificate("01").expect("db").expect("known");
        assert!(old.revoked.is_some(), "superseded");
        assert!(
            s.certificate("02")
                .expect("db")
                .expect("known")
                .revoked
                .is_none()
        );
        assert!(matches!(
            s.enroll(&cert("c2", "g", "03")).expect("db"),
            Err(EnrollRefusal::KeyExhausted {
                uses: 2,
                max: 2,
                ..
            })
        ));
        assert_eq!(s.key_usage("g", "k1").expect("db").uses, 2);
    }

    pub(super) fn disabled_other_group_and_revoked_key_are_refused(s: &Store) {
        assert_eq!(s.enroll(&cert("c1", "g", "01")).expect("db"), Ok(()));
        assert!(matches!(
            s.enroll(&cert("c1", "h", "02")).expect("db"),
            Err(EnrollRefusal::OtherGroup { .. })
        ));
        assert!(s.set_disabled("c1", true, 2).expect("db"));
        assert!(s.certificate("01").expect("db").expect("known").disabled);
        assert_eq!(
            s.enroll(&cert("c1", "g", "03")).expect("db"),
            Err(EnrollRefusal::Disabled("c1".into()))
        );
        s.revoke_key("g", "k1", 3).expect("db");
        assert_eq!(
            s.enroll(&cert("c9", "g", "04")).expect("db"),
            Err(EnrollRefusal::KeyRevoked("g".into()))
        );
    }

    pub(super) fn renewal<'a>(old: &'a str, serial: &'a str, now_ms: i64) -> Renewal<'a> {
        Renewal {
            name: "c1",
            group: "g",
            old_serial: old,
            serial,
            fingerprint: "f",
            not_after_ms: now_ms + 100,
            now_ms,
            revoke_old_at_ms: now_ms + 5,
            root_sha256: "r",
        }
    }

    /// The root of each certificate is recorded, and a connector's listing
    /// carries its current certificate's: a renewal by another root moves
    /// the connector to it.
    pub(super) fn a_connectors_current_root_follows_its_renewals(s: &Store) {
        let old = NewCertificate {
            root_sha256: "old-root",
            not_after_ms: 1_000,
            ..cert("c1", "g", "01")
        };
        assert_eq!(s.enroll(&old).expect("db"), Ok(()));
        let root = |s: &Store| s.connectors().expect("db")[0].root_sha256.clone();
        assert_eq!(root(s).as_deref(), Some("old-root"));
        let renewed = Renewal {
            root_sha256: "new-root",
            ..renewal("01", "02", 2)
        };
        assert_eq!(s.renew(&renewed).expect("db"), Ok(()));
        assert_eq!(root(s).as_deref(), Some("new-root"));
    }

    pub(super) fn renewal_supersedes_after_a_grace_and_checks_the_presented_serial(s: &Store) {
        assert_eq!(s.enroll(&cert("c1", "g", "01")).expect("db"), Ok(()));
        assert_eq!(s.enroll(&cert("c2", "g", "09")).expect("db"), Ok(()));
        assert_eq!(s.renew(&renewal("01", "02", 2)).expect("db"), Ok(()));
        // In grace: both valid, the new one current.
        assert!(
            s.certificate("01")
                .expect("db")
                .expect("known")
                .revoked
                .is_none()
        );
        assert_eq!(s.connectors().expect("db")[0].serial.as_deref(), Some("02"));
        assert_eq!(s.revoke_after_grace(6).expect("db"), vec![]);
        // The old one renews again while in grace; its grace is not extended.
        assert_eq!(s.renew(&renewal("01", "03", 4)).expect("db"), Ok(()));
        assert_eq!(
            s.revoke_after_grace(7).expect("db"),
            vec![("c1".to_owned(), "01".to_owned())]
        );
        assert!(
            s.certificate("01")
                .expect("db")
                .expect("known")
                .revoked
                .is_some()
        );
        assert_eq!(s.revoke_after_grace(8).expect("db"), vec![]);
        assert_eq!(
            s.revoke_after_grace(9).expect("db"),
            vec![("c1".to_owned(), "02".to_owned())]
        );
        let history = s.certificate_history(10).expect("db");
        let serials: Vec<&str> = history["c1"].iter().map(|h| h.serial.as_str()).collect();
        assert_eq!(serials, ["03", "02", "01"]);
        // Refusals: revoked, unknown, another connector's, expired, disabled.
        assert!(matches!(
            s.renew(&renewal("01", "04", 10)).expect("db"),
            Err(RenewRefusal::Revoked { .. })
        ));
        assert!(matches!(
            s.renew(&renewal("77", "04", 10)).expect("db"),
            Err(RenewRefusal::Unknown(_))
        ));
        assert!(matches!(
            s.renew(&renewal("09", "04", 10)).expect("db"),
            Err(RenewRefusal::Unknown(_))
        ));
        assert!(matches!(
            s.renew(&renewal("03", "04", 104)).expect("db"),
            Err(RenewRefusal::Expired(_))
        ));
        assert!(s.set_disabled("c1", true, 11).expect("db"));
        assert_eq!(
            s.renew(&renewal("03", "04", 12)).expect("db"),
            Err(RenewRefusal::Disabled("c1".into()))
        );
        assert!(
            s.certificate("04").expect("db").is_none(),
            "nothing recorded"
        );
    }

    pub(super) fn a_name_with_a_valid_certificate_is_reenrolled_only_with_leave_once(s: &Store) {
        let at = |serial, now_ms| NewCertificate {
            max_uses: 10,
            now_ms,
            ..cert("c1", "g", serial)
        };
        assert_eq!(s.enroll(&at("01", 1)).expect("db"), Ok(()));
        assert_eq!(
            s.enroll(&at("02", 2)).expect("db"),
            Err(EnrollRefusal::NameTaken("c1".into()))
        );
        assert!(
            s.certificate("01")
                .expect("db")
                .expect("known")
                .revoked
                .is_none()
        );
        // Leave that ran out is no leave.
        assert!(s.allow_reenroll("c1", 3, 2).expect("db"));
        assert_eq!(
            s.enroll(&at("02", 4)).expect("db"),
            Err(EnrollRefusal::NameTaken("c1".into()))
        );
        assert!(s.allow_reenroll("c1", 6, 4).expect("db"));
        assert_eq!(s.enroll(&at("02", 5)).expect("db"), Ok(()));
        assert_eq!(
            s.enroll(&at("03", 5)).expect("db"),
            Err(EnrollRefusal::NameTaken("c1".into())),
            "once"
        );
        // An expired certificate holds no name: the key re-enrolls it.
        assert_eq!(s.enroll(&at("04", 10)).expect("db"), Ok(()));
        assert_eq!(
            s.key_usage("g", "k1").expect("db").uses,
            3,
            "refusals use nothing"
        );
        assert!(!s.allow_reenroll("nobody", 6, 4).expect("db"));
    }

    pub(super) fn a_deleted_connector_frees_its_name_and_stays_revoked(s: &Store) {
        assert_eq!(s.enroll(&cert("c1", "g", "01")).expect("db"), Ok(()));
        assert!(s.set_disabled("c1", true, 1).expect("db"));
        assert_eq!(s.delete_connector("c1", 2).expect("db"), Some(1));
        assert_eq!(s.delete_connector("c1", 2).expect("db"), None);
        assert!(s.connectors().expect("db").is_empty());
        assert!(!s.set_disabled("c1", true, 2).expect("db"), "not enrolled");
        assert!(!s.allow_reenroll("c1", 9, 2).expect("db"), "not enrolled");
        assert_eq!(s.revoke_certificates("c1", "t", 2).expect("db"), None);
        assert_eq!(s.revoke_certificates("nobody", "t", 2).expect("db"), None);
        assert!(
            s.certificate("01")
                .expect("db")
                .expect("known")
                .revoked
                .is_some()
        );
        assert_eq!(s.enroll(&cert("c1", "h", "02")).expect("db"), Ok(()));
        let c = &s.connectors().expect("db")[0];
        assert_eq!((c.group.as_str(), c.disabled), ("h", false));
        assert!(
            s.certificate("01")
                .expect("db")
                .expect("known")
                .revoked
                .is_some()
        );
        assert_eq!(s.delete_connector("nobody", 2).expect("db"), None);
    }

    /// Two stores on one database (two replicas): with one use left on a
    /// key, concurrent enrollments of different names succeed exactly once.
    pub(super) fn concurrent_enrollments_use_a_key_once(a: &Store, b: &Store) {
        for round in 0..5 {
            let key = format!("once-{round}");
            let (sa, sb) = (format!("a{round}"), format!("b{round}"));
            let (na, nb) = (format!("ca{round}"), format!("cb{round}"));
            let enroll = |s: &Store, name: &str, serial: &str| {
                s.enroll(&NewCertificate {
                    key_sha256: &key,
                    max_uses: 1,
                    ..cert(name, "g", serial)
                })
                .expect("db")
            };
            let barrier = std::sync::Barrier::new(2);
            let (ra, rb) = std::thread::scope(|scope| {
                let ta = scope.spawn(|| {
                    barrier.wait();
                    enroll(a, &na, &sa)
                });
                let tb = scope.spawn(|| {
                    barrier.wait();
                    enroll(b, &nb, &sb)
                });
                (ta.join().expect("thread"), tb.join().expect("thread"))
            });
            let ok = [&ra, &rb].iter().filter(|r| r.is_ok()).count();
            assert_eq!(ok, 1, "round {round}: {ra:?} {rb:?}");
            assert!(
                [&ra, &rb].iter().any(|r| matches!(
                    r,
                    Err(EnrollRefusal::KeyExhausted {
                        uses: 1,
                        max: 1,
                        ..
                    })
                )),
                "round {round}: {ra:?} {rb:?}"
            );
            assert_eq!(a.key_usage("g", &key).expect("db").uses, 1);
            assert_eq!(b.key_usage("g", &key).expect("db").uses, 1);
        }
    }

    /// A revocation, a disable or a delete made through one store is seen
    /// through the other at once (what the reconcile reads), and replicas
    /// register and list each other.
    pub(super) fn changes_and_replicas_are_shared(a: &Store, b: &Store) {
        assert_eq!(a.enroll(&cert("c1", "g", "01")).expect("db"), Ok(()));
        assert_eq!(a.enroll(&cert("c2", "g", "02")).expect("db"), Ok(()));
        let serials = vec!["01".to_owned(), "02".to_owned(), "99".to_owned()];
        let seen = b.certificates(&serials).expect("db");
        assert_eq!(seen.len(), 2, "unknown serials are left out");
        assert!(seen.values().all(|r| r.revoked.is_none() && !r.disabled));
        assert_eq!(a.revoke_certificates("c1", "test", 2).expect("db"), Some(1));
        assert!(a.set_disabled("c2", true, 2).expect("db"));
        let seen = b.certificates(&serials).expect("db");
        assert_eq!(seen["01"].revoked, Some((2, "test".to_owned())));
        assert!(seen["02"].disabled);
        // Many serials at once (past one statement's chunk).
        let many: Vec<String> = (0..1200)
            .map(|i| format!("x{i}"))
            .chain(serials.iter().cloned())
            .collect();
        assert_eq!(b.certificates(&many).expect("db").len(), 2);

        let replica = |id: &str, at: i64| ReplicaRecord {
            id: id.to_owned(),
            addresses: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
            version: "0.1.0".into(),
            started_ms: 1,
            heartbeat_ms: at,
            policy_hash: "h".into(),
        };
        a.heartbeat(&replica("r1", 10), 0).expect("db");
        b.heartbeat(&replica("r2", 20), 0).expect("db");
        a.heartbeat(&replica("r1", 30), 0).expect("db");
        let listed = b.replicas().expect("db");
        assert_eq!(listed, vec![replica("r1", 30), replica("r2", 20)]);
        // A replica silent past the cutoff is forgotten; a clean stop
        // removes its own entry.
        b.heartbeat(&replica("r2", 40), 35).expect("db");
        assert_eq!(a.replicas().expect("db"), vec![replica("r2", 40)]);
        b.remove_replica("r2").expect("db");
        assert!(a.replicas().expect("db").is_empty());
    }

    /// A transition to `to` of `connector` for `host`:80/tcp in segment `s`.
    pub(super) fn event(at_ms: i64, host: &str, connector: &str, to: &str) -> EventRecord {
        EventRecord {
            at_ms,
            segment: "s".into(),
            host: host.into(),
            protocol: "tcp".into(),
            port: 80,
            connector: connector.into(),
            from: "unknown".into(),
            to: to.into(),
            cause: "report".into(),
        }
    }

    /// Two replicas record the same address changes: each is kept once;
    /// the address history is read by address (or every address with
    /// `*`), apart from the status history, and pruned with it.
    pub(super) fn address_history_is_recorded_once_filtered_and_pruned(a: &Store, b: &Store) {
        let change = |at_ms, address: &str, from: &str, to: &str, cause: &str| AddressEventRecord {
            event: EventRecord {
                from: from.into(),
                cause: cause.into(),
                ..event(at_ms, "a.test", "c1", to)
            },
            address: address.into(),
        };
        let seen = [
            change(1_000, "10.0.0.1", "unknown", "up", "appeared"),
            change(1_000, "10.0.0.2", "unknown", "down", "appeared"),
            change(5_000, "10.0.0.2", "down", "unknown", "left"),
        ];
        for c in &seen {
            a.record_address_events(std::slice::from_ref(c))
                .expect("recorded");
            // The other replica saw it a little later.
            let mut later = c.clone();
            later.event.at_ms += 7;
            b.record_address_events(&[later]).expect("recorded");
        }
        let by = |address: &str| EventFilter {
            host: Some("a.test".into()),
            address: Some(address.into()),
            ..Default::default()
        };
        let (page, total) = b.address_events(&by("10.0.0.2"), 10, 0).expect("read");
        assert_eq!(total, 2, "{page:?}");
        assert_eq!(page[0], seen[2], "newest first, once");
        assert_eq!(page[1], seen[1]);
        let (_, total) = a.address_events(&by("*"), 10, 0).expect("read");
        assert_eq!(total, 3);
        // The status history holds none of them.
        assert_eq!(a.events(&EventFilter::default(), 10, 0).expect("read").1, 0);
        assert_eq!(a.prune_events(2_000).expect("pruned"), 0);
        let (page, total) = b.address_events(&by("*"), 10, 0).expect("read");
        assert_eq!((total, page.first()), (1, Some(&seen[2])));
    }

    /// A batch of address changes is compared row by row, each with the
    /// result its address ends with at that point of the batch: a result
    /// repeated by another connector is a copy, whichever address comes
    /// between; the next batch starts from the result the last one ended
    /// with. Rows keep the batch's order.
    pub(super) fn an_address_batch_is_compared_row_by_row(s: &Store) {
        let change = |at_ms, address: &str, connector: &str, to: &str| AddressEventRecord {
            event: event(at_ms, "a.test", connector, to),
            address: address.into(),
        };
        s.record_address_events(&[
            change(1_000, "10.0.0.1", "c1", "up"),
            change(1_001, "10.0.0.2", "c1", "up"),
            change(1_002, "10.0.0.1", "c2", "up"),
            change(1_003, "10.0.0.1", "c2", "down"),
            change(1_004, "10.0.0.2", "c2", "up"),
            change(1_005, "10.0.0.1", "c1", "down"),
            change(1_006, "10.0.0.1", "c1", "up"),
        ])
        .expect("recorded");
        s.record_address_events(&[
            change(2_000, "10.0.0.1", "c2", "up"),
            change(2_001, "10.0.0.2", "c2", "down"),
        ])
        .expect("recorded");
        let all = EventFilter {
            address: Some("*".into()),
            ..Default::default()
        };
        let (page, total) = s.address_events(&all, 10, 0).expect("read");
        let rows: Vec<_> = page
            .iter()
            .rev()
            .map(|r| (r.event.at_ms, r.address.as_str(), r.event.to.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                (1_000, "10.0.0.1", "up"),
                (1_001, "10.0.0.2", "up"),
                (1_003, "10.0.0.1", "down"),
                (1_006, "10.0.0.1", "up"),
                (2_001, "10.0.0.2", "down"),
            ]
        );
        assert_eq!(total, 5);
    }

    pub(super) fn history_is_filtered_paged_and_pruned(s: &Store) {
        s.record_events(&[
            event(1_000, "a.test", "c1", "up"),
            event(2_000, "a.test", "c2", "down"),
            event(3_000, "b.test", "c1", "down"),
            event(4_000, "a.test", "c1", "down"),
        ])
        .expect("recorded");
        let a = EventFilter {
            host: Some("a.test".into()),
            ..Default::default()
        };
        let (page, total) = s.events(&a, 2, 0).expect("read");
        assert_eq!(total, 3);
        assert_eq!(
            page.iter().map(|e| e.at_ms).collect::<Vec<_>>(),
            [4_000, 2_000],
            "newest first"
        );
        let (page, _) = s.events(&a, 2, 2).expect("read");
        assert_eq!(page.iter().map(|e| e.at_ms).collect::<Vec<_>>(), [1_000]);
        let window = EventFilter {
            connector: Some("c1".into()),
            since_ms: Some(1_000),
            until_ms: Some(4_000),
            ..Default::default()
        };
        let (page, total) = s.events(&window, 10, 0).expect("read");
        assert_eq!(total, 2, "since inclusive, until exclusive: {page:?}");
        let hidden = EventFilter {
            hidden_segments: vec!["s".into()],
            ..Default::default()
        };
        assert_eq!(s.events(&hidden, 10, 0).expect("read").1, 0);
        assert_eq!(s.prune_events(3_000).expect("pruned"), 2);
        let (page, total) = s.events(&EventFilter::default(), 10, 0).expect("read");
        assert_eq!(total, 2);
        assert!(page.iter().all(|e| e.at_ms >= 3_000));
    }

    /// Two replicas (two stores on one database) both record every
    /// transition they see: each is kept once, whichever came first, and a
    /// flap (up, down, up) stays three rows.
    pub(super) fn history_rows_are_recorded_once_across_replicas(a: &Store, b: &Store) {
        for (i, to) in ["up", "down", "up"].into_iter().enumerate() {
            let at = 1_000 * (i as i64 + 1);
            a.record_events(&[event(at, "a.test", "c1", to)])
                .expect("recorded");
            // The other replica saw it a little later, with another
            // connector's transition in the same batch.
            b.record_events(&[
                event(at + 7, "a.test", "c1", to),
                event(at + 7, "a.test", "c2", to),
            ])
            .expect("recorded");
        }
        let c1 = EventFilter {
            connector: Some("c1".into()),
            ..Default::default()
        };
        let (page, total) = a.events(&c1, 10, 0).expect("read");
        assert_eq!(total, 3, "{page:?}");
        assert_eq!(
            page.iter()
                .map(|e| (e.at_ms, e.to.as_str()))
                .collect::<Vec<_>>(),
            [(3_000, "up"), (2_000, "down"), (1_000, "up")],
            "the first replica's copy of each"
        );
        let c2 = EventFilter {
            connector: Some("c2".into()),
            ..Default::default()
        };
        assert_eq!(b.events(&c2, 10, 0).expect("read").1, 3, "c2's own rows");
    }

    /// One batch holding several transitions of a key (a flap inside one
    /// pump) and copies of them: each change is kept once, in order; after
    /// the retention the key's latest status goes with its rows.
    pub(super) fn a_batch_is_compared_row_by_row_and_pruned_with_its_latest(s: &Store) {
        s.record_events(&[
            event(1_000, "a.test", "c1", "up"),
            event(1_001, "a.test", "c1", "up"),
            event(1_002, "a.test", "c2", "up"),
            event(1_003, "a.test", "c1", "down"),
            event(1_004, "a.test", "c1", "down"),
            event(1_005, "a.test", "c1", "up"),
        ])
        .expect("recorded");
        let c1 = EventFilter {
            connector: Some("c1".into()),
            ..Default::default()
        };
        let (page, _) = s.events(&c1, 10, 0).expect("read");
        assert_eq!(
            page.iter()
                .map(|e| (e.at_ms, e.to.as_str()))
                .collect::<Vec<_>>(),
            [(1_005, "up"), (1_003, "down"), (1_000, "up")]
        );
        // The next batch continues from where the last one ended.
        s.record_events(&[event(2_000, "a.test", "c1", "up")])
            .expect("recorded");
        assert_eq!(s.events(&c1, 10, 0).expect("read").1, 3, "a copy");
        assert_eq!(s.prune_events(3_000).expect("pruned"), 4);
        s.record_events(&[event(4_000, "a.test", "c1", "up")])
            .expect("recorded");
        assert_eq!(
            s.events(&c1, 10, 0).expect("read").1,
            1,
            "past the retention, the status is recorded afresh"
        );
    }

    /// An admin action `action` on `target` by token `actor` at `at_ms`.
    pub(super) fn audited(at_ms: i64, actor: &str, action: &str, target: &str) -> AuditRecord {
        AuditRecord {
            at_ms,
            actor_kind: "token".into(),
            actor: actor.into(),
            source: "127.0.0.1".into(),
            action: action.into(),
            target: target.into(),
            outcome: "ok".into(),
            detail: String::new(),
            provider: String::new(),
            subject: String::new(),
        }
    }

    /// The audit trail is shared by two stores on one database (two
    /// replicas), read newest first with filters and paging, and pruned.
    pub(super) fn sessions_and_sign_ins_are_shared_and_revocable(a: &Store, b: &Store) {
        let session = SessionRecord {
            id_sha256: "s1".into(),
            person: "alice".into(),
            provider: "corp".into(),
            scopes: "admin".into(),
            created_ms: 1_000,
            expires_ms: 9_000,
            revoked_ms: None,
            subject: "248289761001".into(),
            sid: Some("sid-1".into()),
            roles: Some(r#"["reach-admins"]"#.into()),
            checked_ms: 1_000,
            refresh_sealed: Some("sealed-1".into()),
        };
        a.create_session(&session).expect("create");
        assert_eq!(b.session("s1").expect("read"), Some(session.clone()));
        assert_eq!(b.session("nope").expect("read"), None);
        assert!(b.revoke_session("s1", 2_000).expect("revoke"));
        assert!(!a.revoke_session("s1", 3_000).expect("revoke twice"));
        assert_eq!(
            a.session("s1").expect("read").and_then(|s| s.revoked_ms),
            Some(2_000)
        );
        // A later session forgets those that ended before it.
        let later = SessionRecord {
            id_sha256: "s2".into(),
            created_ms: 10_000,
            expires_ms: 20_000,
            ..session
        };
        b.create_session(&later).expect("create");
        assert_eq!(a.session("s1").expect("read"), None);
        assert_eq!(
            a.sessions(10_500).expect("list"),
            std::slice::from_ref(&later)
        );

        // One replica wins a re-validation; what it learnt is shared.
        assert!(a.claim_session_check("s2", 1_000, 11_000).expect("claim"));
        assert!(!b.claim_session_check("s2", 1_000, 11_001).expect("lost"));
        b.session_refreshed("s2", r#"["reach-readers"]"#, Some("sealed-2"))
            .expect("refreshed");
        b.session_refreshed("s2", r#"["reach-readers"]"#, None)
            .expect("refreshed, no new token");
        let seen = a.session("s2").expect("read").expect("there");
        assert_eq!(
            (
                seen.checked_ms,
                seen.roles.as_deref(),
                seen.refresh_sealed.as_deref()
            ),
            (11_000, Some(r#"["reach-readers"]"#), Some("sealed-2"))
        );

        // A back-channel logout names the provider's session, or the subject.
        let third = SessionRecord {
            id_sha256: "s3".into(),
            sid: None,
            ..later.clone()
        };
        a.create_session(&third).expect("create");
        assert_eq!(
            b.revoke_provider_sessions("other", Some("sid-1"), None, 12_000)
                .expect("revoke"),
            0
        );
        assert_eq!(
            b.revoke_provider_sessions("corp", Some("sid-1"), None, 12_000)
                .expect("revoke"),
            1
        );
        assert_eq!(a.sessions(12_000).expect("list"), [third]);
        assert_eq!(
            a.revoke_provider_sessions("corp", None, Some("248289761001"), 12_000)
                .expect("revoke"),
            1
        );
        assert!(a.sessions(12_000).expect("list").is_empty());
        assert!(
            a.logout_token_once("corp", "j1", 20_000, 12_000)
                .expect("once")
        );
        assert!(
            !b.logout_token_once("corp", "j1", 20_000, 12_000)
                .expect("replay")
        );
        assert!(
            b.logout_token_once("other", "j1", 20_000, 12_000)
                .expect("another provider")
        );
        assert!(
            b.logout_token_once("corp", "j1", 30_000, 21_000)
                .expect("expired, forgotten")
        );

        let login = LoginRecord {
            state_sha256: "st".into(),
            provider: "corp".into(),
            verifier: "v".into(),
            nonce: "n".into(),
            next: "/".into(),
            expires_ms: 5_000,
        };
        a.put_login(&login, 1_000).expect("put");
        assert_eq!(
            b.take_login("st", 2_000).expect("take"),
            Some(login.clone())
        );
        assert_eq!(a.take_login("st", 2_000).expect("taken once"), None);
        a.put_login(&login, 1_000).expect("put");
        assert_eq!(b.take_login("st", 6_000).expect("expired"), None);
    }

    pub(super) fn audit_is_shared_filtered_paged_and_pruned(a: &Store, b: &Store) {
        a.record_audit(&audited(1_000, "root", "connector.revoke", "c1"))
            .expect("recorded");
        let mut refused = audited(2_000, "alice", "connector.disable", "c2");
        refused.actor_kind = "person".into();
        refused.provider = "corp".into();
        refused.subject = "248289761001".into();
        refused.outcome = "not_found".into();
        refused.detail = "no enrolled connector \"c2\"".into();
        b.record_audit(&refused).expect("recorded");
        b.record_audit(&audited(2_000, "root", "connector.delete", "c1"))
            .expect("recorded");
        a.record_audit(&audited(3_000, "root", "provisioning_key.revoke", "g"))
            .expect("recorded");
        let (page, total) = b.audit(&AuditFilter::default(), 2, 0).expect("read");
        assert_eq!(total, 4);
        assert_eq!(
            page.iter().map(|r| r.action.as_str()).collect::<Vec<_>>(),
            ["provisioning_key.revoke", "connector.delete"],
            "newest first; the same millisecond, the later one first"
        );
        let (page, _) = b.audit(&AuditFilter::default(), 2, 2).expect("read");
        assert_eq!(page[0], refused, "{page:?}");
        let by = |f: AuditFilter| a.audit(&f, 10, 0).expect("read");
        let (page, total) = by(AuditFilter {
            target: Some("c1".into()),
            ..Default::default()
        });
        assert_eq!((total, page[0].at_ms), (2, 2_000));
        let (_, total) = by(AuditFilter {
            actor: Some("root".into()),
            since_ms: Some(2_000),
            ..Default::default()
        });
        assert_eq!(total, 2, "since is inclusive");
        let (page, total) = by(AuditFilter {
            action: Some("connector.disable".into()),
            ..Default::default()
        });
        assert_eq!((total, page[0].actor.as_str()), (1, "alice"));
        assert_eq!(a.prune_audit(2_000).expect("pruned"), 1);
        let (page, total) = b.audit(&AuditFilter::default(), 10, 0).expect("read");
        assert_eq!(total, 3);
        assert!(page.iter().all(|r| r.at_ms >= 2_000), "{page:?}");
        // Refusals of unknown tokens: one entry per source and minute.
        for (store, source, minute) in [
            (a, "192.0.2.1", 60_000),
            (b, "192.0.2.1", 60_000),
            (a, "192.0.2.1", 60_000),
            (a, "192.0.2.2", 60_000),
            (b, "192.0.2.1", 120_000),
        ] {
            store.count_refusal(source, minute).expect("counted");
        }
        let (page, total) = by(AuditFilter {
            action: Some("token.refused".into()),
            ..Default::default()
        });
        let seen: Vec<(i64, &str, &str, &str)> = page
            .iter()
            .map(|r| {
                (
                    r.at_ms,
                    r.source.as_str(),
                    r.actor_kind.as_str(),
                    r.detail.as_str(),
                )
            })
            .collect();
        assert_eq!(total, 3, "{seen:?}");
        assert!(
            seen.contains(&(60_000, "192.0.2.1", "unknown", "refusals: 3")),
            "{seen:?}"
        );
        assert!(
            seen.contains(&(60_000, "192.0.2.2", "unknown", "refusals: 1")),
            "{seen:?}"
        );
        assert!(
            seen.contains(&(120_000, "192.0.2.1", "unknown", "refusals: 1")),
            "{seen:?}"
        );
    }
}

#[cfg(test)]
/// The suite over one backend: `$open()` makes a fresh store, `$pair()` two
/// stores on one fresh database.
macro_rules! suite {
    ($backend:ident, $open:expr, $pair:expr) => {
        mod $backend {
            use super::suite::*;

            #[test]
            fn disabled_is_looked_up_by_name() {
                super::suite::disabled_is_looked_up_by_name(&$open());
            }

            #[test]
            fn enrollment_counts_uses_and_supersedes_certificates() {
                super::suite::enrollment_counts_uses_and_supersedes_certificates(&$open());
            }

            #[test]
            fn disabled_other_group_and_revoked_key_are_refused() {
                super::suite::disabled_other_group_and_revoked_key_are_refused(&$open());
            }

            #[test]
            fn a_connectors_current_root_follows_its_renewals() {
                super::suite::a_connectors_current_root_follows_its_renewals(&$open());
            }

            #[test]
            fn renewal_supersedes_after_a_grace_and_checks_the_presented_serial() {
                super::suite::renewal_supersedes_after_a_grace_and_checks_the_presented_serial(
                    &$open(),
                );
            }

            #[test]
            fn a_name_with_a_valid_certificate_is_reenrolled_only_with_leave_once() {
                super::suite::a_name_with_a_valid_certificate_is_reenrolled_only_with_leave_once(
                    &$open(),
                );
            }

            #[test]
            fn a_deleted_connector_frees_its_name_and_stays_revoked() {
                super::suite::a_deleted_connector_frees_its_name_and_stays_revoked(&$open());
            }

            #[test]
            fn concurrent_enrollments_use_a_key_once() {
                let (a, b) = $pair();
                super::suite::concurrent_enrollments_use_a_key_once(&a, &b);
            }

            #[test]
            fn a_batch_is_compared_row_by_row_and_pruned_with_its_latest() {
                super::suite::a_batch_is_compared_row_by_row_and_pruned_with_its_latest(&$open());
            }

            #[test]
            fn history_is_filtered_paged_and_pruned() {
                super::suite::history_is_filtered_paged_and_pruned(&$open());
            }

            #[test]
            fn an_address_batch_is_compared_row_by_row() {
                super::suite::an_address_batch_is_compared_row_by_row(&$open());
            }

            #[test]
            fn address_history_is_recorded_once_filtered_and_pruned() {
                let (a, b) = $pair();
                super::suite::address_history_is_recorded_once_filtered_and_pruned(&a, &b);
            }

            #[test]
            fn history_rows_are_recorded_once_across_replicas() {
                let (a, b) = $pair();
                super::suite::history_rows_are_recorded_once_across_replicas(&a, &b);
            }

            #[test]
            fn changes_and_replicas_are_shared() {
                let (a, b) = $pair();
                super::suite::changes_and_replicas_are_shared(&a, &b);
            }

            #[test]
            fn audit_is_shared_filtered_paged_and_pruned() {
                let (a, b) = $pair();
                super::suite::audit_is_shared_filtered_paged_and_pruned(&a, &b);
            }

            #[test]
            fn sessions_and_sign_ins_are_shared_and_revocable() {
                let (a, b) = $pair();
                super::suite::sessions_and_sign_ins_are_shared_and_revocable(&a, &b);
            }

            #[test]
            fn drains_are_shared_kept_and_ended() {
                let (a, b) = $pair();
                super::suite::drains_are_shared_kept_and_ended(&a, &b);
            }

            #[test]
            fn a_shared_secret_is_created_once() {
                let (a, b) = $pair();
                super::suite::a_shared_secret_is_created_once(&a, &b);
            }
        }
    };
}

#[cfg(test)]
fn postgres_store(url: &str) -> Store {
    Store::open(&StoreLocation::Postgres {
        url: url.to_owned(),
        password: None,
    })
    .expect("PostgreSQL store")
}

#[cfg(test)]
suite!(sqlite_suite, || Store::in_memory().expect("db"), || {
    let dir = std::env::temp_dir().join(format!(
        "reach-store-pair-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = StoreLocation::Sqlite(dir.join("reach.db"));
    (
        Store::open(&path).expect("db"),
        Store::open(&path).expect("db"),
    )
});

#[cfg(test)]
suite!(
    postgres_suite,
    || postgres_store(
        &test_support::Postgres::shared()
            .fresh_database()
            .expect("database")
    ),
    || {
        let url = test_support::Postgres::shared()
            .fresh_database()
            .expect("database");
        (postgres_store(&url), postgres_store(&url))
    }
);

/// Waits until `store`'s listener listens: it announces itself once it
/// does (perhaps before a receiver subscribed: the count tells).
#[cfg(test)]
fn listening(store: &Store) {
    announced_since(store, Some(0), "LISTEN established");
}

/// Waits until `store`'s announcement count is no longer `before`: `what`
/// was announced.
#[cfg(test)]
fn announced_since(store: &Store, before: Option<u64>, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while store.announced() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not announced within 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// PostgreSQL only: a change made through one store is announced to the
/// other (`NOTIFY` → `changes`), which is what wakes a replica's reconcile
/// before its next periodic pass.
#[cfg(test)]
#[test]
fn postgres_changes_are_announced_to_other_stores() {
    let url = test_support::Postgres::shared()
        .fresh_database()
        .expect("database");
    let (a, b) = (postgres_store(&url), postgres_store(&url));
    let mut rx = a.changes().expect("PostgreSQL announces changes");
    let wait = |rx: &mut watch::Receiver<u64>, what: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !rx.has_changed().expect("listener runs") {
            assert!(
                std::time::Instant::now() < deadline,
                "no change within 10 s: {what}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        rx.mark_unchanged();
    };
    listening(&a);
    rx.borrow_and_update();
    assert_eq!(b.enroll(&suite::cert("c1", "g", "01")).expect("db"), Ok(()));
    assert_eq!(b.revoke_certificates("c1", "test", 2).expect("db"), Some(1));
    wait(&mut rx, "revocation on the other store");
    assert!(b.set_disabled("c1", true, 3).expect("db"));
    wait(&mut rx, "disable on the other store");
    assert!(Store::in_memory().expect("db").changes().is_none());
}

/// The PostgreSQL backend of `store` (tests of what only it does).
#[cfg(test)]
fn pg_backend(store: &Store) -> &PgStore {
    let Backend::Postgres(p) = &store.backend else {
        unreachable!("a PostgreSQL store")
    };
    p
}

/// Ends the LISTEN connections to database `db` of `server`; how many.
#[cfg(test)]
fn end_listen(server: &test_support::Postgres, db: &str) -> String {
    server
        .psql(
            db,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = current_database() AND query LIKE 'LISTEN%'",
        )
        .expect("psql")
}

/// PostgreSQL only: a change committed through a store is announced to
/// that store's own `changes` by the time the call returns, not when its
/// `NOTIFY` comes back through its `LISTEN` (here that connection is ended
/// first: it listens again only after a second's pause); a transaction
/// that announced nothing bumps nothing.
#[cfg(test)]
#[test]
fn postgres_a_change_is_announced_to_its_own_store_at_commit() {
    let server = test_support::Postgres::shared();
    let url = server.fresh_database().expect("database");
    let db = test_support::Postgres::database_of(&url).expect("database name");
    let a = postgres_store(&url);
    listening(&a);
    assert_eq!(a.enroll(&suite::cert("c1", "g", "01")).expect("db"), Ok(()));
    assert_eq!(end_listen(server, db), "1", "the store's LISTEN connection");
    let before = a.announced();
    assert_eq!(a.enroll(&suite::cert("c2", "g", "02")).expect("db"), Ok(()));
    assert_eq!(a.announced(), before, "an enrollment announces nothing");
    assert_eq!(a.revoke_certificates("c1", "test", 3).expect("db"), Some(1));
    assert_ne!(
        a.announced(),
        before,
        "a revocation is announced to its own store at commit"
    );
}

/// How many times `store` asked its database `call`.
#[cfg(test)]
fn asked(store: &Store, call: &str) -> u64 {
    store
        .calls()
        .iter()
        .find(|(c, _)| *c == call)
        .map_or(0, |(_, n)| *n)
}

/// PostgreSQL only: a session's standing (is its connector disabled, is
/// its provisioning key revoked) is read from the database once per
/// announcement: asked again while nothing was announced, the store
/// answers from its reading; once another store disables, enables or
/// revokes, the change is announced and read. While the store does not
/// listen, every question goes to the database.
#[cfg(test)]
#[test]
fn postgres_standing_is_read_again_only_after_an_announcement() {
    let server = test_support::Postgres::shared();
    let url = server.fresh_database().expect("database");
    let db = test_support::Postgres::database_of(&url).expect("database name");
    let (a, b) = (postgres_store(&url), postgres_store(&url));
    listening(&a);
    assert_eq!(b.enroll(&suite::cert("c1", "g", "01")).expect("db"), Ok(()));
    let twice = |a: &Store, expected: bool| {
        let n = asked(a, "is_disabled");
        assert_eq!(a.is_disabled("c1").expect("db"), expected);
        assert_eq!(a.is_disabled("c1").expect("db"), expected);
        asked(a, "is_disabled") - n
    };
    assert_eq!(
        twice(&a, false),
        1,
        "the second answer comes from the reading"
    );
    for disabled in [true, false] {
        let before = a.announced();
        assert!(b.set_disabled("c1", disabled, 2).expect("db"));
        announced_since(&a, before, "the other store's change");
        assert_eq!(twice(&a, disabled), 1, "read again after the announcement");
    }
    let n = asked(&a, "key_revoked");
    assert!(!a.key_revoked("g", "k").expect("db"));
    assert!(!a.key_revoked("g", "k").expect("db"));
    assert_eq!(asked(&a, "key_revoked") - n, 1);
    let before = a.announced();
    b.revoke_key("g", "k", 3).expect("db");
    announced_since(&a, before, "the revocation");
    assert!(a.key_revoked("g", "k").expect("db"));
    assert!(!a.key_revoked("g", "other").expect("db"));
    let p = pg_backend(&a);
    // A reading answers for two seconds.
    assert!(!a.is_disabled("c1").expect("db"));
    let now = std::time::Instant::now();
    assert_eq!(p.known_revoked("g", "k", now), Some(true));
    assert_eq!(p.known_disabled("c1", now), Some(false));
    let later = now + std::time::Duration::from_millis(2_100);
    assert_eq!(p.known_revoked("g", "k", later), None);
    assert_eq!(p.known_disabled("c1", later), None);
    // The listener's connection ended: nothing is answered from a reading
    // until it listens again (it waits a second before it does).
    end_listen(server, db);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while p.listens() {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener did not notice its end"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(
        twice(&a, false),
        2,
        "both asked of the database while not listening"
    );
}

/// PostgreSQL only: `sslmode` is honoured (`require` refuses a server
/// without TLS, naming the mode) and bad URLs are named; without one, a
/// host off loopback or a root means TLS, and plain text to a host off
/// loopback, asked for, is warned about in the store's status.
#[cfg(test)]
#[test]
fn postgres_sslmode_is_honoured_and_bad_urls_are_named() {
    let url = test_support::Postgres::shared()
        .fresh_database()
        .expect("database");
    let open = |url: String| {
        Store::open(&StoreLocation::Postgres {
            url,
            password: None,
        })
    };
    let required = url.replace("sslmode=disable", "sslmode=require");
    let Err(e) = open(required) else {
        panic!("a server without TLS is refused under sslmode=require")
    };
    assert!(
        e.to_string().contains("TLS") && e.to_string().contains("sslmode=require"),
        "{e}"
    );
    // The server answers on loopback under the name `db.example`
    // (`hostaddr`): a host off loopback by its URL.
    let named = url.replace("127.0.0.1", "db.example") + "&hostaddr=127.0.0.1";
    let Err(e) = open(
        named
            .replace("sslmode=disable&", "")
            .replace("?sslmode=disable", "?"),
    ) else {
        panic!("a host off loopback without sslmode gets require")
    };
    assert!(e.to_string().contains("sslmode=require"), "{e}");
    let plain = open(named).expect("sslmode=disable, asked for");
    let warning = plain
        .status()
        .warning
        .expect("plain text off loopback is warned about");
    assert!(
        warning.contains("plain text") && warning.contains("sslmode=disable"),
        "{warning}"
    );
    drop(plain);
    let local = open(url.clone()).expect("loopback, plain text");
    assert_eq!(local.status().warning, None);
    drop(local);
    // A root given without sslmode means verify-full, on loopback too.
    let key = rcgen::KeyPair::generate().expect("key");
    let root = rcgen::CertificateParams::new(vec!["db.example".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("root");
    let root_file = std::env::temp_dir().join(format!(
        "reach-pg-root-{}-{}.pem",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::write(&root_file, root.pem()).expect("root");
    let rooted = url.replace(
        "sslmode=disable",
        &format!("sslrootcert={}", root_file.display()),
    );
    let Err(e) = open(rooted) else {
        panic!("sslrootcert without sslmode is verify-full: no plain text")
    };
    assert!(e.to_string().contains("sslmode=verify-full"), "{e}");
    let _ = std::fs::remove_file(&root_file);
    let Err(e) = open(url.replace("sslmode=disable", "sslmode=sometimes")) else {
        panic!("an unknown sslmode is refused")
    };
    assert!(e.to_string().contains("sslmode \"sometimes\""), "{e}");
    let Err(e) = open(format!("{url}&sslrootcert=/nonexistent/ca.pem")) else {
        panic!("a missing sslrootcert is refused")
    };
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
    // `prefer` falls back to plain text on this server.
    let preferred = open(url.replace("sslmode=disable", "sslmode=prefer")).expect("prefer");
    assert!(preferred.connectors().expect("db").is_empty());
}

/// PostgreSQL only, over TLS: a server with `ssl = on` and a certificate
/// from its own root (rcgen) is reached with `sslmode=verify-full` and that
/// root as `sslrootcert`; the same URL with another root is refused, the
/// error saying the certificate was not trusted.
#[cfg(test)]
#[test]
fn postgres_tls_verify_full_works_and_a_wrong_root_is_refused() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let root = |name: &str| {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("root");
        (cert.pem(), Issuer::new(params, key))
    };
    let (root_pem, issuer) = root("test database root");
    let (other_pem, _) = root("another root");
    let server_key = KeyPair::generate().expect("key");
    let server = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("names")
        .signed_by(&server_key, &issuer)
        .expect("server certificate");
    let pg = test_support::Postgres::start_tls(&server.pem(), &server_key.serialize_pem())
        .expect("PostgreSQL with TLS");
    let url = pg.fresh_database().expect("database");
    let dir = std::env::temp_dir().join(format!(
        "reach-pg-tls-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let (good, wrong) = (dir.join("root.pem"), dir.join("other.pem"));
    std::fs::write(&good, &root_pem).expect("write root");
    std::fs::write(&wrong, &other_pem).expect("write other root");
    let with_root = |path: &std::path::Path| {
        url.replace(
            "sslmode=disable",
            &format!("sslmode=verify-full&sslrootcert={}", path.display()),
        )
    };
    let open = |url: String| {
        Store::open(&StoreLocation::Postgres {
            url,
            password: None,
        })
    };
    let store = open(with_root(&good)).expect("verify-full with the server's root");
    store.ping().expect("answers over TLS");
    drop(store);
    // The root alone (no sslmode) means verify-full.
    let by_default = url.replace(
        "sslmode=disable",
        &format!("sslrootcert={}", good.display()),
    );
    let store = open(by_default).expect("verify-full by default with a root");
    store.ping().expect("answers over TLS");
    assert!(store.connectors().expect("db").is_empty());
    let Err(e) = open(with_root(&wrong)) else {
        panic!("a server certificate from another root is refused")
    };
    let shown = e.to_string();
    assert!(
        shown.contains("certificate")
            && (shown.contains("UnknownIssuer") || shown.contains("issuer")),
        "{shown}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
