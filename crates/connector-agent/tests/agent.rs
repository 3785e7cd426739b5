//! The agent end to end on loopback: a real DNS zone (hickory-server), real
//! TCP listeners and ICMP, and a test CA speaking the generated
//! `ConnectorSession` service.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Assignment, Authority, Seen, agent_config, start_agent};
use protocol::v1::authority_message::Kind as FromCa;
use protocol::v1::connector_message::Kind as ToCa;
use protocol::v1::{self, CheckMethod, FailureKind, HealthStatus, Protocol};
use test_support::{DnsServer, Segment, closed_port, http_get, listeners};

const WAIT: Duration = Duration::from_secs(10);

/// The tests of this file run one at a time: the rate test measures timing
/// at its listeners, which parallel agents on two cores would blur.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ips(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

type Latest = BTreeMap<(String, String, i32, u32), v1::ApplicationHealth>;

fn key_of(app: &v1::ApplicationHealth) -> (String, String, i32, u32) {
    let k = app.app.clone().expect("app key");
    (k.segment, k.host, k.protocol, k.port)
}

/// Collects reports until `done` holds for the latest state.
async fn until(ca: &mut Authority, latest: &mut Latest, done: impl Fn(&Latest) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(latest) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            !left.is_zero(),
            "condition not reached; latest: {latest:#?}"
        );
        let report = ca.next_report(left).await;
        for app in report.applications {
            latest.insert(key_of(&app), app);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_example_on_loopback_reports_six_up_addresses() {
    let _serial = SERIAL.lock().await;
    let dns = DnsServer::start_with_ttl(
        ([127, 0, 0, 1], 0).into(),
        "lanukcorp.test",
        &[
            ("jira.lanukcorp.test", "127.0.1.1".parse().expect("ip")),
            ("jira.lanukcorp.test", "127.0.1.2".parse().expect("ip")),
        ],
        300,
    )
    .await
    .expect("DNS server");
    let (p, _) = listeners(&ips(&["127.0.1.1", "127.0.1.2", "127.0.1.3"])).await;
    // A UDP service on the same addresses (ICMP answers for the host).
    let udp = tokio::net::UdpSocket::bind("127.0.1.1:0")
        .await
        .expect("udp");
    let q = udp.local_addr().expect("addr").port();
    let mut ca = Authority::start(Assignment {
        segments: vec![
            Segment::new("jira")
                .apps(["jira.lanukcorp.test", "127.0.1.3"])
                .tcp([p])
                .udp([q])
                .interval_ms(500)
                .groups(["dc-east"])
                .proto(),
        ],
        settings: v1::ConnectorSettings {
            heartbeat_interval_ms: 200,
            ..Default::default()
        },
    })
    .await;
    let mut config = agent_config(&ca.url(), Some(dns.addr()));
    let metrics_port = closed_port("127.0.0.1");
    config.metrics_listen = Some(([127, 0, 0, 1], metrics_port).into());
    let (stop, agent) = start_agent(config);

    match ca.next(WAIT).await {
        Seen::Connected(name, group, key) => {
            assert_eq!(
                (name.as_str(), group.as_str(), key.as_str()),
                ("c1", "dc-east", "secret")
            );
        }
        other => panic!("expected a connection, saw {other:?}"),
    }
    match ca.next(WAIT).await {
        Seen::Message(ToCa::Hello(h)) => {
            assert_eq!(h.name, "c1");
            assert_eq!(h.group, "dc-east");
            assert!(!h.version.is_empty());
            let caps = h.capabilities.expect("capabilities");
            // The agent opens the ICMP socket type the machine permits (raw
            // as root, which CI is); a machine with none fails here naming
            // what is missing, so UDP checks below are ICMP echoes.
            let permitted = test_support::caps::icmp_socket().unwrap_or_else(|e| panic!("{e:#}"));
            assert_eq!(caps.icmp_mode, permitted, "{caps:?}");
            assert!(caps.icmp, "{caps:?}");
        }
        other => panic!("expected Hello, saw {other:?}"),
    }
    let first = ca.next_report(WAIT).await;
    assert!(
        first.full_state,
        "first report after connecting is full state"
    );

    let mut latest = Latest::new();
    until(&mut ca, &mut latest, |l| l.len() == 4).await;
    let mut addresses = Vec::new();
    for ((_, host, protocol, port), app) in &latest {
        assert_eq!(
            app.status,
            HealthStatus::Up as i32,
            "{host}:{port}: {app:?}"
        );
        for a in &app.addresses {
            assert_eq!(a.status, HealthStatus::Up as i32);
            let method = if *protocol == Protocol::Tcp as i32 {
                CheckMethod::Tcp
            } else {
                CheckMethod::Icmp
            };
            assert_eq!(a.method, method as i32, "{a:?}");
            addresses.push(format!(
                "{}:{}/{}",
                a.address,
                port,
                if *protocol == Protocol::Tcp as i32 {
                    "tcp"
                } else {
                    "udp"
                }
            ));
        }
    }
    addresses.sort();
    let mut expected = vec![
        format!("127.0.1.1:{p}/tcp"),
        format!("127.0.1.2:{p}/tcp"),
        format!("127.0.1.3:{p}/tcp"),
        format!("127.0.1.1:{q}/udp"),
        format!("127.0.1.2:{q}/udp"),
        format!("127.0.1.3:{q}/udp"),
    ];
    expected.sort();
    assert_eq!(
        addresses, expected,
        "exactly the six checks of the seed's example"
    );
    // A heartbeat with the load follows.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Seen::Message(ToCa::Heartbeat(hb)) =
            ca.next(deadline - tokio::time::Instant::now()).await
        {
            let load = hb.load.expect("load");
            if load.targets == 6 {
                assert_eq!(load.checks_per_cycle, 6);
                assert_eq!(load.rate_limit, 200);
                break;
            }
        }
    }
    let metrics = http_get(([127, 0, 0, 1], metrics_port).into(), "/metrics").await;
    for name in [
        "reach_agent_checks_total{",
        "reach_agent_check_duration_seconds_bucket",
        "reach_agent_rate_limiter_wait_seconds_bucket",
        "reach_agent_checks_in_flight",
        "reach_agent_targets 6",
        "reach_agent_session_state{state=\"connected\"} 1",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
    let _ = stop.send(());
    agent.await.expect("agent stopped cleanly");
    dns.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_unhealthy_and_dns_failure() {
    let _serial = SERIAL.lock().await;
    let dns = DnsServer::start_with_ttl(
        ([127, 0, 0, 1], 0).into(),
        "lanukcorp.test",
        &[
            ("half.lanukcorp.test", "127.0.2.2".parse().expect("ip")),
            ("half.lanukcorp.test", "127.0.2.3".parse().expect("ip")),
        ],
        300,
    )
    .await
    .expect("DNS server");
    let (p, _) = listeners(&ips(&["127.0.2.2"])).await;
    let closed = closed_port("127.0.2.1");
    let mut ca = Authority::start(Assignment {
        segments: vec![
            Segment::new("half")
                .apps(["half.lanukcorp.test"])
                .tcp([p])
                .interval_ms(500)
                .groups(["dc-east"])
                .proto(),
            Segment::new("closed")
                .apps(["127.0.2.1"])
                .tcp([closed])
                .interval_ms(500)
                .groups(["dc-east"])
                .proto(),
            Segment::new("nx")
                .apps(["missing.lanukcorp.test"])
                .tcp([80])
                .interval_ms(500)
                .groups(["dc-east"])
                .proto(),
            Segment::new("off")
                .apps(["127.0.2.9"])
                .tcp([80])
                .mode("none")
                .interval_ms(500)
                .groups(["dc-east"])
                .proto(),
        ],
        settings: v1::ConnectorSettings::default(),
    })
    .await;
    let (stop, agent) = start_agent(agent_config(&ca.url(), Some(dns.addr())));
    let mut latest = Latest::new();
    until(&mut ca, &mut latest, |l| l.len() >= 3).await;
    let by_segment = |name: &str| {
        latest
            .iter()
            .find(|(k, _)| k.0 == name)
            .map(|(_, v)| v.clone())
            .expect("segment reported")
    };
    let half = by_segment("half");
    assert_eq!(half.status, HealthStatus::Unhealthy as i32, "{half:?}");
    let down: Vec<_> = half
        .addresses
        .iter()
        .filter(|a| a.status == HealthStatus::Down as i32)
        .collect();
    assert_eq!(down.len(), 1);
    assert_eq!(down[0].address, "127.0.2.3");
    assert_eq!(down[0].failure, FailureKind::Refused as i32);

    let closed_app = by_segment("closed");
    assert_eq!(closed_app.status, HealthStatus::Down as i32);
    assert_eq!(closed_app.addresses[0].failure, FailureKind::Refused as i32);
    assert_eq!(closed_app.addresses[0].method, CheckMethod::Tcp as i32);
    assert!(!closed_app.addresses[0].detail.is_empty());

    let nx = by_segment("nx");
    assert_eq!(nx.status, HealthStatus::Down as i32);
    assert!(nx.addresses.is_empty());
    assert!(
        nx.dns_error.contains("NXDOMAIN"),
        "resolver's reason: {}",
        nx.dns_error
    );
    assert!(
        !latest.keys().any(|k| k.0 == "off"),
        "none segments are not checked"
    );
    let _ = stop.send(());
    agent.await.expect("agent stopped");
    dns.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_access_checks_report_and_expire() {
    let _serial = SERIAL.lock().await;
    let (p, _) = listeners(&ips(&["127.0.4.1"])).await;
    let mut ca = Authority::start(Assignment {
        segments: vec![
            Segment::new("wiki")
                .apps(["127.0.4.0/24"])
                .tcp([p])
                .mode("on_access")
                .interval_ms(200)
                .groups(["dc-east"])
                .proto(),
        ],
        settings: v1::ConnectorSettings {
            on_access_window_ms: 700,
            ..Default::default()
        },
    })
    .await;
    let (stop, agent) = start_agent(agent_config(&ca.url(), None));
    let first = ca.next_report(WAIT).await;
    assert!(
        first.full_state && first.applications.is_empty(),
        "nothing checked before an access"
    );
    let app = v1::ApplicationKey {
        segment: "wiki".into(),
        host: "127.0.4.1".into(),
        protocol: Protocol::Tcp as i32,
        port: u32::from(p),
    };
    let accessed = tokio::time::Instant::now();
    ca.send(FromCa::Access(v1::AccessEvent {
        accessed_ms_ago: 0,
        app: Some(app.clone()),
        access_id: "a1.1.from-the-test".into(),
    }))
    .await;
    let report = ca.next_report(WAIT).await;
    assert_eq!(report.applications.len(), 1);
    assert_eq!(report.applications[0].status, HealthStatus::Up as i32);
    assert_eq!(
        report.applications[0].access_id, "a1.1.from-the-test",
        "the access's id is echoed"
    );
    // Checked because of the access (an on-access segment is never checked
    // otherwise); how soon is the `onaccess` benchmark's figure, not this
    // test's.
    // Re-checked every interval, then expired once (the deadline only bounds
    // a hang: the window is 700 ms).
    let mut rounds = 1;
    let expired = loop {
        assert!(
            accessed.elapsed() < WAIT,
            "still checked {WAIT:?} after an access with a 700-ms window"
        );
        let r = ca.next_report(WAIT).await;
        let a = &r.applications[0];
        if a.expired {
            break a.clone();
        }
        assert_eq!(a.status, HealthStatus::Up as i32);
        assert_eq!(a.access_id, "a1.1.from-the-test", "in every report");
        rounds += 1;
    };
    assert_eq!(expired.status, HealthStatus::Unknown as i32);
    assert!(
        rounds >= 3,
        "kept checking during the window ({rounds} rounds)"
    );
    let elapsed = accessed.elapsed();
    assert!(
        elapsed >= Duration::from_millis(700),
        "expired {elapsed:?} after the access, before its 700-ms window"
    );
    // And then it stops touching it.
    let quiet = tokio::time::timeout(Duration::from_millis(600), ca.next_report(WAIT)).await;
    assert!(quiet.is_err(), "no report after expiry: {quiet:?}");
    let _ = stop.send(());
    agent.await.expect("agent stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_ca_goes_away_and_resends_full_state() {
    let _serial = SERIAL.lock().await;
    let (p, _) = listeners(&ips(&["127.0.6.1"])).await;
    let assignment = Assignment {
        segments: vec![
            Segment::new("app")
                .apps(["127.0.6.1"])
                .tcp([p])
                .interval_ms(300)
                .groups(["dc-east"])
                .proto(),
        ],
        settings: v1::ConnectorSettings {
            heartbeat_interval_ms: 200,
            ..Default::default()
        },
    };
    let mut ca = Authority::start(assignment.clone()).await;
    let addr = ca.addr;
    let (stop, agent) = start_agent(agent_config(&ca.url(), None));
    let mut latest = Latest::new();
    until(&mut ca, &mut latest, |l| !l.is_empty()).await;
    ca.stop().await;

    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut ca = Authority::start_on(addr, assignment).await;
    // Backoff is at most 0.5 s then 1 s, 2 s (full jitter).
    match ca.next(Duration::from_secs(8)).await {
        Seen::Connected(..) => {}
        other => panic!("expected a reconnection, saw {other:?}"),
    }
    assert!(matches!(ca.next(WAIT).await, Seen::Message(ToCa::Hello(_))));
    let report = ca.next_report(WAIT).await;
    assert!(
        report.full_state,
        "first report after reconnecting is full state"
    );
    assert_eq!(
        report.applications.len(),
        1,
        "state kept while disconnected"
    );
    assert_eq!(report.applications[0].status, HealthStatus::Up as i32);
    let _ = stop.send(());
    agent.await.expect("agent stopped");
    ca.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_from_the_ca_is_honoured_and_pings_answered() {
    let _serial = SERIAL.lock().await;
    let mut ca = Authority::start(Assignment::default()).await;
    let (stop, agent) = start_agent(agent_config(&ca.url(), None));
    let _ = ca.next_report(WAIT).await;
    ca.send(FromCa::Ping(v1::Ping { nonce: 42 })).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Seen::Message(ToCa::Pong(p)) = ca.next(deadline - tokio::time::Instant::now()).await
        {
            assert_eq!(p.nonce, 42);
            break;
        }
    }
    let asked = tokio::time::Instant::now();
    ca.send(FromCa::Shutdown(v1::Shutdown {
        reason: "maintenance".into(),
        reconnect_to: String::new(),
        retry_after_ms: 1500,
    }))
    .await;
    loop {
        if let Seen::Connected(..) = ca.next(WAIT).await {
            break;
        }
    }
    assert!(
        asked.elapsed() >= Duration::from_millis(1500),
        "waited retry_after_ms"
    );
    let _ = stop.send(());
    agent.await.expect("agent stopped");
}

/// Kills the child if the test ends before it does.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The seed's default: 20 checks per second when nobody says otherwise.
/// The real `connector-agent` binary, started with no rate flag against a
/// CA that sets none, says 20 in its `Hello`, paces at 20 (its heartbeat's
/// `rate_limit`), and its first round over 40 loopback applications takes
/// at least 39 periods of 50 ms with no more than 20 starts in a second at
/// the listeners (what 40/s would break; 10/s breaks the two figures).
/// A CA assigning one continuous segment of 40 applications,
/// 127.0.`octet`.1 to .40, on one port each listener records accepts on.
async fn forty_targets(
    octet: u8,
    settings: v1::ConnectorSettings,
) -> (Authority, test_support::apps::Arrivals) {
    let addrs: Vec<String> = (1..=40).map(|i| format!("127.0.{octet}.{i}")).collect();
    let (p, accepted) = listeners(&addrs).await;
    let apps: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let ca = Authority::start(Assignment {
        segments: vec![
            Segment::new("many")
                .apps(&apps)
                .tcp([p])
                .interval_ms(60_000)
                .groups(["dc-east"])
                .proto(),
        ],
        settings,
    })
    .await;
    (ca, accepted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_checks_twenty_per_second_by_default() {
    let _serial = SERIAL.lock().await;
    let (mut ca, accepted) = forty_targets(
        18,
        v1::ConnectorSettings {
            heartbeat_interval_ms: 200,
            ..Default::default()
        },
    )
    .await;
    let state =
        std::env::temp_dir().join(format!("reach-agent-default-rate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&state);
    let _agent = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_connector-agent"))
            .args(["--ca", &ca.url(), "--name", "c1", "--group", "dc-east"])
            .args(["--provisioning-key", "secret", "--icmp", "off"])
            // Names are not used; any query would go to a closed loopback
            // port, never off the machine.
            .args([
                "--dns-server",
                &format!("127.0.0.1:{}", closed_port("127.0.0.1")),
            ])
            .arg("--state-dir")
            .arg(&state)
            .env_remove("REACH_CHECKS_PER_SECOND")
            .env_remove("REACH_MAX_CHECKS_PER_SECOND")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting connector-agent"),
    );
    let deadline = tokio::time::Instant::now() + 3 * WAIT;
    let mut latest = Latest::new();
    let (mut announced, mut paced) = (None, None);
    while latest.len() < 40 || paced.is_none() {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(
            !left.is_zero(),
            "Hello {announced:?}, rate_limit {paced:?}, {} applications reported",
            latest.len()
        );
        match ca.next(left).await {
            Seen::Message(ToCa::Hello(h)) => {
                announced = h.capabilities.map(|c| c.checks_per_second);
            }
            Seen::Message(ToCa::Heartbeat(hb)) => {
                if let Some(load) = hb.load {
                    paced = Some(load.rate_limit);
                }
            }
            Seen::Message(ToCa::Report(r)) => {
                for app in r.applications {
                    latest.insert(key_of(&app), app);
                }
            }
            _ => {}
        }
    }
    assert_eq!(announced, Some(20), "checks_per_second in the Hello");
    assert_eq!(paced, Some(20), "the pacer's rate_limit in the heartbeat");
    let times = accepted.lock().expect("lock").clone();
    assert_eq!(times.len(), 40, "each target probed once");
    let span =
        times.iter().max().copied().expect("times") - times.iter().min().copied().expect("times");
    assert!(span >= Duration::from_millis(1930), "40 checks in {span:?}");
    let max = test_support::max_in_window(&times, Duration::from_millis(985));
    assert!(max <= 20, "{max} checks started within one second");
    let _ = std::fs::remove_dir_all(&state);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_targets_at_twenty_per_second_never_exceed_the_rate() {
    let _serial = SERIAL.lock().await;
    let (mut ca, accepted) = forty_targets(5, v1::ConnectorSettings::default()).await;
    let mut config = agent_config(&ca.url(), None);
    config.checks_per_second = 20;
    let (stop, agent) = start_agent(config);
    let mut latest = Latest::new();
    until(&mut ca, &mut latest, |l| l.len() == 40).await;
    let mut times = accepted.lock().expect("lock").clone();
    times.sort();
    assert_eq!(times.len(), 40, "each target probed once");
    let span = times[39] - times[0];
    // 39 periods of 50 ms at least (how much longer a busy machine makes
    // it is not the rate's business).
    assert!(span >= Duration::from_millis(1930), "{span:?}");
    // No one-second window holds more than 20 connections. The pacer's own
    // start times obey this exactly (see the unit tests in pacer.rs); accept
    // instants at the listener add connect latency and the test runtime's
    // scheduling jitter (a few ms on a busy 2-core machine), which is
    // discounted from the window here.
    let max = test_support::max_in_window(&times, Duration::from_millis(985));
    assert!(max <= 20, "{max} connections within one second");
    let strict = test_support::max_in_window(&times, Duration::from_secs(1));
    println!("40 checks at 20/s: span {span:?}, at most {max} per 985 ms, {strict} per exact 1 s");
    let _ = stop.send(());
    agent.await.expect("agent stopped");
}

/// A TCP server that alternates between open and closed every check: it
/// accepts one connection, closes its listener (later attempts are
/// refused), and listens again `closed_for` later. With checks every
/// `interval` and `interval < closed_for < 2 * interval`, every other
/// check finds it closed. Returns its port.
async fn alternating_server(ip: &str, closed_for: Duration) -> u16 {
    let bind = |addr: std::net::SocketAddr| -> std::io::Result<tokio::net::TcpListener> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(16)
    };
    let first = bind((ip.parse::<std::net::IpAddr>().expect("ip"), 0).into()).expect("bind");
    let addr = first.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut listener = Some(first);
        loop {
            let Some(l) = listener.take() else {
                tokio::time::sleep(closed_for).await;
                listener = bind(addr).ok();
                continue;
            };
            if let Ok((stream, _)) = l.accept().await {
                drop(stream);
            }
            drop(l);
        }
    });
    addr.port()
}

/// A server that alternates open/closed every check does not
/// flap the reported status with `fall = 3`, while the same server under
/// the default 1 / 1 does; the per-address results show the raw
/// alternation in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fall_three_keeps_an_alternating_server_up() {
    let _serial = SERIAL.lock().await;
    let interval = Duration::from_millis(400);
    let closed_for = Duration::from_millis(600);
    let damped_port = alternating_server("127.0.16.1", closed_for).await;
    let plain_port = alternating_server("127.0.16.2", closed_for).await;
    let segment = |name: &str, ip: &str, port: u16| {
        Segment::new(name)
            .apps([ip])
            .tcp([port])
            .interval_ms(u64::try_from(interval.as_millis()).expect("ms"))
            .groups(["dc-east"])
            .proto()
    };
    let damped = v1::Segment {
        fall: 3,
        ..segment("damped", "127.0.16.1", damped_port)
    };
    let mut ca = Authority::start(Assignment {
        segments: vec![damped, segment("plain", "127.0.16.2", plain_port)],
        settings: v1::ConnectorSettings::default(),
    })
    .await;
    let (stop, agent) = start_agent(agent_config(&ca.url(), None));
    // (status, raw reachable) of every report per segment.
    let mut seen: BTreeMap<String, Vec<(i32, bool)>> = BTreeMap::new();
    let enough = |seen: &BTreeMap<String, Vec<(i32, bool)>>| {
        ["damped", "plain"].iter().all(|s| {
            seen.get(*s)
                .is_some_and(|v| v.iter().filter(|(_, up)| !up).count() >= 4)
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !enough(&seen) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "too few failed checks: {seen:?}");
        for app in ca.next_report(left).await.applications {
            let segment = key_of(&app).0;
            let up = app
                .addresses
                .first()
                .is_some_and(|a| a.status == HealthStatus::Up as i32);
            seen.entry(segment).or_default().push((app.status, up));
        }
    }
    let damped = &seen["damped"];
    let plain = &seen["plain"];
    assert!(
        damped.iter().any(|(_, up)| *up) && damped.iter().any(|(_, up)| !up),
        "the server alternated: {damped:?}"
    );
    assert!(
        damped.iter().all(|(s, _)| *s == HealthStatus::Up as i32),
        "fall = 3 must not flap: {damped:?}"
    );
    assert!(
        plain.iter().any(|(s, _)| *s == HealthStatus::Down as i32),
        "without damping the same server flaps: {plain:?}"
    );
    let _ = stop.send(());
    agent.await.expect("agent stopped");
}

/// IPv6 end to end, and the group's `dns_resolution`. A name
/// with an A record (nothing listens there) and an AAAA record (::1,
/// listening) is Unhealthy under `dual`, Up with only ::1 under `ipv6`
/// (sent in a `PolicyUpdate`); an explicit IPv6 entry and an IPv6 subnet
/// (on access) are checked whatever the choice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_resolution_ipv6_checks_only_aaaa_addresses() {
    let _serial = SERIAL.lock().await;
    test_support::caps::ipv6_loopback().unwrap_or_else(|e| panic!("{e:#}"));
    let l6 = tokio::net::TcpListener::bind("[::1]:0")
        .await
        .expect("[::1]");
    let port = l6.local_addr().expect("addr").port();
    tokio::spawn(async move {
        loop {
            if let Ok((s, _)) = l6.accept().await {
                drop(s);
            }
        }
    });
    let dns = DnsServer::start_with_ttl(
        ([127, 0, 0, 1], 0).into(),
        "six.test",
        &[
            ("dual.six.test", "127.0.17.1".parse().expect("ip")),
            ("dual.six.test", "::1".parse().expect("ip")),
        ],
        300,
    )
    .await
    .expect("DNS server");
    let segments = vec![
        Segment::new("dual")
            .apps(["dual.six.test", "::1"])
            .tcp([port])
            .interval_ms(300)
            .groups(["dc-east"])
            .proto(),
        Segment::new("subnet6")
            .apps(["::1/128"])
            .tcp([port])
            .mode("on_access")
            .interval_ms(300)
            .groups(["dc-east"])
            .proto(),
    ];
    let mut ca = Authority::start(Assignment {
        segments: segments.clone(),
        settings: v1::ConnectorSettings::default(),
    })
    .await;
    let (stop, agent) = start_agent(agent_config(&ca.url(), Some(dns.addr())));
    let fqdn = ("dual".to_owned(), "dual.six.test".to_owned());
    let explicit = ("dual".to_owned(), "::1".to_owned());
    let status_of = |l: &Latest, k: &(String, String)| {
        l.iter()
            .find(|(key, _)| key.0 == k.0 && key.1 == k.1)
            .map(|(_, v)| v.clone())
    };
    let mut latest = Latest::new();
    until(&mut ca, &mut latest, |l| {
        status_of(l, &fqdn).is_some_and(|a| a.status == HealthStatus::Unhealthy as i32)
    })
    .await;
    let app = status_of(&latest, &fqdn).expect("reported");
    let mut addrs: Vec<&str> = app.addresses.iter().map(|a| a.address.as_str()).collect();
    addrs.sort_unstable();
    assert_eq!(addrs, vec!["127.0.17.1", "::1"], "dual asks A and AAAA");
    until(&mut ca, &mut latest, |l| {
        status_of(l, &explicit).is_some_and(|a| a.status == HealthStatus::Up as i32)
    })
    .await;

    // The group switches to IPv6 only.
    ca.send(FromCa::PolicyUpdate(v1::PolicyUpdate {
        segments,
        settings: Some(v1::ConnectorSettings {
            dns_resolution: v1::DnsResolution::Ipv6 as i32,
            ..Default::default()
        }),
    }))
    .await;
    until(&mut ca, &mut latest, |l| {
        status_of(l, &fqdn).is_some_and(|a| {
            a.status == HealthStatus::Up as i32
                && a.addresses.len() == 1
                && a.addresses[0].address == "::1"
        })
    })
    .await;
    // An access to an address inside the IPv6 subnet is checked on ::1.
    ca.send(FromCa::Access(v1::AccessEvent {
        app: Some(v1::ApplicationKey {
            segment: "subnet6".into(),
            host: "::1".into(),
            protocol: Protocol::Tcp as i32,
            port: u32::from(port),
        }),
        accessed_ms_ago: 0,
        access_id: String::new(),
    }))
    .await;
    let subnet = ("subnet6".to_owned(), "::1".to_owned());
    until(&mut ca, &mut latest, |l| {
        status_of(l, &subnet).is_some_and(|a| a.status == HealthStatus::Up as i32)
    })
    .await;
    let _ = stop.send(());
    agent.await.expect("agent stopped");
    dns.stop().await;
}

/// The DNS server stops answering under a running connector checking an FQDN
/// application every second: for a 12-s outage every report of it is Up,
/// with its last known address and, once the answer expired, the DNS error;
/// and no two reports of it are further apart than the CA's default
/// staleness (3 intervals), past which the CA would show it Unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dns_outage_keeps_an_fqdn_application_up_with_the_dns_error() {
    let _serial = SERIAL.lock().await;
    let dns = DnsServer::start_with_ttl(
        ([127, 0, 0, 1], 0).into(),
        "lanukcorp.test",
        &[("outage.lanukcorp.test", "127.0.5.1".parse().expect("ip"))],
        1,
    )
    .await
    .expect("DNS server");
    let (p, _) = listeners(&ips(&["127.0.5.1"])).await;
    let mut ca = Authority::start(Assignment {
        segments: vec![
            Segment::new("outage")
                .apps(["outage.lanukcorp.test"])
                .tcp([p])
                .interval_ms(1000)
                .groups(["dc-east"])
                .proto(),
        ],
        settings: v1::ConnectorSettings::default(),
    })
    .await;
    let (stop, agent) = start_agent(agent_config(&ca.url(), Some(dns.addr())));
    let mut latest = Latest::new();
    until(&mut ca, &mut latest, |l| {
        l.values().any(|a| a.status == HealthStatus::Up as i32)
    })
    .await;
    // The server stops answering: its port is held by sockets that never
    // reply (as a server that hangs, or one behind a path that drops its
    // packets), so every lookup runs into the resolver's timeout.
    let addr = dns.addr();
    dns.stop().await;
    let mut silent = None;
    for _ in 0..100 {
        // The server's sockets close as its tasks wind down.
        if let (Ok(udp), Ok(tcp)) = (
            std::net::UdpSocket::bind(addr),
            std::net::TcpListener::bind(addr),
        ) {
            silent = Some((udp, tcp));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _silent = silent.expect("the stopped DNS server's port stayed in use");
    // The CA shows an application Unknown once its latest check is older
    // than `stale_after_intervals` (3) × its interval.
    let stale_after_ms = 3_000;
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    };
    let outage_start = unix_ms();
    let end = tokio::time::Instant::now() + Duration::from_secs(12);
    let (mut checked_at, mut seen) = (vec![outage_start], Vec::new());
    while tokio::time::Instant::now() < end {
        let report = ca.next_report(WAIT).await;
        for app in report.applications {
            assert_eq!(
                (app.status, app.addresses.len()),
                (HealthStatus::Up as i32, 1),
                "during the outage: {app:?}"
            );
            checked_at.push(app.checked_at_unix_ms.max(outage_start));
            seen.push(app.dns_error);
        }
    }
    checked_at.push(unix_ms());
    checked_at.sort_unstable();
    let longest = checked_at.windows(2).map(|w| w[1] - w[0]).max();
    assert!(
        longest.is_some_and(|ms| ms < stale_after_ms),
        "{longest:?} ms between checks during the outage: the CA shows the application \
         Unknown (checked at {checked_at:?})"
    );
    assert!(
        seen.iter().any(|e| !e.is_empty()),
        "the DNS error was never shown: {seen:?}"
    );
    let _ = stop.send(());
    agent.await.expect("agent stopped");
}
