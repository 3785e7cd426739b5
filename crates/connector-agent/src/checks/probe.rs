//! Probes: a TCP three-way handshake, an ICMP echo through one shared
//! surge-ping client per address family, and the UDP-port rule (ICMP, then a
//! TCP fallback for which a handshake or a reset both prove the host
//! reachable).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use policy::{AddressResult, CheckTarget, Failure, FailureKind, Method, Protocol};
use surge_ping::{Client, ICMP, PingIdentifier, PingSequence, SurgeError};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::config::IcmpPreference;

/// Which ICMP socket the connector uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcmpMode {
    /// A raw ICMP socket (needs CAP_NET_RAW).
    Raw,
    /// An unprivileged datagram ICMP socket (`net.ipv4.ping_group_range`).
    Dgram,
    /// No ICMP: UDP ports are checked by the TCP fallback alone.
    None,
}

impl IcmpMode {
    /// The name sent in `Capabilities.icmp_mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            IcmpMode::Raw => "raw",
            IcmpMode::Dgram => "dgram",
            IcmpMode::None => "none",
        }
    }
}

/// Runs probes. One per process: every raw ICMP socket sees every ICMP
/// packet of the host, so the connector opens one per address family and
/// shares it between all checks.
#[derive(Debug)]
pub struct Prober {
    timeout_ms: AtomicU64,
    icmp_v4: Option<IcmpClient>,
    icmp_v6: Option<IcmpClient>,
    mode: IcmpMode,
    /// Source of identifiers and sequence numbers: concurrent pingers to one
    /// host must differ in them or their replies collide.
    next_id: AtomicU32,
    /// The application-level checks targets refer to.
    checks: std::sync::Mutex<crate::checks::appcheck::Registry>,
}

struct IcmpClient(Client);

impl std::fmt::Debug for IcmpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IcmpClient")
    }
}

fn open_icmp(kind: ICMP, hint: socket2::Type) -> io::Result<(Client, IcmpMode)> {
    let config = surge_ping::Config::builder()
        .kind(kind)
        .sock_type_hint(hint)
        .build();
    let client = Client::new(&config)?;
    // surge-ping falls back to the other socket type by itself; report the
    // one it got. (Its socket exposes no `AsFd`, so the receive buffer cannot
    // be enlarged without unsafe code, which this crate forbids; the pacer's
    // rate keeps concurrency far below where the default buffer overflows.)
    let mode = if client.get_socket().get_type() == socket2::Type::RAW {
        IcmpMode::Raw
    } else {
        IcmpMode::Dgram
    };
    Ok((client, mode))
}

impl Prober {
    /// Opens the ICMP sockets `preference` asks for. Never fails: where
    /// neither socket type can be opened it warns once and UDP ports are
    /// checked by the TCP fallback alone. Must run inside a tokio runtime.
    pub fn new(preference: IcmpPreference, timeout: Duration) -> Self {
        let hint = match preference {
            IcmpPreference::Off => None,
            IcmpPreference::Auto | IcmpPreference::Raw => Some(socket2::Type::RAW),
            IcmpPreference::Dgram => Some(socket2::Type::DGRAM),
        };
        let (mut v4, mut v6, mut mode) = (None, None, IcmpMode::None);
        if let Some(hint) = hint {
            match open_icmp(ICMP::V4, hint) {
                Ok((client, m)) => {
                    v4 = Some(IcmpClient(client));
                    mode = m;
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "no ICMP socket (raw or unprivileged) can be opened: UDP ports are \
                     checked by the TCP fallback alone; {}",
                    build_info::hints::see(build_info::hints::ICMP)
                ),
            }
            match open_icmp(ICMP::V6, hint) {
                Ok((client, _)) => v6 = Some(IcmpClient(client)),
                Err(e) => tracing::debug!(error = %e, "no ICMPv6 socket"),
            }
        }
        tracing::info!(icmp = mode.as_str(), "probes ready");
        Prober {
            timeout_ms: AtomicU64::new(duration_ms(timeout)),
            icmp_v4: v4,
            icmp_v6: v6,
            mode,
            next_id: AtomicU32::new(rand::random()),
            checks: std::sync::Mutex::default(),
        }
    }

    /// The id a [`CheckTarget`] carries for the application `host`'s check
    /// `check` (0 for the bare TCP handshake).
    pub fn check_id(&self, host: &policy::Host, check: &policy::AppCheck) -> u32 {
        self.checks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .id(host, check)
    }

    /// The ICMP socket in use (for IPv4; IPv6 follows it where possible).
    pub fn icmp_mode(&self) -> IcmpMode {
        self.mode
    }

