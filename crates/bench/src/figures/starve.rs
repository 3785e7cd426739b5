//! Listener starvation: the CA over TLS with 2,000 idle TCP connections and
//! 200 slow TLS clients held open against its HTTPS listener (from 110
//! loopback addresses, 20 each, so no per-source cap refuses them outright;
//! any connection the CA closes is opened again at once), while a client on
//! 127.0.0.1 makes access requests, each on a fresh connection (TCP, TLS,
//! `POST /api/v1/access`, answer). Reported: the p99 of those requests, and
//! the most file descriptors the CA held (`/proc/PID/fd`) against its cap
//! (`/proc/PID/limits`, "Max open files").
//!
//! No connector is connected: the answer is the CA's decision for a segment
//! without one (503 `no_connector`), decided like any other; what is
//! measured is whether a client gets through the crowd, not selection.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::stats::{ms, quantile};

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "starve_access_p99_ms",
        unit: "ms",
        goal: Goal::AtMost { limit: 100.0 },
    },
    Spec {
        name: "starve_ca_fds_percent_of_cap",
        unit: "%",
        goal: Goal::AtMost { limit: 100.0 },
    },
];

const IDLE: usize = 2000;
const SLOW_TLS: usize = 200;
/// Hostile connections per source address.
const PER_ADDRESS: usize = 20;

/// The first bytes of a TLS ClientHello record; a slow client sends one
/// of them at a time.
const CLIENT_HELLO_PREFIX: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01];

/// The `n`-th hostile source address (127.1.x.y).
fn hostile(n: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 1, (n / 250) as u8, (n % 250 + 1) as u8))
}

async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// Keeps one hostile connection open from `from` until `stop`: silent, or
/// sending a ClientHello prefix a byte every half second; reopened when the
/// CA closes it.
async fn hold(from: IpAddr, to: SocketAddr, slow_tls: bool, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = connect_from(from, to).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut buf = [0u8; 256];
        let mut sent = 0;
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if slow_tls && sent < CLIENT_HELLO_PREFIX.len() {
                if s.write_all(&CLIENT_HELLO_PREFIX[sent..=sent])
                    .await
                    .is_err()
                {
                    break;
                }
                sent += 1;
            }
            match tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) | Err(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A file's count of entries (`/proc/PID/fd`).
fn open_fds(pid: u32) -> Option<usize> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|d| d.count())
}

/// One access request on a fresh TLS connection; the time to its answer.
async fn access(tls: &tokio_rustls::TlsConnector, to: SocketAddr, body: &str) -> Result<Duration> {
    let t = Instant::now();
    let tcp = TcpStream::connect(to).await?;
    let _ = tcp.set_nodelay(true);
    let name = rustls::pki_types::ServerName::IpAddress(to.ip().into());
    let mut s = tls.connect(name, tcp).await?;
    let request = format!(
        "POST /api/v1/access HTTP/1.1\r\nhost: {to}\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        ca::TOKEN,
        body.len()
    );
    s.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await?;
    let status = answer
        .split(|&b| b == b' ')
        .nth(1)
        .and_then(|c| std::str::from_utf8(c).ok())
        .unwrap_or("");
    if !matches!(status, "200" | "503") {
        bail!("unexpected answer: {:?}", String::from_utf8_lossy(&answer));
    }
    Ok(t.elapsed())
}

/// A TLS client that trusts the CA's root in `data_dir`.
fn client(root_pem: &[u8]) -> Result<tokio_rustls::TlsConnector> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(root_pem) {
        roots.add(c?)?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// The configuration without its `[limits]` section (the CA's defaults).
fn without_limits(text: &str) -> Result<String> {
    let start = text
        .find("[limits]\n")
        .context("the bench configuration has no [limits]")?;
    let end = start
        + text[start..]
            .find("\n[")
            .context("[limits] is the configuration's last section")?;
    Ok(format!("{}{}", &text[..start], &text[end + 1..]))
}

/// Measures both figures.
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let (idle, slow) = mode.pick((IDLE / 10, SLOW_TLS / 10), (IDLE, SLOW_TLS));
    let requests = mode.pick(50, 600);
    // This process holds every hostile connection.
    let need = (idle + slow + 256) as u64;
    crate::sys::need_open_files(need, "starve's hostile connections")?;
    let text = ca::config_text(&CaSetup {
        ingest_apps: 0,
        ..CaSetup::default()
    })
    .replace("[tls]\nenabled = false", "[tls]\nenabled = true");
    // The other figures lift the connection caps; this one measures the
    // defaults.
    let text = without_limits(&text)?;
    let (server, dir) = ca::start_text(&text).await?;
    let pid = server.pid().context("the CA has no process id")?;
    let root_path = dir.join("reach-ca-data").join("ca.pem");
    ca::wait_until(Duration::from_secs(10), "the CA's root", || {
        let p = root_path.clone();
        async move { Ok(p.exists()) }
    })
    .await?;
    let tls = client(&std::fs::read(&root_path)?)?;
    let body = serde_json::json!({"host": ca::APP_HOST, "protocol": "tcp", "port": ca::APP_PORT})
        .to_string();
    // Warm up before the crowd arrives.
    access(&tls, server.http, &body).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let mut crowd = Vec::new();
    for i in 0..idle + slow {
        let from = hostile(i / PER_ADDRESS);
        crowd.push(tokio::spawn(hold(
            from,
            server.http,
            i >= idle,
            stop.clone(),
        )));
    }
    // Let the crowd fill the listener.
    tokio::time::sleep(mode.pick(Duration::from_secs(1), Duration::from_secs(5))).await;

    let (mut lat, mut max_fds, mut failed) = (Vec::with_capacity(requests), 0usize, 0usize);
    // The first failure's error, for the note.
    let mut first_error = None;
    for _ in 0..requests {
        match access(&tls, server.http, &body).await {
            Ok(d) => lat.push(d),
            Err(e) => {
                failed += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
        }
        max_fds = max_fds.max(open_fds(pid).unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cap = crate::sys::fd_cap(Some(pid)).unwrap_or(0);
    stop.store(true, Ordering::Relaxed);
    for t in crowd {
        t.abort();
    }
    drop(server);
    if lat.is_empty() {
        bail!("no access request was answered ({failed} failed)");
    }
    lat.sort();
    let note = format!(
        "{idle} idle TCP + {slow} slow TLS connections held from {} addresses ({PER_ADDRESS} \
         each, reopened when closed); {} access requests on fresh TLS connections from 127.0.0.1, \
         {failed} failed{}; p50 {:.2} ms",
        (idle + slow).div_ceil(PER_ADDRESS),
        lat.len() + failed,
        first_error.map_or_else(String::new, |e| format!(" (first: {e})")),
        ms(quantile(&lat, 0.5)),
    );
    let percent = if cap > 0 {
        max_fds as f64 * 100.0 / cap as f64
    } else {
        f64::NAN
    };
    Ok(vec![
        SPECS[0].figure(ms(quantile(&lat, 0.99)), None, note),
        SPECS[1].figure(
            percent,
            None,
            format!("most open descriptors {max_fds} of a cap of {cap} (/proc/PID/fd, limits)"),
        ),
    ])
}
