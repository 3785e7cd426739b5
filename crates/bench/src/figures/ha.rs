//! High availability: CA replicas sharing one real PostgreSQL
//! database (`test_support::Postgres` starts it for the run), each a
//! `serve-ca` child process. Side by side in one run:
//!
//! - **Enrollment latency** on PostgreSQL against SQLite: two single CAs
//!   over TLS, enrolled into alternately by `connector_agent::enroll_only`
//!   (the connector's own enrollment: key pair, CSR, TLS to the CA,
//!   `Enroll` with the provisioning key, the state files written).
//! - **Revoke to close**: two TLS replicas A and B on one database, the
//!   real connector agent (in this process) attached to both; `POST
//!   /api/v1/connectors/NAME/revoke` on A, then B's `GET /api/v1/connectors`
//!   polled every 5 ms until the connector is no longer connected there.
//! - **Connector cost per replica**: the real `connector-agent` binary (a
//!   child process, next to `reach-bench`) checking N loopback targets, once
//!   attached to 1 replica and once to 3 (`--ca` repeated), each replica
//!   behind a counting TCP relay in this process: CPU from `/proc`, bytes
//!   the connector sent toward the CAs (TCP payload) and checks from its
//!   own `/metrics`, over the same window. The checks alone (scheduler,
//!   pacer and prober wired as the agent wires them, no session) run in a
//!   `connector-checks` child, so the reporting part of the CPU is known.
//! - **Ingestion per replica**: the `ingest` group's simulated connector
//!   streams into 1 replica alone, then into 3 replicas at once.
//!
//! All traffic goes to loopback.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use connector_agent::{Config, IcmpPreference};
use policy::{AppEntry, HealthReporting, PortRange, Segment};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::Spec;
use super::ca::{self, TOKEN};
use super::cluster::{Replica, replica_config};
use super::ingest;
use crate::Mode;
use crate::pg::PgHost;
use crate::report::{Figure, Goal};
use crate::stats::{median, median_of, ms, quantile};
use crate::sys;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "ha_enroll_p50_ms",
        unit: "ms",
        goal: Goal::Info,
    },
    Spec {
        name: "ha_enroll_p99_ms",
        unit: "ms",
        goal: Goal::Info,
    },
    Spec {
        name: "ha_revoke_to_close_ms",
        unit: "ms",
        goal: Goal::AtMost { limit: 2000.0 },
    },
    Spec {
        name: "ha_connector_cpu_per_replica",
        unit: "µs CPU/check",
        goal: Goal::RatioAtMost { ratio: 1.1 },
    },
    Spec {
        name: "ha_connector_bytes_per_replica",
        unit: "B/check",
        goal: Goal::RatioAtMost { ratio: 1.1 },
    },
    Spec {
        name: "ha_connector_checks_per_s_3_vs_1",
        unit: "checks/s",
        goal: Goal::RatioAtMost { ratio: 1.1 },
    },
    Spec {
        name: "ha_ingest_per_replica_3_vs_1",
        unit: "updates/s",
        goal: Goal::Info,
    },
];

/// The real connector's group (its own, so it is not assigned the
/// `ingest` segment the simulated connectors report on).
const HA_GROUP: &str = "ha";
/// Its provisioning key.
const HA_KEY: &str = "ha-bench-provisioning-key-16k7POB64F4rZAEJTzOfts19";
/// The real connector's segment.
const SEGMENT: &str = "ha";
/// Report interval of the segment: every target is checked once a second.
const INTERVAL_S: u64 = 1;

/// The `k`-th target address (127.30.x.y).
fn target_ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 30, (k / 250) as u8, (k % 250) as u8 + 1)
}

