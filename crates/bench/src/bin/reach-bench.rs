//! `reach-bench`: the load driver behind `cargo xtask bench`. `run` measures
//! every figure against its bare baseline and writes `results.json`, and
//! exits non-zero naming every group that failed and every figure that was
//! not produced; the other subcommands are the child processes it measures.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use bench::Mode;
use bench::figures::{self, GROUPS};
use bench::report::{Results, table};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "reach-bench", about = "reach's benchmark load driver")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Measures the figures, prints the table, writes the JSON.
    Run {
        /// Smoke mode: seconds, small sizes; checks that everything runs.
        #[arg(long)]
        quick: bool,
        /// Only these groups (comma-separated): policy, tcp, appcheck, icmp, dns,
        /// pacing, memory, ingest, batching, access, cold, detect, scale,
        /// onaccess, starve, dashboard, sizes, spray, events, burst, ha, storm,
        /// database, startup, replicas, logstream, peers.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// criterion's output directory (`$CARGO_TARGET_DIR/criterion`).
        #[arg(long)]
        criterion: Option<PathBuf>,
        /// Where to write results.json.
        #[arg(long)]
        out: Option<PathBuf>,
        /// (testing the driver) Makes this group fail without running, so
        /// a test can prove that a failed group fails the run.
        #[arg(long, hide = true)]
        plant_failure: Option<String>,
    },
    /// (child) The CA on loopback with this configuration file.
    ServeCa { config: PathBuf },
    /// (child) The bare tonic and axum baselines.
    ServeBare {
        decision: Option<PathBuf>,
        json: Option<PathBuf>,
    },
    /// (child) A connector assigned this many targets; prints its RSS.
    ConnectorMem { targets: usize },
    /// (child) The connector's checks alone (no session): `targets`
    /// loopback targets on `port`, at most `rate` checks/s; prints its CPU
    /// and checks over `seconds`.
    ConnectorChecks {
        port: u16,
        targets: usize,
        rate: u32,
        seconds: f64,
    },
    /// (profiling) The `ingest` group's status-history writes alone:
    /// `batches` batches of `rows` transitions into a fresh SQLite file in
    /// `dir`, written by `replicas` stores sharing it.
    HistoryBatches {
        dir: PathBuf,
        #[arg(long, default_value_t = 20)]
        batches: usize,
        #[arg(long, default_value_t = 22_000)]
        rows: usize,
        #[arg(long, default_value_t = 1)]
        replicas: usize,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    // reqwest is built without a default TLS crypto provider in this
    // workspace; the driver speaks plain HTTP but reqwest wants one anyway.
    // An error means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    runtime.block_on(async move {
        match cli.command {
            Cmd::Run {
                quick,
                only,
                criterion,
                out,
                plant_failure,
            } => run(quick, &only, criterion, out, plant_failure.as_deref()).await,
            Cmd::ServeCa { config } => bench::servers::serve_ca(&config).await,
            Cmd::ServeBare { decision, json } => {
                bench::servers::serve_bare(decision.as_deref(), json.as_deref()).await
            }
            Cmd::ConnectorMem { targets } => figures::memory::child(targets).await,
            Cmd::ConnectorChecks {
                port,
                targets,
                rate,
                seconds,
            } => figures::ha::checks_child(port, targets, rate, seconds).await,
            Cmd::HistoryBatches {
                dir,
                batches,
                rows,
                replicas,
            } => figures::ingest::history_child(&dir, batches, rows, replicas),
        }
    })
}

/// Runs the groups, prints the table and writes the JSON; fails (after
/// both) if a group failed or a figure was not produced, naming each, so
/// that the smoke run in CI cannot pass with a figure lost.
async fn run(
    quick: bool,
    only: &[String],
    criterion: Option<PathBuf>,
    out: Option<PathBuf>,
    plant_failure: Option<&str>,
) -> Result<()> {
    let mode = if quick { Mode::Quick } else { Mode::Full };
    if let Some(unknown) = only.iter().find(|o| !GROUPS.contains(&o.as_str())) {
        bail!(
            "--only: no group named {unknown:?} (groups: {})",
            GROUPS.join(", ")
        );
    }
    let mut all = Vec::new();
    let mut failures = Vec::new();
    for &group in GROUPS {
        if !only.is_empty() && !only.iter().any(|o| o == group) {
            continue;
        }
        let t = Instant::now();
        eprintln!("reach-bench: {group} …");
        let result = match group {
            _ if plant_failure == Some(group) => Err(anyhow!(
                "planted failure (--plant-failure {group}): the group did not run"
            )),
            "policy" => Ok(match &criterion {
                Some(dir) => figures::criterion::read(dir),
                None => figures::failed(
                    group,
                    &anyhow!("criterion was not run (pass --criterion DIR)"),
                ),
            }),
            "tcp" => figures::tcp::run(mode).await,
            "appcheck" => figures::appcheck::run(mode).await,
            "icmp" => figures::icmp::run(mode).await,
            "dns" => figures::dns::run(mode).await,
            "pacing" => figures::pacing::run(mode).await,
            "memory" => figures::memory::run(mode).await,
            "ingest" => figures::ingest::run(mode).await,
            "batching" => figures::batching::run(mode).await,
            "access" => figures::access::run(mode).await,
            "cold" => figures::cold::run(mode).await,
            "detect" => figures::detect::run(mode).await,
            "scale" => figures::scale::run(mode).await,
            "storm" => figures::storm::run(mode).await,
            "onaccess" => figures::onaccess::run(mode).await,
            "starve" => figures::starve::run(mode).await,
            "dashboard" => figures::dashboard::run(mode).await,
            "sizes" => figures::sizes::run(mode).await,
            "spray" => figures::spray::run(mode).await,
            "events" => figures::events::run(mode).await,
            "burst" => figures::burst::run(mode).await,
            "ha" => figures::ha::run(mode).await,
            "database" => figures::database::run(mode).await,
            "startup" => figures::startup::run(mode).await,
            "replicas" => figures::replicas::run(mode).await,
            "logstream" => figures::logstream::run(mode).await,
            "peers" => figures::peers::run(mode).await,
            _ => Err(anyhow!("the driver does not know how to run group {group}")),
        };
        let figures = match result {
            Ok(f) => figures::complete(group, f),
            Err(e) => {
                eprintln!("reach-bench: {group} failed: {e:#}");
                failures.push(format!("group {group} failed: {e:#}"));
                figures::failed(group, &e)
            }
        };
        failures.extend(
            figures
                .iter()
                .filter(|f| f.value.is_none())
                .map(|f| format!("{group}: {} not produced: {}", f.name, f.note)),
        );
        eprintln!(
            "reach-bench: {group} done in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        all.extend(figures);
    }
    let results = Results {
        machine: bench::sys::machine(),
        mode: mode.as_str().to_owned(),
        finished_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        figures: all,
    };
    if let Some(path) = out {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, serde_json::to_string_pretty(&results)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("reach-bench: wrote {}", path.display());
    }
    print!("{}", table(&results));
    if !failures.is_empty() {
        bail!(
            "{} failure(s); every figure must be produced:\n  {}",
            failures.len(),
            failures.join("\n  ")
        );
    }
    Ok(())
}
