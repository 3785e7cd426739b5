//! The listeners under a hostile crowd: silent and
//! half-handshaken connections cannot lock an access request out, a silent
//! connection is closed after the first-byte timeout, one source address
//! cannot take more than its share of connections, and a flood of bad
//! tokens or enrollments from one address throttles that address only;
//! and a runtime busy with connector sessions does not hold up an access
//! decision.
//! Two sources on one machine: clients bind 127.0.0.2 (the hostile one) or
//! 127.0.0.1 (the legitimate one) before connecting to the CA on 127.0.0.1.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use protocol::v1;
use test_support::http::client_tls;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const HOSTILE: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const FRIENDLY: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));

/// The default config with `limits` as its `[limits]` table.
fn config(limits: &str) -> String {
    default_config().replace("[selection]", &format!("[limits]\n{limits}\n\n[selection]"))
}

/// A TCP connection to `to` from the address `from`.
async fn connect_from(from: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(to).await
}

/// Whether the server closed `s` within `within` (EOF or reset).
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    ended_by_reset(s, within).await.is_some()
}

/// How the server ended `s` within `within`: `Some(true)` reset, `Some(false)`
/// closed (EOF), `None` still open.
async fn ended_by_reset(s: &mut TcpStream, within: Duration) -> Option<bool> {
    let mut buf = [0u8; 512];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) => return false,
                Ok(_) => continue,
                Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
            }
        }
    })
    .await
    .ok()
}

/// Silent TCP connections from `n` addresses, 127.0.1.`first` onwards.
async fn silent_from_many(ca: &Ca, first: u8, n: u8) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for i in 0..n {
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 1, first + i));
        held.push(connect_from(from, ca.http).await.expect("connect"));
    }
    held
}

/// Asserts that an access request from the friendly address is answered
/// within 3 s, `while_` the crowd is held.
async fn assert_answered(ca: &Ca, while_: &str) {
    let answered = tokio::time::timeout(Duration::from_secs(3), access_from(FRIENDLY, ca)).await;
    assert!(
        matches!(answered, Ok(Some(_))),
        "access request not answered while {while_}: {answered:?}"
    );
}

/// The first bytes of a TLS 1.2+ ClientHello record (the header and part of
/// the handshake header), and nothing after: a client stuck mid-hello.
const CLIENT_HELLO_PREFIX: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01];

/// One HTTPS request from `from` with `token`; the status, or `None` when
/// the connection was refused or closed before an answer.
async fn request_from(
    from: IpAddr,
    ca: &Ca,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<serde_json::Value>,
) -> Option<u16> {
    let tcp = connect_from(from, ca.http).await.ok()?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client_tls(&ca.root())));
    let name = rustls::pki_types::ServerName::IpAddress(ca.http.ip().into());
    let tls = tls.connect(name, tcp).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .ok()?;
    tokio::spawn(conn);
    let mut b = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", ca.http.to_string());
    if let Some(t) = token {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let body = match body {
        Some(v) => {
            b = b.header("content-type", "application/json");
            Full::new(Bytes::from(v.to_string()))
        }
        None => Full::new(Bytes::new()),
    };
    let response = sender.send_request(b.body(body).ok()?).await.ok()?;
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await;
    Some(status)
}

/// A gRPC channel to the CA from `from`.
async fn channel_from(from: IpAddr, ca: &Ca) -> tonic::transport::Channel {
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca.root()));
    tonic::transport::Endpoint::from_shared(format!("https://{}", ca.grpc))
        .expect("endpoint")
        .local_address(Some(from))
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .expect("connect")
}

async fn access_from(from: IpAddr, ca: &Ca) -> Option<u16> {
    request_from(
        from,
        ca,
        "POST",
        "/api/v1/access",
        Some(ACCESS_TOKEN),
        Some(serde_json::json!({"host": "jira.test.reach", "protocol": "tcp", "port": 80})),
    )
    .await
}

#[tokio::test]
async fn silent_and_half_handshaken_connections_do_not_lock_out_an_access_request() {
    let ca = Ca::start(&config(
        "max_connections = 16\nhttp_max_connections_per_source = 8",
    ))
    .await;
    // More silent connections than the CA serves at once, plus a few that
    // send a ClientHello prefix and stall, all from one hostile address.
    let mut held = Vec::new();
    for _ in 0..24 {
        if let Ok(s) = connect_from(HOSTILE, ca.http).await {
            held.push(s);
        }
    }
    for _ in 0..4 {
        if let Ok(mut s) = connect_from(HOSTILE, ca.http).await {
            let _ = s.write_all(CLIENT_HELLO_PREFIX).await;
            held.push(s);
        }
    }
    // A fresh access request from another address is answered, well
    // before any of the held connections times out (10 s by default).
    assert_answered(&ca, "silent connections are held").await;
    drop(held);
    ca.stop().await;
}

