//! Three CA replicas on one PostgreSQL database (plain text, each a
//! `serve-ca` child), N simulated connectors attached to all three as
//! `connector-agent` attaches (see [`super::fleet`]: one session per
//! replica, 3·N sessions). In three phases:
//!
//! 1. **Steady state**: each replica's RSS and CPU over a window; the
//!    heartbeat lag (as `scale` measures it: the marker of each session's
//!    last heartbeat sent at an instant, then how long until every
//!    replica's `ListConnectors` shows it); revocation to close: a
//!    connector of its own group attached to all three, its group's
//!    provisioning key (what authenticates a plain-text session) revoked
//!    through replica 1's admin API, and the time until its sessions at
//!    all three replicas are closed, seen by the connector.
//! 2. **Restart storm with decisions**: a client asks replicas 1 and 3 for
//!    access decisions round-robin at a steady rate while replica 2 is
//!    killed and started again on the same configuration; every connector
//!    reconnects to it with backoff.
//! 3. **Network blip**: every connection to all three replicas dropped at
//!    once and replaced; everything reconnects with backoff while the
//!    client asks all three replicas.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::Spec;
use super::ca::{self, TOKEN};
use super::cluster::{Replica, replica_config};
use super::decisions::{self, Tally};
use super::fleet::{self, Fleet};
use crate::Mode;
use crate::pg::PgHost;
use crate::report::{Figure, Goal};
use crate::sim::{self, Identity};
use crate::stats::{ms, quantile};
use crate::sys::{cpu_time, named_thread_cpu, peak_usage, rss_bytes};

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "replicas_steady_rss_mib",
        unit: "MiB",
        goal: Goal::AtMost { limit: 2048.0 },
    },
    Spec {
        name: "replicas_steady_cpu_percent",
        unit: "% of a core",
        goal: Goal::Info,
    },
    Spec {
        name: "replicas_heartbeat_lag_s",
        unit: "s",
        goal: Goal::AtMost { limit: 1.0 },
    },
    Spec {
        name: "replicas_revoke_to_close_p50_ms",
        unit: "ms",
        goal: Goal::Info,
    },
    Spec {
        name: "replicas_revoke_to_close_max_ms",
        unit: "ms",
        goal: Goal::AtMost { limit: 2000.0 },
    },
    Spec {
        name: "replicas_restart_whole_s",
        unit: "s",
        // connector-agent's longest backoff toward one of several replicas
        // (5 s) plus 5 s to take the sessions.
        goal: Goal::AtMost { limit: 10.0 },
    },
    Spec {
        name: "replicas_restart_attempts_per_s_peak",
        unit: "attempts/s",
        goal: Goal::Info,
    },
    Spec {
        name: "replicas_restart_refused",
        unit: "sessions",
        goal: Goal::AtMost { limit: 0.0 },
    },
    Spec {
        name: "replicas_restart_peak_cpu_percent",
        unit: "% of a core",
        goal: Goal::Info,
    },
    Spec {
        name: "replicas_restart_peak_rss_mib",
        unit: "MiB",
        goal: Goal::Info,
    },
    Spec {
        name: "replicas_restart_failed_decisions",
        unit: "decisions",
        goal: Goal::AtMost { limit: 0.0 },
    },
    Spec {
        name: "replicas_blip_whole_s",
        unit: "s",
        goal: Goal::AtMost { limit: 10.0 },
    },
    Spec {
        name: "replicas_blip_attempts_per_s_peak",
        unit: "attempts/s",
        goal: Goal::Info,
    },
    Spec {
        name: "replicas_blip_refused",
        unit: "sessions",
        goal: Goal::AtMost { limit: 0.0 },
    },
    Spec {
        name: "replicas_blip_failed_decisions",
        unit: "decisions",
        goal: Goal::AtMost { limit: 0.0 },
    },
    Spec {
        name: "replicas_blip_no_connector_decisions",
        unit: "decisions",
        goal: Goal::Info,
    },
    Spec {
        name: "replicas_decision_cpu_ms",
        unit: "ms CPU/decision",
        goal: Goal::AtMost { limit: 0.1 },
    },
    Spec {
        name: "replicas_decision_p50_ms",
        unit: "ms",
        goal: Goal::Info,
    },
];

