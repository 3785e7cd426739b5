//! Enrollment and the connector's credentials: on first start (or with
//! `connector-agent enroll`) the connector makes its own key pair and a CSR,
//! sends them with its group's provisioning key to the CA's `Enrollment`
//! service over server-authenticated TLS, and keeps the returned client
//! certificate with the key in `--state-dir`. Every session after that is
//! mutual TLS with that certificate; the provisioning key is not sent again.
//!
//! Before the certificate expires, [`renew`] exchanges it for a new one
//! over a new key (`Enrollment.Renew`, mutual TLS with the current
//! certificate, no provisioning key); see [`crate::ca::renewal`] for when.
//!
//! State directory files: `connector.key` (PKCS#8 PEM, mode 0600),
//! `connector.pem` (the certificate) and `identity` (name, group, serial,
//! and the time the certificate was received in Unix ms; written last, so
//! its presence means the enrollment is complete). A renewal writes
//! `connector.key.new` and `connector.pem.new` in full first, then renames
//! the key, then the certificate; [`load`] finishes or discards a renewal
//! a crash interrupted, so a certificate is never paired with the wrong key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use protocol::v1;
use protocol::v1::enrollment_client::EnrollmentClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::ca::dial::{CaTarget, Dialer};
use crate::ca::trust::Trust;
use crate::config::ProvisioningKey;
use crate::retry::error_chain;

/// The key file in the state directory.
pub const KEY_FILE: &str = "connector.key";
/// The certificate file.
pub const CERT_FILE: &str = "connector.pem";
/// Name, group and serial of the enrollment.
pub const IDENTITY_FILE: &str = "identity";
/// A renewed key, before it replaces [`KEY_FILE`].
pub const NEW_KEY_FILE: &str = "connector.key.new";
/// A renewed certificate, before it replaces [`CERT_FILE`].
pub const NEW_CERT_FILE: &str = "connector.pem.new";

/// Why enrollment or loading credentials failed.
#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `--ca-cert` is missing for an `https://` CA.
    #[error("--ca-cert (REACH_CA_CERT) is required to trust an https:// CA")]
    MissingCaCert,
    /// Key or CSR generation failed.
    #[error("cannot make a key pair and CSR: {0}")]
    Key(String),
    /// The CA could not be reached (retryable).
    #[error("cannot reach the CA: {0}")]
    Unreachable(String),
    /// The CA refused the enrollment (not retryable).
    #[error("the CA refused the enrollment ({code:?}): {message}")]
    Refused {
        /// gRPC code.
        code: tonic::Code,
        /// The CA's reason.
        message: String,
    },
    /// The state directory belongs to another connector.
    #[error(
        "the state directory {dir} holds the enrollment of connector {name:?} in group {group:?}; use another --state-dir or delete it"
    )]
    OtherIdentity {
        /// The directory.
        dir: PathBuf,
        /// Enrolled name.
        name: String,
        /// Enrolled group.
        group: String,
    },
    /// Invalid URL or TLS setup.
    #[error("TLS setup: {0}")]
    Tls(String),
    /// The stored certificate cannot be read.
    #[error("{path}: not a readable certificate")]
    BadCertificate {
        /// The file.
        path: PathBuf,
    },
}

impl EnrollError {
    /// Whether trying again later may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            EnrollError::Unreachable(_) => true,
            EnrollError::Refused { code, .. } => matches!(
                code,
                tonic::Code::Unavailable
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::Internal
                    | tonic::Code::Unknown
                    | tonic::Code::DeadlineExceeded
            ),
            _ => false,
        }
    }
}

/// A completed enrollment: the client certificate the CA signed, its key
/// and the roots to trust, as kept in the state directory.
#[derive(Clone)]
pub struct Enrollment {
    /// The roots the connector trusts for the CA (shared: a trust bundle
    /// the CA sends reaches every session and the renewal).
    pub trust: Trust,
    /// The client certificate (PEM).
    pub cert_pem: String,
    /// Its key (PEM).
    key_pem: String,
    /// Its serial.
    pub serial: String,
    /// When the connector received it, Unix ms (the start of its lifetime
    /// for renewal; the certificate's own `notBefore` has a few minutes of
    /// slack for clocks running behind).
    pub issued_ms: i64,
    /// End of its validity, Unix ms.
    pub not_after_ms: i64,
}

