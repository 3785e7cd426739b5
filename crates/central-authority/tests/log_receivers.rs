//! Log streaming from a real CA: a JSON receiver on loopback gets an
//! access decision, a health transition, the connector's status and an
//! audit entry, each with its documented fields; `GET
//! /api/v1/log_receivers` shows the receiver; a reload adds a receiver
//! that then gets records too.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio::net::TcpListener;

const ADMIN_TOKEN: &str = "tok-admin-Wq3vN8rZpL2xT6cY0mJ4hB7k";

/// A JSON-lines receiver on loopback: every record it got.
async fn receiver() -> (u16, Arc<Mutex<Vec<Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let records = got.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let records = records.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(conn).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let v: Value = serde_json::from_str(&line).expect("a JSON object per line");
                    records.lock().expect("records").push(v);
                }
            });
        }
    });
    (port, got)
}

fn config(receivers: &str) -> String {
    let extra = format!(
        "[[api_tokens]]\nname = \"root\"\ntoken = \"{ADMIN_TOKEN}\"\nscopes = [\"admin\"]\n{receivers}"
    );
    config_text(
        "heartbeat_interval_ms = 100",
        "discovery_timeout_ms = 400",
        &extra,
    )
}

fn json_receiver(name: &str, port: u16, types: &str) -> String {
    format!(
        "\n[[log_receivers]]\nname = \"{name}\"\ndestination = \"tcp://127.0.0.1:{port}\"\nformat = \"json\"\n{types}\n"
    )
}

fn first(records: &Mutex<Vec<Value>>, f: impl Fn(&Value) -> bool) -> Option<Value> {
    records
        .lock()
        .expect("records")
        .iter()
        .find(|r| f(r))
        .cloned()
}

async fn arrives(what: &str, records: &Mutex<Vec<Value>>, f: impl Fn(&Value) -> bool) -> Value {
    eventually(what, || std::future::ready(first(records, &f).is_some())).await;
    first(records, f).expect("arrived")
}