/// Sequential decisions asked of replica 1 in the steady state, in
/// `DECISION_ROUNDS` rounds, each after an idle window as long as the
/// previous round took.
const DECISIONS: usize = 1000;
const DECISION_ROUNDS: usize = 5;

/// Heartbeat interval of the replicas (the `CaSetup` default).
const HEARTBEAT: Duration = Duration::from_secs(5);
/// How long attaching or reattaching may take before the group gives up
/// (on PostgreSQL, under load, a replica admits a few hundred sessions a
/// second: 10,000 take most of a minute).
const LIMIT: Duration = Duration::from_secs(180);
/// How long the heartbeat lag is waited for.
const LAG_LIMIT: Duration = Duration::from_secs(10);

/// What the phases share.
struct Run {
    mode: Mode,
    replicas: Vec<Replica>,
    fleet: fleet::Attached,
    /// Decisions asked per second.
    rate: f64,
    /// Revocation trials (one connector group each).
    trials: usize,
    /// " (quick mode: …)" or empty.
    label: String,
}

impl Run {
    fn fleet(&self) -> &Fleet {
        &self.fleet.fleet
    }

    fn grpc_urls(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.server.grpc_url()).collect()
    }

    fn base(&self, r: usize) -> String {
        format!("http://{}", self.replicas[r].server.http)
    }

    fn live(&self) -> String {
        let f = self.fleet();
        (0..f.replicas())
            .map(|r| f.live(r).to_string())
            .collect::<Vec<_>>()
            .join("/")
    }
}

/// The revocation trials' connector groups, one each (`revoke-K`).
fn revoke_groups(trials: usize) -> String {
    let mut s = String::new();
    for k in 0..trials {
        let _ = write!(
            s,
            "\n[[connector_groups]]\nname = \"revoke-{k}\"\nprovisioning_key = \"{}\"\n",
            revoke_key(k)
        );
    }
    s
}

fn revoke_key(k: usize) -> String {
    format!("revoke-{k}-provisioning-key-bTryrvnXQ0gLBbJxZybBOAGB")
}

/// Measures (quick: 150 connectors).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    PgHost::around(async |pg| measure(mode, pg).await).await
}

async fn measure(mode: Mode, pg: &PgHost) -> Result<Vec<Figure>> {
    let n = mode.pick(150usize, 10_000);
    let trials = mode.pick(3usize, 5);
    let db = pg.fresh_database().await?;
    let mut replicas = Vec::new();
    for i in 1..=3 {
        let text = replica_config(Some(&db), &format!("r{i}"), None, 0, &revoke_groups(trials));
        replicas.push(Replica::start(&text).await?);
    }
    let urls: Vec<String> = replicas.iter().map(|r| r.server.grpc_url()).collect();
    let t = Instant::now();
    let mut run = Run {
        mode,
        replicas,
        fleet: fleet::attach(&urls, n, HEARTBEAT)?,
        rate: mode.pick(20.0, 50.0),
        trials,
        label: if n == 10_000 {
            String::new()
        } else {
            format!(" (quick mode: {n} connectors, not 10,000)")
        },
    };
    let f = run.fleet.fleet.clone();
    f.count_from(Some(t));
    ca::wait_until(
        LIMIT,
        "every connector attached to all three replicas",
        || {
            let whole = f.all_whole();
            async move { Ok(whole) }
        },
    )
    .await
    .with_context(|| {
        format!(
            "sessions live at replicas 1/2/3: {}; {} attempts failed (refused or no Welcome within 30 s); {}",
            run.live(),
            f.refused(&[0, 1, 2]),
            f.lost()
        )
    })?;
    let attach_s = t.elapsed().as_secs_f64();
    let mut out = Vec::new();
    let phases = match steady(&run, attach_s).await.context("steady state") {
        Ok(f) => {
            out.extend(f);
            restart(&mut run).await.context("restart storm")
        }
        Err(e) => Err(e),
    };
    let phases = match phases {
        Ok(f) => {
            out.extend(f);
            blip(&run).await.context("network blip")
        }
        Err(e) => Err(e),
    };
    match phases {
        Ok(f) => out.extend(f),
        Err(e) => {
            eprintln!("reach-bench: replicas: {e:#}");
            for spec in SPECS.iter().skip(out.len()) {
                out.push(spec.missing(format!("not measured: {e:#}")));
            }
        }
    }
    Ok(out)
}

