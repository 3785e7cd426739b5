//! Trust over loopback: enrollment with provisioning keys, mutual TLS,
//! identity from the certificate, the administrator's controls, persistence
//! across a restart, and hostile input. Every refusal is checked for its
//! reason and for leaving everything else undisturbed.

mod common;

use std::time::Duration;

use common::*;
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ADMIN_TOKEN: &str = "tok-admin-PlQ7jmHXY1X2oyup1UokZXlp";

fn admin_token() -> String {
    format!("[[api_tokens]]\nname = \"root\"\ntoken = \"{ADMIN_TOKEN}\"\nscopes = [\"admin\"]\n")
}

/// The default config with an admin token and `groups_extra` replacing the
/// two groups' key lines.
fn config(groups_extra: &str) -> String {
    let base = config_text("", "discovery_timeout_ms = 400", &admin_token());
    if groups_extra.is_empty() {
        base
    } else {
        base.replace(
            &format!("provisioning_key = \"{KEY_EAST}\""),
            &format!("provisioning_key = \"{KEY_EAST}\"\n{groups_extra}"),
        )
    }
}

/// A live east connector whose report has landed: the witness that a
/// refusal disturbed nothing else.
async fn witness(ca: &Ca) -> Conn {
    let (c, _) = connect(ca, "witness", "dc-east").await;
    c.report(
        vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
        true,
    )
    .await;
    let web = ca.web();
    eventually("the witness's report lands", || async {
        web.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;
    c
}

/// The witness is still connected and its reports still land.
async fn undisturbed(ca: &Ca, w: &Conn) {
    w.report(
        vec![app("jira", "jira.test.reach", 80, &[], &["127.0.0.21"])],
        true,
    )
    .await;
    let web = ca.web();
    eventually("the witness still reports", || async {
        web.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "down")
    })
    .await;
}

fn refused(r: Result<Creds, tonic::Status>) -> tonic::Status {
    r.expect_err("refused")
}

#[tokio::test]
async fn enrollment_issues_a_certificate_that_authenticates_sessions() {
    let ca = Ca::start(&config("")).await;
    let t = ca.target();
    let creds = enroll(&t, "east-1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    assert_eq!(creds.serial.len(), 32, "128-bit serial in hex");
    let mut c = open_with(&t, &creds, "east-1", "dc-east")
        .await
        .expect("session");
    assert!(matches!(c.next().await, Some(Out::Welcome(_))));
    let web = ca.web();
    let (s, v) = web.get_json("/api/v1/connectors", Some(ADMIN_TOKEN)).await;
    assert_eq!(s, 200);
    let entry = &v["connectors"][0];
    assert_eq!(entry["name"], "east-1");
    assert_eq!(entry["enrolled"], true);
    assert_eq!(entry["disabled"], false);
    assert_eq!(entry["certificate_serial"], creds.serial.as_str());
    assert!(entry["session_id"].is_string(), "{entry}");
    // The read scope sees the connector, not its serial, session or version.
    let (s, v) = web.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
    assert_eq!(s, 200);
    let entry = &v["connectors"][0];
    assert_eq!(entry["name"], "east-1");
    assert_eq!(entry["connected"], true);
    for admin_only in ["certificate_serial", "session_id", "version"] {
        assert!(
            entry.get(admin_only).is_none(),
            "{admin_only} shown: {entry}"
        );
    }
    // The admin view counts the key's uses and never shows the key.
    let (s, body) = web
        .send("GET", "/api/v1/provisioning_keys", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(s, 200, "{body}");
    assert!(
        !body.contains(KEY_EAST) && !body.contains(KEY_WEST),
        "{body}"
    );
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let east = v["provisioning_keys"]
        .as_array()
        .expect("keys")
        .iter()
        .find(|k| k["group"] == "dc-east")
        .expect("east")
        .clone();
    assert_eq!(
        (east["uses"].as_u64(), east["max_uses"].as_u64()),
        (Some(1), Some(10))
    );
    // Admin scope only.
    let (s, _) = web
        .send("GET", "/api/v1/provisioning_keys", Some(READ_TOKEN), None)
        .await;
    assert_eq!(s, 403);
    ca.stop().await;
}

#[tokio::test]
async fn wrong_key_unknown_group_and_bad_names_are_refused() {
    let ca = Ca::start(&config("")).await;
    let w = witness(&ca).await;
    let t = ca.target();
    let e = refused(enroll(&t, "c1", "dc-east", KEY_WEST).await);
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("wrong provisioning key"), "{e:?}");
    assert!(
        !e.message().contains(KEY_WEST),
        "the key must not be echoed"
    );
    // A group the CA does not have is answered as a wrong key: the same
    // code and the same words, so group names cannot be found by trying.
    let wrong = refused(enroll(&t, "c1", "dc-east", KEY_WEST).await);
    let e = refused(enroll(&t, "c1", "dc-nowhere", KEY_EAST).await);
    assert_eq!(e.code(), wrong.code(), "{e:?} / {wrong:?}");
    assert_eq!(
        e.message().replace("dc-nowhere", "GROUP"),
        wrong.message().replace("dc-east", "GROUP"),
        "an unknown group reads differently from a wrong key"
    );
    let e = refused(enroll(&t, "bad name", "dc-east", KEY_EAST).await);
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("invalid connector name"), "{e:?}");
    // A CSR that is not one.
    let e = v1::enrollment_client::EnrollmentClient::new(t.channel().await)
        .enroll(v1::EnrollRequest {
            name: "c1".into(),
            group: "dc-east".into(),
            provisioning_key: KEY_EAST.into(),
            csr_pem:
                "-----BEGIN CERTIFICATE REQUEST-----\ngarbage\n-----END CERTIFICATE REQUEST-----\n"
                    .into(),
        })
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("invalid CSR"), "{e:?}");
    undisturbed(&ca, &w).await;
    // Failed attempts use nothing up (the witness's enrollment is the one use).
    let (_, body) = ca
        .web()
        .send("GET", "/api/v1/provisioning_keys", Some(ADMIN_TOKEN), None)
        .await;
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["provisioning_keys"][0]["group"], "dc-east", "{body}");
    assert_eq!(v["provisioning_keys"][0]["uses"], 1, "{body}");
    ca.stop().await;
}

