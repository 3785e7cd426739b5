//! The configuration file's shapes as serde reads them: one `section!`
//! per TOML table, each key declared once with its type, default, bounds,
//! allowed values, whether a reload applies it and its line in the
//! reference. Rules beyond bounds are in `settings`, `secrets`, `oidc` and
//! `receivers`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use policy::SegmentSpec;
use serde::Deserialize;

use super::declare::{KeyType, lo, section, within};
use crate::ground::secret::Secret;

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    #[serde(default)]
    pub(super) server: ServerSection,
    #[serde(default)]
    pub(super) selection: SelectionSection,
    #[serde(default)]
    pub(super) health: HealthSection,
    #[serde(default)]
    pub(super) tls: TlsSection,
    #[serde(default)]
    pub(super) limits: LimitsSection,
    #[serde(default)]
    pub(super) store: StoreSection,
    #[serde(default)]
    pub(super) replica: ReplicaSection,
    #[serde(default)]
    pub(super) audit: AuditSection,
    #[serde(default)]
    pub(super) api_tokens: Vec<TokenSection>,
    #[serde(default)]
    pub(super) oidc: Vec<OidcSection>,
    #[serde(default)]
    pub(super) connector_groups: Vec<GroupSection>,
    #[serde(default)]
    pub(super) segments: Vec<SegmentSpec>,
    #[serde(default)]
    pub(super) log_receivers: Vec<ReceiverSection>,
}

section! {
    /// `[server]`: listen addresses, the data directory, reloads.
    struct ServerSection in "server" {
        grpc_listen: String = value("127.0.0.1:7443".into()),
            bounds None, values "host:port", Restart,
            "Connector sessions, access and health gRPC services (TLS).";
        http_listen: String = value("127.0.0.1:7480".into()),
            bounds None, values "host:port", Restart,
            "Dashboard, JSON API and metrics (HTTPS).";
        anonymous_read: bool = value(false),
            bounds None, values "", Reload,
            "Dashboard and GET APIs need no token (demos only).";
        public_names: Vec<String> = value(Vec::new()),
            bounds None, values "host[:port]", Reload,
            "Names the HTTPS API is reached by; other Host headers get 400 (empty: any).";
        reload_poll_ms: u64 = value(1000),
            bounds lo(10), values "", Reload,
            "How often the file is checked for changes (SIGHUP also reloads).";
        data_dir: Option<PathBuf> = absent("`reach-ca-data` next to the file"),
            bounds None, values "", Restart,
            "Database and generated certificates.";
        allow_short_secrets: bool = value(false),
            bounds None, values "", Reload,
            "Tests only: accept guessable tokens and keys (estimated under 64 bits).";
    }
}

section! {
    /// `[store]`: where the CA keeps its enrolled state. `url` is read into a
    /// `Secret`, since a URL may carry a password.
    struct StoreSection in "store" {
        url: Option<Secret> = absent("SQLite `reach.db` in `data_dir`"),
            bounds None, values "`postgres://…` or `sqlite:PATH`", Restart,
            "The store; one PostgreSQL database for several replicas.";
        password_file: Option<PathBuf> = absent("`REACH_STORE_PASSWORD`, else the URL's"),
            bounds None, values "", Restart,
            "File holding the PostgreSQL password.";
    }
}

section! {
    /// `[replica]`: how this CA process names itself among replicas.
    struct ReplicaSection in "replica" {
        id: Option<String> = absent("host name and gRPC port"),
            bounds None, values "1-128 characters, no commas", Restart,
            "This replica's name (GET /api/v1/replicas).";
        advertise: Vec<String> = value(Vec::new()),
            bounds None, values "host:port", Restart,
            "Addresses other replicas and connectors reach it by (empty: the listen addresses).";
    }
}

section! {
    /// `[audit]`: the audit trail of admin actions.
    struct AuditSection in "audit" {
        retention_s: u64 = value(365 * 24 * 3600),
            bounds within(60, 315_360_000), values "", Reload,
            "How long audit entries are kept; pruned hourly.";
    }
}

