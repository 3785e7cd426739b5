//! The pacer with real probes on loopback: on-access checks overtake queued
//! continuous ones, and a target asked for by several segments at once is
//! probed once.

use std::sync::Arc;
use std::time::Duration;

use connector_agent::IcmpPreference;
use connector_agent::checks::pacer::{AllowNetworks, Pacer, Priority};
use connector_agent::checks::probe::Prober;
use connector_agent::metrics::Metrics;
use policy::{CheckTarget, FailureKind, Protocol};
use test_support::{Blackhole, eventually, listeners};

fn target(ip: &str, port: u16) -> CheckTarget {
    CheckTarget {
        check: 0,
        address: ip.parse().expect("ip"),
        protocol: Protocol::Tcp,
        port,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn triggered_checks_go_ahead_of_continuous_ones() {
    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_millis(300)));
    let (pacer, task) = Pacer::spawn(prober, 20, 16, Metrics::new());
    let ips: Vec<String> = (1..=6).map(|i| format!("127.0.8.{i}")).collect();
    let (port, _) = listeners(&ips).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut joins = Vec::new();
    for ip in &ips[..5] {
        let (pacer, order, ip) = (pacer.clone(), order.clone(), ip.clone());
        joins.push(tokio::spawn(async move {
            pacer
                .check(target(&ip, port), Priority::Continuous, Duration::ZERO)
                .await;
            order.lock().expect("lock").push(ip);
        }));
        tokio::task::yield_now().await;
    }
    // Every continuous check is queued (or already started) before the
    // triggered one is asked for.
    eventually("the five continuous checks queued or started", || {
        let s = pacer.stats();
        async move { s.started + u64::from(s.queue_depth) >= 5 }
    })
    .await;
    let r = pacer
        .check(target(&ips[5], port), Priority::Triggered, Duration::ZERO)
        .await;
    assert!(r.reachable);
    order.lock().expect("lock").push(ips[5].clone());
    for j in joins {
        j.await.expect("join");
    }
    let order = order.lock().expect("lock").clone();
    let pos = order
        .iter()
        .position(|ip| ip == &ips[5])
        .expect("triggered ran");
    assert!(pos <= 2, "triggered check finished {pos}th of {order:?}");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_target_is_probed_once_for_every_segment_asking() {
    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_millis(300)));
    let (pacer, task) = Pacer::spawn(prober, 50, 16, Metrics::new());
    let (port, accepted) = listeners(&["127.0.8.9".to_string()]).await;
    let t = target("127.0.8.9", port);
    let results = futures::future::join_all(
        (0..5).map(|_| pacer.check(t, Priority::Continuous, Duration::from_secs(30))),
    )
    .await;
    assert!(results.iter().all(|r| r.reachable));
    // A later round within the reuse age is served from the last result.
    let again = pacer
        .check(t, Priority::Continuous, Duration::from_secs(30))
        .await;
    assert!(again.reachable);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(accepted.lock().expect("lock").len(), 1, "probed once");
    assert_eq!(pacer.stats().started, 1);
    // A fresh probe when asked for one.
    pacer.check(t, Priority::Triggered, Duration::ZERO).await;
    assert_eq!(pacer.stats().started, 2);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submitted_checks_complete_through_the_channel() {
    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_millis(300)));
    let (pacer, task) = Pacer::spawn(prober, 50, 16, Metrics::new());
    let (port, accepted) = listeners(&["127.0.8.10".to_string()]).await;
    let t = target("127.0.8.10", port);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // Two rounds ask for one target: one probe, two tagged completions.
    for round in [7, 8] {
        let now = pacer.submit(
            t,
            Priority::Continuous,
            Duration::from_secs(30),
            &tx,
            round,
            round as u32 * 10,
        );
        assert!(now.is_none(), "nothing to reuse yet");
    }
    let mut got = Vec::new();
    for _ in 0..2 {
        let c = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("in time")
            .expect("completion");
        assert!(c.result.reachable);
        got.push((c.round, c.index));
    }
    got.sort_unstable();
    assert_eq!(got, vec![(7, 70), (8, 80)]);
    // Within the reuse age the result comes back at once.
    let reused = pacer.submit(t, Priority::Continuous, Duration::from_secs(30), &tx, 9, 0);
    assert!(reused.is_some_and(|r| r.reachable));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(accepted.lock().expect("lock").len(), 1, "probed once");
    assert!(rx.try_recv().is_err(), "a reused result is not sent again");
    task.abort();
}