/// N accepting TCP listeners on 127.30.0.1… sharing one port: the targets.
struct Targets {
    port: u16,
    n: usize,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Targets {
    async fn start(n: usize) -> Result<Targets> {
        let first = TcpListener::bind(SocketAddr::new(IpAddr::V4(target_ip(0)), 0)).await?;
        let port = first.local_addr()?.port();
        let mut listeners = vec![first];
        for k in 1..n {
            let at = SocketAddr::new(IpAddr::V4(target_ip(k)), port);
            listeners.push(
                TcpListener::bind(at)
                    .await
                    .with_context(|| format!("binding target {at}"))?,
            );
        }
        let tasks = listeners
            .into_iter()
            .map(|l| {
                tokio::spawn(async move {
                    while let Ok((s, _)) = l.accept().await {
                        drop(s);
                    }
                })
            })
            .collect();
        Ok(Targets { port, n, tasks })
    }

    /// The CA's group `ha` and its continuous segment of the targets.
    fn toml(&self) -> String {
        targets_toml(self.port, self.n)
    }
}

/// Group `ha` and its continuous segment of `n` targets on `port`.
fn targets_toml(port: u16, n: usize) -> String {
    let apps: Vec<String> = (0..n).map(|k| format!("\"{}\"", target_ip(k))).collect();
    format!(
        r#"
[[connector_groups]]
name = "{HA_GROUP}"
provisioning_key = "{HA_KEY}"
# Every enrollment of the figures uses it.
max_uses = 1000000

[[segments]]
name = "{SEGMENT}"
applications = [{}]
tcp_ports = ["{port}"]
health_reporting = "continuous"
report_interval_s = {INTERVAL_S}
connector_groups = ["{HA_GROUP}"]
"#,
        apps.join(", ")
    )
}

impl Drop for Targets {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Whether `base`'s `GET /api/v1/connectors` lists `name` as connected.
pub(crate) async fn connected(http: &reqwest::Client, base: &str, name: &str) -> Result<bool> {
    let v = ca::get_json(http, base, "/api/v1/connectors").await?;
    Ok(v["connectors"].as_array().is_some_and(|list| {
        list.iter()
            .any(|c| c["name"] == name && c["connected"] == true)
    }))
}

/// A reqwest client trusting only `root`.
fn tls_client(root: &Path) -> Result<reqwest::Client> {
    let pem = std::fs::read(root).with_context(|| format!("reading {}", root.display()))?;
    Ok(reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&pem)?])
        .timeout(Duration::from_secs(10))
        .build()?)
}

pub(crate) fn scratch(what: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir()
        .join(format!("reach-bench-{}", std::process::id()))
        .join(what);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A real connector's configuration for `urls`, in group `ha`.
fn agent_config(urls: &[String], name: &str, root: &Path, state: PathBuf) -> Config {
    let mut config = Config::new(urls[0].clone(), name, HA_GROUP);
    config.ca = urls.to_vec();
    config.ca_cert = Some(root.to_owned());
    config.state_dir = state;
    config.provisioning_key = Some(HA_KEY.into());
    config.icmp = IcmpPreference::Off;
    config
}

/// One enrollment as the connector makes it; its duration.
async fn enroll_once(url: &str, root: &Path, dir: &Path, name: &str) -> Result<Duration> {
    let config = agent_config(&[url.to_owned()], name, root, dir.join(name));
    let t = Instant::now();
    connector_agent::enroll_only(&config)
        .await
        .with_context(|| format!("enrolling {name} at {url}"))?;
    Ok(t.elapsed())
}

/// Enrollment latencies on SQLite and PostgreSQL, alternately (sorted).
async fn enrollments(
    sqlite: &Replica,
    pg: &Replica,
    n: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let dir = scratch("enroll")?;
    let (root_s, root_p) = (sqlite.root().await?, pg.root().await?);
    // Warm-up: the first of each pays for the CA's lazy start-up work.
    enroll_once(&sqlite.https_grpc(), &root_s, &dir, "warm-s").await?;
    enroll_once(&pg.https_grpc(), &root_p, &dir, "warm-p").await?;
    let (mut s, mut p) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        s.push(enroll_once(&sqlite.https_grpc(), &root_s, &dir, &format!("e-s-{i}")).await?);
        p.push(enroll_once(&pg.https_grpc(), &root_p, &dir, &format!("e-p-{i}")).await?);
    }
    s.sort();
    p.sort();
    Ok((s, p))
}

