//! Application-level checks (a segment's `check`) against real web
//! applications on loopback: an HTTP status outside `check_expect` makes
//! the address Down with the status as its reason, the `Host` header is
//! the application's name, a TLS check verifies with `check_ca_file`'s
//! roots (expired, unknown issuer) or accepts any certificate without
//! them, reports the certificate's expiry either way, and each check takes
//! one place in the pacer's rate.

use std::sync::Arc;
use std::time::Duration;

use connector_agent::IcmpPreference;
use connector_agent::checks::pacer::{Pacer, Priority};
use connector_agent::checks::probe::Prober;
use connector_agent::metrics::Metrics;
use policy::{AddressResult, AppCheck, CheckKind, CheckTarget, FailureKind, Host, Protocol};
use test_support::{Certs, WebApp};

const DAY: i64 = 86_400;

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn prober() -> Prober {
    Prober::new(IcmpPreference::Off, Duration::from_secs(5))
}

fn app_check(kind: CheckKind, ca_pem: Option<&str>) -> AppCheck {
    AppCheck {
        kind,
        ca_pem: ca_pem.map(Into::into),
        ..AppCheck::default()
    }
}

async fn run(prober: &Prober, host: &str, check: &AppCheck, app: &WebApp) -> AddressResult {
    let host: Host = host.parse().expect("host");
    let target = CheckTarget {
        address: app.addr().ip(),
        protocol: Protocol::Tcp,
        port: app.addr().port(),
        check: prober.check_id(&host, check),
    };
    prober.check(target).await
}

fn reason(r: &AddressResult) -> Option<&str> {
    r.check.as_ref().and_then(|c| c.reason.as_deref())
}

fn not_after(r: &AddressResult) -> Option<i64> {
    r.check.as_ref().and_then(|c| c.not_after)
}

#[tokio::test]
async fn an_http_check_is_down_on_500_and_up_on_200() {
    let app = WebApp::http("127.0.5.1", 500, None).await.expect("app");
    let prober = prober();
    let check = app_check(CheckKind::Http, None);
    let down = run(&prober, "app.test", &check, &app).await;
    assert!(!down.reachable, "{down:?}");
    assert_eq!(reason(&down), Some("http 500"));
    let failure = down.failure.as_ref().expect("failure");
    assert_eq!(
        (failure.kind, failure.detail.as_str()),
        (FailureKind::Other, "http 500")
    );
    // A bare TCP check of the same port is Up: the port accepts.
    let tcp = run(&prober, "app.test", &AppCheck::default(), &app).await;
    assert!(tcp.reachable && tcp.check.is_none(), "{tcp:?}");

    app.set_status(200);
    let up = run(&prober, "app.test", &check, &app).await;
    assert!(up.reachable, "{up:?}");
    assert!(up.failure.is_none() && up.check.is_none(), "{up:?}");
    // check_expect decides: 500 accepted when asked for.
    app.set_status(500);
    let lenient = AppCheck {
        expect: "200,500-599".parse().expect("ranges"),
        path: "/healthz".into(),
        ..check
    };
    assert!(run(&prober, "app.test", &lenient, &app).await.reachable);
    // Three checks asked; the bare TCP check sent no request.
    assert_eq!(app.requests(), 3);
}

#[tokio::test]
async fn the_host_header_is_the_applications_name() {
    let app = WebApp::http("127.0.5.2", 200, Some("app.test"))
        .await
        .expect("app");
    let prober = prober();
    let check = app_check(CheckKind::Http, None);
    let right = run(&prober, "app.test", &check, &app).await;
    assert!(right.reachable, "{right:?}");
    let wrong = run(&prober, "other.test", &check, &app).await;
    assert!(!wrong.reachable);
    assert_eq!(reason(&wrong), Some("http 421"));
}

