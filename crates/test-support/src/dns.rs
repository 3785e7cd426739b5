//! A real authoritative DNS server (hickory-server) on a loopback address,
//! serving one in-memory zone that a test can add records to while it runs.
//! It counts the queries it receives and can be switched to answer every
//! query with SERVFAIL or NXDOMAIN, so tests see what a resolver asks and
//! how it copes with a failing server.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use anyhow::{Context, Result};
use hickory_server::Server;
use hickory_server::net::runtime::{Time, TokioRuntimeProvider};
use hickory_server::proto::op::{Header, HeaderCounts, MessageType, ResponseCode};
use hickory_server::proto::rr::rdata::{A, AAAA, SOA};
use hickory_server::proto::rr::{LowerName, Name, RData, Record, RrKey};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, MessageResponseBuilder, ZoneType};

/// How the server answers; switch with [`DnsServer::set_mode`] while it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// From the zone (the default).
    Answer = 0,
    /// SERVFAIL to every query: a transient failure of the server.
    ServFail = 1,
    /// NXDOMAIN to every query: the name does not exist (authoritative).
    NxDomain = 2,
}

/// The zone, behind a query counter and a failure switch.
struct Handler {
    catalog: Catalog,
    queries: Arc<AtomicU64>,
    mode: Arc<AtomicU8>,
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response_handle: R,
    ) -> ResponseInfo {
        self.queries.fetch_add(1, Ordering::Relaxed);
        let code = match self.mode.load(Ordering::Relaxed) {
            1 => ResponseCode::ServFail,
            2 => ResponseCode::NXDomain,
            _ => {
                return self
                    .catalog
                    .handle_request::<R, T>(request, response_handle)
                    .await;
            }
        };
        let response =
            MessageResponseBuilder::new(&request.queries, None).error_msg(&request.metadata, code);
        match response_handle.send_response(response).await {
            Ok(info) => info,
            // Nothing reached the client: report what was meant.
            Err(_) => {
                let mut metadata = request.metadata;
                metadata.message_type = MessageType::Response;
                metadata.response_code = code;
                ResponseInfo::from(Header {
                    metadata,
                    counts: HeaderCounts::default(),
                })
            }
        }
    }
}

/// TTL of every answer unless a test picks another: short, so re-resolution
/// is exercised.
pub const TTL: u32 = 5;

/// The zone a running server answers from.
type Zone = Arc<InMemoryZoneHandler<TokioRuntimeProvider>>;

/// A running DNS server; stops when dropped.
pub struct DnsServer {
    addr: SocketAddr,
    zone: Zone,
    ttl: u32,
    queries: Arc<AtomicU64>,
    mode: Arc<AtomicU8>,
    task: tokio::task::JoinHandle<()>,
}

impl DnsServer {
    /// Serves `zone` (e.g. `"reach.test"`) on UDP `addr` with A/AAAA
    /// `records` (`(fqdn, address)`; names outside the zone are ignored by
    /// resolvers, and unknown names answer NXDOMAIN), every answer with
    /// [`TTL`].
    pub async fn start(addr: SocketAddr, zone: &str, records: &[(&str, IpAddr)]) -> Result<Self> {
        Self::start_with_ttl(addr, zone, records, TTL).await
    }