section! {
    /// `[tls]`: certificates of both listeners and of connectors.
    struct TlsSection in "tls" {
        enabled: bool = value(true),
            bounds None, values "", Restart,
            "Serve TLS on both listeners.";
        cert_file: Option<PathBuf> = absent("a server certificate the CA issues itself"),
            bounds None, values "with `key_file`", Reload,
            "Your own server certificate chain (PEM).";
        key_file: Option<PathBuf> = absent("generated"),
            bounds None, values "with `cert_file`", Reload,
            "Its private key (PEM).";
        issuer_cert_file: Option<PathBuf> = absent("`data_dir/ca.pem`, generated on first start"),
            bounds None, values "with `issuer_key_file`", Reload,
            "Your own CA for connector certificates.";
        issuer_key_file: Option<PathBuf> = absent("generated"),
            bounds None, values "with `issuer_cert_file`", Reload,
            "Its private key.";
        next_root_file: Option<PathBuf> = absent("none"),
            bounds None, values "not with `previous_root_file`", Reload,
            "Root rotation, introduce: a new root (PEM) trusted and announced to connectors beside the issuing one.";
        previous_root_file: Option<PathBuf> = absent("none"),
            bounds None, values "not with `next_root_file`", Reload,
            "Root rotation, switch: the root that issued before, still trusted and announced until it is retired.";
        server_names: Vec<String> = value(Vec::new()),
            bounds None, values "", Reload,
            "Names connectors dial that the generated server certificate does not carry by itself (a DNS alias, a load balancer, a NAT address). It carries localhost, 127.0.0.1, ::1 and each listen address; for 0.0.0.0 or :: the host's name, FQDN and interface addresses instead.";
        connector_cert_days: u32 = value(365),
            bounds within(1, 3650), values "", Reload,
            "Connector certificate lifetime; connectors renew at about 2/3 of it.";
        connector_cert_validity_s: Option<u64> = absent("`connector_cert_days`"),
            bounds within(3, 315_360_000), values "", Reload,
            "Finer lifetime in seconds (tests); wins over the days.";
        renewal_grace_s: u64 = value(300),
            bounds within(1, 604_800), values "", Reload,
            "A renewed connector's old certificate stays valid this long.";
        handshake_timeout_ms: u64 = value(10_000),
            bounds within(100, 120_000), values "", Restart,
            "TLS handshake deadline.";
    }
}

