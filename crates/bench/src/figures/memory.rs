//! Connector memory per target: RSS growth of a connector process (the
//! agent's scheduler, pacer and prober as `connector_agent::run` wires them)
//! when it is assigned continuous segments with 10k and 100k check targets,
//! divided by the targets. Each size runs in its own child process.
//!
//! The growth is measured once every round has been queued in the pacer
//! (at 20 checks/s a 100k-target cycle takes 83 min, so nearly every
//! target waits in the queue: the connector's worst case).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use connector_agent::IcmpPreference;
use connector_agent::checks::pacer::Pacer;
use connector_agent::checks::probe::Prober;
use connector_agent::metrics::Metrics;
use connector_agent::resolver::{Resolver, TtlBounds};
use connector_agent::schedule::Scheduler;
use policy::{AppEntry, HealthReporting, PortRange, Segment};
use serde::{Deserialize, Serialize};

use super::Spec;
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::sys::rss_bytes;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "connector_bytes_per_target_10k",
        unit: "B/target",
        goal: Goal::Info,
    },
    Spec {
        name: "connector_bytes_per_target_100k",
        unit: "B/target",
        goal: Goal::AtMost { limit: 1024.0 },
    },
];

/// Entries per segment (the ports multiply them, up to 10 for continuous).
const ENTRIES: usize = 1000;
const PORTS: u16 = 10;

/// What a child reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct MemReport {
    /// RSS before the assignment.
    pub before: u64,
    /// RSS once every round is queued.
    pub after: u64,
    /// Targets the scheduler holds.
    pub targets: u32,
    /// Checks waiting in the pacer at the second reading.
    pub queued: u32,
}

/// Continuous segments with `targets` (address, port) targets in all, on
/// loopback addresses 127.16.0.0/12 (nothing listens there: the few checks
/// that start are refused at once).
pub fn segments(targets: usize) -> Vec<Segment> {
    let per_segment = ENTRIES * usize::from(PORTS);
    let count = targets.div_ceil(per_segment);
    (0..count)
        .map(|s| {
            let entries = (targets - s * per_segment).min(per_segment) / usize::from(PORTS);
            Segment {
                check: policy::AppCheck::default(),
                name: format!("mem-{s}"),
                applications: (0..entries).map(|i| entry(s * ENTRIES + i)).collect(),
                tcp_ports: PortRange::new(9000, 9000 + PORTS - 1).into_iter().collect(),
                udp_ports: Vec::new(),
                health_reporting: HealthReporting::Continuous,
                report_interval: Duration::from_secs(60),
                multimatch: false,
                client_hostname_validation: false,
                connector_groups: vec!["bench".to_owned()],
                damping: policy::Damping::default(),
                strategy: None,
            }
        })
        .collect()
}

/// The `g`-th address entry: 127.16.0.1, 127.16.0.2, …
fn entry(g: usize) -> AppEntry {
    AppEntry::Ip(IpAddr::V4(Ipv4Addr::new(
        127,
        16 + (g / 62_500) as u8,
        ((g % 62_500) / 250) as u8,
        (g % 250) as u8 + 1,
    )))
}

/// `reach-bench connector-mem N` (in the child): prints one JSON line.
pub async fn child(targets: usize) -> Result<()> {
    let metrics = Metrics::new();
    let resolver = Resolver::new(Some("127.0.0.1:53".parse()?), TtlBounds::default())?;
    let prober = Arc::new(Prober::new(IcmpPreference::Off, Duration::from_secs(1)));
    let (pacer, _pacer_task) = Pacer::spawn(prober, 20, 256, metrics.clone());
    let (reports_tx, mut reports_rx) = tokio::sync::mpsc::unbounded_channel();
    let (scheduler, _task) = Scheduler::spawn(resolver, pacer.clone(), metrics, reports_tx);
    tokio::spawn(async move { while reports_rx.recv().await.is_some() {} });
    // Let the runtime and allocator settle before the first reading.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_bytes(None);

    scheduler
        .apply(segments(targets), Duration::from_secs(1800))
        .await;
    // Wait until the queue stops growing (it then drains at 20/s).
    let mut last = 0;
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let depth = pacer.stats().queue_depth;
        if depth > 0 && depth <= last {
            break;
        }
        last = depth;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = rss_bytes(None);
    let report = MemReport {
        before,
        after,
        targets: scheduler.load().targets,
        queued: pacer.stats().queue_depth,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}

async fn measure(targets: usize) -> Result<MemReport> {
    crate::servers::child_result(
        &["connector-mem".to_owned(), targets.to_string()],
        "connector-mem",
    )
    .await
}

/// Measures both sizes (quick: 1k and 10k).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let sizes = mode.pick([1_000usize, 10_000], [10_000, 100_000]);
    let mut out = Vec::new();
    for (spec, size) in SPECS.iter().zip(sizes) {
        let r = measure(size).await?;
        let growth = r.after.saturating_sub(r.before);
        // The assignment holds exactly `size` distinct targets by
        // construction; the scheduler's own count is in the note.
        out.push(spec.figure(
            growth as f64 / size as f64,
            None,
            format!(
                "RSS {:.1} MiB → {:.1} MiB for {size} targets (scheduler counted {}; {} segments of {ENTRIES} IPs × {PORTS} \
                 TCP ports), {} checks queued in the pacer at the reading{}",
                r.before as f64 / 1048576.0,
                r.after as f64 / 1048576.0,
                r.targets,
                size.div_ceil(ENTRIES * usize::from(PORTS)),
                r.queued,
                if size == sizes[0] && mode == Mode::Quick {
                    " (quick mode: smaller sizes than the names say)"
                } else {
                    ""
                }
            ),
        ));
    }
    Ok(out)
}
