//! Test fixtures on loopback: a small test CA (the generated
//! `ConnectorSession` server on tonic) and an agent to run against it. The
//! DNS server, applications and segment builder are `test_support`'s.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::v1::authority_message::Kind as FromCa;
use protocol::v1::connector_message::Kind as ToCa;
use protocol::v1::connector_session_server::{ConnectorSession, ConnectorSessionServer};
use protocol::v1::{self, AuthorityMessage, ConnectorMessage};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

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
    refusal: Arc<Mutex<Option<Status>>>,
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
        if let Some(status) = self.refusal.lock().expect("lock").clone() {
            return Err(status);
        }
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
    refusal: Arc<Mutex<Option<Status>>>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Authority {
    pub async fn start(assignment: Assignment) -> Authority {
        Self::start_on("127.0.0.1:0".parse().expect("addr"), assignment).await
    }

    pub async fn start_on(addr: SocketAddr, assignment: Assignment) -> Authority {
        Self::start_with(addr, assignment, None).await
    }

    /// Serves TLS with `identity` (on 127.0.0.1).
    pub async fn start_tls(identity: tonic::transport::Identity) -> Authority {
        let addr = "127.0.0.1:0".parse().expect("addr");
        Self::start_with(addr, Assignment::default(), Some(identity)).await
    }

    async fn start_with(
        addr: SocketAddr,
        assignment: Assignment,
        identity: Option<tonic::transport::Identity>,
    ) -> Authority {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind CA");
        let addr = listener.local_addr().expect("addr");
        let (seen_tx, seen) = mpsc::unbounded_channel();
        let current = Arc::new(Mutex::new(None));
        let refusal = Arc::new(Mutex::new(None));
        let service = Service {
            refusal: refusal.clone(),
            seen: seen_tx,
            assignment: Arc::new(Mutex::new(assignment)),
            current: current.clone(),
            key: "secret".into(),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut builder = tonic::transport::Server::builder();
            if let Some(identity) = identity {
                builder = match builder
                    .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                {
                    Ok(b) => b,
                    Err(e) => panic!("test CA TLS: {e}"),
                };
            }
            let _ = builder
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
            refusal,
            stop: Some(stop),
            task,
        }
    }

    /// From now on, refuses every session with `status` (as the real CA
    /// refuses a revoked or disabled connector).
    pub fn refuse(&self, status: Status) {
        *self.refusal.lock().expect("lock") = Some(status);
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
