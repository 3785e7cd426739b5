//! Truthful health under load: a status's age is
//! the age of its check, and no result is lost to the CA's limits.

mod common;

use central_authority::api;
use std::time::{Duration, Instant};

use common::*;
use policy::Status;
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;

/// 200 hosts on ten TCP ports each: 2,000 targets for one connector.
fn bulk() -> Segment {
    segment("bulk")
        .apps((1..=200).map(|i| format!("127.0.3.{i}")))
        .tcp(["20001-20010"])
        .groups(["dc-east"])
}

/// A segment reported every 200 ms, so staleness shows within a test.
fn fast() -> String {
    Segment::new("fast")
        .apps(["127.0.0.31"])
        .tcp(["80"])
        .interval_ms(200)
        .groups(["dc-east"])
        .toml()
}

fn fast_status(ca: &Ca) -> (Status, Option<&'static str>, Option<u64>) {
    let apps = api::views::applications(&ca.authority, Some("fast"));
    let Some(c) = apps.first().and_then(|a| a.connectors.first()) else {
        return (Status::Unknown, None, None);
    };
    (c.status, c.unknown_cause, c.checked_age_ms)
}

/// A connector that keeps re-sending one old result (its age growing, as
/// when rounds fall behind) turns Unknown once that check is older than the
/// staleness limit, although reports keep arriving.
#[tokio::test]
async fn a_result_re_sent_without_a_new_check_turns_unknown_on_time() {
    let ca = Ca::start(&config_text("stale_after_intervals = 2", "", &fast())).await;
    let (c, _) = connect(&ca, "east-1", "dc-east").await;
    c.heartbeat(v1::CheckLoad {
        cycle_seconds: 0.0,
        rate_limit: 20,
        ..Default::default()
    })
    .await;
    let checked = Instant::now();
    let result = || v1::ApplicationHealth {
        age_ms: u64::try_from(checked.elapsed().as_millis()).unwrap_or(u64::MAX),
        ..app("fast", "127.0.0.31", 80, &["127.0.0.31"], &[])
    };
    c.report(vec![result()], false).await;
    let mut seen_up = false;
    let mut unknown = None;
    // Re-send every 50 ms for up to 3 s; the limit is 2 intervals of
    // 200 ms plus a zero cycle.
    while checked.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        c.report(vec![result()], false).await;
        c.heartbeat(v1::CheckLoad {
            rate_limit: 20,
            ..Default::default()
        })
        .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        match fast_status(&ca) {
            (Status::Up, _, _) => seen_up = true,
            (Status::Unknown, Some(cause), age) if seen_up => {
                unknown = Some((cause, age, checked.elapsed()));
                break;
            }
            _ => {}
        }
    }
    assert!(seen_up, "the fresh result was shown");
    let (cause, age, after) = unknown.expect("still not Unknown after 3 s of re-sent old results");
    assert_eq!(cause, "stale");
    assert!(
        age.is_some_and(|a| a >= 400),
        "the API shows the check's age: {age:?}"
    );
    // Not before the limit: the check's age is what counts.
    assert!(after >= Duration::from_millis(400), "{after:?}");
    ca.stop().await;
}

/// A connector whose checks stopped but whose session stays up (heartbeats
/// only) turns Unknown on time.
#[tokio::test]
async fn a_connector_that_stops_checking_turns_unknown_with_its_session_up() {
    let ca = Ca::start(&config_text("stale_after_intervals = 2", "", &fast())).await;
    let (c, _) = connect(&ca, "east-1", "dc-east").await;
    // The result was 150 ms old when sent.
    c.report(
        vec![v1::ApplicationHealth {
            age_ms: 150,
            ..app("fast", "127.0.0.31", 80, &["127.0.0.31"], &[])
        }],
        false,
    )
    .await;
    let sent = Instant::now();
    let mut up = false;
    let mut turned = None;
    while sent.elapsed() < Duration::from_secs(3) {
        c.heartbeat(v1::CheckLoad {
            rate_limit: 20,
            ..Default::default()
        })
        .await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        match fast_status(&ca) {
            (Status::Up, _, age) => {
                up = true;
                assert!(age.is_some_and(|a| a >= 150), "{age:?}");
            }
            (Status::Unknown, Some("stale"), _) if up => {
                turned = Some(sent.elapsed());
                break;
            }
            _ => {}
        }
    }
    let after = turned.expect("Unknown within 3 s");
    // 400 ms limit minus the 150 ms the check was already old.
    assert!(after >= Duration::from_millis(250), "{after:?}");
    ca.stop().await;
}

