//! CA ingestion: application-status updates per second over N connector
//! streams, next to a bare tonic server that only decodes and counts the
//! same messages on the same number of streams. Both rates are messages
//! sent / time until the server has handled the last of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
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
use crate::stats::median;
use crate::sys;

/// The figures.
pub const SPECS: &[Spec] = &[Spec {
    name: "ca_ingest_updates_per_s",
    unit: "updates/s",
    goal: Goal::RatioAtLeast { ratio: 0.5 },
}];

/// Connector streams, each on its own HTTP/2 connection.
const STREAMS: usize = 8;
const APPS: usize = 1000;

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
/// `reports_received` counter had them all.
async fn reach(server: &Server, run: Duration) -> Result<(u64, f64)> {
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http);
    let channels: Vec<Channel> = sim::channels(&server.grpc_url(), STREAMS).await?;
    let before = ca::reports_received(&http, &base).await?;
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
    let elapsed = t0.elapsed().as_secs_f64();
    for s in sessions {
        s.abort();
    }
    Ok((total, elapsed))
}

/// Measures both, in alternating trials (bare, CA, bare, CA, …) with both
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
    let (mut bare_rates, mut reach_rates) = (Vec::new(), Vec::new());
    let (mut bare_cores, mut reach_cores) = (Vec::new(), Vec::new());
    let (mut bare_n, mut reach_n) = (0, 0);
    for _ in 0..trials {
        let cpu = sys::cpu_time(bare_server.pid());
        let (n, t) = bare(&bare_server, duration).await?;
        bare_cores.push((sys::cpu_time(bare_server.pid()) - cpu).as_secs_f64() / t);
        bare_rates.push(n as f64 / t);
        bare_n += n;
        let cpu = sys::cpu_time(ca_server.pid());
        let (n, t) = reach(&ca_server, duration).await?;
        reach_cores.push((sys::cpu_time(ca_server.pid()) - cpu).as_secs_f64() / t);
        reach_rates.push(n as f64 / t);
        reach_n += n;
    }
    drop(bare_server);
    drop(ca_server);
    let ratios: Vec<String> = reach_rates
        .iter()
        .zip(&bare_rates)
        .map(|(r, b)| format!("{:.2}", r / b))
        .collect();
    Ok(vec![SPECS[0].figure(
        median(&reach_rates),
        Some(median(&bare_rates)),
        format!(
            "HealthReports of one application ({size} B encoded) over {STREAMS} connector \
             streams, {trials} alternating trials of {:.0} s each (median; per-trial ratios \
             {}): {reach_n} handled by the CA, {bare_n} by a bare tonic ConnectorSession that \
             decodes and counts; servers in child processes, CPU in cores: CA {:.2}, bare {:.2}",
            duration.as_secs_f64(),
            ratios.join(", "),
            median(&reach_cores),
            median(&bare_cores),
        ),
    )])
}
