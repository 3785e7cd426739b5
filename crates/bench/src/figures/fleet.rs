//! Simulated connectors attached to every CA replica as `connector-agent`
//! attaches (`connector_agent::session::attach`): one session per replica, each
//! reconnecting on its own after it ends, with full-jitter backoff held to
//! `connector_agent::retry::REPLICA_BACKOFF_MAX`. A session sends `Hello`,
//! one report of the `web` application Up, then heartbeats (spread over
//! the interval, like `scale`). Sessions to a replica share HTTP/2
//! connections, 50 per connection. The driver can replace one replica's
//! connections (it restarted on new ports) or drop and replace every
//! connection at once (a network blip that resets them all); the fleet
//! counts, per replica, attempts per second, refused sessions and live
//! sessions.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use connector_agent::retry::{REPLICA_BACKOFF_MAX, backoff_within};
use futures::{Stream, StreamExt};
use protocol::v1;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

use super::ca;
use crate::sim::{self, Identity};

/// Sessions per HTTP/2 connection (the CA allows 64 streams per connection).
pub const PER_CHANNEL: usize = 50;
/// Attempt counters: one per second since counting started.
const SECONDS: usize = 180;

/// The fleet's shared state.
#[derive(Debug)]
pub struct Fleet {
    /// Connectors (each with one session per replica).
    pub n: usize,
    channels: Vec<watch::Sender<Arc<Vec<Channel>>>>,
    /// Attempts are counted (and failures are refusals) from then.
    epoch: watch::Sender<Option<Instant>>,
    /// Bumped to drop every session and connection (a network blip).
    blip: watch::Sender<u64>,
    stop: watch::Sender<bool>,
    attempts: Vec<Vec<AtomicU64>>,
    refused: Vec<AtomicU64>,
    live: Vec<AtomicUsize>,
    /// Sessions that ended after their `Welcome`, not by the driver.
    lost: AtomicU64,
    /// Why the first of them ended.
    lost_why: std::sync::Mutex<Vec<String>>,
    /// The marker of the last heartbeat each session sent.
    sent: Vec<Vec<AtomicU32>>,
    heartbeat: Duration,
}

/// The running fleet; its sessions end when it is dropped.
#[derive(Debug)]
pub struct Attached {
    /// Its state.
    pub fleet: Arc<Fleet>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.fleet.stop.send_replace(true);
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Connections (opened on first use) to `url` for `n` sessions.
fn lazy_channels(url: &str, n: usize) -> Result<Arc<Vec<Channel>>> {
    let mut out = Vec::new();
    for _ in 0..n.div_ceil(PER_CHANNEL) {
        out.push(
            Endpoint::from_shared(url.to_owned())?
                .tcp_nodelay(true)
                .connect_lazy(),
        );
    }
    Ok(Arc::new(out))
}

/// Starts `n` connectors attached to every replica at `urls` (gRPC).
pub fn attach(urls: &[String], n: usize, heartbeat: Duration) -> Result<Attached> {
    let mut channels = Vec::new();
    for url in urls {
        channels.push(watch::channel(lazy_channels(url, n)?).0);
    }
    let counters = |k: usize| (0..k).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
    let fleet = Arc::new(Fleet {
        n,
        channels,
        epoch: watch::channel(None).0,
        blip: watch::channel(0).0,
        stop: watch::channel(false).0,
        attempts: urls.iter().map(|_| counters(SECONDS)).collect(),
        refused: counters(urls.len()),
        live: urls.iter().map(|_| AtomicUsize::new(0)).collect(),
        lost: AtomicU64::new(0),
        lost_why: std::sync::Mutex::new(Vec::new()),
        sent: urls
            .iter()
            .map(|_| (0..n).map(|_| AtomicU32::new(0)).collect())
            .collect(),
        heartbeat,
    });
    let mut tasks = Vec::with_capacity(n * urls.len());
    for i in 0..n {
        for r in 0..urls.len() {
            tasks.push(tokio::spawn(session(fleet.clone(), i, r)));
        }
    }
    Ok(Attached { fleet, tasks })
}

impl Fleet {
    /// Replicas.
    pub fn replicas(&self) -> usize {
        self.live.len()
    }

    /// Live sessions at replica `r`.
    pub fn live(&self, r: usize) -> usize {
        self.live[r].load(Ordering::Relaxed)
    }

    /// Whether every connector has a session at every replica.
    pub fn all_whole(&self) -> bool {
        (0..self.replicas()).all(|r| self.live(r) == self.n)
    }

    /// Replica `r` now listens at `url`: new connections for its sessions.
    pub fn replace(&self, r: usize, url: &str) -> Result<()> {
        self.channels[r].send_replace(lazy_channels(url, self.n)?);
        Ok(())
    }

    /// A network blip: every session and connection dropped at once and
    /// replaced by new ones to the same `urls`.
    pub fn blip(&self, urls: &[String]) -> Result<()> {
        for (r, url) in urls.iter().enumerate() {
            self.replace(r, url)?;
        }
        self.blip.send_modify(|k| *k += 1);
        Ok(())
    }

