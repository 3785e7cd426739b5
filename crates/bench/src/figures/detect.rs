//! Detection and recovery latency with the real connector agent
//! (`connector_agent::run` in the driver, as in `cold`) and the CA in a
//! child process: application servers are loopback listeners in continuous
//! segments with a report interval of 1 s (9 applications) and 60 s (40
//! applications, all checked at once every interval: the load the 60-s
//! goal is about). With the refusing plan's 9 more, the plans ask for 18.7
//! checks a second of the connector's 20: above the rate, no order of
//! checks meets every bound (at 10 + 10 + 40/60 = 20.7 a second the 60-s
//! checks came up to 20 s late, or under first come, first served the 1-s
//! ones 2 s late). A server stops answering, the realistic failure: it
//! stops accepting and its accept queue is filled (backlog 0 plus one held
//! connection), so the kernel drops further SYNs and each check hangs
//! until the agent's check timeout, as a hung or blackholed host does. The
//! driver asks `Access/Resolve` for it every few milliseconds until the CA
//! refuses it with `all_down`: that is the detection latency. Then the
//! server answers again and the driver asks until the CA selects the
//! connector for it: the recovery latency.
//!
//! A change is seen at the connector's next check of the application (up
//! to one report interval later), which for a server that stops answering
//! takes the whole check timeout, reported through its outbox (at most
//! `BATCH_WINDOW` later) and applied by the CA, so the bound is one
//! interval plus one check timeout plus one batch window, plus the
//! driver's polling period. The failures and recoveries of the
//! applications fall at phases spread evenly over their check schedule
//! (taken from the time each listener last accepted a check), so the
//! largest latency shows how close the worst case comes to the bound and
//! the median sits near half an interval plus the timeout. The 60-s
//! applications run side by side and split in two halves: one half stops
//! answering once (detection), the other starts not answering and answers
//! once (recovery, from the Down its first check found), so the figure
//! takes about one interval, not forty. A third plan fails its 1-s
//! applications by refusing instead (the listening socket closed, every
//! SYN reset), measured apart: each check fails at once, so its bound
//! holds with the timeout to spare. Quick mode runs the plans small, with
//! a 2-s interval standing in for the 60-s one.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use connector_agent::send::outbox::BATCH_WINDOW;
use connector_agent::{Config, IcmpPreference};
use protocol::v1;
use protocol::v1::access_decision::Outcome;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tonic::transport::Channel;

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::stats::{ms, quantile};

/// The agent's check timeout (`Config::new`'s default, 1 s).
const CHECK_TIMEOUT: Duration = Duration::from_millis(1000);

/// Detection and recovery latencies.
#[derive(Debug, Default)]
struct Samples {
    down: Vec<Duration>,
    up: Vec<Duration>,
}

/// One report interval's runs: the applications, cycles and polling.
#[derive(Clone, Copy, Debug)]
struct Plan {
    interval: Duration,
    apps: usize,
    cycles: usize,
    poll: Duration,
    /// Third octet of the applications' loopback addresses.
    octet: u8,
    segment: &'static str,
    /// One cycle per application, half of them measuring detection only
    /// and half recovery only (from a server that was never up), so the
    /// plan takes one interval instead of two.
    split: bool,
    /// The server fails by refusing (its listening socket closed: every
    /// SYN is answered with a reset, each check fails at once) rather than
    /// by no longer answering.
    refuse: bool,
}

impl Plan {
    /// Whether application `k` starts down and measures recovery only.
    fn starts_down(&self, k: usize) -> bool {
        self.split && k % 2 == 1
    }

    /// Application `k`'s `c`-th phase, as a fraction of the interval,
    /// spread evenly over the applications (of its half) and cycles.
    fn phase(&self, k: usize, c: usize) -> f64 {
        let (k, apps) = if self.split {
            (k / 2, self.apps.div_ceil(2))
        } else {
            (k, self.apps)
        };
        ((k * self.cycles + c) as f64 + 0.5) / (apps * self.cycles) as f64
    }
}

impl Plan {
    /// One interval plus one check plus one batch window plus one poll.
    fn bound(&self) -> Duration {
        self.interval + CHECK_TIMEOUT + BATCH_WINDOW + self.poll
    }
}

