//! The roots the connector trusts for the CA: those of `--ca-cert` until
//! the CA tells it a trust bundle (`TrustBundle`, over a session whose
//! server certificate it verified), then that bundle, for every later
//! session, renewal and enrollment. The bundle is kept in `--state-dir`
//! (`trust.pem`, written atomically) across restarts, with the SHA-256 of
//! the `--ca-cert` content it was learned with: a `--ca-cert` that differs
//! from it is the operator's word (a compromised root replaced by hand)
//! and wins, and the bundle is dropped.
//!
//! A bundle may also ask for the certificate to be renewed (a rotation
//! switched the issuing root): the ask reaches [`crate::ca::renewal`], which
//! renews at the moment asked unless its own time comes first.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rand::RngExt;
use tokio::sync::watch;

/// The trust bundle in the state directory.
pub const TRUST_FILE: &str = "trust.pem";

/// The first line of [`TRUST_FILE`], before the `--ca-cert` hash.
const HEADER: &str = "# reach trust bundle, learned with --ca-cert sha256 ";

/// A request to renew the certificate `serial` at `at_ms` (Unix ms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenewAsk {
    /// The certificate the ask is about (a renewal since makes it moot).
    pub serial: String,
    /// When to renew.
    pub at_ms: i64,
}

/// The roots in force, shared by every session, the renewal task and
/// enrollment. Cloning is shallow.
#[derive(Clone)]
pub struct Trust {
    inner: Arc<Inner>,
}

struct Inner {
    /// Where the bundle is kept (`None`: not kept).
    state_dir: Option<PathBuf>,
    /// SHA-256 of the `--ca-cert` content.
    source: String,
    roots: RwLock<String>,
    asks: watch::Sender<Option<RenewAsk>>,
}

impl std::fmt::Debug for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trust")
            .field("state_dir", &self.inner.state_dir)
            .finish_non_exhaustive()
    }
}

/// SHA-256 of `text`, lower-case hex.
fn sha256_hex(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Why a bundle cannot be used; `Ok` with how many roots it holds.
pub fn check_bundle(pem: &str) -> Result<usize, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate in it".into());
    }
    for cert in &certs {
        let (_, parsed) = x509_parser::parse_x509_certificate(cert)
            .map_err(|_| "a certificate does not parse".to_owned())?;
        if !parsed.is_ca() {
            return Err(format!("{} is not a CA certificate", parsed.subject()));
        }
    }
    Ok(certs.len())
}

