//! Addresses remembered across DNS changes, with a real connector (the
//! agent library, in this process) resolving through a real DNS server
//! (hickory-server on loopback) whose zone changes while it runs: the
//! address that left the answer stays in the application's view with when
//! it left and its last result.

mod common;

use std::time::Duration;

use common::*;
use test_support::DnsServer;

const HOST: &str = "app.moving.test";

/// Waits up to `limit` for `f`, checking every 100 ms; panics with `what`
/// and the last value `f` saw.
async fn wait_for<F, Fut>(what: &str, limit: Duration, mut f: F) -> serde_json::Value
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (bool, serde_json::Value)>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let (done, v) = f().await;
        if done {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out: {what}: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The address entry `ip` of an application answer.
fn entry<'a>(v: &'a serde_json::Value, ip: &str) -> Option<&'a serde_json::Value> {
    v["address_history"]
        .as_array()?
        .iter()
        .find(|a| a["address"] == ip)
}

/// `app.moving.test` answers 127.0.31.1 (a listening port: Up) and
/// 127.0.31.2 (nothing listens: Down). Once 127.0.31.2 leaves the zone,
/// the connector re-resolves (TTL 1 s) and checks 127.0.31.1 only; the
/// application still lists 127.0.31.2, Down as last checked, with the time
/// it left, after the time it appeared; 127.0.31.1 stays in the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_leaves_the_answer_is_remembered() {
    let listener = std::net::TcpListener::bind("127.0.31.1:0").expect("listens on 127.0.31.1");
    let port = listener.local_addr().expect("address").port();
    let up: std::net::IpAddr = "127.0.31.1".parse().expect("ip");
    let leaving: std::net::IpAddr = "127.0.31.2".parse().expect("ip");
    let dns = DnsServer::start_with_ttl(
        ([127, 0, 0, 1], 0).into(),
        "moving.test",
        &[(HOST, up), (HOST, leaving)],
        1,
    )
    .await
    .expect("DNS server");
    let text = config_text(
        "",
        "",
        &Segment::new("moving")
            .apps([HOST])
            .tcp([port])
            .interval_ms(300)
            .groups(["dc-east"])
            .toml(),
    );
    let ca = Ca::start(&text).await;
    let mut config = agent_config(&ca, "moving", "east-1", "dc-east", KEY_EAST);
    config.dns_server = Some(dns.addr());
    config.dns_stale_grace_s = 0;
    config.check_timeout_ms = 1000;
    let (stop, agent) = spawn_agent(config);
    let http = ca.web();
    let path = format!("/api/v1/application?segment=moving&host={HOST}&protocol=tcp&port={port}");
    let answer = || async {
        let (s, v) = http.get_json(&path, Some(READ_TOKEN)).await;
        if s == 200 { v } else { serde_json::Value::Null }
    };
    let before = wait_for(
        "both addresses checked",
        Duration::from_secs(20),
        || async {
            let v = answer().await;
            let ok = entry(&v, "127.0.31.1").is_some_and(|e| e["status"] == "up")
                && entry(&v, "127.0.31.2").is_some_and(|e| e["status"] == "down");
            (ok, v)
        },
    )
    .await;
    for ip in ["127.0.31.1", "127.0.31.2"] {
        let e = entry(&before, ip).expect("listed");
        assert!(e["left"].is_null(), "{before}");
        assert_eq!(e["connector"], "east-1", "{before}");
    }
    let removed_at = central_authority::ground::clock::now_ms();
    dns.remove(HOST, leaving).await.expect("removes the record");
    let after = wait_for("127.0.31.2 left", Duration::from_secs(20), || async {
        let v = answer().await;
        let ok = entry(&v, "127.0.31.2").is_some_and(|e| e["left"].is_i64());
        (ok, v)
    })
    .await;
    let gone = entry(&after, "127.0.31.2").expect("still listed");
    assert_eq!(gone["status"], "down", "its last result: {after}");
    let left = gone["left"].as_i64().unwrap_or(0);
    assert!(
        left >= removed_at,
        "left {left} before the change {removed_at}: {after}"
    );
    assert!(
        gone["appeared"].as_i64().unwrap_or(i64::MAX) < removed_at,
        "{after}"
    );
    assert!(
        gone["last_seen"].as_i64().unwrap_or(i64::MAX) <= left,
        "{after}"
    );
    let kept = entry(&after, "127.0.31.1").expect("listed");
    assert!(kept["left"].is_null() && kept["status"] == "up", "{after}");
    // Present addresses are listed first, then those that left.
    assert_eq!(
        after["address_history"][0]["address"], "127.0.31.1",
        "{after}"
    );
    // The connector's latest result holds the address in the answer only.
    let addresses: Vec<&str> = after["application"]["connectors"][0]["addresses"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["address"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(addresses, ["127.0.31.1"], "{after}");
    // The address history (`GET /api/v1/events?address=`, stored): the
    // address that left appeared Down and left, newest first, at the times
    // the application's answer gives.
    let app = format!("moving/{HOST}/tcp/{port}");
    let events = |address: &str| {
        let path = format!("/api/v1/events?app={app}&address={address}");
        let http = &http;
        async move {
            let (s, v) = http.get_json(&path, Some(READ_TOKEN)).await;
            assert_eq!(s, 200, "{v}");
            v
        }
    };
    let stored = wait_for("the change stored", Duration::from_secs(10), || async {
        let v = events("127.0.31.2").await;
        (v["total"] == 2, v)
    })
    .await;
    let change = |e: &serde_json::Value| {
        (
            e["address"].as_str().unwrap_or("").to_owned(),
            e["from"].as_str().unwrap_or("").to_owned(),
            e["to"].as_str().unwrap_or("").to_owned(),
            e["cause"].as_str().unwrap_or("").to_owned(),
            e["connector"].as_str().unwrap_or("").to_owned(),
        )
    };
    let seen: Vec<_> = stored["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(change)
        .collect();
    let expect = |from: &str, to: &str, cause: &str| {
        (
            "127.0.31.2".to_owned(),
            from.to_owned(),
            to.to_owned(),
            cause.to_owned(),
            "east-1".to_owned(),
        )
    };
    assert_eq!(
        seen,
        [
            expect("down", "unknown", "left"),
            expect("unknown", "down", "appeared")
        ],
        "{stored}"
    );
    assert_eq!(stored["events"][0]["at"].as_i64(), Some(left), "{stored}");
    assert_eq!(stored["events"][1]["at"], gone["appeared"], "{stored}");
    // Every address of the application; the status history holds none.
    let all = events("*").await;
    assert!(all["total"].as_u64().unwrap_or(0) >= 3, "{all}");
    let (s, statuses) = http
        .get_json(&format!("/api/v1/events?app={app}"), Some(READ_TOKEN))
        .await;
    assert_eq!(s, 200, "{statuses}");
    assert!(
        statuses["events"]
            .as_array()
            .into_iter()
            .flatten()
            .all(|e| e.get("address").is_none()),
        "{statuses}"
    );
    let (s, bad) = http
        .get_json("/api/v1/events?address=nowhere", Some(READ_TOKEN))
        .await;
    assert_eq!(s, 400, "{bad}");
    let _ = stop.send(());
    let _ = agent.await;
    drop(listener);
    dns.stop().await;
    ca.stop().await;
}

/// The address history of `jira.test.reach`'s `address` (`*`: every
/// address), newest first: (address, from, to, cause, connector) of each
/// row, and how many rows there are.
async fn address_rows(http: &Http, address: &str) -> (Vec<[String; 5]>, u64) {
    let path = format!("/api/v1/events?app=jira/jira.test.reach/tcp/80&address={address}");
    let (s, v) = http.get_json(&path, Some(READ_TOKEN)).await;
    assert_eq!(s, 200, "{v}");
    let text = |e: &serde_json::Value, k: &str| e[k].as_str().unwrap_or("").to_owned();
    let rows = v["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| ["address", "from", "to", "cause", "connector"].map(|k| text(e, k)))
        .collect();
    (rows, v["total"].as_u64().unwrap_or(0))
}

/// `jira.test.reach` answers one address at two connectors. east-1's
/// result flips ten times down and up, each flip a change of east-1's
/// status (a status history row), while east-2 keeps reaching it: the
/// address history shows only that the address appeared, as the status
/// history shows each flip. With two addresses in east-1's answer its
/// status no longer says which changed, and the address history shows
/// each result, from the one it last showed; the address that leaves the
/// answer leaves the history too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flip_the_status_history_shows_is_not_an_address_row() {
    let ca = Ca::start(&default_config()).await;
    let (east1, _) = connect(&ca, "east-1", "dc-east").await;
    let (east2, _) = connect(&ca, "east-2", "dc-east").await;
    let http = ca.web();
    let (one, two) = ("127.0.0.21", "127.0.0.22");
    let jira = |up: &[&str], down: &[&str]| vec![app("jira", "jira.test.reach", 80, up, down)];
    east1.report(jira(&[one], &[]), false).await;
    east2.report(jira(&[one], &[]), false).await;
    for _ in 0..10 {
        east1.report(jira(&[], &[one]), false).await;
        east2.report(jira(&[one], &[]), false).await;
        east1.report(jira(&[one], &[]), false).await;
    }
    let statuses = || async {
        let (s, v) = http
            .get_json(
                "/api/v1/events?app=jira/jira.test.reach/tcp/80",
                Some(READ_TOKEN),
            )
            .await;
        assert_eq!(s, 200, "{v}");
        v
    };
    // Each connector's first result, and twenty flips of east-1.
    wait_for("the flips stored", Duration::from_secs(10), || async {
        let v = statuses().await;
        (v["total"] == 22, v)
    })
    .await;
    let row = |address: &str, from: &str, to: &str, cause: &str| {
        [address, from, to, cause, "east-1"].map(str::to_owned)
    };
    let (rows, total) = address_rows(&http, one).await;
    assert_eq!(total, 1, "{rows:?}");
    assert_eq!(
        rows[0][1..4],
        ["unknown", "up", "appeared"].map(str::to_owned)
    );
    // east-1 answers two addresses (Unhealthy), both up (Up), then one.
    east1.report(jira(&[two], &[one]), false).await;
    east1.report(jira(&[one, two], &[]), false).await;
    east1.report(jira(&[one], &[]), false).await;
    wait_for(
        "the second address stored",
        Duration::from_secs(10),
        || async {
            let (rows, total) = address_rows(&http, "*").await;
            (total == 5, serde_json::json!(rows))
        },
    )
    .await;
    let (rows, _) = address_rows(&http, one).await;
    assert_eq!(
        rows[..2],
        [
            row(one, "down", "up", "report"),
            row(one, "up", "down", "report")
        ],
        "{rows:?}"
    );
    let (rows, _) = address_rows(&http, two).await;
    assert_eq!(
        rows,
        [
            row(two, "up", "unknown", "left"),
            row(two, "unknown", "up", "appeared")
        ]
    );
    // Unhealthy and Up again; the last report changed no status.
    wait_for("the statuses stored", Duration::from_secs(10), || async {
        let v = statuses().await;
        (v["total"] == 24, v)
    })
    .await;
    ca.stop().await;
}
