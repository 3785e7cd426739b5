//! The link to the server: the URL's `sslmode` and the roots its
//! certificate is verified against.

use crate::ground::secret::Secret;
use crate::store::StoreError;
use rustls::pki_types::pem::PemObject;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

/// `e` naming the `sslmode` when TLS is what failed: the operator's fix is
/// a server that offers TLS, the right root, or the mode.
pub(super) fn tls_refused(e: StoreError, link: Link) -> StoreError {
    let text = e.to_string();
    if link.mode == "disable" || !(text.contains("TLS") || text.contains("certificate")) {
        return e;
    }
    StoreError::Pool(format!(
        "{text} (sslmode={}: the server must offer TLS with a certificate for its name from \
         the sslrootcert root or the system's; sslmode=disable only on a trusted network)",
        link.mode
    ))
}

/// The `sslmode` a link gets, and whether it may run in plain text to a
/// host off loopback (an attacker on the path could then read and alter
/// sessions, connectors and the audit trail: warned about).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Link {
    /// The mode in force, as libpq names it.
    pub(crate) mode: &'static str,
    /// A host is off loopback and the mode lets the link be plain text
    /// (`disable`, `allow`, `prefer`: each only by the operator's choice).
    pub(crate) plaintext_remote: bool,
}

/// Whether `host` (a URL's host: a name, an address or a unix socket
/// directory) is this machine.
fn is_local(host: &tokio_postgres::config::Host) -> bool {
    match host {
        tokio_postgres::config::Host::Unix(_) => true,
        tokio_postgres::config::Host::Tcp(name) => {
            let bare = name.trim_start_matches('[').trim_end_matches(']');
            policy::host::Host::parse(bare).is_ok_and(|h| match h.ip() {
                Some(ip) => is_loopback(ip),
                None => h.as_str() == "localhost",
            })
        }
    }
}

/// Whether `ip` is a loopback address (IPv4-mapped ones too).
fn is_loopback(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
        v4 => v4.is_loopback(),
    }
}

