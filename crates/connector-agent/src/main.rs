//! The `connector-agent` binary: parses flags, sets up logging and runs the
//! connector until SIGTERM or Ctrl-C.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use connector_agent::{Config, LogFormat, retry};
use tracing_subscriber::EnvFilter;

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { () = ctrl_c => {}, () = term => {} }
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    if let Some(dir) = build_info::docs::requested() {
        build_info::docs::write(Config::command(), &dir)?;
        return Ok(ExitCode::SUCCESS);
    }
    let config = Config::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a terminal: journald and files get plain text.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    match config.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    let ca_cert = config.ca_cert.clone();
    let result = if config.command == Some(connector_agent::Command::Enroll) {
        connector_agent::enroll_only(&config)
            .await
            .context("connector-agent enroll failed")
    } else {
        connector_agent::run(config, shutdown_signal())
            .await
            .context("connector-agent failed")
    };
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("Error: {e:#}");
            if let Some(hint) = retry::tls_hint(&format!("{e:#}"), ca_cert.as_deref()) {
                eprintln!("hint: {hint}");
            }
            Ok(ExitCode::FAILURE)
        }
    }
}