/// Phase 1: RSS, CPU, heartbeat lag, revocation to close.
async fn steady(run: &Run, attach_s: f64) -> Result<Vec<Figure>> {
    let window = run
        .mode
        .pick(Duration::from_secs(2), Duration::from_secs(10));
    let pids: Vec<Option<u32>> = run.replicas.iter().map(|r| r.server.pid()).collect();
    let cpu0: Vec<Duration> = pids.iter().map(|p| cpu_time(*p)).collect();
    let t0 = Instant::now();
    tokio::time::sleep(window).await;
    let cpu: Vec<f64> = pids
        .iter()
        .zip(&cpu0)
        .map(|(p, c)| {
            cpu_time(*p).saturating_sub(*c).as_secs_f64() * 100.0 / t0.elapsed().as_secs_f64()
        })
        .collect();
    let rss: Vec<f64> = pids
        .iter()
        .map(|p| rss_bytes(*p) as f64 / 1048576.0)
        .collect();
    let (lag, lagging) = heartbeat_lag(run).await?;
    let (decision_cpu, decision_p50, rounds) = decision_cost(run).await?;
    let mut closes = Vec::with_capacity(run.trials);
    for k in 0..run.trials {
        closes.push(revoke_once(run, k).await?);
    }
    closes.sort();
    let (n, label) = (run.fleet().n, &run.label);
    let each = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.1}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    let setup = format!(
        "{n} connectors × 3 replicas = {} sessions over {} HTTP/2 connections per replica, all \
         attached {attach_s:.1} s after the start; heartbeats every {} s",
        3 * n,
        n.div_ceil(fleet::PER_CHANNEL),
        HEARTBEAT.as_secs()
    );
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let mut lag_fig = SPECS[2].figure(
        lag,
        None,
        if lagging == 0 {
            format!("slowest replica: every session's last heartbeat (at an instant during steady heartbeats) visible in its ListConnectors {lag:.2} s later; {setup}{label}")
        } else {
            format!("{lagging} sessions' last heartbeats still not shown {lag:.1} s later; {setup}{label}")
        },
    );
    if lagging > 0 {
        lag_fig.met = Some(false);
    }
    let closes_ms: Vec<String> = closes.iter().map(|d| format!("{:.0}", ms(*d))).collect();
    let revoke_note = format!(
        "{} trials (all: {} ms): a connector of its own group attached to all three replicas \
         (plain text: its session is authenticated by the group's provisioning key), POST \
         /api/v1/provisioning_keys/GROUP/revoke on replica 1, to its sessions at all three \
         replicas closed, as the connector sees them end; the other replicas learn it from \
         PostgreSQL (LISTEN/NOTIFY, a 1 s reconcile as the fallback); {setup}{label}",
        run.trials,
        closes_ms.join(", ")
    );
    Ok(vec![
        SPECS[0].figure(max(&rss), None, format!("largest replica RSS; replicas 1/2/3: {} MiB; {setup}{label}", each(&rss))),
        SPECS[1].figure(max(&cpu), None, format!("busiest replica over {:.0} s of steady heartbeats; replicas 1/2/3: {} % of a core; {setup}{label}", window.as_secs_f64(), each(&cpu))),
        lag_fig,
        SPECS[3].figure(ms(quantile(&closes, 0.5)), None, format!("p50 of {revoke_note}")),
        SPECS[4].figure(ms(quantile(&closes, 1.0)), None, format!("max of {revoke_note}")),
        SPECS[16].figure(decision_cpu, None, format!("the CPU of replica 1's HTTP API runtime (`reach-http` threads, schedstat) over sequential decisions (POST /api/v1/access, each with its explanation) for an application whose segment's group holds all {n} connectors, less its rate in an idle window just before, per decision: the median of {DECISION_ROUNDS} rounds ({DECISIONS} decisions in a full run; the first builds the roster) of {rounds} ms; steady state {:.1} % of a core; {setup}{label}", cpu[0])),
        SPECS[17].figure(decision_p50, None, format!("p50 of the same decisions as the client sees them (one at a time, over one kept-alive connection); {setup}{label}")),
    ])
}