    /// The probe timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// Changes the probe timeout (the CA may impose one).
    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout_ms
            .store(duration_ms(timeout).max(1), Ordering::Relaxed);
    }

    /// Checks one target according to its protocol.
    pub async fn check(&self, target: CheckTarget) -> AddressResult {
        let addr = SocketAddr::new(target.address, target.port);
        let timeout = self.timeout();
        match target.protocol {
            Protocol::Tcp if target.check != 0 => {
                let probe = self
                    .checks
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(target.check);
                let Some(probe) = probe else {
                    return not_run(target, "unknown application check");
                };
                let deadline = Instant::now() + timeout;
                match connect(addr, timeout).await {
                    Ok((stream, rtt)) => {
                        probe
                            .run(target.address, stream, rtt, deadline, timeout)
                            .await
                    }
                    Err(failure) => result(target.address, Method::Tcp, Err(failure)),
                }
            }
            Protocol::Tcp => {
                let outcome = tcp_handshake(addr, timeout).await;
                result(target.address, Method::Tcp, outcome)
            }
            Protocol::Udp => {
                if let Some(client) = self.icmp_client(target.address) {
                    match self.echo(client, target.address, timeout).await {
                        Ok(rtt) => return result(target.address, Method::Icmp, Ok(rtt)),
                        Err(failure) => {
                            tracing::trace!(%addr, %failure.detail, "no ICMP reply, trying TCP");
                        }
                    }
                }
                // A UDP service cannot be probed by handshake: a completed
                // handshake or a reset both prove the host reachable.
                let outcome = match tcp_handshake(addr, timeout).await {
                    Err((f, rtt)) if f.kind == FailureKind::Refused => Ok(rtt),
                    other => other,
                };
                result(target.address, Method::TcpFallback, outcome)
            }
        }
    }

    fn icmp_client(&self, ip: IpAddr) -> Option<&Client> {
        match ip {
            IpAddr::V4(_) => self.icmp_v4.as_ref().map(|c| &c.0),
            IpAddr::V6(_) => self.icmp_v6.as_ref().map(|c| &c.0),
        }
    }

    async fn echo(
        &self,
        client: &Client,
        ip: IpAddr,
        timeout: Duration,
    ) -> Result<Duration, Failure> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // Truncation is intended: identifiers and sequences cycle through
        // 65,536 values, far more than checks in flight.
        let mut pinger = client.pinger(ip, PingIdentifier(id as u16)).await;
        pinger.timeout(timeout);
        match pinger.ping(PingSequence(id as u16), &[0u8; 16]).await {
            Ok((_, rtt)) => Ok(rtt),
            Err(SurgeError::Timeout { .. }) => Err(Failure {
                kind: FailureKind::Timeout,
                detail: format!("no ICMP echo reply within {} ms", timeout.as_millis()),
            }),
            Err(SurgeError::IOError(e)) => Err(io_failure(&e)),
            Err(e) => Err(Failure {
                kind: FailureKind::Other,
                detail: e.to_string(),
            }),
        }
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A failure and how long it took to learn it.
type Outcome = Result<Duration, (Failure, Duration)>;

async fn tcp_handshake(addr: SocketAddr, timeout: Duration) -> Outcome {
    // The connection is dropped at once: a handshake is all we need.
    connect(addr, timeout).await.map(|(_stream, rtt)| rtt)
}

/// A TCP connection to `addr` and how long its handshake took.
async fn connect(
    addr: SocketAddr,
    timeout: Duration,
) -> Result<(TcpStream, Duration), (Failure, Duration)> {
    let start = Instant::now();
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => Ok((stream, start.elapsed())),
        Ok(Err(e)) => Err((io_failure(&e), start.elapsed())),
        Err(_) => Err((
            Failure {
                kind: FailureKind::Timeout,
                detail: format!("no TCP handshake within {} ms", timeout.as_millis()),
            },
            start.elapsed(),
        )),
    }
}

fn io_failure(e: &io::Error) -> Failure {
    let kind = match e.kind() {
        io::ErrorKind::ConnectionRefused => FailureKind::Refused,
        io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
            FailureKind::Unreachable
        }
        io::ErrorKind::TimedOut => FailureKind::Timeout,
        _ => FailureKind::Other,
    };
    Failure {
        kind,
        detail: e.to_string(),
    }
}

fn result(address: IpAddr, method: Method, outcome: Outcome) -> AddressResult {
    match outcome {
        Ok(rtt) => AddressResult {
            check: None,
            address,
            reachable: true,
            method,
            rtt,
            failure: None,
        },
        Err((failure, _)) => AddressResult {
            check: None,
            address,
            reachable: false,
            method,
            rtt: Duration::ZERO,
            failure: Some(failure),
        },
    }
}

/// A result for a check that could not run (e.g. the connector is shutting
/// down).
pub fn not_run(target: CheckTarget, detail: &str) -> AddressResult {
    AddressResult {
        check: None,
        address: target.address,
        reachable: false,
        method: match target.protocol {
            Protocol::Tcp => Method::Tcp,
            Protocol::Udp => Method::Icmp,
        },
        rtt: Duration::ZERO,
        failure: Some(Failure {
            kind: FailureKind::Other,
            detail: detail.to_owned(),
        }),
    }
}

/// Shared handle to the prober.
pub type SharedProber = Arc<Prober>;