impl std::fmt::Debug for Enrollment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enrollment")
            .field("serial", &self.serial)
            .field("issued_ms", &self.issued_ms)
            .field("not_after_ms", &self.not_after_ms)
            .finish_non_exhaustive()
    }
}

impl Enrollment {
    /// The client TLS configuration for sessions (mutual TLS).
    pub fn tls(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.trust.roots()))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
    }

    /// Whether the certificate has expired at `now_ms`.
    pub fn expired(&self, now_ms: i64) -> bool {
        now_ms >= self.not_after_ms
    }
}

/// Now, Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `notBefore` and `notAfter` of a PEM certificate, Unix ms.
fn validity(cert_pem: &str) -> Option<(i64, i64)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).ok()?;
    let cert = pem.parse_x509().ok()?;
    let v = cert.validity();
    Some((
        v.not_before.timestamp().saturating_mul(1000),
        v.not_after.timestamp().saturating_mul(1000),
    ))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EnrollError + '_ {
    move |source| EnrollError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Reads the CA root from `--ca-cert`.
pub fn read_ca_cert(path: Option<&Path>) -> Result<String, EnrollError> {
    let path = path.ok_or(EnrollError::MissingCaCert)?;
    std::fs::read_to_string(path).map_err(io(path))
}

/// Writes `text` to `path` atomically and durably, readable by the
/// connector's owner only (`private_files::write_atomic`).
fn write_atomic(path: &Path, text: &str) -> Result<(), EnrollError> {
    private_files::write_atomic(path, text).map_err(io(path))
}

pub use private_files::{create_private_dir, loose_permissions};

/// Warnings about the connector's secret files (`--provisioning-key-file`
/// and the enrolled key in `state_dir`) that others can read or anyone
/// but the owner can write.
pub fn secret_file_warnings(provisioning_key_file: Option<&Path>, state_dir: &Path) -> Vec<String> {
    provisioning_key_file
        .map(Path::to_owned)
        .into_iter()
        .chain([state_dir.join(KEY_FILE)])
        .filter_map(|p| loose_permissions(&p))
        .collect()
}

/// The enrollment in `dir`, if complete, for `name` in `group`, trusting
/// `trust`.
pub fn load(
    dir: &Path,
    name: &str,
    group: &str,
    trust: &Trust,
) -> Result<Option<Enrollment>, EnrollError> {
    finish_renewal(dir)?;
    let id_path = dir.join(IDENTITY_FILE);
    let identity = match std::fs::read_to_string(&id_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&id_path)(e)),
    };
    let mut lines = identity.lines();
    let (n, g, serial, received) = (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
        lines.next().and_then(|l| l.trim().parse::<i64>().ok()),
    );
    if n != name || g != group {
        return Err(EnrollError::OtherIdentity {
            dir: dir.to_owned(),
            name: n.to_owned(),
            group: g.to_owned(),
        });
    }
    let read = |f: &str| {
        let p = dir.join(f);
        std::fs::read_to_string(&p).map_err(io(&p))
    };
    let cert_pem = read(CERT_FILE)?;
    let (not_before, not_after_ms) =
        validity(&cert_pem).ok_or_else(|| EnrollError::BadCertificate {
            path: dir.join(CERT_FILE),
        })?;
    // The serial and the receipt time of a renewed certificate are in the
    // identity file only once the renewal completed; a renewal whose
    // identity write was interrupted still has the right certificate.
    Ok(Some(Enrollment {
        trust: trust.clone(),
        cert_pem,
        key_pem: read(KEY_FILE)?,
        serial: serial.to_owned(),
        // Within the certificate's validity (`max`/`min`, not `clamp`: a
        // malformed certificate may end before it starts).
        issued_ms: received
            .unwrap_or(not_before)
            .max(not_before)
            .min(not_after_ms),
        not_after_ms,
    }))
}

