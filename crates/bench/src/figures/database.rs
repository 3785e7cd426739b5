//! The database's share: one CA on a fresh PostgreSQL database (the store
//! replicas share), measured by PostgreSQL's own statistics.
//!
//! - **Per status transition**: simulated connectors (real gRPC sessions,
//!   50 per HTTP/2 connection) each report ten applications Up, then every
//!   round (100 ms) 1 % of the applications flip Up↔Down, reported by every
//!   connector that has them; then, half as long, 1 % of the (application,
//!   connector) results flip on their own (connectors disagreeing,
//!   `db_disagreeing_*`). An idle window (sessions and heartbeats only) is
//!   measured after them and subtracted pro rata from each, so what is
//!   left is what the transitions cost: committed transactions and rows
//!   written (`pg_stat_database`), WAL bytes (`pg_current_wal_lsn()`), the
//!   CPU of every PostgreSQL process and of the CA, per transition stored
//!   in `health_events`. The flapping windows run on the CA's connections
//!   that stored the first reports, as a CA's long-lived pool does: a
//!   backend started for a window (the statistics published by ending the
//!   connections) paid its first touch of every shared buffer page in it,
//!   a quarter of PostgreSQL's samples; and on WAL files ready for reuse
//!   (`PgStats::recycle_wal`), as a server in service has.
//! - **Per enrollment and per renewal**: a second CA (TLS, its own fresh
//!   database) enrolled into by `connector_agent::ca::enroll::enroll` and
//!   renewed by `connector_agent::ca::enroll::renew` (the connector's own
//!   calls), sequentially; each window ends with the CA's connections
//!   ended, so PostgreSQL has published their counts.
//!
//! All traffic goes to loopback.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use connector_agent::ca::dial::{CaTarget, CaUrl};
use connector_agent::ca::enroll;
use futures::{StreamExt, TryStreamExt};
use protocol::v1;
use rand::seq::index::sample;
use tokio::sync::mpsc;

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::pg::{PgHost, PgSample, PgStats};
use crate::report::{Figure, Goal};
use crate::servers::Server;
use crate::sim::{self, Identity};
use crate::sys::cpu_time;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "db_transition_commits",
        unit: "transactions/transition",
        goal: Goal::Info,
    },
    Spec {
        name: "db_transition_rows",
        unit: "rows/transition",
        goal: Goal::Info,
    },
    Spec {
        name: "db_transition_wal_bytes",
        unit: "B/transition",
        goal: Goal::Info,
    },
    Spec {
        name: "db_transition_pg_cpu_us",
        unit: "µs CPU/transition",
        goal: Goal::Info,
    },
    Spec {
        name: "db_transition_ca_cpu_us",
        unit: "µs CPU/transition",
        goal: Goal::Info,
    },
    Spec {
        name: "db_transitions_per_s_at_half_core",
        unit: "transitions/s",
        // Baseline: the transitions/s at which the CA itself is at a full
        // core. The database must not be the bottleneck before the CA is.
        goal: Goal::RatioAtLeast { ratio: 1.0 },
    },
    Spec {
        name: "db_disagreeing_rows",
        unit: "rows/transition",
        goal: Goal::Info,
    },
    Spec {
        name: "db_disagreeing_wal_bytes",
        unit: "B/transition",
        goal: Goal::Info,
    },
    Spec {
        name: "db_disagreeing_pg_cpu_us",
        unit: "µs CPU/transition",
        goal: Goal::Info,
    },
    Spec {
        name: "db_enroll_commits",
        unit: "transactions/enrollment",
        goal: Goal::Info,
    },
    Spec {
        name: "db_enroll_rows",
        unit: "rows/enrollment",
        goal: Goal::Info,
    },
    Spec {
        name: "db_enroll_wal_bytes",
        unit: "B/enrollment",
        goal: Goal::Info,
    },
    Spec {
        name: "db_renew_commits",
        unit: "transactions/renewal",
        goal: Goal::Info,
    },
    Spec {
        name: "db_renew_rows",
        unit: "rows/renewal",
        goal: Goal::Info,
    },
    Spec {
        name: "db_renew_wal_bytes",
        unit: "B/renewal",
        goal: Goal::Info,
    },
];

