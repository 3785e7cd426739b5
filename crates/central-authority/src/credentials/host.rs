//! This host's names and addresses: what a generated server certificate
//! names when the CA listens on a wildcard address, so that a connector on
//! another host verifies the CA whether it dials the host's name, its fully
//! qualified name or one of its addresses.

use std::net::IpAddr;
use std::time::Duration;

/// How long resolving the fully qualified name may take: getaddrinfo asks
/// the DNS servers when the hosts file does not name the host, and one
/// that does not answer would hold the CA's start for its full timeout.
const FQDN_LIMIT: Duration = Duration::from_secs(3);

/// A host's own names and the addresses of its interfaces.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostIdentity {
    /// The host name (`hostname`).
    pub name: Option<String>,
    /// Its fully qualified name (`hostname -f`), where it has one.
    pub fqdn: Option<String>,
    /// Every address of its interfaces but link-local IPv6 ones.
    pub addresses: Vec<IpAddr>,
}

impl HostIdentity {
    /// This host's: the host name, the canonical name the resolver gives
    /// for it (the hosts file's first name, or DNS) when that is a
    /// different, dotted name, and every interface address but link-local
    /// IPv6 (fe80::/10, which a client can dial only with a zone index no
    /// certificate can name). What cannot be read is logged and left out.
    pub fn of_this_host() -> Self {
        let name = match dns_lookup::get_hostname() {
            Ok(name) if !name.is_empty() => Some(name),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the host name; the generated server certificate does not name it");
                None
            }
        };
        let fqdn = name
            .as_deref()
            .and_then(canonical_name)
            .filter(|f| f.contains('.') && Some(f) != name.as_ref());
        let addresses = match if_addrs::get_if_addrs() {
            Ok(interfaces) => interfaces
                .iter()
                .map(if_addrs::Interface::ip)
                .filter(|ip| !link_local_v6(ip))
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list the interfaces' addresses; the generated server certificate does not name them");
                Vec::new()
            }
        };
        HostIdentity {
            name,
            fqdn,
            addresses,
        }
    }
}

/// fe80::/10.
fn link_local_v6(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// The canonical name of `host` (getaddrinfo with `AI_CANONNAME`), within
/// [`FQDN_LIMIT`]; `None` when it has none or the resolver is slower.
fn canonical_name(host: &str) -> Option<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let host = host.to_owned();
    let asked = host.clone();
    // A thread of its own: getaddrinfo cannot be cancelled; one that
    // outlives the limit ends by itself, its answer dropped.
    let spawned = std::thread::Builder::new()
        .name("fqdn".into())
        .spawn(move || {
            let hints = dns_lookup::AddrInfoHints {
                flags: libc::AI_CANONNAME,
                ..dns_lookup::AddrInfoHints::default()
            };
            let name = dns_lookup::getaddrinfo(Some(&host), None, Some(hints))
                .ok()
                .and_then(|mut answers| answers.find_map(|a| a.ok()?.canonname));
            let _ = tx.send(name);
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start resolving the host's fully qualified name");
        return None;
    }
    match rx.recv_timeout(FQDN_LIMIT) {
        Ok(name) => name,
        Err(_) => {
            tracing::warn!(
                host = %asked,
                limit_s = FQDN_LIMIT.as_secs(),
                "resolving the host's fully qualified name took too long; the generated server certificate does not name it (add it to [tls] server_names)"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_ipv6_is_left_out_and_nothing_else() {
        for (ip, link_local) in [
            ("fe80::1", true),
            ("febf::1", true),
            ("fec0::1", false),
            ("fd00::1", false),
            ("::1", false),
            ("169.254.1.1", false),
            ("10.77.0.1", false),
        ] {
            let ip: IpAddr = ip.parse().expect("address");
            assert_eq!(link_local_v6(&ip), link_local, "{ip}");
        }
    }

    #[test]
    fn this_host_has_a_name_and_its_loopback_address() {
        let host = HostIdentity::of_this_host();
        assert!(host.name.is_some(), "{host:?}");
        assert!(
            host.addresses.contains(&IpAddr::from([127, 0, 0, 1])),
            "{host:?}"
        );
        assert!(!host.addresses.iter().any(link_local_v6), "{host:?}");
    }
}