/// Asks replica 1 for decisions one after the other (`DECISION_ROUNDS`
/// rounds), every one of which must select a connector; the replica's CPU
/// per decision above its rate in the idle window before each round (the
/// median round) and the median latency, both in ms, and every round's
/// cost.
async fn decision_cost(run: &Run) -> Result<(f64, f64, String)> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let url = format!("{}/api/v1/access", run.base(0));
    let body = serde_json::json!({"host": ca::APP_HOST, "protocol": "tcp", "port": ca::APP_PORT});
    let pid = run.replicas[0].server.pid();
    let per_round = run.mode.pick(40, DECISIONS / DECISION_ROUNDS);
    let mut took = Vec::with_capacity(per_round * DECISION_ROUNDS);
    let mut costs = Vec::with_capacity(DECISION_ROUNDS);
    // A decision runs on the HTTP API's runtime (its threads are
    // `reach-http`); the sessions' heartbeats, which vary from one window
    // to the next by more than the decisions cost, run on the other. That
    // runtime's rate is read just before each round, over a window as long
    // as a round (nanosecond `schedstat` times: a round is a few tens of
    // milliseconds, a few ticks of `/proc/PID/stat`).
    let http_cpu = || named_thread_cpu(pid, "reach-http");
    let mut idle_window = Duration::from_millis(250);
    for round in 0..DECISION_ROUNDS {
        let (i0, s0) = (http_cpu(), Instant::now());
        tokio::time::sleep(idle_window).await;
        let idle = http_cpu().saturating_sub(i0).as_secs_f64() / s0.elapsed().as_secs_f64();
        let (c0, t0) = (http_cpu(), Instant::now());
        for k in 0..per_round {
            let t = Instant::now();
            let r = http
                .post(&url)
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await?;
            let status = r.status();
            let text = r.text().await?;
            took.push(t.elapsed());
            if !status.is_success() {
                bail!("decision {k} of round {round} at replica 1: {status}: {text}");
            }
        }
        let spent = t0.elapsed();
        let busy = http_cpu().saturating_sub(c0).as_secs_f64() - idle * spent.as_secs_f64();
        costs.push(busy * 1e3 / per_round as f64);
        idle_window = spent;
    }
    let rounds = costs
        .iter()
        .map(|c| format!("{c:.3}"))
        .collect::<Vec<_>>()
        .join(", ");
    costs.sort_by(f64::total_cmp);
    let cost = costs[costs.len() / 2];
    if cost <= 0.0 {
        bail!(
            "replica 1's CPU over its decisions was not above its steady rate (machine load): {rounds} ms per decision"
        );
    }
    took.sort();
    Ok((cost, ms(quantile(&took, 0.5)), rounds))
}

