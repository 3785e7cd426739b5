//! A web application on loopback for application-level checks: answers
//! every HTTP/1.1 request with the status it is told (changeable while it
//! runs), or 421 when the request's `Host` is not the one it wants, over
//! TCP or TLS with certificates made here (a test CA and a leaf for a name,
//! valid or expired). Counts the requests that reached it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

use anyhow::Context as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// A test CA and a leaf certificate it issued for one name.
#[derive(Debug)]
pub struct Certs {
    /// The CA's certificate, PEM (what `check_ca_file` holds).
    pub ca_pem: String,
    /// The leaf's chain, DER.
    pub chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// The leaf's key, DER (PKCS#8).
    pub key: Vec<u8>,
    /// The leaf's notAfter, Unix seconds.
    pub not_after: i64,
}

impl Certs {
    /// A CA, and a leaf for `name` (a DNS name or an IP address) valid
    /// from `not_before` to `not_after` (Unix seconds).
    pub fn issue(name: &str, not_before: i64, not_after: i64) -> anyhow::Result<Certs> {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("reach test CA {}", next_ca()),
        );
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;
        let leaf_key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![name.to_owned()])?;
        params.not_before = time::OffsetDateTime::from_unix_timestamp(not_before)?;
        params.not_after = time::OffsetDateTime::from_unix_timestamp(not_after)?;
        let leaf = params.signed_by(&leaf_key, &ca)?;
        Ok(Certs {
            ca_pem: ca.pem(),
            chain: vec![leaf.der().clone()],
            key: leaf_key.serialize_der(),
            not_after,
        })
    }
}

/// A distinct number per CA of this process (CAs with one name would be
/// taken for each other by a verifier).
fn next_ca() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A running web application; stops when dropped.
#[derive(Debug)]
pub struct WebApp {
    addr: SocketAddr,
    status: Arc<AtomicU16>,
    requests: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WebApp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WebApp {
    /// Serves plain HTTP on `ip` (a free port), answering `status`; with
    /// `want_host`, a request whose `Host` differs gets 421.
    pub async fn http(ip: &str, status: u16, want_host: Option<&str>) -> anyhow::Result<WebApp> {
        Self::http_at(port_zero(ip)?, status, want_host).await
    }

    /// [`WebApp::http`] on a given address and port.
    pub async fn http_at(
        addr: SocketAddr,
        status: u16,
        want_host: Option<&str>,
    ) -> anyhow::Result<WebApp> {
        Self::start(addr, status, want_host, None).await
    }

    /// Serves HTTPS with `certs`' leaf.
    pub async fn https(
        ip: &str,
        status: u16,
        want_host: Option<&str>,
        certs: &Certs,
    ) -> anyhow::Result<WebApp> {
        Self::https_at(port_zero(ip)?, status, want_host, certs).await
    }

    /// [`WebApp::https`] on a given address and port.
    pub async fn https_at(
        addr: SocketAddr,
        status: u16,
        want_host: Option<&str>,
        certs: &Certs,
    ) -> anyhow::Result<WebApp> {
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certs.key.clone().into());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs.chain.clone(), key)?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        Self::start(addr, status, want_host, Some(acceptor)).await
    }

    async fn start(
        addr: SocketAddr,
        status: u16,
        want_host: Option<&str>,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> anyhow::Result<WebApp> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("bind {addr}"))?;
        let addr = listener.local_addr()?;
        let status = Arc::new(AtomicU16::new(status));
        let requests = Arc::new(AtomicU64::new(0));
        let want: Option<Arc<str>> = want_host.map(Into::into);
        let (s, r) = (status.clone(), requests.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (s, r, want, tls) = (s.clone(), r.clone(), want.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                answer(stream, &s, &r, want.as_deref()).await;
                            }
                        }
                        None => answer(stream, &s, &r, want.as_deref()).await,
                    }
                });
            }
        });
        Ok(WebApp {
            addr,
            status,
            requests,
            task,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers `status` from now on.
    pub fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    /// Requests answered so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::SeqCst)
    }
}

/// `ip` with port 0 (any free port).
fn port_zero(ip: &str) -> anyhow::Result<SocketAddr> {
    let ip: std::net::IpAddr = ip.parse().with_context(|| format!("address {ip:?}"))?;
    Ok(SocketAddr::new(ip, 0))
}

/// Reads one request's head and answers it.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    status: &AtomicU16,
    requests: &AtomicU64,
    want_host: Option<&str>,
) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    requests.fetch_add(1, Ordering::SeqCst);
    let text = String::from_utf8_lossy(&head);
    let host = text.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("host")
            .then(|| value.trim().to_owned())
    });
    let code = match want_host {
        Some(want) if host.as_deref() != Some(want) => 421,
        _ => status.load(Ordering::SeqCst),
    };
    let body = "a body the check does not need";
    let response = format!(
        "HTTP/1.1 {code} Test\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}
