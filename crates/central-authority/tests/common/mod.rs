//! Test harness: a CA served in-process on 127.0.0.1:0, real tonic clients
//! acting as connectors, and a small HTTP client (hyper) for the JSON API.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use central_authority::{Authority, Config};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use protocol::v1::connector_message::Kind as In;
use protocol::v1::connector_session_client::ConnectorSessionClient;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

pub const KEY_EAST: &str = "key-east-0123456789";
pub const KEY_WEST: &str = "key-west-0123456789";
pub const ACCESS_TOKEN: &str = "tok-access-0123456789";
pub const READ_TOKEN: &str = "tok-read-0123456789";

/// A config with two groups and a segment of each mode; `extra` is
/// appended (more segments or sections must not repeat the ones here).
pub fn config_text(health: &str, selection: &str, extra: &str) -> String {
    format!(
        r#"
[server]
grpc_listen = "127.0.0.1:0"
http_listen = "127.0.0.1:1"
reload_poll_ms = 50

[selection]
{selection}

[health]
{health}

[[api_tokens]]
name = "svc"
token = "{ACCESS_TOKEN}"
scopes = ["access"]

[[api_tokens]]
name = "ops"
token = "{READ_TOKEN}"
scopes = ["read"]

[[connector_groups]]
name = "dc-east"
provisioning_key = "{KEY_EAST}"

[[connector_groups]]
name = "dc-west"
provisioning_key = "{KEY_WEST}"

[[segments]]
name = "jira"
applications = ["jira.test.reach", "127.0.0.21"]
tcp_ports = ["80"]
health_reporting = "continuous"
report_interval_s = 60
connector_groups = ["dc-east"]

[[segments]]
name = "lab"
applications = ["*.lab.test.reach"]
tcp_ports = ["8000-8100"]
health_reporting = "on_access"
report_interval_s = 60
connector_groups = ["dc-east", "dc-west"]

[[segments]]
name = "legacy"
applications = ["legacy.test.reach"]
tcp_ports = ["9000"]
health_reporting = "none"
connector_groups = ["dc-west"]

[[segments]]
name = "payroll"
applications = ["payroll.test.reach"]
tcp_ports = ["443"]
health_reporting = "continuous"
client_hostname_validation = true
connector_groups = ["dc-east"]
{extra}
"#
    )
}

pub fn default_config() -> String {
    config_text("", "discovery_timeout_ms = 400", "")
}

/// A unique scratch directory under the system temp dir.
pub fn scratch_dir(tag: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "reach-ca-test-{}-{}-{tag}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A CA running in this process.
pub struct Ca {
    pub authority: Arc<Authority>,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Ca {
    pub async fn start(text: &str) -> Ca {
        let config = Config::from_toml(text, Path::new("."))
            .unwrap_or_else(|e| panic!("{}", e.messages().join("\n")));
        Self::start_config(config).await
    }

    pub async fn start_file(path: &Path) -> Ca {
        let config = Config::load(path).unwrap_or_else(|e| panic!("{}", e.messages().join("\n")));
        Self::start_config(config).await
    }

    pub async fn start_config(config: Config) -> Ca {
        let g = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let h = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let (grpc, http) = (g.local_addr().expect("addr"), h.local_addr().expect("addr"));
        let authority = Arc::new(Authority::new(config));
        let (tx, rx) = oneshot::channel::<()>();
        let a = authority.clone();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = rx.await;
            };
            central_authority::run_with(a, g, h, shutdown)
                .await
                .expect("CA runs");
        });
        Ca {
            authority,
            grpc,
            http,
            stop: Some(tx),
            task,
        }
    }

    pub async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.grpc))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect")
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(5), &mut self.task)
            .await
            .expect("CA stops within 5 s")
            .expect("CA task");
    }
}

/// A connector played by a real tonic client.
pub struct Conn {
    pub tx: mpsc::Sender<v1::ConnectorMessage>,
    pub rx: tonic::Streaming<v1::AuthorityMessage>,
    pub name: String,
    pub group: String,
}

pub async fn open(
    addr: SocketAddr,
    name: &str,
    group: &str,
    key: &str,
) -> Result<Conn, tonic::Status> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let (tx, rx) = mpsc::channel(64);
    tx.send(hello(name, group)).await.expect("queue hello");
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    let md = request.metadata_mut();
    md.insert(protocol::metadata::CONNECTOR, name.parse().expect("ascii"));
    md.insert(protocol::metadata::GROUP, group.parse().expect("ascii"));
    md.insert(
        protocol::metadata::PROVISIONING_KEY,
        key.parse().expect("ascii"),
    );
    let response = ConnectorSessionClient::new(channel)
        .connect(request)
        .await?;
    Ok(Conn {
        tx,
        rx: response.into_inner(),
        name: name.into(),
        group: group.into(),
    })
}

pub fn hello(name: &str, group: &str) -> v1::ConnectorMessage {
    v1::ConnectorMessage {
        kind: Some(In::Hello(v1::Hello {
            name: name.into(),
            group: group.into(),
            version: "0.0.0-test".into(),
            capabilities: Some(v1::Capabilities {
                icmp: false,
                icmp_mode: "none".into(),
                checks_per_second: 20,
            }),
        })),
    }
}

