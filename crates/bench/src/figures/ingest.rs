//! CA ingestion: application-status updates per second over N connector
//! streams, next to a bare tonic server that only decodes and counts the
//! same messages on the same number of streams. Both rates are messages
//! sent / time until the server has handled the last of them; for the CA
//! that includes writing the status history: its clock stops when the
//! reports-received counter has every update and the stored history
//! (`/api/v1/events`) holds every transition they made (counted by
//! `/api/v1/overview`'s `version`), so a history written behind the intake
//! is inside the figure, batching lag (the CA stores every second) and all.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::{Stream, StreamExt};
use prost::Message;
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use protocol::v1::connector_session_client::ConnectorSessionClient;
use tonic::transport::Channel;

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::servers::Server;
use crate::sim::{self, Identity};
use crate::stats::{median_of, per_trial};
use crate::sys;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "ca_ingest_updates_per_s",
        unit: "updates/s",
        goal: Goal::RatioAtLeast { ratio: 0.8 },
    },
    CPU_PER_ENTRY,
];

/// The CA's CPU per report entry against the bare server's per message,
/// from the same trials (goal: within 20%).
const CPU_PER_ENTRY: Spec = Spec {
    name: "ca_cpu_us_per_entry",
    unit: "µs CPU",
    goal: Goal::RatioAtMost { ratio: 1.2 },
};

/// Server CPU per update of a trial (updates, updates/s, cores), in µs.
fn cpu_us_per_update(run: &(u64, f64, f64)) -> f64 {
    run.2 / run.1.max(f64::MIN_POSITIVE) * 1e6
}

/// Connector streams, each on its own HTTP/2 connection.
pub(crate) const STREAMS: usize = 8;
/// Applications of the `ingest` segment the reports cycle through.
pub(crate) const APPS: usize = 1000;

/// Reports (one application each) until `deadline`; counts them in `sent`.
fn reports(
    stream: usize,
    deadline: Instant,
    sent: Arc<AtomicU64>,
) -> impl Stream<Item = v1::ConnectorMessage> + Send + 'static {
    futures::stream::unfold(0usize, move |k| {
        let sent = sent.clone();
        async move {
            if Instant::now() >= deadline {
                return None;
            }
            sent.fetch_add(1, Ordering::Relaxed);
            let i = (stream * 7919 + k) % APPS;
            // Every update changes the RTT; one in 64 flips the status.
            let msg = sim::report(
                "ingest",
                &ca::ingest_host(i),
                ca::APP_PORT,
                k % 64 != 63,
                k as u64,
            );
            Some((msg, k + 1))
        }
    })
}

fn identity(i: usize) -> Identity {
    Identity {
        name: format!("ingest-{i}"),
        group: ca::GROUP.to_owned(),
        key: ca::KEY.to_owned(),
    }
}

