//! Certificate renewal over loopback (`Enrollment.Renew`): the identity
//! renewed is the one of the presented certificate, the old serial stays
//! valid for its grace and is refused after it, revoked and expired
//! certificates cannot renew, and the real connector agent (in process)
//! stays connected and reporting across several renewals of a certificate
//! that lives seconds, while the admin API lists each serial.

mod common;

use central_authority::trust;
use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;

const ADMIN_TOKEN: &str = "tok-admin-PlQ7jmHXY1X2oyup1UokZXlp";

/// The default config with an admin token and a `[tls]` section.
fn config(tls: &str) -> String {
    config_text(
        "",
        "discovery_timeout_ms = 400",
        &format!(
            "[[api_tokens]]\nname = \"root\"\ntoken = \"{ADMIN_TOKEN}\"\nscopes = [\"admin\"]\n\n[tls]\n{tls}\n"
        ),
    )
}

/// Calls `Renew` over mutual TLS with `creds` and a new key.
async fn renew(t: &Target, creds: &Creds, name: &str) -> Result<Creds, tonic::Status> {
    let (pair, csr) = key_and_csr(name);
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&t.root))
        .identity(tonic::transport::Identity::from_pem(
            &creds.cert,
            &creds.key,
        ));
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", t.grpc))
        .expect("endpoint")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("{e:?}")))?;
    let r = v1::enrollment_client::EnrollmentClient::new(channel)
        .renew(v1::RenewRequest { csr_pem: csr })
        .await?
        .into_inner();
    Ok(Creds {
        cert: r.certificate_pem,
        key: pair.serialize_pem(),
        serial: r.serial,
    })
}

