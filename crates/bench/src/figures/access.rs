//! Access decisions: `reach.v1.Access/Resolve` and `POST /api/v1/access` on
//! the CA (100+ segments, four connectors reporting the application Up),
//! next to a bare tonic `Access` and a bare axum handler that return the
//! CA's own answer (same bytes) without deciding anything. Closed loop at
//! the same concurrency over several HTTP/2 connections for throughput;
//! then an open loop at half the CA's throughput for latency (requests are
//! released evenly spaced on a schedule, not after the previous answer, so
//! queueing in the server is not hidden).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use prost::Message;
use protocol::v1::access_client::AccessClient;
use tonic::transport::Channel;

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::servers::Server;
use crate::sim::{self, Identity};
use crate::stats::{median_of, ms, per_trial, quantile};
use crate::sys;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "access_grpc_decisions_per_s",
        unit: "decisions/s",
        goal: Goal::RatioAtLeast { ratio: 0.9 },
    },
    Spec {
        name: "access_grpc_p99_half_load_ms",
        unit: "ms",
        goal: Goal::RatioAtMost { ratio: 1.0 },
    },
    Spec {
        name: "access_grpc_p50_half_load_ms",
        unit: "ms",
        goal: Goal::Info,
    },
    Spec {
        name: "access_http_decisions_per_s",
        unit: "decisions/s",
        goal: Goal::Info,
    },
    Spec {
        name: "access_http_p99_ms",
        unit: "ms",
        goal: Goal::RatioAtMost { ratio: 1.1 },
    },
];

const CHANNELS: usize = 4;
const CONCURRENCY: usize = 64;
const CONNECTORS: usize = 4;

/// A closed loop's result.
pub(crate) struct ClosedLoop {
    /// Decisions per second.
    pub(crate) rate: f64,
    /// Sorted latencies.
    pub(crate) lat: Vec<Duration>,
    /// Per request: its task, when it started (from the loop's start) and
    /// its latency.
    timeline: Vec<(usize, Duration, Duration)>,
}

/// What one closed-loop task measured: each request's start (from the
/// loop's start) and latency.
type Measured = Vec<(Duration, Duration)>;

/// Ends a closed loop: lets `tasks` run until `run` after `t0`, stops them
/// and collects what each task measured (each request's start, from `t0`,
/// and latency).
async fn finish_closed(
    tasks: Vec<tokio::task::JoinHandle<Result<Measured>>>,
    stop: &AtomicBool,
    t0: Instant,
    run: Duration,
) -> Result<ClosedLoop> {
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = t0.elapsed();
    let mut timeline = Vec::new();
    for (n, t) in tasks.into_iter().enumerate() {
        timeline.extend(t.await??.into_iter().map(|(at, l)| (n, at, l)));
    }
    let mut lat: Vec<Duration> = timeline.iter().map(|&(_, _, l)| l).collect();
    lat.sort();
    Ok(ClosedLoop {
        rate: lat.len() as f64 / elapsed.as_secs_f64(),
        lat,
        timeline,
    })
}

