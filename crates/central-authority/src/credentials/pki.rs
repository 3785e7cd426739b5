//! The CA's public-key infrastructure: the issuing root (generated and
//! persisted in the data directory on first start, or read from PEM files),
//! the TLS server certificate, signing a connector's CSR into a client
//! certificate that names connector and group, and reading that identity
//! back from a certificate a peer presents.
//!
//! **Invariant:** the identity of a connector session comes from here (the
//! certificate's URI SAN, checked against its common name), never from what
//! the connector says in `Hello`.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};

use crate::credentials::host::HostIdentity;
use crate::ground::digest::{hex, sha256_hex};

/// The URI SAN prefix of connector certificates.
pub const IDENTITY_PREFIX: &str = "spiffe://reach/group/";

/// Largest CSR the CA parses (a P-256 or RSA-4096 CSR is well under 4 KiB).
pub const MAX_CSR_BYTES: usize = 16 * 1024;

/// File names in the data directory.
pub const ROOT_CERT_FILE: &str = "ca.pem";
/// The root's private key (mode 0600).
pub const ROOT_KEY_FILE: &str = "ca.key";
/// The generated server certificate (rewritten at every start).
pub const SERVER_CERT_FILE: &str = "server.pem";
/// The generated server key (mode 0600).
pub const SERVER_KEY_FILE: &str = "server.key";

/// Why PKI material could not be loaded, generated or issued.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Certificate or key material is malformed or could not be produced.
    #[error("{what}: {source}")]
    Cert {
        /// What was being done.
        what: &'static str,
        /// Why.
        source: rcgen::Error,
    },
    /// The CSR is not acceptable.
    #[error("invalid certificate signing request: {0}")]
    InvalidCsr(String),
    /// A root certificate (`[tls]`'s issuer or a rotation's other root) is
    /// not usable as one.
    #[error("{path}: {reason}")]
    Root {
        /// The file (or what it is).
        path: String,
        /// Why.
        reason: String,
    },
}

/// Why a presented certificate does not name a connector.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Not a parseable X.509 certificate.
    #[error("the client certificate cannot be parsed")]
    Unparseable,
    /// No (or more than one) reach identity URI.
    #[error("the client certificate carries no reach connector identity")]
    NoIdentity,
    /// The identity URI and the common name disagree.
    #[error("the client certificate's common name does not match its identity")]
    NameMismatch,
}

/// A connector identity read from a certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertIdentity {
    /// Connector name.
    pub name: String,
    /// Connector group.
    pub group: String,
    /// Serial number, lower-case hex.
    pub serial: String,
}

/// A freshly issued client certificate.
#[derive(Clone, Debug)]
pub struct Issued {
    /// PEM.
    pub pem: String,
    /// Serial, lower-case hex.
    pub serial: String,
    /// SHA-256 of the DER, lower-case hex.
    pub fingerprint: String,
    /// End of validity, Unix milliseconds.
    pub not_after_ms: i64,
    /// The identity URI.
    pub identity_uri: String,
    /// The fingerprint of the root that signed it (`Root::fingerprint`).
    pub root: String,
}

