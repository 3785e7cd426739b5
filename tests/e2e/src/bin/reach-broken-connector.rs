//! A small connector written from `proto/` alone (not connector-agent's
//! code) that breaks one rule of the contract on purpose, so the
//! conformance kit's own tests can show that the kit fails the right rule:
//!
//! - `--fault too-fast`: ignores the imposed check rate (every check of a
//!   round at once, a round every 300 ms);
//! - `--fault skip-address`: checks only the first address a name resolves to;
//! - `--fault ignore-flow-control`: sends a refused report again at once,
//!   over and over, instead of waiting `retry_after_ms`.
//!
//! Otherwise it enrolls with a CSR, holds one session (to the first address
//! of the CA's name), answers pings, heartbeats, checks continuous segments'
//! TCP ports by handshake at the imposed rate and reports in batches no
//! larger than `max_report_entries`. It does not renew, attach to further
//! replicas, ping or follow on-access windows: the kit fails those rules
//! too, and its tests assert only the rule each fault breaks and rules the
//! connector does follow.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

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
}

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
    let (cert, key_pem) = enroll(target, &args, &key).await?;
    let channel = channel(target, Some(Identity::from_pem(cert, key_pem))).await?;
    session(channel, &args, &resolver).await
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

async fn enroll(target: Target<'_>, args: &Args, key: &str) -> Result<(String, String)> {
    let pair = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, args.name.as_str());
    let csr = params.serialize_request(&pair)?.pem()?;
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
    Ok((r.certificate_pem, pair.serialize_pem()))
}

/// What the session learnt from `Welcome`.
struct Assignment {
    segments: Vec<v1::Segment>,
    rate: u32,
    max_entries: usize,
}

async fn session(channel: Channel, args: &Args, resolver: &TokioResolver) -> Result<()> {
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
    let (events_tx, mut events) = mpsc::channel(64);
    let pongs = tx.clone();
    tokio::spawn(async move {
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
    let beats = tx.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(heartbeat).await;
            let beat = In::Heartbeat(v1::Heartbeat::default());
            if beats.send(message(beat)).await.is_err() {
                return;
            }
        }
    });
    let mut sequence = 0;
    loop {
        let results = round(&assignment, args.fault, resolver).await;
        for chunk in results.chunks(assignment.max_entries) {
            sequence += 1;
            send(&tx, chunk, sequence, args.fault, &mut events).await?;
        }
        let pause = if args.fault == Fault::TooFast {
            300
        } else {
            1000
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

fn message(kind: In) -> v1::ConnectorMessage {
    v1::ConnectorMessage { kind: Some(kind) }
}

/// Sends one report; on `FlowControl` sends it again, after `retry_after_ms`
/// unless the fault says otherwise.
async fn send(
    tx: &mpsc::Sender<v1::ConnectorMessage>,
    entries: &[v1::ApplicationHealth],
    sequence: u64,
    fault: Fault,
    refusals: &mut mpsc::Receiver<v1::FlowControl>,
) -> Result<()> {
    for _ in 0..200 {
        let report = v1::HealthReport {
            applications: entries.to_vec(),
            full_state: false,
            sequence,
        };
        tx.send(message(In::Report(report))).await?;
        // The CA answers a refusal at once; silence means it took the report.
        match tokio::time::timeout(Duration::from_millis(200), refusals.recv()).await {
            Ok(Some(f)) if f.sequence == sequence => {
                if fault != Fault::IgnoreFlowControl {
                    tokio::time::sleep(Duration::from_millis(f.retry_after_ms)).await;
                }
            }
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
            for range in &segment.tcp_ports {
                for port in range.start..=range.end {
                    let Ok(port) = u16::try_from(port) else {
                        continue;
                    };
                    let mut results = Vec::new();
                    for ip in &addrs {
                        if fault != Fault::TooFast {
                            tokio::time::sleep(pace).await;
                        }
                        results.push(check(SocketAddr::new(*ip, port)).await);
                    }
                    out.push(entry(&segment.name, host, port, results));
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

async fn check(addr: SocketAddr) -> v1::AddressResult {
    let start = std::time::Instant::now();
    let up = matches!(
        tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    );
    v1::AddressResult {
        address: addr.ip().to_string(),
        status: if up {
            v1::HealthStatus::Up
        } else {
            v1::HealthStatus::Down
        } as i32,
        method: v1::CheckMethod::Tcp as i32,
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
            protocol: v1::Protocol::Tcp as i32,
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
