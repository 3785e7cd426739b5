//! A small connector written from `proto/` alone (not connector-agent's
//! code) that breaks one rule of the contract on purpose, so the
//! conformance kit's own tests can show that the kit fails the right rule:
//!
//! - `--fault too-fast`: ignores the imposed check rate (every check of a
//!   round at once, a round every 300 ms);
//! - `--fault skip-address`: checks only the first address a name resolves to;
//! - `--fault ignore-flow-control`: sends a refused report again at once,
//!   over and over, instead of waiting `retry_after_ms`;
//! - `--fault drop-refused`: drops the entries of a refused report instead
//!   of sending them again;
//! - `--fault let-expire`: never renews; when its certificate has expired
//!   (and the CA ended the session) it enrolls again with the provisioning
//!   key.
//! - `--fault no-backoff`: opens a session again 20 ms after it ended,
//!   however often that fails (a tight loop).
//!
//! Otherwise it enrolls with a CSR, renews at two thirds of the
//! certificate's lifetime (`Renew`, then a new session on the renewed
//! certificate), holds one session (to the first address of the CA's
//! name) and opens it again with backoff (0.5 s doubling to 8 s) after any
//! disconnect (at once, enrolling again, when its certificate expired),
//! sends its latest results as the full state of every new session,
//! answers pings, heartbeats (with its round's duration as the
//! cycle time), checks continuous segments' TCP ports by handshake and UDP
//! ports by a TCP connection (a reset proves the host reachable) at the
//! imposed rate, and reports after each round in batches no larger than
//! `max_report_entries`, each after the CA's answer to the one before,
//! sending a refused one again after `retry_after_ms` (also one refused
//! late, by a CA that was paused). It does not ping, attach to further replicas or
//! follow on-access windows: the kit fails those rules too, and its tests
//! assert only the rule each fault breaks and rules the connector does
//! follow.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use protocol::v1::connector_message::Kind as In;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Fault {
    TooFast,
    SkipAddress,
    IgnoreFlowControl,
    DropRefused,
    LetExpire,
    NoBackoff,
}

/// First wait before opening a session again; it doubles up to `BACKOFF_MAX`.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(8);

/// A connector that breaks one rule on purpose.
#[derive(Debug, Parser)]
struct Args {
    #[arg(long)]
    ca: String,
    #[arg(long)]
    ca_cert: std::path::PathBuf,
    #[arg(long)]
    name: String,
    #[arg(long)]
    group: String,
    #[arg(long)]
    dns: SocketAddr,
    #[arg(long, value_enum)]
    fault: Fault,
}

