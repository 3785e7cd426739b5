//! reach against the health checkers operators already run, in one run on
//! the same loopback targets: HAProxy's server `check` (Debian's `haproxy`,
//! 2.6) and the Prometheus blackbox exporter (Debian's
//! `prometheus-blackbox-exporter`). Each peer runs as a child process with
//! a configuration generated here ([`haproxy_cfg`], [`blackbox_yml`]);
//! reach is the real `connector-agent` binary attached to a real CA (a
//! `serve-ca` child).
//!
//! - **CPU per check** at one rate: N loopback TCP listeners and N HTTP
//!   servers answering 200, each checked every 500 ms (2,000 checks/s at
//!   N = 1,000). reach's connector checks them as a continuous segment
//!   (`check = "http"` for the HTTP ones); HAProxy as one backend of N
//!   servers with `check inter 500ms rise 1 fall 1`; the exporter through
//!   `/probe?target=…&module=…` requests the driver sends at the same rate,
//!   as Prometheus would. A process's CPU is `utime + stime` from
//!   `/proc/PID/stat` over the window; the checks are the connections the
//!   targets accepted over it, so the three share one count.
//! - **Detection** at a 1-s interval, 1-s timeout, rise 1 and fall 1
//!   (reach's defaults) on both: applications that stop answering (the
//!   accept queue full: SYNs dropped, each check times out, as `detect`
//!   does) and applications that refuse (listener closed: RST), at phases
//!   spread over the interval; the time to reach's Down in the CA's table
//!   (`ListApplications`, polled) against the time to HAProxy's `DOWN` in
//!   `show stat` on its stats socket (polled alike).
//! - **Memory per target**: the RSS of the connector assigned 10,000
//!   targets minus its RSS assigned one, per target, against HAProxy's with
//!   10,000 servers and with one (a 60-s interval on both; nothing listens
//!   at those targets).
//!
//! A peer that is not installed fails its figures, naming the program.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use protocol::v1;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

use super::Spec;
use super::ca::{self, CaSetup};
use super::detect::AppServer;
use super::ha::{agent_binary, connected, scrape_checks, scratch};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::servers::Server;
use crate::stats::{median_of, ms, quantile};
use crate::sys;

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "peers_tcp_cpu_vs_haproxy",
        unit: "µs CPU/check",
        goal: Goal::RatioAtMost { ratio: 1.0 },
    },
    Spec {
        name: "peers_http_cpu_vs_haproxy",
        unit: "µs CPU/check",
        goal: Goal::RatioAtMost { ratio: 1.0 },
    },
    Spec {
        name: "peers_tcp_cpu_vs_blackbox",
        unit: "µs CPU/check",
        goal: Goal::RatioAtMost { ratio: 1.0 },
    },
    Spec {
        name: "peers_http_cpu_vs_blackbox",
        unit: "µs CPU/check",
        goal: Goal::RatioAtMost { ratio: 1.0 },
    },
    Spec {
        name: "peers_detect_silent_ms_vs_haproxy",
        unit: "ms",
        goal: Goal::RatioAtMost { ratio: 1.0 },
    },
    Spec {
        name: "peers_detect_refused_ms_vs_haproxy",
        unit: "ms",
        goal: Goal::RatioAtMost { ratio: 1.0 },
    },
    Spec {
        name: "peers_bytes_per_target_vs_haproxy",
        unit: "B/target",
        goal: Goal::Info,
    },
];

/// The CA's groups (one per kind of work, so a connector does one) and
/// their segments, of the same name.
const TCP: &str = "peers-tcp";
const HTTP: &str = "peers-http";
const DETECT: &str = "peers-detect";
const MEM_ONE: &str = "peers-mem-1";
const MEM_MANY: &str = "peers-mem";
/// The groups' provisioning key.
const PEERS_KEY: &str = "peers-bench-provisioning-key-4kQm2bX9vTzL7cPw";

/// Second octet of each kind of target's loopback addresses.
const TCP_NET: u8 = 31;
const HTTP_NET: u8 = 32;
const MEM_NET: u8 = 33;
const DETECT_NET: u8 = 34;

/// The check interval of the CPU figures, and of the memory figure.
const CPU_INTERVAL: Duration = Duration::from_millis(500);
const MEM_INTERVAL: Duration = Duration::from_secs(60);
/// Detection: reach's defaults (1-s timeout, rise 1, fall 1) at 1 s.
const DETECT_INTERVAL: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_secs(1);

/// The `k`-th target of a kind: 127.NET.x.y.
fn target_ip(net: u8, k: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, net, (k / 250) as u8, (k % 250) as u8 + 1)
}

/// The run's sizes.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    /// TCP targets, and HTTP targets.
    targets: usize,
    /// Silent applications, and refusing ones.
    detect_apps: usize,
    /// Targets of the memory figure.
    mem_targets: usize,
    trials: usize,
    warm: Duration,
    window: Duration,
    /// Settling time before an RSS reading.
    settle: Duration,
}