/// The link for `hosts` (and their `hostaddr`s) with the URL's own
/// `sslmode`, if any: without one, `verify-full` when a root is given
/// (`sslrootcert`), else `require` if any host or address is off loopback,
/// and `prefer` on loopback and unix sockets.
pub(crate) fn link(
    (hosts, addrs): (&[tokio_postgres::config::Host], &[std::net::IpAddr]),
    explicit: Option<&str>,
    root: bool,
) -> Result<Link, String> {
    let remote = hosts.iter().any(|h| !is_local(h)) || addrs.iter().any(|a| !is_loopback(*a));
    let mode = match explicit {
        Some("disable") => "disable",
        Some("allow") => "allow",
        Some("prefer") => "prefer",
        Some("require") => "require",
        Some("verify-ca") => "verify-ca",
        Some("verify-full") => "verify-full",
        Some(other) => {
            return Err(format!(
                "url: sslmode {other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            ));
        }
        None if root => "verify-full",
        None if remote => "require",
        None => "prefer",
    };
    Ok(Link {
        mode,
        plaintext_remote: remote && matches!(mode, "disable" | "allow" | "prefer"),
    })
}

/// The driver's `SslMode` for a libpq mode name: every mode that uses TLS
/// verifies the server's certificate, name included (`require` and
/// `verify-ca` are as strict as `verify-full`).
fn driver_mode(mode: &str) -> SslMode {
    match mode {
        "disable" => SslMode::Disable,
        "allow" | "prefer" => SslMode::Prefer,
        _ => SslMode::Require,
    }
}

/// `url` without its `sslmode` and `sslrootcert` (which the driver does not
/// take), parsed, with the link it gets and its root file.
pub(crate) fn parse_url(
    url: &str,
) -> Result<(tokio_postgres::Config, Link, Option<std::path::PathBuf>), StoreError> {
    let bad = |m: String| StoreError::Config(m);
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(bad(format!(
            "url {:?} is neither a file path nor a postgres:// URL",
            crate::store::redact_url(url)
        )));
    }
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut kept = Vec::new();
    let mut explicit = None;
    let mut root = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "sslmode" => explicit = Some(v),
            "sslrootcert" => root = Some(std::path::PathBuf::from(v)),
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    let config: tokio_postgres::Config = rest
        .parse()
        .map_err(|e| bad(format!("url {}: {e}", crate::store::redact_url(url))))?;
    let hosts = (config.get_hosts(), config.get_hostaddrs());
    let link = link(hosts, explicit, root.is_some()).map_err(bad)?;
    Ok((config, link, root))
}

/// The driver's configuration and TLS connector for `url`: `sslmode`
/// (default: [`link`]) and `sslrootcert` (a PEM file; default the system's
/// roots) are read here. The server's certificate is always verified, name
/// included.
pub(super) fn parse(
    url: &str,
    password: Option<&Secret>,
) -> Result<(tokio_postgres::Config, MakeRustlsConnect, Link), StoreError> {
    let bad = |m: String| StoreError::Config(m);
    let (mut config, link, root) = parse_url(url)?;
    let mode = driver_mode(link.mode);
    config.ssl_mode(mode);
    if config.get_password().is_none()
        && let Some(p) = password
    {
        config.password(p.expose());
    }
    if config.get_application_name().is_none() {
        config.application_name("reach-central-authority");
    }
    config.connect_timeout(Duration::from_secs(10));
    let roots = root_store(root.as_deref(), mode)?;
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| bad(format!("TLS: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok((config, MakeRustlsConnect::new(tls), link))
}

/// The roots the server's certificate is verified against: the PEM file
/// `root` (`sslrootcert`), or the system's unless TLS is off.
fn root_store(
    root: Option<&std::path::Path>,
    mode: SslMode,
) -> Result<rustls::RootCertStore, StoreError> {
    let bad = |m: String| StoreError::Config(m);
    let mut roots = rustls::RootCertStore::empty();
    match root {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| bad(format!("sslrootcert {}: {e}", path.display())))?;
            let certs = rustls::pki_types::CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(format!("sslrootcert {}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(bad(format!(
                    "sslrootcert {}: no certificate in it",
                    path.display()
                )));
            }
            for c in certs {
                roots
                    .add(c)
                    .map_err(|e| bad(format!("sslrootcert {}: {e}", path.display())))?;
            }
        }
        None if mode != SslMode::Disable => {
            let found = rustls_native_certs::load_native_certs();
            for c in found.certs {
                let _ = roots.add(c);
            }
        }
        None => {}
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The link each URL gets: its own `sslmode`; else `verify-full` with a
    /// root, `require` off loopback, `prefer` on loopback and unix sockets;
    /// plain text possible to a host off loopback only when asked for.
    #[test]
    fn the_sslmode_follows_the_host_unless_the_url_names_one() {
        let root = "&sslrootcert=/etc/reach/db-ca.pem";
        for (url, mode, plaintext_remote) in [
            ("postgres://u@db.example.com/reach", "require", false),
            ("postgres://u@10.0.0.5:5432/reach", "require", false),
            ("postgres://u@[2001:db8::5]/reach", "require", false),
            (
                "postgres://u@192.168.1.20/reach?application_name=x",
                "require",
                false,
            ),
            (
                "postgres://u@db.example.com/reach?connect_timeout=5",
                "require",
                false,
            ),
            ("postgres://u@127.0.0.1/reach", "prefer", false),
            ("postgres://u@127.8.9.10:5433/reach", "prefer", false),
            ("postgres://u@[::1]/reach", "prefer", false),
            ("postgres://u@localhost/reach", "prefer", false),
            ("postgres://u@LOCALHOST./reach", "prefer", false),
            (
                "postgres://u@%2Fvar%2Frun%2Fpostgresql/reach",
                "prefer",
                false,
            ),
            (
                "postgres://u@localhost,db.example.com/reach",
                "require",
                false,
            ),
            (
                "postgres://u@db.example.com/reach?sslmode=disable",
                "disable",
                true,
            ),
            (
                "postgres://u@db.example.com/reach?sslmode=prefer",
                "prefer",
                true,
            ),
            (
                "postgres://u@db.example.com/reach?sslmode=allow",
                "allow",
                true,
            ),
            (
                "postgres://u@db.example.com/reach?sslmode=verify-ca",
                "verify-ca",
                false,
            ),
            (
                "postgres://u@127.0.0.1/reach?sslmode=disable",
                "disable",
                false,
            ),
            (
                "postgres://u@127.0.0.1/reach?sslmode=require",
                "require",
                false,
            ),
            ("postgres://u@db.localhost.example/reach", "require", false),
            ("postgres://u@127.0.0.1.example/reach", "require", false),
            (
                "postgres://u@localhost/reach?hostaddr=10.0.0.5",
                "require",
                false,
            ),
            (
                "postgres://u@localhost/reach?hostaddr=127.0.0.1",
                "prefer",
                false,
            ),
        ] {
            let (_, link, _) = parse_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(
                (link.mode, link.plaintext_remote),
                (mode, plaintext_remote),
                "{url}"
            );
        }
        // A root makes the default verify-full, on loopback too.
        for host in ["db.example.com", "127.0.0.1"] {
            let url = format!("postgres://u@{host}/reach?connect_timeout=5{root}");
            let (_, link, file) = parse_url(&url).expect("url");
            assert_eq!(link.mode, "verify-full", "{url}");
            assert!(file.is_some());
        }
        let Err(e) = parse_url("postgres://u@db.example.com/reach?sslmode=sometimes") else {
            panic!("an unknown sslmode is refused")
        };
        assert!(e.to_string().contains("sslmode \"sometimes\""), "{e}");
    }
}