    /// Like [`DnsServer::start`], every answer (and the SOA's negative TTL)
    /// with `ttl`.
    pub async fn start_with_ttl(
        addr: SocketAddr,
        zone: &str,
        records: &[(&str, IpAddr)],
        ttl: u32,
    ) -> Result<Self> {
        let origin = fqdn(zone).with_context(|| format!("zone name {zone:?}"))?;
        let mut handler = InMemoryZoneHandler::<TokioRuntimeProvider>::empty(
            origin.clone(),
            ZoneType::Primary,
            AxfrPolicy::Deny,
        );
        let soa = SOA::new(
            Name::from_str(&format!("ns.{origin}"))?,
            Name::from_str(&format!("hostmaster.{origin}"))?,
            1,
            3600,
            600,
            86400,
            ttl,
        );
        handler.upsert_mut(Record::from_rdata(origin.clone(), ttl, RData::SOA(soa)), 1);
        for (name, ip) in records {
            handler.upsert_mut(record(name, *ip, ttl)?, 1);
        }
        let zone: Zone = Arc::new(handler);
        let mut catalog = Catalog::new();
        catalog.upsert(LowerName::new(&origin), vec![zone.clone()]);
        let (socket, tcp) = bind_pair(addr).await?;
        let addr = socket.local_addr()?;
        let queries = Arc::new(AtomicU64::new(0));
        let mode = Arc::new(AtomicU8::new(Mode::Answer as u8));
        let mut server = Server::new(Handler {
            catalog,
            queries: queries.clone(),
            mode: mode.clone(),
        });
        server.register_socket(socket);
        server.register_listener(tcp, std::time::Duration::from_secs(5), 65_535);
        let task = tokio::spawn(async move {
            let _ = server.block_until_done().await;
        });
        Ok(DnsServer {
            addr,
            zone,
            ttl,
            queries,
            mode,
            task,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Adds an address record for `name` (a fully qualified name) while the
    /// server runs.
    pub async fn add(&self, name: &str, ip: IpAddr) -> Result<()> {
        self.zone.upsert(record(name, ip, self.ttl)?, 2).await;
        Ok(())
    }

    /// Removes the address record `ip` of `name` while the server runs (the
    /// name's other addresses stay; with none left it answers with no
    /// records).
    pub async fn remove(&self, name: &str, ip: IpAddr) -> Result<()> {
        let record = record(name, ip, self.ttl)?;
        let key = RrKey::new(LowerName::new(&record.name), record.record_type());
        let mut records = self.zone.records_mut().await;
        if let Some(set) = records.get_mut(&key) {
            let mut updated = (**set).clone();
            updated.remove(&record, 3);
            if updated.is_empty() {
                records.remove(&key);
            } else {
                *set = Arc::new(updated);
            }
        }
        Ok(())
    }

    /// Queries received so far (every question: an A and an AAAA lookup of
    /// one name are two).
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }

    /// Changes how the server answers from now on.
    pub fn set_mode(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::Relaxed);
    }

    /// Stops serving and waits until the socket is closed.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl std::fmt::Debug for DnsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsServer")
            .field("addr", &self.addr)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `name` as an absolute DNS name (a trailing dot is optional).
fn fqdn(name: &str) -> Result<Name> {
    Ok(Name::from_str(&format!("{}.", name.trim_end_matches('.')))?)
}

/// An A or AAAA record, by the address's family.
fn record(name: &str, ip: IpAddr, ttl: u32) -> Result<Record> {
    let name = fqdn(name).with_context(|| format!("record name {name:?}"))?;
    let rdata = match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    };
    Ok(Record::from_rdata(name, ttl, rdata))
}

/// A UDP socket and a TCP listener on the same port: answers too large for
/// UDP are truncated there, and resolvers ask again over TCP. With port 0
/// the kernel picks a free UDP port, which another process may hold for TCP;
/// then a fresh pair is tried (up to 20 times) instead of failing the test.
async fn bind_pair(addr: SocketAddr) -> Result<(tokio::net::UdpSocket, tokio::net::TcpListener)> {
    let mut tries = 0;
    loop {
        tries += 1;
        let socket = tokio::net::UdpSocket::bind(addr)
            .await
            .with_context(|| format!("binding DNS server to {addr}"))?;
        let bound = socket.local_addr()?;
        match tokio::net::TcpListener::bind(bound).await {
            Ok(tcp) => return Ok((socket, tcp)),
            Err(e)
                if addr.port() == 0 && e.kind() == std::io::ErrorKind::AddrInUse && tries < 20 =>
            {
                continue;
            }
            Err(e) => {
                return Err(e).with_context(|| format!("binding DNS server (TCP) to {bound}"));
            }
        }
    }
}