#[tokio::test]
async fn an_exhausted_key_is_refused() {
    let ca = Ca::start(&config("max_uses = 2")).await;
    let t = ca.target();
    let w = witness(&ca).await; // use 1
    enroll(&t, "c2", "dc-east", KEY_EAST).await.expect("use 2");
    let e = refused(enroll(&t, "c3", "dc-east", KEY_EAST).await);
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("exhausted (2 of 2 uses)"), "{e:?}");
    // Other groups' keys are counted apart.
    enroll(&t, "w1", "dc-west", KEY_WEST)
        .await
        .expect("west has its own key");
    undisturbed(&ca, &w).await;
    ca.stop().await;
}

#[tokio::test]
async fn an_expired_key_is_refused() {
    let ca = Ca::start(&config("expires_at = \"2001-01-01T00:00:00Z\"")).await;
    let t = ca.target();
    let e = refused(enroll(&t, "c1", "dc-east", KEY_EAST).await);
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("has expired"), "{e:?}");
    enroll(&t, "w1", "dc-west", KEY_WEST)
        .await
        .expect("the other group's key works");
    ca.stop().await;
}

#[tokio::test]
async fn a_revoked_key_enrolls_nobody_but_enrolled_connectors_stay() {
    let ca = Ca::start(&config("")).await;
    let w = witness(&ca).await;
    let web = ca.web();
    let (s, body) = web
        .send(
            "POST",
            "/api/v1/provisioning_keys/dc-east/revoke",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let e = refused(enroll(&ca.target(), "c2", "dc-east", KEY_EAST).await);
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("was revoked"), "{e:?}");
    undisturbed(&ca, &w).await;
    let (s, _) = web
        .send(
            "POST",
            "/api/v1/provisioning_keys/dc-nowhere/revoke",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 404);
    ca.stop().await;
}