/// Closed loop: `CONCURRENCY` tasks over `channels` for `run`; returns
/// decisions/s and sorted latencies.
pub(crate) async fn grpc_closed(channels: &[Channel], run: Duration) -> Result<ClosedLoop> {
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..CONCURRENCY {
        let mut client = AccessClient::new(channels[i % channels.len()].clone());
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = client
                    .resolve(ca::authorized(ca::access_request(
                        ca::APP_HOST,
                        ca::APP_PORT,
                    ))?)
                    .await?;
                std::hint::black_box(r);
                lat.push((t - t0, t.elapsed()));
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    finish_closed(tasks, &stop, t0, run).await
}

/// An open-loop run's sorted latencies and the CPU it took.
pub(crate) struct OpenLoop {
    /// Sorted latencies.
    pub(crate) lat: Vec<Duration>,
    /// Each answered request's release time (from the loop's start) and
    /// latency, in release order.
    timeline: Vec<(Duration, Duration)>,
    /// Server CPU over wall time (1.0 = one core busy).
    pub(crate) server_cores: f64,
    /// Load generator CPU (this process) over wall time.
    client_cores: f64,
    /// What the server's threads did meanwhile, per answered request.
    server: PerRequest,
}

/// What a server's threads did per request over a trial: CPU, time
/// runnable but waiting for a core, and preemptions (from the scheduler's
/// per-thread counters), to tell extra work from waiting for a turn.
#[derive(Clone, Copy, Debug)]
struct PerRequest {
    /// CPU time, µs per request.
    cpu_us: f64,
    /// Time runnable but not running, µs per request.
    waited_us: f64,
    /// Involuntary context switches per 1000 requests.
    preempted_per_1000: f64,
}

impl PerRequest {
    /// `delta` spread over `requests`.
    fn of(delta: sys::ThreadTimes, requests: usize) -> Self {
        let n = requests.max(1) as f64;
        PerRequest {
            cpu_us: delta.cpu.as_secs_f64() * 1e6 / n,
            waited_us: delta.waited.as_secs_f64() * 1e6 / n,
            preempted_per_1000: delta.preempted as f64 * 1000.0 / n,
        }
    }
}

/// The medians of `trials`' per-request figures (`server` of each), for a
/// note.
fn per_request_note<T>(trials: &[T], server: impl Fn(&T) -> PerRequest) -> String {
    format!(
        "{:.1} µs CPU, {:.1} µs waiting for a core, {:.1} preemptions per 1000",
        median_of(trials, |t| server(t).cpu_us),
        median_of(trials, |t| server(t).waited_us),
        median_of(trials, |t| server(t).preempted_per_1000),
    )
}

/// Why requests of a run failed: each distinct error with its count and
/// the release time of its first occurrence, so a failed run says which
/// errors and when, not only how many.
#[derive(Default)]
struct Failures {
    /// (error, count, first release) in order of first occurrence.
    kinds: Vec<(String, u64, Duration)>,
}

impl Failures {
    fn add(&mut self, at: Duration, error: String) {
        match self.kinds.iter_mut().find(|(e, _, _)| *e == error) {
            Some((_, n, first)) => {
                *n += 1;
                *first = (*first).min(at);
            }
            None => self.kinds.push((error, 1, at)),
        }
    }
}

impl std::fmt::Display for Failures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut kinds: Vec<_> = self.kinds.iter().collect();
        kinds.sort_by_key(|(_, _, first)| *first);
        for (i, (error, n, first)) in kinds.iter().take(5).enumerate() {
            let sep = if i == 0 { "" } else { "; " };
            write!(
                f,
                "{sep}{n} × {error} (first at {:.3} s)",
                first.as_secs_f64()
            )?;
        }
        if kinds.len() > 5 {
            write!(f, "; {} more kinds", kinds.len() - 5)?;
        }
        Ok(())
    }
}

/// Open loop at `rate`/s for `run`: request *i* is released at
/// `t0 + i / rate`, evenly spaced (not in bursts per timer tick: tokio's
/// timer has millisecond granularity, and releasing a millisecond's
/// requests at once measures the burst's own queueing, not the server's),
/// each in its own task, so a slow answer never delays the next request. A
/// plain thread keeps the schedule with `thread::sleep` (tens of
/// microseconds of jitter) and hands each request to the runtime; latency
/// runs from that hand-off to the answer, so the client runtime's
/// scheduling delay is counted.
pub(crate) async fn grpc_open(
    side: &str,
    channels: &[Channel],
    server: Option<u32>,
    rate: f64,
    run: Duration,
) -> Result<OpenLoop> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let total = (rate * run.as_secs_f64()) as u64;
    let handle = tokio::runtime::Handle::current();
    let channels = channels.to_vec();
    let (server0, client0, wall0) = (sys::cpu_time(server), sys::cpu_time(None), Instant::now());
    let threads0 = sys::thread_times(server);
    let t0 = Instant::now();
    let pacer = std::thread::spawn(move || {
        for i in 0..total {
            let due = t0 + Duration::from_secs_f64(i as f64 / rate);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let mut client = AccessClient::new(channels[i as usize % channels.len()].clone());
            let tx = tx.clone();
            let sent = Instant::now();
            handle.spawn(async move {
                let answer = match ca::authorized(ca::access_request(ca::APP_HOST, ca::APP_PORT)) {
                    Ok(request) => client
                        .resolve(request)
                        .await
                        .map(|_| sent.elapsed())
                        .map_err(|s| format!("{:?}: {}", s.code(), s.message())),
                    Err(e) => Err(format!("request not built: {e}")),
                };
                let _ = tx.send((sent - t0, answer));
            });
        }
    });
    let mut timeline = Vec::with_capacity(total as usize);
    let mut failures = Failures::default();
    while let Some((at, answer)) = rx.recv().await {
        match answer {
            Ok(l) => timeline.push((at, l)),
            Err(e) => failures.add(at, e),
        }
    }
    timeline.sort();
    let mut lat: Vec<Duration> = timeline.iter().map(|&(_, l)| l).collect();
    let wall = wall0.elapsed().as_secs_f64();
    let server_cores = (sys::cpu_time(server) - server0).as_secs_f64() / wall;
    let client_cores = (sys::cpu_time(None) - client0).as_secs_f64() / wall;
    let threads = threads0.until(&sys::thread_times(server));
    if pacer.join().is_err() {
        bail!("the open-loop pacing thread panicked");
    }
    if (lat.len() as u64) < total {
        bail!(
            "{} of {total} gRPC access requests to the {side} server failed: {failures}",
            total - lat.len() as u64
        );
    }
    lat.sort();
    let server = PerRequest::of(threads, lat.len());
    Ok(OpenLoop {
        lat,
        timeline,
        server_cores,
        client_cores,
        server,
    })
}

