//! The configuration reference: one row per key of `ca.toml` (section, key,
//! type, default, allowed values, what it does). The book's
//! `configuration.md` is generated from it; tests hold it to the parser
//! (`file`'s serde shapes and defaults, `settings`' bounds) and to
//! `deploy/examples/ca.toml`, so none of the three drifts silently.

use std::fmt::Write as _;

/// How a section is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `[name]`, once.
    Table,
    /// `[[name]]`, repeated; each needs a `name`.
    Array,
}

/// A section of the file.
#[derive(Clone, Copy, Debug)]
pub struct Section {
    /// Its name.
    pub name: &'static str,
    /// Table or array of tables.
    pub shape: Shape,
    /// One line on what it holds.
    pub about: &'static str,
}

/// A key's default.
#[derive(Clone, Copy, Debug)]
pub enum KeyDefault {
    /// A TOML value equal to what serde fills in when the key is absent
    /// (a test checks it).
    Value(&'static str),
    /// No literal default: what absence means.
    Absent(&'static str),
}

/// One key.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// Its section.
    pub section: &'static str,
    /// Its name.
    pub key: &'static str,
    /// Its TOML type.
    pub ty: &'static str,
    /// Its default.
    pub default: KeyDefault,
    /// Inclusive numeric bounds the CA enforces (`None` upper: unbounded).
    pub bounds: Option<(u64, Option<u64>)>,
    /// Allowed values or form, when not just bounds.
    pub values: &'static str,
    /// What it does.
    pub about: &'static str,
}

/// Every section, in the order the reference lists them.
#[rustfmt::skip]
pub const SECTIONS: &[Section] = &[
    Section { name: "server", shape: Shape::Table, about: "Listen addresses, the data directory, reloads." },
    Section { name: "store", shape: Shape::Table, about: "Where enrolled state lives: SQLite (default) or PostgreSQL." },
    Section { name: "replica", shape: Shape::Table, about: "How this process names itself among replicas sharing the store." },
    Section { name: "audit", shape: Shape::Table, about: "The audit trail of admin actions." },
    Section { name: "tls", shape: Shape::Table, about: "Certificates of both listeners and of connectors." },
    Section { name: "limits", shape: Shape::Table, about: "Bounds on what one peer may cost the CA." },
    Section { name: "selection", shape: Shape::Table, about: "How a connector is chosen for an access." },
    Section { name: "health", shape: Shape::Table, about: "Health checking: windows, rates, retention." },
    Section { name: "api_tokens", shape: Shape::Array, about: "Bearer tokens for the HTTP and gRPC APIs." },
    Section { name: "oidc", shape: Shape::Array, about: "OpenID providers people sign in with (the dashboard, `api login`)." },
    Section { name: "connector_groups", shape: Shape::Array, about: "Groups of connectors and their provisioning keys." },
    Section { name: "segments", shape: Shape::Array, about: "Applications, their ports and how their health is known." },
    Section { name: "log_receivers", shape: Shape::Array, about: "SIEM receivers the CA streams connector status, health transitions, access decisions and audit records to (Log streaming)." },
];

const fn e(
    section: &'static str,
    key: &'static str,
    ty: &'static str,
    default: KeyDefault,
    bounds: Option<(u64, Option<u64>)>,
    values: &'static str,
    about: &'static str,
) -> Entry {
    Entry {
        section,
        key,
        ty,
        default,
        bounds,
        values,
        about,
    }
}

use KeyDefault::{Absent, Value};

const fn lo(n: u64) -> Option<(u64, Option<u64>)> {
    Some((n, None))
}

const fn within(a: u64, b: u64) -> Option<(u64, Option<u64>)> {
    Some((a, Some(b)))
}

/// Every key of every section.
#[rustfmt::skip]
pub const ENTRIES: &[Entry] = &[
    e("server", "grpc_listen", "string", Value("\"127.0.0.1:7443\""), None, "host:port", "Connector sessions, access and health gRPC services (TLS)."),
    e("server", "http_listen", "string", Value("\"127.0.0.1:7480\""), None, "host:port", "Dashboard, JSON API and metrics (HTTPS)."),
    e("server", "anonymous_read", "bool", Value("false"), None, "", "Dashboard and GET APIs need no token (demos only)."),
    e("server", "public_names", "array of strings", Value("[]"), None, "host[:port]", "Names the HTTPS API is reached by; other Host headers get 400 (empty: any)."),
    e("server", "reload_poll_ms", "integer", Value("1000"), lo(10), "", "How often the file is checked for changes (SIGHUP also reloads)."),
    e("server", "data_dir", "path", Absent("`reach-ca-data` next to the file"), None, "", "Database and generated certificates."),
    e("server", "allow_short_secrets", "bool", Value("false"), None, "", "Tests only: accept guessable tokens and keys (estimated under 64 bits)."),
    e("store", "url", "string", Absent("SQLite `reach.db` in `data_dir`"), None, "`postgres://…` or `sqlite:PATH`", "The store; one PostgreSQL database for several replicas."),
    e("store", "password_file", "path", Absent("`REACH_STORE_PASSWORD`, else the URL's"), None, "", "File holding the PostgreSQL password."),
    e("replica", "id", "string", Absent("host name and gRPC port"), None, "1-128 characters, no commas", "This replica's name (GET /api/v1/replicas)."),
    e("replica", "advertise", "array of strings", Value("[]"), None, "host:port", "Addresses other replicas and connectors reach it by (empty: the listen addresses)."),
    e("audit", "retention_s", "integer", Value("31536000"), within(60, 315_360_000), "", "How long audit entries are kept; pruned hourly."),
    e("tls", "enabled", "bool", Absent("true"), None, "", "Serve TLS on both listeners."),
    e("tls", "cert_file", "path", Absent("a server certificate the CA issues itself"), None, "with `key_file`", "Your own server certificate chain (PEM)."),
    e("tls", "key_file", "path", Absent("generated"), None, "with `cert_file`", "Its private key (PEM)."),
    e("tls", "issuer_cert_file", "path", Absent("`data_dir/ca.pem`, generated on first start"), None, "with `issuer_key_file`", "Your own CA for connector certificates."),
    e("tls", "issuer_key_file", "path", Absent("generated"), None, "with `issuer_cert_file`", "Its private key."),
    e("tls", "next_root_file", "path", Absent("none"), None, "not with `previous_root_file`", "Root rotation, introduce: a new root (PEM) trusted and announced to connectors beside the issuing one."),
    e("tls", "previous_root_file", "path", Absent("none"), None, "not with `next_root_file`", "Root rotation, switch: the root that issued before, still trusted and announced until it is retired."),
    e("tls", "server_names", "array of strings", Value("[]"), None, "", "Names connectors dial that the generated server certificate does not carry by itself (a DNS alias, a load balancer, a NAT address). It carries localhost, 127.0.0.1, ::1 and each listen address; for 0.0.0.0 or :: the host's name, FQDN and interface addresses instead."),
    e("tls", "connector_cert_days", "integer", Absent("365"), within(1, 3650), "", "Connector certificate lifetime; connectors renew at about 2/3 of it."),
    e("tls", "connector_cert_validity_s", "integer", Absent("`connector_cert_days`"), within(3, 315_360_000), "", "Finer lifetime in seconds (tests); wins over the days."),
    e("tls", "renewal_grace_s", "integer", Absent("300"), within(1, 604_800), "", "A renewed connector's old certificate stays valid this long."),
    e("tls", "handshake_timeout_ms", "integer", Absent("10000"), within(100, 120_000), "", "TLS handshake deadline."),
    e("limits", "max_concurrent_streams", "integer", Value("64"), lo(1), "", "HTTP/2 streams per connection."),
    e("limits", "max_connections", "integer", Value("1024"), lo(1), "", "Open HTTP connections."),
    e("limits", "connector_messages_per_second", "integer", Value("200"), lo(1), "", "Messages per connector session, any kind; excess dropped."),
    e("limits", "connector_message_burst", "integer", Value("400"), None, "at least 1", "Burst of the above."),
    e("limits", "first_byte_timeout_ms", "integer", Value("5000"), within(100, 600_000), "", "A new connection's first byte (and, after TLS, its first HTTP byte)."),
    e("limits", "idle_timeout_ms", "integer", Value("60000"), within(100, 600_000), "", "HTTP connection without traffic and no request in flight."),
    e("limits", "header_timeout_ms", "integer", Value("10000"), within(100, 600_000), "", "HTTP/1 request headers."),
    e("limits", "body_timeout_ms", "integer", Value("10000"), within(100, 600_000), "", "Request body."),
    e("limits", "http_max_connections_per_source", "integer", Value("64"), lo(1), "", "HTTP connections per source address."),
    e("limits", "grpc_max_connections", "integer", Value("4096"), lo(1), "", "Open gRPC connections."),
    e("limits", "grpc_max_connections_per_source", "integer", Value("256"), lo(1), "", "gRPC connections per source address (connectors behind one NAT share one)."),
    e("limits", "grpc_max_connection_age_s", "integer", Value("86400"), within(1, 31_536_000), "", "GOAWAY at this age, closed a minute later; connectors reconnect."),
    e("limits", "connector_entries_per_second", "integer", Value("2000"), within(1, 10_000_000), "", "Report entries per session; beyond it FlowControl, re-sent."),
    e("limits", "connector_entries_burst", "integer", Value("10000"), within(1, 10_000_000), "", "Burst of the above."),
    e("limits", "throttle_ipv4_prefix", "integer", Value("32"), within(8, 32), "", "Failed tokens, enrollments and sign-ins are counted per IPv4 network of this many bits."),
    e("limits", "throttle_ipv6_prefix", "integer", Value("64"), within(32, 128), "", "The same for IPv6 (a /64 is one subscriber's)."),
    e("limits", "throttle_max_sources", "integer", Value("65536"), within(1, 10_000_000), "", "Sources each throttle keeps apart; beyond it new sources share one allowance."),
    e("limits", "login_per_source_per_minute", "integer", Value("10"), within(1, 10_000), "", "Sign-ins (`GET /auth/login`) one source may start per minute."),
    e("limits", "login_per_second", "integer", Value("5"), within(1, 10_000), "", "Sign-ins the whole CA starts per second (burst ten times that); each keeps a store row for ten minutes."),
    e("selection", "strategy", "string", Value("\"healthy\""), None, "`healthy`, `group`, `nearest`", "Default strategy; segments may choose their own."),
    e("selection", "discovery_timeout_ms", "integer", Value("3000"), within(1, 60_000), "", "How long an access waits for on-access discovery."),
    e("selection", "nearest_tolerance_percent", "integer", Value("20"), within(0, 1000), "", "`nearest`: draw among connectors within this % of the best smoothed RTT…"),
    e("selection", "nearest_tolerance_ms", "integer", Value("2"), within(0, 60_000), "", "…or within this many ms, whichever margin is larger."),
    e("health", "on_access_window_s", "integer", Value("1800"), lo(1), "", "How long an accessed application stays checked."),
    e("health", "on_access_window_ms", "integer", Absent("`on_access_window_s`"), None, "", "Finer window in ms (tests); wins over the seconds."),
    e("health", "stale_after_intervals", "integer", Value("3"), lo(1), "", "A report older than this many intervals is stale (Unknown)."),
    e("health", "check_budget", "integer", Value("6000"), lo(1), "", "Warn above this many checks per connector cycle."),
    e("health", "heartbeat_interval_ms", "integer", Value("5000"), lo(10), "", "Heartbeat interval imposed on connectors."),
    e("health", "access_forward_interval_ms", "integer", Absent("min(60000, window/4)"), lo(1), "shorter than the window", "At most one access forward per application and connector this often."),
    e("health", "checks_per_second", "integer", Value("0"), within(0, 100_000), "0: the connector's own", "Check rate imposed on connectors."),
    e("health", "check_timeout_ms", "integer", Value("0"), within(0, 600_000), "0: the connector's own", "Check timeout imposed on connectors."),
    e("health", "assumed_checks_per_second", "integer", Value("20"), lo(1), "", "Connector check rate `check-config` plans with."),
    e("health", "transitions_kept", "integer", Value("20"), None, "", "Status transitions kept per application and connector."),
    e("health", "min_subnet_prefix_v4", "integer", Value("8"), within(1, 32), "", "Refuse subnet entries wider than this (0.0.0.0/0 always)."),
    e("health", "min_subnet_prefix_v6", "integer", Value("8"), within(1, 128), "", "Same for IPv6 (::/0 always)."),
    e("health", "on_access_retention_s", "integer", Value("3600"), within(0, 31_536_000), "", "Ended on-access entries are listed (Unknown) this long, then removed."),
    e("health", "max_windows_per_connector", "integer", Value("10000"), within(1, 10_000_000), "", "Live on-access windows per connector; beyond it refused and counted."),
    e("health", "max_windows_per_segment", "integer", Value("5000"), within(1, 10_000_000), "", "Live on-access windows per segment."),
    e("health", "history_retention_s", "integer", Value("604800"), within(60, 31_536_000), "", "How long health history is kept."),
    e("health", "certificate_warn_days", "integer", Value("14"), within(0, 3650), "", "Warn (no status change) when a checked TLS certificate expires within this many days."),
    e("health", "warmup_ms", "integer", Value("30000"), within(0, 3_600_000), "", "After start, Unknown rather than Down until connectors have reported."),
    e("api_tokens", "name", "string", Absent("required"), None, "unique", "Who the token belongs to (audit trail)."),
    e("api_tokens", "token", "string", Absent("one of `token`, `token_file`"), None, "64+ bits estimated (`openssl rand -base64 32`); not a placeholder (`change-me`, `REPLACE-ME`)", "The bearer token."),
    e("api_tokens", "token_file", "path", Absent("one of `token`, `token_file`"), None, "", "File holding it (not readable by others)."),
    e("api_tokens", "scopes", "array of strings", Value("[]"), None, "`access`, `read`, `admin`", "What it may do; `admin` disables, revokes, deletes."),
    e("oidc", "name", "string", Absent("required"), None, "unique", "The provider's name (`/auth/login?provider=`; the first is the default)."),
    e("oidc", "issuer", "string", Absent("required"), None, "https URL (http only on loopback)", "The issuer; its `/.well-known/openid-configuration` is read on first sign-in."),
    e("oidc", "client_id", "string", Absent("required"), None, "", "The CA's client id at the provider."),
    e("oidc", "client_secret", "string", Absent("none: a public client (PKCE alone)"), None, "", "The client secret."),
    e("oidc", "client_secret_file", "path", Absent("none"), None, "", "File holding it, instead of `client_secret`."),
    e("oidc", "redirect_url", "string", Absent("required"), None, "`https://CA/auth/callback`", "Where the provider sends the browser back (registered at the provider)."),
    e("oidc", "scopes", "array of strings", Value(r#"["profile", "email"]"#), None, "", "Scopes asked for besides `openid` (add the one that releases the roles claim)."),
    e("oidc", "ca_file", "path", Absent("the system's roots"), None, "PEM", "Roots trusted for the provider's TLS."),
    e("oidc", "roles_claim", "string", Value(r#""groups""#), None, "claim name or dotted path", "The ID token claim holding the person's groups or roles (`realm_access.roles` for Keycloak realm roles)."),
    e("oidc", "roles", "table", Value("{}"), None, "`{ \"role\" = [scopes] }`", "Each claim value and the scopes (`read`, `access`, `admin`) it grants; a person with none is refused."),
    e("oidc", "session_lifetime_s", "integer", Value("28800"), None, "300–604800", "How long a sign-in lasts (the cookie and the stored session)."),
    e("oidc", "keys_refresh_s", "integer", Value("3600"), None, "60–86400", "How long the provider's signing keys (JWKS) are used before they are fetched again (a key the provider withdrew stops verifying); an unknown key id fetches them at once."),
    e("oidc", "revalidate_s", "integer", Value("300"), None, "1–86400", "How often a session is confirmed with the provider (refresh token, else userinfo) at its next request; a refusal ends it, and the roles it returns apply."),
    e("connector_groups", "name", "string", Absent("required"), None, "unique", "The group's name."),
    e("connector_groups", "provisioning_key", "string", Absent("one of the key settings"), None, "64+ bits estimated (`openssl rand -base64 32`); not a placeholder (`change-me`, `REPLACE-ME`)", "The key connectors enroll with."),
    e("connector_groups", "provisioning_key_file", "path", Absent("one of the key settings"), None, "", "File holding it."),
    e("connector_groups", "max_uses", "integer", Absent("10"), None, "", "Enrollments the key allows."),
    e("connector_groups", "expires_at", "string", Absent("never"), None, "`YYYY-MM-DD` or RFC 3339 UTC", "When the key stops working."),
    e("connector_groups", "dns_resolution", "string", Absent("`dual`"), None, "`ipv4`, `ipv6`, `dual`", "Which address records its connectors resolve."),
    e("connector_groups", "location", "table", Absent("none"), None, "`{ latitude, longitude }` degrees", "Where its connectors are, for `nearest` with a user's location."),
    e("segments", "name", "string", Absent("required"), None, "unique", "The segment's name."),
    e("segments", "applications", "array of strings", Value("[]"), None, "FQDN, IP, `*.wildcard`, CIDR", "The applications it covers."),
    e("segments", "tcp_ports", "array of strings", Value("[]"), None, "`80`, `8000-8100`", "TCP ports and ranges."),
    e("segments", "udp_ports", "array of strings", Value("[]"), None, "`53`, `5000-5100`", "UDP ports and ranges."),
    e("segments", "health_reporting", "string", Absent("`continuous`"), None, "`continuous`, `on_access`, `none`", "How health is known."),
    e("segments", "report_interval_s", "integer", Absent("60"), None, "", "Report interval."),
    e("segments", "report_interval_ms", "integer", Absent("`report_interval_s`"), None, "", "Finer interval in ms (tests, demos); wins."),
    e("segments", "multimatch", "bool", Value("false"), None, "", "Inclusive matching."),
    e("segments", "client_hostname_validation", "bool", Value("false"), None, "", "Hide from the health dashboard and API."),
    e("segments", "connector_groups", "array of strings", Value("[]"), None, "group names", "Groups serving the segment."),
    e("segments", "rise", "integer", Absent("1"), None, "", "Flap damping: reachable results in a row before Up."),
    e("segments", "fall", "integer", Absent("1"), None, "", "Flap damping: failed results in a row before Down."),
    e("segments", "strategy", "string", Absent("`[selection] strategy`"), None, "`healthy`, `group`, `nearest`", "This segment's selection strategy."),
    e("segments", "check", "string", Absent("`tcp`"), None, "`tcp`, `tls`, `http`, `https`", "What a TCP port's check does after the handshake (UDP ports: as always)."),
    e("segments", "check_path", "string", Absent("`/`"), None, "starts with `/`; `http`, `https` only", "The path of the check's `GET`."),
    e("segments", "check_expect", "string", Absent("`200-399`"), None, "`200,204,300-399` within 100-599; `http`, `https` only", "The statuses that count as Up."),
    e("segments", "check_ca_file", "path", Absent("no verification"), None, "PEM, 1+ certificates; `tls`, `https` only", "Roots the server's certificate is verified with (sent to connectors)."),
    e("log_receivers", "name", "string", Absent("required"), None, "unique, 1-64 of `a-z0-9_-`", "The receiver's name (its spool is `<data_dir>/log-spool/<name>/`)."),
    e("log_receivers", "destination", "string", Absent("required"), None, "`tcp://host:port`, `tls://host:port`, `file:///path`", "Where records go."),
    e("log_receivers", "format", "string", Value(r#""json""#), None, "`json`, `syslog`, `csv`, `tsv`", "JSON lines, RFC 5424 syslog (octet-counted on tcp/tls), or csv/tsv with a header."),
    e("log_receivers", "types", "array of strings", Absent("all four"), None, "`connector_status`, `health`, `access`, `audit`", "The record types it takes."),
    e("log_receivers", "root_file", "path", Absent("required for `tls://`"), None, "PEM", "Roots the receiver's certificate is verified with."),
    e("log_receivers", "server_name", "string", Absent("the destination's host"), None, "`tls://` only", "The name the receiver's certificate must carry."),
    e("log_receivers", "client_cert_file", "path", Absent("none"), None, "PEM; with `client_key_file`", "The CA's client certificate, for a receiver that asks for one."),
    e("log_receivers", "client_key_file", "path", Absent("none"), None, "PEM; with `client_cert_file`", "Its key (not readable by others)."),
    e("log_receivers", "spool_bytes", "integer", Value("67108864"), None, "65536 or more", "The spool's bound on disk; records past it are dropped and counted."),
    e("log_receivers", "file_max_bytes", "integer", Absent("104857600 (100 MiB)"), None, "4096 or more; `file://` only", "The file is rotated to `path.1` at this size."),
    e("log_receivers", "file_keep", "integer", Absent("5"), None, "`file://` only", "Rotated files kept (`path.1` … `path.N`)."),
    e("log_receivers", "filter", "table", Absent("none"), None, "`{ groups = [], segments = [], statuses = [] }`", "Only records of these connector groups, segments and statuses (connector `status`, health `to`, access `decision`, audit `outcome`); an empty list or a record without the field passes."),
];

/// The keys a reload does not change (`*`: the whole section): they are
/// read once, at start, and a reload that changes them logs that they take
/// effect at the next start. The reference's "Applies" column is made from
/// this list.
pub const RESTART_ONLY: &[(&str, &str)] = &[
    ("server", "grpc_listen"),
    ("server", "http_listen"),
    ("server", "data_dir"),
    ("store", "*"),
    ("replica", "*"),
    ("tls", "enabled"),
    ("tls", "handshake_timeout_ms"),
    ("limits", "max_concurrent_streams"),
    ("limits", "max_connections"),
    ("limits", "first_byte_timeout_ms"),
    ("limits", "idle_timeout_ms"),
    ("limits", "header_timeout_ms"),
    ("limits", "body_timeout_ms"),
    ("limits", "http_max_connections_per_source"),
    ("limits", "grpc_max_connections"),
    ("limits", "grpc_max_connections_per_source"),
    ("limits", "grpc_max_connection_age_s"),
];

/// Whether a reload leaves `section`.`key` as it was at start.
pub fn restart_only(section: &str, key: &str) -> bool {
    RESTART_ONLY
        .iter()
        .any(|(s, k)| *s == section && (*k == "*" || *k == key))
}

/// The reference as Markdown (the book's `configuration.md`).
pub fn markdown() -> String {
    let mut out = String::from(
        "<!-- Generated from crates/central-authority/src/config/reference.rs: \
         REACH_BLESS=1 cargo test -p central-authority --lib config::reference -->\n\n\
         # Configuration reference\n\n\
         The CA reads one TOML file (`central-authority --config ca.toml`); \
         `central-authority check-config ca.toml` lists every problem at once. \
         Unknown keys are errors. Edits are picked up without a restart (the file, \
         and the certificate and key files `[tls]` names, are polled; `kill -HUP` \
         also reloads), but for the keys whose Applies column says *restart*: \
         those are read once, at start, and a reload that changes them logs that \
         they take effect at the next start. `deploy/examples/ca.toml` shows every \
         key below.\n\n\
         The connector has no configuration file: its flags and environment \
         variables are listed by `connector-agent --help` and its man page.\n",
    );
    for s in SECTIONS {
        let header = match s.shape {
            Shape::Table => format!("[{}]", s.name),
            Shape::Array => format!("[[{}]]", s.name),
        };
        let _ = write!(
            out,
            "\n## `{header}`\n\n{}\n\n| Key | Type | Default | Allowed | Applies | Description |\n|---|---|---|---|---|---|\n",
            s.about
        );
        for entry in ENTRIES.iter().filter(|e| e.section == s.name) {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} | {} |",
                entry.key,
                entry.ty,
                default_text(entry.default),
                allowed_text(entry),
                if restart_only(entry.section, entry.key) {
                    "restart"
                } else {
                    "reload"
                },
                entry.about
            );
        }
    }
    out
}

fn default_text(d: KeyDefault) -> String {
    match d {
        Value(v) => format!("`{v}`"),
        Absent(a) => a.to_string(),
    }
}

fn allowed_text(entry: &Entry) -> String {
    let bounds = match entry.bounds {
        Some((lo, Some(hi))) => format!("{lo}–{hi}"),
        Some((lo, None)) => format!("≥ {lo}"),
        None => String::new(),
    };
    match (bounds.is_empty(), entry.values.is_empty()) {
        (true, _) => entry.values.to_string(),
        (false, true) => bounds,
        (false, false) => format!("{bounds}; {}", entry.values),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    /// Every restart-only entry names a key or section of the reference.
    #[test]
    fn every_restart_only_key_exists() {
        for (section, key) in super::RESTART_ONLY {
            assert!(
                super::ENTRIES
                    .iter()
                    .any(|e| e.section == *section && (*key == "*" || e.key == *key)),
                "[{section}] {key} is listed restart-only but is no key"
            );
        }
    }

    use super::super::{Config, ConfigError, Problem, file};
    use super::*;

    fn root() -> &'static Path {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
    }

    /// The names serde lists as expected after an unknown key in `text`.
    fn expected_keys(text: &str) -> BTreeSet<String> {
        let (_, errors) = file::read(text).expect("reads past the unknown key");
        let message = errors
            .first()
            .map(|e| e.message().to_string())
            .expect("the unknown key is an error");
        let list = message
            .split_once("expected one of ")
            .map(|(_, rest)| rest)
            .or_else(|| message.split_once("expected ").map(|(_, rest)| rest))
            .unwrap_or_else(|| panic!("no expected list in {message:?}"));
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    }

    /// The start of a section, for tests: arrays need a `name`.
    fn opening(s: &Section) -> String {
        match s.shape {
            Shape::Table => format!("[{}]\n", s.name),
            Shape::Array => format!("[[{}]]\nname = \"x\"\n", s.name),
        }
    }

    #[test]
    fn sections_are_the_files_tables() {
        let serde: BTreeSet<String> = expected_keys("zz_unknown = 1\n");
        let ours: BTreeSet<String> = SECTIONS.iter().map(|s| s.name.to_string()).collect();
        assert_eq!(serde, ours);
    }

    #[test]
    fn every_sections_keys_are_the_ones_serde_accepts() {
        for s in SECTIONS {
            let serde = expected_keys(&format!("{}zz_unknown = 1\n", opening(s)));
            let ours: BTreeSet<String> = ENTRIES
                .iter()
                .filter(|e| e.section == s.name)
                .map(|e| e.key.to_string())
                .collect();
            assert_eq!(serde, ours, "keys of [{}]", s.name);
        }
    }

    #[test]
    fn documented_defaults_are_what_the_parser_fills_in() {
        let mut checked = 0;
        for entry in ENTRIES {
            let Value(value) = entry.default else {
                continue;
            };
            let s = SECTIONS
                .iter()
                .find(|s| s.name == entry.section)
                .expect("its section is listed");
            let empty = file::read(&opening(s)).expect("empty section reads").0;
            let written = format!("{}{} = {value}\n", opening(s), entry.key);
            let (given, errors) = file::read(&written).expect("default reads");
            assert!(errors.is_empty(), "{written}: {errors:?}");
            assert_eq!(
                format!("{empty:?}"),
                format!("{given:?}"),
                "{}.{}: documented default {value} is not the parser's",
                entry.section,
                entry.key
            );
            checked += 1;
        }
        assert!(checked > 40, "only {checked} defaults checked");
    }

    fn problems(text: &str) -> Vec<Problem> {
        match Config::from_toml(text, Path::new("/tmp")) {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid(problems)) => problems,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    fn names_field(problems: &[Problem], field: &str) -> bool {
        problems
            .iter()
            .any(|p| matches!(p, Problem::Setting { field: f, .. } if f == field))
    }

    #[test]
    fn documented_bounds_are_the_ones_enforced() {
        for entry in ENTRIES.iter().filter(|e| e.section != "segments") {
            let Some((lo, hi)) = entry.bounds else {
                continue;
            };
            let field = format!("{}.{}", entry.section, entry.key);
            let at = |v: u64| problems(&format!("[{}]\n{} = {v}\n", entry.section, entry.key));
            assert!(!names_field(&at(lo), &field), "{field} = {lo} refused");
            if lo > 0 {
                assert!(
                    names_field(&at(lo - 1), &field),
                    "{field} = {} taken",
                    lo - 1
                );
            }
            if let Some(hi) = hi {
                assert!(!names_field(&at(hi), &field), "{field} = {hi} refused");
                assert!(
                    names_field(&at(hi + 1), &field),
                    "{field} = {} taken",
                    hi + 1
                );
            }
        }
    }

    /// Keys each section of the example sets or shows commented out.
    fn example_keys(text: &str) -> BTreeSet<(String, String)> {
        let mut section = String::new();
        let mut keys = BTreeSet::new();
        for line in text.lines() {
            let line = line.trim_start_matches(['#', ' ']);
            if let Some(name) = line.strip_prefix('[') {
                let name = name.trim_start_matches('[');
                if let Some((name, _)) = name.split_once(']') {
                    section = name.to_string();
                }
                continue;
            }
            if let Some((key, _)) = line.split_once(" = ") {
                let key = key.trim();
                if key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                {
                    keys.insert((section.clone(), key.to_string()));
                }
            }
        }
        keys
    }

    #[test]
    fn the_example_shows_every_key() {
        let text = std::fs::read_to_string(root().join("deploy/examples/ca.toml"))
            .expect("read deploy/examples/ca.toml");
        let shown = example_keys(&text);
        let missing: Vec<String> = ENTRIES
            .iter()
            .filter(|e| !shown.contains(&(e.section.to_string(), e.key.to_string())))
            .map(|e| format!("{}.{}", e.section, e.key))
            .collect();
        assert!(
            missing.is_empty(),
            "deploy/examples/ca.toml does not show {missing:?}"
        );
    }

    #[test]
    fn example_keys_sees_set_and_commented_keys() {
        let keys = example_keys("[a]\nx = 1\n# y = 2\n[[b]]\nz = 3 # w = 4\n");
        let want: BTreeSet<(String, String)> = [("a", "x"), ("a", "y"), ("b", "z")]
            .iter()
            .map(|(s, k)| (s.to_string(), k.to_string()))
            .collect();
        assert_eq!(keys, want);
    }

    /// `book/src/configuration.md` is what `markdown` generates
    /// (`REACH_BLESS=1` rewrites it).
    #[test]
    fn committed_reference_is_fresh() {
        let generated = markdown();
        let path = root().join("book/src/configuration.md");
        if std::env::var_os("REACH_BLESS").is_some() {
            std::fs::write(&path, &generated).expect("write book/src/configuration.md");
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "book/src/configuration.md is stale: run `REACH_BLESS=1 cargo test -p central-authority --lib config::reference` and commit it"
        );
    }
}
