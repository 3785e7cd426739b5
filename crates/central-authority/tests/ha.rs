//! High availability, connector side: three CA replicas (in this process,
//! each on its own loopback address and the same port, sharing one data
//! directory: the SQLite trust store and the issuing root) behind one name
//! that a real DNS server on loopback resolves to all three, and the real
//! connector attached to every one of them.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use central_authority::{Authority, Config};
use common::{Http, KEY_EAST, READ_TOKEN, scratch_dir, spawn_agent};
use test_support::{DnsServer, Segment, TcpApp, retry};
use tokio::sync::oneshot;

const NAME: &str = "ca.ha.test";
const APP: &str = "app.ha.test";
const WAIT: Duration = Duration::from_secs(20);

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// The replicas' policy: one continuous segment, reported every `interval_ms`.
fn policy(grpc: SocketAddr, http: SocketAddr, interval_ms: u64, port: u16) -> String {
    format!(
        r#"
[server]
grpc_listen = "{grpc}"
http_listen = "{http}"

[tls]
server_names = ["{NAME}"]

[health]
heartbeat_interval_ms = 300

[[api_tokens]]
name = "ops"
token = "{READ_TOKEN}"
scopes = ["read"]

[[connector_groups]]
name = "dc-east"
provisioning_key = "{KEY_EAST}"
{segment}"#,
        segment = Segment::new("ha")
            .apps([APP])
            .tcp([port])
            .interval_ms(interval_ms)
            .groups(["dc-east"])
            .toml()
    )
}

/// One CA replica served in this process on `grpc` / `http`.
struct Replica {
    http: SocketAddr,
    web: Http,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Replica {
    async fn start(data_dir: &Path, grpc: SocketAddr, http: SocketAddr, text: &str) -> Replica {
        let mut config = Config::from_toml(text, Path::new("."))
            .unwrap_or_else(|e| panic!("{}", e.messages().join("\n")));
        config.settings.data_dir = data_dir.to_owned();
        let authority = Arc::new(Authority::open(config, true).expect("trust state opens"));
        let root = authority.pki().expect("TLS").issuer_pem.clone();
        let g = tokio::net::TcpListener::bind(grpc)
            .await
            .expect("bind gRPC");
        let h = tokio::net::TcpListener::bind(http)
            .await
            .expect("bind HTTP");
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = rx.await;
            };
            central_authority::run_with(authority, g, h, shutdown)
                .await
                .expect("CA runs");
        });
        Replica {
            http,
            web: Http::new(http, &root),
            stop: Some(tx),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.task).await;
        self.task.abort();
    }

    /// The connector's status for the application in this replica's table.
    async fn status(&self, connector: &str, port: u16) -> Option<String> {
        let app = self.web.app("ha", APP, u64::from(port)).await?;
        app["connectors"]
            .as_array()?
            .iter()
            .find(|c| c["connector"] == connector)
            .and_then(|c| c["status"].as_str().map(str::to_owned))
    }

    /// The connector as `GET /api/v1/connectors` lists it.
    async fn connector(&self, name: &str) -> serde_json::Value {
        let (s, v) = self
            .web
            .get_json("/api/v1/connectors", Some(READ_TOKEN))
            .await;
        assert_eq!(s, 200, "{v}");
        v["connectors"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == name).cloned())
            .unwrap_or_default()
    }
}