/// Completes or discards a renewal that a crash interrupted: both new
/// files present means neither was moved yet (the old pair is intact:
/// discard them); only the certificate present means the key was moved
/// (move the certificate too).
fn finish_renewal(dir: &Path) -> Result<(), EnrollError> {
    let (new_key, new_cert) = (dir.join(NEW_KEY_FILE), dir.join(NEW_CERT_FILE));
    match (new_key.exists(), new_cert.exists()) {
        (true, true) => {
            std::fs::remove_file(&new_key).map_err(io(&new_key))?;
            std::fs::remove_file(&new_cert).map_err(io(&new_cert))?;
        }
        (false, true) => {
            let cert = dir.join(CERT_FILE);
            std::fs::rename(&new_cert, &cert).map_err(io(&cert))?;
        }
        (true, false) => {
            // Written before the certificate: the renewal never completed.
            std::fs::remove_file(&new_key).map_err(io(&new_key))?;
        }
        (false, false) => {}
    }
    Ok(())
}

/// Makes the directory's renames durable.
fn sync_dir(dir: &Path) -> Result<(), EnrollError> {
    #[cfg(unix)]
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// A new key pair and a CSR naming `name` (the CA uses only the key).
fn key_and_csr(name: &str) -> Result<(rcgen::KeyPair, String), EnrollError> {
    let key = rcgen::KeyPair::generate().map_err(|e| EnrollError::Key(e.to_string()))?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
        .map_err(|e| EnrollError::Key(e.to_string()))?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let csr = params
        .serialize_request(&key)
        .and_then(|c| c.pem())
        .map_err(|e| EnrollError::Key(e.to_string()))?;
    Ok((key, csr))
}

/// Renews once: new key pair and CSR, `Renew` over mutual TLS with
/// `current`, the new key and certificate written atomically into `dir`
/// (see the module comment), and the new enrollment returned.
pub async fn renew(
    target: &CaTarget,
    current: &Enrollment,
    dir: &Path,
    name: &str,
    group: &str,
) -> Result<Enrollment, EnrollError> {
    let (key, csr) = key_and_csr(name)?;
    let endpoint = target
        .endpoint(Some(current.tls()))
        .map_err(EnrollError::Tls)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(15));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| EnrollError::Unreachable(error_chain(&e)))?;
    let issued_ms = now_ms();
    let response = EnrollmentClient::new(channel)
        .renew(v1::RenewRequest { csr_pem: csr })
        .await
        .map_err(|s| EnrollError::Refused {
            code: s.code(),
            message: s.message().to_owned(),
        })?
        .into_inner();
    let key_pem = key.serialize_pem();
    let not_after_ms =
        validity(&response.certificate_pem).map_or(response.not_after_unix_ms, |(_, n)| n);
    // Both new files complete and durable first; then the key, then the
    // certificate replace the old ones (see `finish_renewal`).
    let (new_key, new_cert) = (dir.join(NEW_KEY_FILE), dir.join(NEW_CERT_FILE));
    write_atomic(&new_key, &key_pem)?;
    write_atomic(&new_cert, &response.certificate_pem)?;
    sync_dir(dir)?;
    let (key_path, cert_path) = (dir.join(KEY_FILE), dir.join(CERT_FILE));
    std::fs::rename(&new_key, &key_path).map_err(io(&key_path))?;
    std::fs::rename(&new_cert, &cert_path).map_err(io(&cert_path))?;
    sync_dir(dir)?;
    write_atomic(
        &dir.join(IDENTITY_FILE),
        &format!("{name}\n{group}\n{}\n{issued_ms}\n", response.serial),
    )?;
    tracing::info!(
        old_serial = %current.serial,
        serial = %response.serial,
        not_after_ms,
        "certificate renewed"
    );
    Ok(Enrollment {
        trust: current.trust.clone(),
        cert_pem: response.certificate_pem,
        key_pem,
        serial: response.serial,
        issued_ms,
        not_after_ms,
    })
}