#[tokio::main]
async fn main() -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let key = std::env::var("REACH_PROVISIONING_KEY").context("REACH_PROVISIONING_KEY")?;
    let resolver = resolver(args.dns)?;
    let authority = args.ca.trim_start_matches("https://").trim_end_matches('/');
    let (host, port) = authority
        .rsplit_once(':')
        .with_context(|| format!("--ca {:?}: want https://NAME:PORT", args.ca))?;
    let (host, port) = (host.to_owned(), port.parse::<u16>().context("--ca port")?);
    let ip = *resolver
        .lookup_ip(host.as_str())
        .await
        .with_context(|| format!("resolving {host}"))?
        .iter()
        .collect::<Vec<_>>()
        .first()
        .context("the CA's name has no address")?;
    let root = std::fs::read_to_string(&args.ca_cert)?;
    let target = (&host, SocketAddr::new(ip, port), root.as_str());
    let mut cert = enroll_until(target, &args, &key).await;
    let mut backoff = BACKOFF_MIN;
    let carried = Carried::default();
    loop {
        if Instant::now() >= cert.not_after {
            cert = enroll_until(target, &args, &key).await;
        }
        let opened = Instant::now();
        let renewing = async {
            if args.fault == Fault::LetExpire {
                return std::future::pending().await;
            }
            tokio::time::sleep_until(cert.renew_at.into()).await;
            renew_until(target, &cert).await
        };
        let ended = tokio::select! {
            r = attached(target, &cert, &args, &resolver, &carried) => r,
            renewed = renewing => match renewed {
                // The old session closes here; the next opens on the new one.
                Some(renewed) => {
                    cert = renewed;
                    continue;
                }
                None => Ok(()),
            },
        };
        if let Err(e) = ended {
            eprintln!("session ended: {e:#}");
        }
        if opened.elapsed() > Duration::from_secs(10) {
            backoff = BACKOFF_MIN;
        }
        // An expired certificate ended the session: enroll again at once.
        if Instant::now() >= cert.not_after {
            continue;
        }
        if args.fault == Fault::NoBackoff {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// What outlives a session: the latest round's duration (sent in
/// heartbeats as the cycle time) and results (the next session's full
/// state).
#[derive(Default)]
struct Carried {
    cycle_ms: Arc<AtomicU64>,
    latest: std::sync::Mutex<Vec<v1::ApplicationHealth>>,
}

/// The client certificate, its key and when to renew it.
struct Cert {
    cert_pem: String,
    key_pem: String,
    not_after: Instant,
    renew_at: Instant,
}

impl Cert {
    fn new(r: v1::EnrollResponse, key_pem: String) -> Self {
        let now_ms = unix_ms();
        let left = Duration::from_millis(u64::try_from(r.not_after_unix_ms - now_ms).unwrap_or(0));
        let now = Instant::now();
        Cert {
            cert_pem: r.certificate_pem,
            key_pem,
            not_after: now + left,
            renew_at: now + left * 2 / 3,
        }
    }

    fn identity(&self) -> Identity {
        Identity::from_pem(&self.cert_pem, &self.key_pem)
    }
}

/// Enrolls with the provisioning key, retrying with backoff.
async fn enroll_until(target: Target<'_>, args: &Args, key: &str) -> Cert {
    let mut backoff = BACKOFF_MIN;
    loop {
        match enroll(target, args, key).await {
            Ok(cert) => return cert,
            Err(e) => eprintln!("enrollment failed: {e:#}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Renews `cert`, retrying with backoff until it expires.
async fn renew_until(target: Target<'_>, cert: &Cert) -> Option<Cert> {
    let mut backoff = BACKOFF_MIN;
    while Instant::now() < cert.not_after {
        match renew(target, cert).await {
            Ok(renewed) => return Some(renewed),
            Err(e) => eprintln!("renewal failed: {e:#}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
    None
}

async fn renew(target: Target<'_>, cert: &Cert) -> Result<Cert> {
    let (csr, key_pem) = csr(None)?;
    let channel = channel(target, Some(cert.identity())).await?;
    let r = v1::enrollment_client::EnrollmentClient::new(channel)
        .renew(v1::RenewRequest { csr_pem: csr })
        .await
        .context("renew")?
        .into_inner();
    Ok(Cert::new(r, key_pem))
}

/// One session on `cert`, until it ends.
async fn attached(
    target: Target<'_>,
    cert: &Cert,
    args: &Args,
    resolver: &TokioResolver,
    carried: &Carried,
) -> Result<()> {
    let channel = channel(target, Some(cert.identity())).await?;
    session(channel, args, resolver, carried).await
}

fn resolver(dns: SocketAddr) -> Result<TokioResolver> {
    let mut ns = NameServerConfig::udp_and_tcp(dns.ip());
    for conn in &mut ns.connections {
        conn.port = dns.port();
    }
    let mut builder = TokioResolver::builder_with_config(
        ResolverConfig::from_name_servers(vec![ns]),
        TokioRuntimeProvider::default(),
    );
    builder.options_mut().cache_size = 0;
    Ok(builder.build()?)
}

type Target<'a> = (&'a String, SocketAddr, &'a str);

async fn channel(target: Target<'_>, id: Option<Identity>) -> Result<Channel> {
    let (name, addr, root) = target;
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(root))
        .domain_name(name.as_str());
    if let Some(id) = id {
        tls = tls.identity(id);
    }
    Ok(Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect()
        .await?)
}

/// A new key pair and a CSR for it (naming `name` when given).
fn csr(name: Option<&str>) -> Result<(String, String)> {
    let pair = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    if let Some(name) = name {
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
    }
    Ok((
        params.serialize_request(&pair)?.pem()?,
        pair.serialize_pem(),
    ))
}

async fn enroll(target: Target<'_>, args: &Args, key: &str) -> Result<Cert> {
    let (csr, key_pem) = csr(Some(&args.name))?;
    let r = v1::enrollment_client::EnrollmentClient::new(channel(target, None).await?)
        .enroll(v1::EnrollRequest {
            name: args.name.clone(),
            group: args.group.clone(),
            provisioning_key: key.to_owned(),
            csr_pem: csr,
        })
        .await
        .context("enroll")?
        .into_inner();
    Ok(Cert::new(r, key_pem))
}

/// What the session learnt from `Welcome`.
struct Assignment {
    segments: Vec<v1::Segment>,
    rate: u32,
    max_entries: usize,
}

/// One session over `channel`, opened with a full state of the latest
/// results.
async fn session(
    channel: Channel,
    args: &Args,
    resolver: &TokioResolver,
    carried: &Carried,
) -> Result<()> {
    let (tx, rx) = mpsc::channel(64);
    let mut inbound = v1::connector_session_client::ConnectorSessionClient::new(channel)
        .connect(ReceiverStream::new(rx))
        .await?
        .into_inner();
    tx.send(message(In::Hello(v1::Hello {
        name: args.name.clone(),
        group: args.group.clone(),
        version: "0.0.1-broken".into(),
        // As the contract says: the release its first lines state.
        release: protocol::release::Release::current().to_string(),
        capabilities: Some(v1::Capabilities {
            icmp: false,
            icmp_mode: "none".into(),
            checks_per_second: 20,
            trust_bundle: false,
        }),
    })))
    .await?;
    let welcome = loop {
        match inbound.message().await?.and_then(|m| m.kind) {
            Some(Out::Welcome(w)) => break w,
            Some(_) => {}
            None => bail!("the session ended before Welcome"),
        }
    };
    let settings = welcome.settings.unwrap_or_default();
    let assignment = Assignment {
        segments: welcome.segments,
        rate: settings.checks_per_second.max(1),
        max_entries: usize::try_from(settings.max_report_entries.max(1))?,
    };
    let heartbeat = Duration::from_millis(settings.heartbeat_interval_ms.max(100));
    full_state(&tx, carried).await?;
    let cycle_ms = &carried.cycle_ms;
    let (events_tx, mut events) = mpsc::channel(64);
    let (ended_tx, ended) = tokio::sync::oneshot::channel::<()>();
    let pongs = tx.clone();
    tokio::spawn(async move {
        let _ended = ended_tx;
        while let Ok(Some(m)) = inbound.message().await {
            match m.kind {
                Some(Out::Ping(p)) => {
                    let _ = pongs
                        .send(message(In::Pong(v1::Pong { nonce: p.nonce })))
                        .await;
                }
                Some(Out::FlowControl(f)) => {
                    let _ = events_tx.send(f).await;
                }
                _ => {}
            }
        }
    });
    let beats = (tx.clone(), cycle_ms.clone());
    let beating = tokio::spawn(async move {
        loop {
            tokio::time::sleep(heartbeat).await;
            let cycle = beats.1.load(Ordering::Relaxed) as f64 / 1000.0;
            let beat = In::Heartbeat(v1::Heartbeat {
                load: Some(v1::CheckLoad {
                    cycle_seconds: cycle,
                    ..Default::default()
                }),
                ..Default::default()
            });
            if beats.0.send(message(beat)).await.is_err() {
                return;
            }
        }
    });
    let rounds = async {
        let mut sequence = 0;
        let mut recent = Recent::default();
        loop {
            let started = Instant::now();
            let results = round(&assignment, args.fault, resolver).await;
            if let Ok(mut latest) = carried.latest.lock() {
                latest.clone_from(&results);
            }
            for chunk in results.chunks(assignment.max_entries) {
                sequence += 1;
                let report = (sequence, chunk.to_vec());
                send(&tx, Some(report), args.fault, &mut events, &mut recent).await?;
            }
            let pause = if args.fault == Fault::TooFast {
                300
            } else {
                1000
            };
            // A refusal that comes late (the CA was paused) is answered
            // while the connector waits for its next round.
            let next = tokio::time::Instant::now() + Duration::from_millis(pause);
            while let Ok(Some(f)) = tokio::time::timeout_at(next, events.recv()).await {
                let again = refused(f, args.fault, &recent).await;
                send(&tx, again, args.fault, &mut events, &mut recent).await?;
            }
            let took = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            cycle_ms.store(took, Ordering::Relaxed);
        }
    };
    let result: Result<()> = tokio::select! {
        r = rounds => r,
        _ = ended => Err(anyhow::anyhow!("the CA ended the session")),
    };
    beating.abort();
    result
}

/// The full state after a (re)connect: the latest results with their
/// ages; nothing before the first round (an empty one would turn every
/// application Unknown).
async fn full_state(tx: &mpsc::Sender<v1::ConnectorMessage>, carried: &Carried) -> Result<()> {
    let latest = carried.latest.lock().map(|l| l.clone()).unwrap_or_default();
    if latest.is_empty() {
        return Ok(());
    }
    let now = unix_ms();
    let applications = latest
        .into_iter()
        .map(|mut a| {
            a.age_ms = u64::try_from(now - a.checked_at_unix_ms).unwrap_or(0);
            a
        })
        .collect();
    let report = v1::HealthReport {
        applications,
        full_state: true,
        sequence: 0,
    };
    tx.send(message(In::Report(report))).await?;
    Ok(())
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn message(kind: In) -> v1::ConnectorMessage {
    v1::ConnectorMessage { kind: Some(kind) }
}

/// Reports sent lately, by sequence: a refusal that comes late (the CA was
/// paused) still finds its report.
#[derive(Default)]
struct Recent(std::collections::VecDeque<(u64, Vec<v1::ApplicationHealth>)>);

impl Recent {
    fn keep(&mut self, sequence: u64, entries: &[v1::ApplicationHealth]) {
        self.0.retain(|(s, _)| *s != sequence);
        self.0.push_back((sequence, entries.to_vec()));
        if self.0.len() > 64 {
            self.0.pop_front();
        }
    }

    fn get(&self, sequence: u64) -> Option<Vec<v1::ApplicationHealth>> {
        self.0
            .iter()
            .find(|(s, _)| *s == sequence)
            .map(|(_, e)| e.clone())
    }
}

/// What to do about refusal `f`: the refused report to send again, after
/// `retry_after_ms` unless the fault says otherwise (none when the fault
/// drops it, or it is not one of the recent reports).
async fn refused(
    f: v1::FlowControl,
    fault: Fault,
    recent: &Recent,
) -> Option<(u64, Vec<v1::ApplicationHealth>)> {
    let entries = recent.get(f.sequence)?;
    if fault == Fault::DropRefused {
        return None;
    }
    if fault != Fault::IgnoreFlowControl {
        tokio::time::sleep(Duration::from_millis(f.retry_after_ms)).await;
    }
    Some((f.sequence, entries))
}

/// Sends `report` (if any) and waits for the CA's answer: on `FlowControl`
/// sends the refused report again (this one, or an earlier one refused
/// late), as [`refused`] says.
async fn send(
    tx: &mpsc::Sender<v1::ConnectorMessage>,
    report: Option<(u64, Vec<v1::ApplicationHealth>)>,
    fault: Fault,
    refusals: &mut mpsc::Receiver<v1::FlowControl>,
    recent: &mut Recent,
) -> Result<()> {
    let mut next = report;
    for _ in 0..200 {
        if let Some((sequence, entries)) = next.take() {
            recent.keep(sequence, &entries);
            let report = v1::HealthReport {
                applications: entries,
                full_state: false,
                sequence,
            };
            tx.send(message(In::Report(report))).await?;
        }
        // The CA answers a refusal at once; silence means it took the report.
        match tokio::time::timeout(Duration::from_millis(200), refusals.recv()).await {
            Ok(Some(f)) => next = refused(f, fault, recent).await,
            _ => return Ok(()),
        }
    }
    Ok(())
}

/// Checks every continuous TCP application once.
async fn round(
    a: &Assignment,
    fault: Fault,
    resolver: &TokioResolver,
) -> Vec<v1::ApplicationHealth> {
    let pace = Duration::from_secs_f64(1.0 / f64::from(a.rate));
    let mut out = Vec::new();
    for segment in &a.segments {
        if segment.health_reporting != v1::HealthReporting::Continuous as i32 {
            continue;
        }
        for host in &segment.applications {
            let addrs = addresses(host, fault, resolver).await;
            let ports = [
                (&segment.tcp_ports, v1::Protocol::Tcp),
                (&segment.udp_ports, v1::Protocol::Udp),
            ];
            for (ranges, protocol) in ports {
                for port in ranges.iter().flat_map(|r| r.start..=r.end) {
                    let Ok(port) = u16::try_from(port) else {
                        continue;
                    };
                    let mut results = Vec::new();
                    for ip in &addrs {
                        if fault != Fault::TooFast {
                            tokio::time::sleep(pace).await;
                        }
                        let udp = protocol == v1::Protocol::Udp;
                        results.push(check(SocketAddr::new(*ip, port), udp).await);
                    }
                    out.push(entry(&segment.name, host, protocol, port, results));
                }
            }
        }
    }
    out
}

async fn addresses(host: &str, fault: Fault, resolver: &TokioResolver) -> Vec<IpAddr> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return vec![ip];
    }
    let mut all: Vec<IpAddr> = match resolver.lookup_ip(host).await {
        Ok(l) => l.iter().collect(),
        Err(_) => Vec::new(),
    };
    if fault == Fault::SkipAddress {
        all.truncate(1);
    }
    all
}

/// A TCP handshake; for a UDP port the TCP fallback alone (no ICMP echo),
/// where a reset proves the host reachable too.
async fn check(addr: SocketAddr, udp: bool) -> v1::AddressResult {
    let start = std::time::Instant::now();
    let up =
        match tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr))
            .await
        {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => udp && e.kind() == std::io::ErrorKind::ConnectionRefused,
            Err(_) => false,
        };
    v1::AddressResult {
        address: addr.ip().to_string(),
        status: if up {
            v1::HealthStatus::Up
        } else {
            v1::HealthStatus::Down
        } as i32,
        method: if udp {
            v1::CheckMethod::TcpFallback
        } else {
            v1::CheckMethod::Tcp
        } as i32,
        rtt_us: u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
        failure: if up {
            v1::FailureKind::Unspecified
        } else {
            v1::FailureKind::Refused
        } as i32,
        detail: String::new(),
        ..Default::default()
    }
}

fn entry(
    segment: &str,
    host: &str,
    protocol: v1::Protocol,
    port: u16,
    results: Vec<v1::AddressResult>,
) -> v1::ApplicationHealth {
    let up = results
        .iter()
        .any(|r| r.status == v1::HealthStatus::Up as i32);
    v1::ApplicationHealth {
        app: Some(v1::ApplicationKey {
            segment: segment.to_owned(),
            host: host.to_owned(),
            protocol: protocol as i32,
            port: u32::from(port),
        }),
        status: if up {
            v1::HealthStatus::Up
        } else {
            v1::HealthStatus::Down
        } as i32,
        addresses: results,
        checked_at_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        ..Default::default()
    }
}