/// The identity URI of a connector.
pub fn identity_uri(group: &str, name: &str) -> String {
    format!("{IDENTITY_PREFIX}{group}/connector/{name}")
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `t` without its fraction of a second.
fn whole_seconds(t: SystemTime) -> SystemTime {
    t.duration_since(UNIX_EPOCH).map_or(UNIX_EPOCH, |d| {
        UNIX_EPOCH + Duration::from_secs(d.as_secs())
    })
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// A random positive serial of 16 bytes (its DER form is these bytes).
fn serial() -> Vec<u8> {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    bytes.to_vec()
}

fn cert_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |source| PkiError::Cert { what, source }
}

fn read(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|source| PkiError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Writes `text` to `path` atomically and durably, readable by the CA's
/// owner only (`private_files::write_atomic`).
pub fn write_atomic(path: &Path, text: &str) -> Result<(), PkiError> {
    private_files::write_atomic(path, text).map_err(|source| PkiError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Where the CA's certificates come from (`[tls]` in the config).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TlsSources {
    /// Server certificate chain (PEM); generated when `None`.
    pub cert_file: Option<PathBuf>,
    /// Server key (PEM).
    pub key_file: Option<PathBuf>,
    /// Issuing CA certificate (PEM); generated in the data dir when `None`.
    pub issuer_cert_file: Option<PathBuf>,
    /// Issuing CA key (PEM).
    pub issuer_key_file: Option<PathBuf>,
    /// Root rotation, introduce: a new root certificate (PEM) trusted for
    /// client certificates and announced to connectors beside the issuing
    /// one, which still issues.
    pub next_root_file: Option<PathBuf>,
    /// Root rotation, switch: the root that issued before, still trusted
    /// and announced until it is retired (removed from the config).
    pub previous_root_file: Option<PathBuf>,
    /// Extra names (DNS names or IP addresses) in a generated server
    /// certificate, besides those [`server_names`] gives it from the
    /// listen addresses.
    pub server_names: Vec<String>,
}

impl TlsSources {
    /// Every file named (what a reload reads again).
    pub fn files(&self) -> Vec<PathBuf> {
        [
            &self.cert_file,
            &self.key_file,
            &self.issuer_cert_file,
            &self.issuer_key_file,
            &self.next_root_file,
            &self.previous_root_file,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect()
    }
}

/// The CA's keys and certificates.
pub struct Pki {
    issuer: Issuer<'static, KeyPair>,
    /// The issuing CA's certificate (PEM): what connectors trust
    /// (`--ca-cert`).
    pub issuer_pem: String,
    /// The TLS server certificate chain (PEM).
    pub server_cert_pem: String,
    server_key_pem: String,
    validity: Duration,
    /// Every root trusted: the issuing one first, then a rotation's other.
    roots: Vec<Root>,
}

impl fmt::Debug for Pki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pki")
            .field("validity", &self.validity)
            .finish_non_exhaustive()
    }
}

impl Pki {
    /// Loads (or on first start generates and persists) the issuing root in
    /// `data_dir`, and loads or issues the TLS server certificate.
    pub fn load(
        data_dir: &Path,
        sources: &TlsSources,
        listen_hosts: &[IpAddr],
        validity: Duration,
    ) -> Result<Pki, PkiError> {
        private_files::create_private_dir(data_dir).map_err(|source| PkiError::Io {
            path: data_dir.to_owned(),
            source,
        })?;
        let (issuer_pem, issuer_key_pem) =
            match (&sources.issuer_cert_file, &sources.issuer_key_file) {
                (Some(c), Some(k)) => (read(c)?, read(k)?),
                _ => Self::root(data_dir)?,
            };
        let key = KeyPair::from_pem(&issuer_key_pem).map_err(cert_err("issuer key"))?;
        let issuer =
            Issuer::from_ca_cert_pem(&issuer_pem, key).map_err(cert_err("issuer certificate"))?;
        let roots = Root::all(&issuer_pem, sources)?;
        let (server_cert_pem, server_key_pem) = match (&sources.cert_file, &sources.key_file) {
            (Some(c), Some(k)) => (read(c)?, read(k)?),
            _ => {
                let names = server_names(
                    &sources.server_names,
                    listen_hosts,
                    HostIdentity::of_this_host,
                );
                let (cert, key) = server_cert(&issuer, &names)?;
                write_atomic(&data_dir.join(SERVER_CERT_FILE), &cert)?;
                write_atomic(&data_dir.join(SERVER_KEY_FILE), &key)?;
                tracing::info!(
                    names = %names.join(", "),
                    "issued the TLS server certificate from the root"
                );
                (cert, key)
            }
        };
        Ok(Pki {
            issuer,
            issuer_pem,
            server_cert_pem,
            server_key_pem,
            validity,
            roots,
        })
    }

    /// The persisted root, generated on first start.
    fn root(data_dir: &Path) -> Result<(String, String), PkiError> {
        let (cert_path, key_path) = (data_dir.join(ROOT_CERT_FILE), data_dir.join(ROOT_KEY_FILE));
        if cert_path.exists() && key_path.exists() {
            if let Some(warning) = private_files::loose_permissions(&key_path) {
                tracing::warn!("{warning}");
            }
            return Ok((read(&cert_path)?, read(&key_path)?));
        }
        let (cert, key) = generate_root()?;
        // Key first: a crash in between leaves no certificate without key.
        write_atomic(&key_path, &key)?;
        // Public: the data directory's group may read it (the Debian
        // package's `reach-admin`, for `api --ca-cert`).
        private_files::write_atomic_group_readable(&cert_path, &cert).map_err(|source| {
            PkiError::Io {
                path: cert_path.clone(),
                source,
            }
        })?;
        tracing::info!(path = %cert_path.display(), "generated the CA's root certificate");
        Ok((cert, key))
    }

    /// The server identity for rustls/tonic: (certificate chain PEM, key PEM).
    pub fn server_identity(&self) -> (&str, &str) {
        (&self.server_cert_pem, &self.server_key_pem)
    }

    /// The serial of the server certificate (the chain's first), lower-case
    /// hex; `None` when it cannot be parsed.
    pub fn server_serial(&self) -> Option<String> {
        let der = pem_certificates(&self.server_cert_pem).into_iter().next()?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
        Some(hex(cert.tbs_certificate.raw_serial()))
    }

    /// The roots a client certificate may chain to: the issuing one and a
    /// rotation's other.
    pub fn trusted_roots(&self) -> Vec<rustls::pki_types::CertificateDer<'static>> {
        self.roots.iter().map(|r| r.der.clone()).collect()
    }

    /// Every root trusted, the issuing one first.
    pub fn roots(&self) -> &[Root] {
        &self.roots
    }

    /// The fingerprint of the root that issues.
    pub fn issuing_root(&self) -> &str {
        self.roots.first().map_or("", |r| r.fingerprint.as_str())
    }

    /// Where a root rotation stands.
    pub fn phase(&self) -> Phase {
        match self.roots.get(1).map(|r| r.role) {
            Some(RootRole::Next) => Phase::Introduce,
            Some(RootRole::Previous) => Phase::Switch,
            _ => Phase::Steady,
        }
    }

    /// The trust bundle connectors are told: every trusted root's PEM, the
    /// issuing one first.
    pub fn bundle_pem(&self) -> String {
        self.roots.iter().map(|r| r.pem.as_str()).collect()
    }

    /// The trusted root whose key signed the DER certificate `leaf` (its
    /// issuer's name and its signature checked), if any.
    pub fn root_of(&self, leaf: &[u8]) -> Option<&Root> {
        let (_, cert) = x509_parser::parse_x509_certificate(leaf).ok()?;
        self.roots.iter().find(|root| {
            x509_parser::parse_x509_certificate(&root.der)
                .ok()
                .is_some_and(|(_, r)| {
                    r.subject().as_raw() == cert.issuer().as_raw()
                        && cert.verify_signature(Some(r.public_key())).is_ok()
                })
        })
    }

    /// How long a connector whose certificate is not from the issuing root
    /// is given to renew it (`TrustBundle.renew_within_ms`): a tenth of a
    /// certificate's lifetime, at most 10 minutes, so that a rotation's
    /// renewals spread out and finish well within every lifetime.
    pub fn renew_spread(&self) -> Duration {
        (self.validity / 10).min(Duration::from_secs(600))
    }

    /// Signs a client certificate for connector `name` of `group` over the
    /// public key of `csr_pem`. Only the CSR's key is used (its signature is
    /// verified); subject, names and usages are the CA's.
    pub fn issue(&self, name: &str, group: &str, csr_pem: &str) -> Result<Issued, PkiError> {
        if csr_pem.len() > MAX_CSR_BYTES {
            return Err(PkiError::InvalidCsr(format!(
                "{} bytes (at most {MAX_CSR_BYTES})",
                csr_pem.len()
            )));
        }
        let csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| PkiError::InvalidCsr(e.to_string()))?;
        let uri = identity_uri(group, name);
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "reach");
        dn.push(DnType::OrganizationalUnitName, group);
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        params.subject_alt_names =
            vec![SanType::URI(uri.clone().try_into().map_err(|_| {
                PkiError::InvalidCsr("name or group is not ASCII".into())
            })?)];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let serial = serial();
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        let now = SystemTime::now();
        // The certificate holds whole seconds: the store and the answer say
        // the same end. With milliseconds kept, the store counted a
        // certificate the TLS handshake had just refused as still valid, and
        // refused the connector's enrollment with its provisioning key.
        let not_after = whole_seconds(now + self.validity);
        // A little slack for connectors whose clock runs behind.
        params.not_before = offset(now - Duration::from_secs(300));
        params.not_after = offset(not_after);
        let cert = params
            .signed_by(&csr.public_key, &self.issuer)
            .map_err(cert_err("signing a client certificate"))?;
        Ok(Issued {
            pem: cert.pem(),
            serial: hex(&serial),
            fingerprint: sha256_hex(cert.der()),
            not_after_ms: unix_ms(not_after),
            identity_uri: uri,
            root: self.issuing_root().to_owned(),
        })
    }
}

