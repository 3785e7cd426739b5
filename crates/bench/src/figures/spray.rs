//! Hardening: valid `POST /api/v1/access` requests from a clean source
//! address while 300 other loopback addresses (127.0.1.0 – 127.0.2.43,
//! bound before connecting) spray bad tokens at ~60 requests/s in total,
//! against the same requests with no spray, in alternating trials of one
//! run. The CA keeps its default limits here (unlike the other groups): the
//! guessing throttle is what is measured, and a valid token must never be
//! throttled.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::stats::{median_of, ms, per_trial, quantile};

/// The figures.
pub const SPECS: &[Spec] = &[Spec {
    name: "spray_access_p99_ms",
    unit: "ms",
    goal: Goal::RatioAtMost { ratio: 1.5 },
}];

/// Spraying source addresses.
const SPRAYERS: u16 = 300;
/// Bad-token requests per second, all sprayers together.
const SPRAY_RATE: f64 = 60.0;
/// The clean source address of the valid requests.
const CLEAN: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));

fn sprayer(i: u16) -> IpAddr {
    let [hi, lo] = (256 + i).to_be_bytes();
    IpAddr::V4(Ipv4Addr::new(127, 0, hi, lo))
}

/// The benchmark configuration with the `[limits]` table the other groups
/// use to lift the CA's limits taken out, so every limit is the default.
fn default_limits(text: &str) -> Result<String> {
    let start = text
        .find("[limits]")
        .ok_or_else(|| anyhow!("no [limits] table in the benchmark configuration"))?;
    let end = text[start..]
        .find("[[api_tokens]]")
        .ok_or_else(|| anyhow!("no [[api_tokens]] after [limits]"))?;
    Ok(format!("{}{}", &text[..start], &text[start + end..]))
}

/// One trial's valid requests: sorted latencies and the refusals.
struct Trial {
    lat: Vec<Duration>,
    refused: Vec<String>,
}

/// What the spray got back, by status.
#[derive(Default)]
struct Answers {
    unauthorized: u64,
    throttled: u64,
    other: u64,
    failed: u64,
}

/// A client whose connections come from `from` (bound before connecting).
fn client_from(from: IpAddr) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .local_address(from)
        .no_proxy()
        // Plain HTTP: no roots to load (300 clients).
        .tls_certs_only(Vec::new())
        .timeout(Duration::from_secs(10))
        .build()
}

/// Sends one bad token from `client`; its status, `None` if it failed.
async fn bad_token(client: &reqwest::Client, url: &str, n: usize) -> Option<u16> {
    let request = client
        .post(url)
        .bearer_auth(format!("spray-{n}-0123456789abcdef"))
        .json(&access_body());
    request.send().await.map(|r| r.status().as_u16()).ok()
}

impl Answers {
    fn add(&mut self, status: Option<u16>) {
        match status {
            Some(401) => self.unauthorized += 1,
            Some(429) => self.throttled += 1,
            Some(_) => self.other += 1,
            None => self.failed += 1,
        }
    }

    fn total(&self) -> u64 {
        self.unauthorized + self.throttled + self.other + self.failed
    }
}

/// Takes every sprayer past its own allowance of failures (and the CA past
/// its global one) at once, as a guesser would: 12 bad tokens each.
async fn prime(clients: &Arc<Vec<reqwest::Client>>, url: &str) -> Result<Answers> {
    let mut tasks = Vec::new();
    for i in 0..clients.len() {
        let (clients, url) = (clients.clone(), url.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for n in 0..12 {
                statuses.push(bad_token(&clients[i], &url, i * 100 + n).await);
            }
            statuses
        }));
    }
    let mut answers = Answers::default();
    for t in tasks {
        for status in t.await? {
            answers.add(status);
        }
    }
    Ok(answers)
}

/// Sends bad tokens round robin from the sprayers at `SPRAY_RATE` while
/// `on`, until `stop`; returns what they were answered.
fn spray(
    clients: Arc<Vec<reqwest::Client>>,
    url: String,
    on: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Answers> {
    tokio::spawn(async move {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / SPRAY_RATE));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n = 0usize;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            if !on.load(Ordering::Relaxed) {
                continue;
            }
            let (clients, url, tx) = (clients.clone(), url.clone(), tx.clone());
            n += 1;
            tokio::spawn(async move {
                let status = bad_token(&clients[n % clients.len()], &url, 100_000 + n).await;
                let _ = tx.send(status);
            });
        }
        drop(tx);
        let mut answers = Answers::default();
        while let Some(status) = rx.recv().await {
            answers.add(status);
        }
        answers
    })
}

fn access_body() -> serde_json::Value {
    serde_json::json!({"host": ca::APP_HOST, "protocol": "tcp", "port": ca::APP_PORT})
}