#[tokio::test]
async fn silent_connections_from_many_addresses_give_way_to_a_new_client() {
    // Every per-source cap respected, yet more than the CA serves at once:
    // the connections idle longest give way to new ones.
    let ca = Ca::start(&config("max_connections = 16")).await;
    let held = silent_from_many(&ca, 10, 24).await;
    assert_answered(&ca, "silent connections are held").await;
    drop(held);
    ca.stop().await;
}

#[tokio::test]
async fn a_connection_silent_after_the_handshake_is_closed_after_the_first_byte_timeout() {
    let ca = Ca::start(&config("first_byte_timeout_ms = 300")).await;
    // The TLS handshake completes, then nothing: today hyper's protocol
    // sniffing waits for the first byte forever.
    let tcp = TcpStream::connect(ca.http).await.expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client_tls(&ca.root())));
    let name = rustls::pki_types::ServerName::IpAddress(ca.http.ip().into());
    let mut tls = tls.connect(name, tcp).await.expect("TLS handshake");
    let mut buf = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf)).await;
    assert!(
        matches!(r, Ok(Ok(0)) | Ok(Err(_))),
        "a silent HTTPS connection stayed open: {r:?}"
    );
    // A bare silent TCP connection too (the TLS handshake timeout is longer).
    let mut s = TcpStream::connect(ca.http).await.expect("connect");
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    assert_eq!(ca.web().send("GET", "/healthz", None, None).await.0, 200);
    ca.stop().await;
}

#[tokio::test]
async fn a_silent_crowd_over_the_limit_makes_no_connection_give_way() {
    // Connections over the limit wait for their first byte without a
    // slot: silent ones never evict, so a crowd that reopens what it loses
    // cannot churn the listener; one that speaks still gets in.
    let ca = Ca::start(&config("max_connections = 4")).await;
    let mut seated = silent_from_many(&ca, 10, 4).await;
    let over = silent_from_many(&ca, 20, 8).await;
    for (i, s) in seated.iter_mut().enumerate() {
        let end = ended_by_reset(s, Duration::from_millis(300)).await;
        assert_eq!(end, None, "connection {i} gave way to silent ones");
    }
    assert_answered(&ca, "silent connections are held").await;
    drop(over);
    ca.stop().await;
}

#[tokio::test]
async fn connections_given_up_for_silence_are_reset_not_closed() {
    // Given way to a new client: reset, so a crowd that reopens what it
    // loses leaves no TIME_WAIT on the CA and no long conntrack entries.
    let ca = Ca::start(&config("max_connections = 4")).await;
    let mut held = silent_from_many(&ca, 10, 4).await;
    assert_answered(&ca, "silent connections are held").await;
    let mut ends = Vec::new();
    for s in &mut held {
        ends.push(ended_by_reset(s, Duration::from_millis(500)).await);
    }
    assert!(
        ends.contains(&Some(true)),
        "none given way by a reset: {ends:?}"
    );
    assert!(
        !ends.contains(&Some(false)),
        "one given way by a FIN: {ends:?}"
    );
    ca.stop().await;

    // Past the first-byte deadline: bare TCP, and after the TLS handshake.
    let ca = Ca::start(&config("first_byte_timeout_ms = 300")).await;
    let mut s = TcpStream::connect(ca.http).await.expect("connect");
    assert_eq!(
        ended_by_reset(&mut s, Duration::from_secs(5)).await,
        Some(true)
    );
    let tcp = TcpStream::connect(ca.http).await.expect("connect");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client_tls(&ca.root())));
    let name = rustls::pki_types::ServerName::IpAddress(ca.http.ip().into());
    let mut tls = tls.connect(name, tcp).await.expect("TLS handshake");
    let mut buf = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf)).await;
    assert!(
        matches!(&r, Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "a silent HTTPS connection was not reset: {r:?}"
    );
    ca.stop().await;
}

