//! A real authoritative DNS server (hickory-server) on a loopback address,
//! serving one in-memory zone for the scenarios.

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

/// TTL of every answer: short, so re-resolution is exercised.
pub const TTL: u32 = 5;

/// A running DNS server; stops when dropped.
#[derive(Debug)]
pub struct DnsServer {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl DnsServer {
    /// Serves `zone` (e.g. `"reach.test"`) on UDP `addr` with A/AAAA
    /// `records` (`(fqdn, address)`; names outside the zone are ignored by
    /// resolvers, and unknown names answer NXDOMAIN).
    pub async fn start(addr: SocketAddr, zone: &str, records: &[(&str, IpAddr)]) -> Result<Self> {
        let origin = Name::from_str(&format!("{}.", zone.trim_end_matches('.')))
            .with_context(|| format!("zone name {zone:?}"))?;
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
            TTL,
        );
        handler.upsert_mut(Record::from_rdata(origin.clone(), TTL, RData::SOA(soa)), 1);
        for (name, ip) in records {
            let name = Name::from_str(&format!("{}.", name.trim_end_matches('.')))
                .with_context(|| format!("record name {name:?}"))?;
            let rdata = match ip {
                IpAddr::V4(v4) => RData::A(A(*v4)),
                IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
            };
            handler.upsert_mut(Record::from_rdata(name, TTL, rdata), 1);
        }
        let mut catalog = Catalog::new();
        catalog.upsert(LowerName::new(&origin), vec![Arc::new(handler)]);
        let socket = tokio::net::UdpSocket::bind(addr)
            .await
            .with_context(|| format!("binding DNS server to {addr}"))?;
        let addr = socket.local_addr()?;
        let mut server = Server::new(catalog);
        server.register_socket(socket);
        let task = tokio::spawn(async move {
            let _ = server.block_until_done().await;
        });
        Ok(DnsServer { addr, task })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
