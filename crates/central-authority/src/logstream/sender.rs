//! A receiver's sender: one task that keeps its connection (tcp, tls) or
//! file open and streams its spool into it, in order.
//!
//! Delivery is at least once. Over a stream, a record counts as taken
//! only once `resend_window` bytes more were written after it: what a
//! broken connection may have lost (the CA's send queue, the receiver's
//! socket buffer, taken by TCP but never read) lies within that window, and
//! the next connection starts at the oldest record not yet counted as taken.
//! A file takes a record once it is written. Reconnects back off from
//! 200 ms doubling to 30 s, with full jitter.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

use super::format;
use super::spool::Reader;
use super::{Destination, ReceiverSpec, Stats};

/// The first reconnect delay and the longest.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(30));
/// How long a connection (with the TLS handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after a connection a receiver may still refuse it before the
/// first record goes out.
const SETTLE: Duration = Duration::from_millis(200);
/// A receiver that takes nothing this long is reconnected.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// The most bytes of messages written at once.
const BATCH_BYTES: usize = 256 << 10;
/// The CA's send buffer asked for (Linux doubles it).
const SEND_BUFFER: u32 = 256 << 10;
/// The bytes a broken connection may have lost at most: the CA's send
/// buffer (512 KiB) and a receiver's socket buffer (Linux grows one to
/// 6 MiB at most by default).
const RESEND_WINDOW: u64 = 8 << 20;

/// The resend window for a spool of `spool_bytes`: at most a quarter of
/// it, so records counted as not yet taken never fill the spool.
fn resend_window(spool_bytes: u64) -> u64 {
    RESEND_WINDOW.min(spool_bytes / 4)
}

/// Why a connection ended.
enum End {
    /// Told to stop.
    Stopped,
    /// Broken, after records went out (the backoff starts over).
    Broken(String),
    /// Failed before any record went out.
    Failed(String),
}

/// Runs the receiver's sender until `stop` is set.
pub(crate) async fn run(
    spec: &ReceiverSpec,
    mut reader: Reader,
    stats: &Stats,
    mut stop: watch::Receiver<bool>,
) {
    let mut delay = BACKOFF.0;
    loop {
        if *stop.borrow() {
            break;
        }
        let end = match &spec.destination {
            Destination::File { path } => to_file(spec, path, &mut reader, stats, &mut stop).await,
            Destination::Tcp { .. } | Destination::Tls { .. } => {
                to_stream(spec, &mut reader, stats, &mut stop).await
            }
        };
        stats.set_connected(false);
        match end {
            End::Stopped => break,
            End::Broken(e) => {
                tracing::warn!(receiver = %spec.name, error = %e, "log receiver connection lost");
                stats.error(e);
                delay = BACKOFF.0;
            }
            End::Failed(e) => {
                tracing::debug!(receiver = %spec.name, error = %e, "log receiver unreachable");
                stats.error(e);
            }
        }
        let wait = Duration::from_millis(rand::random_range(0..=delay.as_millis() as u64));
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stopped(&mut stop) => break,
        }
        delay = (delay * 2).min(BACKOFF.1);
    }
    let spool = reader.spool();
    if let Err(e) = spool.confirm(spool.confirmed(), true) {
        tracing::warn!(receiver = %spec.name, error = %e, "cannot keep the log spool's position");
    }
}

/// Resolves once `stop` is set or its sender is gone.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

async fn connect(destination: &Destination) -> Result<Box<dyn Stream>, String> {
    let (host, port) = match destination {
        Destination::Tcp { host, port } | Destination::Tls { host, port, .. } => (host, *port),
        Destination::File { .. } => return Err("not a stream".to_owned()),
    };
    let addr = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} has no address"))?;
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(|e| format!("socket: {e}"))?;
    let _ = socket.set_send_buffer_size(SEND_BUFFER);
    let tcp = socket
        .connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let _ = tcp.set_nodelay(true);
    let Destination::Tls {
        root_file,
        server_name,
        client,
        ..
    } = destination
    else {
        return Ok(Box::new(tcp));
    };
    let config = tls_config(root_file, client.as_ref())?;
    let name = rustls::pki_types::ServerName::try_from(server_name.clone())
        .map_err(|e| format!("server name {server_name}: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake with {addr}: {e}"))?;
    Ok(Box::new(tls))
}