section! {
    /// `[limits]`: bounds on what one peer may cost the CA.
    struct LimitsSection in "limits" {
        max_concurrent_streams: u32 = value(64),
            bounds lo(1), values "", Restart,
            "HTTP/2 streams per connection.";
        max_connections: usize = value(1024),
            bounds lo(1), values "", Restart,
            "Open HTTP connections.";
        connector_messages_per_second: u32 = value(200),
            bounds lo(1), values "", Reload,
            "Messages per connector session, any kind; excess dropped.";
        connector_message_burst: u32 = value(400),
            bounds lo(1), values "", Reload,
            "Burst of the above.";
        first_byte_timeout_ms: u64 = value(5_000),
            bounds within(100, 600_000), values "", Restart,
            "A new connection's first byte (and, after TLS, its first HTTP byte).";
        idle_timeout_ms: u64 = value(60_000),
            bounds within(100, 600_000), values "", Restart,
            "HTTP connection without traffic and no request in flight.";
        header_timeout_ms: u64 = value(10_000),
            bounds within(100, 600_000), values "", Restart,
            "HTTP/1 request headers.";
        body_timeout_ms: u64 = value(10_000),
            bounds within(100, 600_000), values "", Restart,
            "Request body.";
        http_max_connections_per_source: usize = value(64),
            bounds lo(1), values "", Restart,
            "HTTP connections per source address.";
        grpc_max_connections: usize = value(4096),
            bounds lo(1), values "", Restart,
            "Open gRPC connections.";
        grpc_max_connections_per_source: usize = value(256),
            bounds lo(1), values "", Restart,
            "gRPC connections per source address (connectors behind one NAT share one).";
        grpc_max_connection_age_s: u64 = value(86_400),
            bounds within(1, 31_536_000), values "", Restart,
            "GOAWAY at this age, closed a minute later; connectors reconnect.";
        connector_entries_per_second: u32 = value(2000),
            bounds within(1, 10_000_000), values "", Reload,
            "Report entries per session; beyond it FlowControl, re-sent.";
        connector_entries_burst: u32 = value(10_000),
            bounds within(1, 10_000_000), values "", Reload,
            "Burst of the above.";
        throttle_ipv4_prefix: u8 = value(32),
            bounds within(8, 32), values "", Reload,
            "Failed tokens, enrollments and sign-ins are counted per IPv4 network of this many bits.";
        throttle_ipv6_prefix: u8 = value(64),
            bounds within(32, 128), values "", Reload,
            "The same for IPv6 (a /64 is one subscriber's).";
        throttle_max_sources: usize = value(65_536),
            bounds within(1, 10_000_000), values "", Reload,
            "Sources each throttle keeps apart; beyond it new sources share one allowance.";
        login_per_source_per_minute: u32 = value(10),
            bounds within(1, 10_000), values "", Reload,
            "Sign-ins (`GET /auth/login`) one source may start per minute.";
        login_per_second: u32 = value(5),
            bounds within(1, 10_000), values "", Reload,
            "Sign-ins the whole CA starts per second (burst ten times that); each keeps a store row for ten minutes.";
    }
}

section! {
    /// `[selection]`: how a connector is chosen for an access.
    struct SelectionSection in "selection" {
        strategy: String = value("healthy".into()),
            bounds None, values "`healthy`, `group`, `nearest`", Reload,
            "Default strategy; segments may choose their own.";
        discovery_timeout_ms: u64 = value(3000),
            bounds within(1, 60_000), values "", Reload,
            "How long an access waits for on-access discovery.";
        nearest_tolerance_percent: u32 = value(20),
            bounds within(0, 1000), values "", Reload,
            "`nearest`: draw among connectors within this % of the best smoothed RTT…";
        nearest_tolerance_ms: u64 = value(2),
            bounds within(0, 60_000), values "", Reload,
            "…or within this many ms, whichever margin is larger.";
    }
}

