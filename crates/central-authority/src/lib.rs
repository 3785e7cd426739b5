//! reach's central authority (CA): configuration and reload, connector
//! sessions, the health table, access resolution with on-access discovery,
//! and the HTTP (dashboard, JSON API, metrics) and gRPC surfaces.
//!
//! `run` takes already-bound listeners and a shutdown future, so tests serve
//! on `127.0.0.1:0` and the binary stays a thin flag parser.

#![forbid(unsafe_code)]

pub mod access;
pub mod api;
pub mod config;
pub mod credentials;
pub mod error;
pub mod ground;
pub mod housekeeping;
pub mod intake;
pub mod logstream;
pub mod reload;
pub mod replicas;
pub mod state;
pub mod store;
pub mod tools;
pub mod trust;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;

pub use config::{Config, ConfigError, Settings};
pub use error::{RunError, TrustError};
pub use state::authority::Authority;

/// How often housekeeping (window expiry, staleness, load estimates) runs.
const HOUSEKEEPING_EVERY: Duration = Duration::from_millis(500);

/// Sets up `tracing` for the binary: `RUST_LOG` filters (default `info`),
/// text (coloured only on a terminal) or JSON lines on stderr.
pub fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        logs.json().init();
    } else {
        logs.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
}

/// Resolves on SIGINT or SIGTERM (the binary's shutdown signal).
pub async fn terminated() {
    #[cfg(unix)]
    if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        return;
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Runs the CA until `shutdown` resolves: gRPC on `grpc`, HTTP on `http`,
/// housekeeping, and (when the config came from a file) reload on SIGHUP
/// and file change. Connector sessions get a `Shutdown` when it ends.
pub async fn run(
    config: Config,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let tls = config.settings.tls_enabled;
    let authority = Arc::new(Authority::open(config, tls)?);
    run_with(authority, grpc, http, shutdown).await
}

/// Like `run`, over state the caller keeps a handle to (tests inspect it).
pub async fn run_with(
    authority: Arc<Authority>,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    log_start(&authority, &grpc, &http);
    let state = authority.snapshot();
    if let Some(path) = state.config.path.clone() {
        tokio::spawn(reload::watch_config(
            authority.clone(),
            path,
            stop_rx.clone(),
        ));
    }
    drop(state);

    // Replicas of one CA share the store: heartbeat there, and close the
    // sessions a change made on another replica ended.
    let me = {
        let state = authority.snapshot();
        let s = state.settings();
        replicas::Me::new(
            &state,
            grpc.local_addr().unwrap_or(s.grpc_listen),
            http.local_addr().unwrap_or(s.http_listen),
        )
    };
    authority.set_replica_id(me.id.clone());
    authority
        .log_stream()
        .start(me.id.clone(), &authority.snapshot().config.log_receivers);
    // The drains in force before the first session can register.
    if let Some(Err(e)) = authority.blocking(access::drain::refresh_drains).await {
        tracing::warn!(error = %e, "cannot read the drained connectors from the store");
    }
    tokio::spawn(replicas::run(
        authority.clone(),
        me,
        stopped(stop_rx.clone()),
    ));

    tokio::spawn(keep_house(authority.clone(), stopped(stop_rx.clone())));

    tokio::spawn(intake::transitions::run(
        authority.clone(),
        stopped(stop_rx.clone()),
    ));

    // Long-lived session streams would hold a graceful gRPC shutdown open
    // forever: close them first, telling each connector why.
    let closer = authority.clone();
    let grpc_stop = {
        let rx = stop_rx.clone();
        async move {
            stopped(rx).await;
            closer.close_all_sessions("central authority is shutting down");
            closer.history().close();
            closer.log_stream().stop();
        }
    };
    let grpc = api::grpc::serve(authority.clone(), grpc, grpc_stop);
    let http = serve_http_apart(authority.clone(), http, stopped(stop_rx));
    tokio::try_join!(grpc, http)?;
    tracing::info!("central authority stopped");
    Ok(())
}

/// Serves the HTTP API (access decisions, the dashboard, the admin API)
/// on a runtime of its own (tokio's default of a worker per core) until
/// `stop` resolves. Connector sessions run on the caller's runtime:
/// when thousands reconnect at once, their tasks fill its run queues, and a
/// decision queued behind them waited there for seconds (5-s client
/// timeouts while every replica's own decision time stayed under 1.6 s).
/// On its own runtime a decision waits only for the operating system to
/// give its worker a share of the CPU.
async fn serve_http_apart(
    authority: Arc<Authority>,
    http: TcpListener,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let listener = http.into_std().map_err(RunError::Http)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("reach-http")
        .enable_all()
        .build()
        .map_err(RunError::Http)?;
    let (done_tx, done) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("reach-http".into())
        .spawn(move || {
            let served = runtime.block_on(async move {
                let listener = TcpListener::from_std(listener).map_err(RunError::Http)?;
                api::http::serve(authority, listener, stop).await
            });
            // Streams and requests still open end with the runtime.
            runtime.shutdown_timeout(Duration::from_secs(1));
            let _ = done_tx.send(served);
        })
        .map_err(RunError::Http)?;
    done.await.unwrap_or_else(|_| {
        Err(RunError::Http(std::io::Error::other(
            "the HTTP server's thread ended without a result",
        )))
    })
}

/// Logs where the CA listens and with what, and its configuration's
/// warnings.
fn log_start(authority: &Authority, grpc: &TcpListener, http: &TcpListener) {
    let state = authority.snapshot();
    tracing::info!(
        grpc = %grpc.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string()),
        http = %http.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string()),
        segments = state.policy().segments.len(),
        groups = state.policy().connector_groups.len(),
        strategy = %state.settings().strategy,
        tls = authority.pki().is_some(),
        data_dir = %state.settings().data_dir.display(),
        "central authority listening"
    );
    for warning in &state.config.warnings {
        tracing::warn!("{warning}");
    }
    if let Some(cap) = api::listen::somaxconn() {
        let limits = &state.settings().limits;
        let listeners = [
            ("HTTP", "max_connections", limits.max_connections),
            ("gRPC", "grpc_max_connections", limits.grpc_max_connections),
        ];
        for (what, key, limit) in listeners {
            if let Some(w) = api::listen::backlog_warning(what, key, limit, cap) {
                tracing::warn!("{w}");
            }
        }
    }
    if authority.pki().is_none() {
        tracing::warn!(
            "TLS is off ([tls] enabled = false): connectors authenticate with provisioning keys in plain text; use this for local experiments only"
        );
    }
}

