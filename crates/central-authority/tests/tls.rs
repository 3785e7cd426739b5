//! The CA's TLS material follows a reload: its own server certificate
//! files replaced under access load (HTTPS and gRPC, every request on a
//! new TLS connection) reach every new handshake on both listeners with no
//! failed decision, while a connector session opened before stays up; a
//! broken replacement is refused and the material in force stays.

mod common;

use central_authority::api;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use protocol::v1;

const ADMIN_TOKEN: &str = "tok-admin-PlQ7jmHXY1X2oyup1UokZXlp";

/// A root the test holds (what clients trust and what issues the CA's
/// server certificates and connector certificates).
struct Root {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
    key_pem: String,
}

impl Root {
    fn new(name: &str) -> Root {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let cert = params.self_signed(&key).expect("root");
        let (pem, key_pem) = (cert.pem(), key.serialize_pem());
        Root {
            issuer: rcgen::Issuer::new(params, key),
            pem,
            key_pem,
        }
    }

    /// A server certificate for 127.0.0.1: (certificate PEM, key PEM,
    /// serial in lower-case hex).
    fn server(&self) -> (String, String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                .expect("params");
        let serial: [u8; 16] = rand::random::<[u8; 16]>().map(|b| b & 0x7f);
        let mut serial = serial.to_vec();
        serial[0] |= 0x40;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        let cert = params.signed_by(&key, &self.issuer).expect("server");
        let hex: String = serial.iter().map(|b| format!("{b:02x}")).collect();
        (cert.pem(), key.serialize_pem(), hex)
    }
}

/// Writes `text` to `path` as a deploy would: a new file renamed over it.
fn replace(path: &Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).expect("write");
    std::fs::rename(&next, path).expect("rename");
}

/// The serial of the certificate a new TLS handshake with `addr` gets.
async fn served_serial(addr: SocketAddr, root_pem: &str) -> String {
    let connector =
        tokio_rustls::TlsConnector::from(Arc::new(test_support::http::client_tls(root_pem)));
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let tls = connector.connect(name, tcp).await.expect("handshake");
    let der = tls.get_ref().1.peer_certificates().expect("certificate")[0].clone();
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    cert.tbs_certificate
        .raw_serial()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Decisions made and failed by the load.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
}

/// One access decision over HTTPS on a new connection: whether it chose a
/// connector.
async fn decide_http(addr: SocketAddr, root: &str) -> Result<(), String> {
    let connector =
        tokio_rustls::TlsConnector::from(Arc::new(test_support::http::client_tls(root)));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let body = serde_json::json!({"host": "jira.test.reach", "protocol": "tcp", "port": 80});
    let request = hyper::Request::post("/api/v1/access")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {ACCESS_TOKEN}"))
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            body.to_string(),
        )))
        .map_err(|e| e.to_string())?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    match response.status().as_u16() {
        200 => Ok(()),
        s => Err(format!("status {s}")),
    }
}

/// One access decision over gRPC (`Access/Resolve`) on a new connection.
async fn decide_grpc(t: &Target) -> Result<(), String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", t.grpc))
        .map_err(|e| e.to_string())?
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .ca_certificate(tonic::transport::Certificate::from_pem(&t.root)),
        )
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let decision = v1::access_client::AccessClient::new(channel)
        .resolve(with_access_token(v1::AccessRequest {
            host: "jira.test.reach".into(),
            protocol: v1::Protocol::Tcp as i32,
            port: 80,
            user_location: None,
        }))
        .await
        .map_err(|s| s.to_string())?
        .into_inner();
    match decision.outcome {
        Some(v1::access_decision::Outcome::Selected(_)) => Ok(()),
        other => Err(format!("no connector: {other:?}")),
    }
}

/// Access decisions over HTTPS and gRPC, each on a new TLS connection,
/// until `running` turns false.
fn load(
    http: SocketAddr,
    target: Target,
    running: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while running.load(Ordering::Relaxed) {
            for result in [
                decide_http(http, &target.root).await,
                decide_grpc(&target).await,
            ] {
                match result {
                    Ok(()) => tally.ok.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        eprintln!("failed decision: {e}");
                        tally.failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }
    })
}