/// Connects and consumes the Welcome.
pub async fn connect(ca: &Ca, name: &str, group: &str) -> (Conn, v1::Welcome) {
    let key = if group == "dc-east" {
        KEY_EAST
    } else {
        KEY_WEST
    };
    let mut c = open(ca.grpc, name, group, key)
        .await
        .expect("authenticated");
    match c.next().await {
        Some(Out::Welcome(w)) => (c, w),
        other => panic!("expected Welcome, got {other:?}"),
    }
}

impl Conn {
    /// The next message from the CA (None when the stream ended), within 5 s.
    pub async fn next(&mut self) -> Option<Out> {
        match tokio::time::timeout(Duration::from_secs(5), self.rx.message()).await {
            Ok(Ok(Some(m))) => m.kind,
            Ok(Ok(None)) | Ok(Err(_)) => None,
            Err(_) => panic!("no message from the CA within 5 s"),
        }
    }

    /// The next message within `d`, or None if nothing came.
    pub async fn next_within(&mut self, d: Duration) -> Option<Out> {
        match tokio::time::timeout(d, self.rx.message()).await {
            Ok(Ok(Some(m))) => m.kind,
            _ => None,
        }
    }

    pub async fn report(&self, apps: Vec<v1::ApplicationHealth>, full_state: bool) {
        self.tx
            .send(v1::ConnectorMessage {
                kind: Some(In::Report(v1::HealthReport {
                    applications: apps,
                    full_state,
                })),
            })
            .await
            .expect("send report");
    }

    pub async fn heartbeat(&self, load: v1::CheckLoad) {
        self.tx
            .send(v1::ConnectorMessage {
                kind: Some(In::Heartbeat(v1::Heartbeat { load: Some(load) })),
            })
            .await
            .expect("send heartbeat");
    }
}

pub fn key(segment: &str, host: &str, port: u32) -> v1::ApplicationKey {
    v1::ApplicationKey {
        segment: segment.into(),
        host: host.into(),
        protocol: v1::Protocol::Tcp as i32,
        port,
    }
}

/// An application result: `up` addresses reachable, `down` not.
pub fn app(
    segment: &str,
    host: &str,
    port: u32,
    up: &[&str],
    down: &[&str],
) -> v1::ApplicationHealth {
    let mut addresses: Vec<v1::AddressResult> = up
        .iter()
        .map(|a| v1::AddressResult {
            address: (*a).into(),
            status: v1::HealthStatus::Up as i32,
            method: v1::CheckMethod::Tcp as i32,
            rtt_us: 1500,
            failure: 0,
            detail: String::new(),
        })
        .collect();
    addresses.extend(down.iter().map(|a| v1::AddressResult {
        address: (*a).into(),
        status: v1::HealthStatus::Down as i32,
        method: v1::CheckMethod::Tcp as i32,
        rtt_us: 0,
        failure: v1::FailureKind::Refused as i32,
        detail: "connection refused".into(),
    }));
    let status = match (up.len(), down.len()) {
        (0, _) => v1::HealthStatus::Down,
        (_, 0) => v1::HealthStatus::Up,
        _ => v1::HealthStatus::Unhealthy,
    };
    v1::ApplicationHealth {
        app: Some(key(segment, host, port)),
        status: status as i32,
        addresses,
        checked_at_unix_ms: 1,
        dns_error: String::new(),
        expired: false,
    }
}

/// A minimal HTTP client.
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl Http {
    pub fn new(addr: SocketAddr) -> Http {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://{addr}"),
        }
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> (u16, String) {
        let mut b = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        let body = match body {
            Some(v) => {
                b = b.header("content-type", "application/json");
                Full::new(Bytes::from(v.to_string()))
            }
            None => Full::new(Bytes::new()),
        };
        let response = self
            .client
            .request(b.body(body).expect("request"))
            .await
            .expect("HTTP request");
        let status = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    pub async fn get_json(&self, path: &str, token: Option<&str>) -> (u16, serde_json::Value) {
        let (s, body) = self.send("GET", path, token, None).await;
        (
            s,
            serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
        )
    }

    pub async fn access(&self, host: &str, protocol: &str, port: u32) -> (u16, serde_json::Value) {
        let (s, body) = self
            .send(
                "POST",
                "/api/v1/access",
                Some(ACCESS_TOKEN),
                Some(serde_json::json!({"host": host, "protocol": protocol, "port": port})),
            )
            .await;
        (
            s,
            serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}")),
        )
    }

    pub async fn access_anonymous(&self) -> (u16, String) {
        self.send(
            "POST",
            "/api/v1/access",
            None,
            Some(serde_json::json!({"host": "jira.test.reach", "protocol": "tcp", "port": 80})),
        )
        .await
    }

    /// The health entry of one application, if listed.
    pub async fn app(&self, segment: &str, host: &str, port: u64) -> Option<serde_json::Value> {
        let (s, v) = self.get_json("/api/v1/health", Some(READ_TOKEN)).await;
        assert_eq!(s, 200, "{v}");
        v["applications"]
            .as_array()?
            .iter()
            .find(|a| {
                a["segment"] == segment && a["host"] == host && a["port"].as_u64() == Some(port)
            })
            .cloned()
    }
}

/// Waits (bounded) until `f` returns true, checking every 20 ms. Used only
/// where the CA reacts to a network event whose timing the test does not
/// control (a peer closing its stream).
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}