/// `--allow-networks`: whatever asks for it (check, submit, on-access or
/// continuous), an address outside the allowed networks is never probed and
/// comes back down with `NotAllowed`; addresses inside are probed as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_outside_allow_networks_are_never_probed() {
    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_millis(300)));
    let allowed = AllowNetworks::new(["127.0.8.0/24".parse().expect("net")]);
    let (pacer, task) = Pacer::spawn_restricted(prober, 50, 16, allowed, Metrics::new());
    let ips = ["127.0.8.11".to_string(), "127.0.9.11".to_string()];
    let (port, accepted) = listeners(&ips).await;
    let inside = pacer
        .check(
            target("127.0.8.11", port),
            Priority::OnAccess,
            Duration::ZERO,
        )
        .await;
    assert!(inside.reachable, "{inside:?}");
    let outside = pacer
        .check(
            target("127.0.9.11", port),
            Priority::OnAccess,
            Duration::ZERO,
        )
        .await;
    assert!(!outside.reachable);
    let failure = outside.failure.expect("a failure");
    assert_eq!(failure.kind, FailureKind::NotAllowed);
    assert_eq!(failure.detail, "outside --allow-networks");
    // The same through `submit`, and for an IPv4-mapped IPv6 spelling.
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    for ip in ["127.0.9.11", "::ffff:127.0.9.11"] {
        let now = pacer.submit(
            target(ip, port),
            Priority::Continuous,
            Duration::ZERO,
            &tx,
            1,
            0,
        );
        assert_eq!(
            now.and_then(|r| r.failure).map(|f| f.kind),
            Some(FailureKind::NotAllowed),
            "{ip}"
        );
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let accepted = accepted.lock().expect("lock").clone();
    assert_eq!(
        accepted.len(),
        1,
        "only the allowed address was probed: {accepted:?}"
    );
    assert_eq!(pacer.stats().started, 1);
    task.abort();
}

/// Probes run side by side up to the bound on checks in flight: handshakes
/// that hang hold their slots, not the other checks' probes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_probes_do_not_hold_back_the_others() {
    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_secs(60)));
    let (pacer, task) = Pacer::spawn(prober, 1000, 4, Metrics::new());
    let mut holes = Vec::new();
    let mut hung = Vec::new();
    for ip in ["127.0.8.21", "127.0.8.22", "127.0.8.23"] {
        let hole = Blackhole::start(ip).await.expect("blackhole");
        let (pacer, t) = (pacer.clone(), target(ip, hole.port()));
        hung.push(tokio::spawn(async move {
            pacer.check(t, Priority::Continuous, Duration::ZERO).await
        }));
        holes.push(hole);
    }
    eventually("three hung handshakes in flight", || {
        let in_flight = pacer.stats().in_flight;
        async move { in_flight == 3 }
    })
    .await;
    let (port, _) = listeners(&["127.0.8.24".to_string()]).await;
    let up = tokio::time::timeout(
        Duration::from_secs(20),
        pacer.check(
            target("127.0.8.24", port),
            Priority::Continuous,
            Duration::ZERO,
        ),
    )
    .await
    .expect("a free slot's check is not held back by the hung ones");
    assert!(up.reachable, "{up:?}");
    assert_eq!(pacer.stats().in_flight, 3, "the hung handshakes still hang");
    assert!(hung.iter().all(|h| !h.is_finished()));
    task.abort();
}

/// A check that started before the pacer task ends still gets its own
/// result (the probe is not cut off with the pacer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_check_completes_after_the_pacer_task_ends() {
    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_millis(500)));
    let (pacer, task) = Pacer::spawn(prober, 1000, 4, Metrics::new());
    let hole = Blackhole::start("127.0.8.25").await.expect("blackhole");
    let t = target("127.0.8.25", hole.port());
    let check = tokio::spawn({
        let pacer = pacer.clone();
        async move { pacer.check(t, Priority::Continuous, Duration::ZERO).await }
    });
    eventually("the check started", || {
        let started = pacer.stats().started;
        async move { started == 1 }
    })
    .await;
    task.abort();
    let result = tokio::time::timeout(Duration::from_secs(20), check)
        .await
        .expect("the started check completes")
        .expect("join");
    assert_eq!(
        result.failure.as_ref().map(|f| f.kind),
        Some(FailureKind::Timeout),
        "{result:?}"
    );
}