/// Runs `attempt` against each CA replica in turn until one is reachable:
/// the first answer that is not [`EnrollError::Unreachable`] counts (a
/// refusal is the deployment's answer, every replica shares the database).
pub async fn on_any<T, F, Fut>(dialer: &Dialer, mut attempt: F) -> Result<T, EnrollError>
where
    F: FnMut(CaTarget) -> Fut,
    Fut: std::future::Future<Output = Result<T, EnrollError>>,
{
    let mut last = EnrollError::Unreachable("no CA address".into());
    for target in dialer.candidates().await {
        let label = target.label();
        match attempt(target).await {
            Err(EnrollError::Unreachable(reason)) => {
                last = EnrollError::Unreachable(format!("{label}: {reason}"));
            }
            other => return other,
        }
    }
    Err(last)
}

/// A channel to the CA over TLS that trusts `ca_pem` (no client
/// certificate: enrollment).
async fn channel(target: &CaTarget, ca_pem: &str) -> Result<Channel, EnrollError> {
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    let endpoint = target
        .endpoint(Some(tls))
        .map_err(EnrollError::Tls)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(15));
    endpoint
        .connect()
        .await
        .map_err(|e| EnrollError::Unreachable(error_chain(&e)))
}

/// Enrolls once (trusting `trust`'s roots): new key pair, CSR, `Enroll`,
/// files written.
pub async fn enroll(
    target: &CaTarget,
    trust: &Trust,
    dir: &Path,
    name: &str,
    group: &str,
    provisioning_key: &ProvisioningKey,
) -> Result<Enrollment, EnrollError> {
    let (key, csr) = key_and_csr(name)?;
    let mut client = EnrollmentClient::new(channel(target, &trust.roots()).await?);
    let issued_ms = now_ms();
    let response = client
        .enroll(v1::EnrollRequest {
            name: name.to_owned(),
            group: group.to_owned(),
            provisioning_key: provisioning_key.expose().to_owned(),
            csr_pem: csr,
        })
        .await
        .map_err(|s| EnrollError::Refused {
            code: s.code(),
            message: s.message().to_owned(),
        })?
        .into_inner();
    create_private_dir(dir).map_err(io(dir))?;
    let key_pem = key.serialize_pem();
    // Old identity first: a crash mid-way leaves "not enrolled", never a
    // certificate paired with the wrong key.
    let id_path = dir.join(IDENTITY_FILE);
    match std::fs::remove_file(&id_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&id_path)(e)),
    }
    write_atomic(&dir.join(KEY_FILE), &key_pem)?;
    write_atomic(&dir.join(CERT_FILE), &response.certificate_pem)?;
    write_atomic(
        &id_path,
        &format!("{name}\n{group}\n{}\n{issued_ms}\n", response.serial),
    )?;
    let not_after_ms =
        validity(&response.certificate_pem).map_or(response.not_after_unix_ms, |(_, n)| n);
    tracing::info!(
        serial = %response.serial,
        identity = %response.identity_uri,
        state_dir = %dir.display(),
        "enrolled with the CA"
    );
    Ok(Enrollment {
        trust: trust.clone(),
        cert_pem: response.certificate_pem,
        key_pem,
        serial: response.serial,
        issued_ms,
        not_after_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("reach-enroll-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    fn files(d: &Path, names: &[(&str, &str)]) {
        for (name, text) in names {
            std::fs::write(d.join(name), text).expect("write");
        }
    }

    fn read(d: &Path, name: &str) -> Option<String> {
        std::fs::read_to_string(d.join(name)).ok()
    }

    #[test]
    fn an_interrupted_renewal_never_pairs_a_certificate_with_the_wrong_key() {
        // Crash before any rename: the old pair stays, the new files go.
        let d = dir("both");
        files(
            &d,
            &[
                (KEY_FILE, "old key"),
                (CERT_FILE, "old cert"),
                (NEW_KEY_FILE, "new key"),
                (NEW_CERT_FILE, "new cert"),
            ],
        );
        finish_renewal(&d).expect("finished");
        assert_eq!(read(&d, KEY_FILE).as_deref(), Some("old key"));
        assert_eq!(read(&d, CERT_FILE).as_deref(), Some("old cert"));
        assert_eq!(
            (read(&d, NEW_KEY_FILE), read(&d, NEW_CERT_FILE)),
            (None, None)
        );
        // Crash after the key moved: the certificate follows it.
        let d = dir("key-moved");
        files(
            &d,
            &[
                (KEY_FILE, "new key"),
                (CERT_FILE, "old cert"),
                (NEW_CERT_FILE, "new cert"),
            ],
        );
        finish_renewal(&d).expect("finished");
        assert_eq!(read(&d, KEY_FILE).as_deref(), Some("new key"));
        assert_eq!(read(&d, CERT_FILE).as_deref(), Some("new cert"));
        assert_eq!(read(&d, NEW_CERT_FILE), None);
        // Crash while the certificate was being written: discarded.
        let d = dir("key-only");
        files(
            &d,
            &[
                (KEY_FILE, "old key"),
                (CERT_FILE, "old cert"),
                (NEW_KEY_FILE, "new key"),
            ],
        );
        finish_renewal(&d).expect("finished");
        assert_eq!(read(&d, KEY_FILE).as_deref(), Some("old key"));
        assert_eq!(read(&d, NEW_KEY_FILE), None);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[cfg(unix)]
    #[test]
    fn a_written_key_is_readable_by_the_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let d = dir("mode");
        write_atomic(&d.join(NEW_KEY_FILE), "key").expect("written");
        let mode = std::fs::metadata(d.join(NEW_KEY_FILE))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(&d);
    }
}

#[cfg(all(test, unix))]
mod owner_only_files {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
    }

    #[test]
    fn state_files_are_written_privately_and_never_through_a_planted_file() {
        let root = std::env::temp_dir().join(format!("reach-enroll-modes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("state");
        create_private_dir(&dir).expect("mkdir");
        assert_eq!(mode(&dir), 0o700);
        // The old temporary name was predictable: a file planted there
        // was truncated and renamed into place.
        std::fs::write(dir.join("connector.tmp"), "planted").expect("plant");
        write_atomic(&dir.join(KEY_FILE), "key").expect("key");
        write_atomic(&dir.join(CERT_FILE), "cert").expect("cert");
        assert_eq!(
            std::fs::read_to_string(dir.join("connector.tmp")).expect("read"),
            "planted"
        );
        assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
        assert_eq!(mode(&dir.join(CERT_FILE)), 0o600);
        let leftovers = std::fs::read_dir(&dir)
            .expect("list")
            .filter(|e| {
                e.as_ref().is_ok_and(|e| {
                    e.file_name().to_string_lossy().ends_with(".tmp")
                        && e.file_name() != "connector.tmp"
                })
            })
            .count();
        assert_eq!(leftovers, 0, "no temporary file left");
        // Secret files others can read are warned about, naming file and mode.
        assert!(secret_file_warnings(None, &dir).is_empty());
        let key_file = root.join("group.key");
        std::fs::write(&key_file, "k").expect("write");
        // Its group may read it (an operator's share); others may not.
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        assert!(secret_file_warnings(Some(&key_file), &dir).is_empty());
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::fs::set_permissions(dir.join(KEY_FILE), std::fs::Permissions::from_mode(0o604))
            .expect("chmod");
        let warnings = secret_file_warnings(Some(&key_file), &dir);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].contains("group.key") && warnings[0].contains("0644"),
            "{warnings:?}"
        );
        assert!(
            warnings[1].contains(KEY_FILE) && warnings[1].contains("0604"),
            "{warnings:?}"
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
