//! The runtime `Settings` (everything in the file but the policy and the
//! secrets) and the rules that turn the file's `[server]`, `[selection]`,
//! `[health]`, `[tls]` and `[limits]` tables into them.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use policy::{Strategy, Tolerance};

use super::file::{
    FileConfig, HealthSection, LimitsSection, ReplicaSection, SelectionSection, ServerSection,
    StoreSection, TlsSection,
};
use super::{Problem, setting};

/// Runtime settings (everything in the file except policy and secrets).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// gRPC listen address (`[server] grpc_listen`).
    pub grpc_listen: SocketAddr,
    /// HTTP listen address (`[server] http_listen`).
    pub http_listen: SocketAddr,
    /// Reads need no token (`[server] anonymous_read`).
    pub anonymous_read: bool,
    /// The `host[:port]` names the CA's HTTPS listener is reached by
    /// (`[server] public_names`, normalised host and port if written);
    /// empty: any `Host`. A request whose `Host` (`:authority`) is none of
    /// them is refused (`api::guard`).
    pub public_names: Vec<(String, Option<u16>)>,
    /// How often the config file is checked for changes
    /// (`[server] reload_poll_ms`, default 1000).
    pub reload_poll: Duration,
    /// Selection strategy (`[selection] strategy`); a segment's own
    /// `strategy` wins.
    pub strategy: Strategy,
    /// How far from the best RTT the `nearest` strategy still draws from
    /// (`[selection] nearest_tolerance_percent`, default 20, and
    /// `nearest_tolerance_ms`, default 2: whichever is larger).
    pub nearest_tolerance: Tolerance,
    /// How long an access waits for on-access discovery
    /// (`[selection] discovery_timeout_ms`, default 3000).
    pub discovery_timeout: Duration,
    /// On-access window (`[health] on_access_window_ms`, else
    /// `on_access_window_s`, default 1800 s).
    pub on_access_window: Duration,
    /// A report older than this many report intervals (plus the connector's
    /// cycle time) is Unknown (`[health] stale_after_intervals`, default 3).
    pub stale_after_intervals: u32,
    /// Checks per connector cycle above which the CA warns
    /// (`[health] check_budget`, default 6000).
    pub check_budget: u64,
    /// Heartbeat interval imposed on connectors
    /// (`[health] heartbeat_interval_ms`, default 5000).
    pub heartbeat_interval: Duration,
    /// At most one access forward per application and connector this often
    /// (`[health] access_forward_interval_ms`, default 60000).
    pub access_forward_interval: Duration,
    /// Rate limit imposed on connectors, 0 = their own
    /// (`[health] checks_per_second`).
    pub connector_checks_per_second: u32,
    /// Check timeout imposed on connectors, 0 = their own
    /// (`[health] check_timeout_ms`).
    pub connector_check_timeout_ms: u32,
    /// Rate assumed for a connector that did not state one
    /// (`[health] assumed_checks_per_second`, default 20).
    pub assumed_checks_per_second: u32,
    /// Status transitions kept per application for the dashboard
    /// (`[health] transitions_kept`, default 20).
    pub transitions_kept: usize,
    /// Shortest subnet prefixes a segment's application entry may have
    /// (`[health] min_subnet_prefix_v4`, default 8, and
    /// `min_subnet_prefix_v6`, default 8); `/0` is always refused.
    pub min_subnet_prefix: (u8, u8),
    /// How long after its last report an on-access application's entry
    /// that is Unknown (its window ended) stays listed before it is removed
    /// (`[health] on_access_retention_s`, default 3600).
    pub on_access_retention: Duration,
    /// Live on-access windows per connector, whether opened by accesses or
    /// adopted from reports; beyond it accesses are not forwarded to that
    /// connector and reports do not open windows (`[health]
    /// max_windows_per_connector`, default 10000).
    pub max_windows_per_connector: usize,
    /// Live on-access windows per segment, all its connectors together:
    /// a flood of names under one wildcard segment cannot take a
    /// connector's whole allowance (`[health] max_windows_per_segment`,
    /// default 5000).
    pub max_windows_per_segment: usize,
    /// How long the status history (every transition, `GET
    /// /api/v1/events`) is kept in the database (`[health]
    /// history_retention_s`, default 604800: 7 days).
    pub history_retention: Duration,
    /// How long the audit trail of admin actions (`GET /api/v1/audit`) is
    /// kept in the database (`[audit] retention_s`, default 31536000: one
    /// year).
    pub audit_retention: Duration,
    /// Longest a freshly started CA stays not ready (`/readyz` 503) while
    /// the connectors the store knows re-attach and report (`[health]
    /// warmup_ms`, default 30000; 0: ready at once).
    pub warmup: Duration,
    /// A checked application's TLS certificate expiring within this long
    /// is warned about (`[health] certificate_warn_days`, default 14).
    pub certificate_warn: Duration,
    /// Where the CA keeps its database and generated certificates
    /// (`[server] data_dir`, default `reach-ca-data` next to the config).
    pub data_dir: PathBuf,
    /// Serve TLS on both listeners (`[tls] enabled`, default true). Without
    /// it connectors authenticate with the provisioning key in metadata:
    /// for benchmarks and local experiments only.
    pub tls_enabled: bool,
    /// TLS material (`[tls]`).
    pub tls: crate::credentials::pki::TlsSources,
    /// Validity of issued connector certificates
    /// (`[tls] connector_cert_days`, default 365).
    pub connector_cert_validity: Duration,
    /// How long a connector's certificate stays valid after a renewal
    /// superseded it, so that a live session on it can move over
    /// (`[tls] renewal_grace_s`, default 300).
    pub renewal_grace: Duration,
    /// Time a client has to finish the TLS handshake
    /// (`[tls] handshake_timeout_ms`, default 10000).
    pub handshake_timeout: Duration,
    /// Hostile-input bounds (`[limits]`).
    pub limits: Limits,
    /// Where the enrolled state lives (`[store] url`; default `reach.db` in
    /// the data directory).
    pub store: crate::store::StoreLocation,
    /// This replica's id among the replicas sharing the store
    /// (`[replica] id`; default the host name and the gRPC port).
    pub replica_id: Option<String>,
    /// Addresses this replica advertises (`[replica] advertise`; default
    /// its gRPC and HTTP listen addresses).
    pub advertise: Vec<String>,
}

