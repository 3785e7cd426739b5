//! Attaching to every CA replica: the connector holds one session per
//! address the `--ca` names resolve to (see [`crate::ca::dial`] for how a
//! replica is found and verified). The names are resolved again every
//! `--ca-resolve-interval-s` and after any lost session: sessions open to
//! new addresses and close to addresses that went away; while a name does
//! not resolve, its sessions stay as they are.
//!
//! The sessions share one scheduler and one pacer (see [`crate::session::stream`]):
//! more replicas mean more reports sent, never more checks.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::ca::dial::{CaTarget, CaUrl, Dialer};
use crate::retry::{REPLICA_BACKOFF_MAX, stopped};
use crate::session::options::{Parts, SessionOptions};
use crate::session::stream;

/// Default of `--ca-resolve-interval-s`.
pub const DEFAULT_RESOLVE_INTERVAL: Duration = Duration::from_secs(30);
/// While no address is known at all, resolve again this soon.
const RETRY_EMPTY: Duration = Duration::from_secs(2);
/// Re-resolutions after lost sessions are at least this far apart.
const MIN_RERESOLVE: Duration = Duration::from_secs(1);

/// A running session with one replica.
struct Attached {
    target: CaTarget,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// Holds one session per replica address until `shutdown` turns true.
pub async fn run(
    dialer: Dialer,
    interval: Duration,
    options: SessionOptions,
    parts: Parts,
    mut shutdown: watch::Receiver<bool>,
) {
    let lost = Arc::new(Notify::new());
    let mut attached: BTreeMap<SocketAddr, Attached> = BTreeMap::new();
    loop {
        let (targets, failed) = dialer.resolve().await;
        for (url, reason) in &failed {
            tracing::warn!(ca = %url.as_str(), %reason, "cannot resolve the CA's name; its sessions stay as they are");
        }
        reconcile(&mut attached, targets, &failed, &options, &parts, &lost);
        parts.metrics.ca_addresses.set(attached.len() as i64);
        let wait = if attached.is_empty() {
            RETRY_EMPTY.min(interval)
        } else {
            interval
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = lost.notified() => {
                // Not faster than this, however many sessions fail.
                tokio::select! {
                    () = tokio::time::sleep(MIN_RERESOLVE) => {}
                    () = stopped(&mut shutdown) => break,
                }
            }
            () = stopped(&mut shutdown) => break,
        }
    }
    for a in attached.values() {
        let _ = a.stop.send(true);
    }
    for (_, a) in attached {
        let mut task = a.task;
        if tokio::time::timeout(Duration::from_secs(2), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
    }
}

/// Opens sessions to new addresses and stops those to addresses no longer
/// resolved (except those of URLs whose name failed to resolve this time).
fn reconcile(
    attached: &mut BTreeMap<SocketAddr, Attached>,
    targets: Vec<CaTarget>,
    failed: &[(CaUrl, String)],
    options: &SessionOptions,
    parts: &Parts,
    lost: &Arc<Notify>,
) {
    let wanted: BTreeMap<SocketAddr, CaTarget> = targets
        .into_iter()
        .filter_map(|t| t.addr.map(|a| (a, t)))
        .collect();
    attached.retain(|addr, a| {
        let keep = wanted.contains_key(addr) || failed.iter().any(|(u, _)| *u == a.target.url);
        if !keep {
            tracing::info!(ca = %a.target.label(), "the CA name no longer resolves to this replica: closing its session");
            let _ = a.stop.send(true);
        }
        keep
    });
    let several = wanted.len() > 1;
    for (addr, target) in wanted {
        if attached.contains_key(&addr) {
            continue;
        }
        let mut options = options.clone();
        if several {
            options.reconnect_max = REPLICA_BACKOFF_MAX;
        }
        tracing::info!(ca = %target.label(), "attaching to a CA replica");
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(stream::run(
            target.clone(),
            options,
            parts.clone(),
            stop_rx,
            lost.clone(),
        ));
        attached.insert(addr, Attached { target, stop, task });
    }
}