/// The session id of connector `name` (admin view), if connected.
fn session_of(ca: &Ca, name: &str) -> Option<String> {
    api::views::connectors(&ca.authority)
        .into_iter()
        .find(|c| c.name == name && c.connected)
        .and_then(|c| c.session_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replaced_server_certificate_files_reach_new_handshakes_under_load() {
    let dir = scratch_dir("tls-reload");
    let root = Root::new("reach test root");
    let (cert_a, key_a, serial_a) = root.server();
    let (cert_b, key_b, serial_b) = root.server();
    let file = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let (cert, key) = (file("server.pem", &cert_a), file("server.key", &key_a));
    let (issuer, issuer_key) = (file("root.pem", &root.pem), file("root.key", &root.key_pem));
    let tls = format!(
        "[tls]\ncert_file = {cert:?}\nkey_file = {key:?}\nissuer_cert_file = {issuer:?}\nissuer_key_file = {issuer_key:?}\n\n\
         [[api_tokens]]\nname = \"root\"\ntoken = \"{ADMIN_TOKEN}\"\nscopes = [\"admin\"]\n"
    );
    let path = file(
        "ca.toml",
        &config_text("", "discovery_timeout_ms = 400", &tls),
    );
    let ca = Ca::start_file(&path).await;
    let target = ca.target();
    assert_eq!(served_serial(ca.http, &root.pem).await, serial_a);
    assert_eq!(served_serial(ca.grpc, &root.pem).await, serial_a);

    // A connector session, opened before the swap, reports jira up. After
    // its Welcome the CA tells it the one root to trust.
    let mut conn = open(&target, "east-1", "dc-east", KEY_EAST)
        .await
        .expect("open");
    assert!(matches!(
        conn.next().await,
        Some(protocol::v1::authority_message::Kind::Welcome(_))
    ));
    let bundle = conn.trust_bundle().await;
    assert_eq!(bundle.roots_pem, root.pem);
    assert_eq!(bundle.renew_within_ms, 0);
    conn.report(
        vec![app("jira", "jira.test.reach", 80, &["10.0.0.1"], &[])],
        true,
    )
    .await;
    eventually("jira decided", || async {
        decide_http(ca.http, &root.pem).await.is_ok()
    })
    .await;
    let session = session_of(&ca, "east-1").expect("connected");

    let running = Arc::new(AtomicBool::new(true));
    let tally = Arc::new(Tally::default());
    let load = load(ca.http, target.clone(), running.clone(), tally.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The key first, then the certificate (a poll between them reads a
    // pair that does not match: that reload is refused, the next applies).
    replace(&key, &key_b);
    replace(&cert, &cert_b);
    for addr in [ca.http, ca.grpc] {
        eventually("a new handshake gets the new certificate", || async {
            served_serial(addr, &root.pem).await == serial_b
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // A broken certificate file is refused: the material in force stays.
    let refused_before = reloads_refused(&ca).await;
    replace(&cert, "not a certificate");
    eventually("the broken file's reload is refused", || async {
        reloads_refused(&ca).await > refused_before
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(served_serial(ca.http, &root.pem).await, serial_b);
    assert_eq!(served_serial(ca.grpc, &root.pem).await, serial_b);
    let (status, audit) = ca
        .web()
        .get_json("/api/v1/audit?action=config.reload", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(status, 200, "{audit}");
    let latest = &audit["entries"][0];
    assert_eq!(latest["outcome"], "refused", "{audit}");
    assert!(
        latest["detail"]
            .as_str()
            .is_some_and(|d| d.contains("server certificate")),
        "the refusal says why: {latest}"
    );
    assert!(
        audit["entries"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["outcome"] == "ok"
                && e["detail"].as_str().is_some_and(|d| d.contains(&serial_b)))),
        "the applied reload names the new certificate: {audit}"
    );

    running.store(false, Ordering::Relaxed);
    load.await.expect("load");
    let (ok, failed) = (
        tally.ok.load(Ordering::Relaxed),
        tally.failed.load(Ordering::Relaxed),
    );
    eprintln!("decisions across the swap: {ok} ok, {failed} failed");
    assert_eq!(failed, 0, "failed decisions");
    assert!(ok > 10, "the load ran: {ok}");

    // The session opened before the swap is the one still registered, and
    // the CA asked it to go nowhere.
    assert_eq!(session_of(&ca, "east-1"), Some(session));
    conn.heartbeat(v1::CheckLoad::default()).await;
    assert!(
        conn.next_within(Duration::from_millis(500)).await.is_none(),
        "the session was told something (or ended)"
    );
    ca.stop().await;
}

/// `reach_ca_config_reloads_total{outcome="rejected"}`.
async fn reloads_refused(ca: &Ca) -> u64 {
    let (_, text) = ca
        .web()
        .send("GET", "/metrics", Some(READ_TOKEN), None)
        .await;
    text.lines()
        .find(|l| l.starts_with("reach_ca_config_reloads_total{outcome=\"rejected\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<f64>().ok())
        .map_or(0, |n| n as u64)
}

/// A server certificate the CA issues itself is issued anew by a reload
/// (from the root in force, with the names in force).
#[tokio::test]
async fn a_reload_issues_the_generated_server_certificate_anew() {
    let dir = scratch_dir("tls-generated");
    let path = dir.join("ca.toml");
    let text = default_config();
    std::fs::write(&path, &text).expect("write");
    let ca = Ca::start_file(&path).await;
    let root = ca.root();
    let before = served_serial(ca.grpc, &root).await;
    replace(&path, &format!("{text}\n# touched\n"));
    for addr in [ca.grpc, ca.http] {
        eventually("a new handshake gets a new certificate", || async {
            served_serial(addr, &root).await != before
        })
        .await;
    }
    ca.stop().await;
}

/// The number of certificates in a PEM text.
fn certificates_in(pem: &str) -> usize {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes()).count()
}

/// `GET /api/v1/root`.
async fn root_status(ca: &Ca) -> serde_json::Value {
    let (status, v) = ca.web().get_json("/api/v1/root", Some(ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{v}");
    v
}

/// The names in `GET /api/v1/root`'s `on_old_root`.
async fn on_old_root(ca: &Ca) -> Vec<String> {
    root_status(ca).await["on_old_root"]
        .as_array()
        .map(|l| {
            l.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The admin view of connector `name`.
async fn connector_view(ca: &Ca, name: &str) -> serde_json::Value {
    let (_, v) = ca
        .web()
        .get_json("/api/v1/connectors", Some(ADMIN_TOKEN))
        .await;
    v["connectors"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == name).cloned())
        .unwrap_or_default()
}

/// A root rotation in three reloads, with the real connector agent and a
/// connector that does not know trust bundles (as 0.1.0): introduced, the
/// agent keeps both roots in its state directory; switched, the CA serves
/// a certificate of the new root and the agent, asked to, renews onto it
/// while the old connector's session stays; retired, the old connector's
/// session ends, its certificate is refused, and the agent, never enrolled
/// again (its group's key is revoked), trusts only the new root.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_root_rotates_in_three_reloads() {
    let dir = scratch_dir("rotation");
    let path = dir.join("ca.toml");
    let base = config_text(
        "heartbeat_interval_ms = 60000",
        "discovery_timeout_ms = 400",
        &format!(
            "[[api_tokens]]\nname = \"root\"\ntoken = \"{ADMIN_TOKEN}\"\nscopes = [\"admin\"]\n"
        ),
    );
    // `[tls]` goes before the first array table.
    let with_tls = |tls: &str| {
        base.replacen(
            "[[api_tokens]]",
            &format!(
                "[tls]\nconnector_cert_validity_s = 60\nrenewal_grace_s = 5\n{tls}\n[[api_tokens]]"
            ),
            1,
        )
    };
    std::fs::write(&path, with_tls("")).expect("write");
    let ca = Ca::start_file(&path).await;
    let old_root = ca.data_dir.join("ca.pem");
    let old_pem = ca.root();

    // The real agent, and a connector that ignores trust bundles.
    let agent = agent_config(&ca, "rotation-agent", "east-1", "dc-east", KEY_EAST);
    let state = agent.state_dir.clone();
    let (stop, task) = spawn_agent(agent);
    let (mut legacy, _) = connect(&ca, "east-old", "dc-east").await;
    let legacy_creds = enrolled(&ca.target(), "east-old", "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    eventually("the agent connected", || async {
        connector_view(&ca, "east-1").await["connected"] == true
    })
    .await;
    let first_serial = connector_view(&ca, "east-1").await["certificate_serial"].clone();
    // Nobody may enroll from here on: a connector that had to would fail.
    let (status, _) = ca
        .web()
        .send(
            "POST",
            "/api/v1/provisioning_keys/dc-east/revoke",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let status = root_status(&ca).await;
    assert_eq!(status["phase"], "steady", "{status}");
    assert_eq!(on_old_root(&ca).await, Vec::<String>::new());

    // Introduce.
    let new = central_authority::tools::root::run(&dir.join("root-2")).expect("new root");
    let new_pem = std::fs::read_to_string(&new.cert).expect("new root");
    replace(
        &path,
        &with_tls(&format!("next_root_file = {:?}\n", new.cert)),
    );
    eventually("the agent keeps both roots", || async {
        std::fs::read_to_string(state.join("trust.pem"))
            .is_ok_and(|t| certificates_in(&t) == 2 && t.contains(new_pem.trim()))
    })
    .await;
    let status = root_status(&ca).await;
    assert_eq!(status["phase"], "introduce", "{status}");
    assert_eq!(status["roots"][1]["fingerprint"], new.fingerprint.as_str());
    assert_eq!(on_old_root(&ca).await, ["east-1", "east-old"]);
    assert_eq!(
        status["without_trust_bundle"],
        serde_json::json!(["east-old"])
    );

    // Switch: the new root issues; the agent is asked to renew.
    replace(
        &path,
        &with_tls(&format!(
            "issuer_cert_file = {:?}\nissuer_key_file = {:?}\nprevious_root_file = {old_root:?}\n",
            new.cert, new.key
        )),
    );
    eventually(
        "a new handshake gets a certificate of the new root",
        || async {
            let connector = tokio_rustls::TlsConnector::from(Arc::new(
                test_support::http::client_tls(&new_pem),
            ));
            let Ok(tcp) = tokio::net::TcpStream::connect(ca.grpc).await else {
                return false;
            };
            let name = rustls::pki_types::ServerName::IpAddress(ca.grpc.ip().into());
            connector.connect(name, tcp).await.is_ok()
        },
    )
    .await;
    eventually("the agent renewed onto the new root", || async {
        on_old_root(&ca).await == ["east-old"]
    })
    .await;
    eventually(
        "the agent is connected on its renewed certificate",
        || async {
            let v = connector_view(&ca, "east-1").await;
            v["connected"] == true && v["certificate_serial"] != first_serial
        },
    )
    .await;
    // The old connector's session is still up.
    legacy.heartbeat(v1::CheckLoad::default()).await;
    assert!(connector_view(&ca, "east-old").await["connected"] == true);

    // Retire: the old root is refused.
    replace(
        &path,
        &with_tls(&format!(
            "issuer_cert_file = {:?}\nissuer_key_file = {:?}\n",
            new.cert, new.key
        )),
    );
    let mut ended = false;
    for _ in 0..50 {
        match legacy.next_within(Duration::from_millis(200)).await {
            Some(protocol::v1::authority_message::Kind::Shutdown(s)) => {
                assert!(s.reason.contains("no longer trusts"), "{s:?}");
                ended = true;
                break;
            }
            Some(_) => {}
            None => {}
        }
    }
    assert!(ended, "the old connector's session ended");
    let new_target = Target {
        grpc: ca.grpc,
        root: new_pem.clone(),
    };
    let refused = open_with(&new_target, &legacy_creds, "east-old", "dc-east");
    let refused = tokio::time::timeout(Duration::from_secs(5), async {
        match refused.await {
            Err(e) => Err(e),
            Ok(mut c) => match c.next_within(Duration::from_secs(2)).await {
                Some(protocol::v1::authority_message::Kind::Welcome(_)) => Ok(()),
                _ => Err(tonic::Status::unknown("no welcome")),
            },
        }
    })
    .await;
    assert!(
        !matches!(refused, Ok(Ok(()))),
        "a certificate of the retired root is refused"
    );
    eventually("the agent trusts only the new root", || async {
        std::fs::read_to_string(state.join("trust.pem")).is_ok_and(|t| {
            certificates_in(&t) == 1 && t.contains(new_pem.trim()) && !t.contains(old_pem.trim())
        })
    })
    .await;
    let status = root_status(&ca).await;
    assert_eq!(status["phase"], "steady", "{status}");
    assert!(connector_view(&ca, "east-1").await["connected"] == true);
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    ca.stop().await;
}
