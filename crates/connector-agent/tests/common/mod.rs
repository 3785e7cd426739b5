//! Test fixtures on loopback: an authoritative DNS server (hickory-server)
//! and a small test CA (the generated `ConnectorSession` server on tonic).
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::rr::rdata::{A, AAAA, SOA};
use hickory_proto::rr::{LowerName, Name, RData, Record};
use hickory_server::Server;
use hickory_server::net::runtime::TokioRuntimeProvider;
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneType};
use protocol::v1::authority_message::Kind as FromCa;
use protocol::v1::connector_message::Kind as ToCa;
use protocol::v1::connector_session_server::{ConnectorSession, ConnectorSessionServer};
use protocol::v1::{self, AuthorityMessage, ConnectorMessage};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// An authoritative server for one zone on 127.0.0.1:<random UDP port>.
pub struct Dns {
    pub addr: SocketAddr,
    server: Server<Catalog>,
    zone: Arc<InMemoryZoneHandler<TokioRuntimeProvider>>,
    origin: String,
    ttl: u32,
}

impl Dns {
    /// Serves `zone` with `records` (name relative to the zone, address),
    /// every record with `ttl`.
    pub async fn start(zone: &str, records: &[(&str, IpAddr)], ttl: u32) -> Dns {
        let origin = Name::from_str(&format!("{zone}.")).expect("zone name");
        let mut handler = InMemoryZoneHandler::<TokioRuntimeProvider>::empty(
            origin.clone(),
            ZoneType::Primary,
            AxfrPolicy::Deny,
        );
        let soa = SOA::new(
            Name::from_str(&format!("ns.{zone}.")).expect("ns"),
            Name::from_str(&format!("admin.{zone}.")).expect("admin"),
            1,
            3600,
            600,
            86400,
            ttl,
        );
        handler.upsert_mut(Record::from_rdata(origin.clone(), ttl, RData::SOA(soa)), 1);
        for (name, ip) in records {
            let name = Name::from_str(&format!("{name}.{zone}.")).expect("name");
            let rdata = match ip {
                IpAddr::V4(v4) => RData::A(A(*v4)),
                IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
            };
            handler.upsert_mut(Record::from_rdata(name, ttl, rdata), 1);
        }
        let zone_handler = Arc::new(handler);
        let mut catalog = Catalog::new();
        catalog.upsert(LowerName::new(&origin), vec![zone_handler.clone()]);
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("bind DNS");
        let addr = socket.local_addr().expect("addr");
        let mut server = Server::new(catalog);
        server.register_socket(socket);
        Dns {
            addr,
            server,
            zone: zone_handler,
            origin: zone.to_owned(),
            ttl,
        }
    }

    /// Adds an address record while the server runs.
    pub async fn add(&self, name: &str, ip: IpAddr) {
        let name = Name::from_str(&format!("{name}.{}.", self.origin)).expect("name");
        let rdata = match ip {
            IpAddr::V4(v4) => RData::A(A(v4)),
            IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
        };
        self.zone
            .upsert(Record::from_rdata(name, self.ttl, rdata), 2)
            .await;
    }

    pub async fn stop(mut self) {
        let _ = self.server.shutdown_gracefully().await;
    }
}

/// The sender of the current session's messages to the connector.
type Current = Arc<Mutex<Option<mpsc::Sender<Result<AuthorityMessage, Status>>>>>;

/// What the test CA saw.
#[derive(Debug)]
pub enum Seen {
    /// A connector opened a session: (name, group, key) from the metadata.
    Connected(String, String, String),
    /// A message from the connector.
    Message(ToCa),
    /// The connector's stream ended.
    Ended,
}

/// The assignment the test CA hands out.
#[derive(Clone, Debug, Default)]
pub struct Assignment {
    pub segments: Vec<v1::Segment>,
    pub settings: v1::ConnectorSettings,
}

#[derive(Clone)]
struct Service {
    seen: mpsc::UnboundedSender<Seen>,
    assignment: Arc<Mutex<Assignment>>,
    current: Current,
    key: String,
}

