//! Several CA replicas on one store, in this process over loopback: a real
//! PostgreSQL server (started by `test_support::Postgres`) and, for the
//! reconcile fallback, one SQLite file shared by two CAs. Replicas share
//! the issuing root through `[tls] issuer_*_file` and a service name
//! through `[tls] server_names`; enrollment limits hold across them; a
//! revocation or disable on one closes the connector's session on the
//! other; a drain on one holds on the other; each lists both in
//! `GET /api/v1/replicas`.

mod common;

use central_authority::api;
use central_authority::trust;
use std::path::Path;
use std::time::Duration;

use common::*;
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

const ADMIN_TOKEN: &str = "tok-admin-PlQ7jmHXY1X2oyup1UokZXlp";
const SERVICE_NAME: &str = "ca.reach.test";

/// A replica's config: the common policy (dc-west's key usable once), an
/// admin token, the store at `url`, the service name, the issuing root of
/// `issuer` (a data directory) when given, and replica id `id`.
fn replica_config(url: &str, issuer: Option<&Path>, id: &str) -> String {
    let tls = match issuer {
        Some(dir) => format!(
            "issuer_cert_file = {:?}\nissuer_key_file = {:?}\n",
            dir.join("ca.pem"),
            dir.join("ca.key")
        ),
        None => String::new(),
    };
    let extra = format!(
        "[[api_tokens]]\nname = \"root\"\ntoken = \"{ADMIN_TOKEN}\"\nscopes = [\"admin\"]\n\n\
         [store]\nurl = {url:?}\n\n[tls]\nserver_names = [\"{SERVICE_NAME}\"]\n{tls}\n\
         [replica]\nid = {id:?}\n"
    );
    config_text("", "discovery_timeout_ms = 400", &extra).replace(
        &format!("provisioning_key = \"{KEY_WEST}\""),
        &format!("provisioning_key = \"{KEY_WEST}\"\nmax_uses = 1"),
    )
}

/// Two replicas on the store at `url`, the second with the first's root.
async fn two_replicas(url: &str) -> (Ca, Ca) {
    let a = Ca::start(&replica_config(url, None, "replica-a")).await;
    let b = Ca::start(&replica_config(url, Some(&a.data_dir), "replica-b")).await;
    assert_eq!(a.root(), b.root(), "one issuing root");
    (a, b)
}

/// A channel to `ca` that verifies its certificate against `root` under
/// the shared service name, not its address.
async fn by_service_name(ca: &Ca, root: &str) -> tonic::transport::Channel {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(root))
        .domain_name(SERVICE_NAME);
    Endpoint::from_shared(format!("https://{}", ca.grpc))
        .expect("endpoint")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .expect("connects under the service name")
}

