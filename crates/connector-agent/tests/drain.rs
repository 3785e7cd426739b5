//! The `connector-agent` binary's graceful stop, in its own process against
//! a test CA on loopback: on SIGTERM it tells the CA it drains (`Drain`),
//! keeps its session, checks and reports for `--drain-seconds`, then
//! closes the session and exits; a second signal stops it at once; with
//! `--drain-seconds 0` it stops at once without a `Drain`.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Assignment, Authority, Seen};
use protocol::v1;
use protocol::v1::connector_message::Kind as ToCa;
use test_support::{Segment, listeners};

const BIN: &str = env!("CARGO_BIN_EXE_connector-agent");

/// Generous bounds on waits whose timing the test does not control (this
/// is not a measurement).
const WAIT: Duration = Duration::from_secs(20);

/// Kills the child if the test fails before it exits.
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Agent {
    /// Sends the process `signal` (`TERM`, `INT`).
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.0.id().to_string())
            .status()
            .expect("kill(1) runs");
        assert!(status.success(), "kill -{signal}");
    }

    /// Waits for the process to exit (at most `within`); its exit status.
    fn exited(&mut self, within: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.0.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "still running after {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A test CA assigning a continuous segment of one listening application,
/// reported every 300 ms, with heartbeats every 200 ms.
async fn ca_with_one_application() -> Authority {
    let (port, _) = listeners(&["127.0.0.1".to_owned()]).await;
    Authority::start(Assignment {
        segments: vec![
            Segment::new("app")
                .apps(["127.0.0.1"])
                .tcp([port])
                .interval_ms(300)
                .groups(["dc-east"])
                .proto(),
        ],
        settings: v1::ConnectorSettings {
            heartbeat_interval_ms: 200,
            ..Default::default()
        },
    })
    .await
}

/// The real binary against `ca` with `--drain-seconds drain_s`.
fn spawn_agent(ca: &Authority, drain_s: u32) -> Agent {
    let dir = std::env::temp_dir().join(format!(
        "reach-drain-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).expect("state dir");
    let child = Command::new(BIN)
        .args(["--ca", &ca.url(), "--name", "c1", "--group", "dc-east"])
        .arg("--state-dir")
        .arg(&dir)
        .args(["--drain-seconds", &drain_s.to_string()])
        .env("REACH_PROVISIONING_KEY", "secret")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("connector-agent starts");
    Agent(child)
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}

/// What the test CA saw, until `stop` accepts a thing seen (which is
/// included) or `within` passes.
async fn seen_until(
    ca: &mut Authority,
    within: Duration,
    mut stop: impl FnMut(&Seen) -> bool,
) -> Vec<(Instant, Seen)> {
    let deadline = tokio::time::Instant::now() + within;
    let mut out = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "not seen within {within:?}: {out:?}");
        let seen = ca.next(left).await;
        let done = stop(&seen);
        out.push((Instant::now(), seen));
        if done {
            return out;
        }
    }
}

fn is_drain(s: &Seen) -> bool {
    matches!(s, Seen::Message(ToCa::Drain(_)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sigterm_it_drains_for_its_drain_time_keeping_its_session_then_exits() {
    let mut ca = ca_with_one_application().await;
    let mut agent = spawn_agent(&ca, 3);
    ca.next_report(WAIT).await;
    let signalled = Instant::now();
    agent.signal("TERM");
    let before = seen_until(&mut ca, WAIT, is_drain).await;
    assert!(
        !before.iter().any(|(_, s)| matches!(s, Seen::Ended)),
        "the session ended before the drain: {before:?}"
    );
    let Some((_, Seen::Message(ToCa::Drain(drain)))) = before.last() else {
        unreachable!("seen_until stops at the Drain");
    };
    assert!(
        drain.drain_ms > 0 && drain.drain_ms <= 3_000,
        "the drain time left: {drain:?}"
    );
    // The session goes on: heartbeats and reports, then it ends.
    let after = seen_until(&mut ca, WAIT, |s| matches!(s, Seen::Ended)).await;
    let heartbeats = after
        .iter()
        .filter(|(_, s)| matches!(s, Seen::Message(ToCa::Heartbeat(_))))
        .count();
    let reports = after
        .iter()
        .filter(|(_, s)| matches!(s, Seen::Message(ToCa::Report(_))))
        .count();
    assert!(
        heartbeats >= 2 && reports >= 2,
        "{heartbeats} heartbeats and {reports} reports while draining"
    );
    let ended = after.last().map(|(at, _)| *at).expect("ended");
    assert!(
        ended.duration_since(signalled) >= Duration::from_secs(3),
        "the session ended {:?} after SIGTERM, before the drain time",
        ended.duration_since(signalled)
    );
    let status = agent.exited(WAIT);
    assert!(status.success(), "{status:?}");
    ca.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_stops_a_draining_connector_at_once() {
    let mut ca = ca_with_one_application().await;
    let mut agent = spawn_agent(&ca, 600);
    ca.next_report(WAIT).await;
    agent.signal("TERM");
    seen_until(&mut ca, WAIT, is_drain).await;
    agent.signal("INT");
    // Far sooner than the ten minutes it would drain.
    let status = agent.exited(WAIT);
    assert!(status.success(), "{status:?}");
    seen_until(&mut ca, WAIT, |s| matches!(s, Seen::Ended)).await;
    ca.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_drain_seconds_0_it_stops_at_once_without_draining() {
    let mut ca = ca_with_one_application().await;
    let mut agent = spawn_agent(&ca, 0);
    ca.next_report(WAIT).await;
    agent.signal("TERM");
    let seen = seen_until(&mut ca, WAIT, |s| matches!(s, Seen::Ended)).await;
    assert!(!seen.iter().any(|(_, s)| is_drain(s)), "{seen:?}");
    let status = agent.exited(WAIT);
    assert!(status.success(), "{status:?}");
    ca.stop().await;
}