/// Waits until `check` passes on the replica, naming `what`.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    retry(WAIT, || {
        let done = check();
        async move {
            if done.await {
                Ok(())
            } else {
                anyhow::bail!("not yet")
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for: {what}"));
}

fn agent(root: PathBuf, dir: &Path, dns: SocketAddr, port: u16) -> connector_agent::Config {
    let mut agent =
        connector_agent::Config::new(format!("https://{NAME}:{port}"), "east-1", "dc-east");
    agent.ca_cert = Some(root);
    agent.state_dir = dir.join("state");
    agent.provisioning_key = Some(KEY_EAST.into());
    agent.dns_server = Some(dns);
    agent.check_timeout_ms = 300;
    agent.ca_resolve_interval_s = 1;
    agent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_reports_to_every_replica_with_one_schedule_and_reattaches() {
    let (a, b, c, app_ip) = (ip(31), ip(32), ip(33), ip(34));
    // One port for the three gRPC listeners (a name with three A records
    // maps to them), another for HTTP.
    let probe = tokio::net::TcpListener::bind((a, 0)).await.expect("port");
    let grpc_port = probe.local_addr().expect("addr").port();
    drop(probe);
    let probe = tokio::net::TcpListener::bind((a, 0)).await.expect("port");
    let http_port = probe.local_addr().expect("addr").port();
    drop(probe);
    let app = TcpApp::start((app_ip, 8080).into()).await.expect("app");
    let port = app.addr().port();
    let dns = DnsServer::start(
        (ip(1), 0).into(),
        "ha.test",
        &[(NAME, a), (NAME, b), (NAME, c), (APP, app_ip)],
    )
    .await
    .expect("DNS server");

    let data = scratch_dir("ha-shared");
    let interval = 1000;
    let text = |at: IpAddr, interval: u64| {
        policy(
            (at, grpc_port).into(),
            (at, http_port).into(),
            interval,
            port,
        )
    };
    // The first replica makes the shared root; the others load it.
    let r1 = Replica::start(
        &data,
        (a, grpc_port).into(),
        (a, http_port).into(),
        &text(a, interval),
    )
    .await;
    let r2 = Replica::start(
        &data,
        (b, grpc_port).into(),
        (b, http_port).into(),
        &text(b, interval),
    )
    .await;
    let r3 = Replica::start(
        &data,
        (c, grpc_port).into(),
        (c, http_port).into(),
        &text(c, interval),
    )
    .await;
    let dir = scratch_dir("ha-agent");
    let root = dir.join("ca.pem");
    std::fs::write(
        &root,
        std::fs::read_to_string(data.join("ca.pem")).expect("root"),
    )
    .expect("root");
    let config = agent(root, &dir, dns.addr(), grpc_port);
    let (stop, task) = spawn_agent(config);

    // Every replica's own table shows the connector's report.
    for r in [&r1, &r2, &r3] {
        until("every replica shows the application up", || async {
            r.status("east-1", port).await.as_deref() == Some("up")
        })
        .await;
        until(
            "every replica sees three sessions, one assignment",
            || async {
                let v = r.connector("east-1").await;
                v["connected"] == true
                    && v["replicas"]["sessions"] == 3
                    && v["replicas"]["assignments"] == 1
                    && v["replicas"]["disagreement"] == false
            },
        )
        .await;
    }
    // Exactly one replica is the one followed.
    let mut followed = 0;
    for r in [&r1, &r2, &r3] {
        if r.connector("east-1").await["replicas"]["follows_this_replica"] == true {
            followed += 1;
        }
    }
    assert_eq!(followed, 1, "one replica's assignment is followed");

    // One schedule: the application's one address is checked once per
    // report interval, not once per replica. Over 6 intervals three
    // schedules would make ~18 connections; one makes ~6.
    let before = app.count();
    tokio::time::sleep(Duration::from_millis(6 * interval)).await;
    let checks = app.count() - before;
    eprintln!("{checks} checks of the application in 6 report intervals, three replicas");
    assert!(
        (3..=9).contains(&checks),
        "{checks} checks in 6 report intervals with three replicas (one schedule: ~6)"
    );

    // A replica goes away: the others keep their sessions and fresh reports.
    let r2_http = r2.http;
    r2.stop().await;
    for r in [&r1, &r3] {
        until("the live replicas see two sessions", || async {
            r.connector("east-1").await["replicas"]["sessions"] == 2
        })
        .await;
        assert_eq!(r.status("east-1", port).await.as_deref(), Some("up"));
    }
    // It returns (with a different policy file: the replicas disagree).
    let r2 = Replica::start(
        &data,
        (b, grpc_port).into(),
        r2_http,
        &text(b, 2 * interval),
    )
    .await;
    until(
        "the returning replica is attached again and reported to",
        || async {
            r2.status("east-1", port).await.as_deref() == Some("up")
                && r2.connector("east-1").await["connected"] == true
        },
    )
    .await;
    // The disagreement shows on every replica; the newcomer is not followed.
    for r in [&r1, &r2, &r3] {
        until("every replica sees the disagreement", || async {
            let v = r.connector("east-1").await;
            v["replicas"]["sessions"] == 3
                && v["replicas"]["assignments"] == 2
                && v["replicas"]["disagreement"] == true
        })
        .await;
    }
    let v = r2.connector("east-1").await;
    assert_eq!(v["replicas"]["follows_this_replica"], false, "{v}");
    assert_eq!(v["replicas"]["agrees_with_followed"], false, "{v}");
    assert_ne!(
        v["replicas"]["assignment_hash"], v["replicas"]["followed_assignment_hash"],
        "{v}"
    );

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    for r in [r1, r2, r3] {
        r.stop().await;
    }
}
