//! Configuration: the TOML file operators write (`ca.toml`), its validation
//! (every error at once, with the policy crate's messages for segments) and
//! the runtime `Settings` it becomes.
//!
//! Key names are a stable interface: operators' files keep working, so a key
//! is added, never renamed; most keys beyond the core policy are knobs that
//! let tests shorten time.
//!
//! - `declare`: how a section is declared, each key once (type, default,
//!   bounds, allowed values, reload or restart, its reference line);
//! - `file`: the sections of the file, declared;
//! - `settings`: the runtime [`Settings`] and the rules for them;
//! - `secrets`: API tokens, provisioning keys and their use limits;
//! - `oidc`: the OpenID providers people sign in with;
//! - `receivers`: the log receivers records stream to;
//! - `reference`: every key documented, generating the book's reference.

mod declare;
mod file;
mod oidc;
mod receivers;
pub mod reference;
mod secrets;
mod settings;

use std::collections::HashMap;
use std::fmt;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};

use policy::{GroupSpec, Policy, PolicySpec, SegmentSpec, ValidationError};

use crate::credentials::auth::ApiToken;
use crate::ground::secret::Secret;
use file::FileConfig;
pub use secrets::{KeyPolicy, parse_utc};
pub use settings::{Limits, Settings};

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
    /// OpenID providers people sign in with (`[[oidc]]`).
    pub oidc: Vec<crate::credentials::oidc::ProviderConfig>,
    /// The log receivers (`[[log_receivers]]`).
    pub log_receivers: Vec<crate::logstream::ReceiverSpec>,
    /// Provisioning key per connector group.
    pub group_keys: HashMap<String, Secret>,
    /// Use limits of each group's key.
    pub key_policies: HashMap<String, KeyPolicy>,
    /// `content_hash` of the text it was loaded from: the reload watcher's
    /// baseline, so a change made right after loading is not missed.
    pub content_hash: u64,
    /// Things to warn about at start that do not stop the CA: secret files
    /// (`token_file`, `provisioning_key_file`, `client_secret_file`, `[tls]` key files) readable
    /// by others or writable by anyone but their owner.
    pub warnings: Vec<String>,
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
        /// Line, column and the parser's message, never the offending
        /// source line (see `syntax_message`).
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
        let bytes = std::fs::read(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::load_bytes(path, &bytes)
    }

    /// Validates `bytes`, the content of the config file at `path` as read
    /// by the caller (the reload watcher loads the very bytes it saw
    /// settle); relative `*_file` paths are resolved against the file's
    /// directory.
    pub fn load_bytes(path: &Path, bytes: &[u8]) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::Read {
            path: path.to_owned(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not UTF-8 text ({e})"),
            ),
        })?;
        let base = path.parent().unwrap_or_else(|| Path::new("."));
        let mut config = Self::parse(text, path, base)?;
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
        let (file, field_errors) = file::read(text).map_err(|(earlier, e)| {
            let mut messages: Vec<String> =
                earlier.iter().map(|e| syntax_message(text, e)).collect();
            messages.push(syntax_message(text, &e));
            ConfigError::Syntax {
                path: path.to_owned(),
                message: messages.join("; "),
            }
        })?;
        let mut problems: Vec<Problem> = field_errors
            .iter()
            .map(|e| {
                let message = syntax_message(text, e);
                match message.split_once(": ") {
                    Some((at, m)) if at.starts_with("line ") => Problem::Setting {
                        field: at.to_owned(),
                        message: m.to_owned(),
                    },
                    _ => Problem::Setting {
                        field: path.display().to_string(),
                        message,
                    },
                }
            })
            .collect();
        let warnings = secret_file_warnings(&file, base);
        let settings = settings::settings(&file, base, &mut problems);
        let short_ok = file.server.allow_short_secrets;
        let tokens = secrets::api_tokens(&file.api_tokens, base, short_ok, &mut problems);
        let oidc = oidc::providers(&file.oidc, base, &mut problems);
        let log_receivers = receivers::receivers(&file.log_receivers, base, &mut problems);
        let group_keys = secrets::group_keys(&file.connector_groups, base, short_ok, &mut problems);
        let key_policies =
            secrets::key_policies(&file.connector_groups, &group_keys, &mut problems);
        let spec = PolicySpec {
            connector_groups: file
                .connector_groups
                .iter()
                .map(|g| GroupSpec {
                    name: g.name.clone(),
                    dns_resolution: g.dns_resolution.clone(),
                    location: g.location,
                })
                .collect(),
            segments: with_ca_files(file.segments, base),
        };
        // Without valid settings the default limits still find every
        // other policy error in the same pass.
        let limits = settings
            .as_ref()
            .map_or_else(policy::Limits::default, Settings::policy_limits);
        let policy = match policy::validate_with(&spec, limits) {
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
                oidc,
                log_receivers,
                group_keys,
                key_policies,
                content_hash: content_hash(text.as_bytes()),
                warnings,
            }),
            _ => Err(ConfigError::Invalid(problems)),
        }
    }
}

