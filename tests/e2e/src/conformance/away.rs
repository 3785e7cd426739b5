//! What stands at the replicas' gRPC addresses while the kit has taken them
//! away: a listener that speaks the CA's TLS (its server certificate, from
//! the shared data directory) and gRPC, and counts what the
//! `reconnect-backoff` rule names: attempts to open a `Connect` session, a
//! `Connect` stream whose first message is `Hello`, as a CA sees them. A
//! TLS handshake, an HTTP/2 connection, `Enroll` or `Renew` and a stream
//! that never says `Hello` are not session attempts and are not counted.
//! Everything is refused with UNAVAILABLE, as a CA whose store does not
//! answer refuses it: every session after its `Hello`, every `Enroll` and
//! `Renew` (a connector retries them; an answer no CA gives, such as
//! UNIMPLEMENTED, would tell it that retrying cannot help).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use protocol::v1;
use protocol::v1::connector_message::Kind as In;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// How long a stream has to send `Hello` (as at the CA).
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// One address's listener while the replica there is away.
pub struct Away {
    hellos: Arc<AtomicUsize>,
    streams: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Away {
    /// Listens at `addr` with the server certificate `cert_pem` and its key.
    pub async fn start(addr: SocketAddr, cert_pem: &str, key_pem: &str) -> Result<Self> {
        let listener = crate::retry(Duration::from_secs(5), || async {
            Ok(tokio::net::TcpListener::bind(addr).await?)
        })
        .await
        .with_context(|| format!("listening at {addr} while the replica is away"))?;
        let tls = ServerTlsConfig::new().identity(Identity::from_pem(cert_pem, key_pem));
        let mut builder = Server::builder()
            .tls_config(tls)
            .context("the CA's server certificate")?;
        let counter = Counter::default();
        let (hellos, streams) = (counter.hellos.clone(), counter.streams.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = builder
                .add_service(v1::connector_session_server::ConnectorSessionServer::new(
                    counter,
                ))
                .add_service(v1::enrollment_server::EnrollmentServer::new(Unavailable))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Away {
            hellos,
            streams,
            stop: Some(stop),
            task,
        })
    }

    /// `Connect` streams that sent `Hello` (session attempts), and all
    /// `Connect` streams opened.
    pub fn attempts(&self) -> (usize, usize) {
        (
            self.hellos.load(Ordering::Relaxed),
            self.streams.load(Ordering::Relaxed),
        )
    }

    /// Stops listening and frees the address.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

#[derive(Default)]
struct Counter {
    hellos: Arc<AtomicUsize>,
    streams: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl v1::connector_session_server::ConnectorSession for Counter {
    type ConnectStream = ReceiverStream<Result<v1::AuthorityMessage, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<v1::ConnectorMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        self.streams.fetch_add(1, Ordering::Relaxed);
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(1);
        let hellos = self.hellos.clone();
        // The answer's headers go out at once (a connector may send `Hello`
        // only once the stream is open); the refusal follows `Hello`.
        tokio::spawn(async move {
            let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await;
            if let Ok(Ok(Some(v1::ConnectorMessage {
                kind: Some(In::Hello(_)),
            }))) = first
            {
                hellos.fetch_add(1, Ordering::Relaxed);
            }
            let _ = tx
                .send(Err(Status::unavailable(
                    "the CA is away (reach-conformance counts session attempts)",
                )))
                .await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// `Enroll` and `Renew` while the CA is away: UNAVAILABLE, what a CA whose
/// store does not answer says (the connector retries).
struct Unavailable;

fn away() -> Status {
    Status::unavailable("the CA is away (reach-conformance takes the replicas away)")
}

#[tonic::async_trait]
impl v1::enrollment_server::Enrollment for Unavailable {
    async fn enroll(
        &self,
        _: Request<v1::EnrollRequest>,
    ) -> Result<Response<v1::EnrollResponse>, Status> {
        Err(away())
    }

    async fn renew(
        &self,
        _: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::EnrollResponse>, Status> {
        Err(away())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

    /// A root, and a server certificate for `localhost` it issued (PEM).
    fn certs() -> Result<(String, String, String)> {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let mut root = CertificateParams::new(Vec::<String>::new())?;
        root.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let root = rcgen::CertifiedIssuer::self_signed(root, KeyPair::generate()?)?;
        let key = KeyPair::generate()?;
        let leaf = CertificateParams::new(vec!["localhost".to_owned()])?.signed_by(&key, &root)?;
        Ok((root.pem(), leaf.pem(), key.serialize_pem()))
    }

    async fn channel(addr: SocketAddr, root: &str) -> Result<Channel> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(root))
            .domain_name("localhost");
        Ok(Endpoint::from_shared(format!("https://{addr}"))?
            .tls_config(tls)?
            .connect()
            .await?)
    }

    /// What `reconnect-backoff` counts: only `Connect` streams that say
    /// `Hello`. Connections (TLS handshakes), `Renew` and `Enroll` calls
    /// (answered UNAVAILABLE) and a stream that ends without `Hello` are
    /// not session attempts.
    #[tokio::test]
    async fn counts_connect_streams_that_say_hello_only() -> Result<()> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (root, cert, key) = certs()?;
        let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = probe.local_addr()?;
        drop(probe);
        let away = Away::start(addr, &cert, &key).await?;
        // Three connections, then one renewing and one enrolling.
        for _ in 0..3 {
            drop(channel(addr, &root).await?);
        }
        let renewal = v1::enrollment_client::EnrollmentClient::new(channel(addr, &root).await?)
            .renew(v1::RenewRequest::default())
            .await;
        // As from a CA whose store does not answer: retry (UNIMPLEMENTED
        // would say retrying cannot help, and a connector stops).
        assert_eq!(
            renewal.err().map(|s| s.code()),
            Some(tonic::Code::Unavailable)
        );
        let enrollment = v1::enrollment_client::EnrollmentClient::new(channel(addr, &root).await?)
            .enroll(v1::EnrollRequest::default())
            .await;
        assert_eq!(
            enrollment.err().map(|s| s.code()),
            Some(tonic::Code::Unavailable)
        );
        let mut session =
            v1::connector_session_client::ConnectorSessionClient::new(channel(addr, &root).await?);
        // A stream that ends before Hello.
        let silent = session
            .connect(tokio_stream::iter(Vec::<v1::ConnectorMessage>::new()))
            .await;
        if let Ok(r) = silent {
            let _ = r.into_inner().message().await;
        }
        // Two session attempts.
        for _ in 0..2 {
            let hello = v1::ConnectorMessage {
                kind: Some(In::Hello(v1::Hello::default())),
            };
            let opened = session.connect(tokio_stream::iter(vec![hello])).await?;
            let refused = opened.into_inner().message().await;
            assert_eq!(
                refused.err().map(|s| s.code()),
                Some(tonic::Code::Unavailable)
            );
        }
        assert_eq!(away.attempts(), (2, 3), "(session attempts, streams)");
        away.stop().await;
        Ok(())
    }
}