/// Writes the timelines `REACH_BENCH_TIMELINE=DIR` asks for, to tell a
/// stall (slow answers bunched in time) from queueing spread over a run or
/// from an unfair connection: per open-loop trial `access-{ca,bare}-N.csv`
/// (each request's release and latency in µs, in release order), and
/// `http-{ca,bare}-N.csv` for the HTTP closed-loop trials (each request's
/// task, i.e. its connection, start and latency).
fn write_timelines(
    dir: &std::path::Path,
    open: [(&str, &[OpenLoop]); 2],
    http: [(&str, &[HttpTrial]); 2],
) -> Result<()> {
    use std::fmt::Write as _;
    std::fs::create_dir_all(dir)?;
    let write = |name: String, csv: String| {
        let path = dir.join(name);
        std::fs::write(&path, csv).with_context(|| format!("writing {}", path.display()))
    };
    for (side, trials) in open {
        for (n, trial) in trials.iter().enumerate() {
            let mut csv = String::from("release_us,latency_us\n");
            for (at, lat) in &trial.timeline {
                let _ = writeln!(csv, "{},{}", at.as_micros(), lat.as_micros());
            }
            write(format!("access-{side}-{n}.csv"), csv)?;
        }
    }
    for (side, trials) in http {
        for (n, trial) in trials.iter().enumerate() {
            let mut csv = String::from("task,start_us,latency_us\n");
            for (task, at, lat) in &trial.run.timeline {
                let _ = writeln!(csv, "{task},{},{}", at.as_micros(), lat.as_micros());
            }
            write(format!("http-{side}-{n}.csv"), csv)?;
        }
    }
    Ok(())
}

/// Closed loop over HTTP/1.1 keep-alive connections (one per concurrent
/// request); returns decisions/s and sorted latencies.
async fn http_closed(base: &str, run: Duration) -> Result<ClosedLoop> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CONCURRENCY)
        .build()?;
    let url = format!("{base}/api/v1/access");
    let body = serde_json::json!({"host": ca::APP_HOST, "protocol": "tcp", "port": ca::APP_PORT})
        .to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (client, url, body, stop) = (client.clone(), url.clone(), body.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = client
                    .post(&url)
                    .bearer_auth(ca::TOKEN)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await?
                    .error_for_status()?
                    .bytes()
                    .await?;
                std::hint::black_box(r);
                lat.push((t - t0, t.elapsed()));
            }
            Ok::<_, anyhow::Error>(lat)
        }));
    }
    finish_closed(tasks, &stop, t0, run).await
}

/// One HTTP closed-loop trial and what the server's threads did meanwhile.
struct HttpTrial {
    run: ClosedLoop,
    server: PerRequest,
}

/// [`http_closed`] against the server `pid`, with its threads' counters.
async fn http_trial(base: &str, pid: Option<u32>, run: Duration) -> Result<HttpTrial> {
    let before = sys::thread_times(pid);
    let closed = http_closed(base, run).await?;
    let server = PerRequest::of(before.until(&sys::thread_times(pid)), closed.lat.len());
    Ok(HttpTrial {
        run: closed,
        server,
    })
}