#[tokio::test]
async fn an_expired_certificate_is_down_with_roots_and_up_without() {
    let certs = Certs::issue("app.test", now() - 30 * DAY, now() - DAY).expect("certs");
    let app = WebApp::https("127.0.5.3", 200, Some("app.test"), &certs)
        .await
        .expect("app");
    let prober = prober();
    for kind in [CheckKind::Tls, CheckKind::Https] {
        let verified = run(
            &prober,
            "app.test",
            &app_check(kind, Some(&certs.ca_pem)),
            &app,
        )
        .await;
        assert!(!verified.reachable, "{kind}: {verified:?}");
        assert_eq!(
            reason(&verified),
            Some("tls: certificate expired"),
            "{kind}"
        );
        assert_eq!(not_after(&verified), Some(certs.not_after), "{kind}");

        let unverified = run(&prober, "app.test", &app_check(kind, None), &app).await;
        assert!(unverified.reachable, "{kind}: {unverified:?}");
        assert_eq!(reason(&unverified), None);
        assert_eq!(not_after(&unverified), Some(certs.not_after), "{kind}");
    }
    // Only the https checks sent a request (the tls ones stop at the
    // handshake, and the verified https one never got past it).
    assert_eq!(app.requests(), 1);
}

#[tokio::test]
async fn a_certificate_of_another_issuer_is_down_and_a_valid_one_up() {
    let certs = Certs::issue("app.test", now() - DAY, now() + 90 * DAY).expect("certs");
    let other = Certs::issue("app.test", now() - DAY, now() + 90 * DAY).expect("other CA");
    let app = WebApp::https("127.0.5.4", 200, Some("app.test"), &certs)
        .await
        .expect("app");
    let prober = prober();
    let unknown = run(
        &prober,
        "app.test",
        &app_check(CheckKind::Https, Some(&other.ca_pem)),
        &app,
    )
    .await;
    assert!(!unknown.reachable);
    assert_eq!(reason(&unknown), Some("tls: unknown issuer"));

    let check = AppCheck {
        path: "/healthz".into(),
        ..app_check(CheckKind::Https, Some(&certs.ca_pem))
    };
    let valid = run(&prober, "app.test", &check, &app).await;
    assert!(valid.reachable, "{valid:?}");
    assert_eq!(not_after(&valid), Some(certs.not_after));
    // The name is verified: the certificate is not for another name.
    let misnamed = run(&prober, "other.test", &check, &app).await;
    assert!(!misnamed.reachable);
    assert_eq!(
        reason(&misnamed),
        Some("tls: certificate not valid for the name")
    );
}

#[tokio::test]
async fn an_ip_application_is_checked_by_address() {
    let certs = Certs::issue("127.0.5.5", now() - DAY, now() + DAY).expect("certs");
    let app = WebApp::https("127.0.5.5", 200, Some("127.0.5.5"), &certs)
        .await
        .expect("app");
    let r = run(
        &prober(),
        "127.0.5.5",
        &app_check(CheckKind::Https, Some(&certs.ca_pem)),
        &app,
    )
    .await;
    assert!(r.reachable, "{r:?}");
    assert_eq!(not_after(&r), Some(certs.not_after));
}

/// Each application-level check is one check of the pacer: it starts once
/// per target and makes one request; the same address and port with a
/// bare TCP check is a target of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_check_counts_once_against_the_rate() {
    let app = WebApp::http("127.0.5.6", 200, None).await.expect("app");
    let prober = Arc::new(prober());
    let host: Host = "app.test".parse().expect("host");
    let id = prober.check_id(&host, &app_check(CheckKind::Http, None));
    assert_ne!(id, 0);
    // The same application and check get the same id; a bare check 0.
    assert_eq!(
        prober.check_id(&host, &app_check(CheckKind::Http, None)),
        id
    );
    assert_eq!(prober.check_id(&host, &AppCheck::default()), 0);
    let (pacer, task) = Pacer::spawn(prober, 5, 4, Metrics::new());
    let target = |check| CheckTarget {
        address: app.addr().ip(),
        protocol: Protocol::Tcp,
        port: app.addr().port(),
        check,
    };
    for round in 1..=3u64 {
        let http = pacer
            .check(target(id), Priority::Continuous, Duration::ZERO)
            .await;
        assert!(http.reachable, "{http:?}");
        let tcp = pacer
            .check(target(0), Priority::Continuous, Duration::ZERO)
            .await;
        assert!(tcp.reachable && tcp.check.is_none(), "{tcp:?}");
        assert_eq!(pacer.stats().started, 2 * round);
        assert_eq!(app.requests(), round);
    }
    task.abort();
}
