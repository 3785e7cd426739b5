//! Resolution of application names with hickory-resolver: every A and AAAA
//! address of an FQDN, answers kept for their TTL (clamped), failures
//! (NXDOMAIN, SERVFAIL, timeouts) returned as values with the resolver's
//! reason.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use policy::Host;
use tokio::time::Instant;

/// Shortest time an answer (or a failure) is kept before the name is
/// resolved again, whatever its TTL: protects the DNS server from names with
/// TTL 0.
pub const MIN_TTL: Duration = Duration::from_secs(5);
/// Longest time an answer is kept, whatever its TTL, so that a changed
/// record is noticed within the hour.
pub const MAX_TTL: Duration = Duration::from_secs(3600);

/// The resolver could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ResolverError {
    /// The system DNS configuration could not be read.
    #[error("cannot use the system DNS configuration: {0}")]
    System(String),
    /// The resolver could not be built.
    #[error("cannot build the DNS resolver: {0}")]
    Build(String),
}

/// A failed resolution: the resolver's reason, e.g. "no record found for
/// name … type A, response code NXDomain" or "request timed out".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct DnsFailure {
    /// The resolver's reason.
    pub reason: String,
}

/// How long answers are kept.
#[derive(Clone, Copy, Debug)]
pub struct TtlBounds {
    /// Lower clamp for positive answers; also how long failures are kept.
    pub min: Duration,
    /// Upper clamp for positive answers.
    pub max: Duration,
}

impl Default for TtlBounds {
    fn default() -> Self {
        TtlBounds {
            min: MIN_TTL,
            max: MAX_TTL,
        }
    }
}

#[derive(Clone, Debug)]
struct Cached {
    answer: Result<Arc<[IpAddr]>, DnsFailure>,
    until: Instant,
}

/// Resolves application names. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Resolver {
    inner: Arc<TokioResolver>,
    cache: Arc<Mutex<HashMap<String, Cached>>>,
    ttl: TtlBounds,
}

impl Resolver {
    /// A resolver using the system configuration (/etc/resolv.conf and
    /// /etc/hosts), or only `server` when given.
    pub fn new(server: Option<SocketAddr>, ttl: TtlBounds) -> Result<Self, ResolverError> {
        let builder = match server {
            None => {
                TokioResolver::builder_tokio().map_err(|e| ResolverError::System(e.to_string()))?
            }
            Some(addr) => {
                let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
                for conn in &mut ns.connections {
                    conn.port = addr.port();
                }
                TokioResolver::builder_with_config(
                    ResolverConfig::from_name_servers(vec![ns]),
                    TokioRuntimeProvider::default(),
                )
            }
        };
        let mut builder = builder;
        let opts: &mut ResolverOpts = builder.options_mut();
        // This module keeps answers for their (clamped) TTL itself, so every
        // lookup it makes must reach the server.
        opts.cache_size = 0;
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.timeout = Duration::from_secs(2);
        opts.attempts = 2;
        if server.is_some() {
            opts.use_hosts_file = ResolveHosts::Never;
        }
        let inner = builder
            .build()
            .map_err(|e| ResolverError::Build(e.to_string()))?;
        Ok(Resolver {
            inner: Arc::new(inner),
            cache: Arc::default(),
            ttl,
        })
    }

    /// Every address of `name` (A and AAAA, deduplicated, in answer order),
    /// from the cache while its TTL lasts, else from the DNS.
    pub async fn resolve(&self, name: &str) -> Result<Arc<[IpAddr]>, DnsFailure> {
        // One cache entry per host however it is spelled; a text that is
        // no host name is answered without asking the DNS.
        let key = match Host::parse(name) {
            Ok(host) => host.into_string(),
            Err(e) => {
                return Err(DnsFailure {
                    reason: format!("{name:?} is not a host name: {e}"),
                });
            }
        };
        let now = Instant::now();
        if let Some(hit) = self.lock().get(&key)
            && now < hit.until
        {
            return hit.answer.clone();
        }
        let (answer, ttl) = self.lookup(&key).await;
        let until = Instant::now() + ttl;
        let mut cache = self.lock();
        // Bound memory: names nobody asks for any more go once expired.
        if cache.len() > 4096 {
            cache.retain(|_, c| now < c.until);
        }
        cache.insert(
            key,
            Cached {
                answer: answer.clone(),
                until,
            },
        );
        answer
    }

    /// Forgets every cached answer.
    pub fn clear(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        // A panic elsewhere while holding the lock leaves a usable map.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn lookup(&self, name: &str) -> (Result<Arc<[IpAddr]>, DnsFailure>, Duration) {
        // Names in segments are fully qualified: never apply search domains.
        let fqdn = format!("{name}.");
        match self.inner.lookup_ip(fqdn.as_str()).await {
            Ok(lookup) => {
                let ttl = lookup
                    .valid_until()
                    .saturating_duration_since(std::time::Instant::now())
                    .clamp(self.ttl.min, self.ttl.max);
                let mut addrs: Vec<IpAddr> = Vec::new();
                for ip in lookup.iter() {
                    if !addrs.contains(&ip) {
                        addrs.push(ip);
                    }
                }
                if addrs.is_empty() {
                    let reason = format!("no address records for {name}");
                    (Err(DnsFailure { reason }), self.ttl.min)
                } else {
                    tracing::debug!(name, addresses = ?addrs, ttl_s = ttl.as_secs(), "resolved");
                    (Ok(addrs.into()), ttl)
                }
            }
            Err(e) => {
                tracing::debug!(name, error = %e, "resolution failed");
                (
                    Err(DnsFailure {
                        reason: reason(name, &e),
                    }),
                    self.ttl.min,
                )
            }
        }
    }
}

/// The resolver's reason, in the words an operator searches for.
fn reason(name: &str, e: &NetError) -> String {
    match e {
        NetError::Dns(DnsError::NoRecordsFound(nr))
            if nr.response_code == ResponseCode::NXDomain =>
        {
            format!("NXDOMAIN: {name} does not exist")
        }
        NetError::Dns(DnsError::NoRecordsFound(nr)) => {
            format!("no A/AAAA records for {name} ({})", nr.response_code)
        }
        NetError::Dns(DnsError::ResponseCode(code)) if *code == ResponseCode::ServFail => {
            format!("SERVFAIL: the DNS server failed to resolve {name}")
        }
        NetError::Dns(DnsError::ResponseCode(code)) => {
            format!("DNS server answered {code} for {name}")
        }
        NetError::Timeout => format!("DNS request for {name} timed out"),
        other => format!("resolving {name}: {other}"),
    }
}
