//! A client asking CA replicas for access decisions (`POST
//! /api/v1/access` for the `web` application) round-robin at a steady
//! rate, open loop (one task per request, so a slow answer does not slow
//! the rate), sorting the answers: a connector selected; no connector to
//! select (503 `no_connector`, `no_health_report` or `discovery_timeout`:
//! nobody attached, or nobody has reported yet); or a failure (any other
//! status, a transport error, a timeout), kept with its error.
//!
//! The client runs on a thread and runtime of its own: the driver's runtime
//! also carries thousands of simulated sessions, and a reconnect storm
//! there must not delay the client's requests or its reading of the
//! answers (a timeout is then the CA's, or the machine's). Beside the
//! client's view, [`slow_at`] reads how many decisions a replica itself
//! took over a second and a half, which tells a request that waited inside
//! the CA's decision from one that waited before it (to be accepted, read
//! or scheduled).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use tokio::sync::{oneshot, watch};

use super::ca::{self, metric_in};

/// Reasons that mean no connector could be chosen because none is there
/// (or none has reported yet), not that the CA failed.
pub const NO_CONNECTOR: &[&str] = &["no_connector", "no_health_report", "discovery_timeout"];
/// How many failures are kept with their error.
const KEPT: usize = 5;

/// The answers so far.
#[derive(Debug, Default)]
pub struct Tally {
    /// A connector selected.
    pub ok: AtomicU64,
    /// No connector to select.
    pub no_connector: AtomicU64,
    /// Failed.
    pub failed: AtomicU64,
    /// The first failures, with their errors.
    pub errors: Mutex<Vec<String>>,
}

impl Tally {
    /// `(ok, no connector, failed)`.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.ok.load(Ordering::Relaxed),
            self.no_connector.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    /// The kept failures, joined.
    pub fn errors(&self) -> String {
        self.errors.lock().map(|e| e.join("; ")).unwrap_or_default()
    }

    fn fail(&self, what: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut e) = self.errors.lock()
            && e.len() < KEPT
        {
            e.push(what);
        }
    }
}

/// The running client.
#[derive(Debug)]
pub struct Client {
    /// Its answers.
    pub tally: Arc<Tally>,
    stop: watch::Sender<bool>,
    done: oneshot::Receiver<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Client {
    /// Starts asking `bases` (`http://ADDR` of each replica) round-robin,
    /// `rate` decisions a second in all, from a thread of its own.
    pub fn start(bases: Vec<String>, rate: f64) -> Result<Client> {
        // A connection not made within 4 s fails as a connect error, told
        // apart from an answer that did not come.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(4))
            .timeout(Duration::from_secs(5))
            .build()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("the decision client's runtime")?;
        let tally = Arc::new(Tally::default());
        let (stop, stopped) = watch::channel(false);
        let (done_tx, done) = oneshot::channel();
        let t = tally.clone();
        let thread = std::thread::Builder::new()
            .name("decisions".into())
            .spawn(move || {
                runtime.block_on(ask_until_stopped(http, bases, rate, t, stopped));
                let _ = done_tx.send(());
            })
            .context("the decision client's thread")?;
        Ok(Client {
            tally,
            stop,
            done,
            thread,
        })
    }

    /// Stops asking and waits for the answers still due.
    pub async fn stop(self) -> Result<Arc<Tally>> {
        self.stop.send_replace(true);
        self.done
            .await
            .map_err(|_| anyhow!("the decision client's thread ended early"))?;
        self.thread
            .join()
            .map_err(|_| anyhow!("the decision client's thread panicked"))?;
        Ok(self.tally)
    }
}

/// The client's loop: one request task per tick until `stopped`, then
/// every answer still due.
async fn ask_until_stopped(
    http: reqwest::Client,
    bases: Vec<String>,
    rate: f64,
    tally: Arc<Tally>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent = Vec::new();
    for k in 0usize.. {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped.wait_for(|s| *s) => break,
        }
        let (http, tally) = (http.clone(), tally.clone());
        let base = bases[k % bases.len()].clone();
        sent.push(tokio::spawn(async move { ask(&http, &base, &tally).await }));
    }
    for request in sent {
        let _ = request.await;
    }
}

/// How many decisions `base` has taken over 1.6 s itself so far (its
/// `reach_ca_decision_duration_seconds` histogram: the count less the
/// bucket nearest above 1 s), and how many in all.
pub async fn slow_at(http: &reqwest::Client, base: &str) -> Result<(u64, u64)> {
    const NAME: &str = "reach_ca_decision_duration_seconds";
    let text = ca::metrics_text(http, base).await?;
    let mut buckets: Vec<(f64, u64)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(NAME)?.strip_prefix("_bucket{le=\"")?;
            let (le, v) = rest.split_once("\"} ")?;
            Some((
                le.parse::<f64>().ok()?,
                v.trim().parse::<f64>().ok()? as u64,
            ))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let all = metric_in(&text, &format!("{NAME}_count"))
        .ok_or_else(|| anyhow!("no {NAME}_count in {base}/metrics"))?;
    let fast = buckets
        .iter()
        .find(|(le, _)| *le >= 1.0)
        .map(|(_, v)| *v)
        .ok_or_else(|| anyhow!("no {NAME} bucket at or above 1 s in {base}/metrics"))?;
    Ok((all.saturating_sub(fast), all))
}

/// One decision from `base`, sorted into `tally`.
async fn ask(http: &reqwest::Client, base: &str, tally: &Tally) {
    let t = Instant::now();
    let sent = http
        .post(format!("{base}/api/v1/access"))
        .bearer_auth(ca::TOKEN)
        .json(&serde_json::json!({"host": ca::APP_HOST, "protocol": "tcp", "port": ca::APP_PORT}))
        .send()
        .await;
    let response = match sent {
        Ok(r) => r,
        Err(e) => {
            tally.fail(format!(
                "{base} after {:.1} s: {}",
                t.elapsed().as_secs_f64(),
                connector_agent::retry::error_chain(&e)
            ));
            return;
        }
    };
    let status = response.status();
    if status.is_success() {
        tally.ok.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    let reason = body["error"]["reason"].as_str().unwrap_or("");
    if status == reqwest::StatusCode::SERVICE_UNAVAILABLE && NO_CONNECTOR.contains(&reason) {
        tally.no_connector.fetch_add(1, Ordering::Relaxed);
    } else {
        tally.fail(format!(
            "{base}: {status} {reason}: {}",
            body["error"]["message"].as_str().unwrap_or("")
        ));
    }
}
