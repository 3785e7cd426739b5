//! Application-level checks of a TCP port (a segment's `check`): after the
//! handshake, a TLS handshake (`tls`), one HTTP/1.1 `GET` (`http`), or that
//! request over TLS (`https`). The whole check has the probe timeout; the
//! round-trip time reported is the TCP handshake's, as for a bare check.
//!
//! Without roots (`check_ca_file`) any certificate is accepted (the
//! handshake's signature is still verified, proving the server holds the
//! key); with roots the certificate is verified against them for the
//! application's name (or IP). Either way the leaf certificate's notAfter
//! is read and reported. The HTTP body is never read: the status line and
//! headers decide.

use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use policy::{AddressResult, AppCheck, CheckDetail, CheckKind, Failure, FailureKind, Host, Method};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// One application's check, ready to run against any of its addresses.
#[derive(Debug)]
pub struct AppProbe {
    kind: CheckKind,
    /// The `Host` header: the application's name (an IPv6 literal in
    /// brackets).
    host_header: String,
    /// SNI and the name verified: a DNS name for FQDN applications, the
    /// address for IP ones (no SNI is sent then).
    server_name: ServerName<'static>,
    path: String,
    expect: policy::StatusRanges,
    provider: Arc<CryptoProvider>,
    /// The roots' verifier, `None` without roots, or why the roots cannot
    /// be used (every check then fails with it).
    verifier: Result<Option<Arc<WebPkiServerVerifier>>, String>,
}

impl AppProbe {
    /// The check `check` of the application named `host`.
    pub fn new(host: &Host, check: &AppCheck) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (host_header, server_name) = match host.ip() {
            Some(IpAddr::V6(ip)) => (format!("[{ip}]"), ServerName::IpAddress(ip.into())),
            Some(IpAddr::V4(ip)) => (ip.to_string(), ServerName::IpAddress(ip.into())),
            None => {
                let name = host.as_str().to_owned();
                let server = ServerName::try_from(name.clone())
                    .unwrap_or_else(|_| ServerName::IpAddress(IpAddr::from([0, 0, 0, 0]).into()));
                (name, server)
            }
        };
        let verifier = match &check.ca_pem {
            None => Ok(None),
            Some(pem) => roots_verifier(pem, provider.clone()).map(Some),
        };
        AppProbe {
            kind: check.kind,
            host_header,
            server_name,
            path: check.path.clone(),
            expect: check.expect.clone(),
            provider,
            verifier,
        }
    }

    /// Finishes the check of `address` over `stream`, whose TCP handshake
    /// took `rtt`, by `deadline` (the probe `timeout` from the check's
    /// start).
    pub async fn run(
        &self,
        address: IpAddr,
        stream: TcpStream,
        rtt: Duration,
        deadline: Instant,
        timeout: Duration,
    ) -> AddressResult {
        let stage = if self.kind.uses_tls() { "tls" } else { "http" };
        let outcome = tokio::time::timeout_at(deadline, self.after_handshake(stream)).await;
        let (result, not_after) = match outcome {
            Ok(r) => r,
            Err(_) => (
                Err(format!(
                    "{stage}: no answer within {} ms",
                    timeout.as_millis()
                )),
                None,
            ),
        };
        match result {
            Ok(()) => AddressResult {
                address,
                reachable: true,
                method: Method::Tcp,
                rtt,
                failure: None,
                check: not_after.map(|t| {
                    Box::new(CheckDetail {
                        reason: None,
                        not_after: Some(t),
                    })
                }),
            },
            Err(reason) => {
                let kind = if reason.contains("no answer within") {
                    FailureKind::Timeout
                } else {
                    FailureKind::Other
                };
                let failure = Failure {
                    kind,
                    detail: reason.clone(),
                };
                down(address, failure, Some((reason, not_after)))
            }
        }
    }

    /// The check's steps after the TCP handshake; the certificate's
    /// notAfter comes back whether or not they succeed.
    async fn after_handshake(&self, stream: TcpStream) -> (Result<(), String>, Option<i64>) {
        match self.kind {
            CheckKind::Tcp => (Ok(()), None),
            CheckKind::Http => (self.get(stream).await, None),
            CheckKind::Tls | CheckKind::Https => {
                let (tls, not_after) = self.tls(stream).await;
                let result = match tls {
                    Ok(tls) if self.kind == CheckKind::Https => self.get(tls).await,
                    Ok(_) => Ok(()),
                    Err(reason) => Err(reason),
                };
                (result, not_after)
            }
        }
    }

    /// A TLS handshake over `stream`.
    async fn tls(
        &self,
        stream: TcpStream,
    ) -> (
        Result<tokio_rustls::client::TlsStream<TcpStream>, String>,
        Option<i64>,
    ) {
        let inner = match &self.verifier {
            Ok(v) => v.clone(),
            Err(e) => return (Err(e.clone()), None),
        };
        let recording = Arc::new(Recording {
            inner,
            provider: self.provider.clone(),
            not_after: Mutex::new(None),
        });
        let config = match rustls::ClientConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
        {
            Ok(b) => {
                let mut config = b
                    .dangerous()
                    .with_custom_certificate_verifier(recording.clone())
                    .with_no_client_auth();
                // Every check sees the certificate: no resumption.
                config.resumption = rustls::client::Resumption::disabled();
                config
            }
            Err(e) => return (Err(format!("tls: {e}")), None),
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let result = connector
            .connect(self.server_name.clone(), stream)
            .await
            .map_err(|e| tls_reason(&e));
        let not_after = *recording
            .not_after
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        (result, not_after)
    }

    /// One `GET` of the check's path over `io`; its status must be expected.
    async fn get<S>(&self, io: S) -> Result<(), String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(io))
                .await
                .map_err(|e| format!("http: {e}"))?;
        let request = hyper::Request::get(self.path.as_str())
            .header(hyper::header::HOST, self.host_header.as_str())
            .header(hyper::header::USER_AGENT, "reach-connector")
            .body(Empty::new())
            .map_err(|e| format!("http: {e}"))?;
        let send = sender.send_request(request);
        tokio::pin!(conn, send);
        // The connection must be driven while the answer comes; a server
        // that closes right after answering ends it first, and the answer
        // is then waiting.
        let response = tokio::select! {
            r = &mut send => r,
            c = &mut conn => match c {
                Ok(()) => send.await,
                Err(e) => return Err(format!("http: {e}")),
            },
        }
        .map_err(|e| format!("http: {e}"))?;
        // The body is not read; dropping the connection closes it.
        let status = response.status().as_u16();
        if self.expect.contains(status) {
            Ok(())
        } else {
            Err(format!("http {status}"))
        }
    }
}

