//! Enrollment and the connector's credentials: on first start (or with
//! `connector-agent enroll`) the connector makes its own key pair and a CSR,
//! sends them with its group's provisioning key to the CA's `Enrollment`
//! service over server-authenticated TLS, and keeps the returned client
//! certificate with the key in `--state-dir`. Every session after that is
//! mutual TLS with that certificate; the provisioning key is not sent again.
//!
//! State directory files: `connector.key` (PKCS#8 PEM, mode 0600),
//! `connector.pem` (the certificate) and `identity` (name, group, serial;
//! written last, so its presence means the enrollment is complete).

use std::path::{Path, PathBuf};
use std::time::Duration;

use protocol::v1;
use protocol::v1::enrollment_client::EnrollmentClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The key file in the state directory.
pub const KEY_FILE: &str = "connector.key";
/// The certificate file.
pub const CERT_FILE: &str = "connector.pem";
/// Name, group and serial of the enrollment.
pub const IDENTITY_FILE: &str = "identity";

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

/// A group's provisioning key: what the connector shows once to enroll
/// (and, against a CA without TLS, with every session). Its `Debug` output
/// is redacted so that logging a value that holds it can never leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct ProvisioningKey(String);

impl ProvisioningKey {
    /// Wraps a key (the caller checks it is present and printable ASCII,
    /// as `run` and `enroll_only` do).
    pub fn new(key: impl Into<String>) -> Self {
        ProvisioningKey(key.into())
    }

    /// The key itself, for the one place it is sent.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// For `--provisioning-key`: the flag is read straight into the redacted
/// type, so `Debug` of the connector's `Config` never shows it.
impl std::str::FromStr for ProvisioningKey {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(ProvisioningKey::new(s))
    }
}

impl From<&str> for ProvisioningKey {
    fn from(s: &str) -> Self {
        ProvisioningKey::new(s)
    }
}

impl std::fmt::Debug for ProvisioningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProvisioningKey(<redacted>)")
    }
}

/// A completed enrollment: the client certificate the CA signed, its key
/// and the root to trust, as kept in the state directory.
#[derive(Clone)]
pub struct Enrollment {
    /// The CA root the connector trusts (PEM).
    pub ca_pem: String,
    /// The client certificate (PEM).
    pub cert_pem: String,
    /// Its key (PEM).
    key_pem: String,
    /// Its serial.
    pub serial: String,
}

impl std::fmt::Debug for Enrollment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enrollment")
            .field("serial", &self.serial)
            .finish_non_exhaustive()
    }
}

impl Enrollment {
    /// The client TLS configuration for sessions (mutual TLS).
    pub fn tls(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
    }
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

/// Writes `text` atomically: a uniquely named temporary file opened
/// exclusively (`create_new`: a planted file or symlink is never followed)
/// with mode 0600, synced, renamed over `path`, then the directory synced.
/// Every file in the state directory is the owner's alone; `secret` says
/// only whether it holds the private key (kept for the call sites).
fn write_atomic(path: &Path, text: &str, secret: bool) -> Result<(), EnrollError> {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    let _ = secret;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.{}.{:016x}.tmp",
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        rand::random::<u64>(),
    ));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let written = (|| {
        let mut f = options.open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(path)(e));
    }
    #[cfg(unix)]
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(())
}

/// Creates the state directory (and missing parents) with mode 0700: it
/// holds the connector's private key.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// A warning when the secret file at `path` is readable by group or
/// others (`None` when it is not, or cannot be inspected).
pub fn loose_permissions(path: &Path) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
        (mode & 0o077 != 0).then(|| {
            format!(
                "secret file {} is readable by group or others (mode {mode:04o}); chmod 600 it",
                path.display()
            )
        })
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// Warnings about the connector's secret files (`--provisioning-key-file`
/// and the enrolled key in `state_dir`) that group or others can read.
pub fn secret_file_warnings(provisioning_key_file: Option<&Path>, state_dir: &Path) -> Vec<String> {
    provisioning_key_file
        .map(Path::to_owned)
        .into_iter()
        .chain([state_dir.join(KEY_FILE)])
        .filter_map(|p| loose_permissions(&p))
        .collect()
}

/// The enrollment in `dir`, if complete, for `name` in `group`.
pub fn load(
    dir: &Path,
    name: &str,
    group: &str,
    ca_pem: &str,
) -> Result<Option<Enrollment>, EnrollError> {
    let id_path = dir.join(IDENTITY_FILE);
    let identity = match std::fs::read_to_string(&id_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&id_path)(e)),
    };
    let mut lines = identity.lines();
    let (n, g, serial) = (
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
        lines.next().unwrap_or_default(),
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
    Ok(Some(Enrollment {
        ca_pem: ca_pem.to_owned(),
        cert_pem: read(CERT_FILE)?,
        key_pem: read(KEY_FILE)?,
        serial: serial.to_owned(),
    }))
}

/// A channel to the CA over TLS that trusts `ca_pem` (no client
/// certificate: enrollment).
async fn channel(url: &str, ca_pem: &str) -> Result<Channel, EnrollError> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|e| EnrollError::Tls(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(15))
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem)))
        .map_err(|e| EnrollError::Tls(e.to_string()))?;
    endpoint
        .connect()
        .await
        .map_err(|e| EnrollError::Unreachable(crate::session::error_chain(&e)))
}

/// Enrolls once: new key pair, CSR, `Enroll`, files written.
pub async fn enroll(
    url: &str,
    ca_pem: &str,
    dir: &Path,
    name: &str,
    group: &str,
    provisioning_key: &ProvisioningKey,
) -> Result<Enrollment, EnrollError> {
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
    let mut client = EnrollmentClient::new(channel(url, ca_pem).await?);
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
    write_atomic(&dir.join(KEY_FILE), &key_pem, true)?;
    write_atomic(&dir.join(CERT_FILE), &response.certificate_pem, false)?;
    write_atomic(
        &id_path,
        &format!("{name}\n{group}\n{}\n", response.serial),
        false,
    )?;
    tracing::info!(
        serial = %response.serial,
        identity = %response.identity_uri,
        state_dir = %dir.display(),
        "enrolled with the CA"
    );
    Ok(Enrollment {
        ca_pem: ca_pem.to_owned(),
        cert_pem: response.certificate_pem,
        key_pem,
        serial: response.serial,
    })
}

#[cfg(all(test, unix))]
mod tests {
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
        write_atomic(&dir.join(KEY_FILE), "key", true).expect("key");
        write_atomic(&dir.join(CERT_FILE), "cert", false).expect("cert");
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
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        std::fs::set_permissions(dir.join(KEY_FILE), std::fs::Permissions::from_mode(0o604))
            .expect("chmod");
        let warnings = secret_file_warnings(Some(&key_file), &dir);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].contains("group.key") && warnings[0].contains("0640"),
            "{warnings:?}"
        );
        assert!(
            warnings[1].contains(KEY_FILE) && warnings[1].contains("0604"),
            "{warnings:?}"
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