impl Sizes {
    fn of(mode: Mode) -> Sizes {
        Sizes {
            targets: mode.pick(100, 1000),
            detect_apps: mode.pick(2, 10),
            mem_targets: mode.pick(1000, 10_000),
            trials: mode.pick(1, 2),
            warm: mode.pick(Duration::from_millis(1500), Duration::from_secs(3)),
            window: mode.pick(Duration::from_secs(3), Duration::from_secs(10)),
            settle: mode.pick(Duration::from_secs(3), Duration::from_secs(5)),
        }
    }

    /// Checks per second of the CPU figures (each target every 500 ms).
    fn rate(&self) -> u32 {
        (self.targets as f64 / CPU_INTERVAL.as_secs_f64()) as u32
    }
}

/// TCP or HTTP targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Tcp,
    Http,
}

impl Kind {
    fn net(self) -> u8 {
        match self {
            Kind::Tcp => TCP_NET,
            Kind::Http => HTTP_NET,
        }
    }
    fn group(self) -> &'static str {
        match self {
            Kind::Tcp => TCP,
            Kind::Http => HTTP,
        }
    }
    fn module(self) -> &'static str {
        match self {
            Kind::Tcp => "tcp_connect",
            Kind::Http => "http_2xx",
        }
    }
}

/// Loopback targets of one kind on one port, counting the connections
/// they accept (every check of every checker is one).
struct Farm {
    kind: Kind,
    port: u16,
    n: usize,
    accepted: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// What an HTTP target answers, to any request.
const RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nok";

impl Farm {
    async fn start(kind: Kind, n: usize) -> Result<Farm> {
        let first = TcpListener::bind((target_ip(kind.net(), 0), 0)).await?;
        let port = first.local_addr()?.port();
        let mut listeners = vec![first];
        for k in 1..n {
            let at = SocketAddr::new(IpAddr::V4(target_ip(kind.net(), k)), port);
            listeners.push(
                TcpListener::bind(at)
                    .await
                    .with_context(|| format!("binding target {at}"))?,
            );
        }
        let accepted = Arc::new(AtomicU64::new(0));
        let tasks = listeners
            .into_iter()
            .map(|l| {
                let accepted = accepted.clone();
                tokio::spawn(async move {
                    while let Ok((s, _)) = l.accept().await {
                        accepted.fetch_add(1, Ordering::Relaxed);
                        if kind == Kind::Http {
                            tokio::spawn(answer(s));
                        }
                    }
                })
            })
            .collect();
        Ok(Farm {
            kind,
            port,
            n,
            accepted,
            tasks,
        })
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        (0..self.n)
            .map(|k| SocketAddr::new(IpAddr::V4(target_ip(self.kind.net(), k)), self.port))
            .collect()
    }

    fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Farm {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Reads one request head (up to its blank line) and answers 200.
async fn answer(mut s: tokio::net::TcpStream) {
    let mut buf = [0u8; 2048];
    let mut len = 0;
    let read = async {
        while len < buf.len() {
            match s.read(&mut buf[len..]).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => len += n,
            }
            if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                return true;
            }
        }
        false
    };
    if let Ok(true) = tokio::time::timeout(Duration::from_secs(2), read).await {
        let _ = s.write_all(RESPONSE).await;
        let _ = s.shutdown().await;
    }
}

/// A program of a peer: on `PATH` or in the Debian directories.
fn program(name: &str, package: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow!(
                "{name} is not installed: install Debian's `{package}` package \
                 (`apt-get install {package}`; .ci/run does)"
            )
        })
}

/// One HAProxy backend: its servers and whether they are checked by HTTP.
#[derive(Clone, Debug)]
pub struct Backend {
    /// Its name.
    pub name: String,
    /// `option httpchk GET /`, `http-check expect status 200`.
    pub http: bool,
    /// The servers (`name`, address).
    pub servers: Vec<(String, SocketAddr)>,
}

/// HAProxy's configuration: a stats socket at `socket`, every server
/// checked every `inter` with the 1-s timeout and rise 1, fall 1 (reach's
/// defaults); no frontend (nothing is proxied, only checked).
pub fn haproxy_cfg(socket: &Path, inter: Duration, backends: &[Backend]) -> String {
    let ms = inter.as_millis();
    let timeout = TIMEOUT.as_millis();
    let mut s = format!(
        "global\n    stats socket {} mode 600 level admin\n    stats timeout 30s\n\n\
         defaults\n    mode tcp\n    timeout connect {timeout}ms\n    timeout check {timeout}ms\n    \
         timeout client 30s\n    timeout server 30s\n",
        socket.display()
    );
    for b in backends {
        s.push_str(&format!("\nbackend {}\n", b.name));
        if b.http {
            s.push_str("    option httpchk GET /\n    http-check expect status 200\n");
        }
        s.push_str(&format!(
            "    default-server check inter {ms}ms fastinter {ms}ms downinter {ms}ms rise 1 fall 1\n"
        ));
        for (name, addr) in &b.servers {
            s.push_str(&format!("    server {name} {addr}\n"));
        }
    }
    s
}

