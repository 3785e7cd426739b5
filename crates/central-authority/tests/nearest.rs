//! The `nearest` strategy with real connectors (the agent library, in this
//! process) against an in-process CA, where one connector's path to the
//! application is slower: its DNS server points it at an address inside a
//! network namespace this test creates, behind a `test_support::DelayLink`
//! (TUN devices and a forwarder in this process that holds every packet
//! 30 ms each way; the CI kernel has no `tc netem`). The application is a UDP
//! port, which the kernel answers by itself (ICMP echo, or a TCP reset in
//! the fallback), so nothing has to run inside the namespace.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use test_support::dns::Mode;
use test_support::{DelayLink, DnsServer};

const HOST: &str = "app.near.test";
const PORT: u32 = 5353;

/// A DNS server answering `HOST` with `ip`.
async fn dns(ip: &str) -> DnsServer {
    DnsServer::start_with_ttl(
        ([127, 0, 0, 1], 0).into(),
        "near.test",
        &[(HOST, ip.parse().expect("ip"))],
        1,
    )
    .await
    .expect("DNS server")
}

/// Runs an agent `name` of `group` resolving through `dns`.
fn agent(
    ca: &Ca,
    name: &str,
    group: &str,
    key: &str,
    dns: &DnsServer,
) -> (tokio::sync::oneshot::Sender<()>, AgentTask) {
    let mut config = agent_config(ca, name, name, group, key);
    config.dns_server = Some(dns.addr());
    config.dns_stale_grace_s = 0;
    config.check_timeout_ms = 1000;
    spawn_agent(config)
}