/// `segments` with each `check_ca_file` read (relative to the config's
/// directory) for validation, which reads no file itself; the PEM then
/// travels to the connectors, which run elsewhere.
fn with_ca_files(mut segments: Vec<SegmentSpec>, base: &Path) -> Vec<SegmentSpec> {
    for s in &mut segments {
        if let Some(file) = &s.check_ca_file {
            s.check_ca_pem =
                Some(std::fs::read_to_string(base.join(file)).map_err(|e| e.to_string()));
        }
    }
    segments
}

/// A warning for every secret file the config names that others can read
/// or anyone but its owner can write.
fn secret_file_warnings(file: &FileConfig, base: &Path) -> Vec<String> {
    let tokens = file.api_tokens.iter().filter_map(|t| t.token_file.as_ref());
    let keys = file
        .connector_groups
        .iter()
        .filter_map(|g| g.provisioning_key_file.as_ref());
    let tls = [&file.tls.key_file, &file.tls.issuer_key_file]
        .into_iter()
        .flatten();
    let oidc = file
        .oidc
        .iter()
        .filter_map(|o| o.client_secret_file.as_ref());
    let receivers = file
        .log_receivers
        .iter()
        .filter_map(|r| r.client_key_file.as_ref());
    tokens
        .chain(keys)
        .chain(oidc)
        .chain(receivers)
        .chain(tls)
        .filter_map(|p| private_files::loose_permissions(&base.join(p)))
        .collect()
}

/// A TOML error as `line L, column C: message`, without the excerpt of the
/// source that toml's own `Display` quotes: the offending line may hold a
/// token or key (a typo beside a secret), and reload logs every error on
/// each file change. Text in double quotes inside the message (serde
/// quotes a wrongly typed value) is elided for the same reason; field
/// names, which serde quotes in backticks, stay.
fn syntax_message(text: &str, e: &toml::de::Error) -> String {
    let message = elide_quoted(e.message().trim_end());
    let message = match suggestion(&message) {
        Some(better) => format!("{message}; did you mean `{better}`?"),
        None => message,
    };
    let Some(span) = e.span() else {
        return message;
    };
    let before = text.get(..span.start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}: {message}")
}

/// For serde's "unknown field `x`, expected one of `a`, `b`" (or "unknown
/// variant …"): the expected name closest to `x`, if one is close.
fn suggestion(message: &str) -> Option<&str> {
    if !message.starts_with("unknown field") && !message.starts_with("unknown variant") {
        return None;
    }
    let mut names = message.split('`').skip(1).step_by(2);
    let unknown = names.next()?;
    policy::closest(unknown, names)
}

/// `message` with the contents of every double-quoted span replaced by `…`.
fn elide_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut inside = false;
    for c in message.chars() {
        if c == '"' {
            if inside {
                out.push('…');
            }
            inside = !inside;
            out.push(c);
        } else if !inside {
            out.push(c);
        }
    }
    out
}

