//! reach's connector agent: it runs inside a private network, dials out to
//! the central authority (CA), learns which application segments its
//! connector group serves, checks whether their applications are reachable
//! from where it stands, and reports Up / Unhealthy / Down / Unknown.
//!
//! # How it works
//!
//! The modules are grouped by what they do: [`checks`] (what touches an
//! application), [`schedule`] (when), [`send`] (reports on their way out),
//! [`ca`] (reaching, trusting and enrolling with the CA) and [`session`]
//! (one stream per replica and what they share); [`config`], [`retry`],
//! [`metrics`] and [`resolver`] are leaves every group may use.
//!
//! - [`enroll`]: on first start the connector makes a key pair and CSR and
//!   calls `Enrollment.Enroll` with its group's provisioning key; the signed
//!   client certificate and its key stay in `--state-dir`.
//! - [`attach`]: every address a `--ca` name resolves to is a CA replica
//!   ([`dial`]); the connector holds one session per address (verified
//!   against the name), re-resolving periodically and after lost sessions.
//!   Every report goes to every session; [`follow`] decides whose
//!   assignment is in force when replicas disagree (the session connected
//!   longest).
//! - [`session::stream`]: one gRPC `ConnectorSession.Connect` stream to a CA replica,
//!   mutual TLS with that certificate (only against a CA run with
//!   `[tls] enabled = false`, for local experiments, an `http://` URL and
//!   the provisioning key in `x-reach-provisioning-key` metadata instead).
//!   `Hello` first; the CA's `Welcome` and
//!   later `PolicyUpdate`s replace the assignment; `AccessEvent`s start
//!   on-access checks; `Ping`s are answered; `HealthReport`s (the first after
//!   every (re)connect with `full_state = true`) and `Heartbeat`s with the
//!   check load go back. A lost session is re-established with exponential
//!   backoff ([`retry`]: 0.5 s doubling to 30 s, full jitter) while checks
//!   go on. What every session shares is in [`options`].
//! - [`send::report`]: one application's report, a `policy::ApplicationReport`
//!   from the round that made it to the bytes, encoded once for every
//!   replica's session; [`send::outbox`] batches and paces a session's reports,
//!   [`send::wire`] sends them.
//! - [`schedule`] (pure, time passed in) and [`schedule::task`] (the task
//!   that drives it, handle [`schedule::Scheduler`]): per
//!   segment mode — `continuous` applications are checked every report
//!   interval and reported then and at once on a status change;
//!   `on_access` applications from an access until the on-access window
//!   (`ConnectorSettings.on_access_window_ms`, default 30 min) passes without
//!   a new access, then reported once as Unknown with `expired = true`;
//!   `none` segments are never checked.
//! - [`resolver`]: hickory-resolver, system configuration or `--dns-server`;
//!   every A/AAAA address is a target; answers kept for their TTL clamped to
//!   5 s..1 h (refreshes jittered); one lookup per name at a time, shared by
//!   every port and segment; failures become Down with the resolver's reason,
//!   except that a transient one (timeout, SERVFAIL) keeps the last known
//!   addresses in use for `--dns-stale-grace-s` with the error beside them.
//! - [`checks::pacer`]: every check starts here — governor-paced at
//!   `--checks-per-second` on an ideal timeline (so 6,000 checks take 300 s,
//!   not 301.5 s), `--max-in-flight` concurrent, the check an access
//!   triggered first, periodic on-access re-checks and continuous checks
//!   sharing the rest 1:1, one probe per (address, protocol, port) however
//!   many segments share it.
//! - [`checks::probe`]: TCP handshake; ICMP echo via one surge-ping client per
//!   address family (raw socket, else unprivileged, else none with one
//!   warning); UDP ports = ICMP, then a TCP fallback that counts a
//!   handshake or a reset as reachable.
//! - [`renewal`]: the certificate is renewed at about two thirds of its
//!   lifetime (with jitter) over mutual TLS, stored atomically in
//!   `--state-dir`, and the session moves onto it; an expired certificate
//!   needs the provisioning key to enroll again.
//! - [`trust`]: the roots trusted for the CA: `--ca-cert` until the CA
//!   sends a trust bundle (a root rotation), which is kept in
//!   `--state-dir` and trusted from then on; a bundle may ask for an early
//!   renewal.
//! - [`metrics`]: Prometheus metrics at `--metrics-listen` `/metrics`.
//! - Stopping: on SIGTERM the connector drains first ([`run_draining`]):
//!   every session sends `Drain`, so the CA selects it for no new access,
//!   and goes on for `--drain-seconds` before the sessions close.
//!
//! The binary (`main.rs`) parses [`Config`] and calls [`run`].

