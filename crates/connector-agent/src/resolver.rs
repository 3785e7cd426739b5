//! Resolution of application names with hickory-resolver: every A and AAAA
//! address of an FQDN (only A or only AAAA when the connector group's
//! `dns_resolution` says so, see [`Resolver::set_dns_resolution`]), answers
//! kept for their TTL (clamped), failures
//! (NXDOMAIN, SERVFAIL, timeouts) returned as values with the resolver's
//! reason.
//!
//! One lookup per name at a time: every caller asking for a name while it
//! is being looked up (every port and segment of that name) awaits that one
//! lookup (single flight). Lookups are spread out: positive answers are kept
//! for a random 80–100 % of their TTL, so names first resolved together are
//! not all refreshed at the same instant, and at most
//! [`MAX_CONCURRENT_LOOKUPS`] run at once (the start-up burst queues).
//! On a transient failure (timeout, SERVFAIL, refused, network error; not
//! NXDOMAIN or "no such record") the last positive answer keeps being served
//! for a grace period after it expired (serve-stale, RFC 8767), with the
//! failure alongside it so that the report shows the DNS error.
//!
//! A refresh of an expired answer that takes longer than
//! [`CLIENT_RESPONSE_TIMER`] (RFC 8767's client response timer) does not
//! hold its callers: they get the last known addresses, marked stale, at
//! once, while the refresh goes on in the background (still one per name),
//! so a DNS server that stopped answering never delays a check by the
//! resolver's whole timeout.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::RngExt as _;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::op::ResponseCode;
use policy::report::MAX_ADDRESSES_PER_ENTRY;
use policy::{DnsResolution, Host};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

/// Shortest time an answer (or a failure) is kept before the name is
/// resolved again, whatever its TTL: protects the DNS server from names with
/// TTL 0.
pub const MIN_TTL: Duration = Duration::from_secs(5);
/// Longest time an answer is kept, whatever its TTL, so that a changed
/// record is noticed within the hour.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// How long after its TTL the last positive answer is still used while the
/// DNS fails transiently (`--dns-stale-grace-s`). RFC 8767 suggests 1 to 3
/// days for a recursive resolver; a health check wants to notice a moved or
/// removed name much sooner.
pub const DEFAULT_STALE_GRACE: Duration = Duration::from_secs(300);
/// How long a caller waits for the refresh of an expired answer before it
/// is given the last known addresses (RFC 8767's client response timer,
/// 1.8 s); the refresh goes on behind.
pub const CLIENT_RESPONSE_TIMER: Duration = Duration::from_millis(1800);
/// Most lookups in flight at once: start-up, when every application is due
/// together, queues here instead of sending every query at once.
pub const MAX_CONCURRENT_LOOKUPS: usize = 32;
/// Positive answers are kept for a random `1 - TTL_JITTER` to 1 times their
/// (clamped) TTL, never below the minimum: names resolved together are
/// refreshed spread out.
const TTL_JITTER: f64 = 0.2;

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
    /// The failure says nothing about the name (timeout, SERVFAIL, network
    /// error), so the last known addresses may still be used; false for an
    /// authoritative answer (NXDOMAIN, no such record) or an invalid name.
    pub transient: bool,
}

/// A name's addresses, and why they are stale when they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// Every address (A and AAAA, deduplicated, in answer order).
    pub addresses: Arc<[IpAddr]>,
    /// Set when the DNS failed transiently and these are the last known
    /// addresses, served within the stale grace (RFC 8767).
    pub stale: Option<DnsFailure>,
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
    /// The last positive answer and when it expired: served within the
    /// stale grace while lookups fail transiently.
    last_good: Option<(Arc<[IpAddr]>, Instant)>,
}

impl Cached {
    /// What a caller gets from this entry at `now`.
    fn outcome(&self, now: Instant, grace: Duration) -> Result<Resolution, DnsFailure> {
        match &self.answer {
            Ok(addresses) => Ok(Resolution {
                addresses: addresses.clone(),
                stale: None,
            }),
            Err(failure) => match &self.last_good {
                Some((addresses, expired)) if failure.transient && now < *expired + grace => {
                    Ok(Resolution {
                        addresses: addresses.clone(),
                        stale: Some(failure.clone()),
                    })
                }
                _ => Err(failure.clone()),
            },
        }
    }