/// Starts the simulated connectors on `server` and opens the access
/// channels, once a decision selects a connector.
pub(crate) async fn serving(
    server: &Server,
) -> Result<(Vec<tokio::task::JoinHandle<()>>, Vec<Channel>)> {
    let sims = connectors(server).await?;
    let channels = sim::channels(&server.grpc_url(), CHANNELS).await?;
    ca::wait_until(Duration::from_secs(10), "a selectable connector", || {
        let ch = channels[0].clone();
        async move {
            Ok(ca::selected(
                &ca::resolve(ch, ca::APP_HOST, ca::APP_PORT).await?,
            ))
        }
    })
    .await?;
    Ok((sims, channels))
}

/// Connects `CONNECTORS` simulated connectors that report the application
/// Up and keep their sessions alive; returns their tasks.
pub(crate) async fn connectors(server: &Server) -> Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut tasks = Vec::new();
    for (i, ch) in sim::channels(&server.grpc_url(), CONNECTORS)
        .await?
        .into_iter()
        .enumerate()
    {
        let id = Identity {
            name: format!("access-{i}"),
            group: ca::GROUP.to_owned(),
            key: ca::KEY.to_owned(),
        };
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let inbound =
            sim::connect(ch, &id, tokio_stream::wrappers::ReceiverStream::new(rx)).await?;
        tasks.push(sim::drain(inbound));
        tasks.push(tokio::spawn(async move {
            let mut k = 0u32;
            loop {
                let report = sim::report("web", ca::APP_HOST, ca::APP_PORT, true, 500);
                if tx.send(report).await.is_err() || tx.send(sim::heartbeat(k)).await.is_err() {
                    return;
                }
                k += 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }));
    }
    Ok(tasks)
}