/// Bounds on what one peer may cost the CA (`[limits]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// HTTP/2 streams per connection, both listeners (default 64).
    pub max_concurrent_streams: u32,
    /// Open HTTP connections at once (default 1024); more wait in the
    /// kernel's accept queue.
    pub max_connections: usize,
    /// Messages per second one connector session may send (reports,
    /// heartbeats): a guard against floods of tiny messages, far above what
    /// a batching connector sends; excess messages are dropped and counted
    /// (default 200).
    pub connector_messages_per_second: u32,
    /// Burst above that rate (default 400).
    pub connector_message_burst: u32,
    /// Time a new HTTP connection has to send its first byte, and then
    /// (after the TLS handshake) its first byte of HTTP
    /// (`first_byte_timeout_ms`, default 5000).
    pub first_byte_timeout: Duration,
    /// An HTTP connection with no request in flight that moves no byte for
    /// this long is closed (`idle_timeout_ms`, default 60000).
    pub idle_timeout: Duration,
    /// Time an HTTP/1 client has to send a request's headers
    /// (`header_timeout_ms`, default 10000).
    pub header_timeout: Duration,
    /// Time a client has to send a request's body (`body_timeout_ms`,
    /// default 10000).
    pub body_timeout: Duration,
    /// Open HTTP connections from one source address
    /// (`http_max_connections_per_source`, default 64).
    pub http_max_connections_per_source: usize,
    /// Open gRPC connections at once (`grpc_max_connections`, default 4096);
    /// more wait in the kernel's accept queue.
    pub grpc_max_connections: usize,
    /// Open gRPC connections from one source address
    /// (`grpc_max_connections_per_source`, default 256: connectors behind
    /// one NAT share an address).
    pub grpc_max_connections_per_source: usize,
    /// A gRPC connection is asked to close (GOAWAY) at this age, and closed
    /// a minute later (`grpc_max_connection_age_s`, default 86400); its
    /// connector reconnects.
    pub grpc_max_connection_age: Duration,
    /// Application entries per second one connector session may report
    /// (default 2,000: four times a connector at 500 checks/s); a report
    /// beyond it is refused with `FlowControl` and sent again later by the
    /// connector, never dropped.
    pub connector_entries_per_second: u32,
    /// Burst above that rate (default 10,000; a full-state report is always
    /// taken, and may leave the session in debt).
    pub connector_entries_burst: u32,
    /// Failed tokens, enrollments and sign-ins are counted per network of
    /// this many bits of an IPv4 source (`throttle_ipv4_prefix`, default
    /// 32)…
    pub throttle_ipv4_prefix: u8,
    /// …and of an IPv6 one (`throttle_ipv6_prefix`, default 64: a /64 is
    /// one subscriber's).
    pub throttle_ipv6_prefix: u8,
    /// Sources each throttle keeps apart (`throttle_max_sources`, default
    /// 65,536); beyond it new sources share one allowance.
    pub throttle_max_sources: usize,
    /// Sign-ins one source may start per minute
    /// (`login_per_source_per_minute`, default 10, all at once).
    pub login_per_source_per_minute: u32,
    /// Sign-ins the whole CA starts per second (`login_per_second`,
    /// default 5, burst ten times that): each keeps a store row for ten
    /// minutes, so at most ~3,000 are alive.
    pub login_per_second: u32,
}

