//! The pacer with real probes on loopback: on-access checks overtake queued
//! continuous ones, and a target asked for by several segments at once is
//! probed once.

use std::sync::Arc;
use std::time::Duration;

use connector_agent::IcmpPreference;
use connector_agent::metrics::Metrics;
use connector_agent::pacer::{Pacer, Priority};
use connector_agent::probe::Prober;
use policy::{CheckTarget, Protocol};
use test_support::listeners;

fn target(ip: &str, port: u16) -> CheckTarget {
    CheckTarget {
        address: ip.parse().expect("ip"),
        protocol: Protocol::Tcp,
        port,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_access_checks_go_ahead_of_continuous_ones() {
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
    tokio::time::sleep(Duration::from_millis(10)).await;
    let r = pacer
        .check(target(&ips[5], port), Priority::OnAccess, Duration::ZERO)
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
        .expect("on-access ran");
    assert!(pos <= 2, "on-access check finished {pos}th of {order:?}");
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
    pacer.check(t, Priority::OnAccess, Duration::ZERO).await;
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
