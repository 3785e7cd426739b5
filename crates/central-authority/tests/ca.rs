//! In-process tests of the CA over loopback: real tonic clients act as
//! connectors, a hyper client uses the JSON API.

mod common;

use std::time::Duration;

use common::*;
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;

#[tokio::test]
async fn welcome_carries_the_groups_segments_and_settings() {
    let ca = Ca::start(&config_text(
        "heartbeat_interval_ms = 1234\non_access_window_ms = 60000\naccess_forward_interval_ms = 1000",
        "",
        "",
    ))
    .await;
    let (_c, w) = connect(&ca, "east-1", "dc-east").await;
    let mut names: Vec<_> = w.segments.iter().map(|s| s.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["jira", "lab", "payroll"]);
    let s = w.settings.expect("settings");
    assert_eq!(s.heartbeat_interval_ms, 1234);
    assert_eq!(s.on_access_window_ms, 60_000);
    assert!(!w.session_id.is_empty());
    ca.stop().await;
}

#[tokio::test]
async fn reports_are_accepted_only_for_the_groups_applications() {
    let ca = Ca::start(&default_config()).await;
    let http = ca.web();
    let (west, _) = connect(&ca, "west-1", "dc-west").await;
    let (east, _) = connect(&ca, "east-1", "dc-east").await;
    // dc-west does not serve "jira": rejected. A host outside the segment
    // and a port outside it are rejected too.
    west.report(
        vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
        true,
    )
    .await;
    east.report(
        vec![
            app("jira", "other.test.reach", 80, &["127.0.0.21"], &[]),
            app("jira", "jira.test.reach", 81, &["127.0.0.21"], &[]),
            app(
                "jira",
                "jira.test.reach",
                80,
                &["127.0.0.21"],
                &["127.0.0.22"],
            ),
        ],
        true,
    )
    .await;
    eventually("east's report lands", || async {
        http.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "unhealthy")
    })
    .await;
    let a = http
        .app("jira", "jira.test.reach", 80)
        .await
        .expect("listed");
    let conns = a["connectors"].as_array().expect("connectors");
    assert_eq!(conns.len(), 1, "only dc-east's connector is listed: {a}");
    assert_eq!(conns[0]["connector"], "east-1");
    assert!(http.app("jira", "other.test.reach", 80).await.is_none());
    assert!(http.app("jira", "jira.test.reach", 81).await.is_none());
    let (_, metrics) = http.send("GET", "/metrics", Some(READ_TOKEN), None).await;
    assert!(
        metrics.contains("reach_ca_reports_rejected_total 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("reach_ca_reports_received_total 1"),
        "{metrics}"
    );
    ca.stop().await;
}