    /// What a caller gets at `now` from this expired entry while its
    /// refresh is slow: its addresses, if any may still be served, marked
    /// stale (with the entry's own transient failure, or `slow` when the
    /// entry was a positive answer).
    fn stale(
        &self,
        now: Instant,
        grace: Duration,
        slow: impl FnOnce() -> DnsFailure,
    ) -> Option<Resolution> {
        let (addresses, expired) = self.last_good.as_ref()?;
        if now >= *expired + grace {
            return None;
        }
        let failure = match &self.answer {
            Ok(_) => slow(),
            Err(failure) if failure.transient => failure.clone(),
            Err(_) => return None,
        };
        Some(Resolution {
            addresses: addresses.clone(),
            stale: Some(failure),
        })
    }

    /// Whether the entry is still of use at `now` (for trimming the cache).
    fn live(&self, now: Instant, grace: Duration) -> bool {
        now < self.until
            || self
                .last_good
                .as_ref()
                .is_some_and(|(_, expired)| now < *expired + grace)
    }
}

/// Where a lookup in flight publishes its outcome.
type Flight = watch::Receiver<Option<Result<Resolution, DnsFailure>>>;

#[derive(Debug, Default)]
struct State {
    /// Answers by (records asked for, name): a change of
    /// `dns_resolution` never serves an answer of the other family.
    cache: HashMap<(DnsResolution, String), Cached>,
    /// Lookups in flight, by the same key: later callers wait for these.
    flights: HashMap<(DnsResolution, String), Flight>,
    /// Which records lookups ask for now.
    mode: DnsResolution,
}

/// One hickory resolver per `DnsResolution`, sharing the configuration:
/// hickory fixes the records it asks for (`LookupIpStrategy`) when it is
/// built, and the CA may change the group's choice at any time.
#[derive(Debug)]
struct Inners {
    ipv4: TokioResolver,
    ipv6: TokioResolver,
    dual: TokioResolver,
}

impl Inners {
    fn get(&self, mode: DnsResolution) -> &TokioResolver {
        match mode {
            DnsResolution::Ipv4 => &self.ipv4,
            DnsResolution::Ipv6 => &self.ipv6,
            DnsResolution::Dual => &self.dual,
        }
    }
}

/// Resolves application names. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Resolver {
    inner: Arc<Inners>,
    state: Arc<Mutex<State>>,
    lookups: Arc<Semaphore>,
    ttl: TtlBounds,
    stale_grace: Duration,
    /// The `--dns-server`, when given.
    server: Option<SocketAddr>,
}

impl Resolver {
    /// A resolver using the system configuration (/etc/resolv.conf and
    /// /etc/hosts), or only `server` when given.
    pub fn new(server: Option<SocketAddr>, ttl: TtlBounds) -> Result<Self, ResolverError> {
        let build = |strategy| Self::build(server, strategy);
        Ok(Resolver {
            inner: Arc::new(Inners {
                ipv4: build(LookupIpStrategy::Ipv4Only)?,
                ipv6: build(LookupIpStrategy::Ipv6Only)?,
                dual: build(LookupIpStrategy::Ipv4AndIpv6)?,
            }),
            state: Arc::default(),
            lookups: Arc::new(Semaphore::new(MAX_CONCURRENT_LOOKUPS)),
            ttl,
            stale_grace: DEFAULT_STALE_GRACE,
            server,
        })
    }

    /// The DNS servers lookups go to, as `IP` or `IP:PORT` (port 53 left
    /// out): the `--dns-server`, else the system's as the resolver read
    /// them (/etc/resolv.conf on Unix; read again on each call). Empty
    /// (with a debug log) when the system's cannot be read.
    pub fn servers(&self) -> Vec<String> {
        let show = |addr: SocketAddr| match addr.port() {
            53 => addr.ip().to_string(),
            _ => addr.to_string(),
        };
        if let Some(addr) = self.server {
            return vec![show(addr)];
        }
        match hickory_resolver::system_conf::read_system_conf() {
            Ok((config, _)) => {
                let mut out: Vec<String> = Vec::new();
                for ns in config.name_servers() {
                    let port = ns.connections.first().map_or(53, |c| c.port);
                    let shown = show(SocketAddr::new(ns.ip, port));
                    if !out.contains(&shown) {
                        out.push(shown);
                    }
                }
                out
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the system's DNS servers");
                Vec::new()
            }
        }
    }

