//! Configuration reload: on SIGHUP and when the file, or a certificate or
//! key file its `[tls]` names, changes (their content hashes, polled every
//! `reload_poll_ms`). A changed file is loaded once two
//! polls in a row read the same content, so a file caught while a tool
//! writes it in place (truncated, half written) is never applied. A valid
//! new config is applied at once, with the TLS material its `[tls]` names
//! (read again: certificate and key files replaced, a generated server
//! certificate issued anew); an invalid one, or one whose TLS material
//! cannot be loaded, is refused with every error logged and the running
//! policy and material stay. Either way the reload is an entry in the audit
//! trail (`config.reload`, actor `system`: the trigger), naming the API
//! tokens, connector groups and segments an applied one added or removed
//! (names only, never a token).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use crate::config::Config;
use crate::credentials::tls::Material;
use crate::error::TrustError;
use crate::state::authority::Authority;
use crate::state::counters::Metrics;
use crate::trust;
use crate::trust::audit::{Actor, AdminAction, Outcome};

/// The file's current content and its hash, if it can be read.
async fn current(path: &Path) -> Option<(Vec<u8>, u64)> {
    let bytes = tokio::fs::read(path).await.ok()?;
    let hash = crate::config::content_hash(&bytes);
    Some((bytes, hash))
}

/// A hash of the files the running `[tls]` names (certificates and keys
/// the operator provides; a missing one counts as empty), so that
/// replacing them reloads as a change to the configuration does. The
/// generated ones in the data directory are the CA's own writing and are
/// not watched.
async fn tls_files_hash(authority: &Authority) -> u64 {
    let files = authority.snapshot().settings().tls.files();
    let mut all = Vec::new();
    for file in files {
        let bytes = tokio::fs::read(&file).await.unwrap_or_default();
        all.extend_from_slice(&crate::config::content_hash(&bytes).to_le_bytes());
    }
    crate::config::content_hash(&all)
}

/// The configuration's content hash combined with `tls_files_hash`: what
/// the watcher compares from poll to poll.
fn watched(config_hash: u64, tls_hash: u64) -> u64 {
    let mut both = config_hash.to_le_bytes().to_vec();
    both.extend_from_slice(&tls_hash.to_le_bytes());
    crate::config::content_hash(&both)
}

/// What the watcher sees now: the file's content and the combined hash.
async fn watched_now(authority: &Authority, path: &Path) -> Option<(Vec<u8>, u64)> {
    let (bytes, hash) = current(path).await?;
    Some((bytes, watched(hash, tls_files_hash(authority).await)))
}

/// When the file watcher loads a changed file: once two polls in a row read
/// the same changed content. A file written in place is truncated and then
/// filled, and a poll can fall in between: that content is seen once and
/// replaced by the next poll's, so it is never loaded. The cost: a change
/// takes effect one to two poll intervals after it is written, not zero to
/// one.
#[derive(Debug)]
struct Settle {
    /// The content last loaded (applied or refused).
    loaded: u64,
    /// A changed content seen by the last poll, not yet loaded.
    seen: Option<u64>,
}

impl Settle {
    fn new(loaded: u64) -> Settle {
        Settle { loaded, seen: None }
    }

    /// Takes one poll's content hash; true when it is to be loaded now.
    fn poll(&mut self, hash: u64) -> bool {
        if hash == self.loaded {
            self.seen = None;
            return false;
        }
        if self.seen == Some(hash) {
            self.loaded = hash;
            self.seen = None;
            return true;
        }
        self.seen = Some(hash);
        false
    }

    /// Content loaded another way (SIGHUP).
    fn loaded(&mut self, hash: u64) {
        self.loaded = hash;
        self.seen = None;
    }
}

/// Reloads `path` now; returns whether the new config was applied.
pub fn reload(authority: &Authority, path: &Path, trigger: &str) -> bool {
    apply(authority, path, trigger, Config::load(path))
}

/// Applies a reloaded configuration together with the TLS material its
/// `[tls]` names (files read again; a generated server certificate issued
/// again): the material is loaded first, and a configuration whose
/// material cannot be loaded is not applied at all (the running policy and
/// material stay). Returns the new server certificate's serial (`None`
/// without TLS).
fn apply_with_material(
    authority: &Authority,
    config: Config,
) -> Result<Option<String>, TrustError> {
    let material = match authority.tls() {
        Some(_) => {
            // The data directory and the listen addresses take effect at
            // the next start: the running ones name the material.
            let running = authority.snapshot();
            let running = running.settings();
            Some(Material::load(
                &running.data_dir,
                &config.settings.tls,
                &running.listen_hosts(),
                config.settings.connector_cert_validity,
            )?)
        }
        None => None,
    };
    authority.apply(config);
    Ok(trust::rotation::install_material(authority, material))
}