/// The common fields: the type, an RFC 3339 UTC time, the replica, a seq.
fn common_fields(r: &Value, kind: &str, replica: &str) {
    assert_eq!(r["type"], kind, "{r}");
    let time = r["time"].as_str().expect("time");
    assert!(
        time.len() == 24 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "{r}"
    );
    assert_eq!(r["replica"], replica, "{r}");
    assert!(r["seq"].is_u64(), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_ca_streams_every_record_type_and_a_reload_adds_a_receiver() {
    let (port, records) = receiver().await;
    let dir = scratch_dir("log-receivers");
    let path = dir.join("ca.toml");
    std::fs::write(&path, config(&json_receiver("siem", port, ""))).expect("write");
    let ca = Ca::start_file(&path).await;
    let web = ca.web();

    // A connector: connected, then a heartbeat.
    let (conn, _) = connect(&ca, "east-1", "dc-east").await;
    // Heartbeats every interval, as a connector sends them.
    let beat = conn.tx.clone();
    let beating = tokio::spawn(async move {
        let heartbeat = || protocol::v1::ConnectorMessage {
            kind: Some(protocol::v1::connector_message::Kind::Heartbeat(
                protocol::v1::Heartbeat {
                    load: Some(protocol::v1::CheckLoad::default()),
                    replicas: None,
                    status: None,
                },
            )),
        };
        while beat.send(heartbeat()).await.is_ok() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    });
    let connected = arrives("east-1 connected", &records, |r| {
        r["type"] == "connector_status" && r["event"] == "connected"
    })
    .await;
    let replica = ca.authority.replica_id().expect("a replica id").to_owned();
    common_fields(&connected, "connector_status", &replica);
    assert_eq!(connected["connector"], "east-1", "{connected}");
    assert_eq!(connected["group"], "dc-east", "{connected}");
    assert_eq!(connected["status"], "online", "{connected}");
    assert!(
        connected["address"]
            .as_str()
            .is_some_and(|a| a.starts_with("127.0.0.1:")),
        "{connected}"
    );
    arrives("a heartbeat", &records, |r| {
        r["type"] == "connector_status" && r["event"] == "heartbeat" && r["connector"] == "east-1"
    })
    .await;

    // A health transition: jira's 127.0.0.21:80 goes up on east-1.
    conn.report(
        vec![app("jira", "127.0.0.21", 80, &["127.0.0.21"], &[])],
        true,
    )
    .await;
    let health = arrives("jira up on east-1", &records, |r| {
        r["type"] == "health" && r["to"] == "up"
    })
    .await;
    common_fields(&health, "health", &replica);
    for (field, value) in [
        ("application", Value::from("127.0.0.21")),
        ("protocol", "tcp".into()),
        ("port", 80.into()),
        ("segment", "jira".into()),
        ("group", "dc-east".into()),
        ("connector", "east-1".into()),
        ("from", "unknown".into()),
    ] {
        assert_eq!(health[field], value, "{field} of {health}");
    }

    // An access decision.
    let (code, decision) = web.access("127.0.0.21", "tcp", 80).await;
    assert_eq!(code, 200, "{decision}");
    let access = arrives("the access decision", &records, |r| r["type"] == "access").await;
    common_fields(&access, "access", &replica);
    for (field, value) in [
        ("host", Value::from("127.0.0.21")),
        ("port", 80.into()),
        ("protocol", "tcp".into()),
        ("segment", "jira".into()),
        ("decision", "allowed".into()),
        ("connector", "east-1".into()),
        ("group", "dc-east".into()),
        ("candidates_healthy", 1.into()),
        ("candidates_total", 1.into()),
    ] {
        assert_eq!(access[field], value, "{field} of {access}");
    }
    for timing in ["match_us", "select_us", "total_us"] {
        assert!(access[timing].is_u64(), "{timing} of {access}");
    }
    assert!(access["request_id"].is_string(), "{access}");

    // An audit entry: an admin action on a connector nobody enrolled.
    let (code, body) = web
        .send(
            "POST",
            "/api/v1/connectors/nobody/disable",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(code, 404, "{body}");
    let audit = arrives("the audit entry", &records, |r| r["type"] == "audit").await;
    common_fields(&audit, "audit", &replica);
    assert_eq!(audit["actor"], "token root", "{audit}");
    assert_eq!(audit["action"], "connector.disable", "{audit}");
    assert_eq!(audit["target"], "nobody", "{audit}");
    assert_eq!(audit["outcome"], "not_found", "{audit}");
    assert_eq!(audit["source"], "127.0.0.1", "{audit}");

    // Each record once, numbered in order.
    let seqs: Vec<u64> = records
        .lock()
        .expect("records")
        .iter()
        .map(|r| r["seq"].as_u64().expect("seq"))
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");

    // The API shows the receiver (administrators only).
    let (code, listed) = web
        .get_json("/api/v1/log_receivers", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(code, 200, "{listed}");
    let siem = &listed["log_receivers"][0];
    assert_eq!(siem["name"], "siem", "{listed}");
    assert_eq!(siem["destination"], format!("tcp://127.0.0.1:{port}"));
    assert_eq!(siem["format"], "json");
    assert_eq!(siem["connected"], true, "{listed}");
    assert!(siem["sent_total"].as_u64() >= Some(5), "{listed}");
    assert_eq!(siem["dropped_total"], 0, "{listed}");
    let (code, _) = web
        .get_json("/api/v1/log_receivers", Some(READ_TOKEN))
        .await;
    assert_eq!(code, 403);
    // And so does the CLI.
    let out = cli(&ca, &["log-receivers"]).await;
    let line = out.lines().nth(1).unwrap_or_default();
    assert!(out.starts_with("NAME"), "{out}");
    assert!(
        line.starts_with("siem")
            && line.contains(&format!("tcp://127.0.0.1:{port}"))
            && line.contains(" json ")
            && line.contains(" yes "),
        "{out}"
    );

    // A reload adds a receiver of audit records only.
    let (second_port, second) = receiver().await;
    let both = format!(
        "{}{}",
        json_receiver("siem", port, ""),
        json_receiver("audit-only", second_port, "types = [\"audit\"]")
    );
    std::fs::write(&path, config(&both)).expect("write");
    eventually("two receivers listed", || async {
        let (_, listed) = web
            .get_json("/api/v1/log_receivers", Some(ADMIN_TOKEN))
            .await;
        listed["log_receivers"].as_array().map(Vec::len) == Some(2)
    })
    .await;
    let reload = arrives("the reload's audit entry", &second, |r| {
        r["type"] == "audit" && r["action"] == "config.reload"
    })
    .await;
    common_fields(&reload, "audit", &replica);
    assert!(
        first(&second, |r| r["type"] != "audit").is_none(),
        "audit records only"
    );
    // The first receiver kept its connection and numbering.
    let again = arrives("the reload on the first receiver too", &records, |r| {
        r["action"] == "config.reload"
    })
    .await;
    assert!(
        again["seq"].as_u64() > Some(*seqs.last().expect("seqs")),
        "{again}"
    );
    beating.abort();
    drop(conn);
    ca.stop().await;
}

/// `central-authority api ARGS` against `ca` with the admin token: its
/// output (it must exit 0).
async fn cli(ca: &Ca, args: &[&str]) -> String {
    let dir = scratch_dir("log-receivers-cli");
    let cert = dir.join("ca.pem");
    std::fs::write(&cert, ca.root()).expect("write root");
    let token = dir.join("token");
    std::fs::write(&token, format!("{ADMIN_TOKEN}\n")).expect("write token");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_central-authority"));
    cmd.arg("api")
        .args(["--url", &format!("https://{}", ca.http)])
        .arg("--ca-cert")
        .arg(&cert)
        .arg("--token-file")
        .arg(&token)
        .args(args)
        .env_remove("REACH_API_TOKEN")
        .env_remove("REACH_API_URL");
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("run central-authority");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// A heartbeat every replica receives is written by the replica whose
/// session the connector follows: one that says it follows another
/// replica's session writes no record; one that follows this session does,
/// with the connector's status, and so does its drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_followed_replica_writes_a_connectors_heartbeat() {
    use protocol::v1;
    let (port, records) = receiver().await;
    let ca = Ca::start(&config(&json_receiver("siem", port, ""))).await;
    let (conn, _) = connect(&ca, "east-1", "dc-east").await;
    let heartbeat = |follows: bool, version: &str| v1::ConnectorMessage {
        kind: Some(v1::connector_message::Kind::Heartbeat(v1::Heartbeat {
            load: Some(v1::CheckLoad::default()),
            replicas: Some(v1::ReplicaAttachment {
                sessions: 2,
                assignments: 1,
                follows_this_session: follows,
                agrees_with_followed: true,
                ..Default::default()
            }),
            status: Some(Box::new(v1::ConnectorStatus {
                version: version.to_owned(),
                os: "linux".to_owned(),
                applications: 3,
                ..Default::default()
            })),
        })),
    };
    for _ in 0..3 {
        conn.tx
            .send(heartbeat(false, "elsewhere"))
            .await
            .expect("send");
    }
    conn.tx
        .send(heartbeat(true, "followed"))
        .await
        .expect("send");
    let followed = arrives("the followed heartbeat", &records, |r| {
        r["event"] == "heartbeat"
    })
    .await;
    assert_eq!(followed["version"], "followed", "{followed}");
    assert_eq!(followed["os"], "linux", "{followed}");
    assert_eq!(followed["applications"], 3, "{followed}");
    assert_eq!(followed["status"], "online", "{followed}");
    conn.drain(0).await;
    let drained = arrives("the drain", &records, |r| r["event"] == "drained").await;
    assert_eq!(drained["status"], "draining", "{drained}");
    assert!(
        first(&records, |r| r["version"] == "elsewhere").is_none(),
        "a heartbeat another replica writes was written here"
    );
    drop(conn);
    let gone = arrives("the disconnect", &records, |r| r["event"] == "disconnected").await;
    assert_eq!(gone["status"], "offline", "{gone}");
    ca.stop().await;
}
