//! Where the CA is. Each `--ca` URL names a host; its addresses (A/AAAA,
//! resolved through the connector's resolver: the `--dns-server` when
//! given, else the system's) are the replicas. Every session dials an
//! address but verifies the server certificate against the *name* (and
//! sends the name as the HTTP/2 authority), so a replica is trusted exactly
//! as the name would be.
//!
//! One address per replica: when a name has both IPv4 and IPv6 addresses,
//! only the IPv4 ones are used (a dual-stack replica has one of each, and
//! the CA keeps only a connector's newest session, so two sessions to one
//! replica would replace each other forever).

use std::net::{IpAddr, SocketAddr};

use tonic::transport::{ClientTlsConfig, Endpoint, Uri};

use crate::resolver::Resolver;

/// A `--ca` URL, parsed once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaUrl {
    url: String,
    tls: bool,
    host: String,
    port: u16,
    ip: Option<IpAddr>,
}

impl CaUrl {
    /// Parses `url`: `https://` or `http://`, a host and an optional port
    /// (443 / 80 by default), nothing else; the error says what is wrong.
    pub fn parse(url: &str) -> Result<CaUrl, String> {
        let uri: Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            Some(other) => return Err(format!("scheme {other:?}: use https:// (or http://)")),
            None => return Err("no scheme: use https://HOST:PORT".into()),
        };
        let authority = uri.authority().ok_or("no host")?;
        if authority.as_str().contains('@') {
            return Err("user information is not allowed".into());
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err("a path or query is not allowed".into());
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if host.is_empty() {
            return Err("no host".into());
        }
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let ip = host.parse().ok();
        Ok(CaUrl {
            url: format!("{}://{}", if tls { "https" } else { "http" }, authority),
            tls,
            host,
            port,
            ip,
        })
    }

    /// The URL as given (scheme and authority).
    pub fn as_str(&self) -> &str {
        &self.url
    }

    /// The host name (or IP literal) the server certificate must name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Whether it is an `https://` URL.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// This URL dialled at `addr` (its port is the URL's).
    pub fn at(&self, addr: IpAddr) -> CaTarget {
        CaTarget {
            url: self.clone(),
            addr: Some(SocketAddr::new(addr, self.port)),
        }
    }

    /// This URL, dialled by name through the system's resolver (a CA's
    /// `reconnect_to`).
    pub fn by_name(&self) -> CaTarget {
        CaTarget {
            url: self.clone(),
            addr: self.ip.map(|ip| SocketAddr::new(ip, self.port)),
        }
    }
}

/// One CA replica to dial: a URL and, normally, the address its name
/// resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaTarget {
    /// The URL (name, port, scheme).
    pub url: CaUrl,
    /// The address to dial; `None` dials the URL's name.
    pub addr: Option<SocketAddr>,
}

impl CaTarget {
    /// A gRPC endpoint dialling the address, with `tls` (when the URL is
    /// `https://`) verifying the certificate against the URL's host and the
    /// URL as the HTTP/2 origin.
    pub fn endpoint(&self, tls: Option<ClientTlsConfig>) -> Result<Endpoint, String> {
        let scheme = if self.url.tls { "https" } else { "http" };
        let mut endpoint = match self.addr {
            Some(addr) => Endpoint::from_shared(format!("{scheme}://{addr}"))
                .map_err(|e| e.to_string())?
                .origin(self.url.url.parse().map_err(|e| format!("{e}"))?),
            None => Endpoint::from_shared(self.url.url.clone()).map_err(|e| e.to_string())?,
        };
        if self.url.tls
            && let Some(tls) = tls
        {
            endpoint = endpoint
                .tls_config(tls.domain_name(self.url.host.clone()))
                .map_err(|e| e.to_string())?;
        }
        Ok(endpoint)
    }

    /// For logs and metrics: `https://ca.example:7443 at 10.0.0.7:7443`.
    pub fn label(&self) -> String {
        match self.addr {
            Some(addr) => format!("{} at {addr}", self.url.url),
            None => self.url.url.clone(),
        }
    }
}

