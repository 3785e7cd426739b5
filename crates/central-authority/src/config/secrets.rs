//! Secrets in the configuration: API tokens and connector groups'
//! provisioning keys (given inline or in a file, exactly one of the two),
//! and how each group's key may be used (`max_uses`, `expires_at`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::file::{GroupSection, TokenSection};
use super::{Problem, setting};
use crate::auth::{ApiToken, Scope, Secret};

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

/// The `[[api_tokens]]`, each with a name, scopes and a secret, no two
/// alike.
pub(super) fn api_tokens(
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

/// How each group's provisioning key may be used.
pub(super) fn key_policies(
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

/// Each `[[connector_groups]]` provisioning key, by group name.
pub(super) fn group_keys(
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