/// A new root: ECDSA P-256, valid 20 years (from an hour ago), path
/// length 0, named "reach central authority root": (certificate PEM, key
/// PEM). What the CA generates on first start and `central-authority
/// new-root` writes.
pub fn generate_root() -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(cert_err("generating the root key"))?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "reach");
    dn.push(DnType::CommonName, "reach central authority root");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.serial_number = Some(SerialNumber::from_slice(&serial()));
    let now = SystemTime::now();
    params.not_before = offset(now - Duration::from_secs(3600));
    params.not_after = offset(now + Duration::from_secs(20 * 365 * 86_400));
    let cert = params
        .self_signed(&key)
        .map_err(cert_err("signing the root"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The part a root plays in a rotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RootRole {
    /// It signs connector and server certificates.
    Issuing,
    /// Introduced: trusted and announced, not issuing yet
    /// (`[tls] next_root_file`).
    Next,
    /// Issued before the switch: trusted and announced until it is retired
    /// (`[tls] previous_root_file`).
    Previous,
}

/// Where a root rotation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// One root: no rotation in progress.
    Steady,
    /// A new root is trusted and announced; the old one still issues.
    Introduce,
    /// The new root issues; the old one is still trusted until retired.
    Switch,
}

/// A root certificate the CA trusts.
#[derive(Clone, Debug)]
pub struct Root {
    /// Its part.
    pub role: RootRole,
    /// PEM (ends with a newline).
    pub pem: String,
    der: rustls::pki_types::CertificateDer<'static>,
    /// SHA-256 of its DER, lower-case hex: how the store and the API name
    /// it.
    pub fingerprint: String,
    /// Its subject, as text.
    pub subject: String,
    /// End of its validity, Unix ms.
    pub not_after_ms: i64,
}

impl Root {
    /// The issuing root of `issuer_pem` and the rotation's other root that
    /// `sources` names, each checked to be a CA certificate, distinct.
    fn all(issuer_pem: &str, sources: &TlsSources) -> Result<Vec<Root>, PkiError> {
        let mut roots = vec![Root::parse(
            RootRole::Issuing,
            issuer_pem,
            "the issuer certificate",
        )?];
        for (file, role) in [
            (&sources.next_root_file, RootRole::Next),
            (&sources.previous_root_file, RootRole::Previous),
        ] {
            let Some(path) = file else { continue };
            let shown = path.display().to_string();
            let root = Root::parse(role, &read(path)?, &shown)?;
            if root.fingerprint == roots[0].fingerprint {
                return Err(PkiError::Root {
                    path: shown,
                    reason: "this is the issuing root itself; name the other root of the rotation"
                        .into(),
                });
            }
            roots.push(root);
        }
        Ok(roots)
    }

    /// The one certificate of `pem`, which must be a CA's.
    fn parse(role: RootRole, pem: &str, what: &str) -> Result<Root, PkiError> {
        let bad = |reason: &str| PkiError::Root {
            path: what.to_owned(),
            reason: reason.to_owned(),
        };
        let der = pem_certificates(pem)
            .into_iter()
            .next()
            .ok_or_else(|| bad("no PEM CERTIFICATE in it"))?;
        let (_, cert) = x509_parser::parse_x509_certificate(&der)
            .map_err(|_| bad("not a parseable X.509 certificate"))?;
        if !cert.is_ca() {
            return Err(bad("not a CA certificate (basicConstraints CA:TRUE)"));
        }
        let text = first_certificate_block(pem).ok_or_else(|| bad("no PEM CERTIFICATE in it"))?;
        Ok(Root {
            role,
            pem: text,
            fingerprint: sha256_hex(&der),
            subject: cert.subject().to_string(),
            not_after_ms: cert.validity().not_after.timestamp().saturating_mul(1000),
            der,
        })
    }
}

/// The SHA-256 (lower-case hex) of the first certificate of a PEM text, as
/// roots are named (`Root::fingerprint`).
pub fn pem_fingerprint(pem: &str) -> Option<String> {
    pem_certificates(pem).first().map(|der| sha256_hex(der))
}

/// The first `CERTIFICATE` block of a PEM text, with a final newline.
fn first_certificate_block(pem: &str) -> Option<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let start = pem.find(BEGIN)?;
    let end = start + pem[start..].find(END)? + END.len();
    Some(format!("{}\n", &pem[start..end]))
}

