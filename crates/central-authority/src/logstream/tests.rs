//! The log stream against real receivers on loopback: a TCP receiver that
//! closes mid-stream and comes back, a TLS receiver, a rotated file, a
//! restart that resumes from the spool.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::TcpListener;

use super::*;

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "reach-logstream-{name}-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn spec(name: &str, url: &str, destination: Destination, format: Format) -> ReceiverSpec {
    ReceiverSpec {
        name: name.to_owned(),
        url: url.to_owned(),
        destination,
        format,
        types: Kind::ALL.to_vec(),
        filter: Filter::default(),
        spool_bytes: 1 << 20,
        file_max_bytes: 100 << 20,
        file_keep: 5,
    }
}

fn audit(n: u64) -> Record {
    Record::new(Kind::Audit, 1_796_641_933_456 + n)
        .text(Field::Actor, "token ops")
        .text(Field::Action, "connector.drain")
        .text(Field::Target, format!("c{n}"))
        .text(Field::Outcome, "ok")
        .text(Field::Detail, format!("{n}"))
}

fn seq_of(line: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["seq"].as_u64().unwrap()
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    test_support::poll::eventually(what, || std::future::ready(f())).await;
}

/// A JSON receiver that takes 200 records and closes with the rest unread
/// (in its socket buffer, taken by TCP), then comes back: every record
/// arrives at least once, and each connection carries them in order.
#[tokio::test]
async fn a_tcp_receiver_that_closes_mid_stream_gets_every_record_in_order() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = temp("tcp");
    let stream = LogStream::new(&dir);
    let url = format!("tcp://127.0.0.1:{port}");
    let destination = Destination::Tcp {
        host: "127.0.0.1".into(),
        port,
    };
    stream.start(
        "r1".into(),
        &[spec("siem", &url, destination, Format::Json)],
    );
    for n in 0..500 {
        stream.emit(audit(n));
    }
    let (first, _) = listener.accept().await.unwrap();
    let mut lines = BufReader::new(first).lines();
    let mut before = Vec::new();
    while before.len() < 200 {
        before.push(seq_of(&lines.next_line().await.unwrap().unwrap()));
    }
    drop(lines);
    let (second, _) = listener.accept().await.unwrap();
    let mut lines = BufReader::new(second).lines();
    let mut after = Vec::new();
    // Bounded only against a hang: records lost would never come.
    let read = async {
        while after.last() != Some(&499) {
            after.push(seq_of(&lines.next_line().await.unwrap().unwrap()));
        }
    };
    if tokio::time::timeout(std::time::Duration::from_secs(60), read)
        .await
        .is_err()
    {
        panic!("records lost: after the reconnect only {after:?}");
    }
    for got in [&before, &after] {
        assert!(
            got.windows(2).all(|w| w[1] == w[0] + 1),
            "in order: {got:?}"
        );
    }
    let all: BTreeSet<u64> = before.iter().chain(&after).copied().collect();
    assert_eq!(all, (0..500).collect(), "every record at least once");
    assert!(
        after[0] < 200,
        "the records read before the close were in the resend window"
    );
    let state = &stream.states()[0];
    assert_eq!(state.dropped_queue + state.dropped_spool, 0);
    assert!(state.last_error.is_some(), "the broken connection is shown");
    stream.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A receiver's TLS side on loopback: a root in `dir/root.pem`, a
/// certificate for `siem.test` it issued, and, with `client_auth`, the
/// demand for a client certificate from that root.
struct TlsReceiver {
    root_file: PathBuf,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    acceptor: tokio_rustls::TlsAcceptor,
    listener: TcpListener,
    port: u16,
}