/// Runs `housekeeping::run_once` every `HOUSEKEEPING_EVERY` (and, with
/// TLS, revokes superseded certificates), and prunes the audit trail every
/// `housekeeping::AUDIT_PRUNE_EVERY`, until `stop` resolves.
async fn keep_house(hk: Arc<Authority>, stop: impl Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let mut tick = tokio::time::interval(HOUSEKEEPING_EVERY);
    let mut audit_pruned: Option<Instant> = None;
    let mut failing = housekeeping::Repeated::new(Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {
                housekeeping::run_once(&hk, Instant::now());
                // A database write: off the async workers.
                if hk.pki().is_some() {
                    match hk.blocking(trust::renew::revoke_superseded).await {
                        Some(Err(e)) => if let Some(failures) = failing.failed(Instant::now()) {
                            tracing::error!(error = %e, failures, "cannot revoke superseded certificates");
                        },
                        Some(Ok(())) => if let Some(failures) = failing.succeeded() {
                            tracing::info!(failures, "superseded certificates are revoked again");
                        },
                        None => {}
                    }
                }
                if audit_pruned.is_none_or(|t| t.elapsed() >= housekeeping::AUDIT_PRUNE_EVERY) {
                    audit_pruned = Some(Instant::now());
                    let pruned = hk
                        .blocking(|a| housekeeping::prune_audit(a, crate::ground::clock::now_ms()))
                        .await;
                    if let Some(Err(e)) = pruned {
                        tracing::error!(error = %e, "audit trail: pruning failed");
                    }
                }
            }
        }
    }
}