/// The names a generated server certificate carries: localhost,
/// 127.0.0.1 and ::1; each listen address, or for a wildcard one (0.0.0.0,
/// ::) the host's name, fully qualified name and interface addresses
/// (`host`, asked only then); and `extra` (`[tls] server_names`). Sorted,
/// without duplicates. A host name that is no valid DNS name is left out
/// (logged): a client could not dial it.
pub fn server_names(
    extra: &[String],
    listen_hosts: &[IpAddr],
    host: impl FnOnce() -> HostIdentity,
) -> Vec<String> {
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    names.extend(
        listen_hosts
            .iter()
            .filter(|ip| !ip.is_unspecified())
            .map(ToString::to_string),
    );
    if listen_hosts.iter().any(IpAddr::is_unspecified) {
        let host = host();
        for name in host.name.into_iter().chain(host.fqdn) {
            match policy::Host::parse(&name) {
                Ok(valid) => names.push(valid.into_string()),
                Err(e) => tracing::warn!(
                    name,
                    "the host name {e}; the generated server certificate does not name it"
                ),
            }
        }
        names.extend(host.addresses.iter().map(ToString::to_string));
    }
    names.extend(extra.iter().cloned());
    names.sort();
    names.dedup();
    names
}

/// What `check-config` warns about: a CA that listens beyond loopback
/// (`listen`) and issues its own server certificate with no
/// `[tls] server_names`. The warning names what that certificate will
/// carry (from `host`) and the key to set.
pub fn beyond_loopback_warning(
    tls_enabled: bool,
    sources: &TlsSources,
    listen: &[std::net::SocketAddr],
    host: impl FnOnce() -> HostIdentity,
) -> Option<String> {
    let generated = tls_enabled && sources.cert_file.is_none();
    let beyond: Vec<String> = listen
        .iter()
        .filter(|a| !a.ip().is_loopback())
        .map(ToString::to_string)
        .collect();
    if !generated || beyond.is_empty() || !sources.server_names.is_empty() {
        return None;
    }
    let hosts: Vec<IpAddr> = listen.iter().map(std::net::SocketAddr::ip).collect();
    let names = server_names(&[], &hosts, host);
    Some(format!(
        "the CA listens on {} beyond loopback and [tls] server_names is empty: the server certificate it generates names only {}. A connector that dials the CA by another name (a DNS alias, a load balancer, a NAT address) is refused with \"certificate not valid for name\": add that name to [tls] server_names",
        beyond.join(" and "),
        names.join(", ")
    ))
}

