//! Configuration: the TOML file operators write (`ca.toml`), its validation
//! (every error at once, with the policy crate's messages for segments) and
//! the runtime `Settings` it becomes.
//!
//! Names in the file are the contract in DESIGN.md ("Interfaces"); fields
//! beyond it are additions (mostly knobs that let tests shorten time).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use policy::{GroupSpec, Policy, PolicySpec, SegmentSpec, Strategy, ValidationError};
use serde::Deserialize;

use crate::auth::{ApiToken, Scope, Secret};

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    server: ServerSection,
    #[serde(default)]
    selection: SelectionSection,
    #[serde(default)]
    health: HealthSection,
    #[serde(default)]
    tls: TlsSection,
    #[serde(default)]
    limits: LimitsSection,
    #[serde(default)]
    api_tokens: Vec<TokenSection>,
    #[serde(default)]
    connector_groups: Vec<GroupSection>,
    #[serde(default)]
    segments: Vec<SegmentSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ServerSection {
    grpc_listen: String,
    http_listen: String,
    anonymous_read: bool,
    reload_poll_ms: u64,
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct TlsSection {
    enabled: Option<bool>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    issuer_cert_file: Option<PathBuf>,
    issuer_key_file: Option<PathBuf>,
    server_names: Vec<String>,
    connector_cert_days: Option<u32>,
    handshake_timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct LimitsSection {
    max_concurrent_streams: u32,
    max_connections: usize,
    connector_messages_per_second: u32,
    connector_message_burst: u32,
}

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            max_concurrent_streams: 64,
            max_connections: 1024,
            connector_messages_per_second: 50,
            connector_message_burst: 200,
        }
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            grpc_listen: "127.0.0.1:7443".into(),
            http_listen: "127.0.0.1:7480".into(),
            anonymous_read: false,
            reload_poll_ms: 1000,
            data_dir: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct SelectionSection {
    strategy: String,
    discovery_timeout_ms: u64,
}

impl Default for SelectionSection {
    fn default() -> Self {
        SelectionSection {
            strategy: "healthy".into(),
            discovery_timeout_ms: 3000,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct HealthSection {
    on_access_window_s: u64,
    on_access_window_ms: Option<u64>,
    stale_after_intervals: u32,
    check_budget: u64,
    heartbeat_interval_ms: u64,
    access_forward_interval_ms: u64,
    checks_per_second: u32,
    check_timeout_ms: u32,
    assumed_checks_per_second: u32,
    transitions_kept: usize,
}

impl Default for HealthSection {
    fn default() -> Self {
        HealthSection {
            on_access_window_s: 1800,
            on_access_window_ms: None,
            stale_after_intervals: 3,
            check_budget: 6000,
            heartbeat_interval_ms: 5000,
            access_forward_interval_ms: 60_000,
            checks_per_second: 0,
            check_timeout_ms: 0,
            assumed_checks_per_second: 20,
            transitions_kept: 20,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenSection {
    name: String,
    token: Option<String>,
    token_file: Option<PathBuf>,
    #[serde(default)]
    scopes: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupSection {
    name: String,
    provisioning_key: Option<String>,
    provisioning_key_file: Option<PathBuf>,
    #[serde(default)]
    max_uses: Option<u32>,
    #[serde(default)]
    expires_at: Option<String>,
}

/// Runtime settings (everything in the file except policy and secrets).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// gRPC listen address (`[server] grpc_listen`).
    pub grpc_listen: SocketAddr,
    /// HTTP listen address (`[server] http_listen`).
    pub http_listen: SocketAddr,
    /// Reads need no token (`[server] anonymous_read`).
    pub anonymous_read: bool,
    /// How often the config file is checked for changes
    /// (`[server] reload_poll_ms`, default 1000).
    pub reload_poll: Duration,
    /// Selection strategy (`[selection] strategy`).
    pub strategy: Strategy,
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
    /// Where the CA keeps its database and generated certificates
    /// (`[server] data_dir`, default `reach-ca-data` next to the config).
    pub data_dir: PathBuf,
    /// Serve TLS on both listeners (`[tls] enabled`, default true). Without
    /// it connectors authenticate with the provisioning key in metadata:
    /// for benchmarks and local experiments only.
    pub tls_enabled: bool,
    /// TLS material (`[tls]`).
    pub tls: crate::pki::TlsSources,
    /// Validity of issued connector certificates
    /// (`[tls] connector_cert_days`, default 365).
    pub connector_cert_validity: Duration,
    /// Time a client has to finish the TLS handshake
    /// (`[tls] handshake_timeout_ms`, default 10000).
    pub handshake_timeout: Duration,
    /// Hostile-input bounds (`[limits]`).
    pub limits: Limits,
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
    /// heartbeats); excess messages are dropped and counted (default 50).
    pub connector_messages_per_second: u32,
    /// Burst above that rate (default 200).
    pub connector_message_burst: u32,
}

/// How a group's provisioning key may be used (`[[connector_groups]]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPolicy {
    /// Enrollments the key allows in total (`max_uses`, default 10).
    pub max_uses: u32,
    /// After this (Unix ms) the key enrolls nobody (`expires_at`).
    pub expires_ms: Option<i64>,
    /// SHA-256 of the key (what the database stores and counts by).
    pub key_sha256: String,
}

impl Settings {
    /// A session that sends nothing for this long is considered dead: three
    /// heartbeat intervals.
    pub fn idle_timeout(&self) -> Duration {
        (self.heartbeat_interval * 3).max(Duration::from_secs(1))
    }
}

/// A loaded, validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The file it came from (reloads re-read it); `None` when built from text.
    pub path: Option<PathBuf>,
    /// Runtime settings.
    pub settings: Settings,
    /// The validated policy.
    pub policy: Policy,
    /// API tokens.
    pub tokens: Vec<ApiToken>,
    /// Provisioning key per connector group.
    pub group_keys: HashMap<String, Secret>,
    /// Use limits of each group's key.
    pub key_policies: HashMap<String, KeyPolicy>,
    /// `content_hash` of the text it was loaded from: the reload watcher's
    /// baseline, so a change made right after loading is not missed.
    pub content_hash: u64,
}

/// A hash of a config file's bytes, to notice changes.
pub fn content_hash(bytes: &[u8]) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

/// One problem in a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A segment or connector group breaks a policy rule.
    Policy(ValidationError),
    /// A setting is wrong: `field` is its dotted path (`server.grpc_listen`,
    /// `api_tokens "ops".token_file`).
    Setting {
        /// Where.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Policy(e) => write!(f, "{e}"),
            Problem::Setting { field, message } => write!(f, "{field}: {message}"),
        }
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML or has fields of the wrong type or name.
    #[error("{}: {message}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column).
        message: String,
    },
    /// The file parses but breaks rules; every problem is listed.
    #[error("{} problem(s): {}", .0.len(), join(.0))]
    Invalid(Vec<Problem>),
}

fn join(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl ConfigError {
    /// One line per problem, for `check-config` and reload logs.
    pub fn messages(&self) -> Vec<String> {
        match self {
            ConfigError::Invalid(problems) => problems.iter().map(ToString::to_string).collect(),
            other => vec![other.to_string()],
        }
    }
}

impl Config {
    /// Reads and validates a config file; relative `*_file` paths are
    /// resolved against the file's directory.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let base = path.parent().unwrap_or_else(|| Path::new("."));
        let mut config = Self::parse(&text, path, base)?;
        config.path = Some(path.to_owned());
        Ok(config)
    }

    /// One line for logs and `check-config`: what the config holds.
    pub fn summary(&self) -> String {
        format!(
            "{} connector groups, {} segments, {} API tokens",
            self.policy.connector_groups.len(),
            self.policy.segments.len(),
            self.tokens.len()
        )
    }

    /// Validates config text; relative `*_file` paths are resolved against
    /// `base_dir`. The result has no `path`, so it is never reloaded.
    pub fn from_toml(text: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        Self::parse(text, Path::new("<config>"), base_dir)
    }

    fn parse(text: &str, path: &Path, base: &Path) -> Result<Config, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let mut problems = Vec::new();
        let settings = settings(&file, base, &mut problems);
        let tokens = api_tokens(&file.api_tokens, base, &mut problems);
        let group_keys = group_keys(&file.connector_groups, base, &mut problems);
        let key_policies = key_policies(&file.connector_groups, &group_keys, &mut problems);
        let spec = PolicySpec {
            connector_groups: file
                .connector_groups
                .iter()
                .map(|g| GroupSpec {
                    name: g.name.clone(),
                })
                .collect(),
            segments: file.segments,
        };
        let policy = match policy::validate(&spec) {
            Ok(p) => Some(p),
            Err(errors) => {
                problems.extend(errors.0.into_iter().map(Problem::Policy));
                None
            }
        };
        match (settings, policy) {
            (Some(settings), Some(policy)) if problems.is_empty() => Ok(Config {
                path: None,
                settings,
                policy,
                tokens,
                group_keys,
                key_policies,
                content_hash: content_hash(text.as_bytes()),
            }),
            _ => Err(ConfigError::Invalid(problems)),
        }
    }
}

fn setting(problems: &mut Vec<Problem>, field: impl Into<String>, message: impl Into<String>) {
    problems.push(Problem::Setting {
        field: field.into(),
        message: message.into(),
    });
}

fn settings(file: &FileConfig, base: &Path, problems: &mut Vec<Problem>) -> Option<Settings> {
    let before = problems.len();
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
    let grpc = addr(problems, "server.grpc_listen", &file.server.grpc_listen);
    let http = addr(problems, "server.http_listen", &file.server.http_listen);
    if grpc.is_some() && grpc == http {
        setting(
            problems,
            "server.http_listen",
            "is the same address as server.grpc_listen",
        );
    }
    if file.server.reload_poll_ms < 10 {
        setting(problems, "server.reload_poll_ms", "must be at least 10");
    }
    let strategy = file
        .selection
        .strategy
        .parse::<Strategy>()
        .map_err(|m| setting(problems, "selection.strategy", m))
        .ok();
    let s = &file.selection;
    if !(1..=60_000).contains(&s.discovery_timeout_ms) {
        setting(
            problems,
            "selection.discovery_timeout_ms",
            format!("{} is out of range (1-60000)", s.discovery_timeout_ms),
        );
    }
    let h = &file.health;
    let window = match h.on_access_window_ms {
        Some(ms) => Duration::from_millis(ms),
        None => Duration::from_secs(h.on_access_window_s),
    };
    if window.is_zero() {
        setting(
            problems,
            "health.on_access_window_s",
            "must be greater than 0",
        );
    }
    if h.stale_after_intervals == 0 {
        setting(
            problems,
            "health.stale_after_intervals",
            "must be at least 1",
        );
    }
    if h.check_budget == 0 {
        setting(problems, "health.check_budget", "must be at least 1");
    }
    if h.heartbeat_interval_ms < 10 {
        setting(
            problems,
            "health.heartbeat_interval_ms",
            "must be at least 10",
        );
    }
    if h.access_forward_interval_ms == 0 {
        setting(
            problems,
            "health.access_forward_interval_ms",
            "must be at least 1",
        );
    } else if Duration::from_millis(h.access_forward_interval_ms) >= window && !window.is_zero() {
        setting(
            problems,
            "health.access_forward_interval_ms",
            format!(
                "{} ms must be shorter than the on-access window ({} ms), or windows lapse between forwards",
                h.access_forward_interval_ms,
                window.as_millis()
            ),
        );
    }
    if h.assumed_checks_per_second == 0 {
        setting(
            problems,
            "health.assumed_checks_per_second",
            "must be at least 1",
        );
    }
    let t = &file.tls;
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
    let days = t.connector_cert_days.unwrap_or(365);
    if !(1..=3650).contains(&days) {
        setting(
            problems,
            "tls.connector_cert_days",
            format!("{days} is out of range (1-3650)"),
        );
    }
    let handshake = t.handshake_timeout_ms.unwrap_or(10_000);
    if !(100..=120_000).contains(&handshake) {
        setting(
            problems,
            "tls.handshake_timeout_ms",
            format!("{handshake} is out of range (100-120000)"),
        );
    }
    let l = &file.limits;
    if l.max_concurrent_streams == 0 {
        setting(
            problems,
            "limits.max_concurrent_streams",
            "must be at least 1",
        );
    }
    if l.max_connections == 0 {
        setting(problems, "limits.max_connections", "must be at least 1");
    }
    if l.connector_messages_per_second == 0 || l.connector_message_burst == 0 {
        setting(
            problems,
            "limits.connector_messages_per_second",
            "rate and burst must be at least 1",
        );
    }
    if problems.len() > before {
        return None;
    }
    let path = |p: &PathBuf| base.join(p);
    Some(Settings {
        data_dir: file
            .server
            .data_dir
            .as_ref()
            .map_or_else(|| base.join("reach-ca-data"), path),
        tls_enabled: t.enabled.unwrap_or(true),
        tls: crate::pki::TlsSources {
            cert_file: t.cert_file.as_ref().map(path),
            key_file: t.key_file.as_ref().map(path),
            issuer_cert_file: t.issuer_cert_file.as_ref().map(path),
            issuer_key_file: t.issuer_key_file.as_ref().map(path),
            server_names: t.server_names.clone(),
        },
        connector_cert_validity: Duration::from_secs(u64::from(days) * 86_400),
        handshake_timeout: Duration::from_millis(handshake),
        limits: Limits {
            max_concurrent_streams: l.max_concurrent_streams,
            max_connections: l.max_connections,
            connector_messages_per_second: l.connector_messages_per_second,
            connector_message_burst: l.connector_message_burst,
        },
        grpc_listen: grpc?,
        http_listen: http?,
        anonymous_read: file.server.anonymous_read,
        reload_poll: Duration::from_millis(file.server.reload_poll_ms),
        strategy: strategy?,
        discovery_timeout: Duration::from_millis(s.discovery_timeout_ms),
        on_access_window: window,
        stale_after_intervals: h.stale_after_intervals,
        check_budget: h.check_budget,
        heartbeat_interval: Duration::from_millis(h.heartbeat_interval_ms),
        access_forward_interval: Duration::from_millis(h.access_forward_interval_ms),
        connector_checks_per_second: h.checks_per_second,
        connector_check_timeout_ms: h.check_timeout_ms,
        assumed_checks_per_second: h.assumed_checks_per_second,
        transitions_kept: h.transitions_kept,
    })
}

/// Reads a secret given inline or in a file (exactly one of the two).
fn secret(
    problems: &mut Vec<Problem>,
    subject: &str,
    (inline_name, inline): (&str, Option<&String>),
    (file_name, file): (&str, Option<&PathBuf>),
    base: &Path,
) -> Option<Secret> {
    let value = match (inline, file) {
        (Some(_), Some(_)) => {
            setting(
                problems,
                subject,
                format!("set either {inline_name} or {file_name}, not both"),
            );
            return None;
        }
        (None, None) => {
            setting(
                problems,
                subject,
                format!("{inline_name} or {file_name} is required"),
            );
            return None;
        }
        (Some(v), None) => v.trim().to_owned(),
        (None, Some(f)) => {
            let full = base.join(f);
            match std::fs::read_to_string(&full) {
                Ok(v) => v.trim().to_owned(),
                Err(e) => {
                    setting(
                        problems,
                        format!("{subject}.{file_name}"),
                        format!("cannot read {}: {e}", full.display()),
                    );
                    return None;
                }
            }
        }
    };
    if value.is_empty() {
        setting(problems, subject, format!("{inline_name} is empty"));
        return None;
    }
    Some(Secret::new(value))
}

fn api_tokens(
    sections: &[TokenSection],
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Vec<ApiToken> {
    let mut out: Vec<ApiToken> = Vec::new();
    let mut names = HashSet::new();
    for (i, t) in sections.iter().enumerate() {
        let subject = if t.name.is_empty() {
            format!("api_tokens #{}", i + 1)
        } else {
            format!("api_tokens {:?}", t.name)
        };
        if t.name.is_empty() {
            setting(problems, &subject, "name is empty");
        } else if !names.insert(t.name.as_str()) {
            setting(problems, &subject, "name is used by another API token");
        }
        let mut scopes = Vec::new();
        if t.scopes.is_empty() {
            setting(
                problems,
                format!("{subject}.scopes"),
                "is empty (expected some of \"access\", \"read\", \"admin\")",
            );
        }
        for s in &t.scopes {
            match s.parse::<Scope>() {
                Ok(scope) => scopes.push(scope),
                Err(m) => setting(problems, format!("{subject}.scopes"), m),
            }
        }
        let Some(secret) = secret(
            problems,
            &subject,
            ("token", t.token.as_ref()),
            ("token_file", t.token_file.as_ref()),
            base,
        ) else {
            continue;
        };
        if let Some(other) = out.iter().find(|o| o.secret.same_as(&secret)) {
            setting(
                problems,
                &subject,
                format!("token is the same as that of api_tokens {:?}", other.name),
            );
        }
        out.push(ApiToken {
            name: t.name.clone(),
            secret,
            scopes,
        });
    }
    out
}

/// Parses `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM:SSZ` (UTC) into Unix ms.
pub fn parse_utc(text: &str) -> Option<i64> {
    let (date, time) = match text.split_once('T') {
        Some((d, t)) => (d, Some(t.strip_suffix('Z')?)),
        None => (text, None),
    };
    let num = |s: &str, len: usize| -> Option<i64> {
        (s.len() == len && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let mut d = date.split('-');
    let (y, m, day) = (num(d.next()?, 4)?, num(d.next()?, 2)?, num(d.next()?, 2)?);
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let (hh, mm, ss) = match time {
        Some(t) => {
            let mut p = t.split(':');
            let v = (num(p.next()?, 2)?, num(p.next()?, 2)?, num(p.next()?, 2)?);
            if p.next().is_some() || v.0 > 23 || v.1 > 59 || v.2 > 60 {
                return None;
            }
            v
        }
        None => (0, 0, 0),
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400) + hh * 3600 + mm * 60 + ss) * 1000)
}

fn key_policies(
    sections: &[GroupSection],
    keys: &HashMap<String, Secret>,
    problems: &mut Vec<Problem>,
) -> HashMap<String, KeyPolicy> {
    let mut out = HashMap::new();
    for g in sections {
        let subject = format!("connector_groups {:?}", g.name);
        let max_uses = g.max_uses.unwrap_or(10);
        if max_uses == 0 {
            setting(
                problems,
                format!("{subject}.max_uses"),
                "must be at least 1",
            );
        }
        let expires_ms = match &g.expires_at {
            None => None,
            Some(text) => match parse_utc(text) {
                Some(ms) => Some(ms),
                None => {
                    setting(
                        problems,
                        format!("{subject}.expires_at"),
                        format!(
                            "{text:?} is not a UTC time (expected e.g. \"2027-01-31\" or \"2027-01-31T12:00:00Z\")"
                        ),
                    );
                    None
                }
            },
        };
        if let Some(key) = keys.get(&g.name) {
            out.insert(
                g.name.clone(),
                KeyPolicy {
                    max_uses,
                    expires_ms,
                    key_sha256: key.sha256(),
                },
            );
        }
    }
    out
}

fn group_keys(
    sections: &[GroupSection],
    base: &Path,
    problems: &mut Vec<Problem>,
) -> HashMap<String, Secret> {
    let mut out = HashMap::new();
    for (i, g) in sections.iter().enumerate() {
        let subject = if g.name.is_empty() {
            format!("connector_groups #{}", i + 1)
        } else {
            format!("connector_groups {:?}", g.name)
        };
        if let Some(key) = secret(
            problems,
            &subject,
            ("provisioning_key", g.provisioning_key.as_ref()),
            ("provisioning_key_file", g.provisioning_key_file.as_ref()),
            base,
        ) {
            out.insert(g.name.clone(), key);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        [[connector_groups]]
        name = "dc-east"
        provisioning_key = "k-east"

        [[segments]]
        name = "jira"
        applications = ["jira.example.test", "127.0.0.10"]
        tcp_ports = ["80"]
        connector_groups = ["dc-east"]
    "#;

    #[test]
    fn defaults_apply() {
        let c = Config::from_toml(MINIMAL, Path::new(".")).expect("valid");
        let s = &c.settings;
        assert_eq!(s.strategy, Strategy::Healthy);
        assert_eq!(s.discovery_timeout, Duration::from_secs(3));
        assert_eq!(s.on_access_window, Duration::from_secs(1800));
        assert_eq!(s.stale_after_intervals, 3);
        assert_eq!(s.check_budget, 6000);
        assert_eq!(s.grpc_listen.to_string(), "127.0.0.1:7443");
        assert!(!s.anonymous_read);
        assert_eq!(c.policy.segments.len(), 1);
    }

    #[test]
    fn every_error_is_listed() {
        let text = r#"
            [server]
            grpc_listen = "nonsense"
            [selection]
            strategy = "fastest"
            [[api_tokens]]
            name = "ops"
            scopes = ["read", "write"]
            [[connector_groups]]
            name = "dc-east"
            provisioning_key_file = "/nonexistent/reach-key"
            [[segments]]
            name = "jira"
            applications = ["jira.example.test"]
            tcp_ports = ["1-12"]
            connector_groups = ["dc-west"]
        "#;
        let err = Config::from_toml(text, Path::new(".")).expect_err("invalid");
        let all = err.messages().join("\n");
        for needle in [
            "server.grpc_listen",
            "unknown strategy \"fastest\"",
            "api_tokens \"ops\".scopes: unknown scope \"write\"",
            "api_tokens \"ops\": token or token_file is required",
            "connector_groups \"dc-east\".provisioning_key_file: cannot read",
            "segment \"jira\": health_reporting = \"continuous\" is not allowed with 12 ports (max 10)",
            "unknown connector group \"dc-west\"",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
    }

    #[test]
    fn syntax_errors_name_the_place() {
        let err = Config::from_toml("[server]\ngrpc_listen = 7", Path::new(".")).expect_err("bad");
        assert!(matches!(err, ConfigError::Syntax { .. }), "{err}");
        let err = Config::from_toml("[serverr]", Path::new(".")).expect_err("bad");
        assert!(err.to_string().contains("serverr"), "{err}");
    }

    #[test]
    fn secrets_from_files_and_overrides() {
        let dir = std::env::temp_dir().join(format!("reach-ca-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        std::fs::write(dir.join("key"), "from-file\n").expect("write");
        let text = r#"
            [health]
            on_access_window_s = 1800
            on_access_window_ms = 2000
            access_forward_interval_ms = 500
            [[api_tokens]]
            name = "ops"
            token_file = "key"
            scopes = ["access"]
            [[connector_groups]]
            name = "g"
            provisioning_key_file = "key"
        "#;
        let c = Config::from_toml(text, &dir).expect("valid");
        assert_eq!(c.settings.on_access_window, Duration::from_millis(2000));
        assert!(c.group_keys["g"].matches(b"from-file"));
        assert!(c.tokens[0].secret.matches(b"from-file"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn example_config_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples/ca.toml");
        let c = Config::load(&path).unwrap_or_else(|e| panic!("{}", e.messages().join("\n")));
        assert!(!c.policy.segments.is_empty());
    }
}
