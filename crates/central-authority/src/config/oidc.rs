//! `[[oidc]]`: the OpenID providers people sign in with, checked into
//! `credentials::oidc::ProviderConfig`s.

use std::collections::HashSet;
use std::path::Path;

use super::file::OidcSection;
use super::{Problem, setting};
use crate::credentials::auth::Scope;
use crate::credentials::oidc::ProviderConfig;
use crate::ground::secret::Secret;

/// The checked providers; each problem is added to `problems`.
pub(super) fn providers(
    sections: &[OidcSection],
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Vec<ProviderConfig> {
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for (i, o) in sections.iter().enumerate() {
        let subject = if o.name.is_empty() {
            format!("oidc #{}", i + 1)
        } else {
            format!("oidc {:?}", o.name)
        };
        let before = problems.len();
        if o.name.is_empty() {
            setting(problems, &subject, "name is empty");
        } else if !names.insert(o.name.as_str()) {
            setting(problems, &subject, "name is used by another provider");
        }
        check_url(problems, &subject, "issuer", &o.issuer);
        check_url(problems, &subject, "redirect_url", &o.redirect_url);
        if o.client_id.is_empty() {
            setting(problems, format!("{subject}.client_id"), "is empty");
        }
        let client_secret = client_secret(problems, &subject, o, base);
        let ca_pem = o.ca_file.as_ref().and_then(|f| {
            let full = base.join(f);
            std::fs::read(&full)
                .map_err(|e| {
                    let m = format!("cannot read {}: {e}", full.display());
                    setting(problems, format!("{subject}.ca_file"), m);
                })
                .ok()
        });
        let roles = roles(problems, &subject, o);
        o.check_bounds(&subject, problems);
        if problems.len() == before {
            out.push(ProviderConfig {
                name: o.name.clone(),
                issuer: o.issuer.clone(),
                client_id: o.client_id.clone(),
                client_secret,
                redirect_url: o.redirect_url.clone(),
                scopes: o.scopes.clone(),
                ca_pem,
                roles_claim: o.roles_claim.clone(),
                roles,
                session_lifetime_ms: o.session_lifetime_s.saturating_mul(1000),
                keys_refresh_ms: o.keys_refresh_s.saturating_mul(1000),
                revalidate_ms: o.revalidate_s.saturating_mul(1000),
            });
        }
    }
    out
}

/// An `https` URL, or `http` to a loopback address (a provider on the
/// same host, as in tests): tokens never cross a network in the clear.
fn check_url(problems: &mut Vec<Problem>, subject: &str, key: &str, url: &str) {
    match crate::credentials::oidc::check_url(url) {
        Ok(()) => {}
        Err(m) => setting(problems, format!("{subject}.{key}"), m),
    }
}

fn client_secret(
    problems: &mut Vec<Problem>,
    subject: &str,
    o: &OidcSection,
    base: &Path,
) -> Option<Secret> {
    match (&o.client_secret, &o.client_secret_file) {
        (Some(_), Some(_)) => {
            setting(
                problems,
                subject,
                "set either client_secret or client_secret_file, not both",
            );
            None
        }
        (Some(s), None) => Some(s.trimmed()),
        (None, Some(f)) => {
            let full = base.join(f);
            match std::fs::read_to_string(&full) {
                Ok(v) => Some(Secret::new(v).trimmed()),
                Err(e) => {
                    setting(
                        problems,
                        format!("{subject}.client_secret_file"),
                        format!("cannot read {}: {e}", full.display()),
                    );
                    None
                }
            }
        }
        // A public client (PKCE alone).
        (None, None) => None,
    }
}

fn roles(problems: &mut Vec<Problem>, subject: &str, o: &OidcSection) -> Vec<(String, Vec<Scope>)> {
    if o.roles.is_empty() {
        setting(
            problems,
            format!("{subject}.roles"),
            "is empty: map at least one value of the roles claim to scopes \
             (`roles = { \"reach-admins\" = [\"admin\"] }`), or nobody can sign in",
        );
    }
    let mut out = Vec::new();
    for (role, scopes) in &o.roles {
        let mut parsed = Vec::new();
        for s in scopes {
            match s.parse::<Scope>() {
                Ok(scope) => parsed.push(scope),
                Err(m) => setting(problems, format!("{subject}.roles.{role:?}"), m),
            }
        }
        out.push((role.clone(), parsed));
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError, Problem};

    fn problems(oidc: &str) -> Vec<String> {
        match Config::from_toml(oidc, std::path::Path::new("/tmp")) {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid(p)) => p
                .iter()
                .filter_map(|p| match p {
                    Problem::Setting { field, message } => Some(format!("{field}: {message}")),
                    Problem::Policy(_) => None,
                })
                .collect(),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_provider_is_checked_whole() {
        let ok = r#"
[[oidc]]
name = "corp"
issuer = "https://sso.example.com/realms/corp"
client_id = "reach"
client_secret = "s3cret"
redirect_url = "https://ca.example.com:7480/auth/callback"
roles = { "reach-admins" = ["admin"] }
"#;
        assert!(problems(ok).is_empty(), "{:?}", problems(ok));
        let c = Config::from_toml(ok, std::path::Path::new("/tmp")).expect("valid");
        assert_eq!(c.oidc[0].roles_claim, "groups");
        assert_eq!(c.oidc[0].session_lifetime_ms, 28_800_000);
        assert_eq!(c.oidc[0].revalidate_ms, 300_000);

        let bad = r#"
[[oidc]]
name = "corp"
issuer = "http://sso.example.com"
client_id = ""
client_secret = "a"
client_secret_file = "b"
redirect_url = "https://ca.example.com/auth/callback"
roles = { "x" = ["write"] }
session_lifetime_s = 60
revalidate_s = 0

[[oidc]]
name = "corp"
issuer = "http://127.0.0.1:8080"
client_id = "reach"
redirect_url = "http://[::1]:7480/auth/callback"
"#;
        let p = problems(bad);
        for want in [
            "oidc \"corp\".issuer: \"http://sso.example.com\": must be https",
            "oidc \"corp\".client_id: is empty",
            "oidc \"corp\": set either client_secret or client_secret_file",
            "oidc \"corp\".roles.\"x\": unknown scope \"write\"",
            "oidc \"corp\".session_lifetime_s: 60 is out of range (300-604800)",
            "oidc \"corp\".revalidate_s: 0 is out of range (1-86400)",
            "oidc \"corp\": name is used by another provider",
            "oidc \"corp\".roles: is empty",
        ] {
            assert!(
                p.iter().any(|m| m.starts_with(want)),
                "{want} not in {p:#?}"
            );
        }
        // Loopback http is allowed: no problem names the second's URLs.
        assert!(
            !p.iter()
                .any(|m| m.contains("127.0.0.1") || m.contains("[::1]")),
            "{p:#?}"
        );
    }
}
