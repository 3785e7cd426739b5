//! Report throughput under batching: the entries per second one connector
//! session delivers to the CA when each `HealthReport` carries N entries
//! (N = 1, 50, 500, 2,000, the connector's `max_report_entries`), against a
//! bare tonic `ConnectorSession` that decodes and counts the same entries
//! sent one per message on one connection. The CA's per-session message and
//! entry limits are lifted (as in `ingest`), so the figure is the intake's
//! own cost per entry; its rate-limit and flow-control counters are read
//! before and after and given in the note (the first must stay 0).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use futures::{Stream, StreamExt};
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use protocol::v1::connector_message::Kind as In;
use protocol::v1::connector_session_client::ConnectorSessionClient;

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::servers::Server;
use crate::sim::{self, Identity};
use crate::stats::{median_of, per_trial};

/// Entries per report, one figure each.
const SIZES: [usize; 4] = [1, 50, 500, 2000];

/// The goal: 20× a connector at 500 checks/s, for N ≥ 50.
const GOAL: Goal = Goal::AtLeast { limit: 10_000.0 };

/// The figures, in the order of `SIZES`.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "batching_entries_per_s_1",
        unit: "entries/s",
        goal: Goal::Info,
    },
    Spec {
        name: "batching_entries_per_s_50",
        unit: "entries/s",
        goal: GOAL,
    },
    Spec {
        name: "batching_entries_per_s_500",
        unit: "entries/s",
        goal: GOAL,
    },
    Spec {
        name: "batching_entries_per_s_2000",
        unit: "entries/s",
        goal: GOAL,
    },
];

/// Distinct applications (a report holds each at most once).
const APPS: usize = 2000;

/// Reports of `n` entries each until `deadline`; counts entries in `sent`.
fn reports(
    n: usize,
    deadline: Instant,
    sent: Arc<AtomicU64>,
) -> impl Stream<Item = v1::ConnectorMessage> + Send + 'static {
    futures::stream::unfold(0usize, move |k| {
        let sent = sent.clone();
        async move {
            if Instant::now() >= deadline {
                return None;
            }
            let mut applications = Vec::with_capacity(n);
            for j in 0..n {
                let i = (k * n + j) % APPS;
                // Every entry changes the RTT; one in 64 flips the status.
                let msg = sim::report(
                    "ingest",
                    &ca::ingest_host(i),
                    ca::APP_PORT,
                    (k + j) % 64 != 63,
                    (k + j) as u64,
                );
                if let Some(In::Report(r)) = msg.kind {
                    applications.extend(r.applications);
                }
            }
            sent.fetch_add(applications.len() as u64, Ordering::Relaxed);
            let msg = v1::ConnectorMessage {
                kind: Some(In::Report(v1::HealthReport {
                    applications,
                    full_state: false,
                    sequence: k as u64,
                })),
            };
            Some((msg, k + 1))
        }
    })
}

fn identity() -> Identity {
    Identity {
        name: "batching-1".to_owned(),
        group: ca::GROUP.to_owned(),
        key: ca::KEY.to_owned(),
    }
}

/// One entry per message to the bare server on one connection; returns
/// entries/s until the server had counted them all.
async fn bare(server: &Server, run: Duration) -> Result<f64> {
    let ch = sim::channels(&server.grpc_url(), 1)
        .await?
        .pop()
        .ok_or_else(|| anyhow!("no channel"))?;
    let sent = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let id = identity();
    let out = futures::stream::once(futures::future::ready(sim::hello(&id))).chain(reports(
        1,
        t0 + run,
        sent,
    ));
    let mut client = ConnectorSessionClient::new(ch);
    let mut inbound = client.connect(out).await?.into_inner();
    let counted = match inbound.message().await? {
        Some(v1::AuthorityMessage {
            kind: Some(Out::Ping(p)),
        }) => p.nonce,
        other => return Err(anyhow!("bare server answered {other:?}")),
    };
    // The Hello is counted too.
    Ok(counted.saturating_sub(1) as f64 / t0.elapsed().as_secs_f64())
}

/// Reports of `n` entries to the CA on one session; returns entries/s until
/// its `reports_received` counter had them all.
async fn reach(server: &Server, n: usize, run: Duration) -> Result<f64> {
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http);
    let ch = sim::channels(&server.grpc_url(), 1)
        .await?
        .pop()
        .ok_or_else(|| anyhow!("no channel"))?;
    let before = ca::reports_received(&http, &base).await?;
    let sent = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let deadline = t0 + run;
    let inbound = sim::connect(ch, &identity(), reports(n, deadline, sent.clone())).await?;
    let session = sim::drain(inbound);
    tokio::time::sleep_until(deadline.into()).await;
    let total = sent.load(Ordering::Relaxed);
    ca::wait_until(
        Duration::from_secs(60),
        "the CA to handle every entry",
        || {
            let (http, base) = (http.clone(), base.clone());
            async move { Ok(ca::reports_received(&http, &base).await? >= before + total) }
        },
    )
    .await?;
    let rate = total as f64 / t0.elapsed().as_secs_f64();
    session.abort();
    Ok(rate)
}

/// Alternating trials (bare, N = 1, 50, 500, 2,000, bare, …) with both
/// servers up throughout; each figure is the median of its trials.
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let trials = mode.pick(1, 3);
    let duration = mode.pick(Duration::from_millis(300), Duration::from_secs(2));
    let bare_server = Server::spawn(&["serve-bare"]).await?;
    let ca_server = ca::start(&CaSetup {
        ingest_apps: APPS,
        ..CaSetup::default()
    })
    .await?;
    let http = reqwest::Client::new();
    let base = format!("http://{}", ca_server.http);
    let limited = "reach_ca_messages_rate_limited_total";
    let deferred = "reach_ca_reports_deferred_total";
    let counters0 = (
        ca::counter(&http, &base, limited).await?,
        ca::counter(&http, &base, deferred).await?,
    );
    // Warm-up: page in both paths.
    bare(&bare_server, Duration::from_millis(200)).await?;
    reach(&ca_server, 50, Duration::from_millis(200)).await?;
    let mut bare_runs = Vec::new();
    let mut reach_runs: Vec<Vec<f64>> = vec![Vec::new(); SIZES.len()];
    for _ in 0..trials {
        bare_runs.push(bare(&bare_server, duration).await?);
        for (runs, &n) in reach_runs.iter_mut().zip(&SIZES) {
            runs.push(reach(&ca_server, n, duration).await?);
        }
    }
    let counters = (
        ca::counter(&http, &base, limited).await? - counters0.0,
        ca::counter(&http, &base, deferred).await? - counters0.1,
    );
    drop(bare_server);
    drop(ca_server);
    let baseline = median_of(&bare_runs, |r| *r);
    Ok(SPECS
        .iter()
        .zip(&SIZES)
        .zip(&reach_runs)
        .map(|((spec, n), runs)| {
            let pairs: Vec<_> = runs.iter().zip(&bare_runs).collect();
            spec.figure(
                median_of(runs, |r| *r),
                Some(baseline),
                format!(
                    "one connector session sending HealthReports of {n} entries (distinct \
                     applications of {APPS}) as fast as the CA takes them, entry limits lifted; \
                     {trials} trials of {:.1} s alternating with the bare stream (one entry per \
                     message, one connection, bare tonic ConnectorSession that decodes and \
                     counts); median; per-trial ratios {}; over the whole group the CA counted \
                     {} messages rate-limited and {} reports deferred",
                    duration.as_secs_f64(),
                    per_trial(&pairs, |(r, b)| *r / *b),
                    counters.0,
                    counters.1,
                ),
            )
        })
        .collect())
}
