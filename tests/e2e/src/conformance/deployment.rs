//! The kit's deployment: two CA replicas on one PostgreSQL database, a DNS
//! server whose zone names the replicas and an application, the
//! applications themselves, and the connector under test.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use test_support::{DnsServer, Segment, TcpApp, UdpApp};

use super::Options;
use super::icmp::EchoCounter;
use crate::{Ca, Proc, Scenario, TOKEN, group_key};

/// The connector group the connector under test enrolls in.
pub const GROUP: &str = "conformance";
/// The name it enrolls as.
pub const NAME: &str = "connector-under-test";
/// The zone the kit's DNS server serves.
const ZONE: &str = "conformance.test";
/// The CA's name: it resolves to both replicas.
pub const CA_NAME: &str = "ca.conformance.test";
/// The continuous application's name: it resolves to two addresses.
pub const APP_NAME: &str = "app.conformance.test";
/// Checks per second the CA imposes.
pub const RATE: u32 = 4;
/// Report interval of every continuous segment.
pub const INTERVAL: Duration = Duration::from_secs(2);
/// The on-access window.
pub const WINDOW: Duration = Duration::from_secs(5);
/// Connector certificate lifetime: renewal falls inside the watch.
pub const CERT_VALIDITY_S: u64 = 30;
/// Report entries per second the CA takes, and the burst: a rate well
/// above what the checks produce (16 checks at 4 per second make 11
/// results in 4 s), so that a backlog drains at once, and a burst under
/// what they produce in `PAUSE` (so that the reports a paused replica
/// receives at once exceed it and some are refused) and under the 11
/// applications' full state (which leaves the session in debt).
pub const ENTRIES: (u32, u32) = (10, 3);
/// How often the connector sends a heartbeat: the CA closes a session idle
/// for three of them, far longer than `PAUSE`.
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// How long the kit stops (SIGSTOP) the first replica once during the
/// watch: the connector's reports of that time reach it at once when it
/// goes on, more than its entry budget takes, and it refuses some with
/// `FlowControl`, however exactly the connector paces itself.
pub const PAUSE: Duration = Duration::from_secs(2);
/// Ports where the applications listen.
pub const OPEN_PORTS: [u16; 4] = [8080, 8081, 8082, 8083];
/// A port in the segment where nothing listens.
pub const CLOSED_PORT: u16 = 8084;
/// The UDP application's port.
pub const UDP_PORT: u16 = 5300;
/// The on-access application's port.
pub const ACCESS_PORT: u16 = 9000;

/// Everything the kit started.
pub struct Deployment {
    pub sc: Scenario,
    pub replicas: Vec<Ca>,
    pub replica_at: Vec<(SocketAddr, SocketAddr)>,
    /// One TCP application per (address, open port) of the continuous segment.
    pub tcp: Vec<TcpApp>,
    pub _udp: UdpApp,
    pub on_access: TcpApp,
    pub echo: EchoCounter,
    pub connector: Option<Proc>,
    command: Vec<String>,
    store: String,
    _dns: DnsServer,
}

impl Deployment {
    /// The two addresses `APP_NAME` resolves to, then the explicit IP.
    pub fn app_ips(sc: &Scenario) -> [IpAddr; 3] {
        [sc.ip(1, 1), sc.ip(1, 2), sc.ip(1, 3)]
    }

    /// Starts everything, the connector under test last.
    pub async fn start(options: &Options) -> Result<Self> {
        let sc = Scenario::new("conformance", options.block)?;
        let replica_at: Vec<(SocketAddr, SocketAddr)> = (1..=2)
            .map(|i| (sc.addr(0, i, 7443), sc.addr(0, i, 7480)))
            .collect();
        let ips = Self::app_ips(&sc);
        let mut records = vec![(APP_NAME, ips[0]), (APP_NAME, ips[1])];
        for (grpc, _) in &replica_at {
            records.push((CA_NAME, grpc.ip()));
        }
        let dns = DnsServer::start(sc.dns(), ZONE, &records).await?;
        let mut tcp = Vec::new();
        for ip in ips {
            for port in OPEN_PORTS {
                tcp.push(TcpApp::start((ip, port).into()).await?);
            }
        }
        let udp = UdpApp::start((sc.ip(2, 1), UDP_PORT).into()).await?;
        let on_access = TcpApp::start((sc.ip(3, 1), ACCESS_PORT).into()).await?;
        let echo = EchoCounter::start().context(
            "the kit counts ICMP echo requests with a raw socket: run it as root or with CAP_NET_RAW",
        )?;
        let store = test_support::Postgres::shared()
            .fresh_database()
            .context("the kit's replicas share a PostgreSQL store (Debian's postgresql package)")?;
        let mut deployment = Deployment {
            sc,
            replicas: Vec::new(),
            replica_at,
            tcp,
            _udp: udp,
            on_access,
            echo,
            connector: None,
            command: options.command.clone(),
            store,
            _dns: dns,
        };
        for i in 0..2 {
            let ca = deployment.start_replica(i).await?;
            deployment.replicas.push(ca);
        }
        deployment.start_connector()?;
        Ok(deployment)
    }

    /// The replicas' shared data directory (root, server certificate).
    pub fn data_dir(&self) -> PathBuf {
        self.sc.dir.join("ca-data")
    }

    /// Starts replica `i` (0-based); the first one generates the root.
    pub async fn start_replica(&self, i: usize) -> Result<Ca> {
        let (grpc, http) = self.replica_at[i];
        let config = self.config(i);
        Ca::start_replica(
            &self.sc,
            &format!("ca{}", i + 1),
            &config,
            http,
            grpc,
            &self.data_dir(),
        )
        .await
    }