/// The slowest replica's heartbeat lag (s), and how many sessions still
/// lagged when it gave up.
async fn heartbeat_lag(run: &Run) -> Result<(f64, usize)> {
    let mut channels = Vec::new();
    for r in &run.replicas {
        channels.extend(sim::channels(&r.server.grpc_url(), 1).await?);
    }
    let t = Instant::now();
    let sent: Vec<Vec<u32>> = (0..channels.len()).map(|r| run.fleet().sent(r)).collect();
    let mut lag: Vec<Option<f64>> = vec![None; channels.len()];
    loop {
        let mut lagging = 0;
        for (r, ch) in channels.iter().enumerate() {
            if lag[r].is_some() {
                continue;
            }
            match ca::behind(ch.clone(), &sent[r]).await? {
                0 => lag[r] = Some(t.elapsed().as_secs_f64()),
                k => lagging += k,
            }
        }
        if lagging == 0 || t.elapsed() > LAG_LIMIT {
            let worst = lag
                .iter()
                .map(|l| l.unwrap_or(t.elapsed().as_secs_f64()))
                .fold(0.0, f64::max);
            return Ok((worst, lagging));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Trial `k`: connector `revoke-K` attached to all three, its key revoked
/// on replica 1; the time until its last session closed.
async fn revoke_once(run: &Run, k: usize) -> Result<Duration> {
    let id = Identity {
        name: format!("revoke-{k}"),
        group: format!("revoke-{k}"),
        key: revoke_key(k),
    };
    let mut sessions = Vec::new();
    for url in run.grpc_urls() {
        let ch = sim::channels(&url, 1).await?.remove(0);
        sessions.push(sim::connect(ch, &id, futures::stream::pending()).await?);
    }
    let http = reqwest::Client::new();
    let t = Instant::now();
    let status = http
        .post(format!(
            "{}/api/v1/provisioning_keys/revoke-{k}/revoke",
            run.base(0)
        ))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .status();
    if !status.is_success() {
        bail!("revoking the key of group revoke-{k} on replica 1 answered {status}");
    }
    let closed = futures::future::join_all(sessions.into_iter().map(|mut s| async move {
        while let Ok(Some(_)) = s.message().await {}
        t.elapsed()
    }));
    let closed = tokio::time::timeout(Duration::from_secs(30), closed)
        .await
        .with_context(|| format!("revoke-{k}'s sessions not all closed 30 s after the revoke"))?;
    Ok(closed.into_iter().max().unwrap_or_default())
}

/// Waits until `cond` (polled every 20 ms) or [`LIMIT`]; the time.
async fn until(what: &str, mut cond: impl FnMut() -> bool) -> Result<Duration> {
    ca::wait_until(LIMIT, what, || {
        let done = cond();
        async move { Ok(done) }
    })
    .await
}

/// The decisions' note: counts, the failures' errors, and how many of
/// the decisions the asked replicas took over 1.6 s themselves.
fn decisions_note(tally: &Tally, asked: &str, inside: &str) -> String {
    let (ok, none, failed) = tally.counts();
    let errors = tally.errors();
    format!(
        "{asked}: {ok} selected a connector, {none} found no connector ({}), {failed} failed{}; \
         inside the replicas: {inside}",
        decisions::NO_CONNECTOR.join("/"),
        if errors.is_empty() {
            String::new()
        } else {
            format!(" (first: {errors})")
        }
    )
}

/// How many decisions each of `replicas` has taken over 1.6 s so far, and
/// in all (`decisions::slow_at`); `None` where its metrics did not answer.
async fn slow_decisions(run: &Run, replicas: &[usize]) -> Vec<Option<(u64, u64)>> {
    let Ok(http) = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
    else {
        return vec![None; replicas.len()];
    };
    let mut out = Vec::new();
    for r in replicas {
        out.push(decisions::slow_at(&http, &run.base(*r)).await.ok());
    }
    out
}

/// The change in `slow_decisions` from `before` to `after`, as text.
fn slow_note(
    replicas: &[usize],
    before: &[Option<(u64, u64)>],
    after: &[Option<(u64, u64)>],
) -> String {
    let parts: Vec<String> = replicas
        .iter()
        .zip(before.iter().zip(after))
        .map(|(r, pair)| match pair {
            (Some((s0, a0)), Some((s1, a1))) => format!(
                "replica {} took {} of its {} decisions over 1.6 s",
                r + 1,
                s1.saturating_sub(*s0),
                a1.saturating_sub(*a0)
            ),
            _ => format!("replica {}'s /metrics did not answer", r + 1),
        })
        .collect();
    parts.join(", ")
}

/// When replica 2 (index 1), started at `started`, is ready (`/readyz`)
/// and has a session from every connector: (ready, whole) after `started`.
async fn ready_and_whole(run: &Run, started: Instant) -> Result<(f64, f64)> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()?;
    let url = format!("{}/readyz", run.base(1));
    let (mut ready, mut whole) = (None, None);
    loop {
        if ready.is_none()
            && let Ok(r) = http.get(&url).send().await
            && r.status().is_success()
        {
            ready = Some(started.elapsed().as_secs_f64());
        }
        if whole.is_none() && run.fleet().live(1) == run.fleet().n {
            whole = Some(started.elapsed().as_secs_f64());
        }
        if let (Some(r), Some(w)) = (ready, whole) {
            return Ok((r, w));
        }
        if started.elapsed() > LIMIT {
            bail!(
                "replica 2 not ready and whole {LIMIT:?} after its start (ready: {}, sessions: {} of {})",
                ready.is_some(),
                run.fleet().live(1),
                run.fleet().n
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Phase 2: replica 2 killed and started again under decisions at 1 and 3.
async fn restart(run: &mut Run) -> Result<Vec<Figure>> {
    let slow_before = slow_decisions(run, &[0, 2]).await;
    let client = decisions::Client::start(vec![run.base(0), run.base(2)], run.rate)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    run.fleet().count_from(None);
    run.replicas[1].kill().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let started = Instant::now();
    run.replicas[1].start_again().await?;
    let (done_tx, done) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(peak_usage(run.replicas[1].server.pid(), done));
    run.fleet().replace(1, &run.replicas[1].server.grpc_url())?;
    run.fleet().count_from(Some(started));
    let waited = ready_and_whole(run, started).await;
    done_tx.send_replace(true);
    let (cpu, rss) = sampler.await?;
    // A second more of decisions after the table is whole.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tally = client.stop().await?;
    let inside = slow_note(&[0, 2], &slow_before, &slow_decisions(run, &[0, 2]).await);
    let (ready, whole) = waited?;
    let f = run.fleet();
    let (peak, total) = f.attempts(&[1]);
    let label = &run.label;
    let (_, none, failed) = tally.counts();
    let setup = format!(
        "replica 2 killed (SIGKILL), started again 1 s later on the same configuration (new ports); {} connectors reconnect with connector-agent's backoff toward one of several replicas (full jitter, 0.5 s doubling to 5 s){label}",
        f.n
    );
    Ok(vec![
        SPECS[5].figure(ready.max(whole), None, format!("from replica 2's process start: ready (/readyz) after {ready:.2} s, every connector's session back after {whole:.2} s; {setup}")),
        SPECS[6].figure(peak as f64, None, format!("{total} attempts at replica 2 from its start until its table was whole; {setup}")),
        SPECS[7].figure(f.refused(&[1]) as f64, None, format!("sessions replica 2 refused (or did not welcome within 30 s) after its start (replicas 1 and 3: {}); {setup}", f.refused(&[0, 2]))),
        SPECS[8].figure(cpu * 100.0, None, format!("replica 2's busiest 500 ms from its start until its table was whole; {setup}")),
        SPECS[9].figure(rss as f64 / 1048576.0, None, format!("replica 2's largest RSS from its start until its table was whole; {setup}")),
        SPECS[10].figure(
            (failed + none) as f64,
            None,
            format!(
                "decisions at replicas 1 and 3 that did not select a connector; every connector stays attached there, so a `no connector` answer counts as failed too; {}; {setup}",
                decisions_note(&tally, &format!("{:.0}/s round-robin to replicas 1 and 3 from 1 s before the kill to 1 s after the table was whole", run.rate), &inside)
            ),
        ),
    ])
}

/// Phase 3: every connection to every replica dropped at once.
async fn blip(run: &Run) -> Result<Vec<Figure>> {
    let slow_before = slow_decisions(run, &[0, 1, 2]).await;
    let client = decisions::Client::start((0..3).map(|r| run.base(r)).collect(), run.rate)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let f = run.fleet();
    let t = Instant::now();
    f.count_from(Some(t));
    f.blip(&run.grpc_urls())?;
    until("the blip to reach the sessions", || !f.all_whole()).await?;
    let waited = until("every connector back at all three replicas", || {
        f.all_whole()
    })
    .await;
    let whole = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tally = client.stop().await?;
    let inside = slow_note(
        &[0, 1, 2],
        &slow_before,
        &slow_decisions(run, &[0, 1, 2]).await,
    );
    waited.with_context(|| format!("sessions live at replicas 1/2/3: {}", run.live()))?;
    let (peak, total) = f.attempts(&[0, 1, 2]);
    let (_, none, failed) = tally.counts();
    let label = &run.label;
    let setup = format!(
        "every HTTP/2 connection of the {} connectors to all three replicas dropped at once and replaced (as a network blip that resets every connection); each session reconnects with connector-agent's backoff toward one of several replicas (full jitter, 0.5 s doubling to 5 s){label}",
        f.n
    );
    let asked = decisions_note(
        tally.as_ref(),
        &format!(
            "{:.0}/s round-robin to all three replicas from 1 s before the blip to 1 s after the tables were whole",
            run.rate
        ),
        &inside,
    );
    Ok(vec![
        SPECS[11].figure(whole, None, format!("from the blip until every connector had a session at all three replicas again; {setup}")),
        SPECS[12].figure(peak as f64, None, format!("the busiest second's attempts summed over the three replicas, {total} in all; {setup}")),
        SPECS[13].figure(f.refused(&[0, 1, 2]) as f64, None, format!("sessions the replicas refused (or did not welcome within 30 s) after the blip; {setup}")),
        SPECS[14].figure(failed as f64, None, format!("decisions that failed for the CA's own reasons (another status, a transport error or a timeout); a `no connector` answer while the connectors are away is the right answer, counted apart; {asked}; {setup}")),
        SPECS[15].figure(none as f64, None, format!("decisions answered 503 with no connector to select while connectors reattached; {asked}; {setup}")),
    ])
}
