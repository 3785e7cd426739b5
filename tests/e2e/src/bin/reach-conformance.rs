//! `reach-conformance -- <command that starts a connector>`: judges a
//! connector, whoever wrote it, against the contract in `proto/`. It starts
//! two CA replicas (on a PostgreSQL store it starts itself), a DNS server
//! and applications on loopback, runs the command with `{ca_url}`,
//! `{ca_cert}`, `{name}`, `{group}`, `{provisioning_key}`, `{state_dir}` and
//! `{dns}` replaced (and the same values in `REACH_CA_URL`, `REACH_CA_CERT`,
//! `REACH_CONNECTOR_NAME`, `REACH_CONNECTOR_GROUP`, `REACH_PROVISIONING_KEY`,
//! `REACH_STATE_DIR`, `REACH_DNS_SERVER`), and prints each rule with its
//! verdict and evidence. Exits 1 when a rule fails, 2 when the kit itself
//! could not run.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use e2e::conformance::{self, Options};

/// Judges a connector against reach's connector contract.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Directory holding `central-authority` (default: this program's own).
    #[arg(long, env = "REACH_BIN_DIR")]
    bin_dir: Option<PathBuf>,
    /// Where configs and logs go.
    #[arg(long, default_value = "reach-conformance-out")]
    out: PathBuf,
    /// Second octet of the 127.N.0.0/16 block the kit uses.
    #[arg(long, default_value_t = 222)]
    block: u8,
    /// Seconds the connector is watched after its first session (at least
    /// 35, so that its certificate renewal falls inside).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(35..=3600))]
    observe_s: u64,
    /// The command that starts the connector under test.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("reach-conformance could not run: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<bool> {
    let bin_dir = match args.bin_dir {
        Some(dir) => dir,
        None => std::env::current_exe()?
            .parent()
            .context("this program's directory")?
            .to_owned(),
    };
    anyhow::ensure!(
        bin_dir.join("central-authority").is_file(),
        "no central-authority in {} (give --bin-dir)",
        bin_dir.display()
    );
    let out = std::path::absolute(&args.out)?;
    e2e::procs::use_dirs(bin_dir, out.clone());
    let options = Options {
        command: args.command,
        block: args.block,
        observe: Duration::from_secs(args.observe_s),
        out,
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let verdicts = runtime.block_on(conformance::run(&options))?;
    Ok(conformance::print(&verdicts))
}