/// Sessions per HTTP/2 connection (the CA allows 64 streams per connection).
const PER_CHANNEL: usize = 50;
/// The flapping segment.
const SEGMENT: &str = "flap";
/// Applications of the flapping segment.
const POLICY_APPS: usize = 1000;
/// Applications each simulated connector reports.
const APPS_PER: usize = 10;
/// After the last round: the CA stores its transitions every second and
/// PostgreSQL's backends publish their statistics within a second while
/// busy.
const SETTLE: Duration = Duration::from_secs(3);
/// Long enough for a backend that went idle to publish its statistics
/// without ending it (PostgreSQL 15's `PGSTAT_IDLE_INTERVAL` is 10 s).
const PUBLISHED: Duration = Duration::from_secs(11);
/// The enrollment CA's group (its key allows any number of enrollments).
const ENROLL_GROUP: &str = "db-enroll";
/// Its provisioning key.
const ENROLL_KEY: &str = "db-enroll-provisioning-key-pnoYuIzp7FkwOGf6Exgeq6G1";

/// The `k`-th application of the flapping segment (127.22.x.y).
fn flap_host(k: usize) -> String {
    format!("127.22.{}.{}", k / 250, k % 250 + 1)
}

/// The CA's configuration on database `url`: plain text (the simulated
/// connectors), or TLS with a group for enrollments.
fn config(url: &str, tls: bool) -> String {
    let base = ca::config_text(&CaSetup {
        filler_segments: 0,
        ingest_apps: 0,
        ..CaSetup::default()
    });
    let base = if tls { ca::with_tls(&base, "") } else { base };
    let apps: Vec<String> = (0..POLICY_APPS)
        .map(|k| format!("\"{}\"", flap_host(k)))
        .collect();
    // Reports are sent on change only: the interval is long enough that no
    // result goes stale during the run.
    format!(
        r#"[store]
url = {url:?}

{base}
[[segments]]
name = "{SEGMENT}"
applications = [{}]
tcp_ports = ["{port}"]
health_reporting = "continuous"
report_interval_s = 3600
connector_groups = ["{group}"]

[[connector_groups]]
name = "{ENROLL_GROUP}"
provisioning_key = "{ENROLL_KEY}"
max_uses = 1000000
"#,
        apps.join(", "),
        port = ca::APP_PORT,
        group = ca::GROUP,
    )
}

/// One report of several applications of the flapping segment.
fn report(results: &[(usize, bool)]) -> v1::ConnectorMessage {
    let results: Vec<(String, bool)> = results.iter().map(|&(k, up)| (flap_host(k), up)).collect();
    sim::report_of(SEGMENT, ca::APP_PORT, &results, false)
}

/// The application of result `p` (connector `p / APPS_PER`).
fn app_of(p: usize) -> usize {
    p % POLICY_APPS
}

/// The results of application `app` among `pairs`: those `app_of` maps
/// to it.
fn results_of(app: usize, pairs: usize) -> impl Iterator<Item = usize> {
    (app..pairs).step_by(POLICY_APPS)
}

/// Opens the sessions of `n` simulated connectors; each sends what its
/// sender is given and a heartbeat every `heartbeat`.
async fn fleet(
    server: &Server,
    n: usize,
    heartbeat: Duration,
) -> Result<Vec<mpsc::Sender<v1::ConnectorMessage>>> {
    let channels = sim::channels(&server.grpc_url(), n.div_ceil(PER_CHANNEL)).await?;
    let opened = futures::stream::iter(0..n)
        .map(|i| {
            let channel = channels[i / PER_CHANNEL].clone();
            async move {
                let id = Identity {
                    name: format!("db-{i:05}"),
                    group: ca::GROUP.to_owned(),
                    key: ca::KEY.to_owned(),
                };
                let (tx, rx) = mpsc::channel(64);
                let sent = futures::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|m| (m, rx))
                });
                let beats = futures::stream::unfold(0u32, move |k| async move {
                    tokio::time::sleep(heartbeat).await;
                    Some((sim::heartbeat(k), k + 1))
                });
                let inbound =
                    sim::connect(channel, &id, futures::stream::select(sent, beats)).await?;
                sim::drain(inbound);
                Ok::<_, anyhow::Error>(tx)
            }
        })
        .buffered(256)
        .try_collect()
        .await?;
    Ok(opened)
}

/// What PostgreSQL and the CA did between two moments.
#[derive(Clone, Copy, Debug, Default)]
struct Work {
    secs: f64,
    commits: f64,
    rows: f64,
    wal: f64,
    pg_cpu: f64,
    ca_cpu: f64,
}

/// PostgreSQL's counters and the CA's CPU at one moment.
#[derive(Clone, Copy, Debug)]
struct Snap {
    pg: PgSample,
    ca_cpu: Duration,
}