/// The blackbox exporter's configuration: `tcp_connect` and `http_2xx`
/// with the 1-s timeout, IPv4.
pub fn blackbox_yml() -> String {
    let t = TIMEOUT.as_secs();
    format!(
        "modules:\n  tcp_connect:\n    prober: tcp\n    timeout: {t}s\n    tcp:\n      \
         preferred_ip_protocol: ip4\n  http_2xx:\n    prober: http\n    timeout: {t}s\n    \
         http:\n      preferred_ip_protocol: ip4\n      valid_status_codes: [200]\n"
    )
}

/// A peer's process; killed when dropped.
struct Peer {
    child: Child,
    /// HAProxy's stats socket (the exporter's directory).
    socket: PathBuf,
}

impl Peer {
    fn pid(&self) -> Result<u32> {
        self.child
            .id()
            .ok_or_else(|| anyhow!("the peer has exited"))
    }

    /// `haproxy -f CFG -db` with `backends`; returns once its stats socket
    /// answers.
    async fn haproxy(tag: &str, inter: Duration, backends: &[Backend]) -> Result<Peer> {
        let bin = program("haproxy", "haproxy")?;
        let dir = scratch(&format!("haproxy-{tag}"))?;
        let socket = dir.join("stats.sock");
        let _ = std::fs::remove_file(&socket);
        let cfg = dir.join("haproxy.cfg");
        std::fs::write(&cfg, haproxy_cfg(&socket, inter, backends))?;
        let child = Command::new(bin)
            .arg("-f")
            .arg(&cfg)
            .arg("-db")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting haproxy")?;
        let mut peer = Peer { child, socket };
        ca::wait_until(Duration::from_secs(30), "haproxy's stats socket", || {
            let socket = peer.socket.clone();
            async move { Ok(haproxy_stat(&socket).await.is_ok()) }
        })
        .await?;
        if let Some(status) = peer.child.try_wait()? {
            bail!("haproxy exited: {status} (configuration {})", cfg.display());
        }
        Ok(peer)
    }

    /// `prometheus-blackbox-exporter` on `addr`; returns once healthy.
    async fn blackbox(addr: SocketAddr) -> Result<Peer> {
        let bin = program(
            "prometheus-blackbox-exporter",
            "prometheus-blackbox-exporter",
        )?;
        let dir = scratch("blackbox")?;
        let yml = dir.join("blackbox.yml");
        std::fs::write(&yml, blackbox_yml())?;
        let child = Command::new(bin)
            .arg(format!("--config.file={}", yml.display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting prometheus-blackbox-exporter")?;
        let http = reqwest::Client::new();
        let url = format!("http://{addr}/-/healthy");
        ca::wait_until(Duration::from_secs(30), "the blackbox exporter", || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                Ok(http
                    .get(&url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success()))
            }
        })
        .await?;
        Ok(Peer { child, socket: dir })
    }
}

/// `show stat` on HAProxy's stats socket: server name → status (`UP`,
/// `DOWN`, …) of every server.
async fn haproxy_stat(socket: &Path) -> Result<HashMap<String, String>> {
    let mut s = tokio::net::UnixStream::connect(socket).await?;
    s.write_all(b"show stat\n").await?;
    let mut text = String::new();
    s.read_to_string(&mut text).await?;
    Ok(parse_stat(&text))
}

/// The `svname` → `status` columns of `show stat`'s CSV (servers only).
fn parse_stat(text: &str) -> HashMap<String, String> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .trim_start_matches("# ")
        .split(',')
        .collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (Some(sv), Some(st)) = (col("svname"), col("status")) else {
        return HashMap::new();
    };
    lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let name = *f.get(sv)?;
            (name != "FRONTEND" && name != "BACKEND")
                .then(|| (name.to_owned(), f.get(st).copied().unwrap_or("").to_owned()))
        })
        .collect()
}