impl Settings {
    /// The addresses the two listeners bind, which the generated server
    /// certificate names.
    pub fn listen_hosts(&self) -> [std::net::IpAddr; 2] {
        [self.grpc_listen.ip(), self.http_listen.ip()]
    }

    /// The limits policy validation enforces with these settings.
    pub fn policy_limits(&self) -> policy::Limits {
        policy::Limits {
            min_subnet_prefix_v4: self.min_subnet_prefix.0,
            min_subnet_prefix_v6: self.min_subnet_prefix.1,
            ..policy::Limits::default()
        }
    }

    /// A session that sends nothing for this long is considered dead: three
    /// heartbeat intervals.
    pub fn idle_timeout(&self) -> Duration {
        (self.heartbeat_interval * 3).max(Duration::from_secs(1))
    }
}
/// The settings `file` asks for, or `None` with every problem added to
/// `problems`.
pub(super) fn settings(
    file: &FileConfig,
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Option<Settings> {
    let before = problems.len();
    let (grpc, http) = listen_addresses(&file.server, problems);
    let public_names = public_names(&file.server.public_names, problems);
    file.server.check_bounds("server", problems);
    file.store.check_bounds("store", problems);
    file.replica.check_bounds("replica", problems);
    file.audit.check_bounds("audit", problems);
    file.selection.check_bounds("selection", problems);
    file.health.check_bounds("health", problems);
    file.tls.check_bounds("tls", problems);
    file.limits.check_bounds("limits", problems);
    let s = &file.selection;
    let strategy = selection_rules(s, problems);
    let h = &file.health;
    let (window, forward) = health_rules(h, problems);
    let t = &file.tls;
    let validity = tls_rules(t, problems);
    let l = &file.limits;
    let path = |p: &PathBuf| base.join(p);
    let data_dir = file
        .server
        .data_dir
        .as_ref()
        .map_or_else(|| base.join("reach-ca-data"), path);
    let store = store_rules(&file.store, base, problems);
    replica_rules(&file.replica, problems);
    if problems.len() > before {
        return None;
    }
    Some(Settings {
        store: store?,
        replica_id: file.replica.id.clone(),
        advertise: file.replica.advertise.clone(),
        data_dir,
        tls_enabled: t.enabled,
        tls: tls_sources(t, base),
        connector_cert_validity: validity,
        renewal_grace: Duration::from_secs(t.renewal_grace_s),
        handshake_timeout: Duration::from_millis(t.handshake_timeout_ms),
        limits: limits(l),
        grpc_listen: grpc?,
        http_listen: http?,
        anonymous_read: file.server.anonymous_read,
        public_names,
        reload_poll: Duration::from_millis(file.server.reload_poll_ms),
        strategy: strategy?,
        discovery_timeout: Duration::from_millis(s.discovery_timeout_ms),
        nearest_tolerance: Tolerance {
            percent: s.nearest_tolerance_percent,
            absolute: Duration::from_millis(s.nearest_tolerance_ms),
        },
        on_access_window: window,
        stale_after_intervals: h.stale_after_intervals,
        check_budget: h.check_budget,
        heartbeat_interval: Duration::from_millis(h.heartbeat_interval_ms),
        access_forward_interval: forward,
        connector_checks_per_second: h.checks_per_second,
        connector_check_timeout_ms: h.check_timeout_ms,
        assumed_checks_per_second: h.assumed_checks_per_second,
        transitions_kept: h.transitions_kept,
        min_subnet_prefix: (h.min_subnet_prefix_v4, h.min_subnet_prefix_v6),
        on_access_retention: Duration::from_secs(h.on_access_retention_s),
        max_windows_per_connector: h.max_windows_per_connector,
        max_windows_per_segment: h.max_windows_per_segment,
        history_retention: Duration::from_secs(h.history_retention_s),
        warmup: Duration::from_millis(h.warmup_ms),
        certificate_warn: Duration::from_secs(h.certificate_warn_days.saturating_mul(86_400)),
        audit_retention: Duration::from_secs(file.audit.retention_s),
    })
}

/// `[server] public_names`, each parsed as `host[:port]`.
fn public_names(names: &[String], problems: &mut Vec<Problem>) -> Vec<(String, Option<u16>)> {
    let mut out = Vec::new();
    for (i, name) in names.iter().enumerate() {
        match policy::host::parse_authority(name) {
            Ok((host, port)) => out.push((host.into_string(), port)),
            Err(m) => setting(
                problems,
                format!("server.public_names[{i}]"),
                format!(
                    "{m} (expected host[:port], e.g. \"ca.example.com\" or \"ca.example.com:7480\")"
                ),
            ),
        }
    }
    out
}

/// `[selection]`'s rules; the strategy when it is valid.
fn selection_rules(s: &SelectionSection, problems: &mut Vec<Problem>) -> Option<Strategy> {
    s.strategy
        .parse::<Strategy>()
        .map_err(|m| setting(problems, "selection.strategy", m))
        .ok()
}

/// `[replica]`'s rules.
fn replica_rules(r: &ReplicaSection, problems: &mut Vec<Problem>) {
    if let Some(id) = &r.id
        && (id.is_empty() || id.len() > 128 || id.contains(','))
    {
        setting(
            problems,
            "replica.id",
            "must be 1 to 128 characters without commas",
        );
    }
}

/// `[tls]`'s files (relative to the config file's directory `base`).
fn tls_sources(t: &TlsSection, base: &Path) -> crate::credentials::pki::TlsSources {
    let path = |p: &PathBuf| base.join(p);
    crate::credentials::pki::TlsSources {
        cert_file: t.cert_file.as_ref().map(path),
        key_file: t.key_file.as_ref().map(path),
        issuer_cert_file: t.issuer_cert_file.as_ref().map(path),
        issuer_key_file: t.issuer_key_file.as_ref().map(path),
        next_root_file: t.next_root_file.as_ref().map(path),
        previous_root_file: t.previous_root_file.as_ref().map(path),
        server_names: t.server_names.clone(),
    }
}

/// The listeners' and sessions' limits of `[limits]` (checked by
/// `limits_rules`).
fn limits(l: &LimitsSection) -> Limits {
    Limits {
        max_concurrent_streams: l.max_concurrent_streams,
        max_connections: l.max_connections,
        connector_messages_per_second: l.connector_messages_per_second,
        connector_message_burst: l.connector_message_burst,
        first_byte_timeout: Duration::from_millis(l.first_byte_timeout_ms),
        idle_timeout: Duration::from_millis(l.idle_timeout_ms),
        header_timeout: Duration::from_millis(l.header_timeout_ms),
        body_timeout: Duration::from_millis(l.body_timeout_ms),
        http_max_connections_per_source: l.http_max_connections_per_source,
        grpc_max_connections: l.grpc_max_connections,
        grpc_max_connections_per_source: l.grpc_max_connections_per_source,
        grpc_max_connection_age: Duration::from_secs(l.grpc_max_connection_age_s),
        connector_entries_per_second: l.connector_entries_per_second,
        connector_entries_burst: l.connector_entries_burst,
        throttle_ipv4_prefix: l.throttle_ipv4_prefix,
        throttle_ipv6_prefix: l.throttle_ipv6_prefix,
        throttle_max_sources: l.throttle_max_sources,
        login_per_source_per_minute: l.login_per_source_per_minute,
        login_per_second: l.login_per_second,
    }
}

/// The password for a PostgreSQL store when `[store] password_file` is
/// not set.
pub const STORE_PASSWORD_ENV: &str = "REACH_STORE_PASSWORD";

/// `[store]`: absent `url` is `reach.db` in the data directory;
/// `postgres://` (or `postgresql://`) a PostgreSQL database, its password
/// from the URL, `password_file` or `REACH_STORE_PASSWORD`; `sqlite:PATH`
/// another SQLite file (relative to the config file).
fn store_rules(
    store: &StoreSection,
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Option<crate::store::StoreLocation> {
    use crate::store::StoreLocation;
    let Some(url) = &store.url else {
        if store.password_file.is_some() {
            setting(
                problems,
                "store.password_file",
                "is only used with a postgres:// url",
            );
            return None;
        }
        return Some(StoreLocation::DataDir);
    };
    let url = url.expose().trim();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let password = match &store.password_file {
            Some(f) => {
                let full = base.join(f);
                match std::fs::read_to_string(&full) {
                    Ok(v) => Some(crate::ground::secret::Secret::new(v).trimmed()),
                    Err(e) => {
                        setting(
                            problems,
                            "store.password_file",
                            format!("cannot read {}: {e}", full.display()),
                        );
                        return None;
                    }
                }
            }
            None => std::env::var(STORE_PASSWORD_ENV)
                .ok()
                .map(|p| crate::ground::secret::Secret::new(p).trimmed()),
        };
        return Some(StoreLocation::Postgres {
            url: url.to_owned(),
            password,
        });
    }
    if let Some(path) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        && !path.is_empty()
    {
        return Some(StoreLocation::Sqlite(base.join(path)));
    }
    setting(
        problems,
        "store.url",
        format!(
            "{:?} is neither postgres://USER@HOST/DB nor sqlite:PATH",
            crate::store::redact_url(url)
        ),
    );
    None
}

/// `[server] grpc_listen` and `http_listen`: two different socket
/// addresses.
fn listen_addresses(
    server: &ServerSection,
    problems: &mut Vec<Problem>,
) -> (Option<SocketAddr>, Option<SocketAddr>) {
    let addr = |problems: &mut Vec<Problem>, field: &str, text: &str| {
        text.parse::<SocketAddr>()
            .map_err(|_| {
                setting(
                    problems,
                    field,
                    format!("{text:?} is not a socket address (expected e.g. \"127.0.0.1:7443\")"),
                )
            })
            .ok()
    };
    let grpc = addr(problems, "server.grpc_listen", &server.grpc_listen);
    let http = addr(problems, "server.http_listen", &server.http_listen);
    if grpc.is_some() && grpc == http {
        setting(
            problems,
            "server.http_listen",
            "is the same address as server.grpc_listen",
        );
    }
    (grpc, http)
}

/// The access forward interval when none is configured: 60 s, but at most a
/// quarter of the on-access window (at least 1 ms), so any valid window
/// works alone.
pub(super) fn default_forward_interval(window: Duration) -> Duration {
    Duration::from_secs(60)
        .min(window / 4)
        .max(Duration::from_millis(1))
}

/// `[health]`: returns the on-access window (`on_access_window_ms`, else
/// `on_access_window_s`) and the access forward interval (shorter than the
/// window).
fn health_rules(h: &HealthSection, problems: &mut Vec<Problem>) -> (Duration, Duration) {
    let window = match h.on_access_window_ms {
        Some(ms) => Duration::from_millis(ms),
        None => Duration::from_secs(h.on_access_window_s),
    };
    let forward = h.access_forward_interval_ms.unwrap_or_else(|| {
        u64::try_from(default_forward_interval(window).as_millis()).unwrap_or(u64::MAX)
    });
    if forward >= 1 && Duration::from_millis(forward) >= window && !window.is_zero() {
        setting(
            problems,
            "health.access_forward_interval_ms",
            format!(
                "{forward} ms must be shorter than the on-access window ({} ms), or windows lapse between forwards",
                window.as_millis()
            ),
        );
    }
    (window, Duration::from_millis(forward))
}

/// `[tls]`: each certificate with its key, one root rotation at a time;
/// returns the connector certificate validity.
fn tls_rules(t: &TlsSection, problems: &mut Vec<Problem>) -> Duration {
    for (cert, key, field) in [
        (&t.cert_file, &t.key_file, "tls.cert_file"),
        (
            &t.issuer_cert_file,
            &t.issuer_key_file,
            "tls.issuer_cert_file",
        ),
    ] {
        if cert.is_some() != key.is_some() {
            setting(
                problems,
                field,
                "the certificate and its key must be given together",
            );
        }
    }
    // A root rotation has one other root at a time: the next one while it
    // is introduced, or the previous one until it is retired.
    if t.next_root_file.is_some() && t.previous_root_file.is_some() {
        setting(
            problems,
            "tls.next_root_file",
            "one root rotation at a time: finish the one of previous_root_file (remove it) before introducing another root",
        );
    }
    // The finer setting is for tests and short-lived deployments (a
    // lifetime of seconds shows renewal working); it wins when given.
    match t.connector_cert_validity_s {
        Some(s) => Duration::from_secs(s),
        None => Duration::from_secs(u64::from(t.connector_cert_days) * 86_400),
    }
}
