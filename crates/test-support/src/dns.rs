//! A real authoritative DNS server (hickory-server) on a loopback address,
//! serving one in-memory zone that a test can add records to while it runs.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use anyhow::{Context, Result};
use hickory_server::Server;
use hickory_server::net::runtime::TokioRuntimeProvider;
use hickory_server::proto::rr::rdata::{A, AAAA, SOA};
use hickory_server::proto::rr::{LowerName, Name, RData, Record};
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneType};

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
        let socket = tokio::net::UdpSocket::bind(addr)
            .await
            .with_context(|| format!("binding DNS server to {addr}"))?;
        let addr = socket.local_addr()?;
        let mut server = Server::new(catalog);
        server.register_socket(socket);
        let task = tokio::spawn(async move {
            let _ = server.block_until_done().await;
        });
        Ok(DnsServer {
            addr,
            zone,
            ttl,
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
