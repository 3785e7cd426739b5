//! Draining connectors before maintenance, against a CA in this process
//! over TLS with connectors played by real gRPC clients: an administrator's
//! drain under access load moves every decision to the other connector; the
//! last healthy one drains only when forced, and each drain is audited;
//! undrain restores it; `GET /api/v1/whatif` answers for a connector and a
//! group; a connector's own drain (`Drain`) lasts as long as its session;
//! the operator CLI (the real binary) drains, refuses and answers whatif.

mod common;

use std::time::{Duration, Instant};

use common::*;
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use tokio::sync::watch;

const ADMIN_TOKEN: &str = "tok-admin-PlQ7jmHXY1X2oyup1UokZXlp";

fn config() -> String {
    config_text(
        "",
        "discovery_timeout_ms = 400",
        &format!(
            "[[api_tokens]]\nname = \"root\"\ntoken = \"{ADMIN_TOKEN}\"\nscopes = [\"admin\"]\n"
        ),
    )
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"))
}

/// Keeps `conn`'s session alive: a heartbeat every second.
fn keepalive(conn: &Conn) -> tokio::task::JoinHandle<()> {
    let tx = conn.tx.clone();
    tokio::spawn(async move {
        loop {
            let beat = v1::ConnectorMessage {
                kind: Some(v1::connector_message::Kind::Heartbeat(v1::Heartbeat {
                    load: Some(v1::CheckLoad::default()),
                    replicas: None,
                    status: None,
                })),
            };
            if tx.send(beat).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// A connector session kept alive until dropped.
struct Alive {
    conn: Conn,
    beat: tokio::task::JoinHandle<()>,
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.beat.abort();
    }
}

impl std::ops::Deref for Alive {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        &self.conn
    }
}

impl std::ops::DerefMut for Alive {
    fn deref_mut(&mut self) -> &mut Conn {
        &mut self.conn
    }
}

/// A connector of `group` named `name`, kept alive, having reported
/// `apps` up.
async fn reporting(ca: &Ca, name: &str, group: &str, apps: &[(&str, &str, u32)]) -> Alive {
    let (conn, _) = connect(ca, name, group).await;
    let beat = keepalive(&conn);
    let entries = apps
        .iter()
        .map(|(segment, host, port)| app(segment, host, *port, &["127.0.0.21"], &[]))
        .collect();
    conn.report(entries, true).await;
    Alive { conn, beat }
}

/// Waits until jira's row lists each of `connectors` as up.
async fn jira_up_at(web: &Http, connectors: &[&str]) {
    eventually("jira is up at every connector", || async {
        web.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| {
                connectors.iter().all(|c| {
                    a["connectors"].as_array().is_some_and(|l| {
                        l.iter()
                            .any(|x| x["connector"] == *c && x["status"] == "up")
                    })
                })
            })
    })
    .await;
}

/// One access decision of the load: when it was asked, its status and the
/// connector it chose (or the refusal's reason).
#[derive(Debug)]
struct Decided {
    asked: Instant,
    status: u16,
    chosen: String,
}

/// Asks for jira continuously until `stop`; every decision made.
fn access_load(
    web: Http,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Vec<Decided>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        while !*stop.borrow_and_update() {
            let asked = Instant::now();
            let (status, v) = web.access("jira.test.reach", "tcp", 80).await;
            let chosen = v["connector"]
                .as_str()
                .or(v["error"]["reason"].as_str())
                .unwrap_or("?")
                .to_owned();
            out.push(Decided {
                asked,
                status,
                chosen,
            });
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        out
    })
}

/// `POST path` as the admin: status and JSON body.
async fn admin(web: &Http, path: &str) -> (u16, serde_json::Value) {
    let (s, body) = web.send("POST", path, Some(ADMIN_TOKEN), None).await;
    (s, json(&body))
}

