//! Test harness: a CA served in-process on 127.0.0.1:0 with TLS (its own
//! generated root in a scratch data directory), real tonic clients acting as
//! enrolled connectors (mutual TLS), and the JSON API calls on
//! `test_support`'s HTTPS client.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use central_authority::{Authority, Config};
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use protocol::v1::connector_message::Kind as In;
use protocol::v1::connector_session_client::ConnectorSessionClient;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

// Polling for events whose timing the test does not control (a peer closing
// its stream), shared with the other crates' tests. Not every test binary
// polls.
#[allow(unused_imports)]
pub use test_support::{HttpsClient, Segment, eventually};

pub const KEY_EAST: &str = "key-east-B0osmy39tFGyyrktfUA4bq08";
pub const KEY_WEST: &str = "key-west-xJdfkuf189GgDwSbDpdZ9av8";
pub const ACCESS_TOKEN: &str = "tok-access-FPycc3enZejaBMAXzGELmRmD";
pub const READ_TOKEN: &str = "tok-read-x2ngUZsYLeJOhbAo3s2gPemM";

/// A config with two groups and a segment of each mode; `extra` is
/// appended (more segments or sections must not repeat the ones here).
pub fn config_text(health: &str, selection: &str, extra: &str) -> String {
    let segments: String = [
        segment("jira")
            .apps(["jira.test.reach", "127.0.0.21"])
            .tcp(["80"])
            .groups(["dc-east"]),
        segment("lab")
            .apps(["*.lab.test.reach"])
            .tcp(["8000-8100"])
            .mode("on_access")
            .groups(["dc-east", "dc-west"]),
        segment("legacy")
            .apps(["legacy.test.reach"])
            .tcp(["9000"])
            .mode("none")
            .groups(["dc-west"]),
        segment("payroll")
            .apps(["payroll.test.reach"])
            .tcp(["443"])
            .groups(["dc-east"])
            .extra("client_hostname_validation = true"),
    ]
    .iter()
    .map(Segment::toml)
    .collect();
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

{segments}{extra}
"#
    )
}

/// A segment with the config's default report interval (60 s); the
/// builder's own default (1 s) suits agents, not these CA tests.
pub fn segment(name: &str) -> Segment {
    Segment::new(name).interval_ms(60_000)
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
    // A directory of an earlier run whose process had the same id (ids are
    // reused) would hand this CA its old root and enrollments: a test then
    // found "east-1" enrolled already and was refused.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Where a CA's gRPC listener is and the root to trust it with.
#[derive(Clone, Debug)]
pub struct Target {
    pub grpc: SocketAddr,
    pub root: String,
}

impl Target {
    /// A TLS channel without a client certificate (enrollment, APIs).
    pub async fn channel(&self) -> Channel {
        self.endpoint(None).connect().await.expect("connect")
    }

    fn endpoint(&self, identity: Option<&Creds>) -> Endpoint {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.root));
        if let Some(c) = identity {
            tls = tls.identity(Identity::from_pem(&c.cert, &c.key));
        }
        Endpoint::from_shared(format!("https://{}", self.grpc))
            .expect("endpoint")
            .tls_config(tls)
            .expect("tls")
    }

    /// A mutual-TLS channel with `creds`.
    pub async fn mtls(&self, creds: &Creds) -> Channel {
        self.endpoint(Some(creds)).connect().await.expect("connect")
    }
}

/// A connector's enrolled credentials.
#[derive(Clone, Debug)]
pub struct Creds {
    pub cert: String,
    pub key: String,
    pub serial: String,
}

/// A fresh key pair and a CSR for `name`.
pub fn key_and_csr(name: &str) -> (rcgen::KeyPair, String) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let csr = params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem");
    (key, csr)
}

/// Enrolls `name` in `group` with `key` (a new enrollment every call).
pub async fn enroll(
    t: &Target,
    name: &str,
    group: &str,
    key: &str,
) -> Result<Creds, tonic::Status> {
    let (pair, csr) = key_and_csr(name);
    let r = v1::enrollment_client::EnrollmentClient::new(t.channel().await)
        .enroll(v1::EnrollRequest {
            name: name.into(),
            group: group.into(),
            provisioning_key: key.into(),
            csr_pem: csr,
        })
        .await?
        .into_inner();
    Ok(Creds {
        cert: r.certificate_pem,
        key: pair.serialize_pem(),
        serial: r.serial,
    })
}

type CredKey = (String, String, String);

/// Credentials enrolled so far, per (root, name, group): reconnecting
/// connectors reuse their certificate, as the real agent does.
static CREDS: LazyLock<Mutex<HashMap<CredKey, Creds>>> = LazyLock::new(Default::default);

/// Enrolls once per (CA, name, group) and reuses the certificate after.
pub async fn enrolled(
    t: &Target,
    name: &str,
    group: &str,
    key: &str,
) -> Result<Creds, tonic::Status> {
    // One enrollment at a time: two connects of one name racing past the
    // cache would enroll it twice, and the CA refuses the second as a
    // takeover ("… is enrolled with a valid certificate").
    static ENROLLING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one = ENROLLING.lock().await;
    let k = (t.root.clone(), name.to_owned(), group.to_owned());
    if let Some(c) = CREDS.lock().expect("lock").get(&k).cloned() {
        return Ok(c);
    }
    let c = enroll(t, name, group, key).await?;
    CREDS.lock().expect("lock").insert(k, c.clone());
    Ok(c)
}

