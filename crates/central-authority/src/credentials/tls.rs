//! The TLS material both listeners serve, replaced whole by a reload: the
//! PKI in force (roots, issuing key, server certificate) and the two
//! rustls server configurations built from it. Each listener reads the
//! configuration in force for every new connection, so a reload changes
//! what new handshakes see while connections open before keep theirs.
//!
//! Owner of its state (the material in force).

use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::credentials::pki::{Pki, TlsSources};
use crate::ground::sync::{read, write};

/// ALPN of the gRPC listener.
const ALPN_GRPC: &[&[u8]] = &[b"h2"];
/// ALPN of the HTTPS listener.
const ALPN_HTTP: &[&[u8]] = &[b"h2", b"http/1.1"];

/// Why the TLS material cannot serve.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct MaterialError(String);

/// One generation of TLS material.
#[derive(Debug)]
pub struct Material {
    /// The PKI it was built from.
    pub pki: Arc<Pki>,
    /// The gRPC listener's: ALPN `h2`; a client certificate is asked for,
    /// not required (`Enroll` works without one, `Connect` refuses a
    /// session without one), and verified against every trusted root.
    pub grpc: Arc<rustls::ServerConfig>,
    /// The HTTPS listener's: ALPN `h2` and `http/1.1`, no client
    /// certificates.
    pub http: Arc<rustls::ServerConfig>,
}

impl Material {
    /// The material `sources` name (their files read, a server
    /// certificate issued when they name none), in `data_dir` and for the
    /// listen addresses `listen_hosts` (which a reload does not change).
    pub fn load(
        data_dir: &Path,
        sources: &TlsSources,
        listen_hosts: &[IpAddr],
        validity: Duration,
    ) -> Result<Material, MaterialError> {
        let pki = Pki::load(data_dir, sources, listen_hosts, validity)
            .map_err(|e| MaterialError(e.to_string()))?;
        Material::new(pki)
    }

    /// Both listeners' configurations for `pki`: fails when its server
    /// certificate and key cannot serve (malformed, no certificate, a key
    /// that is not the certificate's).
    pub fn new(pki: Pki) -> Result<Material, MaterialError> {
        let grpc = server_config(&pki, true, ALPN_GRPC)?;
        let http = server_config(&pki, false, ALPN_HTTP)?;
        Ok(Material {
            pki: Arc::new(pki),
            grpc: Arc::new(grpc),
            http: Arc::new(http),
        })
    }
}

/// The server certificate chain and key of `pki`, parsed.
fn server_identity(
    pki: &Pki,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), MaterialError> {
    let (cert, key) = pki.server_identity();
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| MaterialError(format!("server certificate: {e}")))?;
    if chain.is_empty() {
        return Err(MaterialError(
            "server certificate: no CERTIFICATE in the PEM".into(),
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
        .map_err(|e| MaterialError(format!("server key: {e}")))?;
    Ok((chain, key))
}

/// A rustls server configuration of `pki`'s server certificate with
/// `alpn`; with `client_certs`, client certificates chaining to one of
/// `pki`'s trusted roots are asked for (optional).
fn server_config(
    pki: &Pki,
    client_certs: bool,
    alpn: &[&[u8]],
) -> Result<rustls::ServerConfig, MaterialError> {
    let (chain, key) = server_identity(pki)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| MaterialError(e.to_string()))?;
    let builder = if client_certs {
        let mut roots = rustls::RootCertStore::empty();
        for root in pki.trusted_roots() {
            roots
                .add(root)
                .map_err(|e| MaterialError(format!("trusted root: {e}")))?;
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| MaterialError(format!("client certificate verifier: {e}")))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| MaterialError(format!("server certificate and key: {e}")))?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// The material in force.
#[derive(Debug)]
pub struct Tls {
    current: RwLock<Arc<Material>>,
}

impl Tls {
    /// Holds `material`.
    pub fn new(material: Material) -> Self {
        Tls {
            current: RwLock::new(Arc::new(material)),
        }
    }

    /// The material in force (for one connection, one reload, one issue).
    pub fn current(&self) -> Arc<Material> {
        read(&self.current).clone()
    }

    /// Puts `material` in force; returns what it replaced.
    pub fn replace(&self, material: Material) -> Arc<Material> {
        std::mem::replace(&mut *write(&self.current), Arc::new(material))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A certificate and a key that do not belong together cannot serve:
    /// the material is refused, naming what is wrong.
    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let dir = std::env::temp_dir().join(format!("reach-tls-material-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let cert = |name: &str| {
            let key = rcgen::KeyPair::generate().expect("key");
            let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
                .expect("params")
                .self_signed(&key)
                .expect("cert");
            (cert.pem(), key.serialize_pem())
        };
        let ((cert_a, key_a), (_, key_b)) = (cert("a.test"), cert("b.test"));
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).expect("write");
            p
        };
        let sources = |key: &str| crate::credentials::pki::TlsSources {
            cert_file: Some(write("server.pem", &cert_a)),
            key_file: Some(write("server.key", key)),
            ..Default::default()
        };
        let load = |s: &crate::credentials::pki::TlsSources| {
            Pki::load(
                &dir.join("data"),
                s,
                &[],
                std::time::Duration::from_secs(60),
            )
            .expect("pki")
        };
        assert!(Material::new(load(&sources(&key_a))).is_ok());
        let refused = Material::new(load(&sources(&key_b))).expect_err("mismatched key");
        assert!(
            refused.to_string().contains("server certificate and key"),
            "{refused}"
        );
        std::fs::write(dir.join("server.pem"), "garbage").expect("write");
        let refused = Material::new(load(&crate::credentials::pki::TlsSources {
            cert_file: Some(dir.join("server.pem")),
            key_file: Some(dir.join("server.key")),
            ..Default::default()
        }))
        .expect_err("no certificate");
        assert!(
            refused.to_string().contains("server certificate"),
            "{refused}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