/// Goals: the bound of each plan (`Plan::bound`), in the figure's unit.
const BOUND_1S_MS: f64 = 1000.0 + 1000.0 + 100.0 + 5.0;
const BOUND_60S_S: f64 = 60.0 + 1.0 + 0.1 + 0.05;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "detect_down_max_ms_1s",
        unit: "ms",
        goal: Goal::AtMost { limit: BOUND_1S_MS },
    },
    Spec {
        name: "detect_down_p50_ms_1s",
        unit: "ms",
        goal: Goal::Info,
    },
    Spec {
        name: "detect_recovery_max_ms_1s",
        unit: "ms",
        goal: Goal::AtMost { limit: BOUND_1S_MS },
    },
    Spec {
        name: "detect_recovery_p50_ms_1s",
        unit: "ms",
        goal: Goal::Info,
    },
    Spec {
        name: "detect_down_max_s_60s",
        unit: "s",
        goal: Goal::AtMost { limit: BOUND_60S_S },
    },
    Spec {
        name: "detect_down_p50_s_60s",
        unit: "s",
        goal: Goal::Info,
    },
    Spec {
        name: "detect_recovery_max_s_60s",
        unit: "s",
        goal: Goal::AtMost { limit: BOUND_60S_S },
    },
    Spec {
        name: "detect_recovery_p50_s_60s",
        unit: "s",
        goal: Goal::Info,
    },
    Spec {
        name: "detect_refused_max_ms_1s",
        unit: "ms",
        goal: Goal::AtMost { limit: BOUND_1S_MS },
    },
    Spec {
        name: "detect_refused_p50_ms_1s",
        unit: "ms",
        goal: Goal::Info,
    },
    Spec {
        name: "detect_refused_recovery_max_ms_1s",
        unit: "ms",
        goal: Goal::AtMost { limit: BOUND_1S_MS },
    },
    Spec {
        name: "detect_refused_recovery_p50_ms_1s",
        unit: "ms",
        goal: Goal::Info,
    },
];

const PLAN_1S: Plan = Plan {
    interval: Duration::from_secs(1),
    apps: 9,
    cycles: 4,
    poll: Duration::from_millis(5),
    octet: 1,
    segment: "detect-1s",
    split: false,
    refuse: false,
};

const PLAN_1S_REFUSED: Plan = Plan {
    octet: 3,
    segment: "detect-1s-refused",
    refuse: true,
    ..PLAN_1S
};

const PLAN_60S: Plan = Plan {
    interval: Duration::from_secs(60),
    apps: 40,
    cycles: 1,
    poll: Duration::from_millis(50),
    octet: 2,
    segment: "detect-60s",
    split: true,
    refuse: false,
};

/// The address the driver fills accept queues from, so the listeners can
/// tell its connections from the agent's checks.
const FILLER: Ipv4Addr = Ipv4Addr::new(127, 79, 255, 254);

/// The accept backlog of an answering server.
const BACKLOG: i32 = 1024;

/// A loopback application server that records when it last accepted a
/// check, and can stop answering (a full accept queue) without closing.
pub(crate) struct AppServer {
    addr: SocketAddr,
    last_accept: Arc<Mutex<Option<Instant>>>,
    listener: Option<Arc<TcpListener>>,
    accepting: Option<(oneshot::Sender<()>, tokio::task::JoinHandle<()>)>,
    /// The driver's connections that fill the accept queue while the
    /// server does not answer.
    held: Vec<TcpStream>,
}

impl AppServer {
    pub(crate) fn new(addr: SocketAddr) -> Self {
        AppServer {
            addr,
            last_accept: Arc::new(Mutex::new(None)),
            listener: None,
            accepting: None,
            held: Vec::new(),
        }
    }

    /// Listens on `addr` and accepts; returns when the socket listens.
    pub(crate) fn start(&mut self) -> Result<()> {
        let socket = TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket
            .bind(self.addr)
            .with_context(|| format!("binding {}", self.addr))?;
        self.listener = Some(Arc::new(socket.listen(BACKLOG as u32)?));
        self.accept();
        Ok(())
    }