    /// Which records lookups ask for from now on: only A (`Ipv4`), only
    /// AAAA (`Ipv6`) or both (`Dual`, the default). Answers cached under
    /// another choice are not used.
    pub fn set_dns_resolution(&self, mode: DnsResolution) {
        let mut state = self.lock();
        if state.mode != mode {
            tracing::info!(dns_resolution = %mode, "DNS resolution changed");
            state.mode = mode;
            state.cache.clear();
        }
    }

    /// The records lookups ask for now.
    pub fn dns_resolution(&self) -> DnsResolution {
        self.lock().mode
    }

    fn build(
        server: Option<SocketAddr>,
        strategy: LookupIpStrategy,
    ) -> Result<TokioResolver, ResolverError> {
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
        opts.ip_strategy = strategy;
        opts.timeout = Duration::from_secs(2);
        opts.attempts = 2;
        if server.is_some() {
            opts.use_hosts_file = ResolveHosts::Never;
        }
        builder
            .build()
            .map_err(|e| ResolverError::Build(e.to_string()))
    }

    /// Uses the last positive answer for up to `grace` after it expired
    /// while the DNS fails transiently (default [`DEFAULT_STALE_GRACE`];
    /// zero turns serve-stale off).
    pub fn with_stale_grace(mut self, grace: Duration) -> Self {
        self.stale_grace = grace;
        self
    }

    /// Every address of `name` (A and AAAA, deduplicated, in answer order),
    /// from the cache while its TTL lasts, else from the DNS; the last known
    /// addresses within the stale grace when the DNS fails transiently (see
    /// [`Resolver::resolution`] to tell).
    pub async fn resolve(&self, name: &str) -> Result<Arc<[IpAddr]>, DnsFailure> {
        self.resolution(name).await.map(|r| r.addresses)
    }

    /// Like [`Resolver::resolve`], and says when the addresses are stale
    /// (and why). Concurrent callers for one name share one lookup.
    pub async fn resolution(&self, name: &str) -> Result<Resolution, DnsFailure> {
        // One cache entry per host however it is spelled; a text that is
        // no host name is answered without asking the DNS.
        let host = match Host::parse(name) {
            Ok(host) => host.into_string(),
            Err(e) => {
                return Err(DnsFailure {
                    reason: format!("{name:?} is not a host name: {e}"),
                    transient: false,
                });
            }
        };
        loop {
            let (mut flight, fallback) = {
                let mut state = self.lock();
                let key = (state.mode, host.clone());
                let now = Instant::now();
                let mut fallback = None;
                if let Some(hit) = state.cache.get(&key) {
                    if now < hit.until {
                        return hit.outcome(now, self.stale_grace);
                    }
                    fallback = hit.stale(now, self.stale_grace, || slow(&host));
                }
                let flight = match state.flights.get(&key) {
                    Some(flight) => flight.clone(),
                    None => {
                        let (tx, rx) = watch::channel(None);
                        state.flights.insert(key.clone(), rx.clone());
                        // A task of its own: a caller that gives up (or is
                        // given the stale answer) does not cancel the
                        // lookup the others wait for.
                        tokio::spawn(self.clone().refresh(key.clone(), tx));
                        rx
                    }
                };
                (flight, fallback)
            };
            let published = match fallback {
                None => published(&mut flight).await,
                Some(stale) => {
                    match tokio::time::timeout(CLIENT_RESPONSE_TIMER, published(&mut flight)).await
                    {
                        Ok(published) => published,
                        Err(_) => {
                            tracing::debug!(name = %host, "DNS refresh slower than the client response timer; using the last known addresses");
                            return Ok(stale);
                        }
                    }
                }
            };
            match published {
                Some(outcome) => return outcome,
                // The lookup task died (the runtime is stopping): forget
                // it, and look again.
                None => {
                    let mut state = self.lock();
                    state.flights.retain(|_, f| !f.same_channel(&flight));
                }
            }
        }
    }

