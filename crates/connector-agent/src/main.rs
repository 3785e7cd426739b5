//! The `connector-agent` binary: parses flags, sets up logging and runs the
//! connector until SIGTERM or Ctrl-C: the first drains (`--drain-seconds`),
//! a second stops it at once.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use connector_agent::{Config, LogFormat, retry};
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

/// Counts SIGTERM and SIGINT (Ctrl-C). The listeners are made once and
/// stay registered, so a second signal right after the first is counted
/// too.
#[cfg(unix)]
fn signals() -> watch::Receiver<u32> {
    use tokio::signal::unix::{SignalKind, signal};
    let (tx, rx) = watch::channel(0u32);
    let listen = |kind: SignalKind, name: &str| match signal(kind) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for {name}");
            None
        }
    };
    let (mut term, mut int) = (
        listen(SignalKind::terminate(), "SIGTERM"),
        listen(SignalKind::interrupt(), "SIGINT"),
    );
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = next(term.as_mut()) => {}
                () = next(int.as_mut()) => {}
            }
            tx.send_modify(|n| *n = n.saturating_add(1));
        }
    });
    rx
}

/// The next delivery of `signal` (never, without a listener).
#[cfg(unix)]
async fn next(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Counts Ctrl-C.
#[cfg(not(unix))]
fn signals() -> watch::Receiver<u32> {
    let (tx, rx) = watch::channel(0u32);
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            tx.send_modify(|n| *n = n.saturating_add(1));
        }
        tracing::error!("cannot listen for Ctrl-C");
    });
    rx
}

/// Completes at the `n`th signal.
async fn signal_number(mut signals: watch::Receiver<u32>, n: u32) {
    let _ = signals.wait_for(|count| *count >= n).await;
}

/// The connector runs on one tokio worker thread unless
/// `TOKIO_WORKER_THREADS` asks for more: a check hops between tasks (pacer,
/// probe, schedule, session), and across two threads each hop was a
/// wake-up of the other (a fifth of the connector's CPU at 2,000 checks/s).
fn main() -> anyhow::Result<ExitCode> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        runtime.worker_threads(1);
    }
    runtime
        .build()
        .context("cannot start the async runtime")?
        .block_on(run())
}

async fn run() -> anyhow::Result<ExitCode> {
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
        let signals = signals();
        let (first, second) = (signal_number(signals.clone(), 1), signal_number(signals, 2));
        connector_agent::run_draining(config, first, second)
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
