//! Bytes a session exchanges with its CA replica, counted on the TCP
//! stream under TLS (so as on the wire: TLS records, HTTP/2 frames and
//! gRPC messages together). [`CountingConnector`] is the session channel's
//! connector: it dials TCP as tonic's own would (no delay, its connect
//! timeout applies on top) and wraps the stream in [`Counted`], which adds
//! what it reads and writes to a [`Traffic`] the heartbeat reads.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::codegen::Service;
use tonic::transport::Uri;

/// Bytes sent and received so far. Cloning shares the counts.
#[derive(Clone, Debug, Default)]
pub struct Traffic {
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
}

impl Traffic {
    /// Bytes written to the CA so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Bytes read from the CA so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

/// An I/O stream that counts what passes through it.
#[derive(Debug)]
pub struct Counted<S> {
    inner: S,
    traffic: Traffic,
}

impl<S> Counted<S> {
    /// `inner`, counted into `traffic`.
    pub fn new(inner: S, traffic: Traffic) -> Self {
        Counted { inner, traffic }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len().saturating_sub(before);
        self.traffic
            .received
            .fetch_add(read as u64, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.traffic.sent.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &polled {
            self.traffic.sent.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Dials the URI's host and port over TCP (no delay) and counts the
/// stream into its [`Traffic`].
#[derive(Clone, Debug, Default)]
pub struct CountingConnector {
    traffic: Traffic,
}

impl CountingConnector {
    /// A connector counting into `traffic`.
    pub fn new(traffic: Traffic) -> Self {
        CountingConnector { traffic }
    }
}

type Connecting = Pin<Box<dyn Future<Output = io::Result<TokioIo<Counted<TcpStream>>>> + Send>>;

impl Service<Uri> for CountingConnector {
    type Response = TokioIo<Counted<TcpStream>>;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let traffic = self.traffic.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no host"))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
                Some("https") => 443,
                _ => 80,
            });
            let stream = TcpStream::connect((host.as_str(), port)).await?;
            stream.set_nodelay(true)?;
            Ok(TokioIo::new(Counted::new(stream, traffic)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_connection_counts_both_directions() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).await.expect("read");
            s.write_all(b"0123456789").await.expect("write");
        });
        let traffic = Traffic::default();
        let mut connector = CountingConnector::new(traffic.clone());
        let uri: Uri = format!("http://{addr}").parse().expect("uri");
        let io = connector.call(uri).await.expect("connect");
        let mut stream = io.into_inner();
        stream.write_all(b"hello").await.expect("write");
        let mut back = [0u8; 10];
        stream.read_exact(&mut back).await.expect("read");
        server.await.expect("server");
        assert_eq!((traffic.sent(), traffic.received()), (5, 10));
    }
}