/// Revoke on `a` to the connector's session on `b` closed, per trial.
async fn revokes(a: &Replica, b: &Replica, trials: usize) -> Result<Vec<Duration>> {
    let root = a.root().await?;
    let http = tls_client(&root)?;
    let (base_a, base_b) = (
        format!("https://{}", a.server.http),
        format!("https://{}", b.server.http),
    );
    let urls = [a.https_grpc(), b.https_grpc()];
    let dir = scratch("revoke")?;
    let mut out = Vec::with_capacity(trials);
    for k in 0..trials {
        let name = format!("revoke-{k}");
        let mut config = agent_config(&urls, &name, &root, dir.join(&name));
        // The targets are IP literals; nothing is resolved by name.
        config.dns_server = Some("127.0.5.2:53".parse()?);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let agent = tokio::spawn(connector_agent::run(config, async move {
            let _ = stop_rx.await;
        }));
        for base in [&base_a, &base_b] {
            ca::wait_until(
                Duration::from_secs(30),
                "the connector to attach to both replicas",
                || {
                    let (http, base, name) = (http.clone(), base.clone(), name.clone());
                    async move { connected(&http, &base, &name).await }
                },
            )
            .await?;
        }
        let t = Instant::now();
        let status = http
            .post(format!("{base_a}/api/v1/connectors/{name}/revoke"))
            .bearer_auth(TOKEN)
            .send()
            .await?
            .status();
        if !status.is_success() {
            bail!("revoke of {name} on replica A answered {status}");
        }
        loop {
            if !connected(&http, &base_b, &name).await? {
                break;
            }
            if t.elapsed() > Duration::from_secs(30) {
                bail!("{name}'s session on replica B still open 30 s after the revoke on A");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        out.push(t.elapsed());
        let _ = stop_tx.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), agent).await;
    }
    Ok(out)
}

/// A TCP relay to `to` that counts the bytes its clients send.
struct Relay {
    addr: SocketAddr,
    sent: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(to: SocketAddr) -> Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let sent = Arc::new(AtomicU64::new(0));
        let counter = sent.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(to).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let back = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    });
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                counter.fetch_add(n as u64, Ordering::Relaxed);
                                if sw.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    back.abort();
                });
            }
        });
        Ok(Relay { addr, sent, task })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What one connector run measured over its window.
#[derive(Clone, Copy, Debug, Default)]
struct AgentRun {
    cpu_s: f64,
    switches: u64,
    bytes: u64,
    checks: u64,
    window_s: f64,
}

impl AgentRun {
    fn cpu_us_per_check(&self) -> f64 {
        self.cpu_s * 1e6 / self.checks.max(1) as f64
    }
    fn switches_per_check(&self) -> f64 {
        self.switches as f64 / self.checks.max(1) as f64
    }
    fn bytes_per_check(&self) -> f64 {
        self.bytes as f64 / self.checks.max(1) as f64
    }
    fn checks_per_s(&self) -> f64 {
        self.checks as f64 / self.window_s.max(f64::MIN_POSITIVE)
    }
}

/// The sum of the `reach_agent_checks_total` lines of a `/metrics` text.
fn checks_in(text: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("reach_agent_checks_total"))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The `connector-agent` binary built next to `reach-bench`.
pub(crate) fn agent_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating reach-bench")?;
    let path = exe.with_file_name("connector-agent");
    if !path.exists() {
        bail!(
            "{} is missing: build it with `cargo build --release -p connector-agent` \
             (`cargo xtask bench` does)",
            path.display()
        );
    }
    Ok(path)
}