    /// Accepts (and drops) connections, recording the agent's.
    fn accept(&mut self) {
        let Some(listener) = self.listener.clone() else {
            return;
        };
        let (tx, mut rx) = oneshot::channel();
        let last = self.last_accept.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut rx => break,
                    accepted = listener.accept() => {
                        if let Ok((s, peer)) = accepted {
                            if peer.ip() != IpAddr::V4(FILLER)
                                && let Ok(mut l) = last.lock()
                            {
                                *l = Some(Instant::now());
                            }
                            drop(s);
                        }
                    }
                }
            }
        });
        self.accepting = Some((tx, task));
    }

    /// Stops accepting; returns once the accept loop has ended.
    async fn pause(&mut self) {
        if let Some((tx, task)) = self.accepting.take() {
            let _ = tx.send(());
            let _ = task.await;
        }
    }

    /// Stops answering: no more accepts, the backlog cut to 0 and the
    /// queue filled from `FILLER` until a handshake hangs. Returns the
    /// instant the queue was full (the last handshake that completed).
    pub(crate) async fn stop_answering(&mut self) -> Result<Instant> {
        self.pause().await;
        let listener = self.listener.clone().context("not listening")?;
        socket2::SockRef::from(&*listener).listen(0)?;
        let mut full = Instant::now();
        for _ in 0..16 {
            let socket = TcpSocket::new_v4()?;
            socket.bind(SocketAddr::new(IpAddr::V4(FILLER), 0))?;
            match tokio::time::timeout(Duration::from_millis(100), socket.connect(self.addr)).await
            {
                Ok(Ok(s)) => {
                    self.held.push(s);
                    full = Instant::now();
                }
                Ok(Err(e)) => bail!("filling {}'s accept queue: {e}", self.addr),
                // A SYN dropped: the queue is full.
                Err(_) => return Ok(full),
            }
        }
        bail!("{}: the accept queue never filled", self.addr)
    }

    /// Answers again: the backlog restored and accepting; returns the
    /// instant handshakes complete again.
    fn answer(&mut self) -> Result<Instant> {
        let listener = self.listener.clone().context("not listening")?;
        socket2::SockRef::from(&*listener).listen(BACKLOG)?;
        let answering = Instant::now();
        self.held.clear();
        self.accept();
        Ok(answering)
    }

    /// Closes the listening socket.
    pub(crate) async fn close(&mut self) {
        self.pause().await;
        self.listener = None;
        self.held.clear();
    }

    fn last_accept(&self) -> Option<Instant> {
        self.last_accept.lock().ok().and_then(|l| *l)
    }
}

/// Asks for `addr` every `poll` until `want` holds for the decision;
/// returns when the answer that showed it arrived.
async fn poll_until(
    ch: &Channel,
    addr: SocketAddr,
    poll: Duration,
    limit: Duration,
    want: fn(&v1::AccessDecision) -> bool,
) -> Result<Instant> {
    let t0 = Instant::now();
    loop {
        let d = ca::resolve(ch.clone(), &addr.ip().to_string(), addr.port()).await?;
        if want(&d) {
            return Ok(Instant::now());
        }
        if t0.elapsed() > limit {
            bail!("{addr}: no change within {limit:?} (last decision {d:?})");
        }
        tokio::time::sleep(poll).await;
    }
}

fn all_down(d: &v1::AccessDecision) -> bool {
    matches!(&d.outcome, Some(Outcome::Refusal(r)) if r.reason == v1::RefusalReason::AllDown as i32)
}

/// The first instant `phase` after a check at `last` (on the grid of
/// `interval`) that is not before `not_before`.
fn next_on_grid(
    last: Instant,
    interval: Duration,
    phase: Duration,
    not_before: Instant,
) -> Instant {
    let mut at = last + phase;
    while at < not_before {
        at += interval;
    }
    at
}

/// A server that starts not answering: wait for the CA's `all_down` (its
/// first check timed out), let it answer at its phase of the check grid
/// (taken from that answer), wait for a selection. Returns the recovery
/// latency.
async fn recovery_only(
    plan: Plan,
    k: usize,
    mut server: AppServer,
    ch: Channel,
) -> Result<Samples> {
    let limit = plan.interval * 3 + Duration::from_secs(10);
    let down = poll_until(&ch, server.addr, plan.poll, limit, all_down).await?;
    let start_at = next_on_grid(
        down,
        plan.interval,
        plan.interval.mul_f64(plan.phase(k, 0)),
        Instant::now() + Duration::from_millis(1),
    );
    tokio::time::sleep_until(start_at.into()).await;
    let started = server.answer()?;
    let routed = poll_until(&ch, server.addr, plan.poll, limit, ca::selected).await?;
    server.close().await;
    Ok(Samples {
        down: Vec::new(),
        up: vec![routed - started],
    })
}

