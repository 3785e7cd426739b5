//! Probes and resolution against real sockets and a real DNS server on
//! loopback: TCP up / refused / timeout, ICMP echo vs the TCP fallback, and
//! resolution of every A/AAAA record with TTL-driven re-resolution.

use std::net::IpAddr;
use std::time::Duration;

use connector_agent::IcmpPreference;
use connector_agent::checks::probe::{IcmpMode, Prober};
use connector_agent::resolver::{Resolver, TtlBounds};
use policy::{CheckTarget, FailureKind, Method, Protocol};
use test_support::{Blackhole, DnsServer, closed_port, listeners};

fn target(ip: &str, protocol: Protocol, port: u16) -> CheckTarget {
    CheckTarget {
        check: 0,
        address: ip.parse().expect("ip"),
        protocol,
        port,
    }
}

/// A prober asking for ICMP (`auto`), after checking that the machine
/// permits an ICMP socket (failing naming what is missing if not) and that
/// the prober opened the type the machine permits (raw where it can: as
/// root, which CI is): an agent that lost ICMP fails here.
fn icmp_prober() -> Prober {
    let permitted = test_support::caps::icmp_socket().unwrap_or_else(|e| panic!("{e:#}"));
    let prober = Prober::new(IcmpPreference::Auto, Duration::from_millis(500));
    assert_eq!(
        prober.icmp_mode().as_str(),
        permitted,
        "the machine permits {permitted} ICMP sockets; the prober opened {:?}",
        prober.icmp_mode()
    );
    prober
}

#[tokio::test]
async fn tcp_up_refused_and_timeout() {
    let prober = Prober::new(IcmpPreference::Off, Duration::from_millis(300));
    let (open, _) = listeners(&["127.0.3.1".to_string()]).await;
    let up = prober.check(target("127.0.3.1", Protocol::Tcp, open)).await;
    assert!(up.reachable, "{up:?}");
    assert_eq!(up.method, Method::Tcp);
    assert!(up.rtt > Duration::ZERO && up.failure.is_none());

    let refused = prober
        .check(target("127.0.3.1", Protocol::Tcp, closed_port("127.0.3.1")))
        .await;
    assert!(!refused.reachable);
    assert_eq!(
        refused.failure.as_ref().map(|f| f.kind),
        Some(FailureKind::Refused)
    );

    let hole = Blackhole::start("127.0.3.2").await.expect("blackhole");
    let port = hole.port();
    let started = tokio::time::Instant::now();
    let timed_out = prober.check(target("127.0.3.2", Protocol::Tcp, port)).await;
    assert!(!timed_out.reachable, "{timed_out:?}");
    assert_eq!(
        timed_out.failure.as_ref().map(|f| f.kind),
        Some(FailureKind::Timeout)
    );
    // At least the timeout: the handshake hung, it was not refused. (How
    // long past it a busy machine takes is no business of this test.)
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");
}

#[tokio::test]
async fn udp_port_answered_by_icmp_echo() {
    let prober = icmp_prober();
    let udp = tokio::net::UdpSocket::bind("127.0.3.3:0")
        .await
        .expect("udp");
    let q = udp.local_addr().expect("addr").port();
    // Several at once to one host: distinct identifiers keep them apart.
    let checks = (0..8).map(|i| prober.check(target("127.0.3.3", Protocol::Udp, q + i)));
    for r in futures::future::join_all(checks).await {
        assert!(r.reachable, "{r:?}");
        assert_eq!(r.method, Method::Icmp);
    }
}

#[tokio::test]
async fn udp_port_falls_back_to_tcp_when_icmp_is_unavailable() {
    let prober = Prober::new(IcmpPreference::Off, Duration::from_millis(300));
    assert_eq!(prober.icmp_mode(), IcmpMode::None);
    // A reset proves the host reachable for the fallback.
    let reset = prober
        .check(target("127.0.3.4", Protocol::Udp, closed_port("127.0.3.4")))
        .await;
    assert!(reset.reachable, "{reset:?}");
    assert_eq!(reset.method, Method::TcpFallback);
    // So does a handshake.
    let (open, _) = listeners(&["127.0.3.4".to_string()]).await;
    let handshake = prober.check(target("127.0.3.4", Protocol::Udp, open)).await;
    assert!(handshake.reachable);
    assert_eq!(handshake.method, Method::TcpFallback);
    // A timeout does not.
    let hole = Blackhole::start("127.0.3.5").await.expect("blackhole");
    let port = hole.port();
    let silent = prober.check(target("127.0.3.5", Protocol::Udp, port)).await;
    assert!(!silent.reachable);
    assert_eq!(silent.method, Method::TcpFallback);
    assert_eq!(silent.failure.map(|f| f.kind), Some(FailureKind::Timeout));
}

