//! A client asking CA replicas for access decisions (`POST
//! /api/v1/access` for the `web` application) round-robin at a steady
//! rate, open loop (one task per request, so a slow answer does not slow
//! the rate), sorting the answers: a connector selected; no connector to
//! select (503 `no_connector`, `no_health_report` or `discovery_timeout`:
//! nobody attached, or nobody has reported yet); or a failure (any other
//! status, a transport error, a timeout), kept with its error.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use tokio::sync::watch;

use super::ca;

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
    task: tokio::task::JoinHandle<Vec<tokio::task::JoinHandle<()>>>,
}

impl Client {
    /// Starts asking `bases` (`http://ADDR` of each replica) round-robin,
    /// `rate` decisions a second in all.
    pub fn start(bases: Vec<String>, rate: f64) -> Result<Client> {
        // A connection not made within 4 s fails as a connect error, told
        // apart from an answer that did not come.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(4))
            .timeout(Duration::from_secs(5))
            .build()?;
        let tally = Arc::new(Tally::default());
        let (stop, mut stopped) = watch::channel(false);
        let t = tally.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut sent = Vec::new();
            for k in 0usize.. {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.wait_for(|s| *s) => break,
                }
                let (http, tally) = (http.clone(), t.clone());
                let base = bases[k % bases.len()].clone();
                sent.push(tokio::spawn(async move { ask(&http, &base, &tally).await }));
            }
            sent
        });
        Ok(Client { tally, stop, task })
    }

    /// Stops asking and waits for the answers still due.
    pub async fn stop(self) -> Result<Arc<Tally>> {
        self.stop.send_replace(true);
        for request in self.task.await? {
            request.await?;
        }
        Ok(self.tally)
    }
}

/// One decision from `base`, sorted into `tally`.
async fn ask(http: &reqwest::Client, base: &str, tally: &Tally) {
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
                "{base}: {}",
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