/// Enrolls `name` in dc-west over `channel`.
async fn enroll_west(
    channel: tonic::transport::Channel,
    name: &str,
) -> Result<v1::EnrollResponse, tonic::Status> {
    let (_, csr) = key_and_csr(name);
    v1::enrollment_client::EnrollmentClient::new(channel)
        .enroll(v1::EnrollRequest {
            name: name.into(),
            group: "dc-west".into(),
            provisioning_key: KEY_WEST.into(),
            csr_pem: csr,
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Whether `ca` lists connector `name` as connected.
async fn connected(ca: &Ca, name: &str) -> bool {
    let (s, v) = ca
        .web()
        .get_json("/api/v1/connectors", Some(READ_TOKEN))
        .await;
    assert_eq!(s, 200, "{v}");
    v["connectors"].as_array().is_some_and(|list| {
        list.iter()
            .any(|c| c["name"] == name && c["connected"] == true)
    })
}

/// Waits (generously: this is not a measurement) for `conn`'s Shutdown.
async fn shut_down(conn: &mut Conn, what: &str) -> v1::Shutdown {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match tokio::time::timeout_at(deadline, conn.rx.message()).await {
            Ok(Ok(Some(v1::AuthorityMessage {
                kind: Some(Out::Shutdown(s)),
            }))) => return s,
            Ok(Ok(Some(_))) => continue,
            Ok(other) => panic!("{what}: stream ended without a Shutdown: {other:?}"),
            Err(_) => panic!("{what}: no Shutdown within 15 s"),
        }
    }
}

/// The scenario on one store: a connector with sessions on both replicas
/// is revoked on B and cut off on A too; another is disabled on A and cut
/// off on B.
async fn revocations_cross_replicas(a: &Ca, b: &Ca) {
    let (ta, tb) = (a.target(), b.target());
    let creds = enroll(&ta, "c1", "dc-east", KEY_EAST)
        .await
        .expect("enrolled on A");
    let mut on_a = open_with(&ta, &creds, "c1", "dc-east")
        .await
        .expect("session on A");
    assert!(matches!(on_a.next().await, Some(Out::Welcome(_))));
    // The certificate A issued authenticates at B: one store, one root.
    let mut on_b = open_with(&tb, &creds, "c1", "dc-east")
        .await
        .expect("session on B");
    assert!(matches!(on_b.next().await, Some(Out::Welcome(_))));
    assert!(connected(a, "c1").await && connected(b, "c1").await);

    let (s, body) = b
        .web()
        .send(
            "POST",
            "/api/v1/connectors/c1/revoke",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let revoked_at = std::time::Instant::now();
    let local = shut_down(&mut on_b, "c1 on B (where it was revoked)").await;
    assert!(local.reason.contains("revoked"), "{local:?}");
    let remote = shut_down(&mut on_a, "c1 on A (revoked on B)").await;
    assert!(remote.reason.contains("revoked"), "{remote:?}");
    // Reported, not asserted: speed is for benchmarks.
    eprintln!("revoke on B to Shutdown on A: {:?}", revoked_at.elapsed());
    eventually("A lists c1 disconnected", || async {
        !connected(a, "c1").await
    })
    .await;
    let Err(e) = open_with(&ta, &creds, "c1", "dc-east").await else {
        panic!("a revoked certificate opens no session on A")
    };
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");

    // A disable on A reaches a session on B.
    let creds = enroll(&tb, "c2", "dc-east", KEY_EAST)
        .await
        .expect("enrolled on B");
    let mut on_b = open_with(&tb, &creds, "c2", "dc-east")
        .await
        .expect("session on B");
    assert!(matches!(on_b.next().await, Some(Out::Welcome(_))));
    let (s, body) = a
        .web()
        .send(
            "POST",
            "/api/v1/connectors/c2/disable",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let remote = shut_down(&mut on_b, "c2 on B (disabled on A)").await;
    assert!(remote.reason.contains("disabled"), "{remote:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_postgres_share_limits_revocations_and_the_replica_list() {
    let url = test_support::Postgres::shared()
        .fresh_database()
        .expect("database");
    let (a, b) = two_replicas(&url).await;
    let root = a.root();

    // dc-west's key has one use: two enrollments at once, one per replica
    // (each reached under the service name), and exactly one succeeds.
    let (ca, cb) = (
        by_service_name(&a, &root).await,
        by_service_name(&b, &root).await,
    );
    let (ra, rb) = tokio::join!(enroll_west(ca, "w1"), enroll_west(cb, "w2"));
    let ok = [&ra, &rb].iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 1, "exactly one enrollment: {ra:?} {rb:?}");
    let refused = [ra, rb]
        .into_iter()
        .find_map(Result::err)
        .expect("one refusal");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("exhausted"), "{refused:?}");

    revocations_cross_replicas(&a, &b).await;

    // Both replicas are listed by each, live, with one policy hash.
    let (s, v) = a.web().get_json("/api/v1/replicas", Some(READ_TOKEN)).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["this"], "replica-a", "{v}");
    let list = v["replicas"].as_array().expect("replicas");
    let ids: Vec<&str> = list.iter().filter_map(|r| r["id"].as_str()).collect();
    assert_eq!(ids, ["replica-a", "replica-b"], "{v}");
    assert!(list.iter().all(|r| r["live"] == true), "{v}");
    assert_eq!(list[0]["policy_hash"], list[1]["policy_hash"], "{v}");
    assert_eq!(list[0]["this"], true, "{v}");
    assert_eq!(
        list[1]["addresses"][0],
        b.grpc.to_string(),
        "advertises its gRPC address: {v}"
    );
    // Reading it takes the read scope.
    let (s, _) = b.web().get_json("/api/v1/replicas", None).await;
    assert_eq!(s, 401);

    b.stop().await;
    eventually("a stopped replica removes itself", || async {
        let (_, v) = a.web().get_json("/api/v1/replicas", Some(READ_TOKEN)).await;
        v["replicas"].as_array().is_some_and(|l| l.len() == 1)
    })
    .await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_sqlite_file_close_revoked_sessions_by_reconcile() {
    let dir = scratch_dir("shared-sqlite");
    let url = format!("sqlite:{}", dir.join("shared.db").display());
    let (a, b) = two_replicas(&url).await;
    revocations_cross_replicas(&a, &b).await;
    b.stop().await;
    a.stop().await;
}

/// Enrolls `name` in dc-east on A and opens a session with it on both
/// replicas, which report jira up and heartbeat every second (until the
/// returned tasks are aborted).
async fn reporting_on_both(a: &Ca, b: &Ca, name: &str) -> Vec<tokio::task::JoinHandle<()>> {
    let creds = enroll(&a.target(), name, "dc-east", KEY_EAST)
        .await
        .expect("enrolled");
    let mut tasks = Vec::new();
    for ca in [a, b] {
        let mut conn = open_with(&ca.target(), &creds, name, "dc-east")
            .await
            .expect("session");
        assert!(matches!(conn.next().await, Some(Out::Welcome(_))));
        conn.report(
            vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
            true,
        )
        .await;
        tasks.push(tokio::spawn(async move {
            loop {
                conn.heartbeat(v1::CheckLoad::default()).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }));
    }
    tasks
}

/// Whether `ca`'s decision for jira explains `name` as drained.
async fn drained_at(ca: &Ca, name: &str) -> bool {
    let (s, v) = ca.web().access("jira.test.reach", "tcp", 80).await;
    s == 200
        && v["explanation"]["candidates"].as_array().is_some_and(|l| {
            l.iter().any(|c| {
                c["connector"] == name && c["reason"] == "drained: selected for no new access"
            })
        })
}

/// The scenario on one store: d1 and d2 report jira to both replicas; d1
/// drained on A is drained on B (every decision there goes to d2, and B
/// lists who drained it); undrained on B, A chooses it again.
async fn drains_cross_replicas(a: &Ca, b: &Ca) {
    let mut tasks = reporting_on_both(a, b, "d1").await;
    tasks.extend(reporting_on_both(a, b, "d2").await);
    for ca in [a, b] {
        eventually("jira up at d1 and d2", || async {
            ca.web()
                .app("jira", "jira.test.reach", 80)
                .await
                .is_some_and(|v| v["connectors"].as_array().is_some_and(|l| l.len() == 2))
        })
        .await;
    }
    let (s, body) = a
        .web()
        .send(
            "POST",
            "/api/v1/connectors/d1/drain",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let drained = std::time::Instant::now();
    eventually("B honours A's drain", || drained_at(b, "d1")).await;
    // Reported, not asserted: speed is for benchmarks.
    eprintln!("drain on A to in force on B: {:?}", drained.elapsed());
    for _ in 0..30 {
        let (s, v) = b.web().access("jira.test.reach", "tcp", 80).await;
        assert_eq!((s, &v["connector"]), (200, &"d2".into()), "{v}");
    }
    let (_, list) = b
        .web()
        .get_json("/api/v1/connectors", Some(READ_TOKEN))
        .await;
    let d1 = list["connectors"]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == "d1"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(d1["drained"]["by"]["name"], "root", "{list}");
    let (s, body) = b
        .web()
        .send(
            "POST",
            "/api/v1/connectors/d1/undrain",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    eventually("A honours B's undrain", || async {
        !drained_at(a, "d1").await
    })
    .await;
    eventually("A chooses d1 again", || async {
        a.web().access("jira.test.reach", "tcp", 80).await.1["connector"] == "d1"
    })
    .await;
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_on_one_replica_holds_on_the_other_on_postgres() {
    let url = test_support::Postgres::shared()
        .fresh_database()
        .expect("database");
    let (a, b) = two_replicas(&url).await;
    drains_cross_replicas(&a, &b).await;
    b.stop().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_on_one_replica_holds_on_the_other_on_one_sqlite_file() {
    let dir = scratch_dir("shared-sqlite-drain");
    let url = format!("sqlite:{}", dir.join("shared.db").display());
    let (a, b) = two_replicas(&url).await;
    drains_cross_replicas(&a, &b).await;
    b.stop().await;
    a.stop().await;
}

/// How long the database is down in `a_database_outage_leaves_every_replica_serving`:
/// a failover's worth, well past the 2 s readiness used to wait for the
/// store and the 15 s a pool call waits for a connection.
const OUTAGE: Duration = Duration::from_secs(60);

/// Sends a heartbeat on each of `conns` every second and, per replica in
/// turn, an access request for jira until `stop`; returns (decisions
/// routed, decisions failed with their answers).
async fn access_load(
    cas: Vec<(Http, Conn)>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> (Vec<Conn>, usize, Vec<String>) {
    let (mut ok, mut failed) = (0, Vec::new());
    let mut beat = tokio::time::interval(Duration::from_secs(1));
    let mut round = tokio::time::interval(Duration::from_millis(100));
    let mut next = 0;
    while !*stop.borrow() {
        tokio::select! {
            _ = stop.changed() => {}
            _ = beat.tick() => {
                for (_, conn) in &cas {
                    conn.heartbeat(v1::CheckLoad::default()).await;
                }
            }
            _ = round.tick() => {
                let (web, _) = &cas[next % cas.len()];
                next += 1;
                let (s, v) = web.access("jira.test.reach", "tcp", 80).await;
                if s == 200 && v["connector"] == "c1" {
                    ok += 1;
                } else {
                    failed.push(format!("{s} {v}"));
                }
            }
        }
    }
    (cas.into_iter().map(|(_, c)| c).collect(), ok, failed)
}

/// Polls every replica's `/readyz` until `stop`; returns the answers that
/// were not 200.
async fn readiness_watch(
    webs: Vec<Http>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> (usize, Vec<String>) {
    let (mut polls, mut unready) = (0, Vec::new());
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    while !*stop.borrow() {
        tokio::select! {
            _ = stop.changed() => {}
            _ = tick.tick() => {
                for (i, web) in webs.iter().enumerate() {
                    let (s, body) = web.send("GET", "/readyz", None, None).await;
                    polls += 1;
                    if s != 200 {
                        unready.push(format!("replica {i}: {s} {body}"));
                    }
                }
            }
        }
    }
    (polls, unready)
}

/// What each replica says about its store: `/api/v1/replicas`'s `store`
/// and the `reach_ca_store_up` gauge.
async fn store_seen(ca: &Ca) -> (bool, serde_json::Value) {
    let (s, v) = ca
        .web()
        .get_json("/api/v1/replicas", Some(READ_TOKEN))
        .await;
    assert_eq!(
        s, 200,
        "/api/v1/replicas answers whatever the store does: {v}"
    );
    let (s, metrics) = ca
        .web()
        .send("GET", "/metrics", Some(READ_TOKEN), None)
        .await;
    assert_eq!(s, 200, "{metrics}");
    let gauge = metrics
        .lines()
        .find_map(|l| l.strip_prefix("reach_ca_store_up "))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no reach_ca_store_up in:\n{metrics}"));
    let up = v["store"]["up"] == true;
    assert_eq!(gauge, if up { "1" } else { "0" }, "the gauge agrees: {v}");
    (up, v)
}

/// A database outage (PostgreSQL stopped for `OUTAGE`) under access load
/// on three replicas: every decision is made, every replica stays ready
/// (`/readyz`, and `/healthz`, its alias), `/livez` answers, the store's
/// state shows in `/api/v1/replicas` and `reach_ca_store_up`, a connector
/// whose certificate cannot be looked up gets `UNAVAILABLE` (not a
/// certificate error), and an admin write is refused with 503
/// `store_unavailable`, not applied, and applied on every replica when
/// made again once the database is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_leaves_every_replica_serving() {
    let pg = test_support::Postgres::start().expect("a PostgreSQL of this test's own");
    let url = pg.fresh_database().expect("database");
    let a = Ca::start(&replica_config(&url, None, "replica-a")).await;
    let b = Ca::start(&replica_config(&url, Some(&a.data_dir), "replica-b")).await;
    let c = Ca::start(&replica_config(&url, Some(&a.data_dir), "replica-c")).await;
    let replicas = [&a, &b, &c];
    // c1 attached to every replica, jira Up; c2 enrolled, not attached.
    let mut cas = Vec::new();
    for ca in replicas {
        let (conn, _) = connect(ca, "c1", "dc-east").await;
        conn.report(
            vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
            true,
        )
        .await;
        eventually("jira up at the replica", || async {
            ca.web().access("jira.test.reach", "tcp", 80).await.0 == 200
        })
        .await;
        cas.push((ca.web(), conn));
    }
    enrolled(&a.target(), "c2", "dc-east", KEY_EAST)
        .await
        .expect("c2 enrolled");
    for ca in replicas {
        for path in ["/livez", "/readyz", "/healthz"] {
            let (s, body) = ca.web().send("GET", path, None, None).await;
            assert_eq!((s, body.as_str()), (200, "ok\n"), "{path}");
        }
        assert!(store_seen(ca).await.0, "the store is up");
    }

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let load = tokio::spawn(access_load(cas, stop_rx.clone()));
    let watch = tokio::spawn(readiness_watch(
        replicas.iter().map(|ca| ca.web()).collect(),
        stop_rx,
    ));

    pg.halt().expect("PostgreSQL stops");
    let down = tokio::time::Instant::now();
    for ca in replicas {
        eventually("the replica sees its store down", || async {
            !store_seen(ca).await.0
        })
        .await;
        let (_, v) = store_seen(ca).await;
        assert_eq!(v["store"]["backend"], "postgres", "{v}");
        assert!(
            v["store"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("does not answer")),
            "{v}"
        );
    }
    // An admin write on each replica: refused, naming the store.
    for ca in replicas {
        let (s, body) = ca
            .web()
            .send(
                "POST",
                "/api/v1/connectors/c1/disable",
                Some(ADMIN_TOKEN),
                None,
            )
            .await;
        assert_eq!(s, 503, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).expect("a JSON error");
        assert_eq!(v["error"]["reason"], "store_unavailable", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("store")),
            "{v}"
        );
    }
    // A connector whose certificate cannot be looked up: UNAVAILABLE.
    let refused = match open(&b.target(), "c2", "dc-east", KEY_EAST).await {
        Err(status) => status,
        Ok(mut conn) => match conn.rx.message().await {
            Err(status) => status,
            other => panic!("c2 admitted while its certificate cannot be checked: {other:?}"),
        },
    };
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        !refused.message().contains("certificate cannot be parsed"),
        "{refused:?}"
    );
    tokio::time::sleep_until(down + OUTAGE).await;
    pg.resume().expect("PostgreSQL starts again");
    for ca in replicas {
        eventually("the replica sees its store again", || async {
            store_seen(ca).await.0
        })
        .await;
    }
    stop_tx.send(true).expect("stop the load");
    let (conns, ok, failed) = load.await.expect("load task");
    let (polls, unready) = watch.await.expect("readiness task");
    assert!(
        failed.is_empty(),
        "{} failed decisions of {}: {:?}",
        failed.len(),
        ok + failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(ok >= 300, "decisions kept coming through the outage: {ok}");
    assert!(
        unready.is_empty(),
        "{} of {polls} readiness polls not 200: {:?}",
        unready.len(),
        &unready[..unready.len().min(5)]
    );

    // The refused write was not applied: c1 is still attached everywhere.
    for ca in replicas {
        assert!(connected(ca, "c1").await, "c1 still attached");
    }
    // Made again, it is applied, and every replica ends c1's session.
    let (s, body) = c
        .web()
        .send(
            "POST",
            "/api/v1/connectors/c1/disable",
            Some(ADMIN_TOKEN),
            None,
        )
        .await;
    assert_eq!(s, 200, "{body}");
    for mut conn in conns {
        let end = shut_down(&mut conn, "c1 disabled after the outage").await;
        assert!(end.reason.contains("disabled"), "{end:?}");
    }
    for ca in replicas {
        eventually("c1 detached", || async { !connected(ca, "c1").await }).await;
    }
    c.stop().await;
    b.stop().await;
    a.stop().await;
}

/// dc-east's key after a rotation.
const KEY_EAST_ROTATED: &str = "key-east-rotated-oqp4fcNQEgNexGKqPreKSK96";

/// The common policy without TLS, on its own SQLite file.
fn plain_config() -> String {
    config_text("", "discovery_timeout_ms = 400", "[tls]\nenabled = false\n")
}

/// Revokes `group`'s provisioning key through `ca`'s authority (off the
/// async workers, as the admin API does); whether the group had one.
async fn revoke_key(ca: &Ca, group: &'static str) -> bool {
    let authority = ca.authority.clone();
    tokio::task::spawn_blocking(move || trust::enroll::revoke_provisioning_key(&authority, group))
        .await
        .expect("revoke task")
        .expect("store")
}

/// Sends `Hello` on a pending stream; the CA's first answer must be an
/// error with `code`, not `Welcome`. Returns its message.
async fn refused_at_hello(conn: &mut Conn, code: tonic::Code, what: &str) -> String {
    conn.tx
        .send(hello(&conn.name, &conn.group))
        .await
        .expect("send Hello");
    match tokio::time::timeout(Duration::from_secs(10), conn.rx.message()).await {
        Ok(Err(status)) => {
            assert_eq!(status.code(), code, "{what}: {status:?}");
            status.message().to_owned()
        }
        other => panic!("{what}: admitted or silent: {other:?}"),
    }
}

/// A stream authenticated by a key that is revoked before it says `Hello`
/// is refused when it registers: the standing check at registration
/// looks at the key that authenticated the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_revoked_before_hello_refuses_the_stream_it_authenticated() {
    let ca = Ca::start_plain(&plain_config()).await;
    let mut pending = open_plain_with(ca.grpc, "p1", KEY_EAST, false)
        .await
        .expect("authenticated while the key is good");
    let revoked = revoke_key(&ca, "dc-east").await;
    assert!(revoked);
    let message = refused_at_hello(
        &mut pending,
        tonic::Code::PermissionDenied,
        "p1 after its key was revoked",
    )
    .await;
    assert!(message.contains("revoked"), "{message}");
    ca.stop().await;
}

/// A rotation (a reload with a new key) ends what the old key
/// authenticated, including a stream that had not said `Hello` when the
/// key changed; the new key admits sessions; and the old key, revoked
/// before the rotation, stays refused if a reload brings it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_on_a_replaced_key_is_refused_and_a_revoked_key_stays_revoked() {
    let text = plain_config();
    let ca = Ca::start_plain(&text).await;
    let load = |text: &str| {
        let mut config = central_authority::Config::from_toml(text, Path::new("."))
            .unwrap_or_else(|e| panic!("{}", e.messages().join("\n")));
        config.settings.data_dir = ca.data_dir.clone();
        config
    };
    let mut pending = open_plain_with(ca.grpc, "p1", KEY_EAST, false)
        .await
        .expect("authenticated by the old key");
    let rotated = text.replace(KEY_EAST, KEY_EAST_ROTATED);
    ca.authority.apply(load(&rotated));
    let message = refused_at_hello(
        &mut pending,
        tonic::Code::Unauthenticated,
        "p1 on the replaced key",
    )
    .await;
    assert!(message.contains("provisioning key"), "{message}");
    let mut fresh = open_plain_with(ca.grpc, "p2", KEY_EAST_ROTATED, true)
        .await
        .expect("the new key authenticates");
    assert!(matches!(fresh.next().await, Some(Out::Welcome(_))));

    // Revoke the new key, rotate back to the old one, then to the revoked
    // one again: the revocation belongs to that key, not to the group.
    revoke_key(&ca, "dc-east").await;
    let closed = shut_down(&mut fresh, "p2 on the revoked key").await;
    assert!(closed.reason.contains("revoked"), "{closed:?}");
    ca.authority.apply(load(&text));
    let mut back = open_plain_with(ca.grpc, "p3", KEY_EAST, true)
        .await
        .expect("the old key was never revoked");
    assert!(matches!(back.next().await, Some(Out::Welcome(_))));
    ca.authority.apply(load(&rotated));
    let Err(e) = open_plain_with(ca.grpc, "p4", KEY_EAST_ROTATED, true).await else {
        panic!("a revoked key authenticates nobody after it comes back")
    };
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("revoked"), "{e:?}");
    ca.stop().await;
}

/// Mid-rollout, replicas A and B hold different keys for one group: a
/// revocation on B ends B's sessions on B's key and leaves A's sessions on
/// A's (unrevoked) key alone, on the reconcile too; revoking A's key then
/// ends them. Each session stands on its own key, on every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_checks_the_key_its_sessions_stand_on() {
    let url = test_support::Postgres::shared()
        .fresh_database()
        .expect("database");
    let plain = |id: &str| {
        replica_config(&url, None, id).replacen("[tls]\n", "[tls]\nenabled = false\n", 1)
    };
    let a = Ca::start_plain(&plain("keys-a")).await;
    let b = Ca::start_plain(&plain("keys-b").replace(KEY_EAST, KEY_EAST_ROTATED)).await;
    let mut on_a = open_plain_with(a.grpc, "p1", KEY_EAST, true)
        .await
        .expect("A takes its key");
    assert!(matches!(on_a.next().await, Some(Out::Welcome(_))));
    let mut on_b = open_plain_with(b.grpc, "p2", KEY_EAST_ROTATED, true)
        .await
        .expect("B takes its key");
    assert!(matches!(on_b.next().await, Some(Out::Welcome(_))));

    revoke_key(&b, "dc-east").await;
    let closed = shut_down(&mut on_b, "p2 on B's revoked key").await;
    assert!(closed.reason.contains("revoked"), "{closed:?}");
    let authority = a.authority.clone();
    let closed_on_a =
        tokio::task::spawn_blocking(move || trust::enroll::reconcile_sessions(&authority))
            .await
            .expect("reconcile task");
    assert_eq!(closed_on_a, 0, "A's session stands on a key nobody revoked");
    let Err(e) = open_plain_with(a.grpc, "p3", KEY_EAST_ROTATED, true).await else {
        panic!("A does not take B's key")
    };
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");

    revoke_key(&a, "dc-east").await;
    let closed = shut_down(&mut on_a, "p1 on A's revoked key").await;
    assert!(closed.reason.contains("revoked"), "{closed:?}");
    b.stop().await;
    a.stop().await;
}

/// Without TLS a connector authenticates with its group's provisioning
/// key: revoking that key on replica A closes the sessions it
/// authenticated on A and on B, and B lets no new one in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_revocation_closes_the_sessions_it_authenticated_on_every_replica() {
    let url = test_support::Postgres::shared()
        .fresh_database()
        .expect("database");
    let plain = |id: &str| {
        replica_config(&url, None, id).replacen("[tls]\n", "[tls]\nenabled = false\n", 1)
    };
    let a = Ca::start_plain(&plain("plain-a")).await;
    let b = Ca::start_plain(&plain("plain-b")).await;
    let mut on_a = open_plain(a.grpc, "p1").await.expect("session on A");
    assert!(matches!(on_a.next().await, Some(Out::Welcome(_))));
    let mut on_b = open_plain(b.grpc, "p1").await.expect("session on B");
    assert!(matches!(on_b.next().await, Some(Out::Welcome(_))));

    let revoked = revoke_key(&a, "dc-east").await;
    assert!(revoked, "dc-east has a key");
    let local = shut_down(&mut on_a, "p1 on A (where the key was revoked)").await;
    assert!(local.reason.contains("revoked"), "{local:?}");
    let remote = shut_down(&mut on_b, "p1 on B (key revoked on A)").await;
    assert!(
        remote.reason.contains("provisioning key") && remote.reason.contains("revoked"),
        "{remote:?}"
    );
    // And the key lets nobody in again, on either replica.
    let mut refused = Vec::new();
    for grpc in [a.grpc, b.grpc] {
        let Err(e) = open_plain(grpc, "p2").await else {
            panic!("a revoked key authenticates no session")
        };
        refused.push(e);
    }
    for e in refused {
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("revoked"), "{e:?}");
    }
    b.stop().await;
    a.stop().await;
}

/// Enrolls dc-east's connector `name` (certificate `serial`) in the store
/// at `location` and disables it there, as another replica would, behind
/// the back of the CA under test.
async fn disable_elsewhere(
    location: central_authority::store::StoreLocation,
    name: &'static str,
    serial: &'static str,
) {
    use central_authority::store::{NewCertificate, Store};
    let done = tokio::task::spawn_blocking(move || -> Result<(), String> {
        let store = Store::open(&location).map_err(|e| e.to_string())?;
        let enrolled = store
            .enroll(&NewCertificate {
                name,
                group: "dc-east",
                key_sha256: "k",
                max_uses: 1,
                serial,
                fingerprint: "f",
                not_after_ms: i64::MAX,
                now_ms: 1,
                root_sha256: "r",
            })
            .map_err(|e| e.to_string())?;
        enrolled.map_err(|e| format!("{e:?}"))?;
        store
            .set_disabled(name, true, 2)
            .map_err(|e| e.to_string())?;
        Ok(())
    })
    .await
    .expect("store task");
    done.unwrap_or_else(|e| panic!("{name} enrolled and disabled in the shared store: {e}"));
}

/// A key-authenticated session of a connector disabled behind this
/// replica's back (by another replica: here, straight in the shared
/// store) is ended by the reconcile, which asks the store for the disabled
/// connectors once, not once per session; the other sessions stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconcile_ends_a_plain_session_of_a_connector_disabled_elsewhere() {
    use central_authority::store::StoreLocation;
    let ca = Ca::start_plain(&plain_config()).await;
    let mut p1 = open_plain(ca.grpc, "p1").await.expect("p1 admitted");
    let mut p2 = open_plain(ca.grpc, "p2").await.expect("p2 admitted");
    for c in [&mut p1, &mut p2] {
        assert!(
            matches!(c.next().await, Some(Out::Welcome(_))),
            "{} welcomed",
            c.name
        );
    }
    disable_elsewhere(
        StoreLocation::Sqlite(ca.data_dir.join("reach.db")),
        "p1",
        "0a",
    )
    .await;
    let authority = ca.authority.clone();
    let closed = tokio::task::spawn_blocking(move || trust::enroll::reconcile_sessions(&authority))
        .await
        .expect("reconcile task");
    assert_eq!(closed, 1, "p1's session, not p2's");
    let end = shut_down(&mut p1, "p1 disabled elsewhere").await;
    assert!(end.reason.contains("disabled"), "{end:?}");
    let authority = ca.authority.clone();
    let again = tokio::task::spawn_blocking(move || trust::enroll::reconcile_sessions(&authority))
        .await
        .expect("reconcile task");
    assert_eq!(again, 0, "p2 stands");
    assert!(
        api::views::connectors(&ca.authority)
            .iter()
            .any(|c| c.name == "p2" && c.connected),
        "p2 stays attached"
    );
    ca.stop().await;
}

/// How often `ca` asked its database what a session's admission asks:
/// whether the connector is disabled and whether its key is revoked.
fn admission_reads(ca: &Ca) -> u64 {
    ca.authority
        .store()
        .calls()
        .iter()
        .filter(|(call, _)| matches!(*call, "is_disabled" | "key_revoked"))
        .map(|(_, n)| *n)
        .sum()
}

/// On PostgreSQL a session's admission asks the database only what no
/// reading taken since the last announcement answers: its `Hello` asks
/// nothing again when nothing was announced since its stream's
/// authentication, a second session admitted within the reading's life (2
/// s) asks nothing, and a change another replica announces (a disable) is
/// read: that connector's next session is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_admission_asks_the_database_once_per_announcement() {
    use central_authority::store::StoreLocation;
    let pg = test_support::Postgres::start().expect("a PostgreSQL of this test's own");
    let url = pg.fresh_database().expect("database");
    let config = config_text(
        "",
        "discovery_timeout_ms = 400",
        &format!("[store]\nurl = {url:?}\n\n[tls]\nenabled = false\n"),
    );
    let ca = Ca::start_plain(&config).await;
    eventually("the replica listens for announcements", || async {
        ca.authority.store().announced().is_some_and(|n| n > 0)
    })
    .await;

    let start = std::time::Instant::now();
    let before = admission_reads(&ca);
    let mut p1 = open_plain_with(ca.grpc, "p1", KEY_EAST, false)
        .await
        .expect("p1 authenticated");
    let authenticated = admission_reads(&ca);
    assert!(authenticated > before, "p1's authentication read the store");
    p1.tx
        .send(hello("p1", "dc-east"))
        .await
        .expect("send Hello");
    assert!(
        matches!(p1.next().await, Some(Out::Welcome(_))),
        "p1 welcomed"
    );
    assert_eq!(
        admission_reads(&ca),
        authenticated,
        "nothing read again at Hello"
    );
    let mut p2 = open_plain(ca.grpc, "p2").await.expect("p2 admitted");
    assert!(
        matches!(p2.next().await, Some(Out::Welcome(_))),
        "p2 welcomed"
    );
    if start.elapsed() < Duration::from_millis(1_500) {
        assert_eq!(
            admission_reads(&ca),
            authenticated,
            "p2 admitted on p1's reading"
        );
    }

    let seen = ca.authority.store().announced();
    disable_elsewhere(
        StoreLocation::Postgres {
            url: url.clone(),
            password: None,
        },
        "p2",
        "0b",
    )
    .await;
    eventually("the disable announced", || async {
        ca.authority.store().announced() != seen
    })
    .await;
    let refused = open_plain(ca.grpc, "p2")
        .await
        .err()
        .expect("p2 refused once disabled elsewhere");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    drop((p1, p2));
    ca.stop().await;
}