section! {
    /// `[health]`: windows, rates, retention.
    struct HealthSection in "health" {
        on_access_window_s: u64 = value(1800),
            bounds lo(1), values "", Reload,
            "How long an accessed application stays checked.";
        on_access_window_ms: Option<u64> = absent("`on_access_window_s`"),
            bounds lo(1), values "", Reload,
            "Finer window in ms (tests); wins over the seconds.";
        stale_after_intervals: u32 = value(3),
            bounds lo(1), values "", Reload,
            "A report older than this many intervals is stale (Unknown).";
        check_budget: u64 = value(6000),
            bounds lo(1), values "", Reload,
            "Warn above this many checks per connector cycle.";
        heartbeat_interval_ms: u64 = value(5000),
            bounds lo(10), values "", Reload,
            "Heartbeat interval imposed on connectors.";
        access_forward_interval_ms: Option<u64> = absent("min(60000, window/4)"),
            bounds lo(1), values "shorter than the window", Reload,
            "At most one access forward per application and connector this often.";
        checks_per_second: u32 = value(0),
            bounds within(0, 100_000), values "0: the connector's own", Reload,
            "Check rate imposed on connectors.";
        check_timeout_ms: u32 = value(0),
            bounds within(0, 600_000), values "0: the connector's own", Reload,
            "Check timeout imposed on connectors.";
        assumed_checks_per_second: u32 = value(20),
            bounds lo(1), values "", Reload,
            "Connector check rate `check-config` plans with.";
        transitions_kept: usize = value(20),
            bounds None, values "", Reload,
            "Status transitions kept per application and connector.";
        min_subnet_prefix_v4: u8 = value(policy::DEFAULT_MIN_SUBNET_PREFIX_V4),
            bounds within(1, 32), values "", Reload,
            "Refuse subnet entries wider than this (0.0.0.0/0 always).";
        min_subnet_prefix_v6: u8 = value(policy::DEFAULT_MIN_SUBNET_PREFIX_V6),
            bounds within(1, 128), values "", Reload,
            "Same for IPv6 (::/0 always).";
        on_access_retention_s: u64 = value(3600),
            bounds within(0, 31_536_000), values "", Reload,
            "Ended on-access entries are listed (Unknown) this long, then removed.";
        max_windows_per_connector: usize = value(10_000),
            bounds within(1, 10_000_000), values "", Reload,
            "Live on-access windows per connector; beyond it refused and counted.";
        max_windows_per_segment: usize = value(5_000),
            bounds within(1, 10_000_000), values "", Reload,
            "Live on-access windows per segment.";
        history_retention_s: u64 = value(7 * 24 * 3600),
            bounds within(60, 31_536_000), values "", Reload,
            "How long health history is kept.";
        certificate_warn_days: u64 = value(14),
            bounds within(0, 3650), values "", Reload,
            "Warn (no status change) when a checked TLS certificate expires within this many days.";
        warmup_ms: u64 = value(30_000),
            bounds within(0, 3_600_000), values "", Reload,
            "After start, Unknown rather than Down until connectors have reported.";
    }
}

section! {
    /// `[[api_tokens]]`: a bearer token; `token` is read straight into a
    /// `Secret` so that `Debug` of the file never shows it.
    struct TokenSection in "api_tokens" {
        name: String = absent("required"),
            bounds None, values "unique", Reload,
            "Who the token belongs to (audit trail).";
        token: Option<Secret> = absent("one of `token`, `token_file`"),
            bounds None, values "64+ bits estimated (`openssl rand -base64 32`); not a placeholder (`change-me`, `REPLACE-ME`)", Reload,
            "The bearer token.";
        token_file: Option<PathBuf> = absent("one of `token`, `token_file`"),
            bounds None, values "", Reload,
            "File holding it (not readable by others).";
        scopes: Vec<String> = value(Vec::new()),
            bounds None, values "`access`, `read`, `admin`", Reload,
            "What it may do; `admin` disables, revokes, deletes.";
    }
}

section! {
    /// `[[oidc]]`: an OpenID provider people sign in with.
    struct OidcSection in "oidc" {
        name: String = absent("required"),
            bounds None, values "unique", Reload,
            "The provider's name (`/auth/login?provider=`; the first is the default).";
        issuer: String = absent("required"),
            bounds None, values "https URL (http only on loopback)", Reload,
            "The issuer; its `/.well-known/openid-configuration` is read on first sign-in.";
        client_id: String = absent("required"),
            bounds None, values "", Reload,
            "The CA's client id at the provider.";
        client_secret: Option<Secret> = absent("none: a public client (PKCE alone)"),
            bounds None, values "", Reload,
            "The client secret.";
        client_secret_file: Option<PathBuf> = absent("none"),
            bounds None, values "", Reload,
            "File holding it, instead of `client_secret`.";
        redirect_url: String = absent("required"),
            bounds None, values "`https://CA/auth/callback`", Reload,
            "Where the provider sends the browser back (registered at the provider).";
        scopes: Vec<String> = value(vec!["profile".to_owned(), "email".to_owned()]),
            bounds None, values "", Reload,
            "Scopes asked for besides `openid` (add the one that releases the roles claim).";
        ca_file: Option<PathBuf> = absent("the system's roots"),
            bounds None, values "PEM", Reload,
            "Roots trusted for the provider's TLS.";
        roles_claim: String = value("groups".to_owned()),
            bounds None, values "claim name or dotted path", Reload,
            "The ID token claim holding the person's groups or roles (`realm_access.roles` for Keycloak realm roles).";
        roles: BTreeMap<String, Vec<String>> = value(BTreeMap::new()),
            bounds None, values "`{ \"role\" = [scopes] }`", Reload,
            "Each claim value and the scopes (`read`, `access`, `admin`) it grants; a person with none is refused.";
        session_lifetime_s: u64 = value(28_800),
            bounds within(300, 604_800), values "", Reload,
            "How long a sign-in lasts (the cookie and the stored session).";
        keys_refresh_s: u64 = value(3600),
            bounds within(60, 86_400), values "", Reload,
            "How long the provider's signing keys (JWKS) are used before they are fetched again (a key the provider withdrew stops verifying); an unknown key id fetches them at once.";
        revalidate_s: u64 = value(300),
            bounds within(1, 86_400), values "", Reload,
            "How often a session is confirmed with the provider (refresh token, else userinfo) at its next request; a refusal ends it, and the roles it returns apply.";
    }
}

