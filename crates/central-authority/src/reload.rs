//! Configuration reload: on SIGHUP and when the file changes (its mtime or
//! content hash, polled every `reload_poll_ms`). A valid new config is
//! applied at once; an invalid one is refused with every error logged and
//! the running policy stays.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use crate::authority::Authority;
use crate::config::Config;
use crate::metrics::Metrics;

/// The hash of the file's current content, if it can be read.
async fn current_hash(path: &Path) -> Option<u64> {
    tokio::fs::read(path)
        .await
        .ok()
        .map(|b| crate::config::content_hash(&b))
}

/// Reloads `path` now; returns whether the new config was applied.
pub fn reload(authority: &Authority, path: &Path, trigger: &str) -> bool {
    match Config::load(path) {
        Ok(config) => {
            let segments = config.policy.segments.len();
            authority.apply(config);
            Metrics::count(&authority.metrics().reloads, "applied");
            tracing::info!(trigger, path = %path.display(), segments, "configuration reloaded");
            true
        }
        Err(e) => {
            Metrics::count(&authority.metrics().reloads, "rejected");
            for message in e.messages() {
                tracing::error!(trigger, path = %path.display(), "{message}");
            }
            tracing::error!(
                trigger,
                "configuration reload refused; the running policy stays"
            );
            false
        }
    }
}

/// Watches for SIGHUP and file changes until `stop` turns true. The file's
/// content hash is compared every `reload_poll_ms` (reading a config file
/// once a second is cheaper than trusting coarse mtimes), starting from the
/// hash of the text the running config was loaded from.
pub async fn watch_config(
    authority: Arc<Authority>,
    path: PathBuf,
    mut stop: watch::Receiver<bool>,
) {
    let mut stopped = std::pin::pin!(async move {
        let _ = stop.wait_for(|s| *s).await;
    });
    let poll = authority.snapshot().settings().reload_poll;
    let mut last = Some(authority.snapshot().config.content_hash);
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
                last = current_hash(&path).await;
                reload(&authority, &path, "SIGHUP");
            }
            _ = tick.tick() => {
                let now = current_hash(&path).await;
                if now.is_some() && now != last {
                    last = now;
                    reload(&authority, &path, "file change");
                }
            }
        }
    }
}