#[tokio::test]
async fn one_source_gets_at_most_its_connection_cap_on_both_listeners() {
    let ca = Ca::start(&config(
        "http_max_connections_per_source = 4\ngrpc_max_connections_per_source = 4",
    ))
    .await;
    for (listener, addr) in [("HTTPS", ca.http), ("gRPC", ca.grpc)] {
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(connect_from(HOSTILE, addr).await.expect("connect"));
        }
        let mut fifth = connect_from(HOSTILE, addr).await.expect("connect");
        assert!(
            closed_within(&mut fifth, Duration::from_secs(10)).await,
            "{listener}: the fifth connection from one source was kept"
        );
        // One accept loop takes the kernel's queue in order: the fifth
        // closed means the held four were accepted before it.
        for s in &mut held {
            assert!(
                !closed_within(s, Duration::from_millis(50)).await,
                "{listener}: a connection within the cap was closed"
            );
        }
        // Another source still gets in.
        match listener {
            "HTTPS" => assert_eq!(
                request_from(FRIENDLY, &ca, "GET", "/healthz", None, None).await,
                Some(200)
            ),
            _ => {
                let mut client = v1::health_query_client::HealthQueryClient::new(
                    channel_from(FRIENDLY, &ca).await,
                );
                let mut request = tonic::Request::new(v1::ListApplicationsRequest::default());
                request.metadata_mut().insert(
                    "authorization",
                    format!("Bearer {READ_TOKEN}").parse().expect("metadata"),
                );
                client.list_applications(request).await.expect("list");
            }
        }
        drop(held);
    }
    ca.stop().await;
}

fn throttled(ca: &Ca, what: &str, scope: &str) -> u64 {
    let m = ca.authority.metrics().render();
    let prefix = format!("reach_ca_throttled_total{{what=\"{what}\",scope=\"{scope}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_flood_of_bad_tokens_from_one_address_does_not_stop_a_good_token_from_another() {
    let ca = Ca::start(&default_config()).await;
    let mut statuses = Vec::new();
    for i in 0..40 {
        let guess = format!("guess-{i:04}-0123456789");
        statuses.push(
            request_from(HOSTILE, &ca, "GET", "/api/v1/health", Some(&guess), None)
                .await
                .unwrap_or(0),
        );
    }
    assert!(
        statuses.contains(&429),
        "the guessing address was never throttled: {statuses:?}"
    );
    // The good token from another address is answered as ever.
    assert_eq!(
        request_from(
            FRIENDLY,
            &ca,
            "GET",
            "/api/v1/health",
            Some(READ_TOKEN),
            None
        )
        .await,
        Some(200)
    );
    assert_eq!(
        access_from(FRIENDLY, &ca).await.map(|s| s != 429),
        Some(true)
    );
    // And the throttled address with the good token is let in: the token
    // is compared first, only failures are throttled.
    assert_eq!(
        request_from(
            HOSTILE,
            &ca,
            "GET",
            "/api/v1/health",
            Some(READ_TOKEN),
            None
        )
        .await,
        Some(200)
    );
    assert_eq!(
        access_from(HOSTILE, &ca).await.map(|s| s != 429),
        Some(true)
    );
    // Without any token it is told to authenticate: no token guesses
    // nothing, so there is nothing to throttle.
    assert_eq!(
        request_from(HOSTILE, &ca, "GET", "/api/v1/health", None, None).await,
        Some(401)
    );
    assert!(throttled(&ca, "token", "source") > 0);
    assert_eq!(throttled(&ca, "token", "global"), 0);

    // The same over gRPC.
    let mut client =
        v1::health_query_client::HealthQueryClient::new(channel_from(HOSTILE, &ca).await);
    let mut codes = Vec::new();
    for i in 0..5 {
        let mut request = tonic::Request::new(v1::ListApplicationsRequest::default());
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer grpc-guess-{i}-0123456789")
                .parse()
                .expect("metadata"),
        );
        codes.push(client.list_applications(request).await.map_err(|s| {
            let retry_after = s
                .metadata()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            (s.code(), retry_after.is_some_and(|r| r >= 1))
        }));
    }
    assert!(
        codes
            .iter()
            .all(|c| matches!(c, Err((tonic::Code::ResourceExhausted, true)))),
        "throttled, with metadata retry-after: {codes:?}"
    );
    // A valid token from the throttled address is let in over gRPC too.
    let mut request = tonic::Request::new(v1::ListApplicationsRequest::default());
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {READ_TOKEN}").parse().expect("metadata"),
    );
    client
        .list_applications(request)
        .await
        .expect("the good token from the throttled address");
    let mut client =
        v1::health_query_client::HealthQueryClient::new(channel_from(FRIENDLY, &ca).await);
    let mut request = tonic::Request::new(v1::ListApplicationsRequest::default());
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {READ_TOKEN}").parse().expect("metadata"),
    );
    client
        .list_applications(request)
        .await
        .expect("the good token from another address");
    ca.stop().await;
}

