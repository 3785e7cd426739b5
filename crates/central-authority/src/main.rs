//! The `central-authority` binary: parses flags, sets up logging, binds the
//! listeners and hands off to `central_authority::run`.

use std::path::{Path, PathBuf};
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

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
    }
    let path = match cli.command {
        Some(Command::CheckConfig { file }) => {
            return Ok(match load(&file) {
                Some(c) => {
                    let p = &c.policy;
                    println!(
                        "{}: OK ({} connector groups, {} segments, {} API tokens)",
                        file.display(),
                        p.connector_groups.len(),
                        p.segments.len(),
                        c.tokens.len()
                    );
                    ExitCode::SUCCESS
                }
                None => ExitCode::FAILURE,
            });
        }
        None => cli
            .config
            .context("--config FILE is required (or REACH_CONFIG)")?,
    };
    let Some(config) = load(&path) else {
        return Ok(ExitCode::FAILURE);
    };
    let s = &config.settings;
    let grpc = tokio::net::TcpListener::bind(s.grpc_listen)
        .await
        .with_context(|| format!("binding gRPC on {}", s.grpc_listen))?;
    let http = tokio::net::TcpListener::bind(s.http_listen)
        .await
        .with_context(|| format!("binding HTTP on {}", s.http_listen))?;
    let shutdown = async {
        #[cfg(unix)]
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! { _ = tokio::signal::ctrl_c() => {}, _ = term.recv() => {} }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    };
    central_authority::run(config, grpc, http, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// Loads a config, printing every error to stderr when it is invalid.
fn load(file: &Path) -> Option<Config> {
    Config::load(file)
        .map_err(|e| {
            for m in e.messages() {
                eprintln!("error: {m}");
            }
            eprintln!("{}: configuration is invalid", file.display());
        })
        .ok()
}