/// One application's cycles: stop answering, wait for `all_down`, answer,
/// wait for a selection (a split plan's detection half: stop answering and
/// wait only). Returns the latencies.
async fn cycles(plan: Plan, k: usize, mut server: AppServer, ch: Channel) -> Result<Samples> {
    if plan.starts_down(k) {
        return recovery_only(plan, k, server, ch).await;
    }
    let limit = plan.interval * 3 + Duration::from_secs(10);
    let mut since = Instant::now() - Duration::from_secs(3600);
    let mut out = Samples::default();
    // Until the CA shows the application up, a stop would time nothing.
    poll_until(&ch, server.addr, plan.poll, limit, ca::selected).await?;
    for c in 0..plan.cycles {
        // Phases spread over the interval across applications and cycles.
        let frac = plan.phase(k, c);
        let t = Instant::now();
        let last = loop {
            match server.last_accept() {
                Some(l) if l >= since => break l,
                _ if t.elapsed() > limit => bail!("{}: no check accepted", server.addr),
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        let stop_at = next_on_grid(
            last,
            plan.interval,
            plan.interval.mul_f64(frac),
            Instant::now(),
        );
        tokio::time::sleep_until(stop_at.into()).await;
        let stopped = if plan.refuse {
            server.close().await;
            Instant::now()
        } else {
            server.stop_answering().await?
        };
        let seen = poll_until(&ch, server.addr, plan.poll, limit, all_down).await?;
        out.down.push(seen - stopped);
        if plan.split {
            server.close().await;
            return Ok(out);
        }
        // Start again at the mirrored phase of the check grid, so
        // recoveries spread over the interval too.
        let start_at = next_on_grid(
            last,
            plan.interval,
            plan.interval.mul_f64(1.0 - frac),
            Instant::now() + Duration::from_millis(1),
        );
        tokio::time::sleep_until(start_at.into()).await;
        let started = if plan.refuse {
            server.start()?;
            Instant::now()
        } else {
            server.answer()?
        };
        let routed = poll_until(&ch, server.addr, plan.poll, limit, ca::selected).await?;
        out.up.push(routed - started);
        since = started;
    }
    server.close().await;
    Ok(out)
}

/// The segments of the plans, for the CA configuration.
fn segments(plans: &[Plan], port: u16) -> String {
    plans
        .iter()
        .map(|p| {
            let apps: Vec<String> = (0..p.apps)
                .map(|k| format!("\"127.79.{}.{}\"", p.octet, k + 1))
                .collect();
            let interval = if p.interval < Duration::from_secs(60) {
                format!("report_interval_ms = {}", p.interval.as_millis())
            } else {
                format!("report_interval_s = {}", p.interval.as_secs())
            };
            format!(
                "\n[[segments]]\nname = \"{}\"\napplications = [{}]\ntcp_ports = [\"{port}\"]\n\
                 health_reporting = \"continuous\"\n{interval}\nconnector_groups = [\"{}\"]\n",
                p.segment,
                apps.join(", "),
                ca::GROUP
            )
        })
        .collect()
}

/// Measures the plans side by side (quick: 3 applications of the 1-s plan,
/// one cycle, and 4 of the split plan with a 2-s interval standing in for
/// 60 s).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let plans: Vec<Plan> = match mode {
        Mode::Quick => vec![
            Plan {
                apps: 3,
                cycles: 1,
                ..PLAN_1S
            },
            Plan {
                interval: Duration::from_secs(2),
                apps: 4,
                ..PLAN_60S
            },
            Plan {
                apps: 3,
                cycles: 1,
                ..PLAN_1S_REFUSED
            },
        ],
        Mode::Full => vec![PLAN_1S, PLAN_60S, PLAN_1S_REFUSED],
    };
    // One port for every application: a free one on the first address.
    let port = {
        let probe = std::net::TcpListener::bind("127.79.1.1:0")?;
        probe.local_addr()?.port()
    };
    let mut servers: Vec<Vec<AppServer>> = Vec::new();
    for p in &plans {
        let mut v = Vec::new();
        for k in 0..p.apps {
            let ip = IpAddr::V4(Ipv4Addr::new(127, 79, p.octet, k as u8 + 1));
            let mut s = AppServer::new(SocketAddr::new(ip, port));
            s.start()?;
            if p.starts_down(k) {
                s.stop_answering().await?;
            }
            v.push(s);
        }
        servers.push(v);
    }
    let text = ca::config_text(&CaSetup {
        filler_segments: 0,
        ingest_apps: 0,
        ..CaSetup::default()
    }) + &segments(&plans, port);
    let (ca_server, _dir) = ca::start_text(&text).await?;

    let mut config = Config::new(ca_server.grpc_url(), "detect-1", ca::GROUP);
    config.provisioning_key = Some(ca::KEY.into());
    config.icmp = IcmpPreference::Off;
    config.state_dir =
        std::env::temp_dir().join(format!("reach-bench-{}-detect", std::process::id()));
    // Names (the `web` segment's FQDN) resolve against a loopback port where
    // nothing answers: no query leaves the machine.
    config.dns_server = Some("127.0.5.2:53".parse()?);
    let rate = config.checks_per_second;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let agent = tokio::spawn(connector_agent::run(config, async move {
        let _ = stop_rx.await;
    }));

    let channels = crate::sim::channels(&ca_server.grpc_url(), 2).await?;
    let mut tasks = Vec::new();
    for (p, group) in plans.iter().zip(servers) {
        for (k, server) in group.into_iter().enumerate() {
            let ch = channels[k % channels.len()].clone();
            tasks.push((*p, tokio::spawn(cycles(*p, k, server, ch))));
        }
    }
    let mut results: Vec<(Plan, Result<Samples>)> = Vec::new();
    for (p, t) in tasks {
        results.push((p, t.await.map_err(anyhow::Error::from).and_then(|r| r)));
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), agent).await;
    drop(ca_server);

    let mut figures = Vec::new();
    for (i, plan) in [PLAN_1S, PLAN_60S, PLAN_1S_REFUSED].iter().enumerate() {
        let specs = &SPECS[i * 4..i * 4 + 4];
        let mine: Vec<_> = results
            .iter()
            .filter(|(p, _)| p.segment == plan.segment)
            .collect();
        if mine.is_empty() {
            figures.extend(specs.iter().map(|s| s.missing("its plan did not run")));
            continue;
        }
        let mut errors = Vec::new();
        let (mut down, mut up) = (Vec::new(), Vec::new());
        for (_, r) in &mine {
            match r {
                Ok(v) => {
                    down.extend(&v.down);
                    up.extend(&v.up);
                }
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        if down.is_empty() || up.is_empty() {
            let why = format!("not measured: {}", errors.join("; "));
            figures.extend(specs.iter().map(|s| s.missing(why.clone())));
            continue;
        }
        down.sort();
        up.sort();
        let p = mine[0].0;
        // The 1-s plan's figures in ms, the 60-s plan's in s (also when a
        // shorter interval stands in for it in quick mode).
        let in_ms = plan.segment != PLAN_60S.segment;
        let unit = |d: Duration| if in_ms { ms(d) } else { d.as_secs_f64() };
        let bound = p.bound();
        let failed = if errors.is_empty() {
            String::new()
        } else {
            format!(
                "; {} applications failed: {}",
                errors.len(),
                errors.join("; ")
            )
        };
        let samples = if p.split {
            format!(
                "{} detections and {} recoveries ({} apps, half stopped answering once, half \
                 answered once from the Down their first check found)",
                down.len(),
                up.len(),
                p.apps
            )
        } else {
            format!(
                "{} samples each ({} apps × {} cycles)",
                down.len(),
                p.apps,
                p.cycles
            )
        };
        let common = format!(
            "{samples} in a continuous segment, report interval {:?}, real \
             connector-agent at {rate} checks/s, CA in a child process, Access/Resolve polled \
             every {:?}; bound = interval + check timeout {:?} + batch window {:?} + poll = \
             {:.3} s{failed}",
            p.interval,
            p.poll,
            CHECK_TIMEOUT,
            BATCH_WINDOW,
            bound.as_secs_f64(),
        );
        let max_down = quantile(&down, 1.0);
        let max_up = quantile(&up, 1.0);
        figures.push(specs[0].figure(
            unit(max_down),
            None,
            format!(
                "largest time from a server {} to the CA answering all_down ({:.1}% of the \
                 bound; min {:.3} s; all, ms: {}); {common}",
                if p.refuse {
                    "refusing (listening socket closed: each SYN reset, each check fails at once)"
                } else {
                    "no longer answering (accept queue full, SYNs dropped: each check times out)"
                },
                max_down.as_secs_f64() * 100.0 / bound.as_secs_f64(),
                quantile(&down, 0.0).as_secs_f64(),
                down.iter()
                    .map(|d| format!("{:.0}", ms(*d)))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        ));
        figures.push(specs[1].figure(
            unit(quantile(&down, 0.5)),
            None,
            format!(
                "median of the same detections (half an interval{} expected); {common}",
                if p.refuse {
                    ""
                } else {
                    " plus the check timeout"
                }
            ),
        ));
        figures.push(specs[2].figure(
            unit(max_up),
            None,
            format!(
                "largest time from a server answering again to the CA first selecting the \
                 connector for it ({:.1}% of the bound; min {:.3} s); {common}",
                max_up.as_secs_f64() * 100.0 / bound.as_secs_f64(),
                quantile(&up, 0.0).as_secs_f64(),
            ),
        ));
        figures.push(specs[3].figure(
            unit(quantile(&up, 0.5)),
            None,
            format!("median of the same recoveries; {common}"),
        ));
    }
    Ok(figures)
}
