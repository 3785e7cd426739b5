//! The compatibility policy at `Hello`, over real gRPC on loopback: an
//! enrolled connector whose `Hello.release` is more than one minor release
//! from the CA's is refused with FAILED_PRECONDITION naming both releases
//! and the rule (never registered, counted by reason), one that is not a
//! release with INVALID_ARGUMENT; the window's releases, and an empty field
//! (a connector written before it, judged as 0.1), are welcomed. Nothing
//! else is disturbed.

mod common;

use common::*;
use protocol::release::Release;
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use protocol::v1::connector_message::Kind as In;

/// `Hello` of the dc-east connector `name` stating `release`.
fn hello_with(name: &str, release: &str) -> v1::ConnectorMessage {
    v1::ConnectorMessage {
        kind: Some(In::Hello(v1::Hello {
            name: name.into(),
            group: "dc-east".into(),
            version: "9.9.9-other-numbering".into(),
            release: release.into(),
            capabilities: None,
        })),
    }
}

/// Opens a session with `creds` and says `hello`: the CA's first answer,
/// a Welcome or the status the stream ended with.
async fn say(t: &Target, creds: &Creds, hello: v1::ConnectorMessage) -> Result<Out, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(hello).await.expect("queue Hello");
    let response = v1::connector_session_client::ConnectorSessionClient::new(t.mtls(creds).await)
        .connect(tonic::Request::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .await?;
    let mut inbound = response.into_inner();
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), inbound.message())
        .await
        .expect("the CA answers Hello within 5 s")?;
    // Keep the stream open until the answer is read.
    drop(tx);
    first
        .and_then(|m| m.kind)
        .ok_or_else(|| tonic::Status::unknown("the stream ended without an answer"))
}

/// `major.minor` moved by `by` minor releases (None below 0).
fn shifted(r: Release, by: i64) -> Option<String> {
    let minor = i64::try_from(r.minor).ok()? + by;
    (minor >= 0).then(|| format!("{}.{minor}.0", r.major))
}

/// Whether the CA lists `name` as connected.
async fn connected(ca: &Ca, name: &str) -> bool {
    let (_, v) = ca
        .web()
        .get_json("/api/v1/connectors", Some(READ_TOKEN))
        .await;
    v["connectors"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["name"] == name && c["connected"] == true)
    })
}

#[tokio::test]
async fn releases_outside_the_window_are_refused_naming_both_and_the_rule() {
    let ca = Ca::start(&default_config()).await;
    let t = ca.target();
    let ours = Release::current();
    // A witness on the current release, reporting.
    let (w, _) = connect(&ca, "witness", "dc-east").await;
    let creds = enroll(&t, "c1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");

    let too_new = shifted(ours, 2).expect("a newer release");
    let e = say(&t, &creds, hello_with("c1", &too_new))
        .await
        .expect_err("too new is refused");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let (oldest, newest) = ours.window();
    for named in [
        format!(
            "connector release {}",
            Release::parse(&too_new).expect("release")
        ),
        format!("is too new for this CA (release {ours})"),
        format!(
            "compatibility policy accepts connectors of the CA's major release within 1 minor release of it, either way (here {oldest} to {newest})"
        ),
    ] {
        assert!(e.message().contains(&named), "{named:?} in {e:?}");
    }
    assert!(!connected(&ca, "c1").await, "a refused release registered");

    if let Some(too_old) = shifted(ours, -2) {
        let e = say(&t, &creds, hello_with("c1", &too_old))
            .await
            .expect_err("too old is refused");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("is too old for this CA"), "{e:?}");
    }
    let e = say(&t, &creds, hello_with("c1", "latest"))
        .await
        .expect_err("not a release");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("\"latest\""), "{e:?}");

    // The window, each end and the middle, and an empty field where the
    // CA's window holds 0.1.
    let mut welcome = vec![shifted(ours, 0), shifted(ours, 1), shifted(ours, -1)];
    if ours.accepts("").is_ok() {
        welcome.push(Some(String::new()));
    }
    for release in welcome.into_iter().flatten() {
        match say(&t, &creds, hello_with("c1", &release)).await {
            Ok(Out::Welcome(_)) => {}
            other => panic!("release {release:?}: {other:?}"),
        }
    }

    // Counted by reason, what the upgrade runbook watches.
    let (status, metrics) = ca
        .web()
        .send("GET", "/metrics", Some(READ_TOKEN), None)
        .await;
    assert_eq!(status, 200);
    for line in [
        "reach_ca_sessions_refused_total{outcome=\"release_too_new\"} 1",
        "reach_ca_sessions_refused_total{outcome=\"release_malformed\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }
    // The witness kept its session throughout.
    w.report(
        vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
        true,
    )
    .await;
    eventually("the witness still reports", || async {
        ca.web()
            .app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;
    ca.stop().await;
}