/// The admin view of connector `name`.
async fn connector(ca: &Ca, name: &str) -> serde_json::Value {
    let (s, v) = ca
        .web()
        .get_json("/api/v1/connectors", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(s, 200, "{v}");
    v["connectors"]
        .as_array()
        .expect("list")
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap_or(serde_json::Value::Null)
}

/// (serial, state) of every certificate the admin view lists for `name`.
async fn certificates(ca: &Ca, name: &str) -> Vec<(String, String)> {
    connector(ca, name).await["certificates"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|c| {
                    (
                        c["serial"].as_str().unwrap_or_default().to_owned(),
                        c["state"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until `f` returns true, up to `limit` (for windows set in seconds
/// by the config: a grace, a certificate lifetime).
async fn within<F, Fut>(limit: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test]
async fn renewal_issues_a_new_serial_and_the_old_one_ends_after_its_grace() {
    let ca = Ca::start(&config("renewal_grace_s = 2")).await;
    let t = ca.target();
    let old = enroll(&t, "east-1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    let new = renew(&t, &old, "east-1").await.expect("renewed");
    assert_ne!(new.serial, old.serial);
    // The admin API lists both: the new one current, the old one in grace.
    let listed = certificates(&ca, "east-1").await;
    assert_eq!(
        listed,
        vec![
            (new.serial.clone(), "current".to_owned()),
            (old.serial.clone(), "grace".to_owned()),
        ]
    );
    let view = connector(&ca, "east-1").await;
    assert_eq!(view["certificate_serial"], new.serial.as_str());
    // The new certificate authenticates a session; no key use was spent.
    let mut c = open_with(&t, &new, "east-1", "dc-east")
        .await
        .expect("session on the new certificate");
    assert!(matches!(c.next().await, Some(Out::Welcome(_))));
    let keys = ca
        .web()
        .get_json("/api/v1/provisioning_keys", Some(ADMIN_TOKEN))
        .await
        .1;
    let east = keys["provisioning_keys"]
        .as_array()
        .expect("keys")
        .iter()
        .find(|k| k["group"] == "dc-east")
        .cloned()
        .expect("east");
    assert_eq!(east["uses"], 1, "renewal spends no provisioning key use");
    // After the grace the old serial is revoked: refused for sessions and
    // for renewals.
    within(
        Duration::from_secs(10),
        "the old serial is revoked",
        || async {
            certificates(&ca, "east-1")
                .await
                .contains(&(old.serial.clone(), "revoked".to_owned()))
        },
    )
    .await;
    let e = open_with(&t, &old, "east-1", "dc-east")
        .await
        .err()
        .expect("refused after the grace");
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    assert!(e.message().contains("revoked"), "{e:?}");
    let e = renew(&t, &old, "east-1").await.expect_err("refused");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("revoked"), "{e:?}");
    // The new one is unaffected.
    let newer = renew(&t, &new, "east-1").await.expect("renews again");
    assert_ne!(newer.serial, new.serial);
    ca.stop().await;
}

#[tokio::test]
async fn renewal_needs_a_valid_certificate_of_this_ca() {
    let ca = Ca::start(&config("connector_cert_validity_s = 3")).await;
    let t = ca.target();
    // No client certificate at all.
    let (_, csr) = key_and_csr("east-1");
    let e = v1::enrollment_client::EnrollmentClient::new(t.channel().await)
        .renew(v1::RenewRequest { csr_pem: csr })
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    // A revoked certificate.
    let revoked = enroll(&t, "east-1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    assert_eq!(
        trust::enroll::revoke_connector(&ca.authority, "east-1").expect("db"),
        Some(1)
    );
    let e = renew(&t, &revoked, "east-1").await.expect_err("refused");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    // A disabled connector.
    let disabled = enroll(&t, "east-2", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    assert!(trust::enroll::set_connector_disabled(&ca.authority, "east-2", true).expect("db"));
    let e = renew(&t, &disabled, "east-2").await.expect_err("refused");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("disabled"), "{e:?}");
    // A malformed CSR with a good certificate.
    let good = enroll(&t, "east-3", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    let e = v1::enrollment_client::EnrollmentClient::new(t.mtls(&good).await)
        .renew(v1::RenewRequest {
            csr_pem: "garbage".into(),
        })
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // An expired certificate (it lives 3 s): refused, nothing recorded.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    assert!(renew(&t, &good, "east-3").await.is_err(), "expired");
    let listed = certificates(&ca, "east-3").await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].1, "expired");
    ca.stop().await;
}

#[tokio::test]
async fn a_certificate_renews_only_the_connector_it_names() {
    let ca = Ca::start(&config("")).await;
    let t = ca.target();
    let a = enroll(&t, "east-a", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    let b = enroll(&t, "east-b", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    // The CSR asks for east-b; the presented certificate is east-a's.
    let renewed = renew(&t, &a, "east-b").await.expect("renewed");
    let der = {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(renewed.cert.as_bytes())
            .expect("pem")
            .to_vec()
    };
    let id = central_authority::credentials::pki::identity_of(&der).expect("identity");
    assert_eq!((id.name.as_str(), id.group.as_str()), ("east-a", "dc-east"));
    assert_eq!(
        connector(&ca, "east-a").await["certificate_serial"],
        renewed.serial.as_str()
    );
    assert_eq!(
        certificates(&ca, "east-b").await,
        vec![(b.serial.clone(), "current".to_owned())],
        "the other connector is untouched"
    );
    ca.stop().await;
}

#[tokio::test]
async fn the_real_connector_stays_connected_and_reporting_across_renewals() {
    // Certificates live 6 s: the agent renews every ~4 s.
    let ca = Ca::start(&config(
        "connector_cert_validity_s = 6\nrenewal_grace_s = 2",
    ))
    .await;
    let mut agent = agent_config(&ca, "agent", "east-1", "dc-east", KEY_EAST);
    agent.check_timeout_ms = 300;
    let (stop, task) = spawn_agent(agent);
    let mut seen = BTreeSet::new();
    let mut last_seen = 0;
    // Three renewals: four serials, and across each the connector is
    // connected again and its heartbeats keep landing.
    while seen.len() < 4 {
        within(Duration::from_secs(20), "a new serial, connected", || {
            let (ca, seen) = (&ca, &seen);
            async move {
                let v = connector(ca, "east-1").await;
                v["connected"] == true
                    && v["certificate_serial"]
                        .as_str()
                        .is_some_and(|s| !seen.contains(s))
            }
        })
        .await;
        let v = connector(&ca, "east-1").await;
        seen.insert(
            v["certificate_serial"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
        let since = last_seen;
        within(Duration::from_secs(20), "heartbeats land", || async {
            connector(&ca, "east-1").await["last_seen"]
                .as_i64()
                .is_some_and(|t| t > since)
        })
        .await;
        last_seen = connector(&ca, "east-1").await["last_seen"]
            .as_i64()
            .unwrap_or_default();
    }
    // Its reports land: the continuous segment's application is known.
    assert!(
        ca.web().app("jira", "127.0.0.21", 80).await.is_some(),
        "the connector reports"
    );
    // Every serial is listed; only the newest is current.
    let listed = certificates(&ca, "east-1").await;
    for s in &seen {
        assert!(listed.iter().any(|(l, _)| l == s), "{s} in {listed:?}");
    }
    assert_eq!(
        listed
            .iter()
            .filter(|(_, state)| state == "current")
            .count(),
        1,
        "{listed:?}"
    );
    // Renewal, never re-enrollment: one use of the key.
    let keys = ca
        .web()
        .get_json("/api/v1/provisioning_keys", Some(ADMIN_TOKEN))
        .await
        .1;
    let uses = keys["provisioning_keys"]
        .as_array()
        .expect("keys")
        .iter()
        .find(|k| k["group"] == "dc-east")
        .map(|k| k["uses"].clone());
    assert_eq!(uses, Some(serde_json::json!(1)));
    let _ = stop.send(());
    let ended = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the agent stops");
    assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
    ca.stop().await;
}

/// A renewal moves the connector onto a new session, which replaces the
/// old one: the connector's results stand across it (the events API shows
/// no transition to Unknown), as they do across its new full state.
#[tokio::test]
async fn a_renewal_leaves_the_connectors_results_standing() {
    let ca = Ca::start(&config(
        "connector_cert_validity_s = 6\nrenewal_grace_s = 2",
    ))
    .await;
    let mut agent = agent_config(&ca, "agent", "east-1", "dc-east", KEY_EAST);
    agent.check_timeout_ms = 300;
    let (stop, task) = spawn_agent(agent);
    within(Duration::from_secs(20), "a result for jira", || async {
        ca.web().app("jira", "127.0.0.21", 80).await.is_some()
    })
    .await;
    let first = connector(&ca, "east-1").await["certificate_serial"].clone();
    // Two renewals (a serial every ~4 s), each a replaced session.
    let mut serials = BTreeSet::from([first.to_string()]);
    while serials.len() < 3 {
        within(
            Duration::from_secs(20),
            "a renewed, connected session",
            || {
                let (ca, serials) = (&ca, &serials);
                async move {
                    let v = connector(ca, "east-1").await;
                    v["connected"] == true
                        && !serials.contains(&v["certificate_serial"].to_string())
                }
            },
        )
        .await;
        serials.insert(connector(&ca, "east-1").await["certificate_serial"].to_string());
    }
    // Its new full state has landed on the last session.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (code, events) = ca
        .web()
        .get_json(
            "/api/v1/events?app=jira/127.0.0.21/tcp/80&connector=east-1",
            Some(ADMIN_TOKEN),
        )
        .await;
    assert_eq!(code, 200, "{events}");
    let events = events["events"].as_array().cloned().unwrap_or_default();
    let to_unknown: Vec<_> = events.iter().filter(|e| e["to"] == "unknown").collect();
    assert!(
        to_unknown.is_empty(),
        "no transition to unknown across renewals: {events:?}"
    );
    assert_eq!(
        events.len(),
        1,
        "one transition, the first result: {events:?}"
    );
    let _ = stop.send(());
    let ended = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the agent stops");
    assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
    ca.stop().await;
}

/// A connector renewing in a loop is refused after five renewals
/// (RESOURCE_EXHAUSTED, saying when to retry), and a revoked certificate's
/// refused attempts do not use up the allowance of the connector's live
/// certificate.
#[tokio::test]
async fn renewing_in_a_loop_is_refused_after_the_burst() {
    let ca = Ca::start(&config("")).await;
    let t = ca.target();
    let stolen = enroll(&t, "east-1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    assert_eq!(
        trust::enroll::revoke_connector(&ca.authority, "east-1").expect("db"),
        Some(1)
    );
    assert!(trust::enroll::allow_reenroll(&ca.authority, "east-1").expect("db"));
    let mut live = enroll(&t, "east-1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled again");
    for _ in 0..8 {
        let e = renew(&t, &stolen, "east-1").await.expect_err("revoked");
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    }
    for i in 0..5 {
        live = renew(&t, &live, "east-1")
            .await
            .unwrap_or_else(|e| panic!("renewal {i}: {e:?}"));
    }
    let e = renew(&t, &live, "east-1").await.expect_err("too often");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("renews too often"), "{e:?}");
    // The refused renewal recorded nothing: the last certificate is current.
    assert_eq!(
        connector(&ca, "east-1").await["certificate_serial"],
        live.serial.as_str()
    );
    ca.stop().await;
}
