//! Application servers on loopback that record every connection attempt, so
//! tests can assert what the connectors' checks did (and did not do).

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::net::{TcpListener, UdpSocket};

/// When each connection arrived, shared with the accept loops.
pub type Arrivals = Arc<Mutex<Vec<Instant>>>;

/// A TCP application: accepts and closes connections, recording when each
/// arrived. Stopping it closes the listener, so checks get refused.
#[derive(Debug)]
pub struct TcpApp {
    addr: SocketAddr,
    accepted: Arrivals,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TcpApp {
    /// Listens on `addr` (a loopback address).
    pub async fn start(addr: SocketAddr) -> Result<Self> {
        let mut app = TcpApp {
            addr,
            accepted: Arc::default(),
            task: None,
        };
        app.resume().await?;
        Ok(app)
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes the listener; connection attempts are refused from now on.
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Listens again on the same address.
    pub async fn resume(&mut self) -> Result<()> {
        if self.task.is_some() {
            return Ok(());
        }
        // The aborted accept loop releases its socket asynchronously; retry
        // the bind briefly.
        let mut last_err = None;
        for _ in 0..50 {
            match bind_reuse(self.addr) {
                Ok(listener) => {
                    self.task = Some(accept_loop(listener, self.accepted.clone()));
                    return Ok(());
                }
                Err(e) => {
                    last_err = Some(e);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("bind failed")))
            .with_context(|| format!("binding TCP app on {}", self.addr))
    }

    /// Every accepted connection's arrival time.
    pub fn arrivals(&self) -> Vec<Instant> {
        self.accepted.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Connections accepted so far.
    pub fn count(&self) -> usize {
        self.accepted.lock().map(|v| v.len()).unwrap_or(0)
    }

    /// Connections accepted at or after `since`.
    pub fn count_since(&self, since: Instant) -> usize {
        self.arrivals().iter().filter(|t| **t >= since).count()
    }
}

impl Drop for TcpApp {
    fn drop(&mut self) {
        self.stop();
    }
}

fn bind_reuse(addr: SocketAddr) -> Result<TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket.listen(1024)?)
}

/// Accepts (and drops) every connection on `listener`, recording when each
/// arrived, until the task is aborted.
fn accept_loop(listener: TcpListener, accepted: Arrivals) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if let Ok((stream, _)) = listener.accept().await {
                if let Ok(mut log) = accepted.lock() {
                    log.push(Instant::now());
                }
                drop(stream);
            }
        }
    })
}

/// TCP listeners on one port of every address in `ips`, accepting (and
/// dropping) every connection and recording when each was accepted. They
/// run until the test's runtime ends.
pub async fn listeners(ips: &[String]) -> (u16, Arrivals) {
    'attempt: for _ in 0..20 {
        let mut bound = Vec::new();
        let mut port = 0;
        for ip in ips {
            let ip: IpAddr = ip.parse().expect("ip");
            match TcpListener::bind((ip, port)).await {
                Ok(l) => {
                    port = l.local_addr().expect("addr").port();
                    bound.push(l);
                }
                Err(_) => continue 'attempt,
            }
        }
        let accepted = Arrivals::default();
        for l in bound {
            accept_loop(l, accepted.clone());
        }
        return (port, accepted);
    }
    panic!("no common free port on {ips:?}");
}

/// A port on `ip` with nothing listening (bound, then closed).
pub fn closed_port(ip: &str) -> u16 {
    let l = std::net::TcpListener::bind((ip.parse::<IpAddr>().expect("ip"), 0)).expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    port
}

/// A listener on loopback whose accept queue is full: the kernel drops
/// further SYNs silently, which is what a blackholed host looks like to a
/// TCP check (the handshake hangs until the checker's timeout).
#[derive(Debug)]
pub struct Blackhole {
    port: u16,
    _held: Vec<tokio::net::TcpStream>,
    _socket: socket2::Socket,
}

impl Blackhole {
    /// Listens on `ip` (a loopback address) with a backlog of 0 and fills
    /// the queue.
    pub async fn start(ip: &str) -> Result<Self> {
        let ip: IpAddr = ip.parse().with_context(|| format!("ip {ip}"))?;
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(SocketAddr::new(ip, 0)),
            socket2::Type::STREAM,
            None,
        )?;
        socket.bind(&SocketAddr::new(ip, 0).into())?;
        socket.listen(0)?;
        let port = socket
            .local_addr()?
            .as_socket()
            .context("not an inet socket")?
            .port();
        // Fill the queue (backlog 0 admits one connection).
        let mut held = Vec::new();
        for _ in 0..3 {
            if let Ok(Ok(s)) = tokio::time::timeout(
                Duration::from_millis(200),
                tokio::net::TcpStream::connect((ip, port)),
            )
            .await
            {
                held.push(s);
            }
        }
        Ok(Blackhole {
            port,
            _held: held,
            _socket: socket,
        })
    }

    /// The port whose handshakes hang.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// A UDP application: a bound socket that echoes datagrams. (UDP checks
/// reach the host by ICMP echo or TCP fallback, so it mostly exists to make
/// the example realistic.)
#[derive(Debug)]
pub struct UdpApp {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl UdpApp {
    /// Binds `addr`.
    pub async fn start(addr: SocketAddr) -> Result<Self> {
        let socket = UdpSocket::bind(addr)
            .await
            .with_context(|| format!("binding UDP app on {addr}"))?;
        let addr = socket.local_addr()?;
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
                let _ = socket.send_to(&buf[..n], peer).await;
            }
        });
        Ok(UdpApp { addr, task })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for UdpApp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The largest number of instants that fall in any window of `window`
/// (a sliding window, not fixed buckets, so no burst hides across a
/// boundary).
pub fn max_in_window(times: &[Instant], window: Duration) -> usize {
    let mut sorted = times.to_vec();
    sorted.sort();
    let mut best = 0;
    let mut start = 0;
    for end in 0..sorted.len() {
        while sorted[end].duration_since(sorted[start]) >= window {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}