/// A server certificate issued by `issuer` for `names`.
fn server_cert(
    issuer: &Issuer<'static, KeyPair>,
    names: &[String],
) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(cert_err("generating the server key"))?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(cert_err("server names"))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "reach");
    dn.push(DnType::CommonName, "reach central authority");
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(SerialNumber::from_slice(&serial()));
    let now = SystemTime::now();
    params.not_before = offset(now - Duration::from_secs(3600));
    params.not_after = offset(now + Duration::from_secs(825 * 86_400));
    let cert = params
        .signed_by(&key, issuer)
        .map_err(cert_err("signing the server certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Every certificate of a PEM text (none when it holds none or is
/// malformed).
fn pem_certificates(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_default()
}

/// Reads the connector identity from a DER certificate: exactly one URI SAN
/// `spiffe://reach/group/<group>/connector/<name>` whose name equals the
/// common name. The chain was verified by TLS already.
pub fn identity_of(der: &[u8]) -> Result<CertIdentity, IdentityError> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|_| IdentityError::Unparseable)?;
    let sans = cert
        .subject_alternative_name()
        .map_err(|_| IdentityError::Unparseable)?
        .ok_or(IdentityError::NoIdentity)?;
    let uris: Vec<&str> = sans
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::URI(u) => Some(*u),
            _ => None,
        })
        .filter(|u| u.starts_with(IDENTITY_PREFIX))
        .collect();
    let [uri] = uris.as_slice() else {
        return Err(IdentityError::NoIdentity);
    };
    let rest = &uri[IDENTITY_PREFIX.len()..];
    let (group, name) = rest
        .split_once("/connector/")
        .filter(|(g, n)| !g.is_empty() && !n.is_empty() && !g.contains('/') && !n.contains('/'))
        .ok_or(IdentityError::NoIdentity)?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .ok_or(IdentityError::NameMismatch)?;
    if cn != name {
        return Err(IdentityError::NameMismatch);
    }
    Ok(CertIdentity {
        name: name.to_owned(),
        group: group.to_owned(),
        serial: hex(cert.tbs_certificate.raw_serial()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csr(name: &str) -> String {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        params
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem")
    }

    #[cfg(unix)]
    #[test]
    fn the_data_dir_and_every_file_in_it_are_the_owners_alone() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("reach-pki-modes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let data = dir.join("data");
        Pki::load(
            &data,
            &TlsSources::default(),
            &[],
            Duration::from_secs(86_400),
        )
        .expect("pki");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&data), 0o700, "data dir");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&data).expect("list") {
            let path = entry.expect("entry").path();
            // The root certificate is public: its group may read it.
            let want = if path.ends_with(ROOT_CERT_FILE) {
                0o640
            } else {
                0o600
            };
            assert_eq!(mode(&path), want, "{}", path.display());
            names.push(
                path.file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        names.sort();
        assert_eq!(
            names,
            [
                ROOT_CERT_FILE,
                ROOT_KEY_FILE,
                SERVER_CERT_FILE,
                SERVER_KEY_FILE
            ]
            .map(String::from)
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>(),
            "no temporary file left"
        );
        // A planted file at a predictable temporary name is never followed.
        std::fs::write(data.join("ca.tmp"), "planted").expect("plant");
        write_atomic(&data.join(ROOT_CERT_FILE), "new").expect("write");
        assert_eq!(
            std::fs::read_to_string(data.join("ca.tmp")).expect("read"),
            "planted"
        );
        assert_eq!(mode(&data.join(ROOT_CERT_FILE)), 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn root_is_generated_once_and_certificates_name_connector_and_group() {
        let dir = std::env::temp_dir().join(format!("reach-pki-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pki = Pki::load(
            &dir,
            &TlsSources::default(),
            &[],
            Duration::from_secs(86_400),
        )
        .expect("pki");
        let again = Pki::load(
            &dir,
            &TlsSources::default(),
            &[],
            Duration::from_secs(86_400),
        )
        .expect("pki");
        assert_eq!(pki.issuer_pem, again.issuer_pem, "the root persists");
        // The CSR asks for another name: the CA's naming wins.
        let issued = pki.issue("c1", "dc-east", &csr("evil")).expect("issued");
        let der = rustls_pem_der(&issued.pem);
        let id = identity_of(&der).expect("identity");
        assert_eq!(id.name, "c1");
        assert_eq!(id.group, "dc-east");
        assert_eq!(id.serial, issued.serial);
        // The end the store keeps is the certificate's own, to the
        // millisecond.
        let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("certificate");
        assert_eq!(
            issued.not_after_ms,
            cert.validity().not_after.timestamp() * 1000,
            "the recorded end differs from the certificate's"
        );
        assert!(matches!(
            pki.issue("c1", "g", "garbage"),
            Err(PkiError::InvalidCsr(_))
        ));
        assert!(matches!(
            pki.issue("c1", "g", &"x".repeat(MAX_CSR_BYTES + 1)),
            Err(PkiError::InvalidCsr(_))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn rustls_pem_der(pem: &str) -> Vec<u8> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(pem.as_bytes())
            .expect("pem")
            .to_vec()
    }

    /// The CA host of the two-host test: a name, a fully qualified name,
    /// loopback, one IPv4 and one unique-local IPv6 address.
    fn ca_host() -> HostIdentity {
        HostIdentity {
            name: Some("Reach-CA".into()),
            fqdn: Some("reach-ca.example.test".into()),
            addresses: ["127.0.0.1", "10.77.0.1", "fd00:77::1"]
                .iter()
                .map(|a| a.parse().expect("address"))
                .collect(),
        }
    }

    /// Verifies `cert_pem` as the server certificate for `name`, chained to
    /// `root_pem`, as a connector's rustls does.
    fn verify(root_pem: &str, cert_pem: &str, name: &str) -> Result<(), rustls::Error> {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::{ServerName, UnixTime};
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(rustls_pem_der(root_pem).into())
            .expect("the root");
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            std::sync::Arc::new(roots),
            std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .expect("verifier");
        let server = ServerName::try_from(name.to_owned()).expect("server name");
        let leaf = rustls_pem_der(cert_pem).into();
        verifier
            .verify_server_cert(&leaf, &[], &server, &[], UnixTime::now())
            .map(|_| ())
    }

    #[test]
    fn a_wildcard_listen_names_the_host_its_fqdn_and_its_addresses() {
        let wildcard = [IpAddr::from([0, 0, 0, 0]), IpAddr::from([0, 0, 0, 0])];
        assert_eq!(
            server_names(&[], &wildcard, ca_host),
            [
                "10.77.0.1",
                "127.0.0.1",
                "::1",
                "fd00:77::1",
                "localhost",
                "reach-ca",
                "reach-ca.example.test"
            ]
        );
        // `[tls] server_names` come on top; `::` is a wildcard too.
        let names = server_names(
            &["ca.example.internal".into()],
            &["::".parse().expect("address")],
            ca_host,
        );
        assert!(
            names.contains(&"ca.example.internal".to_owned()),
            "{names:?}"
        );
        assert!(names.contains(&"reach-ca".to_owned()), "{names:?}");

        // The certificate made of them verifies for each way a connector on
        // another host dials the CA, and for no other name.
        let dir = std::env::temp_dir().join(format!("reach-pki-wildcard-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pki =
            Pki::load(&dir, &TlsSources::default(), &[], Duration::from_secs(60)).expect("pki");
        let (cert, _) =
            server_cert(&pki.issuer, &server_names(&[], &wildcard, ca_host)).expect("cert");
        for name in [
            "10.77.0.1",
            "reach-ca",
            "reach-ca.example.test",
            "fd00:77::1",
        ] {
            verify(&pki.issuer_pem, &cert, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let refused = verify(&pki.issuer_pem, &cert, "10.77.0.9").expect_err("another address");
        assert!(
            refused
                .to_string()
                .contains("not valid for name \"10.77.0.9\""),
            "{refused}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_specific_listen_names_that_address_and_asks_nothing_of_the_host() {
        let names = server_names(
            &[],
            &["10.77.0.1".parse().expect("address")],
            || -> HostIdentity { panic!("the host was asked for a specific listen") },
        );
        assert_eq!(names, ["10.77.0.1", "127.0.0.1", "::1", "localhost"]);
    }

    #[test]
    fn a_host_with_many_interfaces_gets_a_certificate_that_verifies() {
        let many = || HostIdentity {
            name: Some("big".into()),
            fqdn: None,
            addresses: (0..2000u32)
                .map(|i| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i)))
                .collect(),
        };
        let names = server_names(&[], &["0.0.0.0".parse().expect("address")], many);
        assert_eq!(names.len(), 2000 + 4, "deduplicated: 127.0.0.1 once");
        let dir = std::env::temp_dir().join(format!("reach-pki-many-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pki =
            Pki::load(&dir, &TlsSources::default(), &[], Duration::from_secs(60)).expect("pki");
        let (cert, _) = server_cert(&pki.issuer, &names).expect("cert");
        for name in ["10.0.0.0", "10.0.7.207", "big"] {
            verify(&pki.issuer_pem, &cert, name).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The real path: a CA listening on 0.0.0.0 issues a server certificate
    /// naming this machine's host name and its interfaces' addresses, and
    /// a new one at each start.
    #[test]
    fn a_ca_listening_on_every_address_names_this_host() {
        let dir = std::env::temp_dir().join(format!("reach-pki-this-host-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let wildcard = [IpAddr::from([0, 0, 0, 0])];
        let load = || {
            Pki::load(
                &dir,
                &TlsSources::default(),
                &wildcard,
                Duration::from_secs(60),
            )
            .expect("pki")
        };
        let pki = load();
        let this = HostIdentity::of_this_host();
        let host_name = this.name.clone().expect("this machine has a host name");
        let (cert, _) = pki.server_identity();
        verify(&pki.issuer_pem, cert, &host_name).unwrap_or_else(|e| panic!("{host_name}: {e}"));
        for ip in &this.addresses {
            verify(&pki.issuer_pem, cert, &ip.to_string()).unwrap_or_else(|e| panic!("{ip}: {e}"));
        }
        assert_ne!(
            load().server_cert_pem,
            pki.server_cert_pem,
            "a new one per start"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn check_config_warns_when_the_ca_listens_beyond_loopback_without_server_names() {
        let wildcard: Vec<std::net::SocketAddr> = vec![
            "0.0.0.0:7443".parse().expect("a"),
            "0.0.0.0:7480".parse().expect("a"),
        ];
        let warning = beyond_loopback_warning(true, &TlsSources::default(), &wildcard, ca_host)
            .expect("a warning");
        for needle in [
            "0.0.0.0:7443 and 0.0.0.0:7480",
            "reach-ca, reach-ca.example.test",
            "10.77.0.1",
            "[tls] server_names",
        ] {
            assert!(warning.contains(needle), "{needle:?} missing in {warning}");
        }
        let loopback = vec![
            "127.0.0.1:7443".parse().expect("a"),
            "[::1]:7480".parse().expect("a"),
        ];
        let named = TlsSources {
            server_names: vec!["ca.example.internal".into()],
            ..TlsSources::default()
        };
        let own = TlsSources {
            cert_file: Some("/etc/reach/server.pem".into()),
            key_file: Some("/etc/reach/server.key".into()),
            ..TlsSources::default()
        };
        let quiet = [
            beyond_loopback_warning(true, &TlsSources::default(), &loopback, ca_host),
            beyond_loopback_warning(true, &named, &wildcard, ca_host),
            beyond_loopback_warning(true, &own, &wildcard, ca_host),
            beyond_loopback_warning(false, &TlsSources::default(), &wildcard, ca_host),
        ];
        assert_eq!(quiet, [None, None, None, None]);
        // A specific address beyond loopback is named, and warned about.
        let specific = vec!["10.77.0.1:7443".parse().expect("a")];
        let warning = beyond_loopback_warning(true, &TlsSources::default(), &specific, ca_host)
            .expect("a warning");
        assert!(
            warning.contains("names only 10.77.0.1, 127.0.0.1, ::1, localhost."),
            "{warning}"
        );
    }

    /// A rotation's roots: introduced, the new one is trusted and
    /// announced after the issuing one, which signs; switched, the new one
    /// signs and the old one is still trusted; a certificate is told apart
    /// by the root whose key signed it, also when both roots bear the same
    /// name.
    #[test]
    fn a_rotation_trusts_both_roots_and_tells_their_certificates_apart() {
        let dir = std::env::temp_dir().join(format!("reach-pki-rotation-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let day = Duration::from_secs(86_400);
        let old = Pki::load(&dir.join("data"), &TlsSources::default(), &[], day).expect("pki");
        assert_eq!(old.phase(), Phase::Steady);
        let new_root = crate::tools::root::run(&dir.join("root-2")).expect("new root");
        let old_cert = dir.join("data").join(ROOT_CERT_FILE);
        let introduce = Pki::load(
            &dir.join("data"),
            &TlsSources {
                next_root_file: Some(new_root.cert.clone()),
                ..Default::default()
            },
            &[],
            day,
        )
        .expect("introduce");
        assert_eq!(introduce.phase(), Phase::Introduce);
        assert_eq!(introduce.issuing_root(), old.issuing_root());
        assert_eq!(introduce.roots()[1].fingerprint, new_root.fingerprint);
        assert_eq!(introduce.trusted_roots().len(), 2);
        let new_pem = std::fs::read_to_string(&new_root.cert).expect("pem");
        assert_eq!(
            introduce.bundle_pem(),
            format!("{}{new_pem}", old.issuer_pem)
        );
        let switch = Pki::load(
            &dir.join("data"),
            &TlsSources {
                issuer_cert_file: Some(new_root.cert.clone()),
                issuer_key_file: Some(new_root.key.clone()),
                previous_root_file: Some(old_cert.clone()),
                ..Default::default()
            },
            &[],
            day,
        )
        .expect("switch");
        assert_eq!(switch.phase(), Phase::Switch);
        assert_eq!(switch.issuing_root(), new_root.fingerprint);
        let der = |i: &Issued| rustls_pem_der(&i.pem);
        let (from_old, from_new) = (
            old.issue("c1", "g", &csr("c1")).expect("old"),
            switch.issue("c1", "g", &csr("c1")).expect("new"),
        );
        assert_eq!(from_old.root, old.issuing_root());
        assert_eq!(from_new.root, new_root.fingerprint);
        for (pki, cert, root) in [
            (&switch, &from_old, old.issuing_root()),
            (&switch, &from_new, new_root.fingerprint.as_str()),
            (&introduce, &from_new, new_root.fingerprint.as_str()),
        ] {
            assert_eq!(
                pki.root_of(&der(cert)).map(|r| r.fingerprint.as_str()),
                Some(root)
            );
        }
        // Retired: the old root's certificates chain to no trusted root.
        assert!(old.root_of(&der(&from_new)).is_none());
        // Rotation files that cannot serve are refused, naming the file.
        let sources = |next: PathBuf, previous: Option<PathBuf>| TlsSources {
            next_root_file: Some(next),
            previous_root_file: previous,
            ..Default::default()
        };
        let load = |s: &TlsSources| Pki::load(&dir.join("data"), s, &[], day);
        let same = load(&sources(old_cert.clone(), None)).expect_err("the issuing root itself");
        assert!(same.to_string().contains("issuing root itself"), "{same}");
        std::fs::write(dir.join("leaf.pem"), &from_old.pem).expect("write");
        let leaf = load(&sources(dir.join("leaf.pem"), None)).expect_err("a leaf");
        assert!(leaf.to_string().contains("not a CA certificate"), "{leaf}");
        let missing = load(&sources(dir.join("nowhere.pem"), None)).expect_err("missing");
        assert!(missing.to_string().contains("nowhere.pem"), "{missing}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn garbage_is_no_identity() {
        assert_eq!(identity_of(b"nonsense"), Err(IdentityError::Unparseable));
    }
}