/// Applies `loaded` (the config read from `path`), or logs why not.
fn apply(
    authority: &Authority,
    path: &Path,
    trigger: &str,
    loaded: Result<Config, crate::config::ConfigError>,
) -> bool {
    let segments = loaded.as_ref().map_or(0, |c| c.policy.segments.len());
    let changed = loaded
        .as_ref()
        .map(|new| changes(&authority.snapshot().config, new))
        .unwrap_or_default();
    // The TLS material the new file names is loaded with it: a file that
    // cannot be read or a key that is not its certificate's refuses the
    // whole reload, like an invalid configuration.
    let outcome = loaded
        .map_err(|e| e.messages())
        .and_then(|config| apply_with_material(authority, config).map_err(|e| vec![e.to_string()]));
    let (applied, detail) = match outcome {
        Ok(serial) => {
            Metrics::count(&authority.metrics().reloads, "applied");
            tracing::info!(trigger, path = %path.display(), segments, server_certificate = serial.as_deref().unwrap_or("-"), "configuration reloaded");
            let mut detail = match serial {
                Some(serial) => format!("segments={segments} server_certificate={serial}"),
                None => format!("segments={segments}"),
            };
            if !changed.is_empty() {
                detail.push(' ');
                detail.push_str(&changed);
            }
            (true, detail)
        }
        Err(messages) => {
            Metrics::count(&authority.metrics().reloads, "rejected");
            for message in &messages {
                tracing::error!(trigger, path = %path.display(), "{message}");
            }
            tracing::error!(
                trigger,
                "configuration reload refused; the running policy and TLS material stay"
            );
            (false, messages.join("; "))
        }
    };
    let target = path.display().to_string();
    // The reload has taken effect before its entry is written (its detail
    // is what it did); an entry that cannot be written is an error in the
    // log (`audit`), the one trace left.
    let _unrecorded_is_logged = trust::audit::record(
        authority,
        &AdminAction {
            actor: &Actor::system(trigger),
            source: None,
            action: "config.reload",
            target: &target,
            outcome: if applied {
                Outcome::Ok
            } else {
                Outcome::Refused
            },
            detail,
        },
    );
    applied
}

/// What `new` adds to and removes from `old`, by name (never a secret):
/// `tokens+=[a] tokens-=[b] groups+=[…] groups-=[…] segments+=[…]
/// segments-=[…]`, each only when not empty.
fn changes(old: &Config, new: &Config) -> String {
    fn names<'a>(v: impl Iterator<Item = &'a str>) -> std::collections::BTreeSet<&'a str> {
        v.collect()
    }
    let pairs = [
        (
            "tokens",
            names(old.tokens.iter().map(|t| t.name.as_str())),
            names(new.tokens.iter().map(|t| t.name.as_str())),
        ),
        (
            "groups",
            names(old.policy.connector_groups.iter().map(|g| g.name.as_str())),
            names(new.policy.connector_groups.iter().map(|g| g.name.as_str())),
        ),
        (
            "segments",
            names(old.policy.segments.iter().map(|g| g.name.as_str())),
            names(new.policy.segments.iter().map(|g| g.name.as_str())),
        ),
    ];
    let mut out = Vec::new();
    for (what, before, after) in pairs {
        let added: Vec<&str> = after.difference(&before).copied().collect();
        let removed: Vec<&str> = before.difference(&after).copied().collect();
        if !added.is_empty() {
            out.push(format!("{what}+=[{}]", added.join(",")));
        }
        if !removed.is_empty() {
            out.push(format!("{what}-=[{}]", removed.join(",")));
        }
    }
    out.join(" ")
}