impl Trust {
    /// The roots for a connector started with `ca_cert_pem` whose state
    /// lives in `state_dir`: the bundle kept there if it was learned with
    /// this very `--ca-cert`, else `ca_cert_pem`.
    pub fn load(state_dir: &Path, ca_cert_pem: &str) -> Trust {
        let source = sha256_hex(ca_cert_pem);
        let path = state_dir.join(TRUST_FILE);
        let kept = std::fs::read_to_string(&path).ok();
        let roots = match kept.as_deref().and_then(|t| t.split_once('\n')) {
            Some((first, bundle)) if first.strip_prefix(HEADER) == Some(source.as_str()) => {
                match check_bundle(bundle) {
                    Ok(n) => {
                        tracing::info!(path = %path.display(), roots = n, "trusting the CA's roots from the trust bundle it sent");
                        bundle.to_owned()
                    }
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "ignoring the kept trust bundle; trusting --ca-cert");
                        ca_cert_pem.to_owned()
                    }
                }
            }
            Some(_) => {
                tracing::warn!(path = %path.display(), "--ca-cert is not the one the kept trust bundle was learned with: trusting --ca-cert, dropping the bundle");
                let _ = std::fs::remove_file(&path);
                ca_cert_pem.to_owned()
            }
            None => ca_cert_pem.to_owned(),
        };
        Trust::new(Some(state_dir.to_owned()), source, roots)
    }

    /// Exactly `pem`, never kept (tests, tools).
    pub fn fixed(pem: &str) -> Trust {
        Trust::new(None, sha256_hex(pem), pem.to_owned())
    }

    fn new(state_dir: Option<PathBuf>, source: String, roots: String) -> Trust {
        Trust {
            inner: Arc::new(Inner {
                state_dir,
                source,
                roots: RwLock::new(roots),
                asks: watch::channel(None).0,
            }),
        }
    }

    /// The roots in force (PEM).
    pub fn roots(&self) -> String {
        self.inner
            .roots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Takes a bundle the CA sent: checked, kept in the state directory
    /// (atomically), and in force from now on. `Ok(false)` when it is the
    /// bundle in force already; an error (the roots in force stay) when it
    /// cannot be used or kept.
    pub fn learn(&self, bundle: &str) -> Result<bool, String> {
        if *self
            .inner
            .roots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            == bundle
        {
            return Ok(false);
        }
        let n = check_bundle(bundle)?;
        if let Some(dir) = &self.inner.state_dir {
            let path = dir.join(TRUST_FILE);
            let text = format!("{HEADER}{}\n{bundle}", self.inner.source);
            private_files::write_atomic(&path, &text)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        *self
            .inner
            .roots
            .write()
            .unwrap_or_else(PoisonError::into_inner) = bundle.to_owned();
        tracing::info!(
            roots = n,
            "trusting the roots of the CA's trust bundle from now on"
        );
        Ok(true)
    }

    /// The CA asks for certificate `serial` to be renewed within `within`
    /// of `now_ms`: at a random moment in that window, unless an earlier
    /// one was asked for it already.
    pub fn ask_renewal(
        &self,
        serial: &str,
        within: Duration,
        now_ms: i64,
        rng: &mut impl rand::Rng,
    ) {
        let span = i64::try_from(within.as_millis()).unwrap_or(i64::MAX).max(1);
        let at_ms = now_ms.saturating_add(rng.random_range(0..span));
        self.inner.asks.send_if_modified(|ask| match ask {
            Some(a) if a.serial == serial && a.at_ms <= at_ms => false,
            _ => {
                tracing::info!(
                    serial,
                    in_ms = at_ms - now_ms,
                    "the CA asks for the certificate to be renewed (root rotation)"
                );
                *ask = Some(RenewAsk {
                    serial: serial.to_owned(),
                    at_ms,
                });
                true
            }
        });
    }

    /// The renewal asks, newest in force.
    pub fn asks(&self) -> watch::Receiver<Option<RenewAsk>> {
        self.inner.asks.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn root(name: &str) -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.self_signed(&key).expect("root").pem()
    }

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("reach-trust-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    /// A bundle learned is in force and survives a restart with the same
    /// `--ca-cert`; another `--ca-cert` drops it.
    #[test]
    fn a_learned_bundle_is_kept_until_the_ca_cert_changes() {
        let d = dir("kept");
        let (old, new) = (root("old"), root("new"));
        let trust = Trust::load(&d, &old);
        assert_eq!(trust.roots(), old);
        let bundle = format!("{new}{old}");
        assert_eq!(trust.learn(&bundle), Ok(true));
        assert_eq!(trust.learn(&bundle), Ok(false), "the same bundle again");
        assert_eq!(trust.roots(), bundle);
        // A restart with the same --ca-cert: the bundle.
        assert_eq!(Trust::load(&d, &old).roots(), bundle);
        // The operator gives another root: it wins, the bundle goes.
        assert_eq!(Trust::load(&d, &new).roots(), new);
        assert!(!d.join(TRUST_FILE).exists());
        assert_eq!(Trust::load(&d, &old).roots(), old);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_bundle_that_cannot_be_used_changes_nothing() {
        let d = dir("bad");
        let old = root("old");
        let trust = Trust::load(&d, &old);
        for bad in [
            "",
            "garbage",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        ] {
            assert!(trust.learn(bad).is_err(), "{bad:?}");
        }
        // A leaf is no root.
        let key = rcgen::KeyPair::generate().expect("key");
        let leaf = rcgen::CertificateParams::new(vec!["x.test".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("leaf")
            .pem();
        assert!(trust.learn(&leaf).is_err());
        assert_eq!(trust.roots(), old);
        assert!(!d.join(TRUST_FILE).exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// An ask falls inside its window; a later ask for the same certificate
    /// does not postpone an earlier one.
    #[test]
    fn renewal_asks_fall_within_their_window_and_the_earliest_stands() {
        let trust = Trust::fixed(&root("r"));
        let asks = trust.asks();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        trust.ask_renewal("s1", Duration::from_secs(10), 1_000_000, &mut rng);
        let first = asks.borrow().clone().expect("asked");
        assert!((1_000_000..1_010_000).contains(&first.at_ms), "{first:?}");
        trust.ask_renewal("s1", Duration::from_secs(10), 1_020_000, &mut rng);
        assert_eq!(asks.borrow().clone(), Some(first));
        trust.ask_renewal("s2", Duration::from_secs(1), 1_030_000, &mut rng);
        assert_eq!(
            asks.borrow().as_ref().map(|a| a.serial.as_str()),
            Some("s2")
        );
    }
}