async fn snap(stats: &PgStats, ca: Option<u32>) -> Result<Snap> {
    Ok(Snap {
        pg: stats.sample().await?,
        ca_cpu: cpu_time(ca),
    })
}

impl Work {
    fn between(a: &Snap, b: &Snap) -> Work {
        Work {
            secs: (b.pg.at - a.pg.at).as_secs_f64(),
            commits: (b.pg.commits - a.pg.commits) as f64,
            rows: (b.pg.rows - a.pg.rows) as f64,
            wal: (b.pg.wal - a.pg.wal) as f64,
            pg_cpu: b.pg.cpu.saturating_sub(a.pg.cpu).as_secs_f64(),
            ca_cpu: b.ca_cpu.saturating_sub(a.ca_cpu).as_secs_f64(),
        }
    }

    /// This window less `idle`'s work at its rate over this window's length.
    /// Counts do not go below 0: a window whose own commits, rows or WAL
    /// are fewer than the idle rate predicts did none of that work beyond
    /// the idle noise (a short quick-mode idle window overestimates it).
    fn less(&self, idle: &Work) -> Work {
        let k = if idle.secs > 0.0 {
            self.secs / idle.secs
        } else {
            0.0
        };
        Work {
            secs: self.secs,
            commits: (self.commits - idle.commits * k).max(0.0),
            rows: (self.rows - idle.rows * k).max(0.0),
            wal: (self.wal - idle.wal * k).max(0.0),
            pg_cpu: self.pg_cpu - idle.pg_cpu * k,
            ca_cpu: self.ca_cpu - idle.ca_cpu * k,
        }
    }

    /// Per one of `n` operations.
    fn per(&self, n: f64) -> Work {
        Work {
            secs: self.secs,
            commits: self.commits / n,
            rows: self.rows / n,
            wal: self.wal / n,
            pg_cpu: self.pg_cpu / n,
            ca_cpu: self.ca_cpu / n,
        }
    }

    fn describe(&self) -> String {
        format!(
            "{:.1} s: {:.0} commits, {:.0} rows, {:.0} WAL bytes, PostgreSQL {:.2} s CPU, CA {:.2} s CPU",
            self.secs, self.commits, self.rows, self.wal, self.pg_cpu, self.ca_cpu
        )
    }
}