fn down(address: IpAddr, failure: Failure, check: Option<(String, Option<i64>)>) -> AddressResult {
    AddressResult {
        address,
        reachable: false,
        method: Method::Tcp,
        rtt: Duration::ZERO,
        failure: Some(failure),
        check: check.map(|(reason, not_after)| {
            Box::new(CheckDetail {
                reason: Some(reason),
                not_after,
            })
        }),
    }
}

/// A verifier for `pem`'s roots, or why it cannot be built.
fn roots_verifier(
    pem: &str,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, String> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(|e| format!("tls: check_ca_file: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("tls: check_ca_file: {e}"))?;
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| format!("tls: check_ca_file: {e}"))
}

/// The reason string of a failed handshake.
fn tls_reason(e: &io::Error) -> String {
    let Some(error) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return format!("tls: {e}");
    };
    match error {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "tls: certificate expired".into()
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "tls: certificate not yet valid".into()
            }
            CertificateError::UnknownIssuer => "tls: unknown issuer".into(),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "tls: certificate not valid for the name".into()
            }
            CertificateError::Revoked => "tls: certificate revoked".into(),
            CertificateError::BadSignature => "tls: bad certificate signature".into(),
            other => format!("tls: certificate {other:?}"),
        },
        other => format!("tls: {other}"),
    }
}

/// The leaf's notAfter, Unix seconds.
fn not_after_of(cert: &CertificateDer<'_>) -> Option<i64> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    Some(parsed.validity().not_after.timestamp())
}

/// A verifier for one handshake: notes the leaf's notAfter, then verifies
/// with the roots, or accepts any certificate without them.
#[derive(Debug)]
struct Recording {
    inner: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
    not_after: Mutex<Option<i64>>,
}

impl ServerCertVerifier for Recording {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self.not_after.lock().unwrap_or_else(|p| p.into_inner()) = not_after_of(end_entity);
        match &self.inner {
            Some(v) => {
                v.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            }
            None => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The checks the connector runs, by the id a [`policy::CheckTarget`]
/// carries: one per (application name, check) pair assigned since the
/// process started (id 0 is the bare handshake). Ids are never reused, so
/// a check queued before a policy change still finds its probe.
#[derive(Debug, Default)]
pub struct Registry {
    probes: Vec<Arc<AppProbe>>,
    ids: std::collections::HashMap<(String, AppCheck), u32>,
}

impl Registry {
    /// The id of `check` for the application `host` (0 for the bare
    /// handshake).
    pub fn id(&mut self, host: &Host, check: &AppCheck) -> u32 {
        if check.kind == CheckKind::Tcp {
            return 0;
        }
        let key = (host.as_str().to_owned(), check.clone());
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        self.probes.push(Arc::new(AppProbe::new(host, check)));
        let id = u32::try_from(self.probes.len()).unwrap_or(u32::MAX);
        self.ids.insert(key, id);
        id
    }

    /// The probe of `id` (`None` for 0 or an unknown id).
    pub fn get(&self, id: u32) -> Option<Arc<AppProbe>> {
        let index = usize::try_from(id.checked_sub(1)?).ok()?;
        self.probes.get(index).cloned()
    }
}