section! {
    /// `[[connector_groups]]`: a group of connectors and its provisioning key.
    struct GroupSection in "connector_groups" {
        name: String = absent("required"),
            bounds None, values "unique", Reload,
            "The group's name.";
        provisioning_key: Option<Secret> = absent("one of the key settings"),
            bounds None, values "64+ bits estimated (`openssl rand -base64 32`); not a placeholder (`change-me`, `REPLACE-ME`)", Reload,
            "The key connectors enroll with.";
        provisioning_key_file: Option<PathBuf> = absent("one of the key settings"),
            bounds None, values "", Reload,
            "File holding it.";
        max_uses: u32 = value(10),
            bounds lo(1), values "", Reload,
            "Enrollments the key allows.";
        expires_at: Option<String> = absent("never"),
            bounds None, values "`YYYY-MM-DD` or RFC 3339 UTC", Reload,
            "When the key stops working.";
        dns_resolution: Option<String> = absent("`dual`"),
            bounds None, values "`ipv4`, `ipv6`, `dual`", Reload,
            "Which address records its connectors resolve.";
        location: Option<policy::LocationSpec> = absent("none"),
            bounds None, values "`{ latitude, longitude }` degrees", Reload,
            "Where its connectors are, for `nearest` with a user's location.";
    }
}

section! {
    /// `[[log_receivers]]`: where records stream to.
    struct ReceiverSection in "log_receivers" {
        name: String = absent("required"),
            bounds None, values "unique, 1-64 of `a-z0-9_-`", Reload,
            "The receiver's name (its spool is `<data_dir>/log-spool/<name>/`).";
        destination: String = absent("required"),
            bounds None, values "`tcp://host:port`, `tls://host:port`, `file:///path`", Reload,
            "Where records go.";
        format: String = value("json".to_owned()),
            bounds None, values "`json`, `syslog`, `csv`, `tsv`", Reload,
            "JSON lines, RFC 5424 syslog (octet-counted on tcp/tls), or csv/tsv with a header.";
        types: Option<Vec<String>> = absent("all four"),
            bounds None, values "`connector_status`, `health`, `access`, `audit`", Reload,
            "The record types it takes.";
        root_file: Option<PathBuf> = absent("required for `tls://`"),
            bounds None, values "PEM", Reload,
            "Roots the receiver's certificate is verified with.";
        server_name: Option<String> = absent("the destination's host"),
            bounds None, values "`tls://` only", Reload,
            "The name the receiver's certificate must carry.";
        client_cert_file: Option<PathBuf> = absent("none"),
            bounds None, values "PEM; with `client_key_file`", Reload,
            "The CA's client certificate, for a receiver that asks for one.";
        client_key_file: Option<PathBuf> = absent("none"),
            bounds None, values "PEM; with `client_cert_file`", Reload,
            "Its key (not readable by others).";
        spool_bytes: u64 = value(64 << 20),
            bounds lo(65_536), values "", Reload,
            "The spool's bound on disk; records past it are dropped and counted.";
        file_max_bytes: Option<u64> = absent("104857600 (100 MiB)"),
            bounds lo(4096), values "`file://` only", Reload,
            "The file is rotated to `path.1` at this size.";
        file_keep: Option<u32> = absent("5"),
            bounds None, values "`file://` only", Reload,
            "Rotated files kept (`path.1` … `path.N`).";
        filter: ReceiverFilterSection = absent("none"),
            bounds None, values "`{ groups = [], segments = [], statuses = [] }`", Reload,
            "Only records of these connector groups, segments and statuses (connector `status`, health `to`, access `decision`, audit `outcome`); an empty list or a record without the field passes.";
    }
}

