//! The `connector-agent` binary: parses flags, sets up logging and runs the
//! connector until SIGTERM or Ctrl-C.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{CommandFactory, Parser};
use connector_agent::{Config, LogFormat};
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

/// `connector-agent --generate-docs DIR` (hidden, the only argument): the
/// directory to write the man pages and shell completions to. Kept out of
/// `Config` so it shows in neither `--help` nor the pages it writes.
fn generate_docs_dir() -> Option<PathBuf> {
    let mut args = std::env::args_os().skip(1);
    match (args.next(), args.next(), args.next()) {
        (Some(flag), Some(dir), None) if flag == "--generate-docs" => Some(dir.into()),
        _ => None,
    }
}

/// Writes `connector-agent.1` (and one page per subcommand) and the bash,
/// zsh and fish completions into `dir` (`cargo xtask dist` packs them).
fn generate_docs(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cmd = Config::command();
    clap_mangen::generate_to(cmd.clone(), dir)
        .with_context(|| format!("writing man pages to {}", dir.display()))?;
    for shell in [
        clap_complete::Shell::Bash,
        clap_complete::Shell::Zsh,
        clap_complete::Shell::Fish,
    ] {
        clap_complete::generate_to(shell, &mut cmd, "connector-agent", dir)
            .with_context(|| format!("writing {shell} completions to {}", dir.display()))?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if let Some(dir) = generate_docs_dir() {
        return generate_docs(&dir);
    }
    let config = Config::parse();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match config.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
    if config.command == Some(connector_agent::Command::Enroll) {
        return connector_agent::enroll_only(&config)
            .await
            .context("connector-agent enroll failed");
    }
    connector_agent::run(config, shutdown_signal())
        .await
        .context("connector-agent failed to start")
}