/// A CA running in this process.
pub struct Ca {
    pub authority: Arc<Authority>,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub data_dir: PathBuf,
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

    pub async fn start_config(mut config: Config) -> Ca {
        config.settings.data_dir = scratch_dir("data");
        Self::start_in(config).await
    }

    /// Starts on the config's own data dir (a restart keeps its state).
    pub async fn start_in(config: Config) -> Ca {
        Self::start_with_tls(config, true).await
    }

    /// Starts without TLS (`[tls] enabled = false`): connectors
    /// authenticate with provisioning keys in metadata, and `root`/`web`
    /// are not available.
    pub async fn start_plain(text: &str) -> Ca {
        let mut config = Config::from_toml(text, Path::new("."))
            .unwrap_or_else(|e| panic!("{}", e.messages().join("\n")));
        config.settings.data_dir = scratch_dir("data");
        assert!(
            !config.settings.tls_enabled,
            "a config with [tls] enabled = false"
        );
        Self::start_with_tls(config, false).await
    }

    /// Stops this CA (started without TLS from `text`) and starts a new
    /// process of it on the same addresses and data directory: a restart.
    pub async fn restart_plain(self, text: &str) -> Ca {
        let (grpc, http, data_dir) = (self.grpc, self.http, self.data_dir.clone());
        self.stop().await;
        let mut config = Config::from_toml(text, Path::new("."))
            .unwrap_or_else(|e| panic!("{}", e.messages().join("\n")));
        config.settings.data_dir = data_dir;
        Self::start_at(config, false, grpc, http).await
    }

    /// Starts with TLS on HTTP address `http` (a port chosen before the
    /// config that names it), on the config's own data dir.
    pub async fn start_tls_at(config: Config, http: SocketAddr) -> Ca {
        Self::start_at(config, true, ([127, 0, 0, 1], 0).into(), http).await
    }

    async fn start_with_tls(config: Config, tls: bool) -> Ca {
        let any: SocketAddr = ([127, 0, 0, 1], 0).into();
        Self::start_at(config, tls, any, any).await
    }

    async fn start_at(config: Config, tls: bool, grpc: SocketAddr, http: SocketAddr) -> Ca {
        let data_dir = config.settings.data_dir.clone();
        let g = tokio::net::TcpListener::bind(grpc).await.expect("bind");
        let h = tokio::net::TcpListener::bind(http).await.expect("bind");
        let (grpc, http) = (g.local_addr().expect("addr"), h.local_addr().expect("addr"));
        let authority = Arc::new(Authority::open(config, tls).expect("trust state opens"));
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
            data_dir,
            stop: Some(tx),
            task,
        }
    }

    /// The CA's root certificate (what connectors trust).
    pub fn root(&self) -> String {
        self.authority.pki().expect("TLS").issuer_pem.clone()
    }

    /// The gRPC target.
    pub fn target(&self) -> Target {
        Target {
            grpc: self.grpc,
            root: self.root(),
        }
    }

    /// An HTTPS client for the JSON API.
    pub fn web(&self) -> Http {
        Http::new(self.http, &self.root())
    }

    pub async fn channel(&self) -> Channel {
        self.target().channel().await
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

/// Enrolls (once) and opens a session with the certificate.
pub async fn open(t: &Target, name: &str, group: &str, key: &str) -> Result<Conn, tonic::Status> {
    let creds = enrolled(t, name, group, key).await?;
    open_with(t, &creds, name, group).await
}

/// Opens a session with `creds`, saying `name`/`group` in Hello.
pub async fn open_with(
    t: &Target,
    creds: &Creds,
    name: &str,
    group: &str,
) -> Result<Conn, tonic::Status> {
    let (tx, rx) = mpsc::channel(64);
    tx.send(hello(name, group)).await.expect("queue hello");
    let request = tonic::Request::new(ReceiverStream::new(rx));
    let response = ConnectorSessionClient::new(t.mtls(creds).await)
        .connect(request)
        .await?;
    Ok(Conn {
        tx,
        rx: response.into_inner(),
        name: name.into(),
        group: group.into(),
    })
}

/// A session authenticated by its group's provisioning key in metadata
/// (`[tls] enabled = false`), on the replica at `grpc`.
pub async fn open_plain(grpc: std::net::SocketAddr, name: &str) -> Result<Conn, tonic::Status> {
    open_plain_with(grpc, name, KEY_EAST, true).await
}

/// A dc-east stream authenticated by `key` in metadata; its `Hello` queued
/// at once when `hello_now`, else left to the test (the stream stays pending).
pub async fn open_plain_with(
    grpc: std::net::SocketAddr,
    name: &str,
    key: &str,
    hello_now: bool,
) -> Result<Conn, tonic::Status> {
    use protocol::metadata as md;
    let channel = Endpoint::from_shared(format!("http://{grpc}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connects in plain text");
    let (tx, rx) = mpsc::channel(64);
    if hello_now {
        tx.send(hello(name, "dc-east")).await.expect("queue hello");
    }
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    for (k, v) in [
        (md::CONNECTOR, name),
        (md::GROUP, "dc-east"),
        (md::PROVISIONING_KEY, key),
    ] {
        request
            .metadata_mut()
            .insert(k, v.parse().expect("ASCII metadata"));
    }
    let response = ConnectorSessionClient::new(channel)
        .connect(request)
        .await?;
    Ok(Conn {
        tx,
        rx: response.into_inner(),
        name: name.into(),
        group: "dc-east".into(),
    })
}

/// `message` as a request carrying the access token (`Access/Resolve`).
pub fn with_access_token<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {ACCESS_TOKEN}").parse().expect("ascii"),
    );
    request
}

