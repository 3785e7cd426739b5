//! The `central-authority` binary: parses flags, sets up logging, binds the
//! listeners and hands off to `central_authority::run`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use central_authority::Config;
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(version, about = "reach central authority")]
struct Cli {
    /// Configuration file (TOML).
    #[arg(long, env = "REACH_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory (database, generated certificates); overrides
    /// `[server] data_dir`.
    #[arg(long, env = "REACH_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Log format.
    #[arg(long, env = "REACH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration file, print every error, exit non-zero if any.
    CheckConfig { file: PathBuf },
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    central_authority::init_logging(cli.log_format == LogFormat::Json);
    let path = match &cli.command {
        Some(Command::CheckConfig { file }) => file.clone(),
        None => cli
            .config
            .context("--config FILE is required (or REACH_CONFIG)")?,
    };
    let config = match Config::load(&path) {
        Ok(mut config) => {
            if let Some(dir) = &cli.data_dir {
                config.settings.data_dir = dir.clone();
            }
            config
        }
        Err(e) => {
            e.messages().iter().for_each(|m| eprintln!("error: {m}"));
            eprintln!("{}: configuration is invalid", path.display());
            return Ok(ExitCode::FAILURE);
        }
    };
    if cli.command.is_some() {
        println!("{}: OK ({})", path.display(), config.summary());
        return Ok(ExitCode::SUCCESS);
    }
    let (grpc, http) = (config.settings.grpc_listen, config.settings.http_listen);
    let grpc = tokio::net::TcpListener::bind(grpc)
        .await
        .with_context(|| format!("binding gRPC on {grpc}"))?;
    let http = tokio::net::TcpListener::bind(http)
        .await
        .with_context(|| format!("binding HTTP on {http}"))?;
    central_authority::run(config, grpc, http, central_authority::terminated()).await?;
    Ok(ExitCode::SUCCESS)
}