#[tokio::test]
async fn a_revoked_certificate_ends_the_session_and_cannot_reconnect() {
    let ca = Ca::start(&config("")).await;
    let w = witness(&ca).await;
    let t = ca.target();
    let creds = enroll(&t, "c1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    let mut c = open_with(&t, &creds, "c1", "dc-east")
        .await
        .expect("session");
    assert!(matches!(c.next().await, Some(Out::Welcome(_))));
    c.trust_bundle().await;
    let (s, body) = ca
        .web()
        .send(
            "POST",
            "/api/v1/connectors/c1/revoke",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    assert!(body.contains("\"certificates_revoked\":1"), "{body}");
    match c.next().await {
        Some(Out::Shutdown(s)) => assert!(s.reason.contains("revoked"), "{s:?}"),
        other => panic!("expected Shutdown, got {other:?}"),
    }
    let Err(e) = open_with(&t, &creds, "c1", "dc-east").await else {
        panic!("refused")
    };
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("was revoked"), "{e:?}");
    // Re-enrolling with the key issues a new certificate that works.
    let fresh = enroll(&t, "c1", "dc-east", KEY_EAST)
        .await
        .expect("re-enrolled");
    let mut c = open_with(&t, &fresh, "c1", "dc-east")
        .await
        .expect("session");
    assert!(matches!(c.next().await, Some(Out::Welcome(_))));
    undisturbed(&ca, &w).await;
    ca.stop().await;
}

#[tokio::test]
async fn a_disabled_connector_is_cut_off_until_enabled() {
    let ca = Ca::start(&config("")).await;
    let w = witness(&ca).await;
    let t = ca.target();
    let web = ca.web();
    let creds = enroll(&t, "c1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    let mut c = open_with(&t, &creds, "c1", "dc-east")
        .await
        .expect("session");
    assert!(matches!(c.next().await, Some(Out::Welcome(_))));
    c.trust_bundle().await;
    // Only an admin may disable.
    let (s, _) = web
        .send(
            "POST",
            "/api/v1/connectors/c1/disable",
            Some(READ_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 403);
    let (s, body) = web
        .send(
            "POST",
            "/api/v1/connectors/c1/disable",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    match c.next().await {
        Some(Out::Shutdown(s)) => assert!(s.reason.contains("disabled"), "{s:?}"),
        other => panic!("expected Shutdown, got {other:?}"),
    }
    let Err(e) = open_with(&t, &creds, "c1", "dc-east").await else {
        panic!("refused")
    };
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("is disabled"), "{e:?}");
    // Nor can it enroll again to get around it.
    let e = refused(enroll(&t, "c1", "dc-east", KEY_EAST).await);
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("is disabled"), "{e:?}");
    let (_, v) = web.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
    let entry = v["connectors"]
        .as_array()
        .expect("list")
        .iter()
        .find(|c| c["name"] == "c1")
        .expect("listed")
        .clone();
    assert_eq!(
        (entry["disabled"].clone(), entry["connected"].clone()),
        (true.into(), false.into())
    );
    undisturbed(&ca, &w).await;
    let (s, _) = web
        .send(
            "POST",
            "/api/v1/connectors/c1/enable",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200);
    let mut c = open_with(&t, &creds, "c1", "dc-east")
        .await
        .expect("enabled again");
    assert!(matches!(c.next().await, Some(Out::Welcome(_))));
    let (s, _) = web
        .send(
            "POST",
            "/api/v1/connectors/nobody/disable",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 404);
    ca.stop().await;
}

#[tokio::test]
async fn a_certificate_of_group_a_cannot_report_for_group_b() {
    let ca = Ca::start(&config("")).await;
    let w = witness(&ca).await;
    // west-1 is enrolled in dc-west; "jira" is served by dc-east only.
    let (west, _) = connect(&ca, "west-1", "dc-west").await;
    west.report(
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
    eventually("the report is rejected", || async {
        ca.authority
            .metrics()
            .render()
            .contains("reach_ca_reports_rejected_total 1")
    })
    .await;
    let a = ca
        .web()
        .app("jira", "jira.test.reach", 80)
        .await
        .expect("listed");
    let rows = a["connectors"].as_array().expect("rows");
    assert!(rows.iter().all(|r| r["connector"] != "west-1"), "{a}");
    undisturbed(&ca, &w).await;
    ca.stop().await;
}

#[tokio::test]
async fn a_forged_hello_is_refused() {
    let ca = Ca::start(&config("")).await;
    let w = witness(&ca).await;
    let t = ca.target();
    let creds = enroll(&t, "c1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    for (name, group) in [("witness", "dc-east"), ("c1", "dc-west")] {
        let mut c = open_with(&t, &creds, name, group)
            .await
            .expect("the certificate is fine");
        let e = c.rx.message().await.expect_err("session refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(
            e.message()
                .contains("authenticated as \"c1\" in \"dc-east\""),
            "{e:?}"
        );
    }
    // The impersonated witness was not replaced.
    undisturbed(&ca, &w).await;
    ca.stop().await;
}

#[tokio::test]
async fn sessions_need_a_certificate_the_ca_issued() {
    let ca = Ca::start(&config("")).await;
    let w = witness(&ca).await;
    let t = ca.target();
    // No client certificate at all.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(hello("c1", "dc-east")).await.expect("queue");
    let Err(e) = v1::connector_session_client::ConnectorSessionClient::new(t.channel().await)
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
    else {
        panic!("refused")
    };
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(
        e.message().contains("client certificate is required"),
        "{e:?}"
    );
    // A certificate with the right identity from another CA: TLS refuses it.
    let other = Ca::start(&config("")).await;
    let forged = enroll(&other.target(), "witness", "dc-east", KEY_EAST)
        .await
        .expect("enrolled elsewhere");
    let forged_target = Target {
        grpc: ca.grpc,
        root: ca.root(),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(hello("witness", "dc-east")).await.expect("queue");
    let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{}", ca.grpc))
        .expect("endpoint")
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&forged_target.root))
                .identity(tonic::transport::Identity::from_pem(
                    &forged.cert,
                    &forged.key,
                )),
        )
        .expect("tls");
    let outcome = match endpoint.connect().await {
        Err(_) => true,
        Ok(ch) => v1::connector_session_client::ConnectorSessionClient::new(ch)
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .is_err(),
    };
    assert!(outcome, "a foreign certificate must not open a session");
    other.stop().await;
    undisturbed(&ca, &w).await;
    ca.stop().await;
}

#[tokio::test]
async fn enrolled_state_survives_a_restart() {
    let text = config("max_uses = 2");
    let mut cfg =
        central_authority::Config::from_toml(&text, std::path::Path::new(".")).expect("valid");
    cfg.settings.data_dir = scratch_dir("restart");
    let ca = Ca::start_in(cfg.clone()).await;
    let t = ca.target();
    let c1 = enroll(&t, "c1", "dc-east", KEY_EAST).await.expect("use 1");
    let c2 = enroll(&t, "c2", "dc-east", KEY_EAST).await.expect("use 2");
    let (s, _) = ca
        .web()
        .send(
            "POST",
            "/api/v1/connectors/c2/disable",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200);
    let root = ca.root();
    ca.stop().await;

    let ca = Ca::start_in(cfg).await;
    assert_eq!(ca.root(), root, "the root persists");
    let t = ca.target();
    let mut c = open_with(&t, &c1, "c1", "dc-east")
        .await
        .expect("c1's certificate still works");
    assert!(matches!(c.next().await, Some(Out::Welcome(_))));
    let Err(e) = open_with(&t, &c2, "c2", "dc-east").await else {
        panic!("refused")
    };
    assert_eq!(
        e.code(),
        tonic::Code::PermissionDenied,
        "still disabled: {e:?}"
    );
    let e = refused(enroll(&t, "c3", "dc-east", KEY_EAST).await);
    assert!(e.message().contains("exhausted (2 of 2 uses)"), "{e:?}");
    ca.stop().await;
}

/// Readiness after a restart: `/healthz` answers 503
/// `warming_up` until every connector the store knows (enrolled, not
/// disabled) has re-attached and sent its full state, then 200 for good;
/// the bound is `[health] warmup_ms` (0: ready at once).
#[tokio::test]
async fn a_restarted_ca_is_not_ready_until_the_connectors_it_knows_report() {
    let text = |warmup_ms: u64| {
        config_text(
            &format!("warmup_ms = {warmup_ms}"),
            "discovery_timeout_ms = 400",
            &admin_token(),
        )
    };
    let mut cfg = central_authority::Config::from_toml(&text(600_000), std::path::Path::new("."))
        .expect("valid");
    cfg.settings.data_dir = scratch_dir("warmup");
    let ca = Ca::start_in(cfg.clone()).await;
    let t = ca.target();
    let c1 = enroll(&t, "c1", "dc-east", KEY_EAST).await.expect("c1");
    let c2 = enroll(&t, "c2", "dc-west", KEY_WEST).await.expect("c2");
    enroll(&t, "c3", "dc-east", KEY_EAST).await.expect("c3");
    // A disabled connector may not attach: nobody waits for it.
    let (s, _) = ca
        .web()
        .send(
            "POST",
            "/api/v1/connectors/c3/disable",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200);
    ca.stop().await;

    let ca = Ca::start_in(cfg.clone()).await;
    let web = ca.web();
    let healthz = || web.send("GET", "/healthz", None, None);
    let (s, body) = healthz().await;
    assert_eq!(s, 503, "a fresh start with known connectors: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("a JSON error");
    assert_eq!(v["error"]["reason"], "warming_up", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("0 of 2") && message.contains("c1, c2"),
        "{message}"
    );
    let t = ca.target();
    let mut east = open_with(&t, &c1, "c1", "dc-east")
        .await
        .expect("c1 re-attaches");
    assert!(matches!(east.next().await, Some(Out::Welcome(_))));
    // Attached is not enough: its state is not in the table yet.
    let (s, body) = healthz().await;
    assert!(s == 503 && body.contains("0 of 2"), "{s} {body}");
    east.report(
        vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
        true,
    )
    .await;
    eventually("c1's full state counts", || async {
        healthz().await.1.contains("1 of 2")
    })
    .await;
    let (s, body) = healthz().await;
    assert!(s == 503 && body.contains("waiting for c2"), "{s} {body}");
    let mut west = open_with(&t, &c2, "c2", "dc-west")
        .await
        .expect("c2 re-attaches");
    assert!(matches!(west.next().await, Some(Out::Welcome(_))));
    west.report(Vec::new(), true).await;
    eventually("ready once c2 reported too", || async {
        healthz().await.0 == 200
    })
    .await;
    // Warm for good: connectors leaving later is ordinary operation.
    drop((east, west));
    assert_eq!(healthz().await, (200, "ok\n".to_owned()));
    drop(web);
    ca.stop().await;

    // The bound is the configuration's: with `warmup_ms = 0` the same
    // restart is ready at once although neither connector re-attached.
    let mut zero =
        central_authority::Config::from_toml(&text(0), std::path::Path::new(".")).expect("valid");
    zero.settings.data_dir = cfg.settings.data_dir.clone();
    let ca = Ca::start_in(zero).await;
    let (s, body) = ca.web().send("GET", "/healthz", None, None).await;
    assert_eq!((s, body.as_str()), (200, "ok\n"));
    ca.stop().await;
}

#[tokio::test]
async fn plain_text_and_garbage_against_the_tls_ports_close_that_connection_only() {
    let ca = Ca::start(&config("")).await;
    let w = witness(&ca).await;
    // A plain-text gRPC client against the TLS port.
    let plain = tonic::transport::Endpoint::from_shared(format!("http://{}", ca.grpc))
        .expect("endpoint")
        .connect()
        .await;
    if let Ok(ch) = plain {
        let e = v1::health_query_client::HealthQueryClient::new(ch)
            .list_connectors(v1::ListConnectorsRequest {})
            .await
            .expect_err("plain text is refused");
        assert_ne!(e.code(), tonic::Code::Ok);
    }
    // Plain-text HTTP/1 and garbage bytes against both ports: the server
    // closes the connection.
    for addr in [ca.grpc, ca.http] {
        for payload in [
            b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(),
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(),
            (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ] {
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let _ = s.write_all(&payload).await;
            let mut buf = [0u8; 1024];
            let mut total = 0usize;
            let closed = tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => total += n,
                    }
                }
            })
            .await;
            assert!(closed.is_ok(), "{addr} kept a garbage connection open");
            assert!(total < 1024, "{addr} answered garbage with {total} bytes");
        }
    }
    assert_eq!(ca.web().send("GET", "/healthz", None, None).await.0, 200);
    undisturbed(&ca, &w).await;
    ca.stop().await;
}