/// Watches for SIGHUP and file changes until `stop` turns true. The file's
/// content hash, with those of the `[tls]` files it names, is compared
/// every `reload_poll_ms` (reading a config file once a second is cheaper
/// than trusting coarse mtimes), starting from the hash of the text the
/// running config was loaded from; a change is loaded once it has settled
/// (`Settle`), from the very bytes that settled.
pub async fn watch_config(
    authority: Arc<Authority>,
    path: PathBuf,
    mut stop: watch::Receiver<bool>,
) {
    let mut stopped = std::pin::pin!(async move {
        let _ = stop.wait_for(|s| *s).await;
    });
    let poll = authority.snapshot().settings().reload_poll;
    let loaded_hash = authority.snapshot().config.content_hash;
    let mut settle = Settle::new(watched(loaded_hash, tls_files_hash(&authority).await));
    let mut tick = tokio::time::interval(poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    #[cfg(unix)]
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; reloading on file change only");
            None
        }
    };
    loop {
        #[cfg(unix)]
        let hup = async {
            match hangup.as_mut() {
                Some(s) => s.recv().await,
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let hup = std::future::pending::<Option<()>>();
        tokio::select! {
            _ = &mut stopped => return,
            _ = hup => {
                reload(&authority, &path, "SIGHUP");
                // What was loaded, with the `[tls]` files it names now.
                if let Some((_, hash)) = watched_now(&authority, &path).await {
                    settle.loaded(hash);
                }
            }
            _ = tick.tick() => {
                let Some((bytes, hash)) = watched_now(&authority, &path).await else {
                    continue;
                };
                if settle.poll(hash) {
                    let loaded = Config::load_bytes(&path, &bytes);
                    apply(&authority, &path, "file change", loaded);
                    // A reload that named other `[tls]` files changes the
                    // hash without anything to load again.
                    if let Some((_, hash)) = watched_now(&authority, &path).await {
                        settle.loaded(hash);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Settle;

    /// A reload applied and one refused are both in the audit trail, with
    /// the CA (the trigger) as the actor.
    #[test]
    fn reloads_applied_and_refused_are_audited() {
        let text = "[server]\nallow_short_secrets = true\n";
        let base = std::path::Path::new(".");
        let config = crate::Config::from_toml(text, base).expect("valid");
        let a = crate::state::authority::Authority::with_trust(
            config,
            None,
            crate::store::Store::in_memory().expect("db"),
        );
        let path = std::path::Path::new("/etc/reach/ca.toml");
        assert!(super::apply(
            &a,
            path,
            "SIGHUP",
            crate::Config::from_toml(text, base)
        ));
        // Tokens, groups and segments added and removed are named.
        let token = |n: &str| {
            format!(
                "[[api_tokens]]\nname = \"{n}\"\ntoken = \"secret-of-{n}\"\nscopes = [\"read\"]\n"
            )
        };
        let group = |n: &str| {
            format!(
                "[[connector_groups]]\nname = \"{n}\"\nprovisioning_key = \"key-of-{n}-0123456789\"\n"
            )
        };
        let segment = |n: &str, g: &str| {
            format!(
                "[[segments]]\nname = \"{n}\"\napplications = [\"{n}.test.reach\"]\ntcp_ports = [\"443\"]\nconnector_groups = [\"{g}\"]\n"
            )
        };
        let before = format!(
            "{text}{}{}{}{}",
            token("ops"),
            token("ci"),
            group("east"),
            segment("jira", "east")
        );
        let after = format!(
            "{text}{}{}{}{}",
            token("ops"),
            token("grafana"),
            group("west"),
            segment("wiki", "west")
        );
        assert!(super::apply(
            &a,
            path,
            "SIGHUP",
            crate::Config::from_toml(&before, base)
        ));
        assert!(super::apply(
            &a,
            path,
            "SIGHUP",
            crate::Config::from_toml(&after, base)
        ));
        let (entries, _) = a
            .store()
            .audit(&crate::store::AuditFilter::default(), 1, 0)
            .expect("read");
        let detail = &entries[0].detail;
        for part in [
            "tokens+=[grafana]",
            "tokens-=[ci]",
            "groups+=[west]",
            "groups-=[east]",
            "segments+=[wiki]",
            "segments-=[jira]",
        ] {
            assert!(detail.contains(part), "{part}: {detail}");
        }
        assert!(!detail.contains("secret-of"), "no secret: {detail}");
        assert!(super::apply(
            &a,
            path,
            "SIGHUP",
            crate::Config::from_toml(text, base)
        ));
        let bad = crate::Config::from_toml("[audit]\nretention_s = 1\n", base);
        assert!(!super::apply(&a, path, "file change", bad));
        let (entries, total) = a
            .store()
            .audit(&crate::store::AuditFilter::default(), 10, 0)
            .expect("read");
        assert_eq!(total, 5);
        let shown: Vec<(&str, &str, &str, &str, &str)> = entries[..2]
            .iter()
            .map(|r| {
                (
                    r.actor_kind.as_str(),
                    r.actor.as_str(),
                    r.action.as_str(),
                    r.target.as_str(),
                    r.outcome.as_str(),
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "system",
                    "file change",
                    "config.reload",
                    "/etc/reach/ca.toml",
                    "refused"
                ),
                (
                    "system",
                    "SIGHUP",
                    "config.reload",
                    "/etc/reach/ca.toml",
                    "ok"
                ),
            ]
        );
        assert!(
            entries[0].detail.contains("audit.retention_s"),
            "{entries:?}"
        );
        assert!(entries[0].source.is_empty());
    }

    #[test]
    fn a_change_is_loaded_once_two_polls_agree() {
        let mut s = Settle::new(1);
        // Unchanged: nothing to do.
        assert!(!s.poll(1));
        // Truncated (or half written) on one poll, complete on the next,
        // and the same again on the one after: only the complete content
        // is loaded, once.
        assert!(!s.poll(2));
        assert!(!s.poll(3));
        assert!(s.poll(3));
        assert!(!s.poll(3));
        // A change that is undone before it settles loads nothing.
        assert!(!s.poll(4));
        assert!(!s.poll(3));
        assert!(!s.poll(3));
        // Content that keeps changing is loaded once it stops.
        assert!(!s.poll(5));
        assert!(!s.poll(6));
        assert!(!s.poll(7));
        assert!(s.poll(7));
    }

    #[test]
    fn what_sighup_loaded_is_not_loaded_again() {
        let mut s = Settle::new(1);
        assert!(!s.poll(2));
        s.loaded(2);
        assert!(!s.poll(2));
        assert!(!s.poll(2));
        // A refused content is not retried until the file changes again.
        let mut s = Settle::new(1);
        assert!(!s.poll(9));
        assert!(s.poll(9));
        assert!(!s.poll(9));
        assert!(!s.poll(10));
        assert!(s.poll(10));
    }
}