/// The explanation's note of candidate `name` in an access answer.
fn candidate<'a>(answer: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    answer["explanation"]["candidates"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["connector"] == name))
        .unwrap_or_else(|| panic!("no candidate {name}: {answer}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_moves_every_decision_to_the_other_connector_and_the_last_drains_only_when_forced()
{
    let ca = Ca::start(&config()).await;
    let web = ca.web();
    let jira = [("jira", "jira.test.reach", 80)];
    let _e1 = reporting(&ca, "east-1", "dc-east", &jira).await;
    let _e2 = reporting(&ca, "east-2", "dc-east", &jira).await;
    jira_up_at(&web, &["east-1", "east-2"]).await;

    let (stop, stopped) = watch::channel(false);
    let load = access_load(ca.web(), stopped);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, v) = admin(&web, "/api/v1/connectors/east-1/drain").await;
    let drained_at = Instant::now();
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (&v["drained"], &v["already"], &v["forced"], &v["stranded"]),
        (&true.into(), &false.into(), &false.into(), &0.into()),
        "{v}"
    );
    assert_eq!(
        v["by"],
        serde_json::json!({"kind": "token", "name": "root"})
    );
    tokio::time::sleep(Duration::from_millis(800)).await;

    // The last healthy connector: refused, naming what it would strand.
    let (s, v) = admin(&web, "/api/v1/connectors/east-2/drain").await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["error"]["reason"], "last_healthy_connector", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("jira: jira.test.reach:80/tcp"),
        "{message}"
    );
    let row = &v["whatif"]["applications"][0];
    assert_eq!(
        (
            &row["segment"],
            &row["stranded"],
            &row["losing"],
            &row["left"]
        ),
        (
            &"jira".into(),
            &true.into(),
            &serde_json::json!(["east-2"]),
            &serde_json::json!([])
        ),
        "{v}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.send(true).expect("load runs");
    let decisions = load.await.expect("load");

    // No decision failed, and none asked after the drain chose east-1.
    assert!(decisions.iter().all(|d| d.status == 200), "{decisions:?}");
    let after: Vec<&Decided> = decisions.iter().filter(|d| d.asked > drained_at).collect();
    assert!(
        after.len() > 10,
        "{} decisions after the drain",
        after.len()
    );
    assert!(after.iter().all(|d| d.chosen == "east-2"), "{after:?}");
    let (s, answer) = web.access("jira.test.reach", "tcp", 80).await;
    assert_eq!(s, 200, "{answer}");
    let note = candidate(&answer, "east-1");
    assert_eq!(note["eligible"], false, "{answer}");
    assert_eq!(note["reason"], "drained: selected for no new access");

    // Forced: drained, and every access is refused as all drained.
    let (s, v) = admin(&web, "/api/v1/connectors/east-2/drain?force=true").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (&v["forced"], &v["stranded"]),
        (&true.into(), &1.into()),
        "{v}"
    );
    let (s, answer) = web.access("jira.test.reach", "tcp", 80).await;
    assert_eq!(s, 503, "{answer}");
    assert_eq!(answer["error"]["reason"], "all_drained", "{answer}");

    // Each drain is audited, the refused one too.
    let (s, audit) = web
        .get_json("/api/v1/audit?action=connector.drain", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(s, 200, "{audit}");
    let entries = audit["entries"].as_array().expect("entries");
    let seen: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| {
            (
                e["target"].as_str().unwrap_or(""),
                e["outcome"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [("east-2", "ok"), ("east-2", "refused"), ("east-1", "ok")],
        "{audit}"
    );
    assert!(
        entries[0]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("\"forced\":true")),
        "{audit}"
    );
    assert!(
        entries[1]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("jira.test.reach:80/tcp")),
        "{audit}"
    );

    // The connector list shows both drains.
    let (_, list) = web.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
    let drain_of = |name: &str| {
        list["connectors"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["name"] == name))
            .map(|c| c["drained"].clone())
            .unwrap_or_default()
    };
    assert_eq!(drain_of("east-1")["by"]["name"], "root", "{list}");
    assert!(drain_of("east-1")["since"].as_i64().is_some_and(|t| t > 0));

    // Draining a drained connector changes nothing; undrain restores it.
    let (s, v) = admin(&web, "/api/v1/connectors/east-2/drain").await;
    assert_eq!((s, &v["already"]), (200, &true.into()), "{v}");
    let (s, v) = admin(&web, "/api/v1/connectors/east-1/undrain").await;
    assert_eq!((s, &v["was_drained"]), (200, &true.into()), "{v}");
    let (s, answer) = web.access("jira.test.reach", "tcp", 80).await;
    assert_eq!(
        (s, &answer["connector"]),
        (200, &"east-1".into()),
        "{answer}"
    );
    let (s, v) = admin(&web, "/api/v1/connectors/east-1/undrain").await;
    assert_eq!((s, &v["was_drained"]), (200, &false.into()), "{v}");
    assert!(drain_of_now(&web, "east-1").await.is_null());
    for path in [
        "/api/v1/connectors/nobody/drain",
        "/api/v1/connectors/nobody/undrain",
    ] {
        let (s, v) = admin(&web, path).await;
        assert_eq!(
            (s, &v["error"]["reason"]),
            (404, &"not_found".into()),
            "{v}"
        );
    }
    let (s, v) = admin(&web, "/api/v1/connectors/east-1/drain?force=yes").await;
    assert_eq!(s, 400, "{v}");
    // Read scope is not enough to drain.
    let (s, _) = web
        .send(
            "POST",
            "/api/v1/connectors/east-1/drain",
            Some(READ_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 403);
    ca.stop().await;
}