/// Waits up to `limit` for `f`, checking every 100 ms; panics with `what`.
async fn wait_for<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The connector with the slower path is chosen only when no
/// near one is healthy; the explanation shows each candidate's RTT and why.
///
/// Needs root, `/dev/net/tun` and `ip` for the delayed path; it fails,
/// never skips, with a message naming what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nearest_takes_the_slow_path_only_when_the_near_one_is_down() {
    let slow = DelayLink::create(Duration::from_millis(30))
        .unwrap_or_else(|e| panic!("cannot build the delayed path: {e:#}"));
    let near_dns = dns("127.0.18.1").await;
    let far_dns = dns(&slow.far().to_string()).await;
    // The CA's strategy stays healthy; the segment asks for nearest.
    let text = config_text(
        "",
        "discovery_timeout_ms = 400",
        &Segment::new("near")
            .apps([HOST])
            .udp([PORT])
            .interval_ms(300)
            .groups(["dc-east", "dc-west"])
            .extra("strategy = \"nearest\"")
            .toml(),
    );
    let ca = Ca::start(&text).await;
    let (stop_near, near) = agent(&ca, "near-1", "dc-east", KEY_EAST, &near_dns);
    let (stop_far, far) = agent(&ca, "far-1", "dc-west", KEY_WEST, &far_dns);
    let http = ca.web();

    // Both report the application Up, with smoothed RTTs far apart.
    let rtts = |v: &serde_json::Value| -> HashMap<String, f64> {
        v["connectors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["status"] == "up")
            .filter_map(|c| {
                Some((
                    c["connector"].as_str()?.to_owned(),
                    c["smoothed_rtt_ms"].as_f64()?,
                ))
            })
            .collect()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let seen = loop {
        let seen = http
            .app("near", HOST, u64::from(PORT))
            .await
            .map(|v| rtts(&v))
            .unwrap_or_default();
        if seen.get("far-1").is_some_and(|ms| *ms >= 25.0) && seen.contains_key("near-1") {
            break seen;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "both connectors report an RTT: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(seen["near-1"] < 5.0, "{seen:?}");

    let mut chosen: HashMap<String, usize> = HashMap::new();
    let mut last = serde_json::Value::Null;
    for _ in 0..40 {
        let (s, v) = http.access(HOST, "udp", PORT).await;
        assert_eq!(s, 200, "{v}");
        *chosen
            .entry(v["connector"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
        last = v;
    }
    assert_eq!(chosen.get("near-1"), Some(&40), "{chosen:?}");
    let explanation = &last["explanation"];
    assert_eq!(explanation["strategy"], "nearest", "{explanation}");
    let note = |name: &str| {
        explanation["candidates"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["connector"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} in {explanation}"))
    };
    let (n, f) = (note("near-1"), note("far-1"));
    assert_eq!(n["eligible"], true);
    assert!(
        n["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("within the tolerance"),
        "{n}"
    );
    assert_eq!(f["eligible"], false);
    assert!(f["rtt_ms"].as_f64().is_some_and(|ms| ms >= 25.0), "{f}");
    assert!(
        f["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("a nearer connector is reachable"),
        "{f}"
    );

    // The near connector's application goes Down (its name disappears):
    // now the slow path carries the requests.
    near_dns.set_mode(Mode::NxDomain);
    wait_for(
        "far-1 carries the requests",
        Duration::from_secs(20),
        || {
            let http = &http;
            async move {
                let (s, v) = http.access(HOST, "udp", PORT).await;
                s == 200 && v["connector"] == "far-1"
            }
        },
    )
    .await;
    let (_, v) = http.access(HOST, "udp", PORT).await;
    assert_eq!(v["connector"], "far-1", "{v}");

    let _ = stop_near.send(());
    let _ = stop_far.send(());
    let _ = near.await;
    let _ = far.await;
    ca.stop().await;
    drop(slow);
}

/// `app` with every reachable address at `rtt_ms`.
fn app_rtt(host: &str, up: bool, rtt_ms: u64) -> protocol::v1::ApplicationHealth {
    let mut a = if up {
        app("jira", host, 80, &["127.0.0.21"], &[])
    } else {
        app("jira", host, 80, &[], &["127.0.0.21"])
    };
    for r in &mut a.addresses {
        if r.status == protocol::v1::HealthStatus::Up as i32 {
            r.rtt_us = rtt_ms * 1000;
        }
    }
    a
}

/// Through the CA's real sessions: the CA smooths the RTTs the
/// connectors report (EWMA per connector and application), `nearest`
/// (here the CA's global strategy) takes the nearer one, both once their
/// smoothed RTTs are within the tolerance, and the farther one when the
/// nearer one reports Down; the health API shows the smoothed RTT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nearest_follows_the_smoothed_rtt_the_connectors_report() {
    let text = config_text(
        "",
        "strategy = \"nearest\"\nnearest_tolerance_percent = 20\nnearest_tolerance_ms = 2",
        "",
    );
    let ca = Ca::start(&text).await;
    let (slow, _) = connect(&ca, "e1", "dc-east").await;
    let (fast, _) = connect(&ca, "e2", "dc-east").await;
    let host = "127.0.0.21";
    slow.report(vec![app_rtt(host, true, 40)], true).await;
    fast.report(vec![app_rtt(host, true, 1)], true).await;
    let http: &'static Http = Box::leak(Box::new(ca.web()));
    let both_up = || async {
        http.app("jira", host, 80).await.is_some_and(|v| {
            v["connectors"]
                .as_array()
                .is_some_and(|cs| cs.iter().filter(|c| c["status"] == "up").count() == 2)
        })
    };
    eventually("both connectors up", both_up).await;
    let draw = |n: usize| async move {
        let mut chosen: HashMap<String, usize> = HashMap::new();
        let mut last = serde_json::Value::Null;
        for _ in 0..n {
            let (s, v) = http.access(host, "tcp", 80).await;
            assert_eq!(s, 200, "{v}");
            *chosen
                .entry(v["connector"].as_str().unwrap_or_default().to_owned())
                .or_default() += 1;
            last = v;
        }
        (chosen, last)
    };
    let (chosen, last) = draw(30).await;
    assert_eq!(chosen.get("e2"), Some(&30), "{chosen:?}");
    let e = &last["explanation"];
    assert_eq!(e["strategy"], "nearest");
    let e1 = e["candidates"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["connector"] == "e1"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(e1["eligible"], false, "{e1}");
    assert_eq!(e1["rtt_ms"].as_f64(), Some(40.0), "{e1}");
    assert!(
        e1["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("rtt 40.000 ms is beyond 3.000 ms"),
        "{e1}"
    );

    // e1's path gets faster: one report moves its average only by 30 %,
    // ten bring it within the tolerance (best 1 ms, up to 3 ms).
    slow.report(vec![app_rtt(host, true, 1)], false).await;
    let smoothed = |http: &'static Http| async move {
        http.app("jira", host, 80).await.and_then(|v| {
            v["connectors"]
                .as_array()?
                .iter()
                .find(|c| c["connector"] == "e1")?["smoothed_rtt_ms"]
                .as_f64()
        })
    };
    eventually("e1's average moves by 30 %", || async {
        smoothed(http)
            .await
            .is_some_and(|ms| (ms - 28.3).abs() < 0.01)
    })
    .await;
    // The application's detail (`GET /api/v1/application`, the dashboard's
    // application page) shows the same smoothed RTT per connector.
    let (s, detail) = http
        .get_json(
            &format!("/api/v1/application?segment=jira&host={host}&protocol=tcp&port=80"),
            Some(READ_TOKEN),
        )
        .await;
    assert_eq!(s, 200, "{detail}");
    let rtt_of = |name: &str| {
        detail["application"]["connectors"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["connector"] == name))
            .and_then(|c| c["smoothed_rtt_ms"].as_f64())
    };
    assert!(
        rtt_of("e1").is_some_and(|ms| (ms - 28.3).abs() < 0.01),
        "{detail}"
    );
    assert_eq!(rtt_of("e2"), Some(1.0), "{detail}");
    for _ in 0..9 {
        slow.report(vec![app_rtt(host, true, 1)], false).await;
    }
    eventually("e1 within the tolerance", || async {
        smoothed(http).await.is_some_and(|ms| ms < 3.0)
    })
    .await;
    let (chosen, _) = draw(60).await;
    assert!(
        chosen.get("e1").is_some_and(|n| *n > 10) && chosen.get("e2").is_some_and(|n| *n > 10),
        "near-equals share the requests: {chosen:?}"
    );

    // The nearer one reports Down: only then does a slower one carry.
    slow.report(vec![app_rtt(host, true, 40)], false).await;
    for _ in 0..10 {
        slow.report(vec![app_rtt(host, true, 40)], false).await;
    }
    eventually("e1 slow again", || async {
        smoothed(http).await.is_some_and(|ms| ms > 30.0)
    })
    .await;
    assert_eq!(draw(10).await.0.get("e2"), Some(&10));
    fast.report(vec![app_rtt(host, false, 0)], false).await;
    eventually("e2 down", || async {
        http.access(host, "tcp", 80).await.1["connector"] == "e1"
    })
    .await;
    assert_eq!(draw(10).await.0.get("e1"), Some(&10));
    ca.stop().await;
}

/// An application result of segment `geo` for `127.0.0.22:80`, Up with
/// every address at `rtt_ms`.
fn geo_app(rtt_ms: u64) -> protocol::v1::ApplicationHealth {
    let mut a = app("geo", "127.0.0.22", 80, &["127.0.0.22"], &[]);
    for r in &mut a.addresses {
        r.rtt_us = rtt_ms * 1000;
    }
    a
}

/// Paris, where the user of most requests below is.
const PARIS: (f64, f64) = (48.8566, 2.3522);

/// `POST /api/v1/access` for the `geo` application, with the user at
/// `at` when given.
async fn access_from(http: &Http, at: Option<(f64, f64)>) -> (u16, serde_json::Value) {
    let mut body = serde_json::json!({"host": "127.0.0.22", "protocol": "tcp", "port": 80});
    if let Some((latitude, longitude)) = at {
        body["user_location"] = serde_json::json!({"latitude": latitude, "longitude": longitude});
    }
    let (s, text) = http
        .send("POST", "/api/v1/access", Some(ACCESS_TOKEN), Some(body))
        .await;
    (
        s,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

/// The user's location: with dc-east in Frankfurt and dc-west
/// in New York, a request from Paris goes to dc-east's connector although
/// dc-west's reports a lower RTT to the application (5 ms + ~4.8 ms for the
/// 478 km against 1 ms + ~58 ms for 5,837 km); without a location the
/// lower RTT wins, and from Boston dc-west wins. Through the real HTTP API
/// and gRPC; bad locations are refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nearest_weighs_the_users_distance_to_each_group() {
    let text = config_text(
        "",
        "strategy = \"nearest\"",
        &segment("geo")
            .apps(["127.0.0.22"])
            .tcp(["80"])
            .groups(["dc-east", "dc-west"])
            .toml(),
    )
    .replace(
        &format!("provisioning_key = \"{KEY_EAST}\""),
        &format!(
            "provisioning_key = \"{KEY_EAST}\"\nlocation = {{ latitude = 50.1109, longitude = 8.6821 }}"
        ),
    )
    .replace(
        &format!("provisioning_key = \"{KEY_WEST}\""),
        &format!(
            "provisioning_key = \"{KEY_WEST}\"\nlocation = {{ latitude = 40.7128, longitude = -74.006 }}"
        ),
    );
    let ca = Ca::start(&text).await;
    let (east, _) = connect(&ca, "fra-1", "dc-east").await;
    let (west, _) = connect(&ca, "ny-1", "dc-west").await;
    east.report(vec![geo_app(5)], true).await;
    west.report(vec![geo_app(1)], true).await;
    let http: &'static Http = Box::leak(Box::new(ca.web()));
    eventually("both connectors up with their RTTs", || async {
        http.app("geo", "127.0.0.22", 80).await.is_some_and(|v| {
            v["connectors"].as_array().is_some_and(|cs| {
                cs.iter()
                    .filter(|c| c["status"] == "up" && c["smoothed_rtt_ms"].as_f64().is_some())
                    .count()
                    == 2
            })
        })
    })
    .await;

    let draw = |at: Option<(f64, f64)>, n: usize| async move {
        let mut chosen: HashMap<String, usize> = HashMap::new();
        let mut last = serde_json::Value::Null;
        for _ in 0..n {
            let (s, v) = access_from(http, at).await;
            assert_eq!(s, 200, "{v}");
            *chosen
                .entry(v["connector"].as_str().unwrap_or_default().to_owned())
                .or_default() += 1;
            last = v;
        }
        (chosen, last)
    };
    // No location: the lower application RTT wins.
    let (chosen, last) = draw(None, 20).await;
    assert_eq!(chosen.get("ny-1"), Some(&20), "{chosen:?}");
    assert_eq!(
        last["explanation"]["user_location"],
        serde_json::Value::Null
    );

    // From Paris: Frankfurt's connector, and the explanation says why.
    let (chosen, last) = draw(Some(PARIS), 20).await;
    assert_eq!(chosen.get("fra-1"), Some(&20), "{chosen:?}");
    let e = &last["explanation"];
    assert_eq!(e["user_location"]["used"], true, "{e}");
    assert_eq!(e["user_location"]["latitude"], PARIS.0, "{e}");
    let note = |name: &str| {
        e["candidates"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["connector"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("{name} in {e}"))
    };
    let (fra, ny) = (note("fra-1"), note("ny-1"));
    assert_eq!(fra["eligible"], true, "{fra}");
    assert_eq!(ny["eligible"], false, "{ny}");
    assert!(
        fra["distance_km"]
            .as_f64()
            .is_some_and(|km| (km - 478.0).abs() < 5.0),
        "{fra}"
    );
    assert!(
        ny["distance_km"]
            .as_f64()
            .is_some_and(|km| (km - 5837.0).abs() < 10.0),
        "{ny}"
    );
    let score = |n: &serde_json::Value| n["score_ms"].as_f64().unwrap_or_default();
    assert!(
        (score(&fra) - 5.0 - fra["user_rtt_ms"].as_f64().unwrap_or_default()).abs() < 1e-6,
        "{fra}"
    );
    assert!(score(&ny) > score(&fra) + 40.0, "{ny} {fra}");
    assert!(
        fra["reason"]
            .as_str()
            .is_some_and(|r| r.contains("from the user (477.9 km) = score")
                && r.contains("within the tolerance")),
        "{fra}"
    );
    assert!(
        ny["reason"]
            .as_str()
            .is_some_and(|r| r.contains("a nearer connector is reachable")),
        "{ny}"
    );

    // From Boston, New York's connector is both nearer and faster.
    let (chosen, _) = draw(Some((42.3601, -71.0589)), 10).await;
    assert_eq!(chosen.get("ny-1"), Some(&10), "{chosen:?}");

    // Out of range or wrongly shaped: 400 naming the field.
    for (body, field) in [
        (
            serde_json::json!({"latitude": 91.0, "longitude": 2.0}),
            "user_location.latitude 91",
        ),
        (
            serde_json::json!({"latitude": 48.0, "longitude": -181}),
            "user_location.longitude -181",
        ),
        (serde_json::json!({"latitude": 48.0}), "longitude"),
    ] {
        let (s, text) = http
            .send(
                "POST",
                "/api/v1/access",
                Some(ACCESS_TOKEN),
                Some(
                    serde_json::json!({"host": "127.0.0.22", "protocol": "tcp", "port": 80,
                    "user_location": body}),
                ),
            )
            .await;
        assert_eq!(s, 400, "{text}");
        assert!(
            text.contains("invalid_request") && text.contains(field),
            "{field}: {text}"
        );
    }

    // The same through gRPC.
    let mut client = protocol::v1::access_client::AccessClient::new(ca.channel().await);
    let grpc = |latitude: f64, longitude: f64| {
        with_access_token(protocol::v1::AccessRequest {
            host: "127.0.0.22".into(),
            protocol: protocol::v1::Protocol::Tcp as i32,
            port: 80,
            user_location: Some(protocol::v1::GeoLocation {
                latitude,
                longitude,
            }),
        })
    };
    let d = client
        .resolve(grpc(PARIS.0, PARIS.1))
        .await
        .expect("answered")
        .into_inner();
    match d.outcome {
        Some(protocol::v1::access_decision::Outcome::Selected(s)) => {
            assert_eq!(s.connector, "fra-1")
        }
        other => panic!("expected a selection, got {other:?}"),
    }
    let e = d.explanation.expect("explanation");
    assert!(e.user_location.is_some_and(|u| u.used));
    assert!(
        e.candidates
            .iter()
            .all(|c| c.distance_km.is_some() && c.user_rtt_us.is_some() && c.score_us.is_some()),
        "{:?}",
        e.candidates
    );
    let err = client
        .resolve(grpc(f64::NAN, 2.0))
        .await
        .expect_err("invalid");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("user_location.latitude"),
        "{}",
        err.message()
    );
    ca.stop().await;
}