    fn config(&self, i: usize) -> String {
        let (grpc, http) = self.replica_at[i];
        let sc = &self.sc;
        let explicit = Self::app_ips(sc)[2];
        let ports = format!("{}-{}", OPEN_PORTS[0], CLOSED_PORT);
        let interval = INTERVAL.as_millis() as u64;
        let segments = Segment::new("continuous")
            .apps([APP_NAME.to_owned(), explicit.to_string()])
            .tcp([ports.as_str()])
            .interval_ms(interval)
            .groups([GROUP])
            .toml()
            + &Segment::new("udp")
                .apps([sc.ip(2, 1).to_string()])
                .udp([UDP_PORT.to_string()])
                .interval_ms(interval)
                .groups([GROUP])
                .toml()
            + &Segment::new("on-access")
                .apps([sc.ip(3, 1).to_string()])
                .tcp([ACCESS_PORT.to_string()])
                .mode("on_access")
                .interval_ms(interval)
                .groups([GROUP])
                .toml();
        format!(
            r#"[server]
grpc_listen = "{grpc}"
http_listen = "{http}"
anonymous_read = false
data_dir = {data:?}

[store]
url = {store:?}

[replica]
id = "ca{n}"

[tls]
server_names = ["{CA_NAME}"]
connector_cert_validity_s = {CERT_VALIDITY_S}
renewal_grace_s = 10

[limits]
connector_entries_per_second = {eps}
connector_entries_burst = {burst}

[selection]
discovery_timeout_ms = 3000

[health]
on_access_window_ms = {window}
access_forward_interval_ms = 1000
heartbeat_interval_ms = {heartbeat}
checks_per_second = {RATE}
warmup_ms = 0

[[api_tokens]]
name = "conformance"
token = "{TOKEN}"
scopes = ["access", "read", "admin"]

[[connector_groups]]
name = "{GROUP}"
provisioning_key = "{key}"
max_uses = 5

{segments}"#,
            data = self.data_dir().display().to_string(),
            store = self.store,
            n = i + 1,
            eps = ENTRIES.0,
            burst = ENTRIES.1,
            window = WINDOW.as_millis(),
            heartbeat = HEARTBEAT.as_millis(),
            key = group_key(GROUP),
        )
    }

    /// What `{placeholder}` in the command stands for.
    fn substitutions(&self) -> Vec<(&'static str, String)> {
        let root = self.data_dir().join("ca.pem");
        vec![
            ("ca_url", format!("https://{CA_NAME}:7443")),
            ("ca_cert", root.display().to_string()),
            ("name", NAME.to_owned()),
            ("group", GROUP.to_owned()),
            ("provisioning_key", group_key(GROUP)),
            (
                "state_dir",
                self.sc.dir.join("connector-state").display().to_string(),
            ),
            ("dns", self.sc.dns().to_string()),
        ]
    }

    /// Starts the connector under test: the command with its placeholders
    /// replaced, and the same values in `REACH_*` environment variables.
    pub fn start_connector(&mut self) -> Result<()> {
        let subs = self.substitutions();
        let Some((program, args)) = self.command.split_first() else {
            bail!("no connector command given: reach-conformance -- <command>");
        };
        let fill = |s: &str| {
            subs.iter()
                .fold(s.to_owned(), |s, (k, v)| s.replace(&format!("{{{k}}}"), v))
        };
        let args: Vec<String> = args.iter().map(|a| fill(a)).collect();
        let envs: Vec<(&str, String)> =
            subs.iter().map(|(k, v)| (env_name(k), v.clone())).collect();
        let program = find_program(&fill(program))?;
        let proc = Proc::spawn(
            "connector",
            &program.display().to_string(),
            &args,
            &envs,
            &self.sc.dir,
        )?;
        self.connector = Some(proc);
        Ok(())
    }

    /// Prints every process's log (the kit could not finish).
    pub fn print_logs(&self) {
        for ca in &self.replicas {
            eprintln!("--- {} ---\n{}", ca.proc.name(), ca.proc.log());
        }
        if let Some(c) = &self.connector {
            eprintln!("--- connector ---\n{}", c.log());
        }
    }

    /// Stops the connector and the replicas.
    pub async fn stop(&mut self) {
        if let Some(mut c) = self.connector.take() {
            c.stop().await;
        }
        for ca in &mut self.replicas {
            ca.proc.stop().await;
        }
    }
}

/// The environment variable that carries placeholder `key`.
fn env_name(key: &str) -> &'static str {
    match key {
        "ca_url" => "REACH_CA_URL",
        "ca_cert" => "REACH_CA_CERT",
        "name" => "REACH_CONNECTOR_NAME",
        "group" => "REACH_CONNECTOR_GROUP",
        "provisioning_key" => "REACH_PROVISIONING_KEY",
        "state_dir" => "REACH_STATE_DIR",
        _ => "REACH_DNS_SERVER",
    }
}

/// `program` as a path: as given when it has a `/`, else from the kit's
/// own directory (the workspace's binaries), else from `PATH`.
fn find_program(program: &str) -> Result<PathBuf> {
    if program.contains('/') {
        return std::path::absolute(program).with_context(|| format!("program {program:?}"));
    }
    let beside = crate::bin_dir()?.join(program);
    if beside.is_file() {
        return Ok(beside);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("{program:?} is neither beside reach-conformance nor on PATH"))
}