#[tokio::test]
async fn a_reconnecting_connector_replaces_its_old_session() {
    // Session ids are shown to administrators only.
    let admin = "[[api_tokens]]\nname = \"root\"\ntoken = \"tok-admin-PlQ7jmHXY1X2oyup1UokZXlp\"\nscopes = [\"admin\"]\n";
    let ca = Ca::start(&config_text("", "", admin)).await;
    let http = ca.web();
    let (mut old, w1) = connect(&ca, "east-1", "dc-east").await;
    old.report(
        vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
        true,
    )
    .await;
    eventually("report lands", || async {
        http.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;
    let (new, w2) = connect(&ca, "east-1", "dc-east").await;
    assert_ne!(w1.session_id, w2.session_id);
    match old.next().await {
        Some(Out::Shutdown(s)) => assert!(s.reason.contains("replaced"), "{s:?}"),
        other => panic!("expected Shutdown, got {other:?}"),
    }
    assert!(old.next().await.is_none(), "old stream is closed");
    let (_, v) = http
        .get_json(
            "/api/v1/connectors",
            Some("tok-admin-PlQ7jmHXY1X2oyup1UokZXlp"),
        )
        .await;
    let conns = v["connectors"].as_array().expect("connectors");
    assert_eq!(conns.len(), 1);
    assert_eq!(conns[0]["connected"], true);
    assert_eq!(conns[0]["session_id"], w2.session_id.as_str());
    // The connector is still there: its results stand across the
    // replacement, until the new session's full state replaces them.
    let a = http
        .app("jira", "jira.test.reach", 80)
        .await
        .expect("listed");
    assert_eq!(a["connectors"][0]["status"], "up");
    new.report(vec![], true).await;
    eventually("the full state's omission lands", || async {
        http.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["connectors"][0]["status"] == "unknown")
    })
    .await;
    ca.stop().await;
}

#[tokio::test]
async fn disconnect_turns_the_connectors_applications_unknown() {
    let ca = Ca::start(&default_config()).await;
    let http = ca.web();
    let (c, _) = connect(&ca, "east-1", "dc-east").await;
    c.report(
        vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
        true,
    )
    .await;
    eventually("up", || async {
        http.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;
    drop(c);
    eventually("unknown after disconnect", || async {
        http.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| {
                a["status"] == "unknown" && a["connectors"][0]["unknown_cause"] == "disconnected"
            })
    })
    .await;
    let (_, v) = http.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
    assert_eq!(v["connectors"][0]["connected"], false);
    let (s, v) = http.access("jira.test.reach", "tcp", 80).await;
    assert_eq!((s, &v["error"]["reason"]), (503, &"no_connector".into()));
    let a = http
        .app("jira", "jira.test.reach", 80)
        .await
        .expect("listed");
    let causes: Vec<_> = a["transitions"]
        .as_array()
        .expect("t")
        .iter()
        .map(|t| t["cause"].clone())
        .collect();
    assert!(causes.contains(&"disconnected".into()), "{a}");
    ca.stop().await;
}

#[tokio::test]
async fn stale_reports_turn_unknown() {
    let extra = &Segment::new("fast")
        .apps(["127.0.0.31"])
        .tcp(["80"])
        .interval_ms(200)
        .groups(["dc-east"])
        .toml();
    let ca = Ca::start(&config_text("stale_after_intervals = 2", "", extra)).await;
    let http = ca.web();
    let (c, _) = connect(&ca, "east-1", "dc-east").await;
    c.heartbeat(v1::CheckLoad {
        cycle_seconds: 0.0,
        rate_limit: 20,
        ..Default::default()
    })
    .await;
    let reported = std::time::Instant::now();
    c.report(
        vec![app("fast", "127.0.0.31", 80, &["127.0.0.31"], &[])],
        false,
    )
    .await;
    eventually("up", || async {
        http.app("fast", "127.0.0.31", 80)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;
    // 2 intervals of 200 ms plus a zero cycle: unknown after 400 ms.
    eventually("stale → unknown", || async {
        http.app("fast", "127.0.0.31", 80)
            .await
            .is_some_and(|a| a["status"] == "unknown")
    })
    .await;
    let stale_after = reported.elapsed();
    assert!(
        stale_after >= Duration::from_millis(400),
        "unknown {stale_after:?} after the report, before 2 intervals of 200 ms"
    );
    let a = http.app("fast", "127.0.0.31", 80).await.expect("listed");
    assert_eq!(a["status"], "unknown", "{a}");
    assert_eq!(a["connectors"][0]["unknown_cause"], "stale");
    let (s, v) = http.access("127.0.0.31", "tcp", 80).await;
    assert_eq!(
        (s, &v["error"]["reason"]),
        (503, &"no_health_report".into()),
        "{v}"
    );
    ca.stop().await;
}

#[tokio::test]
async fn every_refusal_reason_is_reachable() {
    let ca = Ca::start(&default_config()).await;
    let http = ca.web();
    let reason = |v: &serde_json::Value| v["error"]["reason"].as_str().unwrap_or("").to_owned();

    let (s, v) = http.access("nothing.test.reach", "tcp", 80).await;
    assert_eq!((s, reason(&v).as_str()), (404, "no_segment"), "{v}");
    let (s, v) = http.access("jira.test.reach", "tcp", 8080).await;
    assert_eq!(
        (s, reason(&v).as_str()),
        (403, "port_not_in_segment"),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("jira")
    );
    let (s, v) = http.access("jira.test.reach", "tcp", 80).await;
    assert_eq!((s, reason(&v).as_str()), (503, "no_connector"), "{v}");
    let (s, v) = http.access("jira.test.reach", "tcp", 0).await;
    assert_eq!((s, reason(&v).as_str()), (400, "invalid_request"), "{v}");
    let (s, v) = http.access("jira.test.reach", "sctp", 80).await;
    assert_eq!((s, reason(&v).as_str()), (400, "invalid_request"), "{v}");
    let (s, body) = http
        .send(
            "POST",
            "/api/v1/access",
            Some(ACCESS_TOKEN),
            Some(serde_json::json!({"host": 5})),
        )
        .await;
    assert_eq!(s, 400, "{body}");

    let (east, _) = connect(&ca, "east-1", "dc-east").await;
    let (s, v) = http.access("jira.test.reach", "tcp", 80).await;
    assert_eq!((s, reason(&v).as_str()), (503, "no_health_report"), "{v}");
    east.report(
        vec![app("jira", "jira.test.reach", 80, &[], &["127.0.0.21"])],
        true,
    )
    .await;
    eventually("down", || async {
        http.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "down")
    })
    .await;
    let (s, v) = http.access("jira.test.reach", "tcp", 80).await;
    assert_eq!((s, reason(&v).as_str()), (503, "all_down"), "{v}");
    assert_eq!(v["explanation"]["candidates"][0]["connector"], "east-1");

    // On-access with a connector that never answers: discovery times out
    // (discovery_timeout_ms = 400 in the default test config).
    let started = std::time::Instant::now();
    let (s, v) = http.access("box.lab.test.reach", "tcp", 8001).await;
    assert_eq!((s, reason(&v).as_str()), (503, "discovery_timeout"), "{v}");
    assert!(started.elapsed() >= Duration::from_millis(380));
    assert_eq!(v["explanation"]["discovery_waited"], true);

    // The same through gRPC: a refusal is an answer, not an error.
    let mut client = v1::access_client::AccessClient::new(ca.channel().await);
    let req = with_access_token(v1::AccessRequest {
        host: "nothing.test.reach".into(),
        protocol: v1::Protocol::Tcp as i32,
        port: 80,
        user_location: None,
    });
    let d = client.resolve(req).await.expect("answered").into_inner();
    match d.outcome {
        Some(v1::access_decision::Outcome::Refusal(r)) => {
            assert_eq!(r.reason, v1::RefusalReason::NoSegment as i32)
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let req = with_access_token(v1::AccessRequest {
        host: "x".into(),
        protocol: 0,
        port: 80,
        user_location: None,
    });
    let err = client.resolve(req).await.expect_err("invalid");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    let (_, metrics) = http.send("GET", "/metrics", Some(READ_TOKEN), None).await;
    for outcome in [
        "no_segment",
        "port_not_in_segment",
        "no_connector",
        "all_down",
        "no_health_report",
        "discovery_timeout",
    ] {
        assert!(
            metrics.contains(&format!("outcome=\"{outcome}\"")),
            "{outcome} missing in {metrics}"
        );
    }
    assert!(metrics.contains("reach_ca_decision_duration_seconds_bucket"));
    ca.stop().await;
}

/// A port outside 1-65535 is refused alike through HTTP and gRPC: the same
/// `invalid_request` and the same message, before any decision is made.
#[tokio::test]
async fn a_bad_port_is_refused_alike_over_http_and_grpc() {
    let ca = Ca::start(&default_config()).await;
    let http = ca.web();
    let mut client = v1::access_client::AccessClient::new(ca.channel().await);
    for port in [0, 65_536, 70_000, u32::MAX] {
        let (s, v) = http.access("jira.test.reach", "tcp", port).await;
        assert_eq!((s, &v["error"]["reason"]), (400, &"invalid_request".into()));
        let message = format!("port {port} is outside 1-65535");
        assert_eq!(v["error"]["message"], message.as_str(), "{v}");
        let req = with_access_token(v1::AccessRequest {
            host: "jira.test.reach".into(),
            protocol: v1::Protocol::Tcp as i32,
            port,
            user_location: None,
        });
        let e = client.resolve(req).await.expect_err("refused");
        assert_eq!(
            (e.code(), e.message()),
            (tonic::Code::InvalidArgument, message.as_str())
        );
    }
    // Over HTTP a port may also be negative or not a whole number.
    for (port, shown) in [
        (serde_json::json!(-1), "-1"),
        (serde_json::json!(80.5), "80.5"),
    ] {
        let body = serde_json::json!({"host": "jira.test.reach", "protocol": "tcp", "port": port});
        let (s, text) = http
            .send("POST", "/api/v1/access", Some(ACCESS_TOKEN), Some(body))
            .await;
        assert_eq!(s, 400, "{text}");
        assert!(
            text.contains(&format!("port {shown} is outside 1-65535")),
            "{text}"
        );
    }
    // Both are refusals of the request, not decisions: none is counted.
    let (_, metrics) = http.send("GET", "/metrics", Some(READ_TOKEN), None).await;
    assert!(!metrics.contains("reach_ca_decisions_total{"), "{metrics}");
    ca.stop().await;
}

#[tokio::test]
async fn on_access_discovery_waits_for_the_first_reachable_report() {
    let ca = Ca::start(&config_text("", "discovery_timeout_ms = 3000", "")).await;
    let http = ca.web();
    let (mut west, _) = connect(&ca, "west-1", "dc-west").await;
    let (mut east, _) = connect(&ca, "east-1", "dc-east").await;
    let h = ca.web();
    let request = tokio::spawn(async move { h.access("Box.Lab.Test.Reach", "tcp", 8001).await });
    // Both candidates get the access event for the host the user asked for.
    for c in [&mut west, &mut east] {
        match c.next().await {
            Some(Out::Access(e)) => {
                let k = e.app.expect("app");
                assert_eq!(
                    (k.segment.as_str(), k.host.as_str(), k.port),
                    ("lab", "box.lab.test.reach", 8001)
                );
            }
            other => panic!("expected AccessEvent, got {other:?}"),
        }
    }
    east.report(
        vec![app("lab", "box.lab.test.reach", 8001, &[], &["127.0.1.5"])],
        false,
    )
    .await;
    west.report(
        vec![app("lab", "box.lab.test.reach", 8001, &["127.0.1.5"], &[])],
        false,
    )
    .await;
    let (s, v) = request.await.expect("join");
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["connector"], "west-1");
    assert_eq!(v["group"], "dc-west");
    assert_eq!(v["segment"], "lab");
    assert_eq!(v["explanation"]["discovery_waited"], true);
    assert_eq!(v["explanation"]["matched_entry"], "*.lab.test.reach");
    assert!(v["explanation"]["discovery_ms"].as_u64().expect("ms") < 3000);

    // A second access soon after selects at once and is coalesced: nothing
    // is forwarded again within access_forward_interval.
    let (s, v) = http.access("box.lab.test.reach", "tcp", 8001).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["explanation"]["discovery_waited"], false);
    assert_eq!(
        v["explanation"]["forwarded_to"].as_array().map(Vec::len),
        Some(0),
        "{v}"
    );
    assert!(west.next_within(Duration::from_millis(100)).await.is_none());

    // The application is listed (on-access applications appear once reported).
    let a = http
        .app("lab", "box.lab.test.reach", 8001)
        .await
        .expect("listed");
    assert_eq!(a["status"], "up");
    ca.stop().await;
}

/// Over real sessions: an on-access result no access asked for
/// (a hand-written connector's report without an access id) is listed as
/// Unknown "unsolicited" and not routed on: the next access is forwarded,
/// with an access id, and decided on the connector's answer to it.
#[tokio::test]
async fn an_unsolicited_on_access_report_is_listed_but_not_routed_on() {
    let ca = Ca::start(&config_text("", "discovery_timeout_ms = 3000", "")).await;
    let http = ca.web();
    let (mut west, _) = connect(&ca, "west-1", "dc-west").await;
    west.report(
        vec![app(
            "lab",
            "nobody.lab.test.reach",
            8003,
            &["127.0.1.7"],
            &[],
        )],
        false,
    )
    .await;
    eventually("listed as unsolicited", || async {
        http.app("lab", "nobody.lab.test.reach", 8003)
            .await
            .is_some_and(|a| {
                a["status"] == "unknown" && a["connectors"][0]["unknown_cause"] == "unsolicited"
            })
    })
    .await;
    let h = ca.web();
    let request = tokio::spawn(async move { h.access("nobody.lab.test.reach", "tcp", 8003).await });
    match west.next().await {
        Some(Out::Access(e)) => assert!(e.access_id.starts_with("a1."), "{e:?}"),
        other => panic!("expected AccessEvent, got {other:?}"),
    }
    let mut answer = app("lab", "nobody.lab.test.reach", 8003, &[], &["127.0.1.7"]);
    answer.access_id = "a1.0.forged".into();
    west.report(vec![answer], false).await;
    let (s, v) = request.await.expect("join");
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["error"]["reason"], "all_down", "{v}");
    assert_eq!(v["explanation"]["discovery_waited"], true, "{v}");
    ca.stop().await;
}

#[tokio::test]
async fn on_access_windows_end_by_report_and_by_the_cas_own_clock() {
    let ca = Ca::start(&config_text(
        "on_access_window_ms = 800\naccess_forward_interval_ms = 100",
        "discovery_timeout_ms = 2000",
        "",
    ))
    .await;
    let http = ca.web();
    let (mut west, _) = connect(&ca, "west-1", "dc-west").await;
    let h = ca.web();
    let request = tokio::spawn(async move { h.access("a.lab.test.reach", "tcp", 8000).await });
    assert!(matches!(west.next().await, Some(Out::Access(_))));
    west.report(
        vec![app("lab", "a.lab.test.reach", 8000, &["127.0.1.1"], &[])],
        false,
    )
    .await;
    assert_eq!(request.await.expect("join").0, 200);

    // The connector says the window ended: Unknown at once, and the next
    // access is forwarded again (not coalesced away).
    let mut expired = app("lab", "a.lab.test.reach", 8000, &[], &[]);
    expired.status = v1::HealthStatus::Unknown as i32;
    expired.expired = true;
    west.report(vec![expired], false).await;
    eventually("expired → unknown", || async {
        http.app("lab", "a.lab.test.reach", 8000)
            .await
            .is_some_and(|a| {
                a["status"] == "unknown" && a["connectors"][0]["unknown_cause"] == "window_expired"
            })
    })
    .await;
    let h = ca.web();
    let accessed = std::time::Instant::now();
    let request = tokio::spawn(async move { h.access("a.lab.test.reach", "tcp", 8000).await });
    assert!(
        matches!(west.next().await, Some(Out::Access(_))),
        "re-forwarded after expiry"
    );
    west.report(
        vec![app("lab", "a.lab.test.reach", 8000, &["127.0.1.1"], &[])],
        false,
    )
    .await;
    assert_eq!(request.await.expect("join").0, 200);
    eventually("up again after the report", || async {
        http.app("lab", "a.lab.test.reach", 8000)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;

    // Without further accesses the CA's own window (800 ms) ends, even if
    // the connector never says so.
    eventually("the CA's window ends → unknown", || async {
        http.app("lab", "a.lab.test.reach", 8000)
            .await
            .is_some_and(|a| a["status"] == "unknown")
    })
    .await;
    let ended = accessed.elapsed();
    assert!(
        ended >= Duration::from_millis(800),
        "window ended {ended:?} after the access, before its 800 ms"
    );
    let a = http
        .app("lab", "a.lab.test.reach", 8000)
        .await
        .expect("listed");
    assert_eq!(a["status"], "unknown", "{a}");
    assert_eq!(a["connectors"][0]["unknown_cause"], "window_expired");
    ca.stop().await;
}

#[tokio::test]
async fn none_segments_select_any_connected_connector_and_group_strategy_works() {
    let extra = &segment("shared")
        .apps(["shared.test.reach"])
        .tcp(["80"])
        .groups(["dc-east", "dc-west"])
        .toml();
    let ca = Ca::start(&config_text("", "strategy = \"group\"", extra)).await;
    let http = ca.web();
    let (_w, _) = connect(&ca, "west-1", "dc-west").await;
    let (s, v) = http.access("legacy.test.reach", "tcp", 9000).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["connector"], "west-1");

    let (east, _) = connect(&ca, "east-1", "dc-east").await;
    let (_east2, _) = connect(&ca, "east-2", "dc-east").await;
    east.report(
        vec![app("shared", "shared.test.reach", 80, &["127.0.0.41"], &[])],
        false,
    )
    .await;
    eventually("up", || async {
        http.app("shared", "shared.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;
    // Group strategy: dc-east is the only eligible group; east-2 has not
    // reported Down, so either east connector may be chosen, never west-1.
    for _ in 0..10 {
        let (s, v) = http.access("shared.test.reach", "tcp", 80).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["group"], "dc-east");
        assert_eq!(v["explanation"]["chosen_group"], "dc-east");
        assert_eq!(v["explanation"]["strategy"], "group");
    }
    ca.stop().await;
}

#[tokio::test]
async fn reload_pushes_valid_policy_and_refuses_invalid() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_test_writer()
        .try_init();
    let dir = scratch_dir("reload");
    let path = dir.join("ca.toml");
    std::fs::write(&path, default_config()).expect("write");
    let ca = Ca::start_file(&path).await;
    let http = ca.web();
    let (mut east, w) = connect(&ca, "east-1", "dc-east").await;
    let (mut west, _) = connect(&ca, "west-1", "dc-west").await;
    assert_eq!(w.segments.len(), 3);

    let added = &segment("new")
        .apps(["new.test.reach"])
        .tcp(["80"])
        .mode("none")
        .groups(["dc-east"])
        .toml();
    std::fs::write(&path, config_text("", "discovery_timeout_ms = 400", added)).expect("write");
    match east.next().await {
        Some(Out::PolicyUpdate(u)) => {
            assert!(u.segments.iter().any(|s| s.name == "new"), "{u:?}");
            assert_eq!(u.segments.len(), 4);
        }
        other => panic!("expected PolicyUpdate, got {other:?}"),
    }
    // dc-west's assignment did not change: no update.
    assert!(west.next_within(Duration::from_millis(200)).await.is_none());
    let (s, v) = http.access("new.test.reach", "tcp", 80).await;
    assert_eq!(s, 200, "{v}");

    // Invalid: refused, the running policy stays, nothing is pushed.
    let broken = config_text(
        "",
        "discovery_timeout_ms = 400",
        &added.replace("\"none\"", "\"sometimes\""),
    );
    std::fs::write(&path, broken).expect("write");
    let metrics = || async { http.send("GET", "/metrics", Some(READ_TOKEN), None).await.1 };
    eventually("reload rejected", || async {
        metrics()
            .await
            .contains("reach_ca_config_reloads_total{outcome=\"rejected\"} 1")
    })
    .await;
    assert!(east.next_within(Duration::from_millis(200)).await.is_none());
    let (s, _) = http.access("new.test.reach", "tcp", 80).await;
    assert_eq!(s, 200, "the running policy stays");

    // Removing a group closes its connectors' sessions with a Shutdown.
    let without_west = default_config()
        .replace(
            &format!("[[connector_groups]]\nname = \"dc-west\"\nprovisioning_key = \"{KEY_WEST}\""),
            "",
        )
        .replace(
            "connector_groups = [\"dc-east\", \"dc-west\"]",
            "connector_groups = [\"dc-east\"]",
        )
        .replace(
            "connector_groups = [\"dc-west\"]",
            "connector_groups = [\"dc-east\"]",
        );
    std::fs::write(&path, without_west).expect("write");
    match west.next().await {
        Some(Out::Shutdown(s)) => assert!(s.reason.contains("removed"), "{s:?}"),
        other => panic!("expected Shutdown, got {other:?}"),
    }
    ca.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn dashboard_and_health_api_hide_client_hostname_validation_apps() {
    let ca = Ca::start(&default_config()).await;
    let http = ca.web();
    let (east, _) = connect(&ca, "east-1", "dc-east").await;
    east.report(
        vec![
            app("payroll", "payroll.test.reach", 443, &["127.0.0.51"], &[]),
            app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[]),
        ],
        true,
    )
    .await;
    eventually("jira up", || async {
        http.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;
    let (_, v) = http.get_json("/api/v1/health", Some(READ_TOKEN)).await;
    assert!(!v.to_string().contains("payroll"), "{v}");

    let (s, html) = http.send("GET", "/", Some(READ_TOKEN), None).await;
    assert_eq!(s, 200);
    assert!(!html.contains("payroll"), "hidden application shown");
    // The page is a shell: its rows come from the API (one page at a time).
    assert!(html.contains(r#"<script src="/assets/dashboard.js" defer></script>"#));
    assert!(
        !html.contains(r#"http-equiv="refresh""#),
        "the page reloads itself"
    );
    let (_, v) = http
        .get_json("/api/v1/health?per_page=50", Some(READ_TOKEN))
        .await;
    assert!(!v.to_string().contains("payroll"), "{v}");
    for q in ["q=payroll", "segment=payroll", "status=unknown"] {
        let (_, v) = http
            .get_json(&format!("/api/v1/health?{q}"), Some(READ_TOKEN))
            .await;
        assert!(!v.to_string().contains("payroll"), "{q}: {v}");
    }
    // jira's IP entry has no report yet: Unknown.
    let ip = http.app("jira", "127.0.0.21", 80).await.expect("listed");
    assert_eq!(ip["status"], "unknown");
    let jira = http
        .app("jira", "jira.test.reach", 80)
        .await
        .expect("listed");
    assert_eq!(jira["connectors"][0]["connector"], "east-1");
    assert_eq!(
        jira["connectors"][0]["addresses"][0]["address"],
        "127.0.0.21"
    );
    assert_eq!(jira["connectors"][0]["addresses"][0]["method"], "tcp");
    let (s, _) = http
        .get_json(
            "/api/v1/application?segment=payroll&host=payroll.test.reach&protocol=tcp&port=443",
            Some(READ_TOKEN),
        )
        .await;
    assert_eq!(s, 404, "a hidden application's detail is served");
    ca.stop().await;
}

#[tokio::test]
async fn json_shapes_match_the_design() {
    let ca = Ca::start(&default_config()).await;
    let http = ca.web();
    let (east, _) = connect(&ca, "east-1", "dc-east").await;
    east.heartbeat(v1::CheckLoad {
        targets: 2,
        checks_per_cycle: 2,
        cycle_seconds: 0.1,
        rate_limit: 20,
        ..Default::default()
    })
    .await;
    east.report(
        vec![app(
            "jira",
            "jira.test.reach",
            80,
            &["127.0.0.21"],
            &["127.0.0.22"],
        )],
        true,
    )
    .await;
    eventually("unhealthy", || async {
        http.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "unhealthy")
    })
    .await;
    let a = http
        .app("jira", "jira.test.reach", 80)
        .await
        .expect("listed");
    for f in [
        "segment",
        "host",
        "protocol",
        "port",
        "status",
        "connectors",
    ] {
        assert!(a.get(f).is_some(), "{f} missing: {a}");
    }
    assert_eq!(a["protocol"], "tcp");
    let c = &a["connectors"][0];
    for f in ["connector", "group", "status", "reported_at", "addresses"] {
        assert!(c.get(f).is_some(), "{f} missing: {c}");
    }
    assert!(c["reported_at"].as_u64().is_some());
    let up = &c["addresses"][0];
    assert_eq!(up["address"], "127.0.0.21");
    assert_eq!(up["status"], "up");
    assert_eq!(up["method"], "tcp");
    assert_eq!(up["rtt_ms"].as_f64(), Some(1.5));
    assert!(up["error"].is_null());
    let down = &c["addresses"][1];
    assert_eq!(down["status"], "down");
    assert_eq!(down["error"], "refused: connection refused");

    let (s, v) = http.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
    assert_eq!(s, 200);
    let c = &v["connectors"][0];
    for f in [
        "name",
        "group",
        "connected",
        "checks_per_cycle",
        "cycle_seconds",
        "over_budget",
    ] {
        assert!(c.get(f).is_some(), "{f} missing: {c}");
    }
    assert_eq!(c["name"], "east-1");
    assert_eq!(c["connected"], true);
    assert_eq!(c["over_budget"], false);

    east.report(
        vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
        false,
    )
    .await;
    eventually("up", || async {
        http.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;
    let (s, v) = http.access("JIRA.test.reach.", "tcp", 80).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (
            v["connector"].as_str(),
            v["group"].as_str(),
            v["segment"].as_str()
        ),
        (Some("east-1"), Some("dc-east"), Some("jira"))
    );
    let e = &v["explanation"];
    assert_eq!(e["strategy"], "healthy");
    assert_eq!(e["candidates"][0]["eligible"], true);
    assert_eq!(e["candidates"][0]["status"], "up");
    ca.stop().await;
}

#[tokio::test]
async fn tokens_and_scopes_guard_the_apis() {
    let ca = Ca::start(&default_config()).await;
    let http = ca.web();
    let (s, v) = http.get_json("/api/v1/health", None).await;
    assert_eq!(
        (s, v["error"]["reason"].as_str()),
        (401, Some("unauthorized"))
    );
    let (s, _) = http.get_json("/api/v1/health", Some("not-a-token")).await;
    assert_eq!(s, 401);
    let (s, v) = http.get_json("/api/v1/health", Some(ACCESS_TOKEN)).await;
    assert_eq!((s, v["error"]["reason"].as_str()), (403, Some("forbidden")));
    // The dashboard's page is a shell without data: it loads without a
    // token (its script asks for one when the API answers 401).
    let (s, _) = http.send("GET", "/", None, None).await;
    assert_eq!(s, 200);
    let (s, _) = http
        .send(
            "POST",
            "/api/v1/access",
            Some(READ_TOKEN),
            Some(serde_json::json!({"host":"jira.test.reach","protocol":"tcp","port":80})),
        )
        .await;
    assert_eq!(s, 403);
    let (s, _) = http
        .send("POST", "/api/v1/access", None, Some(serde_json::json!({})))
        .await;
    assert_eq!(s, 401);
    let (s, body) = http.send("GET", "/healthz", None, None).await;
    assert_eq!((s, body.trim()), (200, "ok"));

    let mut client = v1::health_query_client::HealthQueryClient::new(ca.channel().await);
    let err = client
        .list_applications(v1::ListApplicationsRequest::default())
        .await
        .expect_err("needs a token");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let mut req = tonic::Request::new(v1::ListApplicationsRequest::default());
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {READ_TOKEN}").parse().expect("ascii"),
    );
    let apps = client
        .list_applications(req)
        .await
        .expect("listed")
        .into_inner();
    assert!(
        apps.applications
            .iter()
            .all(|a| a.app.as_ref().is_some_and(|k| k.segment != "payroll"))
    );
    assert!(!apps.applications.is_empty());
    ca.stop().await;

    let ca =
        Ca::start(&default_config().replace("[server]", "[server]\nanonymous_read = true")).await;
    let http = ca.web();
    assert_eq!(http.get_json("/api/v1/health", None).await.0, 200);
    assert_eq!(http.send("GET", "/", None, None).await.0, 200);
    let (s, _) = http.access_anonymous().await;
    assert_eq!(s, 401, "anonymous_read does not open access");
    ca.stop().await;
}

#[tokio::test]
async fn over_budget_connectors_are_flagged() {
    let ca = Ca::start(&config_text("check_budget = 1", "", "")).await;
    let http = ca.web();
    let (_east, _) = connect(&ca, "east-1", "dc-east").await;
    // jira has 2 applications × 1 port (payroll 1 more): over a budget of 1.
    eventually("over budget", || async {
        let (_, v) = http.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
        v["connectors"][0]["over_budget"] == true
    })
    .await;
    let (_, v) = http.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
    assert_eq!(v["connectors"][0]["checks_per_cycle"], 3);
    let (_, v) = http.get_json("/api/v1/overview", Some(READ_TOKEN)).await;
    assert_eq!(v["connectors"]["over_budget"], 1, "{v}");
    assert_eq!(v["connectors"]["connected"], 1, "{v}");
    ca.stop().await;
}

/// The CA imposes 50 checks a second, and the connector's pacer runs at
/// the 10 its own ceiling allows (the heartbeat's `rate_limit`): the CA's
/// estimate of its cycle is at 10 a second, the rate it runs at.
#[tokio::test]
async fn the_cycle_estimate_is_at_the_rate_the_connector_reports() {
    let ca = Ca::start(&config_text("checks_per_second = 50", "", "")).await;
    let http = ca.web();
    let (east, _) = connect(&ca, "east-1", "dc-east").await;
    let cycle = || async {
        let (_, v) = http.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
        v["connectors"][0]["cycle_seconds"].as_f64()
    };
    // 3 checks at the imposed 50 a second.
    eventually("an estimate at the imposed rate", || async {
        cycle().await == Some(0.06)
    })
    .await;
    let beat = v1::ConnectorMessage {
        kind: Some(v1::connector_message::Kind::Heartbeat(v1::Heartbeat {
            load: Some(v1::CheckLoad {
                checks_per_cycle: 3,
                rate_limit: 10,
                ..Default::default()
            }),
            replicas: None,
            status: None,
        })),
    };
    east.tx.send(beat).await.expect("heartbeat");
    eventually("an estimate at the reported rate", || async {
        cycle().await == Some(0.3)
    })
    .await;
    ca.stop().await;
}

#[tokio::test]
async fn grpc_health_and_reflection_are_served() {
    let ca = Ca::start(&default_config()).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(ca.channel().await);
    let r = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "reach.v1.Access".into(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    use tonic_reflection::pb::v1 as refl;
    let mut client =
        refl::server_reflection_client::ServerReflectionClient::new(ca.channel().await);
    let request = refl::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            refl::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    // Reflection needs a read token; the standard health service does not.
    let refused = client
        .server_reflection_info(tokio_stream::iter([request.clone()]))
        .await
        .expect_err("no token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let mut authorized = tonic::Request::new(tokio_stream::iter([request]));
    authorized.metadata_mut().insert(
        "authorization",
        format!("Bearer {READ_TOKEN}").parse().expect("metadata"),
    );
    let mut responses = client
        .server_reflection_info(authorized)
        .await
        .expect("reflection")
        .into_inner();
    let response = responses
        .message()
        .await
        .expect("stream")
        .expect("a response");
    let Some(refl::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        response.message_response
    else {
        panic!("unexpected reflection response");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for service in [
        "reach.v1.ConnectorSession",
        "reach.v1.Access",
        "reach.v1.HealthQuery",
    ] {
        assert!(names.contains(&service), "{service} not in {names:?}");
    }
    ca.stop().await;
}

#[tokio::test]
async fn shutdown_tells_connectors_why() {
    let ca = Ca::start(&default_config()).await;
    let (mut east, _) = connect(&ca, "east-1", "dc-east").await;
    ca.stop().await;
    match east.next().await {
        Some(Out::Shutdown(s)) => assert!(s.reason.contains("shutting down"), "{s:?}"),
        other => panic!("expected Shutdown, got {other:?}"),
    }
}

#[tokio::test]
async fn malformed_reports_are_rejected_and_the_session_goes_on() {
    let ca = Ca::start(&default_config()).await;
    let http = ca.web();
    let (east, _) = connect(&ca, "east-1", "dc-east").await;
    let mut no_protocol = app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[]);
    if let Some(k) = no_protocol.app.as_mut() {
        k.protocol = 0;
    }
    let mut bad_address = app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[]);
    bad_address.addresses[0].address = "x".repeat(10_000);
    let mut bad_status = app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[]);
    bad_status.status = 99;
    let mut no_key = app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[]);
    no_key.app = None;
    east.report(vec![no_protocol, bad_address, bad_status, no_key], false)
        .await;
    // Empty messages and a second Hello are ignored too.
    east.tx
        .send(v1::ConnectorMessage { kind: None })
        .await
        .expect("send");
    east.tx
        .send(hello("east-1", "dc-east"))
        .await
        .expect("send");
    east.report(
        vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
        false,
    )
    .await;
    eventually("the good report lands", || async {
        http.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;
    let (_, metrics) = http.send("GET", "/metrics", Some(READ_TOKEN), None).await;
    assert!(
        metrics.contains("reach_ca_reports_rejected_total 4"),
        "{metrics}"
    );
    ca.stop().await;
}

#[tokio::test]
async fn messages_keep_a_session_past_its_idle_timeout() {
    // Idle timeout 1 s (three 100 ms intervals, at least 1 s); a heartbeat
    // every 400 ms for 2.4 s keeps the session; silence then ends it.
    let ca = Ca::start(&config_text("heartbeat_interval_ms = 100", "", "")).await;
    let (mut east, _) = connect(&ca, "east-1", "dc-east").await;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        east.heartbeat(v1::CheckLoad::default()).await;
    }
    let http = ca.web();
    let (_, v) = http.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
    assert_eq!(v["connectors"][0]["connected"], true, "{v}");
    let silent = std::time::Instant::now();
    // The deadline only bounds a hang; how soon is not this test's business.
    match tokio::time::timeout(Duration::from_secs(15), east.next()).await {
        Ok(Some(Out::Shutdown(s))) => assert!(s.reason.contains("no message"), "{s:?}"),
        other => panic!("expected Shutdown, got {other:?}"),
    }
    let waited = silent.elapsed();
    assert!(waited >= Duration::from_millis(550), "{waited:?}");
    ca.stop().await;
}

#[tokio::test]
async fn a_silent_connector_is_disconnected_after_three_heartbeat_intervals() {
    // Three intervals of 100 ms, but never less than 1 s.
    let ca = Ca::start(&config_text("heartbeat_interval_ms = 100", "", "")).await;
    let (mut east, _) = connect(&ca, "east-1", "dc-east").await;
    let started = std::time::Instant::now();
    match east.next().await {
        Some(Out::Shutdown(s)) => assert!(s.reason.contains("no message"), "{s:?}"),
        other => panic!("expected Shutdown, got {other:?}"),
    }
    let err = tokio::time::timeout(Duration::from_secs(5), east.rx.message())
        .await
        .expect("ended in time")
        .expect_err("ended with a status");
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(900));
    let http = ca.web();
    let (_, v) = http.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
    assert_eq!(v["connectors"][0]["connected"], false);
    ca.stop().await;
}

/// The CA takes the messages that arrive together as one batch (one clock
/// read for all): every report of a burst must still be taken, in order,
/// including those that arrive together with the stream's end.
#[tokio::test]
async fn a_burst_of_reports_is_taken_in_order_up_to_the_stream_end() {
    let text = default_config().replace(
        "[selection]",
        "[limits]\nconnector_messages_per_second = 100000\nconnector_message_burst = 100000\n\n[selection]",
    );
    let ca = Ca::start(&text).await;
    let http = ca.web();
    let received = || async {
        let (_, metrics) = http.send("GET", "/metrics", Some(READ_TOKEN), None).await;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("reach_ca_reports_received_total "))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let up: &[&str] = &["127.0.0.21"];
    let none: &[&str] = &[];
    let (c, _) = connect(&ca, "east-1", "dc-east").await;
    // Queued back to back; only the last one says Down.
    for i in 0..500 {
        let (u, d) = if i == 499 { (none, up) } else { (up, none) };
        c.report(vec![app("jira", "jira.test.reach", 80, u, d)], false)
            .await;
    }
    eventually("all 500 reports are counted", || async {
        received().await == 500
    })
    .await;
    let a = http
        .app("jira", "jira.test.reach", 80)
        .await
        .expect("listed");
    assert_eq!(a["status"], "down", "the last report wins: {a}");

    // A burst that ends with the stream: the request side ends (the
    // response side stays open, so nothing is cancelled).
    let (c, _) = connect(&ca, "east-2", "dc-east").await;
    for _ in 0..300 {
        c.report(vec![app("jira", "jira.test.reach", 80, up, none)], false)
            .await;
    }
    let common::Conn { tx, rx: _rx, .. } = c;
    drop(tx);
    eventually("the reports before the end are counted too", || async {
        received().await == 800
    })
    .await;
    eventually("the session ended with its stream", || async {
        let (_, v) = http.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
        v["connectors"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["name"] == "east-2" && c["connected"] == false)
        })
    })
    .await;
    assert_eq!(received().await, 800);
    ca.stop().await;
}

/// An access to an on-access application whose latest result is
/// Down re-checks it at once (forwarded although the forward interval has
/// not passed) and waits for the answer: an application that came back is
/// selected on the next access, not an interval later.
#[tokio::test]
async fn an_access_to_a_down_application_rechecks_and_waits() {
    let ca = Ca::start(&config_text(
        "access_forward_interval_ms = 600000\non_access_window_ms = 3600000",
        "discovery_timeout_ms = 5000",
        "",
    ))
    .await;
    let http = ca.web();
    let (mut west, _) = connect(&ca, "west-1", "dc-west").await;
    let h = ca.web();
    let request = tokio::spawn(async move { h.access("b.lab.test.reach", "tcp", 8002).await });
    assert!(matches!(west.next().await, Some(Out::Access(_))));
    west.report(
        vec![app("lab", "b.lab.test.reach", 8002, &[], &["127.0.1.6"])],
        false,
    )
    .await;
    let (s, v) = request.await.expect("join");
    assert_eq!(s, 503, "{v}");
    assert_eq!(v["error"]["reason"], "all_down", "{v}");

    // The server came back. The next access is forwarded at once (a
    // re-check) and waits for its answer.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let h = ca.web();
    let request = tokio::spawn(async move { h.access("b.lab.test.reach", "tcp", 8002).await });
    match west.next_within(Duration::from_secs(3)).await {
        Some(Out::Access(e)) => assert_eq!(e.accessed_ms_ago, 0),
        other => panic!("expected a re-check AccessEvent, got {other:?}"),
    }
    west.report(
        vec![app("lab", "b.lab.test.reach", 8002, &["127.0.1.6"], &[])],
        false,
    )
    .await;
    let (s, v) = request.await.expect("join");
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["connector"], "west-1");
    assert_eq!(v["explanation"]["discovery_waited"], true);

    // Down again: the re-check's answer ends the wait (no timeout).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    west.report(
        vec![app("lab", "b.lab.test.reach", 8002, &[], &["127.0.1.6"])],
        false,
    )
    .await;
    eventually("down again", || async {
        http.app("lab", "b.lab.test.reach", 8002)
            .await
            .is_some_and(|a| a["status"] == "down")
    })
    .await;
    let h = ca.web();
    let request = tokio::spawn(async move { h.access("b.lab.test.reach", "tcp", 8002).await });
    assert!(matches!(
        west.next_within(Duration::from_secs(3)).await,
        Some(Out::Access(_))
    ));
    west.report(
        vec![app("lab", "b.lab.test.reach", 8002, &[], &["127.0.1.6"])],
        false,
    )
    .await;
    let (s, v) = request.await.expect("join");
    assert_eq!(v["error"]["reason"], "all_down", "{s} {v}");
    assert_eq!(v["explanation"]["discovery_waited"], true, "{v}");
    assert!(
        v["explanation"]["discovery_ms"]
            .as_u64()
            .is_some_and(|ms| ms < 5000),
        "{v}"
    );
    ca.stop().await;
}

/// A group larger than an explanation lists: the HTTP and gRPC answers list
/// 32 candidates (the chosen one, the eligible ones, then connected ones)
/// and count all of them.
#[tokio::test]
async fn a_large_groups_explanation_lists_32_and_counts_every_candidate() {
    let east = format!("provisioning_key = \"{KEY_EAST}\"");
    let config = default_config().replacen(&east, &format!("{east}\nmax_uses = 40"), 1);
    assert_ne!(config, default_config());
    let ca = Ca::start(&config).await;
    let http = ca.web();
    let mut conns = Vec::new();
    for i in 0..40 {
        let (conn, _) = connect(&ca, &format!("east-{i:02}"), "dc-east").await;
        // 20 report the application up, 20 down.
        let (up, down): (&[&str], &[&str]) = if i % 2 == 0 {
            (&["127.0.0.21"], &[])
        } else {
            (&[], &["127.0.0.21"])
        };
        conn.report(vec![app("jira", "jira.test.reach", 80, up, down)], true)
            .await;
        conns.push(conn);
    }
    eventually("every report in", || async {
        http.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["connectors"].as_array().is_some_and(|c| c.len() == 40))
    })
    .await;
    for _ in 0..5 {
        let (s, v) = http.access("jira.test.reach", "tcp", 80).await;
        assert_eq!(s, 200, "{v}");
        let e = &v["explanation"];
        let listed = e["candidates"].as_array().expect("candidates");
        assert_eq!(listed.len(), 32, "{e}");
        assert_eq!(
            (
                e["candidates_total"].as_u64(),
                e["candidates_eligible"].as_u64(),
                e["candidates_connected"].as_u64()
            ),
            (Some(40), Some(20), Some(40))
        );
        // Every eligible one is listed, the chosen among them, in name order.
        assert_eq!(listed.iter().filter(|c| c["eligible"] == true).count(), 20);
        assert!(listed.iter().any(|c| c["connector"] == v["connector"]));
        let names: Vec<&str> = listed
            .iter()
            .filter_map(|c| c["connector"].as_str())
            .collect();
        assert!(names.is_sorted(), "{names:?}");
    }
    let mut client = v1::access_client::AccessClient::new(ca.channel().await);
    let req = with_access_token(v1::AccessRequest {
        host: "jira.test.reach".into(),
        protocol: v1::Protocol::Tcp as i32,
        port: 80,
        user_location: None,
    });
    let d = client.resolve(req).await.expect("answered").into_inner();
    let e = d.explanation.expect("explanation");
    assert_eq!(e.candidates.len(), 32);
    assert_eq!(
        (
            e.candidates_total,
            e.candidates_eligible,
            e.candidates_connected
        ),
        (40, 20, 40)
    );
    match d.outcome {
        Some(v1::access_decision::Outcome::Selected(s)) => {
            assert!(
                e.candidates
                    .iter()
                    .any(|c| c.connector == s.connector && c.eligible)
            );
        }
        other => panic!("expected a selection, got {other:?}"),
    }
    drop(conns);
    ca.stop().await;
}