/// The client configuration of a tls receiver: its roots, and the client
/// certificate if it has one.
pub(crate) fn tls_config(
    root_file: &std::path::Path,
    client: Option<&(std::path::PathBuf, std::path::PathBuf)>,
) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(root_file)
        .map_err(|e| format!("root_file {}: {e}", root_file.display()))?
    {
        let cert = cert.map_err(|e| format!("root_file {}: {e}", root_file.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("root_file {}: {e}", root_file.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("root_file {}: no certificate", root_file.display()));
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS: {e}"))?
    .with_root_certificates(roots);
    match client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("client_cert_file {}: {e}", cert.display()))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("client_key_file {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client certificate: {e}"))
        }
    }
}

/// One connection to a tcp or tls receiver, from the oldest record not
/// counted as taken until it breaks or `stop` is set.
async fn to_stream(
    spec: &ReceiverSpec,
    reader: &mut Reader,
    stats: &Stats,
    stop: &mut watch::Receiver<bool>,
) -> End {
    let stream = tokio::select! {
        r = tokio::time::timeout(CONNECT_TIMEOUT, connect(&spec.destination)) => match r {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return End::Failed(e),
            Err(_) => return End::Failed("connection timed out".to_owned()),
        },
        () = stopped(stop) => return End::Stopped,
    };
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut scratch = [0u8; 512];
    if let Some(end) = settle(&mut rd, &mut scratch, stop).await {
        return end;
    }
    stats.set_connected(true);
    let mut buf = format::header(spec.format).unwrap_or_default();
    let spool = reader.spool().clone();
    let window = resend_window(spec.spool_bytes);
    let mut pos = spool.confirmed();
    // Each written batch: the record after it and the bytes written by
    // its end; a batch leaves once `window` bytes followed it.
    let mut marks = std::collections::VecDeque::new();
    let mut written = 0u64;
    let mut progressed = false;
    loop {
        let (first, batch) = match reader.read(pos, BATCH_BYTES) {
            Ok(b) => b,
            Err(e) => return End::Broken(format!("cannot read the spool: {e}")),
        };
        pos = first;
        if batch.is_empty() && buf.is_empty() {
            tokio::select! {
                () = spool.committed.notified() => continue,
                r = rd.read(&mut scratch) => match r {
                    Ok(0) => return broken(progressed, "the receiver closed the connection".to_owned()),
                    Ok(_) => continue,
                    Err(e) => return broken(progressed, format!("read: {e}")),
                },
                () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                () = stopped(stop) => return End::Stopped,
            }
        }
        for message in &batch {
            format::frame(spec.format, true, message, &mut buf);
        }
        let write = async {
            wr.write_all(&buf).await?;
            wr.flush().await
        };
        tokio::select! {
            r = tokio::time::timeout(WRITE_TIMEOUT, write) => match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return broken(progressed, format!("write: {e}")),
                Err(_) => return broken(progressed, "the receiver took nothing for 60 s".to_owned()),
            },
            () = stopped(stop) => return End::Stopped,
        }
        written += buf.len() as u64;
        buf.clear();
        pos += batch.len() as u64;
        progressed = true;
        stats.sent(batch.len() as u64);
        marks.push_back((pos, written));
        if let Some(taken) = taken(&mut marks, written, window)
            && let Err(e) = spool.confirm(taken, false)
        {
            return End::Broken(format!("cannot keep the spool's position: {e}"));
        }
        stats.spool_usage(spool.usage());
    }
}

/// Waits [`SETTLE`] for a receiver to refuse a connection: one that does
/// says so right after it (a TLS 1.3 server checks the client certificate
/// after the handshake completed on the client's side and answers with an
/// alert). `None` when it did not.
async fn settle(
    rd: &mut (impl AsyncRead + Unpin),
    scratch: &mut [u8],
    stop: &mut watch::Receiver<bool>,
) -> Option<End> {
    tokio::select! {
        r = rd.read(scratch) => match r {
            Ok(0) => Some(End::Failed("the receiver closed the connection at once".to_owned())),
            Ok(_) => None,
            Err(e) => Some(End::Failed(format!("the receiver refused the connection: {e}"))),
        },
        () = tokio::time::sleep(SETTLE) => None,
        () = stopped(stop) => Some(End::Stopped),
    }
}