    /// Looks `key` up, stores the answer and publishes it to the callers
    /// waiting for it.
    async fn refresh(
        self,
        key: (DnsResolution, String),
        tx: watch::Sender<Option<Result<Resolution, DnsFailure>>>,
    ) {
        let (answer, ttl) = {
            // The semaphore is never closed; without a permit, go anyway.
            let _permit = self.lookups.acquire().await.ok();
            self.lookup(key.0, &key.1).await
        };
        let now = Instant::now();
        let outcome = {
            let mut state = self.lock();
            let last_good = match &answer {
                Ok(addresses) => Some((addresses.clone(), now + ttl)),
                Err(failure) if failure.transient => {
                    state.cache.get(&key).and_then(|c| c.last_good.clone())
                }
                // The name is gone: nothing stale to serve.
                Err(_) => None,
            };
            let entry = Cached {
                answer,
                until: now + ttl,
                last_good,
            };
            let outcome = entry.outcome(now, self.stale_grace);
            // Bound memory: names nobody asks for any more go once expired
            // (and past their stale grace).
            if state.cache.len() > 4096 {
                let grace = self.stale_grace;
                state.cache.retain(|_, c| c.live(now, grace));
            }
            state.cache.insert(key.clone(), entry);
            state.flights.remove(&key);
            outcome
        };
        let _ = tx.send(Some(outcome));
    }

    /// Forgets every cached answer.
    pub fn clear(&self) {
        self.lock().cache.clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves a usable map.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn lookup(
        &self,
        mode: DnsResolution,
        name: &str,
    ) -> (Result<Arc<[IpAddr]>, DnsFailure>, Duration) {
        // Names in segments are fully qualified: never apply search domains.
        let fqdn = format!("{name}.");
        match self.inner.get(mode).lookup_ip(fqdn.as_str()).await {
            Ok(lookup) => {
                let ttl = lookup
                    .valid_until()
                    .saturating_duration_since(std::time::Instant::now())
                    .clamp(self.ttl.min, self.ttl.max);
                let mut addrs: Vec<IpAddr> = Vec::new();
                let mut seen = std::collections::HashSet::new();
                for ip in lookup.iter() {
                    if seen.insert(ip) {
                        addrs.push(ip);
                    }
                }
                if addrs.len() > MAX_ADDRESSES_PER_ENTRY {
                    tracing::warn!(
                        name,
                        addresses = addrs.len(),
                        checked = MAX_ADDRESSES_PER_ENTRY,
                        "the name resolves to more addresses than one report entry may carry; checking the first ones"
                    );
                    addrs.truncate(MAX_ADDRESSES_PER_ENTRY);
                }
                if addrs.is_empty() {
                    let reason = format!("no {} records for {name}", records(mode));
                    let failure = DnsFailure {
                        reason,
                        transient: false,
                    };
                    (Err(failure), self.ttl.min)
                } else {
                    tracing::debug!(name, addresses = ?addrs, ttl_s = ttl.as_secs(), "resolved");
                    (Ok(addrs.into()), self.jittered(ttl))
                }
            }
            Err(e) => {
                tracing::debug!(name, error = %e, "resolution failed");
                (
                    Err(DnsFailure {
                        reason: reason(mode, name, &e),
                        transient: transient(&e),
                    }),
                    self.ttl.min,
                )
            }
        }
    }

    /// `ttl` shortened by up to `TTL_JITTER` at random, not below the
    /// minimum.
    fn jittered(&self, ttl: Duration) -> Duration {
        let cut = rand::rng().random_range(0.0..TTL_JITTER);
        ttl.mul_f64(1.0 - cut).max(self.ttl.min.min(ttl))
    }
}

/// The outcome a lookup in flight publishes; `None` when its task died.
async fn published(flight: &mut Flight) -> Option<Result<Resolution, DnsFailure>> {
    flight
        .wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|outcome| outcome.clone())
}

/// The stale reason of a positive answer whose refresh is slow.
fn slow(name: &str) -> DnsFailure {
    DnsFailure {
        reason: format!(
            "DNS request for {name} unanswered after {} ms (refreshing in the background)",
            CLIENT_RESPONSE_TIMER.as_millis()
        ),
        transient: true,
    }
}

/// Whether a failure leaves the name's last answer credible: everything but
/// an authoritative "does not exist" / "no such record".
fn transient(e: &NetError) -> bool {
    match e {
        NetError::Dns(DnsError::NoRecordsFound(nr)) => !matches!(
            nr.response_code,
            ResponseCode::NXDomain | ResponseCode::NoError
        ),
        NetError::Dns(DnsError::ResponseCode(code)) => *code != ResponseCode::NXDomain,
        _ => true,
    }
}