/// Only the IPv4 addresses when there are any, else the IPv6 ones (see the
/// module comment), deduplicated in answer order.
pub fn one_family(addrs: &[IpAddr]) -> Vec<IpAddr> {
    let v4 = addrs.iter().any(IpAddr::is_ipv4);
    let mut out: Vec<IpAddr> = Vec::new();
    for a in addrs {
        if a.is_ipv4() == v4 && !out.contains(a) {
            out.push(*a);
        }
    }
    out
}

/// Resolves the `--ca` URLs to the replicas to dial. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Dialer {
    urls: Vec<CaUrl>,
    resolver: Resolver,
}

impl Dialer {
    /// A dialer for `urls`, resolving names with `resolver`.
    pub fn new(urls: Vec<CaUrl>, resolver: Resolver) -> Self {
        Dialer { urls, resolver }
    }

    /// The URLs.
    pub fn urls(&self) -> &[CaUrl] {
        &self.urls
    }

    /// Every replica of every URL, deduplicated by address; a URL whose
    /// name does not resolve is in the second list (with the reason).
    pub async fn resolve(&self) -> (Vec<CaTarget>, Vec<(CaUrl, String)>) {
        let mut targets: Vec<CaTarget> = Vec::new();
        let mut failed = Vec::new();
        for url in &self.urls {
            let addrs = match url.ip {
                Some(ip) => vec![ip],
                None => match self.resolver.resolve(&url.host).await {
                    Ok(addrs) => one_family(&addrs),
                    Err(e) => {
                        failed.push((url.clone(), e.reason));
                        continue;
                    }
                },
            };
            for addr in addrs {
                let target = url.at(addr);
                if !targets.iter().any(|t| t.addr == target.addr) {
                    targets.push(target);
                }
            }
        }
        (targets, failed)
    }

    /// The replicas to try one after the other (enrollment, renewal): the
    /// resolved ones, or each URL by name when nothing resolves.
    pub async fn candidates(&self) -> Vec<CaTarget> {
        let (targets, failed) = self.resolve().await;
        for (url, reason) in &failed {
            tracing::warn!(ca = %url.as_str(), %reason, "cannot resolve the CA's name");
        }
        if targets.is_empty() {
            return self.urls.iter().map(CaUrl::by_name).collect();
        }
        targets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_urls_parse_with_default_ports_and_reject_the_rest() {
        let u = CaUrl::parse("https://ca.example:7443").expect("valid");
        assert_eq!((u.host(), u.port, u.tls()), ("ca.example", 7443, true));
        let u = CaUrl::parse("https://ca.example").expect("valid");
        assert_eq!(u.port, 443);
        let u = CaUrl::parse("http://[::1]:7443/").expect("valid");
        assert_eq!(
            (u.host(), u.ip, u.tls()),
            ("::1", Some("::1".parse().expect("ip")), false)
        );
        for bad in [
            "ca.example:7443",
            "ftp://ca.example",
            "https://user@ca.example",
            "https://ca.example/path",
            "https://ca.example/?q=1",
            "",
        ] {
            assert!(CaUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_target_dials_the_address_and_names_the_host() {
        let u = CaUrl::parse("https://ca.example:7443").expect("valid");
        let t = u.at("10.0.0.7".parse().expect("ip"));
        assert_eq!(t.addr, Some("10.0.0.7:7443".parse().expect("addr")));
        assert_eq!(t.label(), "https://ca.example:7443 at 10.0.0.7:7443");
        let e = t.endpoint(Some(ClientTlsConfig::new())).expect("endpoint");
        assert_eq!(e.uri().host(), Some("10.0.0.7"));
    }

    #[test]
    fn one_address_family_per_name() {
        let ips =
            |s: &[&str]| -> Vec<IpAddr> { s.iter().map(|a| a.parse().expect("ip")).collect() };
        assert_eq!(
            one_family(&ips(&[
                "::1",
                "127.0.0.1",
                "127.0.0.2",
                "127.0.0.1",
                "fe80::1"
            ])),
            ips(&["127.0.0.1", "127.0.0.2"])
        );
        assert_eq!(one_family(&ips(&["::1", "::2"])), ips(&["::1", "::2"]));
    }
}
