//! The real `connector-agent` binary when the CA refuses it: a revoked (or
//! deleted) connector says re-enrollment is needed and what to do, and
//! waits minutes between attempts, as does one whose release the CA's
//! compatibility policy refuses (with the CA's reason); a disabled one
//! says how an admin enables it. A wrong `--ca-cert` is named, and so is a
//! name the CA's certificate does not carry, with the fix. Its logs carry no colour codes
//! when they are not a terminal, and `--state-dir` has an absolute default.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use tonic::Status;

const BIN: &str = env!("CARGO_BIN_EXE_connector-agent");

/// Kills the child if the test ends first.
struct Agent {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    /// The agent against the plain-text test CA, stdout and stderr piped.
    fn start(ca: &Authority, tag: &str) -> Agent {
        let state =
            std::env::temp_dir().join(format!("reach-agent-refusal-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&state);
        let mut child = Command::new(BIN)
            .args(["--ca", &ca.url(), "--name", "c1", "--group", "dc-east"])
            .arg("--state-dir")
            .arg(&state)
            .env("REACH_PROVISIONING_KEY", "secret")
            .env("RUST_LOG", "info")
            .env_remove("REACH_STATE_DIR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start connector-agent");
        let (tx, lines) = mpsc::channel();
        for out in [
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Agent { child, lines }
    }

    /// Every line until one contains `needle` (which is the last), within
    /// `within`.
    fn until(&self, needle: &str, within: Duration) -> Vec<String> {
        let deadline = std::time::Instant::now() + within;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = line.contains(needle);
                    seen.push(line);
                    if found {
                        return seen;
                    }
                }
                Err(_) => panic!("no {needle:?} within {within:?} in:\n{}", seen.join("\n")),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_connector_says_reenroll_and_waits_minutes() {
    let ca = Authority::start(Assignment::default()).await;
    ca.refuse(Status::unauthenticated(
        "certificate 1A2B was revoked (revoked by an administrator); enroll again",
    ));
    let agent = Agent::start(&ca, "revoked");
    let mut lines = agent.until("re-enrollment needed", Duration::from_secs(30));
    let refused = lines.last().cloned().unwrap_or_default();
    assert!(
        refused.contains("connector-agent enroll") && refused.contains("allow-reenroll c1"),
        "{refused}"
    );
    lines.extend(agent.until("reconnecting", Duration::from_secs(10)));
    let delay_ms: u64 = lines
        .last()
        .and_then(|l| l.split("delay_ms=").nth(1))
        .and_then(|d| d.split_whitespace().next())
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("no delay_ms in {lines:?}"));
    assert!(
        delay_ms >= 30_000,
        "reconnects after {delay_ms} ms: {lines:?}"
    );
    assert!(
        lines.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in piped logs: {lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_release_is_logged_with_the_cas_reason_and_retried_in_minutes() {
    let ca = Authority::start(Assignment::default()).await;
    // What a CA two minor releases ahead of this connector answers at Hello.
    let ours = protocol::release::Release::current();
    let ahead = protocol::release::Release {
        major: ours.major,
        minor: ours.minor + 2,
    };
    let reason = ahead
        .accepts(protocol::release::RELEASE)
        .expect_err("two minor releases apart");
    ca.refuse(Status::failed_precondition(reason.to_string()));
    let agent = Agent::start(&ca, "release");
    let mut lines = agent.until("refuses this connector's release", Duration::from_secs(30));
    let refused = lines.last().cloned().unwrap_or_default();
    assert!(
        refused.contains(&format!("is too old for this CA (release {ahead})"))
            && refused.contains("compatibility policy")
            && refused.contains(protocol::release::RELEASE),
        "{refused}"
    );
    lines.extend(agent.until("reconnecting", Duration::from_secs(10)));
    let delay_ms: u64 = lines
        .last()
        .and_then(|l| l.split("delay_ms=").nth(1))
        .and_then(|d| d.split_whitespace().next())
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("no delay_ms in {lines:?}"));
    assert!(
        delay_ms >= 30_000,
        "reconnects after {delay_ms} ms: {lines:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disabled_connector_says_how_to_enable_it_and_keeps_trying() {
    let ca = Authority::start(Assignment::default()).await;
    ca.refuse(Status::permission_denied("connector \"c1\" is disabled"));
    let mut agent = Agent::start(&ca, "disabled");
    let lines = agent.until(
        "central-authority api connectors enable c1",
        Duration::from_secs(30),
    );
    assert!(lines.iter().all(|l| !l.contains('\u{1b}')), "{lines:?}");
    // Not the re-enrollment advice, and still running: enabled again, it
    // reconnects on its own.
    assert!(
        lines.iter().all(|l| !l.contains("re-enrollment needed")),
        "{lines:?}"
    );
    assert!(agent.child.try_wait().expect("wait").is_none(), "{lines:?}");
}

#[test]
fn the_state_dir_default_is_absolute() {
    let out = Command::new(BIN)
        .arg("--help")
        .env_remove("REACH_STATE_DIR")
        .output()
        .expect("run --help");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("[default: /var/lib/reach/connector]"),
        "{help}"
    );
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/debian/connector.env"
    ))
    .expect("connector.env");
    assert!(
        unit.contains(&format!(
            "REACH_STATE_DIR={}",
            connector_agent::config::DEFAULT_STATE_DIR
        )),
        "{unit}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_cert_that_does_not_match_the_ca_names_the_file() {
    // A CA whose certificate another root issued than the one the
    // connector is given.
    let served = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("cert");
    let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("cert");
    let identity =
        tonic::transport::Identity::from_pem(served.cert.pem(), served.signing_key.serialize_pem());
    let ca = Authority::start_tls(identity).await;
    let addr = ca.addr;
    let dir = std::env::temp_dir().join(format!("reach-agent-wrong-root-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let wrong = dir.join("not-the-ca.pem");
    std::fs::write(&wrong, other.cert.pem()).expect("write");
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--ca",
        &format!("https://{addr}"),
        "--name",
        "c1",
        "--group",
        "g",
    ])
    .arg("--ca-cert")
    .arg(&wrong)
    .arg("--state-dir")
    .arg(dir.join("state"))
    .env("REACH_PROVISIONING_KEY", "secret-0123456789")
    .arg("enroll");
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("run");
    ca.stop().await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "hint: the CA's certificate does not chain to the root in {}",
            wrong.display()
        )),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_certificate_without_the_name_dialled_names_it_and_server_names() {
    // The right root, but a server certificate for localhost only (as the
    // CA generates one when it listens on loopback), dialled by address.
    let served = rcgen::generate_simple_self_signed(vec!["localhost".into()]).expect("cert");
    let identity =
        tonic::transport::Identity::from_pem(served.cert.pem(), served.signing_key.serialize_pem());
    let ca = Authority::start_tls(identity).await;
    let addr = ca.addr;
    let dir = std::env::temp_dir().join(format!("reach-agent-wrong-name-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let root = dir.join("ca.pem");
    std::fs::write(&root, served.cert.pem()).expect("write");
    let mut cmd = Command::new(BIN);
    cmd.args([
        "--ca",
        &format!("https://{addr}"),
        "--name",
        "c1",
        "--group",
        "g",
    ])
    .arg("--ca-cert")
    .arg(&root)
    .arg("--state-dir")
    .arg(dir.join("state"))
    .env("REACH_PROVISIONING_KEY", "secret-0123456789")
    .arg("enroll");
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("run");
    ca.stop().await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("hint: the CA's server certificate does not name \"127.0.0.1\"")
            && err.contains("add \"127.0.0.1\" to [tls] server_names on the CA"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