#![forbid(unsafe_code)]

pub mod ca;
pub mod checks;
pub mod config;
pub mod metrics;
pub mod resolver;
pub mod retry;
pub mod schedule;
pub mod send;
pub mod session;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use config::{Command, Config, IcmpPreference, LogFormat};
use tokio::sync::watch;

use ca::{dial, enroll, renewal, trust};
use checks::{pacer, probe};
use session::{attach, follow, options};

/// Why the connector could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Neither a key file nor `REACH_PROVISIONING_KEY` was given.
    #[error("no provisioning key: use --provisioning-key-file or REACH_PROVISIONING_KEY")]
    MissingProvisioningKey,
    /// The key file could not be read.
    #[error("cannot read the provisioning key file {path}: {source}")]
    ReadKey {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A value cannot travel in gRPC metadata (non-ASCII or control
    /// characters) or is empty.
    #[error("{0} must be non-empty printable ASCII")]
    InvalidIdentity(&'static str),
    /// The CA URL is not a valid URI.
    #[error("invalid --ca URL {url:?}: {reason}")]
    InvalidCa {
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The resolver could not be set up.
    #[error(transparent)]
    Resolver(#[from] resolver::ResolverError),
    /// Enrollment failed or the credentials could not be loaded.
    #[error(transparent)]
    Enroll(#[from] enroll::EnrollError),
    /// The metrics listener could not be bound.
    #[error("cannot listen for metrics on {addr}: {source}")]
    Metrics {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// The provisioning key from `--provisioning-key-file` or
/// `--provisioning-key`, trimmed; present and printable ASCII, or an error
/// naming what is wrong.
fn provisioning_key(config: &Config) -> Result<config::ProvisioningKey, AgentError> {
    let key = match (&config.provisioning_key_file, &config.provisioning_key) {
        (Some(path), _) => std::fs::read_to_string(path)
            .map_err(|source| AgentError::ReadKey {
                path: path.clone(),
                source,
            })?
            .trim()
            .to_owned(),
        (None, Some(key)) => key.expose().trim().to_owned(),
        (None, None) => return Err(AgentError::MissingProvisioningKey),
    };
    if key.is_empty() {
        return Err(AgentError::MissingProvisioningKey);
    }
    printable(&key, "the provisioning key")?;
    Ok(config::ProvisioningKey::new(key))
}

fn printable(value: &str, what: &'static str) -> Result<(), AgentError> {
    if value.is_empty() || !value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(AgentError::InvalidIdentity(what));
    }
    Ok(())
}

/// The `--ca` URLs, parsed: at least one, all `https://` or all `http://`.
fn ca_urls(config: &Config) -> Result<Vec<dial::CaUrl>, AgentError> {
    let urls = config
        .ca
        .iter()
        .map(|url| {
            dial::CaUrl::parse(url.trim()).map_err(|reason| AgentError::InvalidCa {
                url: url.clone(),
                reason,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let Some(first) = urls.first() else {
        return Err(AgentError::InvalidCa {
            url: String::new(),
            reason: "no --ca given".into(),
        });
    };
    if let Some(other) = urls.iter().find(|u| u.tls() != first.tls()) {
        return Err(AgentError::InvalidCa {
            url: other.as_str().to_owned(),
            reason: "every --ca must be https:// (or every one http://)".into(),
        });
    }
    Ok(urls)
}

/// Whether the CA URLs ask for TLS (`https://`).
fn wants_tls(config: &Config) -> bool {
    ca_urls(config).is_ok_and(|u| u.first().is_some_and(dial::CaUrl::tls))
}

fn check_identity(config: &Config) -> Result<(), AgentError> {
    printable(&config.name, "--name")?;
    printable(&config.group, "--group")?;
    ca_urls(config)?;
    Ok(())
}

/// The `--ca` replicas, resolved through `--dns-server` (when given) like
/// application names.
fn dialer(config: &Config) -> Result<dial::Dialer, AgentError> {
    let resolver = resolver::Resolver::new(config.dns_server, resolver::TtlBounds::default())?;
    Ok(dial::Dialer::new(ca_urls(config)?, resolver))
}

/// `connector-agent enroll`: enrolls (replacing an earlier enrollment in
/// the state directory) and returns.
pub async fn enroll_only(config: &Config) -> Result<(), AgentError> {
    check_identity(config)?;
    if !wants_tls(config) {
        return Err(AgentError::InvalidCa {
            url: config.ca.join(","),
            reason: "enrollment needs an https:// CA".into(),
        });
    }
    let trust = trust(config)?;
    let key = provisioning_key(config)?;
    let dialer = dialer(config)?;
    enroll_on_any(config, &dialer, &trust, &key).await?;
    Ok(())
}

/// The roots to trust for the CA: `--ca-cert`, or the trust bundle the CA
/// sent that the state directory keeps ([`trust`]).
fn trust(config: &Config) -> Result<trust::Trust, AgentError> {
    let ca_pem = enroll::read_ca_cert(config.ca_cert.as_deref())?;
    Ok(trust::Trust::load(&config.state_dir, &ca_pem))
}

/// Enrolls with the first CA replica that answers.
async fn enroll_on_any(
    config: &Config,
    dialer: &dial::Dialer,
    trust: &trust::Trust,
    key: &config::ProvisioningKey,
) -> Result<enroll::Enrollment, enroll::EnrollError> {
    enroll::on_any(dialer, |target| async move {
        enroll::enroll(
            &target,
            trust,
            &config.state_dir,
            &config.name,
            &config.group,
            key,
        )
        .await
    })
    .await
}

/// The enrollment in the state directory, enrolling first when there is
/// none; an unreachable CA is retried with backoff until `shutdown`.
/// `Ok(None)` when shut down first.
async fn enrollment(
    config: &Config,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<Option<enroll::Enrollment>, AgentError> {
    let trust = trust(config)?;
    let loaded = enroll::load(&config.state_dir, &config.name, &config.group, &trust)?;
    if let Some(c) = &loaded
        && !c.expired(enroll::now_ms())
    {
        tracing::info!(serial = %c.serial, not_after_ms = c.not_after_ms, state_dir = %config.state_dir.display(), "using the enrolled certificate");
        return Ok(loaded);
    }
    let key = match (provisioning_key(config), &loaded) {
        (Ok(key), _) => key,
        (Err(e), Some(c)) => {
            tracing::error!(
                serial = %c.serial,
                not_after_ms = c.not_after_ms,
                "the connector certificate has expired and this connector has no provisioning key: enroll it again (connector-agent enroll with --provisioning-key-file)"
            );
            return Err(e);
        }
        (Err(e), None) => return Err(e),
    };
    match &loaded {
        Some(c) => {
            tracing::warn!(serial = %c.serial, state_dir = %config.state_dir.display(), "the connector certificate has expired: enrolling again")
        }
        None => {
            tracing::info!(state_dir = %config.state_dir.display(), "not enrolled yet: enrolling")
        }
    }
    let dialer = dialer(config)?;
    let mut attempt = 0u32;
    loop {
        match enroll_on_any(config, &dialer, &trust, &key).await {
            Ok(c) => return Ok(Some(c)),
            Err(e) if e.retryable() => {
                let delay = retry::backoff(attempt, &mut rand::rng());
                attempt = attempt.saturating_add(1);
                let delay_ms = delay.as_millis();
                match retry::tls_hint(&e.to_string(), config.ca_cert.as_deref()) {
                    Some(hint) => {
                        tracing::warn!(error = %e, %hint, delay_ms, "enrollment failed; retrying")
                    }
                    None => tracing::warn!(error = %e, delay_ms, "enrollment failed; retrying"),
                }
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = &mut *shutdown => return Ok(None),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Runs the connector until `shutdown` completes. Errors only when it
/// cannot start; everything after that (CA gone, DNS failing, applications
/// hanging, credentials the CA refuses) is logged, reported and retried. With an `https://` CA it
/// enrolls first when the state directory holds no enrollment.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
    run_draining(config, shutdown, std::future::pending()).await
}

/// [`run`], draining for `--drain-seconds` once `shutdown` completes
/// ([`drain_first`]) unless `now` completes first: the binary's SIGTERM
/// and a second signal.
pub async fn run_draining(
    config: Config,
    shutdown: impl Future<Output = ()>,
    now: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    for warning in
        enroll::secret_file_warnings(config.provisioning_key_file.as_deref(), &config.state_dir)
    {
        tracing::warn!("{warning}");
    }
    check_identity(&config)?;
    let mut shutdown = std::pin::pin!(shutdown);
    let Some(credentials) = credentials(&config, &mut shutdown).await? else {
        return Ok(());
    };
    let metrics = metrics::Metrics::new();
    let (stop_tx, stop_rx) = watch::channel(false);
    let (drain_tx, drain_rx) = watch::channel(None);
    let mut tasks = Vec::new();
    if let Some(addr) = config.metrics_listen {
        tasks.push(serve_metrics(addr, metrics.clone(), stop_rx.clone()).await?);
    }
    let (parts, checks) = start_checks(&config, metrics, drain_rx)?;
    let dialer = dialer(&config)?;
    // The certificate renews itself; the session follows it.
    let renewals = match &credentials {
        options::Credentials::Certificate(current) => {
            let (renewals, task) = start_renewal(&config, &dialer, current, stop_rx.clone());
            tasks.push(task);
            Some(renewals)
        }
        options::Credentials::ProvisioningKey(_) => None,
    };
    let options = session_options(&config, credentials, renewals);
    parts.metrics.set_session_state("connecting");
    tracing::info!(ca = %config.ca.join(","), name = %config.name, group = %config.group, "connector starting");
    let mut session = tokio::spawn(attach::run(
        dialer,
        config.ca_resolve_interval(),
        options,
        parts,
        stop_rx,
    ));
    let ended = tokio::select! {
        () = &mut shutdown => {
            tracing::info!("shutting down");
            drain_first(config.drain(), &drain_tx, &mut session, now).await
        }
        _ = &mut session => {
            tracing::warn!("session task ended");
            true
        }
    };
    let _ = stop_tx.send(true);
    // Give the session a moment to close its stream cleanly.
    if !ended
        && tokio::time::timeout(Duration::from_secs(2), &mut session)
            .await
            .is_err()
    {
        session.abort();
    }
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(2), task).await;
    }
    for task in checks {
        task.abort();
    }
    Ok(())
}

/// Drains before the connector stops: every session tells its CA replica
/// (`v1::Drain`, also a session opened meanwhile), so the CA selects this
/// connector for no new access while its checks and reports go on for
/// `drain`, unless `now` completes or the sessions end first. Returns
/// whether the sessions ended.
async fn drain_first(
    drain: Duration,
    draining: &watch::Sender<Option<std::time::Instant>>,
    session: &mut tokio::task::JoinHandle<()>,
    now: impl Future<Output = ()>,
) -> bool {
    if drain.is_zero() {
        return false;
    }
    let until = tokio::time::Instant::now() + drain;
    let _ = draining.send(Some(until.into_std()));
    tracing::info!(
        drain_s = drain.as_secs(),
        "draining before stopping: the CA selects this connector for no new access while its checks and reports go on (a second signal stops it at once)"
    );
    tokio::select! {
        () = tokio::time::sleep_until(until) => {
            tracing::info!("drained; stopping");
            false
        }
        () = now => {
            tracing::info!("stopping at once");
            false
        }
        _ = session => true,
    }
}

/// How the sessions prove the connector's identity: the enrolled
/// certificate (enrolling first when there is none) with an `https://` CA,
/// else the provisioning key. `Ok(None)` when shut down while enrolling.
async fn credentials(
    config: &Config,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<Option<options::Credentials>, AgentError> {
    if wants_tls(config) {
        return Ok(enrollment(config, shutdown)
            .await?
            .map(options::Credentials::Certificate));
    }
    tracing::warn!(
        "plain-text CA URL: the provisioning key is sent with every session; use https:// and enrollment"
    );
    Ok(Some(options::Credentials::ProvisioningKey(
        provisioning_key(config)?,
    )))
}

/// Serves `/metrics` at `addr` until `stop` turns true.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    metrics: metrics::Metrics,
    mut stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>, AgentError> {
    let listener = metrics::bind(addr)
        .await
        .map_err(|source| AgentError::Metrics { addr, source })?;
    tracing::info!(%addr, "serving metrics at /metrics");
    Ok(tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = metrics::serve(listener, metrics, stopped).await {
            tracing::error!(error = %e, "metrics endpoint failed");
        }
    }))
}

/// Starts what checks: the resolver, the prober, one pacer and one
/// schedule for every CA replica (sessions subscribe to its reports).
/// Returns the parts the sessions drive and the pacer's and scheduler's
/// tasks.
fn start_checks(
    config: &Config,
    metrics: metrics::Metrics,
    draining: watch::Receiver<Option<std::time::Instant>>,
) -> Result<(options::Parts, [tokio::task::JoinHandle<()>; 2]), AgentError> {
    let resolver = resolver::Resolver::new(config.dns_server, resolver::TtlBounds::default())?
        .with_stale_grace(config.dns_stale_grace());
    let prober = Arc::new(probe::Prober::new(config.icmp, config.check_timeout()));
    if !config.allow_networks.is_empty() {
        tracing::info!(networks = ?config.allow_networks, "probing only --allow-networks");
    }
    let (pacer, pacer_task) = pacer::Pacer::spawn_restricted(
        prober.clone(),
        config.checks_per_second,
        config.max_in_flight,
        pacer::AllowNetworks::new(config.allow_networks.iter().copied()),
        metrics.clone(),
    );
    let (scheduler, scheduler_task) =
        schedule::Scheduler::spawn_shared(resolver.clone(), pacer.clone(), metrics.clone());
    let parts = options::Parts {
        scheduler,
        pacer,
        prober,
        metrics,
        resolver,
        assignments: Arc::new(follow::Assignments::new()),
        draining,
    };
    Ok((parts, [scheduler_task, pacer_task]))
}

/// Starts renewing the `current` certificate: the renewed ones arrive on
/// the returned channel.
fn start_renewal(
    config: &Config,
    dialer: &dial::Dialer,
    current: &enroll::Enrollment,
    stop: watch::Receiver<bool>,
) -> (
    watch::Receiver<enroll::Enrollment>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = watch::channel(current.clone());
    let renewer = renewal::Renewer {
        ca: dialer.clone(),
        state_dir: config.state_dir.clone(),
        name: config.name.clone(),
        group: config.group.clone(),
        provisioning_key: provisioning_key(config).ok(),
    };
    (rx, tokio::spawn(renewer.run(current.clone(), tx, stop)))
}

/// What every session is given: identity, credentials and the connector's
/// own check settings.
fn session_options(
    config: &Config,
    credentials: options::Credentials,
    renewals: Option<watch::Receiver<enroll::Enrollment>>,
) -> options::SessionOptions {
    options::SessionOptions {
        identity: options::Identity {
            name: config.name.clone(),
            group: config.group.clone(),
        },
        credentials,
        renewals,
        checks_per_second: config.checks_per_second,
        check_timeout: config.check_timeout(),
        ceilings: config.ceilings(),
        reconnect_max: retry::BACKOFF_MAX,
        ca_cert: config.ca_cert.clone(),
    }
}