#[tokio::test]
async fn a_silent_tls_client_is_dropped_after_the_handshake_timeout() {
    let text = config("").replace(
        "[selection]",
        "[tls]\nhandshake_timeout_ms = 300\n\n[selection]",
    );
    let ca = Ca::start(&text).await;
    for addr in [ca.grpc, ca.http] {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let started = tokio::time::Instant::now();
        let mut buf = [0u8; 16];
        let r = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
        assert!(
            matches!(r, Ok(Ok(0)) | Ok(Err(_))),
            "{addr}: half-open connection not closed: {r:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(250), "{addr}");
    }
    assert_eq!(ca.web().send("GET", "/healthz", None, None).await.0, 200);
    ca.stop().await;
}

#[tokio::test]
async fn an_oversized_message_ends_only_its_own_session() {
    let ca = Ca::start(&config("")).await;
    let w = witness(&ca).await;
    let (big, _) = connect(&ca, "east-2", "dc-east").await;
    let huge = v1::ApplicationHealth {
        dns_error: "x".repeat(protocol::MAX_MESSAGE_BYTES + 1),
        ..app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])
    };
    big.report(vec![huge], false).await;
    let mut big = big;
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match big.rx.message().await {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the oversized session should end");
    undisturbed(&ca, &w).await;
    ca.stop().await;
}