#[tokio::test]
async fn ipv6_loopback_is_checked_too() {
    test_support::caps::ipv6_loopback().unwrap_or_else(|e| panic!("{e:#}"));
    let l = tokio::net::TcpListener::bind("[::1]:0")
        .await
        .expect("[::1]");
    let port = l.local_addr().expect("addr").port();
    let prober = icmp_prober();
    let r = prober.check(target("::1", Protocol::Tcp, port)).await;
    assert!(r.reachable, "{r:?}");
    let r = prober.check(target("::1", Protocol::Udp, port)).await;
    assert!(r.reachable, "{r:?}");
}

#[tokio::test]
async fn every_address_is_resolved_and_answers_are_refreshed_after_their_ttl() {
    let dns = DnsServer::start_with_ttl(
        ([127, 0, 0, 1], 0).into(),
        "zone.test",
        &[
            ("app.zone.test", "127.0.7.1".parse().expect("ip")),
            ("app.zone.test", "127.0.7.2".parse().expect("ip")),
            ("app.zone.test", "::1".parse().expect("ip")),
        ],
        0,
    )
    .await
    .expect("DNS server");
    let ttl = TtlBounds {
        min: Duration::from_millis(300),
        max: Duration::from_secs(60),
    };
    let resolver = Resolver::new(Some(dns.addr()), ttl).expect("resolver");
    let mut got: Vec<IpAddr> = resolver
        .resolve("app.zone.test")
        .await
        .expect("resolves")
        .to_vec();
    got.sort();
    let expect: Vec<IpAddr> = ["127.0.7.1", "127.0.7.2", "::1"]
        .iter()
        .map(|s| s.parse().expect("ip"))
        .collect();
    assert_eq!(got, expect, "every A and AAAA record");

    dns.add("app.zone.test", "127.0.7.3".parse().expect("ip"))
        .await
        .expect("record added");
    let cached = resolver.resolve("APP.zone.test.").await.expect("cached");
    assert_eq!(cached.len(), 3, "kept for the (clamped) TTL");
    tokio::time::sleep(Duration::from_millis(350)).await;
    let fresh = resolver
        .resolve("app.zone.test")
        .await
        .expect("re-resolved");
    assert_eq!(fresh.len(), 4, "new answer after the TTL: {fresh:?}");

    let nx = resolver
        .resolve("missing.zone.test")
        .await
        .expect_err("NXDOMAIN");
    assert_eq!(nx.reason, "NXDOMAIN: missing.zone.test does not exist");
    println!("NXDOMAIN reason: {}", nx.reason);
    dns.stop().await;
}

#[tokio::test]
async fn an_unanswering_dns_server_is_a_dns_failure_with_a_reason() {
    // A UDP socket that never answers.
    let silent = tokio::net::UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("udp");
    let resolver = Resolver::new(
        Some(silent.local_addr().expect("addr")),
        TtlBounds::default(),
    )
    .expect("resolver");
    let started = tokio::time::Instant::now();
    let err = resolver
        .resolve("app.zone.test")
        .await
        .expect_err("timeout");
    println!(
        "timeout reason after {:?}: {}",
        started.elapsed(),
        err.reason
    );
    assert!(err.reason.contains("timed out"), "{}", err.reason);
}

/// A UDP port on an IPv6 address is checked by ICMPv6 echo
/// where ICMP sockets are permitted.
#[tokio::test]
async fn udp_on_ipv6_is_answered_by_icmpv6_echo() {
    let prober = icmp_prober();
    test_support::caps::ipv6_loopback().unwrap_or_else(|e| panic!("{e:#}"));
    let udp = tokio::net::UdpSocket::bind("[::1]:0").await.expect("[::1]");
    let q = udp.local_addr().expect("addr").port();
    let checks = (0..4).map(|i| prober.check(target("::1", Protocol::Udp, q + i)));
    for r in futures::future::join_all(checks).await {
        assert!(r.reachable, "{r:?}");
        assert_eq!(r.method, Method::Icmp, "{r:?}");
        assert_eq!(r.address, "::1".parse::<IpAddr>().expect("ip"));
    }
}
