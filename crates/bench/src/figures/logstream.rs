//! Log streaming's cost. Two CAs of the `access` setup (104 segments, four
//! simulated connectors reporting the application Up): one without log
//! receivers, one with a json receiver over TCP whose destination nobody
//! listens on (a receiver outage: every record goes to its spool). Access
//! p99 in alternating open-loop trials on both. Then a closed loop fills
//! the spool further, a TCP JSON receiver that only counts lines starts
//! on the destination, and the CA's sender streams the spool into it:
//! records per second it takes. CPU per record in three parts, each where
//! it runs: the hand-off a decision does (an access record built and
//! queued, measured in this process on the emitting thread), the CA's
//! spooler thread over the records of the trials, and the CA over the
//! drain, from the threads' `schedstat`; the CA with a receiver less the
//! one without over the trials is shown beside as a cross-check.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::Spec;
use super::access;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::servers::Server;
use crate::stats::{median_of, ms, per_trial, quantile};
use crate::sys;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "logstream_outage_access_p99_ms",
        unit: "ms",
        goal: Goal::RatioAtMost { ratio: 1.1 },
    },
    Spec {
        name: "logstream_records_per_s",
        unit: "records/s",
        goal: Goal::Info,
    },
    Spec {
        name: "logstream_cpu_us_per_record",
        unit: "µs CPU",
        goal: Goal::Info,
    },
];

/// The name of a receiver's spooler thread starts with this.
const SPOOLER: &str = "log-spool-";

/// A CA under access load with its simulated connectors and channels.
struct Side {
    server: Server,
    channels: Vec<tonic::transport::Channel>,
    sims: Vec<tokio::task::JoinHandle<()>>,
}

impl Side {
    async fn start(text: &str) -> Result<Side> {
        let (server, _dir) = ca::start_text(text).await?;
        let (sims, channels) = access::serving(&server).await?;
        Ok(Side {
            server,
            channels,
            sims,
        })
    }

    /// One open-loop trial: the run, the CA's CPU time over it and its
    /// spooler threads' share.
    async fn trial(&self, rate: f64, run: Duration) -> Result<(access::OpenLoop, [Duration; 2])> {
        let pid = self.server.pid();
        let (cpu0, spool0) = (sys::thread_times(pid), sys::named_thread_cpu(pid, SPOOLER));
        let open = access::grpc_open("log", &self.channels, pid, rate, run).await?;
        let cpu = cpu0.until(&sys::thread_times(pid)).cpu;
        let spool = sys::named_thread_cpu(pid, SPOOLER).saturating_sub(spool0);
        Ok((open, [cpu, spool]))
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        for t in &self.sims {
            t.abort();
        }
    }
}

/// The receiver `lake` as `GET /api/v1/log_receivers` shows it.
async fn lake(server: &Server) -> Result<serde_json::Value> {
    let body = ca::get_json(
        &reqwest::Client::new(),
        &format!("http://{}", server.http),
        "/api/v1/log_receivers",
    )
    .await?;
    body["log_receivers"]
        .as_array()
        .and_then(|l| l.iter().find(|r| r["name"] == "lake"))
        .cloned()
        .with_context(|| format!("no receiver lake in {body}"))
}

/// A number of the receiver's state.
fn count(r: &serde_json::Value, key: &str) -> Result<u64> {
    r[key].as_u64().with_context(|| format!("no {key} in {r}"))
}

/// What the drain measured.
struct Drain {
    /// Records taken.
    records: u64,
    /// From the first byte to the last record.
    took: Duration,
    /// The CA's CPU over the drain.
    cpu: Duration,
}