/// The real connector attached through `relays` to `replicas` (their
/// HTTP bases, to see it connected), checking the targets at `rate`;
/// measured over `window` after `warm`.
async fn agent_run(
    relays: &[&Relay],
    bases: &[String],
    rate: u32,
    warm: Duration,
    window: Duration,
    tag: &str,
) -> Result<AgentRun> {
    let name = format!("ha-agent-{tag}");
    let state = scratch(&format!("agent-{tag}"))?;
    let metrics = test_support::free_port()?;
    // Profiling aid: `REACH_BENCH_WRAP_AGENT="valgrind --tool=callgrind"`
    // runs the agent under that command; under callgrind its counts are
    // zeroed when the window starts and dumped when it ends
    // (`callgrind.out.PID.N` in the working directory), so the dump holds
    // the window's instructions alone.
    let wrap: Vec<String> = std::env::var("REACH_BENCH_WRAP_AGENT")
        .map(|w| w.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    let callgrind = wrap.iter().any(|w| w.contains("callgrind"));
    let (warm, window, attach) = if wrap.is_empty() {
        (warm, window, Duration::from_secs(30))
    } else {
        // A wrapped agent starts and runs far more slowly.
        (
            warm.max(Duration::from_secs(10)),
            window.max(Duration::from_secs(20)),
            Duration::from_secs(300),
        )
    };
    let mut command = match wrap.split_first() {
        Some((program, rest)) => {
            let mut c = tokio::process::Command::new(program);
            c.args(rest).arg(agent_binary()?);
            c
        }
        None => tokio::process::Command::new(agent_binary()?),
    };
    for r in relays {
        command.arg("--ca").arg(format!("http://{}", r.addr));
    }
    command
        .args(["--name", &name, "--group", HA_GROUP, "--icmp", "off"])
        .arg("--state-dir")
        .arg(&state)
        .args(["--checks-per-second", &rate.to_string()])
        .args(["--max-checks-per-second", &rate.to_string()])
        // The targets are IP literals; nothing is resolved by name.
        .args(["--dns-server", "127.0.5.2:53"])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .env("REACH_PROVISIONING_KEY", HA_KEY)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut child = command.spawn().context("starting connector-agent")?;
    let pid = child.id();
    let http = reqwest::Client::new();
    for base in bases {
        ca::wait_until(attach, "the connector to attach to every replica", || {
            let (http, base, name) = (http.clone(), base.clone(), name.clone());
            async move { connected(&http, &base, &name).await }
        })
        .await?;
    }
    tokio::time::sleep(warm).await;
    if callgrind && let Some(pid) = pid {
        callgrind_control("-z", pid).await?;
    }
    let metrics_url = format!("http://127.0.0.1:{metrics}/metrics");
    let sent = || {
        relays
            .iter()
            .map(|r| r.sent.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let (cpu0, bytes0, checks0, t0) = (
        sys::thread_times(pid),
        sent(),
        scrape_checks(&http, &metrics_url).await?,
        Instant::now(),
    );
    tokio::time::sleep(window).await;
    let (cpu1, bytes1, checks1, window_s) = (
        sys::thread_times(pid),
        sent(),
        scrape_checks(&http, &metrics_url).await?,
        t0.elapsed().as_secs_f64(),
    );
    if callgrind && let Some(pid) = pid {
        callgrind_control("-d", pid).await?;
    }
    if let Some(status) = child.try_wait()? {
        bail!("connector-agent exited during the run: {status}");
    }
    let _ = child.kill().await;
    let spent = cpu0.until(&cpu1);
    Ok(AgentRun {
        cpu_s: spent.cpu.as_secs_f64(),
        switches: spent.switches,
        bytes: bytes1.saturating_sub(bytes0),
        checks: checks1.saturating_sub(checks0),
        window_s,
    })
}

/// `callgrind_control FLAG PID` (`-z` zeroes the counts, `-d` dumps them).
async fn callgrind_control(flag: &str, pid: u32) -> Result<()> {
    let status = tokio::process::Command::new("callgrind_control")
        .arg(flag)
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .status()
        .await
        .context("running callgrind_control")?;
    if !status.success() {
        bail!("callgrind_control {flag} {pid}: {status}");
    }
    Ok(())
}

/// The agent's checks so far, from its `/metrics` at `url`.
pub(crate) async fn scrape_checks(http: &reqwest::Client, url: &str) -> Result<u64> {
    let text = http
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    Ok(checks_in(&text))
}

/// What `reach-bench connector-checks` prints.
#[derive(Debug, Serialize, Deserialize)]
pub struct ChecksReport {
    /// CPU over the window, seconds.
    pub cpu_s: f64,
    /// Context switches over the window.
    pub switches: u64,
    /// Checks finished in the window.
    pub checks: u64,
}

/// `reach-bench connector-checks PORT N RATE SECONDS` (in the child): the
/// agent's scheduler, pacer and prober (no session) checking the `N`
/// targets on `PORT` every second at most `RATE` checks/s; after a second
/// of warm-up, prints its CPU and checks over `SECONDS` as one JSON line.
pub async fn checks_child(port: u16, targets: usize, rate: u32, seconds: f64) -> Result<()> {
    use connector_agent::checks::pacer::Pacer;
    use connector_agent::checks::probe::Prober;
    use connector_agent::metrics::Metrics;
    use connector_agent::resolver::{Resolver, TtlBounds};
    use connector_agent::schedule::Scheduler;
    let metrics = Metrics::new();
    let resolver = Resolver::new(Some("127.0.5.2:53".parse()?), TtlBounds::default())?;
    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_secs(1)));
    let (pacer, _pacer_task) = Pacer::spawn(prober, rate, 256, metrics.clone());
    let (reports_tx, mut reports_rx) = tokio::sync::mpsc::unbounded_channel();
    let (scheduler, _task) = Scheduler::spawn(resolver, pacer, metrics.clone(), reports_tx);
    tokio::spawn(async move { while reports_rx.recv().await.is_some() {} });
    let segment = Segment {
        check: policy::AppCheck::default(),
        name: SEGMENT.to_owned(),
        applications: (0..targets)
            .map(|k| AppEntry::Ip(IpAddr::V4(target_ip(k))))
            .collect(),
        tcp_ports: PortRange::single(port).into_iter().collect(),
        udp_ports: Vec::new(),
        health_reporting: HealthReporting::Continuous,
        report_interval: Duration::from_secs(INTERVAL_S),
        multimatch: false,
        client_hostname_validation: false,
        connector_groups: vec![HA_GROUP.to_owned()],
        damping: policy::Damping::default(),
        strategy: None,
    };
    scheduler
        .apply(vec![segment], Duration::from_secs(1800))
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let checks = || -> Result<u64> { Ok(checks_in(&metrics.encode()?)) };
    let (cpu0, checks0) = (sys::thread_times(None), checks()?);
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let (cpu1, checks1) = (sys::thread_times(None), checks()?);
    let spent = cpu0.until(&cpu1);
    let report = ChecksReport {
        cpu_s: spent.cpu.as_secs_f64(),
        switches: spent.switches,
        checks: checks1.saturating_sub(checks0),
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

/// Runs the `connector-checks` child on `targets`.
async fn checks_only(targets: &Targets, rate: u32, window: Duration) -> Result<ChecksReport> {
    crate::servers::child_result(
        &[
            "connector-checks".to_owned(),
            targets.port.to_string(),
            targets.n.to_string(),
            rate.to_string(),
            window.as_secs_f64().to_string(),
        ],
        "connector-checks",
    )
    .await
}

/// The figures of `specs`, or each missing with `result`'s error.
fn part(specs: &[Spec], result: Result<Vec<Figure>>) -> Vec<Figure> {
    match result {
        Ok(f) => f,
        Err(e) => {
            eprintln!("reach-bench: ha: {e:#}");
            specs
                .iter()
                .map(|s| s.missing(format!("not measured: {e:#}")))
                .collect()
        }
    }
}

/// Measures every figure (quick: small counts and short windows); a part
/// that fails yields its own figures as missing, with the reason.
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let targets = Targets::start(mode.pick(20, 200)).await?;
    let pg = PgHost::start().await?;
    let mut figures = Vec::new();
    let db = pg.fresh_database().await?;
    figures.extend(part(
        &SPECS[..3],
        enroll_and_revoke(mode, &db, &targets.toml()).await,
    ));
    // 3 and 4 on three plain-text replicas of another database.
    let db = pg.fresh_database().await?;
    let mut replicas = Vec::new();
    for i in 1..=3 {
        replicas.push(
            Replica::start(&replica_config(
                Some(&db),
                &format!("r{i}"),
                None,
                ingest::APPS,
                &targets.toml(),
            ))
            .await?,
        );
    }
    figures.extend(part(
        &SPECS[3..6],
        connector_figures(mode, &targets, &replicas).await,
    ));
    figures.extend(part(
        &SPECS[6..],
        ingest_figure(mode, &replicas).await.map(|f| vec![f]),
    ));
    drop(replicas);
    drop(targets);
    pg.stop().await;
    Ok(figures)
}

/// `ha_enroll_*` and `ha_revoke_to_close_ms` on database `db`.
async fn enroll_and_revoke(mode: Mode, db: &str, targets: &str) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    // 1. Enrollment latency, PostgreSQL against SQLite.
    let n = mode.pick(20usize, 300);
    let sqlite = Replica::start(&replica_config(None, "s1", Some(None), 0, targets)).await?;
    let a = Replica::start(&replica_config(Some(db), "a", Some(None), 0, targets)).await?;
    let (s, p) = enrollments(&sqlite, &a, n).await?;
    drop(sqlite);
    let note = |q: &str| {
        format!(
            "{n} enrollments into each CA (TLS, alternating PostgreSQL and SQLite, after one \
             warm-up each) by connector_agent::enroll_only as `connector-agent enroll` makes \
             them: key pair + CSR, TLS handshake, Enroll with the provisioning key, state files \
             written; value PostgreSQL {q}, baseline SQLite {q}; PostgreSQL p50/p90/max {:.1}/\
             {:.1}/{:.1} ms, SQLite {:.1}/{:.1}/{:.1} ms; PostgreSQL and the CAs on this machine",
            ms(quantile(&p, 0.5)),
            ms(quantile(&p, 0.9)),
            ms(quantile(&p, 1.0)),
            ms(quantile(&s, 0.5)),
            ms(quantile(&s, 0.9)),
            ms(quantile(&s, 1.0)),
        )
    };
    figures.push(SPECS[0].figure(
        ms(quantile(&p, 0.5)),
        Some(ms(quantile(&s, 0.5))),
        note("p50"),
    ));
    figures.push(SPECS[1].figure(
        ms(quantile(&p, 0.99)),
        Some(ms(quantile(&s, 0.99))),
        note("p99"),
    ));

    // 2. Revoke on A to the session on B closed.
    let trials = mode.pick(3usize, 10);
    let root_dir = a.data.clone();
    a.root().await?;
    let b = Replica::start(&replica_config(
        Some(db),
        "b",
        Some(Some(root_dir.as_path())),
        0,
        targets,
    ))
    .await?;
    let mut closed = revokes(&a, &b, trials).await?;
    drop(b);
    drop(a);
    closed.sort();
    figures.push(SPECS[2].figure(
        ms(quantile(&closed, 1.0)),
        None,
        format!(
            "max over {trials} trials (p50 {:.0} ms; all: {}): POST /api/v1/connectors/NAME/revoke \
             on replica A to the connector's session on replica B gone from B's \
             GET /api/v1/connectors (polled every 5 ms); two TLS replicas on one PostgreSQL \
             database (LISTEN/NOTIFY, 1 s reconcile as the fallback), the real agent attached \
             to both",
            ms(quantile(&closed, 0.5)),
            closed
                .iter()
                .map(|d| format!("{:.0}", ms(*d)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ));
    Ok(figures)
}

/// `ha_connector_*`: alternating runs attached to 1 and to 3 replicas,
/// and the checks alone.
async fn connector_figures(
    mode: Mode,
    targets: &Targets,
    replicas: &[Replica],
) -> Result<Vec<Figure>> {
    // More, shorter alternating trials than one long window each: the
    // medians follow the machine's load less.
    let trials = mode.pick(1usize, 3);
    let warm = mode.pick(Duration::from_millis(1500), Duration::from_secs(2));
    let window = mode.pick(Duration::from_secs(3), Duration::from_secs(6));
    // Room above the targets' natural rate (one check each per second).
    let rate = (targets.n as u32 * 2).max(20);
    let mut relays = Vec::new();
    for r in replicas {
        relays.push(Relay::start(r.server.grpc).await?);
    }
    let bases: Vec<String> = replicas
        .iter()
        .map(|r| format!("http://{}", r.server.http))
        .collect();
    // Alternating (1 replica, 3 replicas, checks alone) so that a change
    // in the machine's load reaches the three alike.
    let (mut one, mut three, mut alone) = (Vec::new(), Vec::new(), Vec::new());
    for k in 0..trials {
        one.push(
            agent_run(
                &[&relays[0]],
                &bases[..1],
                rate,
                warm,
                window,
                &format!("1-{k}"),
            )
            .await?,
        );
        let all: Vec<&Relay> = relays.iter().collect();
        three.push(agent_run(&all, &bases, rate, warm, window, &format!("3-{k}")).await?);
        alone.push(checks_only(targets, rate, window).await?);
    }
    let check_us = median_of(&alone, |a| a.cpu_s * 1e6 / a.checks.max(1) as f64);
    let check_switches = median_of(&alone, |a| a.switches as f64 / a.checks.max(1) as f64);
    let switches1 = median_of(&one, AgentRun::switches_per_check);
    let switches3 = median_of(&three, AgentRun::switches_per_check);
    let alone_checks: u64 = alone.iter().map(|a| a.checks).sum();
    let cpu1 = median_of(&one, AgentRun::cpu_us_per_check);
    let cpu3 = median_of(&three, AgentRun::cpu_us_per_check);
    let bytes1 = median_of(&one, AgentRun::bytes_per_check);
    let bytes3 = median_of(&three, AgentRun::bytes_per_check);
    let rate1 = median_of(&one, AgentRun::checks_per_s);
    let rate3 = median_of(&three, AgentRun::checks_per_s);
    let runs = |runs: &[AgentRun]| {
        runs.iter()
            .map(|r| {
                format!(
                    "{:.3} s CPU, {} switches, {} B, {} checks in {:.1} s",
                    r.cpu_s, r.switches, r.bytes, r.checks, r.window_s
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let setup = format!(
        "real connector-agent (child process) checking {} loopback TCP targets once a second \
         (pacer {rate}/s), attached over plain text to 1 or 3 replicas (`--ca` repeated), \
         {trials} alternating trials per count, {:.0} s windows after {:.1} s of warm-up, \
         medians; 1 replica: {}; 3 replicas: {}",
        targets.n,
        window.as_secs_f64(),
        warm.as_secs_f64(),
        runs(&one),
        runs(&three)
    );
    // The reporting part is a difference of two noisy CPU readings: when it
    // is not above zero it was not measured, and the figure says so (no
    // baseline: the goal is then not met) rather than show a meaningless
    // ratio.
    let reporting1 = cpu1 - check_us;
    let cpu_note = format!(
        "CPU (time on a CPU of every thread, /proc/PID/task/*/schedstat, ns resolution) per \
         check of what each extra replica adds, (3 replicas − 1 replica) / 2 = ({cpu3:.1} − \
         {cpu1:.1}) / 2, against the single replica's reporting part: its CPU per check minus \
         the checks alone ({check_us:.1} µs, median: the agent's scheduler, pacer and prober \
         without a session, in a child, {alone_checks} checks in {trials} runs alternating with \
         the others){}; context switches per check (load-independent: task wake-ups across \
         threads): checks alone {check_switches:.2}, 1 replica {switches1:.2}, 3 replicas \
         {switches3:.2}; {setup}",
        if reporting1 > 0.0 {
            String::new()
        } else {
            format!(
                "; the single replica's reporting part came out at {reporting1:.1} µs/check, \
                 within the noise of the CPU readings (machine load): not measured"
            )
        }
    );
    Ok(vec![
        SPECS[3].figure(
            (cpu3 - cpu1) / 2.0,
            (reporting1 > 0.0).then_some(reporting1),
            cpu_note,
        ),
        SPECS[4].figure(
            (bytes3 - bytes1) / 2.0,
            Some(bytes1),
            format!(
                "bytes the connector sent toward the CAs (TCP payload, counted by a relay in \
                 front of each replica) per check, what each extra replica adds, (3 replicas − \
                 1 replica) / 2 = ({bytes3:.1} − {bytes1:.1}) / 2, against the single replica's; \
                 {setup}"
            ),
        ),
        SPECS[5].figure(
            rate3,
            Some(rate1),
            format!(
                "checks/s (the agent's reach_agent_checks_total) attached to 3 replicas against \
                 1: one schedule and one pacer, checks not repeated per replica; {setup}"
            ),
        ),
    ])
}

/// `ha_ingest_per_replica_3_vs_1`: the `ingest` group's simulated
/// connector streaming into replica 1 alone, then into all three at once.
async fn ingest_figure(mode: Mode, replicas: &[Replica]) -> Result<Figure> {
    let trials = mode.pick(1usize, 3);
    let duration = mode.pick(Duration::from_millis(500), Duration::from_secs(3));
    ingest::reach(&replicas[0].server, Duration::from_millis(200)).await?;
    let (mut one, mut three, mut sums) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..trials {
        let (n, t) = ingest::reach(&replicas[0].server, duration).await?;
        one.push(n as f64 / t);
        let each = futures::future::try_join_all(
            replicas.iter().map(|r| ingest::reach(&r.server, duration)),
        )
        .await?;
        let rates: Vec<f64> = each.iter().map(|(n, t)| *n as f64 / t).collect();
        sums.push(rates.iter().sum::<f64>());
        three.push(median(&rates));
    }
    Ok(SPECS[6].figure(
        median(&three),
        Some(median(&one)),
        format!(
            "updates/s one replica absorbs (the ingest group's simulated connector, {} streams, \
             one-application reports, per replica) with 3 replicas taking the stream at once \
             (median replica) against 1 replica alone; {trials} alternating trials of {:.1} s; \
             3 replicas together {:.0} updates/s; all replicas, PostgreSQL and the driver share \
             this machine's cores, so the ratio shows the cores per replica, not a limit of \
             the design",
            ingest::STREAMS,
            duration.as_secs_f64(),
            median(&sums)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_are_summed_over_every_label_set() {
        let text = "# HELP reach_agent_checks Checks finished\n\
            reach_agent_checks_total{method=\"tcp\",result=\"up\"} 40\n\
            reach_agent_checks_total{method=\"tcp\",result=\"down\"} 2\n\
            reach_agent_checks_in_flight 3\n\
            reach_agent_check_duration_seconds_count 99\n";
        assert_eq!(checks_in(text), 42);
        assert_eq!(checks_in(""), 0);
    }

    #[test]
    fn replica_configurations_are_valid_ca_configurations() {
        let dir = std::env::temp_dir();
        let targets = targets_toml(9000, 3);
        let issuer = dir.join("issuer");
        for (store, tls) in [
            (None, Some(None)),
            (
                Some("postgres://reach@127.0.0.1:5432/x?sslmode=disable"),
                Some(None),
            ),
            (
                Some("postgres://reach@127.0.0.1:5432/x?sslmode=disable"),
                Some(Some(issuer.as_path())),
            ),
            (
                Some("postgres://reach@127.0.0.1:5432/x?sslmode=disable"),
                None,
            ),
        ] {
            let text = replica_config(store, "r1", tls, 10, &targets);
            let config = central_authority::Config::from_toml(&text, &dir);
            assert!(
                config.is_ok(),
                "{text}\n{:?}",
                config.err().map(|e| e.messages())
            );
            assert_eq!(text.contains("enabled = false"), tls.is_none(), "{text}");
            assert_eq!(
                text.contains("issuer_key_file"),
                matches!(tls, Some(Some(_)))
            );
        }
    }
}