/// Adds a problem with setting `field`.
fn setting(problems: &mut Vec<Problem>, field: impl Into<String>, message: impl Into<String>) {
    problems.push(Problem::Setting {
        field: field.into(),
        message: message.into(),
    });
}
/// Adds a problem with setting `field` unless `value` is within `bounds`,
/// which are `lo..` ("must be at least LO") or `lo..=hi` ("VALUE is out of
/// range (LO-HI)"). Returns whether it is within.
fn range<T: PartialOrd + fmt::Display>(
    problems: &mut Vec<Problem>,
    field: &str,
    value: T,
    bounds: impl RangeBounds<T>,
) -> bool {
    if bounds.contains(&value) {
        return true;
    }
    let message = match (bounds.start_bound(), bounds.end_bound()) {
        (Bound::Included(lo), Bound::Unbounded) => format!("must be at least {lo}"),
        (Bound::Included(lo), Bound::Included(hi)) => {
            format!("{value} is out of range ({lo}-{hi})")
        }
        _ => format!("{value} is out of range"),
    };
    setting(problems, field, message);
    false
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use policy::Strategy;

    use super::*;

    const MINIMAL: &str = r#"
        [[connector_groups]]
        name = "dc-east"
        provisioning_key = "k-east-SPN7GC8UwIT4NmlyZDirxbgy"

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

    /// A rotation's other root is the next or the previous one, not both;
    /// either is read relative to the file.
    #[test]
    fn one_root_rotation_at_a_time() {
        let with = |tls: &str| format!("[tls]\n{tls}\n{MINIMAL}");
        let both = Config::from_toml(
            &with("next_root_file = \"a.pem\"\nprevious_root_file = \"b.pem\""),
            Path::new("."),
        )
        .expect_err("both");
        assert!(
            both.messages()
                .iter()
                .any(|m| m.contains("tls.next_root_file") && m.contains("one root rotation")),
            "{:?}",
            both.messages()
        );
        let next = Config::from_toml(
            &with("next_root_file = \"r2/ca.pem\""),
            Path::new("/etc/reach"),
        )
        .expect("valid");
        assert_eq!(
            next.settings.tls.next_root_file.as_deref(),
            Some(Path::new("/etc/reach/r2/ca.pem"))
        );
    }

    #[test]
    fn a_group_location_is_read_and_checked() {
        let with = |location: &str| {
            MINIMAL.replace(
                "provisioning_key = \"k-east-SPN7GC8UwIT4NmlyZDirxbgy\"",
                &format!("provisioning_key = \"k-east-SPN7GC8UwIT4NmlyZDirxbgy\"\n{location}"),
            )
        };
        let c = Config::from_toml(
            &with("location = { latitude = 48.85, longitude = 2 }"),
            Path::new("."),
        )
        .expect("valid");
        assert_eq!(
            c.policy.group("dc-east").and_then(|g| g.location),
            policy::Location::new(48.85, 2.0).ok()
        );
        let err = Config::from_toml(
            &with("location = { latitude = 48.85, longitude = 200.0 }"),
            Path::new("."),
        )
        .expect_err("out of range");
        assert_eq!(
            err.messages(),
            vec![
                r#"connector group "dc-east": location.longitude 200 is not a number of degrees in -180..=180"#
            ]
        );
        let err = Config::from_toml(
            &with("location = { latitude = nan, longitude = 2.0 }"),
            Path::new("."),
        )
        .expect_err("not finite");
        assert!(err.messages()[0].contains("location.latitude NaN"), "{err}");
        let err = Config::from_toml(
            &with("location = { lat = 1.0, longitude = 2.0 }"),
            Path::new("."),
        )
        .expect_err("unknown field");
        assert!(err.to_string().contains("lat"), "{err}");
    }

    /// A segment's `check_ca_file` is read relative to the config's
    /// directory, its PEM kept for the connectors; a missing or empty file
    /// is an error naming the segment and the key.
    #[test]
    fn check_ca_files_are_read_relative_to_the_config() {
        let dir = std::env::temp_dir().join(format!("reach-ca-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        std::fs::write(dir.join("roots.pem"), pem).expect("write");
        std::fs::write(dir.join("empty.pem"), "").expect("write");
        let with = |file: &str| {
            format!(
                "{MINIMAL}check = \"https\"\ncheck_path = \"/healthz\"\ncheck_ca_file = \"{file}\"\n"
            )
        };
        let c = Config::from_toml(&with("roots.pem"), &dir).expect("valid");
        let check = &c.policy.segments[0].check;
        assert_eq!(check.kind, policy::CheckKind::Https);
        assert_eq!(
            (check.path.as_str(), check.ca_pem.as_deref()),
            ("/healthz", Some(pem))
        );
        let err = Config::from_toml(&with("missing.pem"), &dir).expect_err("missing");
        assert!(
            err.messages()[0]
                .starts_with(r#"segment "jira": check_ca_file "missing.pem" cannot be read: "#),
            "{err}"
        );
        let err = Config::from_toml(&with("empty.pem"), &dir).expect_err("empty");
        assert_eq!(
            err.messages(),
            vec![r#"segment "jira": check_ca_file "empty.pem" holds no PEM certificate"#]
        );
        let _ = std::fs::remove_dir_all(&dir);
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
        let err = Config::from_toml("[server\ngrpc_listen = 7", Path::new(".")).expect_err("bad");
        assert!(matches!(err, ConfigError::Syntax { .. }), "{err}");
        // A wrongly typed value is reported with its place, beside the
        // other problems of the file.
        let err = Config::from_toml(
            "[server]\ngrpc_listen = 7\nhttp_listen = \"x\"",
            Path::new("."),
        )
        .expect_err("bad");
        let all = err.messages().join("\n");
        assert!(all.contains("line 2, column 15: invalid type"), "{all}");
        assert!(all.contains("server.http_listen"), "{all}");
        let err = Config::from_toml("[serverr]", Path::new(".")).expect_err("bad");
        assert!(err.to_string().contains("serverr"), "{err}");
    }

    #[test]
    fn syntax_errors_never_quote_a_secret() {
        // An unterminated string beside a token, a stray character after a
        // key, a wrongly typed value: toml's own message quotes the line.
        for (text, line) in [
            (
                "[[api_tokens]]\nname = \"ops\"\ntoken = \"s3cret-token-value\nscopes = [\"read\"]\n",
                3,
            ),
            (
                "[[connector_groups]]\nname = \"g\"\nprovisioning_key = \"s3cret-token-value\" x\n",
                3,
            ),
            (
                "[[connector_groups]]\nname = \"g\"\nmax_uses = \"s3cret-token-value\"\n",
                3,
            ),
        ] {
            let err = Config::from_toml(text, Path::new(".")).expect_err("bad");
            let shown = format!("{err} {err:?} {}", err.messages().join(" "));
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains(&format!("line {line}, column ")), "{shown}");
        }
    }

    #[test]
    fn debug_of_a_loaded_config_redacts_every_secret() {
        let text = r#"
            [[api_tokens]]
            name = "ops"
            token = "s3cret-api-token-PlQ7jmHXY1X2oyup1Uok"
            scopes = ["read"]
            [[connector_groups]]
            name = "dc-east"
            provisioning_key = "s3cret-group-key-FPycc3enZejaBMAXzGEL"
        "#;
        let c = Config::from_toml(text, Path::new(".")).expect("valid");
        let shown = format!("{c:?}");
        assert!(
            shown.contains("ops") && shown.contains("dc-east"),
            "{shown}"
        );
        assert!(!shown.contains("s3cret"), "{shown}");
        let file: FileConfig = toml::from_str(text).expect("parses");
        let shown = format!("{file:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn subnet_widths_are_bounded_by_the_config() {
        let text = |v4: &str, v6: &str, apps: &str| {
            format!(
                "[health]\nmin_subnet_prefix_v4 = {v4}\nmin_subnet_prefix_v6 = {v6}\n{MINIMAL}\n\
                 [[segments]]\nname = \"wide\"\napplications = [{apps}]\ntcp_ports = [\"80\"]\n\
                 health_reporting = \"on_access\"\nconnector_groups = [\"dc-east\"]\n"
            )
        };
        let load = |t: String| Config::from_toml(&t, Path::new("."));
        assert!(load(text("16", "64", r#""10.1.0.0/16", "fd00::/64""#)).is_ok());
        let err = load(text("16", "64", r#""10.0.0.0/15""#)).expect_err("too wide");
        assert!(err.to_string().contains("wider than /16"), "{err}");
        let err = load(text("16", "64", r#""fd00::/48""#)).expect_err("too wide");
        assert!(err.to_string().contains("wider than /64"), "{err}");
        // The defaults allow the widest private range and refuse everything.
        assert!(load(text("8", "8", r#""10.0.0.0/8", "fd00::/8""#)).is_ok());
        let err = load(text("8", "8", r#""0.0.0.0/0""#)).expect_err("catch-all");
        assert!(err.to_string().contains("covers every address"), "{err}");
        let err = load(text("0", "8", r#""10.0.0.0/8""#)).expect_err("0 is no bound");
        assert!(
            err.to_string().contains("health.min_subnet_prefix_v4"),
            "{err}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn secret_files_readable_by_others_are_warned_about() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("reach-ca-modes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        for (file, mode) in [("open-token", 0o644), ("closed-key", 0o600)] {
            std::fs::write(
                dir.join(file),
                "a-long-enough-secret-x2ngUZsYLeJOhbAo3s2g\n",
            )
            .expect("write");
            std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(mode))
                .expect("chmod");
        }
        let text = r#"
            [[api_tokens]]
            name = "ops"
            token_file = "open-token"
            scopes = ["read"]
            [[connector_groups]]
            name = "g"
            provisioning_key_file = "closed-key"
        "#;
        let c = Config::from_toml(text, &dir).expect("valid");
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("open-token"), "{:?}", c.warnings);
        assert!(c.warnings[0].contains("0644"), "{:?}", c.warnings);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn secrets_from_files_and_overrides() {
        let dir = std::env::temp_dir().join(format!("reach-ca-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        std::fs::write(dir.join("key"), "from-file-oqp4fcNQEgNexGKqPreKSK96\n").expect("write");
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
        assert!(c.group_keys["g"].matches(b"from-file-oqp4fcNQEgNexGKqPreKSK96"));
        assert!(
            c.tokens[0]
                .secret
                .matches(b"from-file-oqp4fcNQEgNexGKqPreKSK96")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_store_is_sqlite_in_the_data_dir_unless_a_url_says_otherwise() {
        use crate::store::StoreLocation;
        let c = Config::from_toml(MINIMAL, Path::new(".")).expect("valid");
        assert_eq!(c.settings.store, StoreLocation::DataDir);
        assert_eq!(
            c.settings.store.resolve(Path::new("/d")),
            StoreLocation::Sqlite("/d/reach.db".into())
        );
        let dir = std::env::temp_dir().join(format!("reach-ca-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        std::fs::write(dir.join("db-password"), "s3cret-db\n").expect("write");
        let text = "[store]\nurl = \"postgres://reach@db.internal/reach?sslmode=verify-full\"\n\
                    password_file = \"db-password\"\n[replica]\nid = \"ca-1\"\n";
        let c = Config::from_toml(text, &dir).expect("valid");
        match &c.settings.store {
            StoreLocation::Postgres { url, password } => {
                assert_eq!(
                    url,
                    "postgres://reach@db.internal/reach?sslmode=verify-full"
                );
                assert!(password.as_ref().is_some_and(|p| p.matches(b"s3cret-db")));
            }
            other => panic!("expected PostgreSQL, got {other:?}"),
        }
        assert_eq!(c.settings.replica_id.as_deref(), Some("ca-1"));
        // A password in the URL never shows in Debug.
        let c = Config::from_toml(
            "[store]\nurl = \"postgresql://reach:hunter2@db/reach\"\n",
            &dir,
        )
        .expect("valid");
        let shown = format!("{:?} {}", c.settings, c.settings.store);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("reach:***@db/reach"), "{shown}");
        let c = Config::from_toml("[store]\nurl = \"sqlite:shared.db\"\n", &dir).expect("valid");
        assert_eq!(
            c.settings.store,
            StoreLocation::Sqlite(dir.join("shared.db"))
        );
        // Wrong URLs and missing files are named.
        for (text, wanted) in [
            ("[store]\nurl = \"mysql://x\"\n", "store.url"),
            (
                "[store]\nurl = \"postgres://x/y\"\npassword_file = \"missing\"\n",
                "store.password_file: cannot read",
            ),
            (
                "[store]\npassword_file = \"db-password\"\n",
                "store.password_file: is only used",
            ),
            ("[replica]\nid = \"a,b\"\n", "replica.id"),
        ] {
            let err = Config::from_toml(text, &dir).expect_err("invalid");
            let messages = err.messages().join("\n");
            assert!(messages.contains(wanted), "{text}: {messages}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn settings_out_of_bounds_are_named_with_their_bounds() {
        let text = r#"
            [server]
            reload_poll_ms = 9
            [selection]
            discovery_timeout_ms = 0
            [health]
            stale_after_intervals = 0
            check_budget = 0
            heartbeat_interval_ms = 9
            access_forward_interval_ms = 0
            assumed_checks_per_second = 0
            max_windows_per_segment = 0
            [tls]
            connector_cert_days = 3651
            connector_cert_validity_s = 2
            renewal_grace_s = 0
            handshake_timeout_ms = 99
            [limits]
            max_concurrent_streams = 0
            max_connections = 0
            connector_message_burst = 0
            [[connector_groups]]
            name = "g"
            provisioning_key = "k-DmYStD7TW9CYc4cdPkm9zUgy"
            max_uses = 0
        "#;
        let err = Config::from_toml(text, Path::new(".")).expect_err("invalid");
        assert_eq!(
            err.messages(),
            [
                "server.reload_poll_ms: must be at least 10",
                "selection.discovery_timeout_ms: 0 is out of range (1-60000)",
                "health.stale_after_intervals: must be at least 1",
                "health.check_budget: must be at least 1",
                "health.heartbeat_interval_ms: must be at least 10",
                "health.access_forward_interval_ms: must be at least 1",
                "health.assumed_checks_per_second: must be at least 1",
                "health.max_windows_per_segment: 0 is out of range (1-10000000)",
                "tls.connector_cert_days: 3651 is out of range (1-3650)",
                "tls.connector_cert_validity_s: 2 is out of range (3-315360000)",
                "tls.renewal_grace_s: 0 is out of range (1-604800)",
                "tls.handshake_timeout_ms: 99 is out of range (100-120000)",
                "limits.max_concurrent_streams: must be at least 1",
                "limits.max_connections: must be at least 1",
                "limits.connector_message_burst: must be at least 1",
                "connector_groups \"g\".max_uses: must be at least 1",
            ]
        );
    }

    /// An entry of a `[[…]]` section without its `name` is one more
    /// problem, listed with the rest of the file's.
    #[test]
    fn an_entry_without_a_name_is_listed_with_the_other_problems() {
        let text = r#"
            [server]
            reload_poll_ms = 9
            [[api_tokens]]
            token = "t-DmYStD7TW9CYc4cdPkm9zUgy"
            scopes = ["read"]
        "#;
        let err = Config::from_toml(text, Path::new(".")).expect_err("invalid");
        assert_eq!(
            err.messages(),
            [
                "server.reload_poll_ms: must be at least 10",
                "api_tokens #1: name is empty",
            ]
        );
    }

    #[test]
    fn forwards_must_come_more_often_than_windows_lapse() {
        let text = r#"
            [health]
            on_access_window_ms = 1000
            access_forward_interval_ms = 1000
        "#;
        let err = Config::from_toml(text, Path::new(".")).expect_err("invalid");
        assert_eq!(
            err.messages(),
            [
                "health.access_forward_interval_ms: 1000 ms must be shorter than the on-access window (1000 ms), or windows lapse between forwards"
            ]
        );
    }

    /// Any valid window works alone (the forward interval's
    /// default adapts), and the connector overrides get the connector's
    /// own bounds.
    #[test]
    fn a_short_window_alone_is_valid_and_overrides_are_bounded() {
        let c = Config::from_toml("[health]\non_access_window_s = 4\n", Path::new("."))
            .expect("a 4 s window alone is valid");
        assert_eq!(c.settings.on_access_window, Duration::from_secs(4));
        assert_eq!(c.settings.access_forward_interval, Duration::from_secs(1));
        let c = Config::from_toml(MINIMAL, Path::new(".")).expect("valid");
        assert_eq!(c.settings.access_forward_interval, Duration::from_secs(60));
        let text = "[health]\nchecks_per_second = 1000000001\ncheck_timeout_ms = 600001\n";
        let err = Config::from_toml(text, Path::new(".")).expect_err("invalid");
        assert_eq!(
            err.messages(),
            [
                "health.checks_per_second: 1000000001 is out of range (0-100000)",
                "health.check_timeout_ms: 600001 is out of range (0-600000)",
            ]
        );
        let ok = "[health]\nchecks_per_second = 100000\ncheck_timeout_ms = 0\n";
        assert!(Config::from_toml(ok, Path::new(".")).is_ok());
    }

    /// Guessable secrets are refused whatever their length: repeats,
    /// sequences, dictionary and project words, dates, and what the
    /// shipped configurations carry; 256 random bits pass.
    #[test]
    fn weak_secrets_are_refused_by_estimated_strength_unless_allowed_for_tests() {
        for weak in [
            "reach-admin-2024-x",
            "aaaaaaaaaaaaaaaaaaaaaaaa",
            "abcdefghijklmnopqrstuvwxyz",
            "tok-admin-0123456789",
            "key-east-0123456789",
            "correct-horse-battery",
            "ops-token-2026-12-07",
            "fifteen-chars-x",
            "demo-token-loopback-only",
            "qwertyuiopasdfghjkl",
        ] {
            let bits = secrets::estimated_bits(weak, "ops");
            assert!(bits < secrets::MIN_SECRET_BITS, "{weak}: {bits}");
            let text = format!(
                "[[api_tokens]]\nname = \"ops\"\ntoken = {weak:?}\nscopes = [\"read\"]\n\
                 [[connector_groups]]\nname = \"g\"\nprovisioning_key = {weak:?}\n"
            );
            let err = Config::from_toml(&text, Path::new(".")).expect_err(weak);
            let messages = err.messages();
            assert_eq!(messages.len(), 2, "{weak}: {messages:?}");
            assert!(
                messages[0].starts_with("api_tokens \"ops\": token is too weak: about ")
                    && messages[1].starts_with(
                        "connector_groups \"g\": provisioning_key is too weak: about "
                    )
                    && messages
                        .iter()
                        .all(|m| m.contains("`openssl rand -base64 32`")),
                "{messages:?}"
            );
            assert!(!err.to_string().contains(weak), "the secret is never shown");
            let allowed = format!("[server]\nallow_short_secrets = true\n{text}");
            Config::from_toml(&allowed, Path::new(".")).expect("allowed for tests");
        }
        // What `openssl rand -base64 32` and `-hex 32` print pass.
        for strong in [
            "P8mHrP0rMQ4HNusbB1qRAsDTZEUvdhbEPmOKC4RY2Ds=",
            "3f9c2a7e41b05d68a1c4e9f7b2d30a563f9c2a7e41b05d68a1c4e9f7b2d30a56",
        ] {
            let bits = secrets::estimated_bits(strong, "g");
            assert!(bits >= secrets::MIN_SECRET_BITS, "{strong}: {bits}");
            let text =
                format!("[[connector_groups]]\nname = \"g\"\nprovisioning_key = {strong:?}\n");
            Config::from_toml(&text, Path::new(".")).unwrap_or_else(|e| panic!("{strong}: {e}"));
        }
    }

    #[test]
    fn key_expiry_is_a_utc_date_or_time() {
        assert_eq!(parse_utc("2027-01-31"), Some(1_801_353_600_000));
        assert_eq!(parse_utc("2027-01-31T12:00:00Z"), Some(1_801_396_800_000));
        assert_eq!(parse_utc("2024-02-29"), Some(1_709_164_800_000));
        for wrong in [
            "2027-02-31",
            "2027-04-31",
            "2026-02-29",
            "2027-13-01",
            "2027-00-10",
            "2027-1-31",
            "27-01-31",
            "+2027-01-31",
            "12027-01-31",
            "2027-01-31T12:00:00",
            "2027-01-31T24:00:00Z",
            "2027-01-31T12:00Z",
            "2027-01-31 12:00:00Z",
            "2027-01-31T12:00:00+01:00",
            "2027-01-31x",
            "",
        ] {
            assert_eq!(parse_utc(wrong), None, "{wrong:?} was accepted");
        }
        let err = Config::from_toml(
            "[[connector_groups]]\nname = \"g\"\nprovisioning_key = \"k-DmYStD7TW9CYc4cdPkm9zUgy\"\nexpires_at = \"2027-02-31\"",
            Path::new("."),
        )
        .expect_err("invalid");
        assert_eq!(
            err.messages(),
            [
                "connector_groups \"g\".expires_at: \"2027-02-31\" is not a UTC time (expected e.g. \"2027-01-31\" or \"2027-01-31T12:00:00Z\")"
            ]
        );
    }

    /// A token or provisioning key that is (or contains) a placeholder the
    /// shipped configurations carry is refused, naming the token or group
    /// and the key, never the value; inline or from a file, in any case
    /// and spelling, and even where short secrets are allowed.
    #[test]
    fn placeholder_secrets_are_refused_naming_the_token_and_the_group() {
        let shipped = r#"
            [[api_tokens]]
            name = "admin"
            token = "container-admin-token-change-me"
            scopes = ["access", "read", "admin"]
            [[connector_groups]]
            name = "dc-east"
            provisioning_key = "container-key-dc-east-change-me"
        "#;
        let err = Config::from_toml(shipped, Path::new(".")).expect_err("placeholders");
        let fix = "replace it with a secret of your own, e.g. `openssl rand -base64 32`";
        assert_eq!(
            err.messages(),
            [
                format!(
                    r#"api_tokens "admin": token is a placeholder (it contains "change-me"): {fix}"#
                ),
                format!(
                    r#"connector_groups "dc-east": provisioning_key is a placeholder (it contains "change-me"): {fix}"#
                ),
            ]
        );
        assert!(!err.to_string().contains("container-"), "{err}");
        for (value, shown) in [
            ("CHANGE_ME", "change-me"),
            ("pleasechangeme-0123456789", "change-me"),
            ("REPLACE-ME: the ops API token", "REPLACE-ME"),
            ("replace_me", "REPLACE-ME"),
        ] {
            let text = format!(
                "[server]\nallow_short_secrets = true\n[[connector_groups]]\nname = \"g\"\nprovisioning_key = {value:?}\n"
            );
            let err = Config::from_toml(&text, Path::new(".")).expect_err(value);
            assert_eq!(
                err.messages(),
                [format!(
                    r#"connector_groups "g": provisioning_key is a placeholder (it contains {shown:?}): {fix}"#
                )],
                "{value}"
            );
        }
        let dir = std::env::temp_dir().join(format!("reach-ca-placeholder-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        std::fs::write(dir.join("ops.token"), "REPLACE-ME: the ops API token\n").expect("write");
        let text =
            "[[api_tokens]]\nname = \"ops\"\ntoken_file = \"ops.token\"\nscopes = [\"read\"]\n";
        let err = Config::from_toml(text, &dir).expect_err("placeholder in a file");
        assert_eq!(
            err.messages(),
            [format!(
                r#"api_tokens "ops": token_file {} holds a placeholder (it contains "REPLACE-ME"): {fix}"#,
                dir.join("ops.token").display()
            )]
        );
        // Secrets of one's own pass, words that merely resemble the
        // placeholders too.
        for own in [
            "changes-me-not-PKuqddLCxMAexq3zY44ibGNs",
            "3f9c2a7e41b05d68a1c4e9f7b2d30a56",
        ] {
            let text = format!("[[connector_groups]]\nname = \"g\"\nprovisioning_key = {own:?}\n");
            Config::from_toml(&text, Path::new(".")).unwrap_or_else(|e| panic!("{own}: {e}"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The example carries placeholders for its secrets (refused as they
    /// are); with secrets of one's own in their place it is valid.
    #[test]
    fn example_config_is_valid_once_its_secrets_are_replaced() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples/ca.toml");
        let text = std::fs::read_to_string(&path).expect("read the example");
        let err = Config::load_bytes(&path, text.as_bytes()).expect_err("placeholders");
        let messages = err.messages();
        assert!(
            !messages.is_empty() && messages.iter().all(|m| m.contains("is a placeholder")),
            "{messages:?}"
        );
        let own = text.replace("change-me", "3UZEX391VWCxHwwJ+MKXXMLNY4BJqQLw3yrQ");
        let c = Config::load_bytes(&path, own.as_bytes())
            .unwrap_or_else(|e| panic!("{}", e.messages().join("\n")));
        assert!(!c.policy.segments.is_empty());
    }
}