    /// Counts attempts and refusals from `from` on (the counts so far are
    /// cleared); `None` stops counting.
    pub fn count_from(&self, from: Option<Instant>) {
        for a in self.attempts.iter().flatten().chain(&self.refused) {
            a.store(0, Ordering::Relaxed);
        }
        self.epoch.send_replace(from);
    }

    /// The busiest second's attempts summed over `replicas`, and all of
    /// their attempts, since counting started.
    pub fn attempts(&self, replicas: &[usize]) -> (u64, u64) {
        let per_second = (0..SECONDS).map(|s| {
            replicas
                .iter()
                .map(|&r| self.attempts[r][s].load(Ordering::Relaxed))
                .sum::<u64>()
        });
        let all: Vec<u64> = per_second.collect();
        (all.iter().copied().max().unwrap_or(0), all.iter().sum())
    }

    /// Sessions `replicas` refused since counting started.
    pub fn refused(&self, replicas: &[usize]) -> u64 {
        replicas
            .iter()
            .map(|&r| self.refused[r].load(Ordering::Relaxed))
            .sum()
    }

    /// Sessions that ended after their `Welcome` without the driver
    /// ending them, and why the first few did.
    pub fn lost(&self) -> String {
        let why = self
            .lost_why
            .lock()
            .map(|w| w.join("; "))
            .unwrap_or_default();
        format!(
            "{} sessions ended after their Welcome (first: {})",
            self.lost.load(Ordering::Relaxed),
            if why.is_empty() { "none" } else { &why }
        )
    }

    fn lose(&self, why: String) {
        self.lost.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut w) = self.lost_why.lock()
            && w.len() < 3
        {
            w.push(why);
        }
    }

    /// The marker of the last heartbeat each session to replica `r` sent.
    pub fn sent(&self, r: usize) -> Vec<u32> {
        self.sent[r]
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect()
    }

    /// Resolves when the sessions should end: a blip or the fleet stopped.
    fn ended(&self) -> impl Future<Output = ()> + Send + 'static {
        let (mut blip, mut stop) = (self.blip.subscribe(), self.stop.subscribe());
        async move {
            tokio::select! {
                _ = blip.changed() => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        }
    }

    /// What session (`r`, `i`) sends after `Hello`: the `web` application
    /// Up, then heartbeats until the session ends.
    fn outbound(
        self: &Arc<Self>,
        r: usize,
        i: usize,
    ) -> impl Stream<Item = v1::ConnectorMessage> + Send + 'static {
        let fleet = self.clone();
        let every = self.heartbeat;
        let phase = every.mul_f64(i as f64 / self.n.max(1) as f64);
        let report = sim::report("web", ca::APP_HOST, ca::APP_PORT, true, 1000);
        let beats = futures::stream::unfold(1u32, move |k| {
            let fleet = fleet.clone();
            async move {
                let wait = if k == 1 { every + phase } else { every };
                tokio::time::sleep(wait).await;
                fleet.sent[r][i].store(k, Ordering::Relaxed);
                Some((sim::heartbeat(k), k + 1))
            }
        });
        futures::stream::once(futures::future::ready(report))
            .chain(beats)
            .take_until(self.ended())
    }
}

/// Connector `i`'s session with replica `r`, reopened with backoff after
/// it ends, until the fleet stops.
async fn session(fleet: Arc<Fleet>, i: usize, r: usize) {
    let id = Identity {
        name: format!("sim-{i:05}"),
        group: ca::GROUP.to_owned(),
        key: ca::KEY.to_owned(),
    };
    let mut stop = fleet.stop.subscribe();
    let mut attempt = 0u32;
    while !*stop.borrow() {
        // The epoch first: once it is set, the channels are the ones to
        // count (they are replaced before it is set).
        let epoch = *fleet.epoch.borrow();
        let channel = fleet.channels[r].borrow()[i / PER_CHANNEL].clone();
        if let Some(t) = epoch {
            let s = (t.elapsed().as_secs() as usize).min(SECONDS - 1);
            fleet.attempts[r][s].fetch_add(1, Ordering::Relaxed);
        }
        let ended = fleet.ended();
        let opened = tokio::select! {
            o = sim::connect(channel, &id, fleet.outbound(r, i)) => Some(o),
            () = fleet.ended() => None,
        };
        match opened {
            Some(Ok(mut inbound)) => {
                attempt = 0;
                fleet.live[r].fetch_add(1, Ordering::Relaxed);
                let lost = async {
                    loop {
                        match inbound.message().await {
                            Ok(Some(_)) => {}
                            Ok(None) => {
                                break format!("replica {}: the CA ended the stream", r + 1);
                            }
                            Err(s) => break format!("replica {}: {s}", r + 1),
                        }
                    }
                };
                tokio::select! {
                    why = lost => fleet.lose(why),
                    () = ended => {}
                }
                fleet.live[r].fetch_sub(1, Ordering::Relaxed);
            }
            Some(Err(_)) if epoch.is_some() => {
                fleet.refused[r].fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        let wait = backoff_within(attempt, REPLICA_BACKOFF_MAX, &mut rand::rng());
        attempt = attempt.saturating_add(1);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }
}