#[tonic::async_trait]
impl ConnectorSession for Service {
    type ConnectStream = ReceiverStream<Result<AuthorityMessage, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<ConnectorMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let md = request.metadata();
        let get = |k: &str| {
            md.get(k)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let (name, group, key) = (
            get(protocol::metadata::CONNECTOR),
            get(protocol::metadata::GROUP),
            get(protocol::metadata::PROVISIONING_KEY),
        );
        if key != self.key {
            return Err(Status::unauthenticated("wrong provisioning key"));
        }
        let _ = self.seen.send(Seen::Connected(name, group, key));
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(64);
        *self.current.lock().expect("lock") = Some(tx.clone());
        let seen = self.seen.clone();
        let assignment = self.assignment.lock().expect("lock").clone();
        tokio::spawn(async move {
            let mut welcomed = false;
            while let Ok(Some(msg)) = inbound.message().await {
                let Some(kind) = msg.kind else { continue };
                let hello = matches!(kind, ToCa::Hello(_));
                let _ = seen.send(Seen::Message(kind));
                if hello && !welcomed {
                    welcomed = true;
                    let welcome = AuthorityMessage {
                        kind: Some(FromCa::Welcome(v1::Welcome {
                            session_id: "s1".into(),
                            segments: assignment.segments.clone(),
                            settings: Some(assignment.settings),
                        })),
                    };
                    if tx.send(Ok(welcome)).await.is_err() {
                        break;
                    }
                }
            }
            let _ = seen.send(Seen::Ended);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// A test CA on 127.0.0.1.
pub struct Authority {
    pub addr: SocketAddr,
    pub seen: mpsc::UnboundedReceiver<Seen>,
    current: Current,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Authority {
    pub async fn start(assignment: Assignment) -> Authority {
        Self::start_on("127.0.0.1:0".parse().expect("addr"), assignment).await
    }

    pub async fn start_on(addr: SocketAddr, assignment: Assignment) -> Authority {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind CA");
        let addr = listener.local_addr().expect("addr");
        let (seen_tx, seen) = mpsc::unbounded_channel();
        let current = Arc::new(Mutex::new(None));
        let service = Service {
            seen: seen_tx,
            assignment: Arc::new(Mutex::new(assignment)),
            current: current.clone(),
            key: "secret".into(),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(ConnectorSessionServer::new(service))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await;
        });
        Authority {
            addr,
            seen,
            current,
            stop: Some(stop),
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sends a message on the current session.
    pub async fn send(&self, kind: FromCa) {
        let tx = self
            .current
            .lock()
            .expect("lock")
            .clone()
            .expect("a session");
        tx.send(Ok(AuthorityMessage { kind: Some(kind) }))
            .await
            .expect("session open");
    }

    /// The next thing seen, within `within`.
    pub async fn next(&mut self, within: Duration) -> Seen {
        tokio::time::timeout(within, self.seen.recv())
            .await
            .expect("the CA saw nothing in time")
            .expect("CA gone")
    }

    /// The next health report, skipping everything else.
    pub async fn next_report(&mut self, within: Duration) -> v1::HealthReport {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if let Seen::Message(ToCa::Report(r)) = self.next(left).await {
                return r;
            }
        }
    }

    /// Goes away: ends the session with an error and stops serving.
    pub async fn stop(mut self) {
        if let Some(tx) = self.current.lock().expect("lock").take() {
            let _ = tx.try_send(Err(Status::unavailable("CA going away")));
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(3), &mut self.task).await;
        self.task.abort();
    }
}

pub fn range(port: u16) -> v1::PortRange {
    v1::PortRange {
        start: u32::from(port),
        end: u32::from(port),
    }
}

pub fn segment(
    name: &str,
    apps: &[&str],
    tcp: &[u16],
    udp: &[u16],
    mode: v1::HealthReporting,
    interval_ms: u32,
) -> v1::Segment {
    v1::Segment {
        name: name.into(),
        applications: apps.iter().map(|s| s.to_string()).collect(),
        tcp_ports: tcp.iter().copied().map(range).collect(),
        udp_ports: udp.iter().copied().map(range).collect(),
        health_reporting: mode as i32,
        report_interval_s: 1,
        report_interval_ms: interval_ms,
        connector_groups: vec!["dc-east".into()],
        ..Default::default()
    }
}

pub fn agent_config(ca: &str, dns: Option<SocketAddr>) -> connector_agent::Config {
    let mut c = connector_agent::Config::new(ca, "c1", "dc-east");
    c.provisioning_key = Some("secret".into());
    c.dns_server = dns;
    c.checks_per_second = 200;
    c.check_timeout_ms = 500;
    c
}

/// Starts the agent; dropping or sending on the returned sender stops it.
pub fn start_agent(
    config: connector_agent::Config,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let shutdown = async {
            let _ = rx.await;
        };
        if let Err(e) = connector_agent::run(config, shutdown).await {
            panic!("agent failed: {e}");
        }
    });
    (tx, task)
}

/// TCP listeners on one port of every address in `ips`, accepting (and
/// dropping) every connection and recording when each was accepted.
pub async fn listeners(ips: &[String]) -> (u16, Arc<Mutex<Vec<std::time::Instant>>>) {
    'attempt: for _ in 0..20 {
        let mut bound = Vec::new();
        let mut port = 0;
        for ip in ips {
            let ip: IpAddr = ip.parse().expect("ip");
            match tokio::net::TcpListener::bind((ip, port)).await {
                Ok(l) => {
                    port = l.local_addr().expect("addr").port();
                    bound.push(l);
                }
                Err(_) => continue 'attempt,
            }
        }
        let accepted = Arc::new(Mutex::new(Vec::new()));
        for l in bound {
            let acc = accepted.clone();
            tokio::spawn(async move {
                while let Ok((s, _)) = l.accept().await {
                    acc.lock().expect("lock").push(std::time::Instant::now());
                    drop(s);
                }
            });
        }
        return (port, accepted);
    }
    panic!("no common free port on {ips:?}");
}

/// A port on `ip` with nothing listening (bound, then closed).
pub fn closed_port(ip: &str) -> u16 {
    let l = std::net::TcpListener::bind((ip.parse::<IpAddr>().expect("ip"), 0)).expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    port
}

/// A plain HTTP/1.1 GET; returns the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out
}