/// The CA's groups and segments of the figures.
fn ca_sections(tcp: &Farm, http: &Farm, detect: &[SocketAddr], mem: (u16, usize)) -> String {
    let list = |addrs: &mut dyn Iterator<Item = IpAddr>| {
        addrs
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let segment = |name: &str, apps: String, port: u16, interval: Duration, extra: &str| {
        format!(
            "\n[[connector_groups]]\nname = \"{name}\"\nprovisioning_key = \"{PEERS_KEY}\"\n\
             max_uses = 1000000\n\n[[segments]]\nname = \"{name}\"\napplications = [{apps}]\n\
             tcp_ports = [\"{port}\"]\nhealth_reporting = \"continuous\"\n\
             report_interval_ms = {}\nconnector_groups = [\"{name}\"]\n{extra}",
            interval.as_millis()
        )
    };
    let detect_port = detect.first().map_or(0, SocketAddr::port);
    [
        segment(
            TCP,
            list(&mut tcp.addrs().iter().map(|a| a.ip())),
            tcp.port,
            CPU_INTERVAL,
            "",
        ),
        segment(
            HTTP,
            list(&mut http.addrs().iter().map(|a| a.ip())),
            http.port,
            CPU_INTERVAL,
            "check = \"http\"\ncheck_path = \"/\"\ncheck_expect = \"200\"\n",
        ),
        segment(
            DETECT,
            list(&mut detect.iter().map(|a| a.ip())),
            detect_port,
            DETECT_INTERVAL,
            "",
        ),
        segment(
            MEM_ONE,
            list(&mut std::iter::once(IpAddr::V4(target_ip(MEM_NET, 0)))),
            mem.0,
            MEM_INTERVAL,
            "",
        ),
        segment(
            MEM_MANY,
            list(&mut (0..mem.1).map(|k| IpAddr::V4(target_ip(MEM_NET, k)))),
            mem.0,
            MEM_INTERVAL,
            "",
        ),
    ]
    .concat()
}

/// The real connector in `group`, attached to the CA; killed when dropped.
struct Agent {
    child: Child,
    metrics: String,
}

impl Agent {
    async fn start(ca: &Server, group: &str, name: &str, rate: u32) -> Result<Agent> {
        let state = scratch(&format!("agent-{name}"))?;
        let metrics = test_support::free_port()?;
        let mut child = Command::new(agent_binary()?)
            .args(["--ca", &ca.grpc_url(), "--name", name, "--group", group])
            .args(["--icmp", "off"])
            .arg("--state-dir")
            .arg(&state)
            .args(["--checks-per-second", &rate.to_string()])
            .args(["--max-checks-per-second", &rate.to_string()])
            // The targets are IP literals; nothing is resolved by name.
            .args(["--dns-server", "127.0.5.2:53"])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
            .env("REACH_PROVISIONING_KEY", PEERS_KEY)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting connector-agent")?;
        let http = reqwest::Client::new();
        let base = format!("http://{}", ca.http);
        ca::wait_until(Duration::from_secs(30), "the connector to attach", || {
            let (http, base, name) = (http.clone(), base.clone(), name.to_owned());
            async move { connected(&http, &base, &name).await }
        })
        .await?;
        if let Some(status) = child.try_wait()? {
            bail!("connector-agent exited: {status}");
        }
        Ok(Agent {
            child,
            metrics: format!("http://127.0.0.1:{metrics}/metrics"),
        })
    }

    fn pid(&self) -> Result<u32> {
        self.child
            .id()
            .ok_or_else(|| anyhow!("connector-agent has exited"))
    }
}

/// CPU and checks of one process over one window.
#[derive(Clone, Copy, Debug)]
struct Window {
    cpu_s: f64,
    checks: u64,
    secs: f64,
    /// The checks are the configured schedule's, not counted.
    scheduled: bool,
}

impl Window {
    fn us_per_check(&self) -> f64 {
        self.cpu_s * 1e6 / self.checks.max(1) as f64
    }
    fn rate(&self) -> f64 {
        self.checks as f64 / self.secs.max(f64::MIN_POSITIVE)
    }
}

/// After `warm`, `pid`'s CPU and `farm`'s accepted connections over `window`.
async fn measure(pid: u32, farm: &Farm, s: &Sizes) -> Result<Window> {
    tokio::time::sleep(s.warm).await;
    let (c0, a0, t0) = (sys::cpu_time(Some(pid)), farm.accepted(), Instant::now());
    tokio::time::sleep(s.window).await;
    let (c1, a1, secs) = (
        sys::cpu_time(Some(pid)),
        farm.accepted(),
        t0.elapsed().as_secs_f64(),
    );
    if !Path::new(&format!("/proc/{pid}")).exists() {
        bail!("process {pid} exited during the window");
    }
    Ok(Window {
        cpu_s: c1.saturating_sub(c0).as_secs_f64(),
        checks: a1.saturating_sub(a0),
        secs,
        scheduled: false,
    })
}

/// Sends `/probe` requests for `farm`'s targets to the exporter at `rate`
/// (at most 512 in flight) until dropped.
struct Prober {
    task: tokio::task::JoinHandle<()>,
}

impl Prober {
    fn start(exporter: SocketAddr, farm: &Farm, rate: u32) -> Prober {
        let module = farm.kind.module();
        let urls: Arc<Vec<String>> = Arc::new(
            farm.addrs()
                .iter()
                .map(|a| {
                    let target = match farm.kind {
                        Kind::Tcp => a.to_string(),
                        Kind::Http => format!("http://{a}/"),
                    };
                    format!("http://{exporter}/probe?target={target}&module={module}")
                })
                .collect(),
        );
        let task = tokio::spawn(async move {
            let http = reqwest::Client::new();
            let permits = Arc::new(tokio::sync::Semaphore::new(512));
            let t0 = Instant::now();
            let mut sent = 0u64;
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let due = (t0.elapsed().as_secs_f64() * f64::from(rate)) as u64;
                while sent < due {
                    let Ok(permit) = permits.clone().try_acquire_owned() else {
                        break;
                    };
                    let url = urls[sent as usize % urls.len()].clone();
                    let http = http.clone();
                    tokio::spawn(async move {
                        let _ = http.get(url).send().await.map(|r| r.bytes());
                        drop(permit);
                    });
                    sent += 1;
                }
                sent = sent.max(due);
            }
        });
        Prober { task }
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One CPU trial of each checker on `farm`, the order reversed on odd trials.
async fn cpu_trial(
    ca: &Server,
    farm: &Farm,
    s: &Sizes,
    trial: usize,
    exporter: &Result<(Peer, SocketAddr)>,
) -> [Result<Window>; 3] {
    let mut out = [
        Err(anyhow!("not run")),
        Err(anyhow!("not run")),
        Err(anyhow!("not run")),
    ];
    let order: [usize; 3] = if trial.is_multiple_of(2) {
        [0, 1, 2]
    } else {
        [2, 1, 0]
    };
    for which in order {
        out[which] = match which {
            0 => reach_cpu(ca, farm, s, trial).await,
            1 => haproxy_cpu(farm, s).await,
            _ => match exporter {
                Ok((peer, addr)) => blackbox_cpu(peer, *addr, farm, s).await,
                Err(e) => Err(anyhow!("{e:#}")),
            },
        };
    }
    out
}

async fn reach_cpu(ca: &Server, farm: &Farm, s: &Sizes, trial: usize) -> Result<Window> {
    let name = format!("{}-{trial}", farm.kind.group());
    let agent = Agent::start(ca, farm.kind.group(), &name, s.rate() * 2).await?;
    let http = reqwest::Client::new();
    let before = scrape_checks(&http, &agent.metrics).await?;
    let w = measure(agent.pid()?, farm, s).await?;
    let after = scrape_checks(&http, &agent.metrics).await?;
    if after <= before {
        bail!("the connector finished no checks");
    }
    Ok(w)
}

async fn haproxy_cpu(farm: &Farm, s: &Sizes) -> Result<Window> {
    let backend = Backend {
        name: farm.kind.group().to_owned(),
        http: farm.kind == Kind::Http,
        servers: farm
            .addrs()
            .into_iter()
            .enumerate()
            .map(|(k, a)| (format!("s{k}"), a))
            .collect(),
    };
    let peer = Peer::haproxy(farm.kind.group(), CPU_INTERVAL, &[backend]).await?;
    let w = measure(peer.pid()?, farm, s).await?;
    if farm.kind == Kind::Http {
        return Ok(w);
    }
    // A TCP check of HAProxy never reaches accept(): it resets the
    // connection at the SYN-ACK. Its timer-driven schedule (as exact as
    // its HTTP checks show) gives the count.
    Ok(Window {
        checks: (farm.n as f64 * w.secs / CPU_INTERVAL.as_secs_f64()) as u64,
        scheduled: true,
        ..w
    })
}

async fn blackbox_cpu(peer: &Peer, addr: SocketAddr, farm: &Farm, s: &Sizes) -> Result<Window> {
    let _load = Prober::start(addr, farm, s.rate());
    measure(peer.pid()?, farm, s).await
}

/// The CPU figures of one kind: reach against HAProxy and the exporter.
fn cpu_figures(kind: Kind, s: &Sizes, runs: &[[Result<Window>; 3]]) -> Vec<Figure> {
    let (vs_haproxy, vs_blackbox) = match kind {
        Kind::Tcp => (SPECS[0], SPECS[2]),
        Kind::Http => (SPECS[1], SPECS[3]),
    };
    let ok = |i: usize| -> Result<Vec<Window>> {
        runs.iter()
            .map(|r| r[i].as_ref().copied().map_err(|e| anyhow!("{e:#}")))
            .collect()
    };
    let describe = |w: &[Window]| {
        w.iter()
            .map(|w| {
                format!(
                    "{:.2} s CPU, {} checks{} in {:.1} s ({:.0}/s)",
                    w.cpu_s,
                    w.checks,
                    if w.scheduled {
                        " (scheduled: HAProxy resets a TCP check at the SYN-ACK, so the \
                         target never accepts it)"
                    } else {
                        ""
                    },
                    w.secs,
                    w.rate()
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let what = match kind {
        Kind::Tcp => "TCP connect",
        Kind::Http => "HTTP GET / answered 200",
    };
    let setup = format!(
        "CPU (utime + stime, /proc/PID/stat) per check over {:.0}-s windows after {:.1} s of \
         warm-up, {} trial(s), medians; {} loopback targets ({what}) each checked every {} ms \
         ({}/s), checks counted as connections the targets accepted",
        s.window.as_secs_f64(),
        s.warm.as_secs_f64(),
        s.trials,
        s.targets,
        CPU_INTERVAL.as_millis(),
        s.rate()
    );
    let reach = match ok(0) {
        Ok(r) => r,
        Err(e) => {
            let why = format!("not measured: connector: {e:#}");
            return vec![vs_haproxy.missing(why.clone()), vs_blackbox.missing(why)];
        }
    };
    let value = median_of(&reach, Window::us_per_check);
    let one = |spec: Spec, i: usize, peer: &str| match ok(i) {
        Ok(p) => spec.figure(
            value,
            Some(median_of(&p, Window::us_per_check)),
            format!(
                "value: the connector-agent binary attached to the CA (a continuous segment); \
                 baseline: {peer}; {setup}; connector: {}; {peer}: {}",
                describe(&reach),
                describe(&p)
            ),
        ),
        Err(e) => spec.missing(format!("not measured: {peer}: {e:#}")),
    };
    vec![
        one(
            vs_haproxy,
            1,
            "haproxy (one backend, server `check inter 500ms rise 1 fall 1`)",
        ),
        one(
            vs_blackbox,
            2,
            "prometheus-blackbox-exporter (the driver sends /probe requests at the rate; the \
             exporter's CPU only)",
        ),
    ]
}

/// The CPU figures: alternating trials on both kinds.
async fn cpu(ca: &Server, tcp: &Farm, http: &Farm, s: &Sizes) -> Result<Vec<Figure>> {
    let exporter = async {
        let addr: SocketAddr = ([127, 0, 0, 1], test_support::free_port()?).into();
        Ok::<_, anyhow::Error>((Peer::blackbox(addr).await?, addr))
    }
    .await;
    let (mut tcp_runs, mut http_runs) = (Vec::new(), Vec::new());
    for trial in 0..s.trials {
        tcp_runs.push(cpu_trial(ca, tcp, s, trial, &exporter).await);
        http_runs.push(cpu_trial(ca, http, s, trial, &exporter).await);
    }
    let mut figures = cpu_figures(Kind::Tcp, s, &tcp_runs);
    figures.extend(cpu_figures(Kind::Http, s, &http_runs));
    // The connector's and HAProxy's figures come first in SPECS.
    figures.sort_by_key(|f| SPECS.iter().position(|s| s.name == f.name));
    Ok(figures)
}

/// The detection applications: silent ones then refusing ones.
struct DetectApps {
    servers: Vec<AppServer>,
    n: usize,
    port: u16,
}

impl DetectApps {
    fn start(n: usize, port: u16) -> Result<DetectApps> {
        let mut servers = Vec::new();
        for k in 0..2 * n {
            let mut s = AppServer::new(SocketAddr::new(IpAddr::V4(target_ip(DETECT_NET, k)), port));
            s.start()?;
            servers.push(s);
        }
        Ok(DetectApps { servers, n, port })
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        (0..2 * self.n)
            .map(|k| SocketAddr::new(IpAddr::V4(target_ip(DETECT_NET, k)), self.port))
            .collect()
    }
}

/// The CA's statuses of the detection segment: host → status.
async fn ca_statuses(ch: &tonic::transport::Channel) -> Result<HashMap<String, i32>> {
    let mut client = v1::health_query_client::HealthQueryClient::new(ch.clone());
    let list = client
        .list_applications(ca::authorized(v1::ListApplicationsRequest {
            segment: DETECT.to_owned(),
            page: 0,
            per_page: 0,
        })?)
        .await?
        .into_inner();
    Ok(list
        .applications
        .into_iter()
        .filter_map(|a| Some((a.app?.host, a.status)))
        .collect())
}

/// Both checkers' detection latencies: (silent, refused) for each.
type Detections = [Vec<Duration>; 4];

/// Detection: the connector and HAProxy check the same applications; each
/// fails at its phase of the interval; both tables are polled every 10 ms.
async fn detection(ca: &Server, apps: DetectApps) -> Result<Detections> {
    let addrs = apps.addrs();
    let n = apps.n;
    let backend = Backend {
        name: DETECT.to_owned(),
        http: false,
        servers: addrs
            .iter()
            .enumerate()
            .map(|(k, a)| (format!("d{k}"), *a))
            .collect(),
    };
    let haproxy = Peer::haproxy(DETECT, DETECT_INTERVAL, &[backend]).await?;
    let _agent = Agent::start(ca, DETECT, "peers-detect-0", 100).await?;
    let ch = crate::sim::channels(&ca.grpc_url(), 1)
        .await?
        .pop()
        .ok_or_else(|| anyhow!("no channel"))?;
    let hosts: Vec<String> = addrs.iter().map(|a| a.ip().to_string()).collect();
    let up = v1::HealthStatus::Up as i32;
    ca::wait_until(
        Duration::from_secs(30),
        "every application up in both",
        || {
            let (ch, socket, hosts) = (ch.clone(), haproxy.socket.clone(), hosts.clone());
            async move {
                let (c, h) = (ca_statuses(&ch).await?, haproxy_stat(&socket).await?);
                Ok((0..hosts.len()).all(|k| {
                    c.get(&hosts[k]) == Some(&up)
                        && h.get(&format!("d{k}")).is_some_and(|s| s.starts_with("UP"))
                }))
            }
        },
    )
    .await?;
    // Each application fails at its own phase of the next interval.
    let events = Arc::new(std::sync::Mutex::new(vec![None::<Instant>; 2 * n]));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (k, mut server) in apps.servers.into_iter().enumerate() {
        let events = events.clone();
        let at = t0 + DETECT_INTERVAL.mul_f64((k as f64 + 0.5) / (2 * n) as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let when = if k < n {
                server.stop_answering().await?
            } else {
                server.close().await;
                Instant::now()
            };
            if let Ok(mut e) = events.lock() {
                e[k] = Some(when);
            }
            Ok::<_, anyhow::Error>(server)
        }));
    }
    let seen = poll_down(&ch, &haproxy.socket, &hosts, &events).await;
    let mut servers = Vec::new();
    for t in tasks {
        servers.push(t.await??);
    }
    for s in &mut servers {
        s.close().await;
    }
    let [reach, peer] = seen?;
    let split = |v: &[Duration]| -> [Vec<Duration>; 2] {
        let (mut a, mut b) = (v[..n].to_vec(), v[n..].to_vec());
        a.sort();
        b.sort();
        [a, b]
    };
    let ([rs, rr], [hs, hr]) = (split(&reach), split(&peer));
    Ok([rs, hs, rr, hr])
}

/// Polls both tables every 10 ms until each shows every failed
/// application down; the latencies from each failure, per checker.
async fn poll_down(
    ch: &tonic::transport::Channel,
    socket: &Path,
    hosts: &[String],
    events: &std::sync::Mutex<Vec<Option<Instant>>>,
) -> Result<[Vec<Duration>; 2]> {
    let down = v1::HealthStatus::Down as i32;
    let mut seen: [Vec<Option<Duration>>; 2] = [vec![None; hosts.len()], vec![None; hosts.len()]];
    let limit = Instant::now() + DETECT_INTERVAL * 4 + TIMEOUT + Duration::from_secs(10);
    loop {
        let (c, h) = (ca_statuses(ch).await?, haproxy_stat(socket).await?);
        let now = Instant::now();
        let fired: Vec<Option<Instant>> = events.lock().map_err(|_| anyhow!("poisoned"))?.clone();
        for (k, e) in fired.iter().enumerate() {
            let Some(e) = e else { continue };
            if seen[0][k].is_none() && c.get(&hosts[k]) == Some(&down) {
                seen[0][k] = Some(now.saturating_duration_since(*e));
            }
            if seen[1][k].is_none()
                && h.get(&format!("d{k}"))
                    .is_some_and(|s| s.starts_with("DOWN"))
            {
                seen[1][k] = Some(now.saturating_duration_since(*e));
            }
        }
        if seen.iter().all(|s| s.iter().all(Option::is_some)) {
            return Ok(seen.map(|s| s.into_iter().flatten().collect()));
        }
        if now > limit {
            bail!(
                "not every failure seen within the limit (connector: {:?}; haproxy: {:?})",
                seen[0],
                seen[1]
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn detect_figures(d: &Detections, n: usize) -> Vec<Figure> {
    let ms_list = |v: &[Duration]| {
        v.iter()
            .map(|d| format!("{:.0}", ms(*d)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let one = |spec: Spec, reach: &[Duration], peer: &[Duration], how: &str| {
        spec.figure(
            ms(quantile(reach, 0.5)),
            Some(ms(quantile(peer, 0.5))),
            format!(
                "median time from {n} applications {how} (at phases spread over the interval) \
                 to reach's Down in the CA's table (ListApplications polled every 10 ms; value, \
                 max {:.0} ms) against HAProxy's DOWN in `show stat` on its stats socket (polled \
                 alike; baseline, max {:.0} ms); both at a 1-s interval, 1-s timeout, rise 1, \
                 fall 1; connector: {} ms; haproxy: {} ms",
                ms(quantile(reach, 1.0)),
                ms(quantile(peer, 1.0)),
                ms_list(reach),
                ms_list(peer)
            ),
        )
    };
    vec![
        one(
            SPECS[4],
            &d[0],
            &d[1],
            "stopping answering (accept queue full: SYNs dropped, each check times out)",
        ),
        one(
            SPECS[5],
            &d[2],
            &d[3],
            "refusing (listener closed: the handshake answered RST)",
        ),
    ]
}

/// RSS of the connector and of HAProxy with one target and with `n`.
async fn memory(ca: &Server, port: u16, s: &Sizes) -> Result<Figure> {
    let n = s.mem_targets;
    let mut reach = Vec::new();
    for (group, name) in [(MEM_ONE, "peers-mem-1"), (MEM_MANY, "peers-mem-n")] {
        let agent = Agent::start(ca, group, name, 1000).await?;
        tokio::time::sleep(s.settle).await;
        reach.push(sys::rss_bytes(Some(agent.pid()?)));
    }
    let mut peer = Vec::new();
    for count in [1, n] {
        let backend = Backend {
            name: "mem".to_owned(),
            http: false,
            servers: (0..count)
                .map(|k| {
                    let a = SocketAddr::new(IpAddr::V4(target_ip(MEM_NET, k)), port);
                    (format!("m{k}"), a)
                })
                .collect(),
        };
        let haproxy = Peer::haproxy(&format!("mem-{count}"), MEM_INTERVAL, &[backend]).await?;
        tokio::time::sleep(s.settle).await;
        peer.push(sys::rss_bytes(Some(haproxy.pid()?)));
    }
    let per = |v: &[u64]| v[1].saturating_sub(v[0]) as f64 / (n - 1) as f64;
    let mib = |b: u64| b as f64 / 1048576.0;
    Ok(SPECS[6].figure(
        per(&reach),
        Some(per(&peer)),
        format!(
            "RSS growth per target from 1 to {n} targets (loopback addresses where nothing \
             listens, checked every {} s), read {:.0} s after start: connector-agent attached \
             to the CA {:.1} → {:.1} MiB (value); haproxy, one backend of as many servers \
             with `check` {:.1} → {:.1} MiB (baseline)",
            MEM_INTERVAL.as_secs(),
            s.settle.as_secs_f64(),
            mib(reach[0]),
            mib(reach[1]),
            mib(peer[0]),
            mib(peer[1]),
        ),
    ))
}

/// Measures every figure (quick: 100 targets, 2 + 2 detections, 1,000
/// targets for memory, short windows).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let s = Sizes::of(mode);
    let tcp = Farm::start(Kind::Tcp, s.targets).await?;
    let http = Farm::start(Kind::Http, s.targets).await?;
    let detect_port = {
        let probe = std::net::TcpListener::bind((target_ip(DETECT_NET, 0), 0))?;
        probe.local_addr()?.port()
    };
    let apps = DetectApps::start(s.detect_apps, detect_port)?;
    // Nothing listens there: the port of a listener just closed.
    let mem_port = {
        let probe = std::net::TcpListener::bind((target_ip(MEM_NET, 0), 0))?;
        probe.local_addr()?.port()
    };
    let text = ca::config_text(&CaSetup {
        filler_segments: 0,
        ingest_apps: 0,
        ..CaSetup::default()
    }) + &ca_sections(&tcp, &http, &apps.addrs(), (mem_port, s.mem_targets));
    let (ca_server, _dir) = ca::start_text(&text).await?;
    let mut figures = part(&SPECS[..4], cpu(&ca_server, &tcp, &http, &s).await);
    drop((tcp, http));
    let n = apps.n;
    figures.extend(part(
        &SPECS[4..6],
        detection(&ca_server, apps)
            .await
            .map(|d| detect_figures(&d, n)),
    ));
    figures.extend(part(
        &SPECS[6..],
        memory(&ca_server, mem_port, &s).await.map(|f| vec![f]),
    ));
    Ok(figures)
}

/// The figures of `specs`, or each missing with `result`'s error.
fn part(specs: &[Spec], result: Result<Vec<Figure>>) -> Vec<Figure> {
    match result {
        Ok(f) => f,
        Err(e) => {
            eprintln!("reach-bench: peers: {e:#}");
            specs
                .iter()
                .map(|s| s.missing(format!("not measured: {e:#}")))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn show_stat_gives_every_servers_status() {
        let text = "# pxname,svname,qcur,status,weight\n\
            detect,d0,0,UP,1\n\
            detect,d1,0,DOWN,1\n\
            detect,BACKEND,0,UP,2\n\n";
        let m = parse_stat(text);
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(m["d0"], "UP");
        assert_eq!(m["d1"], "DOWN");
        assert!(parse_stat("").is_empty());
    }

    #[test]
    fn the_generated_configurations_name_every_server_and_module() {
        let addr: SocketAddr = "127.31.0.1:9000".parse().expect("addr");
        let cfg = haproxy_cfg(
            Path::new("/tmp/s.sock"),
            Duration::from_millis(500),
            &[Backend {
                name: "b".into(),
                http: true,
                servers: vec![("s0".into(), addr)],
            }],
        );
        assert!(cfg.contains("stats socket /tmp/s.sock"), "{cfg}");
        assert!(cfg.contains("inter 500ms"), "{cfg}");
        assert!(cfg.contains("rise 1 fall 1"), "{cfg}");
        assert!(cfg.contains("option httpchk GET /"), "{cfg}");
        assert!(cfg.contains("server s0 127.31.0.1:9000"), "{cfg}");
        let yml = blackbox_yml();
        assert!(
            yml.contains("tcp_connect:") && yml.contains("http_2xx:"),
            "{yml}"
        );
    }
}