/// Waits until the first reports are stored (one transition to Up per
/// result) and the database's counts of them are published.
async fn settled(stats: &PgStats, pairs: i64) -> Result<i64> {
    let t0 = Instant::now();
    loop {
        let events = stats.count("health_events").await?;
        if events >= pairs {
            // Published without ending the connections: the flapping
            // window runs on these backends.
            tokio::time::sleep(PUBLISHED).await;
            return stats.count("health_events").await;
        }
        if t0.elapsed() > Duration::from_secs(120) {
            bail!("{events} of the first {pairs} transitions stored 120 s after the first reports");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What a flapping window flips each round.
#[derive(Clone, Copy, Debug)]
enum Flaps {
    /// Whole applications, as when they go down or come back: every
    /// connector that reports one sends its new result.
    Applications,
    /// Single (application, connector) results, as when connectors
    /// disagree about an application: each address change is a row of the
    /// address history too (its result is the latest report's).
    Results,
}

impl Flaps {
    /// How many applications, or results of `pairs`, a round picks from.
    fn of(self, pairs: usize) -> usize {
        match self {
            Flaps::Applications => POLICY_APPS,
            Flaps::Results => pairs,
        }
    }

    /// How many of them flip each round.
    fn per_round(self, pairs: usize, percent: usize) -> usize {
        (self.of(pairs) * percent / 100).max(1)
    }
}

/// Flips `percent` % of the applications or of the results every round
/// for `rounds` rounds; `up` holds each result's last report; the
/// transitions sent.
async fn flap(
    senders: &[mpsc::Sender<v1::ConnectorMessage>],
    up: &mut [bool],
    flaps: Flaps,
    round: Duration,
    rounds: usize,
    percent: usize,
) -> Result<usize> {
    let pairs = up.len();
    let mut sent = 0;
    let mut tick = tokio::time::interval(round);
    for _ in 0..rounds {
        tick.tick().await;
        let picked = sample(
            &mut rand::rng(),
            flaps.of(pairs),
            flaps.per_round(pairs, percent),
        );
        let flipped: Vec<usize> = match flaps {
            Flaps::Applications => picked
                .iter()
                .flat_map(|app| results_of(app, pairs))
                .collect(),
            Flaps::Results => picked.into_vec(),
        };
        for p in flipped {
            up[p] = !up[p];
            senders[p / APPS_PER]
                .send(report(&[(app_of(p), up[p])]))
                .await
                .map_err(|_| anyhow!("the session of connector {} ended", p / APPS_PER))?;
            sent += 1;
        }
    }
    Ok(sent)
}

/// Measures every figure (quick: 200 connectors, short windows).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    PgHost::around(async |pg| measure(mode, pg).await).await
}

async fn measure(mode: Mode, pg: &PgHost) -> Result<Vec<Figure>> {
    let mut figures = transitions(mode, &pg.fresh_database().await?).await?;
    figures.extend(enrollments(mode, &pg.fresh_database().await?).await?);
    Ok(figures)
}

/// `db_transition_*`, `db_transitions_per_s_at_half_core` and
/// `db_disagreeing_*`.
async fn transitions(mode: Mode, url: &str) -> Result<Vec<Figure>> {
    let n = mode.pick(200usize, 10_000);
    let idle = mode.pick(Duration::from_secs(8), Duration::from_secs(20));
    // A round every 100 ms: at 10,000 transitions a second (full) their
    // CPU stands well above the sessions' own at the CA, which at 1,000 a
    // second it did not (the CA's figure read 0.3-42 µs across runs).
    let round = Duration::from_millis(100);
    let rounds = mode.pick(60usize, 400);
    // Quick: a tenth of the few results flips each round, so that the
    // transitions' CPU stands above the idle window's (at 1 %, 1,200
    // transitions read below it at the CA in one run).
    let percent = mode.pick(10usize, 1);
    let heartbeat = Duration::from_millis(CaSetup::default().heartbeat_ms);
    let stats = PgStats::connect(url).await?;
    // 32 files: 512 MB, more than the windows write.
    stats.recycle_wal(32).await?;
    let (server, _dir) = ca::start_text(&config(url, false)).await?;
    let senders = fleet(&server, n, heartbeat).await?;
    for (i, tx) in senders.iter().enumerate() {
        let all: Vec<(usize, bool)> = (0..APPS_PER)
            .map(|k| (app_of(i * APPS_PER + k), true))
            .collect();
        tx.send(report(&all))
            .await
            .map_err(|_| anyhow!("the session of connector {i} ended"))?;
    }
    let mut up = vec![true; n * APPS_PER];
    let first = settled(&stats, up.len() as i64).await?;
    let s0 = snap(&stats, server.pid()).await?;
    // A window ends with the backends' counts published: by ending them
    // (`last`), or else by letting them idle, so that the next window
    // runs on them too.
    let mut window = async |flaps: Flaps, rounds: usize, last: bool| {
        let sent = flap(&senders, &mut up, flaps, round, rounds, percent).await?;
        tokio::time::sleep(SETTLE).await;
        if last {
            stats.publish().await?;
        } else {
            tokio::time::sleep(PUBLISHED).await;
        }
        let end = snap(&stats, server.pid()).await?;
        anyhow::Ok((sent, end, stats.count("health_events").await?))
    };
    let (sent, s1, after) = window(Flaps::Applications, rounds, false).await?;
    // Half as long: its figures are information, not the goal's.
    let split_rounds = rounds / 2;
    let (split_sent, s2, split_after) = window(Flaps::Results, split_rounds, true).await?;
    let (stored, split_stored) = (after - first, split_after - after);
    // The idle window starts once the CA's pool has opened its
    // connections again (new backends' start-up is no idle work: in quick
    // mode, 3 s of it subtracted at its rate from a 20-s window read below
    // zero).
    tokio::time::sleep(SETTLE).await;
    let s3 = snap(&stats, server.pid()).await?;
    tokio::time::sleep(idle).await;
    stats.publish().await?;
    let s4 = snap(&stats, server.pid()).await?;
    drop(senders);
    drop(server);
    if stored <= 0 || split_stored <= 0 {
        bail!(
            "{sent} and {split_sent} status changes reported, {stored} and {split_stored} \
             transitions stored in health_events"
        );
    }
    let idle_work = Work::between(&s3, &s4);
    let each = Work::between(&s0, &s1).less(&idle_work).per(stored as f64);
    let split = Work::between(&s1, &s2)
        .less(&idle_work)
        .per(split_stored as f64);
    let results = n * APPS_PER;
    let common = format!(
        "{n} simulated connectors × {APPS_PER} applications ({results} results, each of the \
         {POLICY_APPS} applications reported by {} connectors), one report per change, every \
         {:.1} s; each window less the idle window after the last (sessions and heartbeats \
         only, {}) at its rate; the windows on the connections that stored the first reports \
         (their counts published by 11 s idle), each ending with PostgreSQL's counts \
         published; one CA and PostgreSQL 15 on this shared 2-core machine",
        results / POLICY_APPS,
        round.as_secs_f64(),
        idle_work.describe(),
    );
    let setup = format!(
        "{percent} % of the applications ({}) flipped Up↔Down each round for {rounds} rounds, \
         every connector that reports one sending its new result; {sent} changes reported, \
         {stored} transitions stored in health_events, window {}; {common}",
        Flaps::Applications.per_round(results, percent),
        Work::between(&s0, &s1).describe(),
    );
    let split_setup = format!(
        "after the applications' window, {percent} % of the (application, connector) results \
         ({}) flipped on their own each round for {split_rounds} rounds, so that connectors \
         disagree about an application and its address's result changes with most reports; \
         {split_sent} changes reported, {split_stored} transitions stored, window {}; {common}",
        Flaps::Results.per_round(results, percent),
        Work::between(&s1, &s2).describe(),
    );
    let mut figures = transition_figures(&each, &setup)?;
    figures.extend(disagreeing_figures(&split, &split_setup)?);
    Ok(figures)
}

fn transition_figures(each: &Work, setup: &str) -> Result<Vec<Figure>> {
    if each.pg_cpu <= 0.0 || each.ca_cpu <= 0.0 {
        bail!(
            "the CPU per transition came out at PostgreSQL {:.1} µs, CA {:.1} µs (not above the \
             idle window's; machine load): not measured; {setup}",
            each.pg_cpu * 1e6,
            each.ca_cpu * 1e6
        );
    }
    let at_half = 0.5 / each.pg_cpu;
    let ca_full = 1.0 / each.ca_cpu;
    let mut figures = vec![SPECS[0].figure(
        each.commits,
        None,
        format!("committed transactions (pg_stat_database.xact_commit) per transition; {setup}"),
    )];
    figures.extend(written_figures(&SPECS[1..4], each, setup));
    figures.extend([
        SPECS[4].figure(each.ca_cpu * 1e6, None, format!("the CA process's CPU per transition (receiving the report, the health table, the history pump); {setup}")),
        SPECS[5].figure(
            at_half,
            Some(ca_full),
            format!(
                "0.5 core / PostgreSQL CPU per transition, against the transitions/s at which the \
                 CA is at a full core (1 / its CPU per transition = {ca_full:.0}/s): the database \
                 is never the bottleneck before the CA is; {setup}"
            ),
        ),
    ]);
    Ok(figures)
}

/// The rows, WAL bytes and PostgreSQL CPU per transition of `each`, as
/// the three `specs` in that order.
fn written_figures(specs: &[Spec], each: &Work, setup: &str) -> Vec<Figure> {
    vec![
        specs[0].figure(each.rows, None, format!("rows inserted + updated + deleted (pg_stat_database) per transition; {setup}")),
        specs[1].figure(each.wal, None, format!("WAL bytes (pg_current_wal_lsn() difference) per transition; {setup}")),
        specs[2].figure(each.pg_cpu * 1e6, None, format!("CPU of the postmaster and every PostgreSQL process (/proc, utime+stime, reaped children included) per transition; {setup}")),
    ]
}

fn disagreeing_figures(each: &Work, setup: &str) -> Result<Vec<Figure>> {
    if each.pg_cpu <= 0.0 {
        bail!(
            "PostgreSQL's CPU per disagreeing transition came out at {:.1} µs (not above the \
             idle window's; machine load): not measured; {setup}",
            each.pg_cpu * 1e6
        );
    }
    Ok(written_figures(&SPECS[6..9], each, setup))
}

/// Waits for the TLS CA's generated root; its PEM.
async fn root(dir: &Path) -> Result<String> {
    let path = dir.join("reach-ca-data").join("ca.pem");
    let p = path.clone();
    ca::wait_until(Duration::from_secs(15), "the CA's root", || {
        let p = p.clone();
        async move { Ok(p.exists()) }
    })
    .await?;
    // The file may be seen before it is written whole.
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
}

/// `db_enroll_*` and `db_renew_*` on database `url`.
async fn enrollments(mode: Mode, url: &str) -> Result<Vec<Figure>> {
    let n = mode.pick(20usize, 200);
    let (server, dir) = ca::start_text(&config(url, true)).await?;
    let ca_pem = connector_agent::ca::trust::Trust::fixed(&root(&dir).await?);
    let stats = PgStats::connect(url).await?;
    let target = CaTarget {
        url: CaUrl::parse(&format!("https://{}", server.grpc)).map_err(|e| anyhow!(e))?,
        addr: None,
    };
    let states = dir.join("connectors");
    // Warm-up: the first enrollment pays for the CA's lazy start-up work.
    enroll_one(&target, &ca_pem, &states, "warm").await?;
    // Each window ends with the CA idle and its connections' statistics
    // published (`PgStats::publish`); the CA has no session, so its only
    // background work is its replica heartbeat.
    stats.publish().await?;
    let s1 = snap(&stats, server.pid()).await?;
    let mut names = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("e-{i:04}");
        enroll_one(&target, &ca_pem, &states, &name).await?;
        names.push(name);
    }
    stats.publish().await?;
    let s2 = snap(&stats, server.pid()).await?;
    for name in &names {
        let dir = states.join(name);
        let current = enroll::load(&dir, name, ENROLL_GROUP, &ca_pem)?
            .ok_or_else(|| anyhow!("{name}: no enrollment in {}", dir.display()))?;
        enroll::renew(&target, &current, &dir, name, ENROLL_GROUP)
            .await
            .with_context(|| format!("renewing {name}"))?;
    }
    stats.publish().await?;
    let s3 = snap(&stats, server.pid()).await?;
    drop(server);
    let enrolled = Work::between(&s1, &s2);
    let renewed = Work::between(&s2, &s3);
    let setup = |what: &str, w: &Work| {
        format!(
            "{n} {what} in sequence by the connector's own calls (connector_agent::ca::enroll: key \
             pair, CSR, TLS to the CA, state files written) on a TLS CA with its own fresh \
             PostgreSQL database and no sessions; window {} (the CA's replica heartbeat \
             included), the CA's connections ended at its end so PostgreSQL published their \
             counts; PostgreSQL CPU {:.0} µs and CA CPU {:.0} µs each; shared 2-core machine",
            w.describe(),
            w.pg_cpu / n as f64 * 1e6,
            w.ca_cpu / n as f64 * 1e6,
        )
    };
    let (e, r) = (enrolled.per(n as f64), renewed.per(n as f64));
    let (se, sr) = (setup("enrollments", &enrolled), setup("renewals", &renewed));
    Ok(vec![
        SPECS[9].figure(e.commits, None, format!("committed transactions per enrollment; {se}")),
        SPECS[10].figure(e.rows, None, format!("rows written per enrollment; {se}")),
        SPECS[11].figure(e.wal, None, format!("WAL bytes per enrollment; {se}")),
        SPECS[12].figure(r.commits, None, format!("committed transactions per renewal (Renew over mutual TLS with the current certificate); {sr}")),
        SPECS[13].figure(r.rows, None, format!("rows written per renewal; {sr}")),
        SPECS[14].figure(r.wal, None, format!("WAL bytes per renewal; {sr}")),
    ])
}

/// One enrollment as `connector-agent enroll` makes it, into `states/name`.
async fn enroll_one(
    target: &CaTarget,
    ca_pem: &connector_agent::ca::trust::Trust,
    states: &Path,
    name: &str,
) -> Result<PathBuf> {
    let dir = states.join(name);
    std::fs::create_dir_all(&dir)?;
    enroll::enroll(target, ca_pem, &dir, name, ENROLL_GROUP, &ENROLL_KEY.into())
        .await
        .with_context(|| format!("enrolling {name}"))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(secs: f64, commits: f64, rows: f64) -> Work {
        Work {
            secs,
            commits,
            rows,
            wal: rows * 100.0,
            pg_cpu: secs / 10.0,
            ca_cpu: secs / 20.0,
        }
    }

    /// The idle rate is taken off in proportion to the window's length,
    /// and a count never goes below 0.
    #[test]
    fn the_idle_rate_is_taken_off_and_counts_stay_at_or_above_zero() {
        let idle = work(2.0, 10.0, 4.0);
        let busy = work(4.0, 25.0, 100.0).less(&idle);
        assert_eq!((busy.commits, busy.rows, busy.wal), (5.0, 92.0, 9_200.0));
        let quiet = work(4.0, 15.0, 100.0).less(&idle);
        assert_eq!(quiet.commits, 0.0, "fewer than the idle rate predicts");
        assert_eq!(quiet.rows, 92.0);
    }
}