/// The records a lookup under `mode` asks for, as an operator names them.
fn records(mode: DnsResolution) -> &'static str {
    match mode {
        DnsResolution::Ipv4 => "A",
        DnsResolution::Ipv6 => "AAAA",
        DnsResolution::Dual => "A/AAAA",
    }
}

/// The resolver's reason, in the words an operator searches for.
fn reason(mode: DnsResolution, name: &str, e: &NetError) -> String {
    match e {
        NetError::Dns(DnsError::NoRecordsFound(nr))
            if nr.response_code == ResponseCode::NXDomain =>
        {
            format!("NXDOMAIN: {name} does not exist")
        }
        NetError::Dns(DnsError::NoRecordsFound(nr)) => {
            format!(
                "no {} records for {name} ({})",
                records(mode),
                nr.response_code
            )
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A DNS server that never answers: a UDP socket nobody reads and a TCP
    /// listener nobody accepts from, on one loopback port.
    fn silent_server() -> (std::net::UdpSocket, std::net::TcpListener, SocketAddr) {
        for _ in 0..20 {
            let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind UDP on loopback");
            let addr = udp.local_addr().expect("local address");
            if let Ok(tcp) = std::net::TcpListener::bind(addr) {
                return (udp, tcp, addr);
            }
        }
        panic!("no loopback port free for both UDP and TCP");
    }

    /// The injected clock (tokio's, paused): a refresh of an expired answer
    /// against a server that stopped answering holds its callers for the
    /// client response timer only, one refresh runs for all of them, and
    /// its failure is then served at once alongside the last addresses.
    #[tokio::test(start_paused = true)]
    async fn a_slow_refresh_serves_the_last_addresses_after_the_client_response_timer() {
        let (_udp, _tcp, addr) = silent_server();
        let resolver = Resolver::new(Some(addr), TtlBounds::default()).expect("resolver");
        let known: Arc<[IpAddr]> = Arc::from(vec![IpAddr::from([10, 0, 0, 1])]);
        let key = (resolver.dns_resolution(), "app.test".to_owned());
        let now = Instant::now();
        resolver.lock().cache.insert(
            key.clone(),
            Cached {
                answer: Ok(known.clone()),
                until: now,
                last_good: Some((known.clone(), now)),
            },
        );
        let start = Instant::now();
        let (a, b) = tokio::join!(
            resolver.resolution("app.test"),
            resolver.resolution("app.test")
        );
        let waited = start.elapsed();
        assert!(
            waited >= CLIENT_RESPONSE_TIMER && waited < Duration::from_secs(2),
            "waited {waited:?}"
        );
        for r in [a, b] {
            let r = r.expect("the last known addresses");
            assert_eq!(r.addresses, known);
            let stale = r.stale.expect("marked stale");
            assert!(
                stale.transient && stale.reason.contains("unanswered"),
                "{stale:?}"
            );
        }
        assert_eq!(resolver.lock().flights.len(), 1, "one refresh in flight");
        // The refresh goes on behind and fails; its failure is then served
        // without waiting, with the last addresses.
        let behind = Instant::now();
        while !resolver.lock().flights.is_empty() {
            assert!(
                behind.elapsed() < Duration::from_secs(30),
                "the refresh never ended"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let start = Instant::now();
        let r = resolver.resolution("app.test").await.expect("stale answer");
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(r.addresses, known);
        let stale = r.stale.expect("marked stale");
        assert!(
            stale.transient && !stale.reason.contains("unanswered"),
            "{stale:?}"
        );
        // Once that failure expires, the next refresh holds callers for the
        // timer only again, now with the server's failure as the reason.
        tokio::time::sleep(MIN_TTL).await;
        let start = Instant::now();
        let r = resolver.resolution("app.test").await.expect("stale answer");
        assert!(start.elapsed() < Duration::from_secs(2));
        assert_eq!(r.addresses, known);
    }

    /// Without last known addresses there is nothing to serve early: the
    /// caller waits for the lookup's own outcome.
    #[tokio::test(start_paused = true)]
    async fn a_first_lookup_waits_for_its_outcome() {
        let (_udp, _tcp, addr) = silent_server();
        let resolver = Resolver::new(Some(addr), TtlBounds::default()).expect("resolver");
        let start = Instant::now();
        let failure = resolver
            .resolution("app.test")
            .await
            .expect_err("no answer");
        assert!(start.elapsed() > CLIENT_RESPONSE_TIMER);
        assert!(failure.transient, "{failure:?}");
    }
}
