//! The connector's status (`Heartbeat.status`) as the CA shows it: the
//! real connector agent's heartbeats fill `status` of `GET
//! /api/v1/connectors` (its version, its process's start, the applications
//! it serves, the bytes its session carried) and the per-connector gauges;
//! `ListConnectors` over gRPC carries the same; only administrators see
//! it; a heartbeat without a status (a connector
//! written before the field) is still taken, and shows none.

mod common;

use common::*;
use protocol::v1;
use serde_json::Value;

const ADMIN_TOKEN: &str = "tok-admin-Wq3vN8rZpL2xT6cY0mJ4hB7k";

/// The test config with a fast heartbeat, an admin token and a segment of
/// two IP entries for `dc-west` (which also serves `lab` and `legacy`: four
/// application entries in all, none of them a name to resolve).
fn config() -> String {
    let extra = format!(
        "{}\n[[api_tokens]]\nname = \"root\"\ntoken = \"{ADMIN_TOKEN}\"\nscopes = [\"admin\"]\n",
        segment("west-ips")
            .apps(["127.0.0.41", "127.0.0.42"])
            .tcp(["9"])
            .groups(["dc-west"])
            .toml()
    );
    config_text("heartbeat_interval_ms = 100", "", &extra)
}

/// `name`'s entry of `GET /api/v1/connectors` as `token` sees it.
async fn listed(ca: &Ca, name: &str, token: &str) -> Option<Value> {
    let (code, body) = ca.web().get_json("/api/v1/connectors", Some(token)).await;
    assert_eq!(code, 200, "{body}");
    body["connectors"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    i64::try_from(since.as_millis()).expect("fits")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_agents_status_is_listed_for_administrators() {
    let ca = Ca::start(&config()).await;
    let mut agent = agent_config(&ca, "status-agent", "st-1", "dc-west", KEY_WEST);
    // Never asked: dc-west has no name to resolve; it is what is reported.
    agent.dns_server = Some("127.0.0.1:5399".parse().expect("addr"));
    let (stop, task) = spawn_agent(agent);

    // The first heartbeat of a session may come before the bytes of the
    // first report were counted: wait for a status with traffic both ways.
    let status_now = || async {
        listed(&ca, "st-1", ADMIN_TOKEN)
            .await
            .map_or(Value::Null, |c| c["status"].clone())
    };
    let both_ways = |s: &Value| {
        s["bytes_sent"].as_u64().is_some_and(|n| n > 0)
            && s["bytes_received"].as_u64().is_some_and(|n| n > 0)
    };
    eventually("st-1's status with bytes sent and received", || async {
        both_ways(&status_now().await)
    })
    .await;
    let status = status_now().await;
    assert!(both_ways(&status), "{status}");
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"), "{status}");
    assert_eq!(status["os"], std::env::consts::OS, "{status}");
    assert_eq!(status["arch"], std::env::consts::ARCH, "{status}");
    assert_eq!(status["applications"], 4, "{status}");
    assert_eq!(
        status["dns_resolvers"],
        serde_json::json!(["127.0.0.1:5399"])
    );
    if cfg!(target_os = "linux") {
        // The agent runs in this process: its start is this process's.
        let started = status["process_started_at"].as_i64().expect("a start time");
        let booted = status["host_booted_at"].as_i64().expect("a boot time");
        assert!(
            booted > 0 && booted <= started && started <= now_ms(),
            "{status}"
        );
        assert!(
            status["process_memory_bytes"].as_u64() > Some(0),
            "{status}"
        );
        assert!(
            status["host_memory_total_bytes"].as_u64() > Some(0),
            "{status}"
        );
    }

    // Not for readers: the platform and DNS servers target a connector.
    let read = listed(&ca, "st-1", READ_TOKEN).await.expect("listed");
    assert!(read.get("status").is_none(), "{read}");

    // gRPC `ListConnectors` carries the same status, to administrators only.
    let wire = |token: &'static str| {
        let ca = &ca;
        async move {
            let mut req = tonic::Request::new(v1::ListConnectorsRequest {});
            req.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("ascii"),
            );
            v1::health_query_client::HealthQueryClient::new(ca.channel().await)
                .list_connectors(req)
                .await
                .expect("listed")
                .into_inner()
                .connectors
                .into_iter()
                .find(|c| c.name == "st-1")
                .expect("st-1 listed")
        }
    };
    let admin = wire(ADMIN_TOKEN).await;
    let on_wire = admin.status.as_ref().expect("a status over gRPC");
    assert_eq!(on_wire.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(on_wire.os, std::env::consts::OS);
    assert_eq!(on_wire.applications, 4);
    assert!(
        on_wire.bytes_sent > 0 && on_wire.bytes_received > 0,
        "{on_wire:?}"
    );
    assert!(on_wire.process_start_unix_ms > 0, "{on_wire:?}");
    assert!(admin.status_received_unix_ms > 0, "{admin:?}");
    let reader = wire(READ_TOKEN).await;
    assert_eq!((reader.status, reader.status_received_unix_ms), (None, 0));

    // Gauges per connector, the version as a label of the info series.
    let (code, metrics) = ca
        .web()
        .send("GET", "/metrics", Some(READ_TOKEN), None)
        .await;
    assert_eq!(code, 200);
    let info = format!(
        r#"reach_ca_connector_info{{connector="st-1",group="dc-west",version="{}",os="{}",arch="{}"}} 1"#,
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    for line in [
        info.as_str(),
        r#"reach_ca_connector_applications{connector="st-1",group="dc-west"} 4"#,
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no `{line}` in\n{metrics}"
        );
    }
    assert!(
        metrics.contains(r#"reach_ca_connector_sent_bytes{connector="st-1",group="dc-west"} "#),
        "{metrics}"
    );
    let _ = stop.send(());
    let _ = task.await;
    ca.stop().await;
}

#[tokio::test]
async fn a_heartbeat_without_status_is_taken_and_shows_none() {
    let ca = Ca::start(&config()).await;
    let (c, _) = connect(&ca, "old-1", "dc-west").await;
    // The common harness's heartbeat has no status, as an old connector's.
    c.heartbeat(v1::CheckLoad {
        targets: 7,
        ..Default::default()
    })
    .await;
    eventually("old-1's load listed", || async {
        listed(&ca, "old-1", ADMIN_TOKEN)
            .await
            .is_some_and(|c| c["load"]["targets"] == 7)
    })
    .await;
    let view = listed(&ca, "old-1", ADMIN_TOKEN).await.expect("listed");
    assert_eq!(view["connected"], true, "{view}");
    assert!(view.get("status").is_none(), "{view}");
    ca.stop().await;
}
