//! The agent attached to several CA replicas behind one name: a real DNS
//! zone (hickory-server) whose records the test changes, and two test CAs
//! (plain text) on two loopback addresses with the same port.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use common::{Assignment, Authority, Seen, agent_config, start_agent};
use protocol::v1;
use protocol::v1::connector_message::Kind as ToCa;
use test_support::{DnsServer, Segment, listeners};

const NAME: &str = "ca.replicas.test";
const WAIT: Duration = Duration::from_secs(20);

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

/// Waits until `ca` sees something `want` accepts.
async fn until_seen(ca: &mut Authority, what: &str, mut want: impl FnMut(&Seen) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "timed out waiting for: {what}");
        if let Ok(Some(seen)) = tokio::time::timeout(left, ca.seen.recv()).await
            && want(&seen)
        {
            return;
        }
    }
}

/// A report carrying an application of `segment`.
fn reports_segment(seen: &Seen, segment: &str) -> bool {
    matches!(seen, Seen::Message(ToCa::Report(r))
        if r.applications.iter().any(|a| a.app.as_ref().is_some_and(|k| k.segment == segment)))
}

/// A heartbeat whose replica view `want` accepts.
fn heartbeat(seen: &Seen, want: impl Fn(&v1::ReplicaAttachment) -> bool) -> bool {
    matches!(seen, Seen::Message(ToCa::Heartbeat(h)) if h.replicas.as_ref().is_some_and(&want))
}

fn assignment(segment: &str, ip: &str, port: u16) -> Assignment {
    Assignment {
        segments: vec![
            Segment::new(segment)
                .apps([ip])
                .tcp([port])
                .interval_ms(500)
                .groups(["dc-east"])
                .proto(),
        ],
        settings: v1::ConnectorSettings {
            heartbeat_interval_ms: 200,
            ..Default::default()
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_follow_the_names_addresses_and_the_longest_connected_assignment() {
    let (a_ip, b_ip) = (ip("127.0.0.41"), ip("127.0.0.42"));
    let (port, _) = listeners(&["127.0.0.43".to_owned()]).await;
    let dns = DnsServer::start(
        (ip("127.0.0.1"), 0).into(),
        "replicas.test",
        &[(NAME, a_ip)],
    )
    .await
    .expect("DNS server");
    // The two replicas disagree: A hands out segment "a", B segment "b".
    let mut a = Authority::start_on((a_ip, 0).into(), assignment("a", "127.0.0.43", port)).await;
    let ca_port = a.addr.port();
    let mut b =
        Authority::start_on((b_ip, ca_port).into(), assignment("b", "127.0.0.43", port)).await;
    let mut config = agent_config(&format!("http://{NAME}:{ca_port}"), Some(dns.addr()));
    config.ca_resolve_interval_s = 1;
    let (stop, task) = start_agent(config);

    // The name has one address: one session, to A, following A.
    until_seen(&mut a, "a report of segment a at A", |s| {
        reports_segment(s, "a")
    })
    .await;
    until_seen(&mut a, "A followed, alone", |s| {
        heartbeat(s, |r| {
            r.sessions == 1 && r.follows_this_session && r.agrees_with_followed
        })
    })
    .await;

    // A second address: a session to B opens; A (connected longer) stays
    // followed, so B gets segment "a"'s reports, and both see the
    // disagreement.
    dns.add(NAME, b_ip).await.expect("add");
    until_seen(&mut b, "B sees the disagreement, not followed", |s| {
        heartbeat(s, |r| {
            r.sessions == 2
                && r.assignments == 2
                && !r.follows_this_session
                && !r.agrees_with_followed
                && r.followed_assignment_hash != r.assignment_hash
        })
    })
    .await;
    until_seen(&mut b, "B gets the followed assignment's reports", |s| {
        reports_segment(s, "a")
    })
    .await;
    until_seen(&mut a, "A sees the disagreement, followed", |s| {
        heartbeat(s, |r| {
            r.sessions == 2 && r.assignments == 2 && r.follows_this_session
        })
    })
    .await;

    // A's address goes: its session closes, and B's assignment is followed.
    dns.remove(NAME, a_ip).await.expect("remove");
    until_seen(&mut a, "A's session ends", |s| matches!(s, Seen::Ended)).await;
    until_seen(&mut b, "B followed, alone", |s| {
        heartbeat(s, |r| {
            r.sessions == 1 && r.assignments == 1 && r.follows_this_session
        })
    })
    .await;
    until_seen(&mut b, "B gets segment b's reports", |s| {
        reports_segment(s, "b")
    })
    .await;

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    a.stop().await;
    b.stop().await;
}