/// Streams to the bare server; returns messages and seconds until the
/// server had counted them all.
async fn bare(server: &Server, run: Duration) -> Result<(u64, f64)> {
    let channels = sim::channels(&server.grpc_url(), STREAMS).await?;
    let sent = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let deadline = t0 + run;
    let mut tasks = Vec::new();
    for (i, ch) in channels.into_iter().enumerate() {
        let id = identity(i);
        let out = futures::stream::once(futures::future::ready(sim::hello(&id))).chain(reports(
            i,
            deadline,
            sent.clone(),
        ));
        tasks.push(tokio::spawn(async move {
            let mut client = ConnectorSessionClient::new(ch);
            let mut inbound = client.connect(out).await?.into_inner();
            match inbound.message().await? {
                Some(v1::AuthorityMessage {
                    kind: Some(Out::Ping(p)),
                }) => Ok::<u64, anyhow::Error>(p.nonce),
                other => Err(anyhow!("bare server answered {other:?}")),
            }
        }));
    }
    let mut counted = 0;
    for t in tasks {
        counted += t.await??;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    // The Hello of each stream is counted too.
    Ok((counted.saturating_sub(STREAMS as u64), elapsed))
}

/// Streams to the CA; returns updates and seconds until its
/// `reports_received` counter had them all (the `ha` group's per-replica
/// intake, where replicas share one store).
pub(crate) async fn reach(server: &Server, run: Duration) -> Result<(u64, f64)> {
    let (n, t, _) = streamed(server, run, false).await?;
    Ok((n, t))
}

/// Streams to the CA; returns updates and seconds until its
/// `reports_received` counter had them all and the status history had
/// every transition they made written (the `ingest` group's figure); the
/// transitions written are added to `written`.
async fn reach_written(server: &Server, run: Duration, written: &mut u64) -> Result<(u64, f64)> {
    let (n, t, transitions) = streamed(server, run, true).await?;
    *written += transitions;
    Ok((n, t))
}

/// The history's progress as the CA shows it: transitions taken from the
/// health table and numbered (`/api/v1/overview`'s `version`), then
/// transitions stored (`/api/v1/events`' `total`), read in that order.
async fn history_counts(http: &reqwest::Client, base: &str) -> Result<(u64, u64)> {
    let version = ca::get_json(http, base, "/api/v1/overview").await?["version"]
        .as_u64()
        .context("no version in /api/v1/overview")?;
    let stored = ca::get_json(http, base, "/api/v1/events?per_page=1").await?["total"]
        .as_u64()
        .context("no total in /api/v1/events")?;
    Ok((version, stored))
}

/// Waits until every transition the CA made so far is in its stored
/// history; returns when that was first seen. The CA's pump takes the
/// table's transitions (numbering them) every `PUMP_EVERY` and stores them
/// in batches behind: written once the stored count has caught up with the
/// numbered one (counted from `start`) and stays so, with no new number,
/// over two pump periods (so a pump that ran meanwhile found nothing left).
/// Also returns how many were stored.
async fn history_written(
    http: &reqwest::Client,
    base: &str,
    start: (u64, u64),
    limit: Duration,
) -> Result<(Instant, u64)> {
    let period = central_authority::intake::transitions::PUMP_EVERY;
    let t0 = Instant::now();
    let mut held: Option<(Instant, u64)> = None;
    loop {
        let now = Instant::now();
        let (version, stored) = history_counts(http, base).await?;
        let caught_up = stored.saturating_sub(start.1) >= version.saturating_sub(start.0);
        match held {
            Some((since, v)) if caught_up && v == version => {
                if now.duration_since(since) >= 2 * period {
                    return Ok((since, stored.saturating_sub(start.1)));
                }
            }
            _ if caught_up => held = Some((now, version)),
            _ => held = None,
        }
        if t0.elapsed() > limit {
            bail!(
                "the status history not written within {limit:?}: {} transitions numbered, {} \
                 stored",
                version.saturating_sub(start.0),
                stored.saturating_sub(start.1)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Streams for `run`; (updates, seconds, transitions written) with the
/// clock stopped at intake or, with `history`, once the history is written.
async fn streamed(server: &Server, run: Duration, history: bool) -> Result<(u64, f64, u64)> {
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http);
    let channels: Vec<Channel> = sim::channels(&server.grpc_url(), STREAMS).await?;
    let before = ca::reports_received(&http, &base).await?;
    let counts = if history {
        Some(history_counts(&http, &base).await?)
    } else {
        None
    };
    let sent = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let deadline = t0 + run;
    let mut sessions = Vec::new();
    for (i, ch) in channels.into_iter().enumerate() {
        let inbound = sim::connect(ch, &identity(i), reports(i, deadline, sent.clone())).await?;
        sessions.push(sim::drain(inbound));
    }
    tokio::time::sleep_until((deadline).into()).await;
    let total = sent.load(Ordering::Relaxed);
    ca::wait_until(
        Duration::from_secs(60),
        "the CA to handle every update",
        || {
            let (http, base) = (http.clone(), base.clone());
            async move { Ok(ca::reports_received(&http, &base).await? >= before + total) }
        },
    )
    .await?;
    let (done, transitions) = match counts {
        Some(start) => history_written(&http, &base, start, Duration::from_secs(60)).await?,
        None => (Instant::now(), 0),
    };
    let elapsed = done.duration_since(t0).as_secs_f64();
    for s in sessions {
        s.abort();
    }
    Ok((total, elapsed, transitions))
}

/// One trial against `server`: updates, updates/s and the server's CPU in
/// cores while `measure` (returning updates and seconds) ran.
async fn trial(
    server: &Server,
    measure: impl Future<Output = Result<(u64, f64)>>,
) -> Result<(u64, f64, f64)> {
    let cpu = sys::cpu_time(server.pid());
    let (n, t) = measure.await?;
    let cores = (sys::cpu_time(server.pid()) - cpu).as_secs_f64() / t;
    Ok((n, n as f64 / t, cores))
}

/// Measures both, in alternating trials (bare, CA, CA, bare, bare, CA) with both
/// servers kept running, so a change in the machine's speed during the run
/// (a shared VM) reaches both sides alike; each side's figure is the median
/// of its trials.
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let trials = mode.pick(1, 3);
    let duration = mode.pick(Duration::from_millis(500), Duration::from_secs(3));
    let size = sim::report("ingest", &ca::ingest_host(0), ca::APP_PORT, true, 1234).encoded_len();
    let bare_server = Server::spawn(&["serve-bare"]).await?;
    let ca_server = ca::start(&CaSetup {
        ingest_apps: APPS,
        ..CaSetup::default()
    })
    .await?;
    bare(&bare_server, Duration::from_millis(200)).await?;
    // Per trial: (updates, updates/s, server cores).
    let (mut bare_runs, mut reach_runs) = (Vec::new(), Vec::new());
    let mut written = 0;
    for k in 0..trials {
        // Each pair's first side alternates (bare, CA, CA, bare, …), so a
        // drift during the run does not favour the side that runs first.
        if k % 2 == 0 {
            bare_runs.push(trial(&bare_server, bare(&bare_server, duration)).await?);
            reach_runs.push(
                trial(
                    &ca_server,
                    reach_written(&ca_server, duration, &mut written),
                )
                .await?,
            );
        } else {
            reach_runs.push(
                trial(
                    &ca_server,
                    reach_written(&ca_server, duration, &mut written),
                )
                .await?,
            );
            bare_runs.push(trial(&bare_server, bare(&bare_server, duration)).await?);
        }
    }
    drop(bare_server);
    drop(ca_server);
    let pairs: Vec<_> = reach_runs.iter().zip(&bare_runs).collect();
    let total = |runs: &[(u64, f64, f64)]| runs.iter().map(|r| r.0).sum::<u64>();
    let cpu = cpu_per_entry_figure(&reach_runs, &bare_runs);
    let mut figures = vec![SPECS[0].figure(
        median_of(&reach_runs, |r| r.1),
        Some(median_of(&bare_runs, |r| r.1)),
        format!(
            "HealthReports of one application ({size} B encoded) over {STREAMS} connector \
             streams, {trials} alternating trials of {:.1} s of sending each (median; per-trial \
             ratios {}): {} handled by the CA, its clock stopped once its status history was \
             written too ({written} transitions), {} by a bare tonic ConnectorSession that decodes and counts; servers \
             in child processes, CPU in cores: CA {:.2}, bare {:.2}",
            duration.as_secs_f64(),
            per_trial(&pairs, |(r, b)| r.1 / b.1),
            total(&reach_runs),
            total(&bare_runs),
            median_of(&reach_runs, |r| r.2),
            median_of(&bare_runs, |r| r.2),
        ),
    )];
    figures.push(cpu);
    Ok(figures)
}

/// `ca_cpu_us_per_entry` from the trials `run` measured.
fn cpu_per_entry_figure(reach_runs: &[(u64, f64, f64)], bare_runs: &[(u64, f64, f64)]) -> Figure {
    let pairs: Vec<_> = reach_runs.iter().zip(bare_runs).collect();
    CPU_PER_ENTRY.figure(
        median_of(reach_runs, cpu_us_per_update),
        Some(median_of(bare_runs, cpu_us_per_update)),
        format!(
            "server process CPU (user+sys, /proc) / updates handled in the ingest trials \
             (one entry per report), CA vs bare tonic ConnectorSession; median of the trials; \
             per-trial ratios {}",
            per_trial(&pairs, |(r, b)| cpu_us_per_update(r) / cpu_us_per_update(b))
        ),
    )
}

/// (child, for profiling) The status-history writes of the `ingest` group
/// without the rest of the CA: `batches` one-second batches of `rows`
/// transitions each (the group's ~700,000 updates/s with one in 32 a
/// transition: ~22,000), shaped like its reports (8 connectors × 1,000
/// applications, each down report followed by an up one on the
/// application's next report), appended through `Store::record_events` to a
/// fresh SQLite file in `dir`; `replicas` stores on that file write each
/// batch in turn, as CA processes sharing it do (each sees every
/// transition). Prints the time each batch took. Under callgrind,
/// `--toggle-collect='*record_events*'` counts the history writes alone.
pub fn history_child(
    dir: &std::path::Path,
    batches: usize,
    rows: usize,
    replicas: usize,
) -> Result<()> {
    use central_authority::store::{EventRecord, Store, StoreLocation};
    std::fs::create_dir_all(dir)?;
    let path = dir.join("reach.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.join(format!("reach.db{suffix}")));
    }
    let stores = (0..replicas.max(1))
        .map(|_| Store::open(&StoreLocation::Sqlite(path.clone())))
        .collect::<Result<Vec<_>, _>>()?;
    let hosts: Vec<String> = (0..APPS).map(ca::ingest_host).collect();
    let connectors: Vec<String> = (0..STREAMS).map(|s| format!("ingest-{s}")).collect();
    // Per stream, its report counter; per (stream, application), down.
    let mut k = [0usize; STREAMS];
    let mut down = vec![false; STREAMS * APPS];
    let start_ms: i64 = 1_800_000_000_000;
    for batch in 0..batches {
        let mut events = Vec::with_capacity(rows);
        let mut s = 0;
        while events.len() < rows {
            let i = (s * 7919 + k[s]) % APPS;
            let up = k[s] % 64 != 63;
            k[s] += 1;
            if down[s * APPS + i] == up {
                down[s * APPS + i] = !up;
                let (from, to) = if up { ("down", "up") } else { ("up", "down") };
                let at_ms = start_ms + (batch * 1000 + events.len() * 1000 / rows) as i64;
                events.push(EventRecord {
                    at_ms,
                    segment: "ingest".to_owned(),
                    host: hosts[i].clone(),
                    protocol: "tcp".to_owned(),
                    port: i64::from(ca::APP_PORT),
                    connector: connectors[s].clone(),
                    from: from.to_owned(),
                    to: to.to_owned(),
                    cause: "report".to_owned(),
                });
            }
            s = (s + 1) % STREAMS;
        }
        for (r, store) in stores.iter().enumerate() {
            let mut copy = events.clone();
            // Another replica saw each transition a little later.
            for e in &mut copy {
                e.at_ms += r as i64 * 7;
            }
            let t = Instant::now();
            store.record_events(&copy)?;
            println!(
                "batch {batch} replica {r}: {} rows in {:.1} ms",
                copy.len(),
                t.elapsed().as_secs_f64() * 1e3
            );
        }
    }
    Ok(())
}