/// `GET /api/v1/connectors`' `drained` of connector `name`, now.
async fn drain_of_now(web: &Http, name: &str) -> serde_json::Value {
    let (_, list) = web.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
    list["connectors"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == name))
        .map(|c| c["drained"].clone())
        .unwrap_or_default()
}

/// `GET /api/v1/whatif?without=…` with `token`: status and body.
async fn whatif(web: &Http, without: &str, token: &str) -> (u16, serde_json::Value) {
    web.get_json(&format!("/api/v1/whatif?without={without}"), Some(token))
        .await
}

/// Each application row of a whatif answer as (segment, host, losing,
/// left, stranded).
fn rows(v: &serde_json::Value) -> Vec<(String, String, String, String, bool)> {
    let names = |l: &serde_json::Value| {
        l.as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|n| n.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default()
    };
    v["applications"]
        .as_array()
        .map(|l| {
            l.iter()
                .map(|a| {
                    (
                        a["segment"].as_str().unwrap_or("").to_owned(),
                        a["host"].as_str().unwrap_or("(all)").to_owned(),
                        names(&a["losing"]),
                        names(&a["left"]),
                        a["stranded"] == true,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn row(
    segment: &str,
    host: &str,
    losing: &str,
    left: &str,
    stranded: bool,
) -> (String, String, String, String, bool) {
    (
        segment.into(),
        host.into(),
        losing.into(),
        left.into(),
        stranded,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatif_names_the_applications_a_connector_or_a_group_would_strand() {
    let ca = Ca::start(&config()).await;
    let web = ca.web();
    let payroll = ("payroll", "payroll.test.reach", 443);
    let jira = ("jira", "jira.test.reach", 80);
    let _e1 = reporting(&ca, "east-1", "dc-east", &[jira, payroll]).await;
    let _e2 = reporting(&ca, "east-2", "dc-east", &[jira]).await;
    // dc-west serves `legacy` (health_reporting = none): connected is enough.
    let (w1, _) = connect(&ca, "west-1", "dc-west").await;
    keepalive(&w1);
    jira_up_at(&web, &["east-1", "east-2"]).await;
    eventually("payroll stored", || async {
        let (_, v) = whatif(&web, "east-1", ADMIN_TOKEN).await;
        v["stranded"] == 1
    })
    .await;

    // One connector: jira keeps east-2; payroll (hidden from read tokens)
    // would be stranded, counted but listed only for the admin scope.
    let (s, v) = whatif(&web, "east-1", READ_TOKEN).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["without"], serde_json::json!(["east-1"]));
    assert_eq!(
        (&v["stranded"], &v["hidden_stranded"]),
        (&1.into(), &1.into()),
        "{v}"
    );
    assert_eq!(
        rows(&v),
        [row("jira", "jira.test.reach", "east-1", "east-2", false)]
    );
    let (_, v) = whatif(&web, "east-1", ADMIN_TOKEN).await;
    assert_eq!(
        rows(&v),
        [
            row("payroll", "payroll.test.reach", "east-1", "", true),
            row("jira", "jira.test.reach", "east-1", "east-2", false),
        ],
        "{v}"
    );
    assert_eq!(v["hidden_stranded"], 0);

    // A group: every connector of it.
    let (s, v) = whatif(&web, "dc-east", ADMIN_TOKEN).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["without"], serde_json::json!(["east-1", "east-2"]));
    assert_eq!(
        rows(&v),
        [
            row("jira", "jira.test.reach", "east-1,east-2", "", true),
            row("payroll", "payroll.test.reach", "east-1", "", true),
        ],
        "{v}"
    );
    // A `none` segment's applications, as one row.
    let (_, v) = whatif(&web, "west-1", READ_TOKEN).await;
    assert_eq!(
        rows(&v),
        [row("legacy", "(all)", "west-1", "", true)],
        "{v}"
    );
    assert_eq!(v["applications"][0]["health_reporting"], "none");
    let (_, v) = whatif(&web, "east-2,west-1", READ_TOKEN).await;
    assert_eq!(v["stranded"], 1, "{v}");
    assert_eq!(rows(&v).len(), 2, "{v}");
    // A drained connector carries nothing already: nothing to lose.
    let (s, _) = admin(&web, "/api/v1/connectors/east-2/drain").await;
    assert_eq!(s, 200);
    let (_, v) = whatif(&web, "east-1", READ_TOKEN).await;
    assert_eq!(
        rows(&v),
        [row("jira", "jira.test.reach", "east-1", "", true)],
        "{v}"
    );
    let (_, v) = whatif(&web, "east-2", READ_TOKEN).await;
    assert_eq!(rows(&v), [], "{v}");
    let (s, _) = admin(&web, "/api/v1/connectors/east-2/undrain").await;
    assert_eq!(s, 200);

    // Names: unknown, malformed, missing, ambiguous.
    let (s, v) = whatif(&web, "nobody", READ_TOKEN).await;
    assert_eq!(
        (s, &v["error"]["reason"]),
        (404, &"not_found".into()),
        "{v}"
    );
    for bad in ["a%20b", "connectr:east-1", ""] {
        let (s, v) = whatif(&web, bad, READ_TOKEN).await;
        assert_eq!(
            (s, &v["error"]["reason"]),
            (400, &"invalid_request".into()),
            "{bad}: {v}"
        );
    }
    let (s, _) = web.get_json("/api/v1/whatif", Some(READ_TOKEN)).await;
    assert_eq!(s, 400);
    let (named_like_a_group, _) = connect(&ca, "dc-west", "dc-west").await;
    keepalive(&named_like_a_group);
    let (s, v) = whatif(&web, "dc-west", READ_TOKEN).await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("connector:dc-west or group:dc-west")),
        "{v}"
    );
    let (_, v) = whatif(&web, "connector:dc-west", READ_TOKEN).await;
    assert_eq!(v["without"], serde_json::json!(["dc-west"]), "{v}");
    let (_, v) = whatif(&web, "group:dc-west", READ_TOKEN).await;
    assert_eq!(
        v["without"],
        serde_json::json!(["dc-west", "west-1"]),
        "{v}"
    );
    // Reading it takes the read scope; it changes nothing.
    let (s, _) = web.get_json("/api/v1/whatif?without=east-1", None).await;
    assert_eq!(s, 401);
    let (s, answer) = web.access("jira.test.reach", "tcp", 80).await;
    assert_eq!(s, 200, "{answer}");
    assert!(drain_of_now(&web, "east-1").await.is_null());
    ca.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connector_that_drains_itself_carries_no_new_access_until_its_session_ends() {
    let ca = Ca::start(&config()).await;
    let web = ca.web();
    let jira = [("jira", "jira.test.reach", 80)];
    let mut e1 = reporting(&ca, "east-1", "dc-east", &jira).await;
    let mut e2 = reporting(&ca, "east-2", "dc-east", &jira).await;
    jira_up_at(&web, &["east-1", "east-2"]).await;
    e1.drain(5_000).await;
    eventually("east-1's drain is in force", || async {
        let (_, answer) = web.access("jira.test.reach", "tcp", 80).await;
        candidate(&answer, "east-1")["reason"] == "drained: selected for no new access"
    })
    .await;
    for _ in 0..50 {
        let (s, answer) = web.access("jira.test.reach", "tcp", 80).await;
        assert_eq!(
            (s, &answer["connector"]),
            (200, &"east-2".into()),
            "{answer}"
        );
    }
    let d = drain_of_now(&web, "east-1").await;
    assert_eq!(
        d["by"],
        serde_json::json!({"kind": "connector", "name": "east-1"})
    );
    let (since, until) = (d["since"].as_i64(), d["until"].as_i64());
    assert!(
        matches!((since, until), (Some(s), Some(u)) if u > s && u - s <= 5_000),
        "{d}"
    );
    // On-access: the access goes to east-2 only; nobody waits on east-1.
    let (_, answer) = web.access("x.lab.test.reach", "tcp", 8000).await;
    assert_eq!(
        answer["explanation"]["forwarded_to"],
        serde_json::json!(["east-2"]),
        "{answer}"
    );
    let mut e2_got = false;
    while let Some(m) = e2.next_within(Duration::from_millis(500)).await {
        e2_got |= matches!(m, Out::Access(_));
    }
    assert!(e2_got, "east-2 got the access");
    while let Some(m) = e1.next_within(Duration::from_millis(500)).await {
        assert!(
            !matches!(m, Out::Access(_)),
            "a drained connector got {m:?}"
        );
    }
    // Its next session is not drained.
    drop(e1);
    eventually("east-1's session ended", || async {
        drain_of_now(&web, "east-1").await.is_null()
    })
    .await;
    let again = reporting(&ca, "east-1", "dc-east", &jira).await;
    eventually("east-1 is chosen again", || async {
        let (_, answer) = web.access("jira.test.reach", "tcp", 80).await;
        answer["connector"] == "east-1"
    })
    .await;
    // Both drain themselves: refused as all drained.
    again.drain(0).await;
    e2.drain(0).await;
    eventually("both drains are in force", || async {
        let (s, answer) = web.access("jira.test.reach", "tcp", 80).await;
        s == 503 && answer["error"]["reason"] == "all_drained"
    })
    .await;
    ca.stop().await;
}

/// `central-authority api …` (the real binary) against `ca` with `token`:
/// (exit code, stdout, stderr).
async fn cli(ca: &Ca, token: &str, args: &[&str]) -> (i32, String, String) {
    let dir = scratch_dir("cli");
    let (root, token_file) = (dir.join("ca.pem"), dir.join("token"));
    std::fs::write(&root, ca.root()).expect("write root");
    std::fs::write(&token_file, format!("{token}\n")).expect("write token");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_central-authority"));
    cmd.arg("api")
        .arg("--url")
        .arg(format!("https://{}", ca.http))
        .arg("--ca-cert")
        .arg(&root)
        .arg("--token-file")
        .arg(&token_file)
        .args(args)
        .env_remove("REACH_API_TOKEN");
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("run the CLI");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_drains_refuses_with_the_list_forces_and_answers_whatif() {
    let ca = Ca::start(&config()).await;
    let web = ca.web();
    let jira = [("jira", "jira.test.reach", 80)];
    let _e1 = reporting(&ca, "east-1", "dc-east", &jira).await;
    let _e2 = reporting(&ca, "east-2", "dc-east", &jira).await;
    jira_up_at(&web, &["east-1", "east-2"]).await;

    let (code, out, err) = cli(&ca, READ_TOKEN, &["whatif", "--without", "east-1"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("jira     jira.test.reach  tcp    80    continuous  east-1  east-2"),
        "{out}"
    );
    let (code, out, err) = cli(&ca, READ_TOKEN, &["whatif", "--without", "dc-east"]).await;
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        out.contains("1 would be left without a healthy, undrained connector"),
        "{out}"
    );
    let (code, out, _) = cli(
        &ca,
        READ_TOKEN,
        &[
            "--json",
            "whatif",
            "--without",
            "east-1",
            "--without",
            "east-2",
        ],
    )
    .await;
    assert_eq!(code, 3, "{out}");
    assert_eq!(
        json(&out)["without"],
        serde_json::json!(["east-1", "east-2"])
    );

    let (code, out, err) = cli(&ca, ADMIN_TOKEN, &["connectors", "drain", "east-1"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("drained=true") && out.contains("forced=false"),
        "{out}"
    );
    let (code, out, err) = cli(&ca, ADMIN_TOKEN, &["connectors", "drain", "east-2"]).await;
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        out.starts_with("refused: draining \"east-2\" would leave 1 application(s)"),
        "{out}"
    );
    assert!(
        out.contains("jira     jira.test.reach  tcp    80    continuous  east-2  none"),
        "{out}"
    );
    let (code, out, err) = cli(
        &ca,
        ADMIN_TOKEN,
        &["connectors", "drain", "east-2", "--force"],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("forced=true") && out.contains("stranded=1"),
        "{out}"
    );
    let (code, out, _) = cli(&ca, READ_TOKEN, &["connectors"]).await;
    assert_eq!(code, 0);
    let east1 = out
        .lines()
        .find(|l| l.starts_with("east-1"))
        .expect("east-1 listed");
    assert!(east1.ends_with("by token:root"), "{out}");
    let (code, out, err) = cli(&ca, ADMIN_TOKEN, &["connectors", "undrain", "east-1"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("was_drained=true"), "{out}");
    let (code, _, err) = cli(&ca, ADMIN_TOKEN, &["connectors", "drain", "nobody"]).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("404") && err.contains("not_found"), "{err}");
    ca.stop().await;
}
