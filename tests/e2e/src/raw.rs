//! A connector written by hand from proto/ (not connector-agent's session
//! code): it enrolls itself over the `Enrollment` rpc with an rcgen CSR and
//! opens `Connect` streams with the credentials it is given, saying `Hello`
//! when the test asks. The hostile scenarios keep a spare stream with it;
//! the root rotation probes which certificates the CA still accepts.

use anyhow::{Context, Result};
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use protocol::v1::connector_message::Kind as In;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Enrolled credentials: certificate and key (PEM).
#[derive(Debug)]
pub struct Creds {
    /// The client certificate.
    pub cert: String,
    /// Its key.
    pub key: String,
}

async fn channel(url: &str, root: &str, id: Option<&Creds>) -> Result<Channel> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(root));
    if let Some(c) = id {
        tls = tls.identity(Identity::from_pem(&c.cert, &c.key));
    }
    Ok(Endpoint::from_shared(url.to_owned())?
        .tls_config(tls)?
        .connect()
        .await?)
}

/// Enrolls `name` in `group` with `key`.
pub async fn enroll(url: &str, root: &str, name: &str, group: &str, key: &str) -> Result<Creds> {
    let pair = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let csr = params.serialize_request(&pair)?.pem()?;
    let r = v1::enrollment_client::EnrollmentClient::new(channel(url, root, None).await?)
        .enroll(v1::EnrollRequest {
            name: name.into(),
            group: group.into(),
            provisioning_key: key.into(),
            csr_pem: csr,
        })
        .await
        .context("enroll")?
        .into_inner();
    Ok(Creds {
        cert: r.certificate_pem,
        key: pair.serialize_pem(),
    })
}

/// An authenticated session stream that has sent nothing yet.
pub struct Spare {
    tx: mpsc::Sender<v1::ConnectorMessage>,
    rx: tonic::Streaming<v1::AuthorityMessage>,
}

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spare").finish_non_exhaustive()
    }
}

impl Spare {
    /// Opens the stream; the CA authenticates it before answering.
    pub async fn open(url: &str, root: &str, creds: &Creds) -> Result<Spare> {
        let (tx, rx) = mpsc::channel(8);
        let response = v1::connector_session_client::ConnectorSessionClient::new(
            channel(url, root, Some(creds)).await?,
        )
        .connect(tonic::Request::new(ReceiverStream::new(rx)))
        .await
        .context("open the spare stream")?;
        Ok(Spare {
            tx,
            rx: response.into_inner(),
        })
    }

    /// Sends Hello; `Ok(true)` if the CA answered Welcome (the stream
    /// registered), `Ok(false)` if it refused (Shutdown, error or end).
    pub async fn hello(mut self, name: &str, group: &str) -> Result<bool> {
        let hello = v1::ConnectorMessage {
            kind: Some(In::Hello(v1::Hello {
                name: name.into(),
                group: group.into(),
                version: "hostile-0".into(),
                release: protocol::release::RELEASE.into(),
                capabilities: Some(v1::Capabilities {
                    icmp: false,
                    icmp_mode: "none".into(),
                    checks_per_second: 1,
                    trust_bundle: false,
                }),
            })),
        };
        // A stream the CA already closed refuses the send: a refusal.
        let _ = self.tx.send(hello).await;
        loop {
            let next = tokio::time::timeout(std::time::Duration::from_secs(15), self.rx.message())
                .await
                .context("no answer to Hello within 15 s")?;
            match next {
                Ok(Some(m)) => match m.kind {
                    Some(Out::Welcome(_)) => return Ok(true),
                    Some(Out::Shutdown(_)) => return Ok(false),
                    _ => {}
                },
                Ok(None) | Err(_) => return Ok(false),
            }
        }
    }
}