/// Starts a counting JSON receiver on `port` and waits until it has taken
/// `want` records; the rate is timed from its first byte.
async fn drain(server: &Server, port: u16, want: u64) -> Result<Drain> {
    let rx = test_support::JsonReceiver::counting(([127, 0, 0, 1], port).into()).await?;
    let pid = server.pid();
    let t0 = Instant::now();
    // The sender reconnects with backoff (up to 30 s after a long outage).
    let (first, cpu0) = loop {
        if rx.bytes() > 0 {
            break (Instant::now(), sys::thread_times(pid));
        }
        if t0.elapsed() > Duration::from_secs(60) {
            bail!("the CA did not connect to the receiver within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let at_first = rx.count();
    loop {
        if rx.count() >= want {
            break;
        }
        if first.elapsed() > Duration::from_secs(120) {
            bail!(
                "the receiver took {} of {want} records in 120 s",
                rx.count()
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(Drain {
        records: rx.count() - at_first,
        took: first.elapsed(),
        cpu: cpu0.until(&sys::thread_times(pid)).cpu,
    })
}

/// One side's trials: its runs, the CA's CPU and its spoolers' CPU in all.
type Trials = (Vec<access::OpenLoop>, Duration, Duration);

/// The hand-off a decision does for its record, in process: an access
/// record with the fields a decision writes, built and given to a
/// `LogStream` whose one receiver is away (so every record is spooled), in
/// bursts a spooler keeps up with; the emitting thread's CPU per record
/// (`/proc/thread-self/schedstat`), the spooler's own work excluded.
async fn handoff_us(records: u64) -> Result<f64> {
    use central_authority::logstream::{
        Destination, Field, Filter, Format, Kind, LogStream, ReceiverSpec, Record,
    };
    let dir = std::env::temp_dir().join(format!("reach-bench-handoff-{}", std::process::id()));
    let port = test_support::free_port()?;
    let stream = std::sync::Arc::new(LogStream::new(&dir));
    stream.start(
        "bench".into(),
        &[ReceiverSpec {
            name: "lake".into(),
            url: format!("tcp://127.0.0.1:{port}"),
            destination: Destination::Tcp {
                host: "127.0.0.1".into(),
                port,
            },
            format: Format::Json,
            types: Kind::ALL.to_vec(),
            filter: Filter::default(),
            spool_bytes: 1 << 30,
            file_max_bytes: 1 << 30,
            file_keep: 1,
        }],
    );
    let emitter = stream.clone();
    let cpu = tokio::task::spawn_blocking(move || {
        let thread_cpu = || {
            std::fs::read_to_string("/proc/thread-self/schedstat")
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .map(Duration::from_nanos)
                .context("cannot read /proc/thread-self/schedstat")
        };
        let mut cpu = Duration::ZERO;
        for burst in 0..records / 1000 {
            let t0 = thread_cpu()?;
            for n in 0..1000 {
                let record = Record::new(Kind::Access, 1_796_641_933_456 + burst * 1000 + n)
                    .text(Field::RequestId, format!("{:016x}", rand::random::<u64>()))
                    .text(Field::Host, "app.bench.test")
                    .int(Field::Port, 443)
                    .text(Field::Protocol, "tcp")
                    .text(Field::Segment, "bench-segment-0")
                    .text(Field::Decision, "allowed")
                    .text(Field::Connector, "sim-1")
                    .text(Field::Group, "bench")
                    .int(Field::CandidatesHealthy, 4)
                    .int(Field::CandidatesTotal, 4)
                    .int(Field::MatchUs, 3)
                    .int(Field::SelectUs, 2)
                    .int(Field::TotalUs, 9);
                emitter.emit(record);
            }
            cpu += thread_cpu()?.saturating_sub(t0);
            // The spooler takes a burst every 10 ms.
            std::thread::sleep(Duration::from_millis(25));
        }
        anyhow::Ok(cpu)
    })
    .await??;
    let state = stream.states().into_iter().next().context("no receiver")?;
    stream.stop();
    let _ = std::fs::remove_dir_all(&dir);
    if state.dropped_queue + state.dropped_spool > 0 {
        bail!("the hand-off dropped records ({state:?}): not the path a decision takes");
    }
    Ok(cpu.as_secs_f64() * 1e6 / records as f64)
}

/// `pairs` pairs of open-loop trials alternating between `sides` (second,
/// first, first, second, …; both up).
async fn trials(sides: [&Side; 2], rate: f64, run: Duration, pairs: usize) -> Result<[Trials; 2]> {
    let mut out: [Trials; 2] = Default::default();
    for i in 0..pairs {
        for k in [(i + 1) % 2, i % 2] {
            let (open, [cpu, spool]) = sides[k].trial(rate, run).await?;
            out[k].0.push(open);
            out[k].1 += cpu;
            out[k].2 += spool;
        }
    }
    Ok(out)
}

/// Measures (quick: 1,000 decisions/s, one 0.5-s pair; full: 5,000/s, nine
/// 3-s pairs).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let rate = mode.pick(1000.0, 5000.0);
    let trial = mode.pick(Duration::from_millis(500), Duration::from_secs(3));
    let port = test_support::free_port()?;
    let plain_text = ca::config_text(&CaSetup::default());
    let logged_text = format!(
        "{plain_text}\n[[log_receivers]]\nname = \"lake\"\ndestination = \
         \"tcp://127.0.0.1:{port}\"\nformat = \"json\"\nspool_bytes = {}\n",
        1u64 << 30
    );
    let plain = Side::start(&plain_text).await?;
    let logged = Side::start(&logged_text).await?;
    plain.trial(rate, Duration::from_millis(200)).await?;
    logged.trial(rate, Duration::from_millis(200)).await?;
    let before = count(&lake(&logged.server).await?, "spool_records")?;
    let [(with, cpu_with, spooler), (without, cpu_without, _)] =
        trials([&logged, &plain], rate, trial, mode.pick(1, 9)).await?;
    let state = lake(&logged.server).await?;
    if state["connected"] != false {
        bail!("the receiver's destination is taken: {state}");
    }
    let spooled = count(&state, "spool_records")? - before;
    let per_record = |cpu: Duration| cpu.as_secs_f64() * 1e6 / spooled.max(1) as f64;
    let emit_us = per_record(cpu_with.saturating_sub(cpu_without));
    let spooler_us = per_record(spooler);
    // More records for the drain: a closed loop as fast as the CA decides.
    access::grpc_closed(
        &logged.channels,
        mode.pick(Duration::from_secs(1), Duration::from_secs(8)),
    )
    .await?;
    let state = lake(&logged.server).await?;
    let (in_spool, dropped) = (
        count(&state, "spool_records")?,
        count(&state, "dropped_total")?,
    );
    let d = drain(&logged.server, port, in_spool).await?;
    drop((plain, logged));
    let handoff = handoff_us(mode.pick(20_000, 100_000)).await?;
    let p99 = |r: &access::OpenLoop| ms(quantile(&r.lat, 0.99));
    let send_us = d.cpu.as_secs_f64() * 1e6 / d.records.max(1) as f64;
    let per_s = d.records as f64 / d.took.as_secs_f64();
    Ok(vec![
        SPECS[0].figure(
            median_of(&with, p99),
            Some(median_of(&without, p99)),
            format!(
                "Access/Resolve open loop at {rate:.0}/s, {} alternating trials (median; outage {}, \
                 none {}); value: a CA whose json receiver is down (records spooled: {spooled}), \
                 baseline: the same CA without receivers; CA CPU in cores {:.2} vs {:.2}",
                with.len(),
                per_trial(&with, p99),
                per_trial(&without, p99),
                median_of(&with, |r| r.server_cores),
                median_of(&without, |r| r.server_cores),
            ),
        ),
        SPECS[1].figure(
            per_s,
            None,
            format!(
                "{} records (json, {in_spool} in the spool, {dropped} dropped while it filled) \
                 streamed from the spool to a TCP receiver counting lines, in {:.0} ms from its \
                 first byte",
                d.records,
                d.took.as_secs_f64() * 1000.0
            ),
        ),
        SPECS[2].figure(
            handoff + spooler_us + send_us,
            None,
            format!(
                "hand-off in the decision (an access record built and queued, in process, \
                 emitting thread's CPU) {handoff:.2} µs + spooler thread (numbered, formatted, \
                 written to the spool; CA thread CPU over the {spooled} records of the trials) \
                 {spooler_us:.2} µs + send (CA CPU over the drain / records) {send_us:.2} µs; \
                 cross-check, the whole CA's CPU with the receiver less without over the trials: \
                 {emit_us:.2} µs per record"
            ),
        ),
    ])
}