#[tokio::test]
async fn a_flooding_connector_is_capped_and_keeps_its_session() {
    let text = config("").replace(
        "[selection]",
        "[limits]\nconnector_messages_per_second = 5\nconnector_message_burst = 5\n\n[selection]",
    );
    let ca = Ca::start(&text).await;
    let (c, _) = connect(&ca, "east-1", "dc-east").await;
    for _ in 0..200 {
        c.heartbeat(v1::CheckLoad::default()).await;
    }
    eventually("excess messages are dropped and counted", || async {
        let m = ca.authority.metrics().render();
        m.lines()
            .find(|l| l.starts_with("reach_ca_messages_rate_limited_total "))
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n >= 150)
    })
    .await;
    // After the bucket refills, the session still works.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    c.report(
        vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
        true,
    )
    .await;
    let web = ca.web();
    eventually("the report after the flood lands", || async {
        web.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;
    ca.stop().await;
}

/// Opens an authenticated session stream with `creds` but sends nothing:
/// the spare stream a hostile connector keeps to register on later.
async fn open_spare(t: &Target, creds: &Creds) -> Conn {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let response = v1::connector_session_client::ConnectorSessionClient::new(t.mtls(creds).await)
        .connect(request)
        .await
        .expect("the spare stream is authenticated when it opens");
    Conn {
        tx,
        rx: response.into_inner(),
        name: "c1".into(),
        group: "dc-east".into(),
    }
}

/// Sends Hello on `spare` and asserts it is refused: no Welcome, the stream
/// ends (with a Shutdown or an error), and `c1` is not listed as connected.
async fn hello_on_spare_is_refused(ca: &Ca, mut spare: Conn) {
    // The stream may already be closed by the CA: then the send fails,
    // which is a refusal too.
    let _ = spare.tx.send(hello("c1", "dc-east")).await;
    loop {
        match spare.next().await {
            Some(Out::Welcome(w)) => panic!("the spare stream registered: {w:?}"),
            Some(Out::Shutdown(_)) | None => break,
            Some(_) => {}
        }
    }
    let (_, v) = ca
        .web()
        .get_json("/api/v1/connectors", Some(READ_TOKEN))
        .await;
    let connected = v["connectors"]
        .as_array()
        .expect("list")
        .iter()
        .any(|c| c["name"] == "c1" && c["connected"] == true);
    assert!(!connected, "c1 is not connected: {v}");
}

#[tokio::test]
async fn a_spare_stream_cannot_register_after_its_certificate_is_revoked() {
    let ca = Ca::start(&config("")).await;
    let w = witness(&ca).await;
    let t = ca.target();
    let creds = enroll(&t, "c1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    let mut c = open_with(&t, &creds, "c1", "dc-east")
        .await
        .expect("session");
    assert!(matches!(c.next().await, Some(Out::Welcome(_))));
    c.trust_bundle().await;
    let spare = open_spare(&t, &creds).await;
    let (s, body) = ca
        .web()
        .send(
            "POST",
            "/api/v1/connectors/c1/revoke",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    assert!(matches!(c.next().await, Some(Out::Shutdown(_))));
    hello_on_spare_is_refused(&ca, spare).await;
    undisturbed(&ca, &w).await;
    ca.stop().await;
}

#[tokio::test]
async fn a_spare_stream_cannot_register_after_its_connector_is_disabled() {
    let ca = Ca::start(&config("")).await;
    let w = witness(&ca).await;
    let t = ca.target();
    let creds = enroll(&t, "c1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    // No registered session at all: only the spare.
    let spare = open_spare(&t, &creds).await;
    let (s, body) = ca
        .web()
        .send(
            "POST",
            "/api/v1/connectors/c1/disable",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    hello_on_spare_is_refused(&ca, spare).await;
    undisturbed(&ca, &w).await;
    ca.stop().await;
}

#[tokio::test]
async fn a_connected_name_cannot_be_taken_over_with_the_group_key() {
    let ca = Ca::start(&config("")).await;
    let t = ca.target();
    let web = ca.web();
    let creds = enroll(&t, "c1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    let mut c = open_with(&t, &creds, "c1", "dc-east")
        .await
        .expect("session");
    assert!(matches!(c.next().await, Some(Out::Welcome(_))));
    c.trust_bundle().await;
    let e = refused(enroll(&t, "c1", "dc-east", KEY_EAST).await);
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains(
            "connector \"c1\" is enrolled with a valid certificate; renew with it, or an admin must allow re-enrollment (POST /api/v1/connectors/c1/allow-reenroll)"
        ),
        "{e:?}"
    );
    // The original keeps its session and its reports keep landing.
    assert!(c.next_within(Duration::from_millis(300)).await.is_none());
    c.report(
        vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
        true,
    )
    .await;
    eventually("the original still reports", || async {
        web.app("jira", "jira.test.reach", 80)
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;

    // Only an admin may allow it; then it succeeds once.
    let (s, _) = web
        .send(
            "POST",
            "/api/v1/connectors/c1/allow-reenroll",
            Some(READ_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 403);
    let (s, body) = web
        .send(
            "POST",
            "/api/v1/connectors/c1/allow-reenroll",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let fresh = enroll(&t, "c1", "dc-east", KEY_EAST)
        .await
        .expect("allowed once");
    match c.next().await {
        Some(Out::Shutdown(s)) => assert!(s.reason.contains("re-enrolled"), "{s:?}"),
        other => panic!("expected Shutdown, got {other:?}"),
    }
    let e = refused(enroll(&t, "c1", "dc-east", KEY_EAST).await);
    assert_eq!(
        e.code(),
        tonic::Code::FailedPrecondition,
        "only once: {e:?}"
    );
    let mut c = open_with(&t, &fresh, "c1", "dc-east")
        .await
        .expect("session");
    assert!(matches!(c.next().await, Some(Out::Welcome(_))));
    c.trust_bundle().await;

    // DELETE revokes, ends the session and frees the name.
    let (s, _) = web
        .send("DELETE", "/api/v1/connectors/c1", Some(READ_TOKEN), None)
        .await;
    assert_eq!(s, 403);
    let (s, body) = web
        .send("DELETE", "/api/v1/connectors/c1", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(s, 200, "{body}");
    match c.next().await {
        Some(Out::Shutdown(s)) => assert!(s.reason.contains("deleted"), "{s:?}"),
        other => panic!("expected Shutdown, got {other:?}"),
    }
    let Err(e) = open_with(&t, &fresh, "c1", "dc-east").await else {
        panic!("the deleted connector's certificate is refused")
    };
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let (_, v) = web.get_json("/api/v1/connectors", Some(READ_TOKEN)).await;
    assert!(
        !v["connectors"]
            .as_array()
            .expect("list")
            .iter()
            .any(|c| c["name"] == "c1"),
        "forgotten: {v}"
    );
    enroll(&t, "c1", "dc-west", KEY_WEST)
        .await
        .expect("the name is free, for any group");
    let (s, _) = web
        .send(
            "DELETE",
            "/api/v1/connectors/nobody",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 404);
    let (s, _) = web
        .send(
            "POST",
            "/api/v1/connectors/nobody/allow-reenroll",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 404);
    ca.stop().await;
}

#[tokio::test]
async fn a_name_of_one_group_cannot_be_squatted_from_another() {
    let ca = Ca::start(&config("")).await;
    let t = ca.target();
    let web = ca.web();
    // A west host takes the name first; the east connector meant to have
    // it is refused, with the way out named.
    enroll(&t, "c1", "dc-west", KEY_WEST)
        .await
        .expect("first come");
    let e = refused(enroll(&t, "c1", "dc-east", KEY_EAST).await);
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    assert!(
        e.message()
            .contains("connector \"c1\" is enrolled in connector group \"dc-west\"")
            && e.message().contains("DELETE /api/v1/connectors/c1"),
        "{e:?}"
    );
    // allow-reenroll does not move a name between groups.
    let (s, body) = web
        .send(
            "POST",
            "/api/v1/connectors/c1/allow-reenroll",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let e = refused(enroll(&t, "c1", "dc-east", KEY_EAST).await);
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
    let (s, body) = web
        .send("DELETE", "/api/v1/connectors/c1", Some(ADMIN_TOKEN), None)
        .await;
    assert_eq!(s, 200, "{body}");
    enroll(&t, "c1", "dc-east", KEY_EAST)
        .await
        .expect("freed by the admin");
    ca.stop().await;
}

#[tokio::test]
async fn a_session_ends_when_its_certificate_expires() {
    let text = config("");
    let mut cfg =
        central_authority::Config::from_toml(&text, std::path::Path::new(".")).expect("valid");
    cfg.settings.data_dir = scratch_dir("expiry");
    cfg.settings.connector_cert_validity = Duration::from_secs(2);
    let ca = Ca::start_in(cfg).await;
    let t = ca.target();
    let creds = enroll(&t, "c1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    let mut c = open_with(&t, &creds, "c1", "dc-east")
        .await
        .expect("session");
    assert!(matches!(c.next().await, Some(Out::Welcome(_))));
    // The idle timeout (three heartbeat intervals, 15 s) is longer than the
    // wait: only the certificate ends it.
    let ended = loop {
        match c.next_within(Duration::from_secs(10)).await {
            Some(Out::Shutdown(s)) => break s,
            Some(_) => {}
            None => panic!("the session did not end with a Shutdown"),
        }
    };
    assert!(ended.reason.contains("has expired"), "{ended:?}");
    // An expired name holds nothing: the key enrolls it again.
    enroll(&t, "c1", "dc-east", KEY_EAST)
        .await
        .expect("re-enrolled after expiry");
    ca.stop().await;
}
