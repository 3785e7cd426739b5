//! Secrets in the configuration: API tokens and connector groups'
//! provisioning keys (given inline or in a file, exactly one of the two,
//! never a placeholder a shipped configuration carries), and how each
//! group's key may be used (`max_uses`, `expires_at`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::file::{GroupSection, TokenSection};
use super::{Problem, setting};
use crate::credentials::auth::{ApiToken, Scope};
use crate::ground::secret::Secret;

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
/// Least estimated strength of an API token or provisioning key, in bits.
/// A valid token is never throttled (`trust::throttle` refuses wrong
/// guesses only), so what makes guessing hopeless is the secret itself:
/// 2^64 guesses are out of reach at any rate the CA can answer.
pub const MIN_SECRET_BITS: f64 = 64.0;

/// What a secret is made of for the fix in the messages: 256 random bits.
pub const MAKE_A_SECRET: &str = "`openssl rand -base64 32`";

/// Words of the project's own an attacker tries first (zxcvbn's user
/// inputs): a secret built from them is as weak as one from a dictionary.
const PROJECT_WORDS: &[&str] = &[
    "reach",
    "central",
    "authority",
    "connector",
    "admin",
    "access",
    "read",
    "token",
    "key",
    "provisioning",
    "group",
    "demo",
    "container",
    "secret",
    "password",
    "loopback",
];

/// The estimated strength of `value` in bits: log2 of zxcvbn's guess
/// count (it knows repeats, sequences, keyboard walks, dictionary words and
/// dates), with the project's words and `name` as a dictionary too. zxcvbn
/// counts in a saturating `u64`, so the estimate tops out at exactly 64:
/// "64" reads "64 or more".
pub fn estimated_bits(value: &str, name: &str) -> f64 {
    let mut words: Vec<&str> = PROJECT_WORDS.to_vec();
    if !name.is_empty() {
        words.push(name);
    }
    // `u64::MAX as f64` rounds to 2^64: a saturated count is 64.0 bits.
    (zxcvbn::zxcvbn(value, &words).guesses() as f64).log2()
}

/// The placeholders the project's shipped configurations carry in place of
/// secrets (`change-me` in the container image's and the examples'
/// `ca.toml`, `REPLACE-ME` in the Kubernetes Secrets), as written there, and
/// their two words: a value containing them in any case, joined by `-`, `_`
/// or nothing, is one of them.
const PLACEHOLDERS: &[(&str, [&str; 2])] = &[
    ("change-me", ["change", "me"]),
    ("REPLACE-ME", ["replace", "me"]),
];

/// The shipped placeholder `value` carries, if any: a CA started with one
/// would accept a secret anyone who read the shipped file knows.
fn placeholder(value: &Secret) -> Option<&'static str> {
    let lower = value.expose().to_lowercase();
    PLACEHOLDERS
        .iter()
        .find(|(_, [a, b])| {
            ["-", "_", ""]
                .iter()
                .any(|sep| lower.contains(&format!("{a}{sep}{b}")))
        })
        .map(|(shown, _)| *shown)
}

/// Secrets are read from the file straight into `Secret`, whose `Debug` is
/// redacted.
impl<'de> serde::Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret::new)
    }
}

/// Reads a secret given inline or in a file (exactly one of the two), not
/// a shipped placeholder, of at least [`MIN_SECRET_BITS`] unless
/// `short_ok` (tests only: `[server] allow_short_secrets`). `name` is the
/// token's or group's name (a secret made of it is guessed first).
fn secret(
    problems: &mut Vec<Problem>,
    (subject, name): (&str, &str),
    (inline_name, inline): (&str, Option<&Secret>),
    (file_name, file): (&str, Option<&PathBuf>),
    base: &Path,
    short_ok: bool,
) -> Option<Secret> {
    // Where the value came from, for the placeholder message.
    let source = match file {
        Some(f) if inline.is_none() => format!("{file_name} {} holds", base.join(f).display()),
        _ => format!("{inline_name} is"),
    };
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
        (Some(v), None) => v.trimmed(),
        (None, Some(f)) => {
            let full = base.join(f);
            match std::fs::read_to_string(&full) {
                Ok(v) => Secret::new(v).trimmed(),
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
    if let Some(shown) = placeholder(&value) {
        // The shipped marker only, never the value.
        setting(
            problems,
            subject,
            format!(
                "{source} a placeholder (it contains {shown:?}): replace it with a secret \
                 of your own, e.g. {MAKE_A_SECRET}"
            ),
        );
        return None;
    }
    if !short_ok && weak(problems, subject, &value, name, (source, inline.is_some())) {
        return None;
    }
    Some(value)
}

/// Whether `value` is estimated under [`MIN_SECRET_BITS`] (then reported
/// as a problem of `subject`, with the estimate only, never the value).
/// `source` says where it came from, and whether inline.
fn weak(
    problems: &mut Vec<Problem>,
    subject: &str,
    value: &Secret,
    name: &str,
    (source, inline): (String, bool),
) -> bool {
    let bits = estimated_bits(value.expose(), name);
    if bits >= MIN_SECRET_BITS {
        return false;
    }
    let held = if inline {
        source
    } else {
        format!("{source} a secret")
    };
    setting(
        problems,
        subject,
        format!(
            "{held} too weak: about {bits:.0} bits against a guesser who tries repeats, \
             sequences, words and dates first; at least {MIN_SECRET_BITS:.0} are required: \
             make one with {MAKE_A_SECRET} (`[server] allow_short_secrets = true` lifts \
             this, for tests only)"
        ),
    );
    true
}

/// The `[[api_tokens]]`, each with a name, scopes and a secret, no two
/// alike.
pub(super) fn api_tokens(
    sections: &[TokenSection],
    base: &Path,
    short_ok: bool,
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
        t.check_bounds(&subject, problems);
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
            (&subject, &t.name),
            ("token", t.token.as_ref()),
            ("token_file", t.token_file.as_ref()),
            base,
            short_ok,
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

/// Parses `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM:SSZ` (UTC) into Unix ms; a
/// date that is not in the calendar (`2027-02-31`) is refused.
pub fn parse_utc(text: &str) -> Option<i64> {
    use time::macros::format_description;
    use time::{Date, PrimitiveDateTime};
    let date_time = format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    let date = format_description!("[year]-[month]-[day]");
    // `[year]` also takes a sign ("+2027"); the file's dates have none.
    if !text.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let at = match PrimitiveDateTime::parse(text, date_time) {
        Ok(at) => at,
        Err(_) => Date::parse(text, date).ok()?.midnight(),
    };
    i64::try_from(at.assume_utc().unix_timestamp_nanos() / 1_000_000).ok()
}

/// How each group's provisioning key may be used.
pub(super) fn key_policies(
    sections: &[GroupSection],
    keys: &HashMap<String, Secret>,
    problems: &mut Vec<Problem>,
) -> HashMap<String, KeyPolicy> {
    let mut out = HashMap::new();
    for g in sections {
        let subject = format!("connector_groups {:?}", g.name);
        g.check_bounds(&subject, problems);
        let max_uses = g.max_uses;
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

/// Each `[[connector_groups]]` provisioning key, by group name.
pub(super) fn group_keys(
    sections: &[GroupSection],
    base: &Path,
    short_ok: bool,
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
            (&subject, &g.name),
            ("provisioning_key", g.provisioning_key.as_ref()),
            ("provisioning_key_file", g.provisioning_key_file.as_ref()),
            base,
            short_ok,
        ) {
            out.insert(g.name.clone(), key);
        }
    }
    out
}