/// Measures all.
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let duration = mode.pick(Duration::from_millis(500), Duration::from_secs(6));
    let dir = std::env::temp_dir().join(format!("reach-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    let ca_server = ca::start(&CaSetup::default()).await?;
    let (sims, channels) = serving(&ca_server).await?;
    // The CA's real answers, for the bare servers to send back.
    let decision = ca::resolve(channels[0].clone(), ca::APP_HOST, ca::APP_PORT).await?;
    let decision_path = dir.join("decision.pb");
    std::fs::write(&decision_path, decision.encode_to_vec())?;
    let base = format!("http://{}", ca_server.http);
    let json = reqwest::Client::new()
        .post(format!("{base}/api/v1/access"))
        .bearer_auth(ca::TOKEN)
        .json(&serde_json::json!({"host": ca::APP_HOST, "protocol": "tcp", "port": ca::APP_PORT}))
        .send()
        .await?
        .error_for_status()
        .context("the CA refused the HTTP access")?
        .bytes()
        .await?;
    let json_path = dir.join("decision.json");
    std::fs::write(&json_path, &json)?;

    let (Some(d), Some(j)) = (decision_path.to_str(), json_path.to_str()) else {
        bail!("temporary paths are not UTF-8");
    };
    let bare = Server::spawn(&["serve-bare", d, j]).await?;
    let bare_channels = sim::channels(&bare.grpc_url(), CHANNELS).await?;
    let bare_base = format!("http://{}", bare.http);

    grpc_closed(&channels, Duration::from_millis(200)).await?;
    let reach_rate = grpc_closed(&channels, duration).await?.rate;
    grpc_closed(&bare_channels, Duration::from_millis(200)).await?;
    let bare_rate = grpc_closed(&bare_channels, duration).await?.rate;
    // Latency in alternating trials (CA, bare, CA, …), both servers up, so
    // a change in the machine's speed reaches both alike; medians of the
    // trials' quantiles.
    // `REACH_BENCH_ACCESS_LOAD` (a fraction of the CA's closed-loop rate,
    // 0.5 unless set) runs the open loop at another load, to see how the
    // tail depends on how busy the machine is; the figures keep their names.
    let load = match std::env::var("REACH_BENCH_ACCESS_LOAD") {
        Err(_) => 0.5,
        Ok(v) => match v.parse::<f64>() {
            Ok(l) if l > 0.0 && l <= 1.0 => l,
            _ => bail!("REACH_BENCH_ACCESS_LOAD={v:?}: expected a fraction in (0, 1]"),
        },
    };
    let half = reach_rate * load;
    let (mut reach_half, mut bare_half) = (Vec::new(), Vec::new());
    // Five short trials rather than three long ones: a trial that meets a
    // pause of the shared machine (single trials' p99 have spread from 3 to
    // 500 ms) then moves the median less.
    for _ in 0..mode.pick(1, 5) {
        let trial = mode.pick(duration, Duration::from_secs(2));
        reach_half.push(grpc_open("reach", &channels, ca_server.pid(), half, trial).await?);
        bare_half.push(grpc_open("bare", &bare_channels, bare.pid(), half, trial).await?);
    }
    // HTTP in alternating trials too (with one run each, a pause of the
    // machine during one of them decided the ratio).
    http_closed(&base, Duration::from_millis(200)).await?;
    http_closed(&bare_base, Duration::from_millis(200)).await?;
    let (mut reach_http, mut bare_http) = (Vec::new(), Vec::new());
    for _ in 0..mode.pick(1, 3) {
        let trial = mode.pick(duration, Duration::from_secs(2));
        reach_http.push(http_trial(&base, ca_server.pid(), trial).await?);
        bare_http.push(http_trial(&bare_base, bare.pid(), trial).await?);
    }
    if let Some(dir) = std::env::var_os("REACH_BENCH_TIMELINE") {
        write_timelines(
            std::path::Path::new(&dir),
            [("ca", &reach_half), ("bare", &bare_half)],
            [("ca", &reach_http), ("bare", &bare_http)],
        )?;
    }
    for t in sims {
        t.abort();
    }
    drop((channels, bare_channels));
    drop((ca_server, bare));

    let p = |l: &[Duration], q| ms(quantile(l, q));
    let p99 = |r: &OpenLoop| p(&r.lat, 0.99);
    let http_p99 = |t: &HttpTrial| p(&t.run.lat, 0.99);
    let http_p50 = |t: &HttpTrial| p(&t.run.lat, 0.5);
    Ok(vec![
        SPECS[0].figure(
            reach_rate,
            Some(bare_rate),
            format!(
                "Access/Resolve, {CONCURRENCY} concurrent over {CHANNELS} channels, closed loop; \
                 answer {} B; bare = tonic Access returning the CA's answer",
                decision.encoded_len()
            ),
        ),
        SPECS[1].figure(
            median_of(&reach_half, p99),
            Some(median_of(&bare_half, p99)),
            format!(
                "open loop at {half:.0}/s ({load} of the CA's closed-loop rate), evenly spaced, latency \
                 from each send, {} alternating trials (median; CA {}, bare {}); baseline = bare \
                 echo at the same rate; CPU in cores: CA {:.2} + load generator {:.2} (bare {:.2} \
                 + {:.2}) of 2; server threads per request: CA {}; bare {}",
                reach_half.len(),
                per_trial(&reach_half, p99),
                per_trial(&bare_half, p99),
                median_of(&reach_half, |r| r.server_cores),
                median_of(&reach_half, |r| r.client_cores),
                median_of(&bare_half, |r| r.server_cores),
                median_of(&bare_half, |r| r.client_cores),
                per_request_note(&reach_half, |t| t.server),
                per_request_note(&bare_half, |t| t.server),
            ),
        ),
        SPECS[2].figure(
            median_of(&reach_half, |r| p(&r.lat, 0.5)),
            Some(median_of(&bare_half, |r| p(&r.lat, 0.5))),
            format!(
                "as above, median; p90 {:.2} ms",
                median_of(&reach_half, |r| p(&r.lat, 0.9)),
            ),
        ),
        SPECS[3].figure(
            median_of(&reach_http, |t| t.run.rate),
            Some(median_of(&bare_http, |t| t.run.rate)),
            format!(
                "POST /api/v1/access, {CONCURRENCY} concurrent HTTP/1.1 keep-alive connections \
                 (reqwest), closed loop, {} alternating trials (median); answer {} B; bare = axum \
                 handler returning the CA's JSON",
                reach_http.len(),
                json.len()
            ),
        ),
        SPECS[4].figure(
            median_of(&reach_http, http_p99),
            Some(median_of(&bare_http, http_p99)),
            format!(
                "closed loop at full load, median of the trials (CA {}, bare {}); p50 {:.2} ms vs \
                 {:.2} ms bare; server threads per request: CA {}; bare {}",
                per_trial(&reach_http, http_p99),
                per_trial(&bare_http, http_p99),
                median_of(&reach_http, http_p50),
                median_of(&bare_http, http_p50),
                per_request_note(&reach_http, |t| t.server),
                per_request_note(&bare_http, |t| t.server),
            ),
        ),
    ])
}