#[tokio::test]
async fn a_flood_of_bad_enrollments_from_one_address_does_not_stop_another() {
    let ca = Ca::start(&default_config()).await;
    let mut client = v1::enrollment_client::EnrollmentClient::new(channel_from(HOSTILE, &ca).await);
    let (_, csr) = key_and_csr("guesser");
    let mut codes = Vec::new();
    // More than the CA's whole-CA burst (50) of attempts.
    for i in 0..80 {
        let r = client
            .enroll(v1::EnrollRequest {
                name: "guesser".into(),
                group: "dc-east".into(),
                provisioning_key: format!("guess-{i:04}-0123456789"),
                csr_pem: csr.clone(),
            })
            .await;
        codes.push(r.map(|_| ()).map_err(|s| s.code()));
    }
    assert!(
        codes.contains(&Err(tonic::Code::ResourceExhausted)),
        "{codes:?}"
    );
    // The guessing address with the right key enrolls: the key is
    // compared first, only failures are throttled.
    let (_, csr) = key_and_csr("west-guess");
    client
        .enroll(v1::EnrollRequest {
            name: "west-guess".into(),
            group: "dc-east".into(),
            provisioning_key: KEY_EAST.into(),
            csr_pem: csr,
        })
        .await
        .expect("a valid key from the throttled address");
    // A legitimate enrollment from another address goes through.
    let mut friendly =
        v1::enrollment_client::EnrollmentClient::new(channel_from(FRIENDLY, &ca).await);
    let (_, csr) = key_and_csr("east-1");
    friendly
        .enroll(v1::EnrollRequest {
            name: "east-1".into(),
            group: "dc-east".into(),
            provisioning_key: KEY_EAST.into(),
            csr_pem: csr,
        })
        .await
        .expect("enrollment from another address");
    assert!(throttled(&ca, "enrollment", "source") > 0);
    assert_eq!(throttled(&ca, "enrollment", "global"), 0);
    ca.stop().await;
}

/// One keep-alive HTTPS connection from one source address.
struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: String,
}

impl Conn {
    async fn open(from: IpAddr, ca: &Ca) -> Option<Conn> {
        let tcp = connect_from(from, ca.http).await.ok()?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(client_tls(&ca.root())));
        let name = rustls::pki_types::ServerName::IpAddress(ca.http.ip().into());
        let tls = tls.connect(name, tcp).await.ok()?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .ok()?;
        tokio::spawn(conn);
        Some(Conn {
            sender,
            host: ca.http.to_string(),
        })
    }

    /// `GET /api/v1/health` with `token`: the status and `Retry-After`.
    async fn get(&mut self, token: &str) -> Option<(u16, Option<u64>)> {
        self.sender.ready().await.ok()?;
        let request = hyper::Request::get("/api/v1/health")
            .header("host", &self.host)
            .header("authorization", format!("Bearer {token}"))
            .body(Full::new(Bytes::new()))
            .ok()?;
        let response = self.sender.send_request(request).await.ok()?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let _ = response.into_body().collect().await;
        Some((status, retry_after))
    }
}

/// Source addresses spraying bad tokens: 127.0.1.0 – 127.0.2.43.
const SPRAYERS: u16 = 300;

fn sprayer(i: u16) -> IpAddr {
    let [hi, lo] = (256 + i).to_be_bytes();
    IpAddr::V4(Ipv4Addr::new(127, 0, hi, lo))
}