async fn tls_receiver(dir: &Path, client_auth: bool) -> TlsReceiver {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let root_key = KeyPair::generate().unwrap();
    let mut root = CertificateParams::new(Vec::<String>::new()).unwrap();
    root.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let root_cert = root.clone().self_signed(&root_key).unwrap();
    let issuer = Issuer::new(root, root_key);
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["siem.test".to_owned()])
        .unwrap()
        .signed_by(&server_key, &issuer)
        .unwrap();
    let root_file = dir.join("root.pem");
    std::fs::write(&root_file, root_cert.pem()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if client_auth {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(root_cert.der().clone()).unwrap();
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder
        .with_single_cert(
            vec![server.der().clone()],
            rustls::pki_types::PrivateKeyDer::try_from(server_key.serialize_der()).unwrap(),
        )
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    TlsReceiver {
        root_file,
        issuer,
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        listener,
        port,
    }
}

/// A TLS receiver verified against its root, in RFC 5424 with octet
/// counting; a second receiver filtered to refusals gets none of these.
#[tokio::test]
async fn a_tls_receiver_gets_octet_counted_syslog() {
    let dir = temp("tls");
    let TlsReceiver {
        root_file,
        acceptor,
        listener,
        port,
        ..
    } = tls_receiver(&dir, false).await;
    let url = format!("tls://127.0.0.1:{port}");
    let tls = Destination::Tls {
        host: "127.0.0.1".into(),
        port,
        root_file: root_file.clone(),
        server_name: "siem.test".into(),
        client: None,
    };
    // The filtered receiver dials a listener of its own: on the same port
    // its connection could be the one accepted below, which never carries
    // a record.
    let apart = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let apart_port = apart.local_addr().unwrap().port();
    let apart_url = format!("tls://127.0.0.1:{apart_port}");
    let apart_tls = Destination::Tls {
        host: "127.0.0.1".into(),
        port: apart_port,
        root_file: root_file.clone(),
        server_name: "siem.test".into(),
        client: None,
    };
    let mut refusals = spec("refusals", &apart_url, apart_tls, Format::Syslog);
    refusals.filter.statuses = vec!["refused".into()];
    let stream = LogStream::new(&dir);
    stream.start(
        "r1".into(),
        &[spec("siem", &url, tls, Format::Syslog), refusals],
    );
    for n in 0..50 {
        stream.emit(audit(n));
    }
    let (tcp, _) = listener.accept().await.unwrap();
    let mut tls = acceptor.accept(tcp).await.unwrap();
    let mut messages = Vec::new();
    let mut buf = Vec::new();
    while messages.len() < 50 {
        let mut chunk = [0u8; 4096];
        let n = tls.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed early");
        buf.extend_from_slice(&chunk[..n]);
        while let Some(space) = buf.iter().position(|b| *b == b' ') {
            let len: usize = std::str::from_utf8(&buf[..space]).unwrap().parse().unwrap();
            if buf.len() < space + 1 + len {
                break;
            }
            let message = String::from_utf8(buf[space + 1..space + 1 + len].to_vec()).unwrap();
            buf.drain(..space + 1 + len);
            messages.push(message);
        }
    }
    for (n, m) in messages.iter().enumerate() {
        assert!(
            m.starts_with("<110>1 2026-12-07T11:12:13.")
                && m.contains(" r1 central-authority - audit [reach@32473 replica=\"r1\" "),
            "{m}"
        );
        assert!(m.contains(&format!(" seq=\"{n}\" ")), "{m}");
        assert!(m.contains(&format!(" detail=\"{n}\"]")), "{m}");
    }
    let states = stream.states();
    assert!(states[0].connected);
    assert_eq!(states[0].sent_total, 50);
    assert_eq!(states[1].sent_total, 0, "filtered out");
    stream.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TLS receiver that asks for a client certificate: the receiver given
/// its client pair is verified against the receiver's root and streams; the
/// one without is refused by the receiver and shows the error, with its
/// records kept in the spool.
#[tokio::test]
async fn a_tls_receiver_that_asks_for_a_client_certificate_gets_the_configured_one() {
    let dir = temp("mtls");
    let TlsReceiver {
        root_file,
        issuer,
        acceptor,
        listener,
        port,
    } = tls_receiver(&dir, true).await;
    let client_key = rcgen::KeyPair::generate().unwrap();
    let client = rcgen::CertificateParams::new(vec!["ca-replica.test".to_owned()])
        .unwrap()
        .signed_by(&client_key, &issuer)
        .unwrap();
    let (cert_file, key_file) = (dir.join("client.pem"), dir.join("client.key"));
    std::fs::write(&cert_file, client.pem()).unwrap();
    std::fs::write(&key_file, client_key.serialize_pem()).unwrap();
    let url = format!("tls://127.0.0.1:{port}");
    let tls = |client| Destination::Tls {
        host: "127.0.0.1".into(),
        port,
        root_file: root_file.clone(),
        server_name: "siem.test".into(),
        client,
    };
    let stream = LogStream::new(&dir);
    stream.start(
        "r1".into(),
        &[
            spec(
                "paired",
                &url,
                tls(Some((cert_file, key_file))),
                Format::Json,
            ),
            spec("bare", &url, tls(None), Format::Json),
        ],
    );
    for n in 0..20 {
        stream.emit(audit(n));
    }
    let mut verified = None;
    let mut refused = 0;
    while verified.is_none() || refused == 0 {
        let (tcp, _) = listener.accept().await.unwrap();
        let Ok(mut tls) = acceptor.accept(tcp).await else {
            refused += 1;
            continue;
        };
        let presented = tls.get_ref().1.peer_certificates().map(<[_]>::to_vec);
        let mut lines = BufReader::new(&mut tls).lines();
        let mut got = 0;
        while got < 20 {
            let line = lines.next_line().await.unwrap().unwrap();
            assert!(line.contains("\"type\":\"audit\""), "{line}");
            got += 1;
        }
        verified = presented;
    }
    let verified = verified.unwrap();
    assert_eq!(
        verified[0].as_ref(),
        client.der().as_ref(),
        "the configured client certificate"
    );
    // Bounded only against a hang: the sender reads the refusal's alert.
    let mut states = stream.states();
    for _ in 0..500 {
        if states[0].sent_total == 20 && states[1].last_error.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        states = stream.states();
    }
    assert_eq!(states[0].sent_total, 20);
    assert!(!states[1].connected);
    assert_eq!(states[1].sent_total, 0);
    assert_eq!(states[1].spool_records, 20, "kept for when it is let in");
    let error = states[1]
        .last_error
        .clone()
        .map(|(e, _)| e)
        .unwrap_or_default();
    assert!(
        error.contains("refused the connection"),
        "the refusal is shown: {error:?}"
    );
    stream.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The nice value of this process's threads whose name starts with
/// `prefix` (`/proc/self/task/*/stat`, field 19).
fn nice_of_threads(prefix: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // The fields after the parenthesised name, which may hold spaces.
        let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
        if let Some(nice) = after.split_whitespace().nth(16) {
            out.push(nice.parse().unwrap());
        }
    }
    out
}

/// A receiver's spooler runs below the decisions' priority: its work waits
/// in the queue, a decision does not.
#[tokio::test]
async fn the_spooler_thread_yields_to_decisions() {
    let dir = temp("nice");
    let stream = LogStream::new(&dir);
    let url = "tcp://127.0.0.1:9".to_owned();
    let tcp = Destination::Tcp {
        host: "127.0.0.1".into(),
        port: 9,
    };
    stream.start("r1".into(), &[spec("nicely", &url, tcp, Format::Json)]);
    let mut nice = Vec::new();
    // Bounded only against a hang: the spooler starts after the spool opens.
    for _ in 0..500 {
        nice = nice_of_threads("log-spool-nice");
        if !nice.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(nice, vec![i64::from(SPOOLER_NICE)]);
    assert!(
        nice_of_threads("tokio-runtime").iter().all(|n| *n == 0),
        "only the spooler"
    );
    stream.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

fn rows(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A csv file receiver rotates at its size, keeps `file_keep` files, and
/// starts each with the header.
#[tokio::test]
async fn a_file_receiver_rotates_and_keeps_its_files() {
    let dir = temp("file");
    let path = dir.join("reach.csv");
    let mut s = spec(
        "file",
        "file:///reach.csv",
        Destination::File { path: path.clone() },
        Format::Csv,
    );
    s.file_max_bytes = 4096;
    s.file_keep = 3;
    let stream = LogStream::new(&dir);
    stream.start("r1".into(), &[s]);
    for n in 0..300 {
        stream.emit(audit(n));
    }
    eventually("300 records written", || {
        stream.states()[0].sent_total == 300
    })
    .await;
    let header = String::from_utf8(format::header(Format::Csv).unwrap()).unwrap();
    let named = |n: u32| PathBuf::from(format!("{}.{n}", path.display()));
    let mut seqs = Vec::new();
    for file in [named(3), named(2), named(1), path.clone()] {
        let len = std::fs::metadata(&file).unwrap().len();
        assert!(len <= 4096, "{} is {len} bytes", file.display());
        let rows = rows(&file);
        assert_eq!(format!("{}\n", rows[0]), header, "{}", file.display());
        seqs.extend(
            rows[1..]
                .iter()
                .map(|r| r.split(',').nth(3).unwrap().parse::<u64>().unwrap()),
        );
    }
    assert!(!named(4).exists(), "only 3 rotated files are kept");
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert_eq!(seqs.last(), Some(&299));
    stream.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Records spooled while the receiver is away survive a restart of the
/// CA (a new `LogStream` on the same directory) and arrive after it,
/// numbered on.
#[tokio::test]
async fn a_restart_sends_what_the_spool_held() {
    let dir = temp("restart");
    // A port nobody listens on yet.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("tcp://127.0.0.1:{port}");
    let destination = Destination::Tcp {
        host: "127.0.0.1".into(),
        port,
    };
    let s = spec("siem", &url, destination, Format::Json);
    let before = LogStream::new(&dir);
    before.start("r1".into(), std::slice::from_ref(&s));
    for n in 0..20 {
        before.emit(audit(n));
    }
    eventually("20 records spooled", || {
        before.states()[0].spool_records == 20
    })
    .await;
    before.stop();
    drop(before);
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let after = LogStream::new(&dir);
    after.start("r1".into(), &[s]);
    after.emit(audit(20));
    let (conn, _) = listener.accept().await.unwrap();
    let mut lines = BufReader::new(conn).lines();
    let mut got = Vec::new();
    while got.len() < 21 {
        let line = lines.next_line().await.unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        got.push((
            v["seq"].as_u64().unwrap(),
            v["detail"].as_str().unwrap().to_owned(),
        ));
    }
    let expected: Vec<(u64, String)> = (0..21).map(|n| (n, n.to_string())).collect();
    assert_eq!(got, expected);
    after.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A receiver left unchanged by a reconfigure keeps its connection; a
/// receiver added starts.
#[tokio::test]
async fn reconfigure_keeps_an_unchanged_receiver_and_adds_a_new_one() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = temp("reconfigure");
    let url = format!("tcp://127.0.0.1:{port}");
    let destination = Destination::Tcp {
        host: "127.0.0.1".into(),
        port,
    };
    let a = spec("a", &url, destination.clone(), Format::Json);
    let stream = LogStream::new(&dir);
    stream.start("r1".into(), std::slice::from_ref(&a));
    stream.emit(audit(0));
    let (conn, _) = listener.accept().await.unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let lines = lines.clone();
        tokio::spawn(async move {
            let mut l = BufReader::new(conn).lines();
            while let Ok(Some(line)) = l.next_line().await {
                lines.lock().unwrap().push(line);
            }
        })
    };
    eventually("the first record", || lines.lock().unwrap().len() == 1).await;
    let mut b = spec("b", &url, destination, Format::Json);
    b.types = vec![Kind::Health];
    stream.reconfigure(&[a, b]);
    assert!(stream.wants(Kind::Health));
    let (_second, _) = listener.accept().await.unwrap();
    stream.emit(audit(1));
    eventually("the second record on the first connection", || {
        lines.lock().unwrap().len() == 2
    })
    .await;
    let names: Vec<String> = stream.states().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["a", "b"]);
    stream.stop();
    reader.abort();
    let _ = std::fs::remove_dir_all(&dir);
}