pub fn hello(name: &str, group: &str) -> v1::ConnectorMessage {
    v1::ConnectorMessage {
        kind: Some(In::Hello(v1::Hello {
            name: name.into(),
            group: group.into(),
            version: "0.0.0-test".into(),
            release: protocol::release::RELEASE.into(),
            capabilities: Some(v1::Capabilities {
                icmp: false,
                icmp_mode: "none".into(),
                checks_per_second: 20,
                trust_bundle: false,
            }),
        })),
    }
}

/// Connects and consumes the Welcome and the trust bundle that follows it.
pub async fn connect(ca: &Ca, name: &str, group: &str) -> (Conn, v1::Welcome) {
    let key = if group == "dc-east" {
        KEY_EAST
    } else {
        KEY_WEST
    };
    let mut c = open(&ca.target(), name, group, key)
        .await
        .expect("authenticated");
    let welcome = match c.next().await {
        Some(Out::Welcome(w)) => w,
        other => panic!("expected Welcome, got {other:?}"),
    };
    c.trust_bundle().await;
    (c, welcome)
}

impl Conn {
    /// Consumes the `TrustBundle` a CA with TLS sends after `Welcome`.
    pub async fn trust_bundle(&mut self) -> v1::TrustBundle {
        match self.next().await {
            Some(Out::TrustBundle(b)) => b,
            other => panic!("expected the trust bundle after Welcome, got {other:?}"),
        }
    }

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
                    sequence: 0,
                })),
            })
            .await
            .expect("send report");
    }

    /// Says the connector drains itself before it stops (`v1::Drain`).
    pub async fn drain(&self, drain_ms: u64) {
        self.tx
            .send(v1::ConnectorMessage {
                kind: Some(In::Drain(v1::Drain { drain_ms })),
            })
            .await
            .expect("send drain");
    }

    pub async fn heartbeat(&self, load: v1::CheckLoad) {
        self.tx
            .send(v1::ConnectorMessage {
                kind: Some(In::Heartbeat(v1::Heartbeat {
                    load: Some(load),
                    replicas: None,
                    status: None,
                })),
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
            reason: None,
            certificate_not_after_unix_s: None,
            address: (*a).into(),
            status: v1::HealthStatus::Up as i32,
            method: v1::CheckMethod::Tcp as i32,
            rtt_us: 1500,
            failure: 0,
            detail: String::new(),
        })
        .collect();
    addresses.extend(down.iter().map(|a| v1::AddressResult {
        reason: None,
        certificate_not_after_unix_s: None,
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
        age_ms: 0,
        access_id: String::new(),
    }
}

/// The shared HTTPS client with the CA API calls the tests make (a
/// `Deref` to it, so `send` and `get_json` are its own).
pub struct Http(HttpsClient);

impl std::ops::Deref for Http {
    type Target = HttpsClient;

    fn deref(&self) -> &HttpsClient {
        &self.0
    }
}

impl Http {
    pub fn new(addr: SocketAddr, root_pem: &str) -> Http {
        Http(HttpsClient::new(addr, root_pem))
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

/// The config of a real connector agent `name` of `group` for `ca`,
/// enrolling with `key`: it trusts the CA's root from a file and keeps its
/// state in a scratch directory (`tag`).
pub fn agent_config(
    ca: &Ca,
    tag: &str,
    name: &str,
    group: &str,
    key: &str,
) -> connector_agent::Config {
    let dir = scratch_dir(tag);
    let root = dir.join("ca.pem");
    std::fs::write(&root, ca.root()).expect("root");
    let mut config = connector_agent::Config::new(format!("https://{}", ca.grpc), name, group);
    config.ca_cert = Some(root);
    config.state_dir = dir.join("state");
    config.provisioning_key = Some(key.into());
    config
}

/// A connector agent running in this process.
pub type AgentTask = tokio::task::JoinHandle<Result<(), connector_agent::AgentError>>;

/// Runs the agent of `config` in this process until the sender sends or is
/// dropped.
pub fn spawn_agent(config: connector_agent::Config) -> (oneshot::Sender<()>, AgentTask) {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(connector_agent::run(config, async move {
        let _ = stopped.await;
    }));
    (stop, task)
}