/// `[log_receivers.filter]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct ReceiverFilterSection {
    pub(super) groups: Vec<String>,
    pub(super) segments: Vec<String>,
    pub(super) statuses: Vec<String>,
}

impl KeyType for ReceiverFilterSection {
    const TOML: &'static str = "table";
}

/// The most field errors one read reports (each costs one more pass).
const MAX_FIELD_ERRORS: usize = 64;

/// Reads the file's shapes, going past field errors: an unknown key or a
/// value of the wrong type or variant is reported (its span and serde's
/// message), then left out, and the read goes on, so one run shows every
/// such error beside the rules the rest breaks. Errors: TOML that does not
/// parse, or a field error with no span to leave out.
pub(super) fn read(
    text: &str,
) -> Result<(FileConfig, Vec<toml::de::Error>), (Vec<toml::de::Error>, toml::de::Error)> {
    let mut root = toml::de::DeTable::parse(text).map_err(|e| (Vec::new(), e))?;
    let mut errors = Vec::new();
    loop {
        let e = match FileConfig::deserialize(toml::de::Deserializer::from(root.clone())) {
            Ok(file) => return Ok((file, errors)),
            Err(e) => e,
        };
        let left_out = match e.span() {
            Some(span) if errors.len() < MAX_FIELD_ERRORS => leave_out(root.get_mut(), &span),
            _ => false,
        };
        if !left_out {
            return Err((errors, e));
        }
        errors.push(e);
    }
}

/// Removes the key (or array element) whose key or value `span` points at,
/// searching every table and array (a `[table]`'s own span is its header
/// only); whether one was found.
fn leave_out(table: &mut toml::de::DeTable<'_>, span: &std::ops::Range<usize>) -> bool {
    let inside = |s: &std::ops::Range<usize>| s.start <= span.start && span.end <= s.end;
    let hit = table.iter().find_map(|(k, v)| {
        let exact = k.span() == *span || v.span() == *span || inside(&k.span());
        exact.then(|| k.clone())
    });
    if let Some(key) = hit {
        return table.remove(&key).is_some();
    }
    table
        .iter_mut()
        .any(|(_, v)| leave_out_value(v.get_mut(), span))
}

fn leave_out_value(value: &mut toml::de::DeValue<'_>, span: &std::ops::Range<usize>) -> bool {
    match value {
        toml::de::DeValue::Table(t) => leave_out(t, span),
        toml::de::DeValue::Array(items) => {
            if let Some(i) = items.iter().position(|v| v.span() == *span) {
                let kept: toml::de::DeArray<'_> =
                    std::mem::replace(items, toml::de::DeArray::new())
                        .into_iter()
                        .enumerate()
                        .filter_map(|(j, v)| (j != i).then_some(v))
                        .collect();
                *items = kept;
                return true;
            }
            items.iter_mut().any(|v| leave_out_value(v.get_mut(), span))
        }
        _ => false,
    }
}

/// 100 MiB.
pub(super) const DEFAULT_FILE_MAX_BYTES: u64 = 100 << 20;
/// Rotated files kept by default.
pub(super) const DEFAULT_FILE_KEEP: u32 = 5;