/// Valid requests from `CLEAN`, released evenly at `rate`/s for `run`,
/// each in its own task (an open loop).
async fn valid(client: &reqwest::Client, base: &str, rate: f64, run: Duration) -> Trial {
    let url = format!("{base}/api/v1/access");
    let total = (rate * run.as_secs_f64()) as u64;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let t0 = tokio::time::Instant::now();
    for i in 0..total {
        tokio::time::sleep_until(t0 + Duration::from_secs_f64(i as f64 / rate)).await;
        let request = client
            .post(&url)
            .bearer_auth(ca::TOKEN)
            .json(&access_body());
        let tx = tx.clone();
        tokio::spawn(async move {
            let sent = Instant::now();
            let answer = match request.send().await {
                Ok(r) if r.status().is_success() => {
                    r.bytes().await.map(|_| ()).map_err(|e| e.to_string())
                }
                Ok(r) => {
                    let status = r.status();
                    let body = r.text().await.unwrap_or_default();
                    Err(format!(
                        "{status}: {}",
                        body.chars().take(160).collect::<String>()
                    ))
                }
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(answer.map(|()| sent.elapsed()));
        });
    }
    drop(tx);
    let mut trial = Trial {
        lat: Vec::new(),
        refused: Vec::new(),
    };
    while let Some(answer) = rx.recv().await {
        match answer {
            Ok(l) => trial.lat.push(l),
            Err(e) => trial.refused.push(e),
        }
    }
    trial.lat.sort();
    trial
}

/// Measures (quick: one pair of 1 s trials; full: five pairs of 3 s).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let text = default_limits(&ca::config_text(&CaSetup {
        ingest_apps: 0,
        ..CaSetup::default()
    }))?;
    let (server, _dir) = ca::start_text(&text).await?;
    let sims = super::access::connectors(&server).await?;
    let base = format!("http://{}", server.http);
    let client = client_from(CLEAN)?;
    ca::wait_until(Duration::from_secs(10), "a selectable connector", || {
        let request = client
            .post(format!("{base}/api/v1/access"))
            .bearer_auth(ca::TOKEN)
            .json(&access_body());
        async move { Ok(request.send().await?.status().is_success()) }
    })
    .await?;
    let (on, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let clients = Arc::new(
        (0..SPRAYERS)
            .map(|i| client_from(sprayer(i)))
            .collect::<Result<Vec<_>, _>>()?,
    );
    let url = format!("{base}/api/v1/access");
    let primed = prime(&clients, &url).await?;
    let sprayers = spray(clients, url, on.clone(), stop.clone());
    let rate = mode.pick(100.0, 200.0);
    let length = mode.pick(Duration::from_secs(1), Duration::from_secs(3));
    // Warm both sides' connections and the spray's throttle state.
    valid(&client, &base, rate, Duration::from_millis(300)).await;
    on.store(true, Ordering::Relaxed);
    tokio::time::sleep(mode.pick(Duration::from_millis(500), Duration::from_secs(2))).await;
    let (mut sprayed, mut quiet) = (Vec::new(), Vec::new());
    for _ in 0..mode.pick(1, 5) {
        on.store(false, Ordering::Relaxed);
        quiet.push(valid(&client, &base, rate, length).await);
        on.store(true, Ordering::Relaxed);
        sprayed.push(valid(&client, &base, rate, length).await);
    }
    stop.store(true, Ordering::Relaxed);
    let answers = sprayers.await?;
    for t in sims {
        t.abort();
    }
    drop(server);
    figure(&sprayed, &quiet, [&primed, &answers], rate, length)
}

fn figure(
    sprayed: &[Trial],
    quiet: &[Trial],
    [primed, answers]: [&Answers; 2],
    rate: f64,
    length: Duration,
) -> Result<Vec<Figure>> {
    let refused: Vec<&String> = sprayed
        .iter()
        .chain(quiet)
        .flat_map(|t| &t.refused)
        .collect();
    if !refused.is_empty() {
        let first: Vec<&str> = refused.iter().take(3).map(|s| s.as_str()).collect();
        return Ok(vec![SPECS[0].missing(format!(
            "{} valid request(s) refused under the spray; first: {}",
            refused.len(),
            first.join(" | ")
        ))]);
    }
    if answers.throttled == 0 {
        return Ok(vec![SPECS[0].missing(format!(
            "the spray was never throttled ({} answered 401, {} other, {} failed; before \
             it, {} of {} answered 429)",
            answers.unauthorized,
            answers.other,
            answers.failed,
            primed.throttled,
            primed.total()
        ))]);
    }
    let p99 = |t: &Trial| ms(quantile(&t.lat, 0.99));
    Ok(vec![SPECS[0].figure(
        median_of(sprayed, p99),
        Some(median_of(quiet, p99)),
        format!(
            "POST /api/v1/access from a clean address at {rate:.0}/s (open loop, 4 connectors \
             report the application Up), {} alternating trials of {:.0} s each (median; sprayed \
             {}, quiet {}); baseline = no spray; refused valid requests: 0; spray: {} bad tokens \
             from {SPRAYERS} addresses at {SPRAY_RATE:.0}/s, answered 401 {} / 429 {} / other {} \
             / failed {}, after 12 from each at once ({} answered 429); default limits",
            sprayed.len(),
            length.as_secs_f64(),
            per_trial(sprayed, p99),
            per_trial(quiet, p99),
            answers.total(),
            answers.unauthorized,
            answers.throttled,
            answers.other,
            answers.failed,
            primed.throttled,
        ),
    )])
}