/// A report over the session's entry limit is refused with `FlowControl`
/// naming it (nothing stored, nothing dropped silently); after the delay
/// it is taken.
#[tokio::test]
async fn a_report_over_the_entry_limit_is_refused_with_flow_control() {
    let extra = format!(
        "{}\n[limits]\nconnector_entries_per_second = 10\nconnector_entries_burst = 2\n",
        fast()
    );
    let ca = Ca::start(&config_text("", "", &extra)).await;
    let (mut c, w) = connect(&ca, "east-1", "dc-east").await;
    let s = w.settings.expect("settings");
    assert_eq!(
        (
            s.max_entries_per_second,
            s.max_entries_burst,
            s.max_report_entries
        ),
        (10, 2, 2)
    );
    let report = |sequence| v1::ConnectorMessage {
        kind: Some(v1::connector_message::Kind::Report(v1::HealthReport {
            applications: vec![
                app("fast", "127.0.0.31", 80, &["127.0.0.31"], &[]),
                app("jira", "127.0.0.21", 80, &["127.0.0.21"], &[]),
            ],
            full_state: false,
            sequence,
        })),
    };
    c.tx.send(report(1)).await.expect("send");
    c.tx.send(report(2)).await.expect("send");
    let fc = loop {
        match c.next().await {
            Some(Out::FlowControl(fc)) => break fc,
            Some(_) => continue,
            None => panic!("session ended"),
        }
    };
    assert_eq!(fc.sequence, 2);
    assert_eq!(fc.max_entries_per_second, 10);
    // Two entries at 10/s: about 200 ms.
    assert!((1..=250).contains(&fc.retry_after_ms), "{fc:?}");
    tokio::time::sleep(Duration::from_millis(fc.retry_after_ms)).await;
    c.tx.send(report(3)).await.expect("send");
    c.heartbeat(v1::CheckLoad::default()).await;
    assert!(
        c.next_within(Duration::from_millis(300)).await.is_none(),
        "the retry is taken"
    );
    let m = ca.authority.metrics();
    assert_eq!(m.messages_rate_limited.get(), 0);
    assert_eq!(m.reports_deferred.get(), 1);
    ca.stop().await;
}

/// The real connector agent `bulk-1` of `dc-east` at 500 checks/s against
/// `ca`, in process; send on the sender to stop it.
fn bulk_agent(ca: &Ca, tag: &str) -> (tokio::sync::oneshot::Sender<()>, AgentTask) {
    let mut config = agent_config(ca, tag, "bulk-1", "dc-east", KEY_EAST);
    config.checks_per_second = 500;
    config.check_timeout_ms = 500;
    spawn_agent(config)
}

/// 2,000 targets at 500 checks/s with the real connector: every
/// application's result reaches the CA, and nothing is dropped by its
/// limits (closed loopback ports are fine targets: they report Down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_result_of_2000_targets_at_500_checks_per_second_reaches_the_ca() {
    let extra = bulk().toml();
    let ca = Ca::start(&config_text(
        "checks_per_second = 500\ncheck_timeout_ms = 500\ncheck_budget = 100000",
        "",
        &extra,
    ))
    .await;
    let (stop, agent) = bulk_agent(&ca, "bulk-agent");
    // 2,000 checks at 500/s take 4 s; allow a loaded machine 30 s.
    let deadline = Instant::now() + Duration::from_secs(30);
    let known = || {
        api::views::applications(&ca.authority, Some("bulk"))
            .iter()
            .filter(|a| a.status != Status::Unknown)
            .count()
    };
    while known() < 2000 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let m = ca.authority.metrics();
    assert_eq!(known(), 2000, "applications with a result at the CA");
    assert_eq!(m.messages_rate_limited.get(), 0, "messages dropped");
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), agent).await;
    ca.stop().await;
}

/// The e2e overload scenario in process: 2,000 continuous targets at 500
/// checks/s plus 600 on-access windows re-checked every second (more than
/// the rate): every continuous application and every accessed one still
/// reaches the CA with a result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_and_on_access_results_all_reach_the_ca_under_overload() {
    let burst = Segment::new("burst")
        .apps(["127.0.4.0/24"])
        .tcp(["30001-30003"])
        .mode("on_access")
        .interval_ms(1000)
        .groups(["dc-east"]);
    let extra = bulk().toml() + &burst.toml();
    let ca = Ca::start(&config_text(
        "checks_per_second = 500\ncheck_timeout_ms = 500\ncheck_budget = 100000",
        "",
        &extra,
    ))
    .await;
    let (stop, agent) = bulk_agent(&ca, "overload-agent");
    let http = ca.web();
    eventually("the connector is connected", || async {
        api::views::connectors(&ca.authority)
            .iter()
            .any(|c| c.connected)
    })
    .await;
    let accessed: Vec<(String, u32)> = (1..=200u32)
        .flat_map(|i| (30001..=30003).map(move |p| (format!("127.0.4.{i}"), p)))
        .collect();
    for chunk in accessed.chunks(10) {
        let calls = chunk.iter().map(|(h, p)| http.access(h, "tcp", *p));
        for (status, body) in futures::future::join_all(calls).await {
            assert!(status == 200 || status == 503, "{status} {body}");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(40);
    let known = |segment: &str| {
        api::views::applications(&ca.authority, Some(segment))
            .iter()
            .filter(|a| a.connectors.iter().any(|c| c.status != Status::Unknown))
            .count()
    };
    while (known("bulk") < 2000 || known("burst") < accessed.len()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let m = ca.authority.metrics();
    eprintln!(
        "bulk {} burst {} rate-limited {}",
        known("bulk"),
        known("burst"),
        m.messages_rate_limited.get()
    );
    assert_eq!(known("bulk"), 2000, "continuous applications with a result");
    assert_eq!(
        known("burst"),
        accessed.len(),
        "accessed applications with a result"
    );
    assert_eq!(m.messages_rate_limited.get(), 0, "messages dropped");
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), agent).await;
    ca.stop().await;
}

/// Server reflection is served as `v1alpha` too (grpcio-reflection and
/// older grpcurl speak only that).
#[tokio::test]
async fn reflection_is_served_as_v1alpha_too() {
    use tonic_reflection::pb::v1alpha as refl;
    let ca = Ca::start(&default_config()).await;
    let mut client =
        refl::server_reflection_client::ServerReflectionClient::new(ca.channel().await);
    let request = refl::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            refl::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    // Like v1, it needs a read token.
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
        .expect("v1alpha reflection is served")
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
        "reach.v1.Enrollment",
    ] {
        assert!(names.contains(&service), "{service} not in {names:?}");
    }
    ca.stop().await;
}