/// Bad tokens from `SPRAYERS` addresses, each past its own allowance and
/// all together past the whole CA's, while a clean address and a sprayed
/// one send valid requests over HTTP and gRPC: not one valid request is
/// refused, and the spray is answered 429 with `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spray_of_bad_tokens_from_many_addresses_never_refuses_a_valid_token() {
    let ca = Arc::new(Ca::start(&default_config()).await);
    // A watch, not a `Notify`: `notify_waiters` wakes only the sprayers
    // waiting at that moment, and one then in the middle of a request
    // would spray on forever, and the test with it.
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let primed = Arc::new(tokio::sync::Semaphore::new(0));
    let mut sprayers = Vec::new();
    for i in 0..SPRAYERS {
        if i == 1 {
            // The sprayed address that sends valid requests below is past
            // its own allowance before the crowd starts.
            if let Ok(Ok(permit)) =
                tokio::time::timeout(Duration::from_secs(30), primed.acquire()).await
            {
                permit.forget();
            }
        }
        let (ca, mut stop, primed) = (ca.clone(), stop.clone(), primed.clone());
        sprayers.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            let Some(mut conn) = Conn::open(sprayer(i), &ca).await else {
                primed.add_permits(1);
                return answers;
            };
            // Past the source's allowance (10) at once…
            for n in 0..12 {
                answers.extend(conn.get(&format!("spray-{i}-{n}-0123456789")).await);
            }
            primed.add_permits(1);
            // …then one a second until the valid requests are done.
            for n in 12.. {
                tokio::select! {
                    _ = stop.wait_for(|stopped| *stopped) => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                let answer = conn.get(&format!("spray-{i}-{n}-0123456789")).await;
                if answer.is_none() {
                    // The CA closed the connection: spray on a new one.
                    match Conn::open(sprayer(i), &ca).await {
                        Some(fresh) => conn = fresh,
                        None => continue,
                    }
                }
                answers.extend(answer);
            }
            answers
        }));
    }
    let all = u32::from(SPRAYERS) - 1;
    let _ = tokio::time::timeout(Duration::from_secs(120), primed.acquire_many(all)).await;
    let sprayed = sprayer(0);
    let mut refused = Vec::new();
    for round in 0..15 {
        for from in [FRIENDLY, sprayed] {
            // Any answer of the access API itself (503 while no connector
            // has reported) means the token was accepted.
            match access_from(from, &ca).await {
                Some(s) if !matches!(s, 401 | 403 | 429) => {}
                other => refused.push((round, from, "access", other)),
            }
            match request_from(from, &ca, "GET", "/api/v1/health", Some(READ_TOKEN), None).await {
                Some(200) => {}
                other => refused.push((round, from, "read", other)),
            }
        }
    }
    for from in [FRIENDLY, sprayed] {
        let mut client =
            v1::health_query_client::HealthQueryClient::new(channel_from(from, &ca).await);
        for round in 0..5 {
            let mut request = tonic::Request::new(v1::ListApplicationsRequest::default());
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {READ_TOKEN}").parse().expect("metadata"),
            );
            if let Err(s) = client.list_applications(request).await {
                refused.push((round, from, "grpc", Some(s.code() as u16)));
            }
        }
    }
    stop_tx.send_replace(true);
    let mut answers = Vec::new();
    for s in sprayers {
        answers.extend(s.await.expect("sprayer"));
    }
    assert_eq!(refused, vec![], "valid requests refused under the spray");
    let too_many: Vec<_> = answers.iter().filter(|(s, _)| *s == 429).collect();
    assert!(
        too_many.len() > usize::from(SPRAYERS),
        "the spray was not throttled: {} of {} answers were 429",
        too_many.len(),
        answers.len()
    );
    assert!(
        too_many.iter().all(|(_, r)| r.is_some_and(|r| r >= 1)),
        "a 429 without Retry-After"
    );
    assert!(
        answers.iter().all(|(s, _)| matches!(s, 401 | 429)),
        "a bad token let in?"
    );
    assert!(throttled(&ca, "token", "source") > 0);
    Arc::try_unwrap(ca).ok().expect("sole owner").stop().await;
}

/// The HTTP API has a runtime of its own: with the runtime that carries
/// the connector sessions running nothing at all (its only thread outside
/// `block_on`, as a reconnect storm's tasks leave a decision no turn), an
/// access decision is still answered, from the health table the sessions
/// filled before.
#[test]
fn an_access_decision_is_answered_while_the_session_runtime_runs_nothing() {
    let sessions = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (ca, conn) = sessions.block_on(async {
        let ca = Ca::start(&default_config()).await;
        let (c, _) = connect(&ca, "east-1", "dc-east").await;
        c.report(
            vec![app("jira", "jira.test.reach", 80, &["127.0.0.21"], &[])],
            true,
        )
        .await;
        let http = ca.web();
        eventually("jira up", || async {
            http.access("jira.test.reach", "tcp", 80).await.0 == 200
        })
        .await;
        (ca, c)
    });
    // The sessions' runtime is parked from here: its tasks (the gRPC
    // listener and every session) do not run until the next `block_on`.
    let (addr, root) = (ca.http, ca.root());
    let asked = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let http = Http::new(addr, &root);
            // Only a failure detector: with the API on the parked runtime
            // the answer never comes.
            tokio::time::timeout(
                Duration::from_secs(10),
                http.access("jira.test.reach", "tcp", 80),
            )
            .await
            .ok()
        })
    })
    .join()
    .expect("the asking thread");
    let (status, body) =
        asked.expect("an access decision answered while the sessions' runtime ran nothing");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["connector"], "east-1", "{body}");
    sessions.block_on(async {
        drop(conn);
        ca.stop().await;
    });
}
