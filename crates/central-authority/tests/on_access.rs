//! On-access behaviour with the real connector agent (the library, in this
//! process) against an in-process CA: what a user sees when an application
//! goes down and comes back.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;

/// A segment with one IP application on `port`, checked on access and
/// reported only every 10 minutes.
fn config(port: u16) -> String {
    config_text(
        "",
        "discovery_timeout_ms = 5000",
        &Segment::new("back")
            .apps(["127.0.0.1"])
            .tcp([port])
            .mode("on_access")
            .interval_ms(600_000)
            .groups(["dc-west"])
            .toml(),
    )
}

/// Server down → the access is refused `all_down`; server back →
/// the next access succeeds within the discovery timeout, although the
/// report interval is 10 minutes and the window is live.
#[tokio::test]
async fn an_application_that_came_back_is_reachable_at_once() {
    // A free port, with nothing listening on it for now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let ca = Ca::start(&config(port)).await;
    let mut agent = agent_config(&ca, "onaccess-back", "west-1", "dc-west", KEY_WEST);
    agent.icmp = connector_agent::IcmpPreference::Off;
    let (stop, task) = spawn_agent(agent);
    let http = ca.web();
    eventually("connected, and the access refused all_down", || async {
        http.access("127.0.0.1", "tcp", u32::from(port)).await.1["error"]["reason"] == "all_down"
    })
    .await;

    // The server comes back.
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let listener = tokio::net::TcpListener::bind(addr).await.expect("rebind");
    let server = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            drop(conn);
        }
    });
    // Past the re-check's minimum gap, so this access is the one that asks.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (s, v) = http.access("127.0.0.1", "tcp", u32::from(port)).await;
    assert_eq!(s, 200, "the application came back: {v}");
    assert_eq!(v["connector"], "west-1");

    server.abort();
    let _ = stop.send(());
    let _ = task.await;
    ca.stop().await;
}