/// The record every record before which is counted as taken: the last
/// batch end that `window` bytes or more followed (its mark and older ones
/// leave `marks`).
fn taken(
    marks: &mut std::collections::VecDeque<(u64, u64)>,
    written: u64,
    window: u64,
) -> Option<u64> {
    let mut taken = None;
    while let Some(&(next, at)) = marks.front() {
        if written - at < window {
            break;
        }
        taken = Some(next);
        marks.pop_front();
    }
    taken
}

fn broken(progressed: bool, why: String) -> End {
    if progressed {
        End::Broken(why)
    } else {
        End::Failed(why)
    }
}

/// The file receiver: appends to `path`, rotating it at `file_max_bytes`
/// to `path.1` (and `path.1` to `path.2`, … keeping `file_keep`).
async fn to_file(
    spec: &ReceiverSpec,
    path: &std::path::Path,
    reader: &mut Reader,
    stats: &Stats,
    stop: &mut watch::Receiver<bool>,
) -> End {
    let open = |path: std::path::PathBuf| async move {
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .await
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        let size = file.metadata().await.map(|m| m.len()).unwrap_or(0);
        Ok::<_, String>((file, size))
    };
    let (mut file, mut size) = match open(path.to_owned()).await {
        Ok(f) => f,
        Err(e) => return End::Failed(e),
    };
    stats.set_connected(true);
    let spool = reader.spool().clone();
    let mut pos = spool.confirmed();
    let mut buf = Vec::new();
    if size == 0 {
        buf.extend(format::header(spec.format).unwrap_or_default());
    }
    // Batches small beside the rotation size, so files end near it.
    let most = usize::try_from(spec.file_max_bytes / 4).map_or(BATCH_BYTES, |m| m.min(BATCH_BYTES));
    loop {
        let (first, batch) = match reader.read(pos, most) {
            Ok(b) => b,
            Err(e) => return End::Broken(format!("cannot read the spool: {e}")),
        };
        pos = first;
        if batch.is_empty() {
            tokio::select! {
                () = spool.committed.notified() => continue,
                () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                () = stopped(stop) => return End::Stopped,
            }
        }
        let mut body = Vec::new();
        for message in &batch {
            format::frame(spec.format, false, message, &mut body);
        }
        if size > 0 && size + (buf.len() + body.len()) as u64 > spec.file_max_bytes {
            if let Err(e) = rotate(path, spec.file_keep).await {
                return End::Broken(e);
            }
            (file, size) = match open(path.to_owned()).await {
                Ok(f) => f,
                Err(e) => return End::Broken(e),
            };
            buf = format::header(spec.format).unwrap_or_default();
        }
        buf.extend_from_slice(&body);
        if let Err(e) = async {
            file.write_all(&buf).await?;
            file.flush().await
        }
        .await
        {
            return End::Broken(format!("cannot write {}: {e}", path.display()));
        }
        size += buf.len() as u64;
        buf.clear();
        pos += batch.len() as u64;
        stats.sent(batch.len() as u64);
        if let Err(e) = spool.confirm(pos, false) {
            return End::Broken(format!("cannot keep the spool's position: {e}"));
        }
        stats.spool_usage(spool.usage());
    }
}

/// `path.N-1` → `path.N` … `path` → `path.1`; the oldest beyond `keep`
/// is removed (with `keep` 0 the file starts over).
async fn rotate(path: &std::path::Path, keep: u32) -> Result<(), String> {
    let numbered = |n: u32| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        std::path::PathBuf::from(p)
    };
    if keep == 0 {
        return tokio::fs::remove_file(path)
            .await
            .map_err(|e| format!("cannot remove {}: {e}", path.display()));
    }
    let _ = tokio::fs::remove_file(numbered(keep)).await;
    for n in (1..keep).rev() {
        let _ = tokio::fs::rename(numbered(n), numbered(n + 1)).await;
    }
    tokio::fs::rename(path, numbered(1))
        .await
        .map_err(|e| format!("cannot rotate {}: {e}", path.display()))
}
