//! The end-to-end harness: a real DNS server, real applications on loopback,
//! and the real `central-authority` and `connector-agent` binaries as
//! separate processes, driven only through their public interfaces (HTTP
//! API, config files, signals).
//!
//! Every scenario gets its own `127.N.0.0/16` block (so scenarios can run in
//! parallel without port clashes), its own directory under `target/e2e/`
//! for configs and logs, fresh processes, shortened intervals, and a hard
//! timeout; on failure the processes' logs are printed.
//!
//! The CA's store: the embedded SQLite file by default; with
//! `REACH_E2E_STORE=postgres` every scenario gets a fresh database on one
//! real PostgreSQL server (`test_support::Postgres`, started by the test
//! binary) and every CA config the harness writes names it in `[store] url`
//! (`cargo xtask e2e` runs the store-touching scenarios both ways).

/// The headless browser (shared with the benchmark).
pub use test_support::browser;
pub mod conformance;
pub mod hosts;
pub mod procs;
pub mod raw;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

pub use procs::{Proc, bin_dir, out_dir};
// The loopback DNS server, the applications and the polling helper are the
// workspace's shared test fixtures.
pub use test_support::{DnsServer, TcpApp, UdpApp, max_in_window, retry};

/// The API token every scenario's CA accepts (scopes access, read, admin).
pub const TOKEN: &str = "e2e-token-16k7POB64F4rZAEJTzOfts19";

/// A reqwest builder whose TLS runs on rustls with the ring provider
/// (installed once as the process default).
pub fn client_builder() -> reqwest::ClientBuilder {
    static PROVIDER: std::sync::Once = std::sync::Once::new();
    PROVIDER.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    reqwest::Client::builder()
}

/// A client that trusts only the roots of `root_pem` (the CA's generated
/// root; both roots during a root rotation).
pub fn tls_client(root_pem: &str) -> Result<reqwest::Client> {
    let roots = reqwest::Certificate::from_pem_bundle(root_pem.as_bytes())?;
    Ok(client_builder()
        .tls_certs_only(roots)
        .timeout(Duration::from_secs(10))
        .build()?)
}

/// Scenarios run in parallel (libtest threads) and hold this lock for
/// reading; `Scenario::run_alone` holds it for writing. (tokio's lock is fair,
/// so a waiting writer is not starved by later readers.)
static RUN_LOCK: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// One scenario's address block and directory.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Scenario name (directory and log prefix).
    pub name: String,
    /// Second octet of the scenario's `127.N.0.0/16` block.
    pub block: u8,
    /// Where configs and logs go.
    pub dir: PathBuf,
    /// The PostgreSQL database of this scenario's CA (`REACH_E2E_STORE=postgres`);
    /// `None`: the embedded SQLite file.
    pub store: Option<String>,
}

/// The store backend the scenarios run on, from `REACH_E2E_STORE`
/// (`sqlite`, the default, or `postgres`).
pub fn store_backend() -> Result<&'static str> {
    match std::env::var("REACH_E2E_STORE").as_deref() {
        Err(_) | Ok("" | "sqlite") => Ok("sqlite"),
        Ok("postgres") => Ok("postgres"),
        Ok(other) => bail!("REACH_E2E_STORE={other:?}: want \"sqlite\" or \"postgres\""),
    }
}

/// A fresh database on the test binary's one PostgreSQL server.
pub fn fresh_postgres_database() -> Result<String> {
    test_support::Postgres::shared().fresh_database()
}

/// `config` with `[store] url = store` appended (a table after the last
/// array table is valid TOML); unchanged when `store` is `None` or the
/// config names a store itself.
pub fn with_store(config: &str, store: Option<&str>) -> String {
    match store {
        Some(url) if !config.contains("\n[store]") => {
            format!("{config}\n[store]\nurl = {url:?}\n")
        }
        _ => config.to_owned(),
    }
}

impl Scenario {
    /// A scenario in block `127.block.0.0/16`.
    pub fn new(name: &str, block: u8) -> Result<Self> {
        let dir = out_dir().join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("cleaning {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir)?;
        let store = match store_backend()? {
            "postgres" => Some(fresh_postgres_database()?),
            _ => None,
        };
        Ok(Scenario {
            name: name.to_owned(),
            block,
            dir,
            store,
        })
    }

    /// `127.block.c.d`.
    pub fn ip(&self, c: u8, d: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, self.block, c, d))
    }

    /// `127.block.c.d:port`.
    pub fn addr(&self, c: u8, d: u8, port: u16) -> SocketAddr {
        SocketAddr::new(self.ip(c, d), port)
    }

    /// The CA's gRPC address.
    pub fn ca_grpc(&self) -> SocketAddr {
        self.addr(0, 1, 7443)
    }

    /// The CA's HTTP address.
    pub fn ca_http(&self) -> SocketAddr {
        self.addr(0, 1, 7480)
    }

    /// The scenario's DNS server address.
    pub fn dns(&self) -> SocketAddr {
        self.addr(0, 53, 5353)
    }

    /// Runs `body` with a hard timeout, alongside other scenarios; on
    /// failure prints every log in the scenario's directory.
    pub async fn run<F, Fut>(&self, limit: Duration, body: F) -> Result<()>
    where
        F: FnOnce(Scenario) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let _shared = RUN_LOCK.read().await;
        self.run_locked(limit, body).await
    }

    /// Like `run`, but with no other scenario running meanwhile (for
    /// timing-sensitive measurements on a small machine).
    pub async fn run_alone<F, Fut>(&self, limit: Duration, body: F) -> Result<()>
    where
        F: FnOnce(Scenario) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let _alone = RUN_LOCK.write().await;
        self.run_locked(limit, body).await
    }

    async fn run_locked<F, Fut>(&self, limit: Duration, body: F) -> Result<()>
    where
        F: FnOnce(Scenario) -> Fut,
        Fut: Future<Output = Result<()>>,
    {
        let result = match tokio::time::timeout(limit, body(self.clone())).await {
            Ok(r) => r,
            Err(_) => Err(anyhow::anyhow!("scenario timed out after {limit:?}")),
        };
        if let Err(e) = &result {
            eprintln!("==== scenario {} failed: {e:#}", self.name);
            self.print_logs();
        }
        result
    }

    /// Prints every `*.log` file of the scenario.
    pub fn print_logs(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(200)..];
                eprintln!("---- {} (last {} lines)", path.display(), tail.len());
                for line in tail {
                    eprintln!("{line}");
                }
            }
        }
    }
}

/// A running central authority.
#[derive(Debug)]
pub struct Ca {
    /// The process.
    pub proc: Proc,
    /// Its config file (rewrite + `reload()` to change policy).
    pub config: PathBuf,
    /// Its root certificate (`ca.pem` in its data directory), which
    /// connectors trust through `--ca-cert`.
    pub root: PathBuf,
    /// HTTP address.
    pub http: SocketAddr,
    /// gRPC address.
    pub grpc: SocketAddr,
    /// The PostgreSQL store its config names (written by the harness).
    store: Option<String>,
    client: reqwest::Client,
}

/// The `[server]`, `[selection]`, `[health]`, token and group sections of a
/// scenario CA config; append `[[segments]]` to it.
pub fn ca_config_head(
    sc: &Scenario,
    groups: &[&str],
    extra_health: &str,
    strategy: &str,
) -> String {
    let mut s = format!(
        r#"[server]
grpc_listen = "{grpc}"
http_listen = "{http}"
anonymous_read = false

[selection]
strategy = "{strategy}"
discovery_timeout_ms = 3000

[health]
on_access_window_s = 1800
stale_after_intervals = 3
check_budget = 6000
heartbeat_interval_ms = 1000
{extra_health}

[[api_tokens]]
name = "e2e"
token = "{TOKEN}"
scopes = ["access", "read", "admin"]
"#,
        grpc = sc.ca_grpc(),
        http = sc.ca_http(),
    );
    for g in groups {
        s.push_str(&format!(
            "\n[[connector_groups]]\nname = \"{g}\"\nprovisioning_key = \"{}\"\n",
            group_key(g)
        ));
    }
    s
}

/// The data directory of replica `i` (1-based) of a scenario's replicas;
/// replica 1's holds the root the others issue with.
pub fn replica_data_dir(sc: &Scenario, i: usize) -> PathBuf {
    sc.dir.join(format!("ca-data-{i}"))
}

/// One replica of a scenario whose replicas share a store and replica 1's
/// root, all under the name `name` (in each server certificate).
#[derive(Debug)]
pub struct Replica<'a> {
    /// Its number, 1-based.
    pub i: usize,
    /// Its gRPC and HTTP listen addresses.
    pub at: (SocketAddr, SocketAddr),
    /// The shared store's URL.
    pub store: &'a str,
    /// The name connectors dial (`[tls] server_names`).
    pub name: &'a str,
    /// The connector groups (`ca_config_head`).
    pub groups: &'a [&'a str],
    /// More `[health]` lines.
    pub extra_health: &'a str,
    /// More `[tls]` lines (one per line, each ending in a newline).
    pub tls: &'a str,
    /// Whether a replica but the first names replica 1's root as its
    /// issuer (false when `tls` names the issuer itself).
    pub first_root: bool,
}

impl Replica<'_> {
    /// `ca_config_head` on its addresses with `[tls]`, `[store]`,
    /// `[replica]` and its data directory; append groups' options and
    /// `[[segments]]` to it.
    pub fn config_head(&self, sc: &Scenario) -> String {
        let (grpc, http) = self.at;
        let i = self.i;
        let head = ca_config_head(sc, self.groups, self.extra_health, "healthy")
            .replace(&sc.ca_grpc().to_string(), &grpc.to_string())
            .replace(&sc.ca_http().to_string(), &http.to_string());
        let root = replica_data_dir(sc, 1);
        let issuer = if i == 1 || !self.first_root {
            String::new()
        } else {
            format!(
                "issuer_cert_file = {:?}\nissuer_key_file = {:?}\n",
                root.join("ca.pem").display().to_string(),
                root.join("ca.key").display().to_string()
            )
        };
        // `[tls]`, `[store]` and `[replica]` go before the first array
        // table (`[[api_tokens]]`).
        let head = head.replacen(
            "[[api_tokens]]",
            &format!(
                "[tls]\nserver_names = [\"{}\"]\n{}{issuer}\n[store]\nurl = {:?}\n\n\
                 [replica]\nid = \"ca{i}\"\n\n[[api_tokens]]",
                self.name, self.tls, self.store
            ),
            1,
        );
        head.replacen(
            "anonymous_read = false",
            &format!(
                "anonymous_read = false\ndata_dir = {:?}",
                replica_data_dir(sc, i).display().to_string()
            ),
            1,
        )
    }
}

/// The provisioning key scenarios use for group `g`.
pub fn group_key(g: &str) -> String {
    format!("key-for-{g}-pnoYuIzp7FkwOGf6Exgeq6G1")
}

impl Ca {
    /// Writes `config` and starts the CA; waits until it serves (`/healthz`
    /// ready, or still warming up: a restarted CA waits for connectors the
    /// scenario may start only after this returns).
    pub async fn start(sc: &Scenario, config: &str) -> Result<Self> {
        let path = sc.dir.join("ca.toml");
        std::fs::write(&path, with_store(config, sc.store.as_deref()))?;
        let proc = Proc::spawn(
            "ca",
            "central-authority",
            &["--config".into(), path.display().to_string()],
            &[],
            &sc.dir,
        )?;
        // The CA keeps its data next to its config (the default): a
        // restarted CA in the same scenario keeps its root and enrollments.
        let root = sc.dir.join("reach-ca-data").join("ca.pem");
        let pem = retry(Duration::from_secs(15), || async {
            Ok(std::fs::read_to_string(&root)?)
        })
        .await
        .context("the CA did not write its root certificate")?;
        let ca = Ca {
            proc,
            config: path,
            root,
            http: sc.ca_http(),
            grpc: sc.ca_grpc(),
            store: sc.store.clone(),
            client: tls_client(&pem)?,
        };
        ca.wait_serving().await?;
        Ok(ca)
    }

    /// Starts one replica of several: `config` (written to
    /// `<scenario>/<name>.toml`) names its listen addresses, which are
    /// given here too, and a `data_dir` (shared by the replicas) whose
    /// `ca.pem` is the root; the first replica started generates it.
    pub async fn start_replica(
        sc: &Scenario,
        name: &str,
        config: &str,
        http: SocketAddr,
        grpc: SocketAddr,
        data_dir: &std::path::Path,
    ) -> Result<Self> {
        Ca::start_replica_from(&bin_dir()?, sc, name, config, (http, grpc), data_dir, &[]).await
    }

    /// Like `start_replica`, running the `central-authority` in `bins`
    /// (e.g. another release's) with `args` after `--config FILE`; `at`
    /// is (HTTP, gRPC).
    pub async fn start_replica_from(
        bins: &std::path::Path,
        sc: &Scenario,
        name: &str,
        config: &str,
        at: (SocketAddr, SocketAddr),
        data_dir: &std::path::Path,
        args: &[&str],
    ) -> Result<Self> {
        let (http, grpc) = at;
        let path = sc.dir.join(format!("{name}.toml"));
        std::fs::write(&path, with_store(config, sc.store.as_deref()))?;
        let mut argv = vec!["--config".to_owned(), path.display().to_string()];
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        let proc = Proc::spawn_from(bins, name, "central-authority", &argv, &[], &sc.dir)?;
        let root = data_dir.join("ca.pem");
        let pem = retry(Duration::from_secs(15), || async {
            Ok(std::fs::read_to_string(&root)?)
        })
        .await
        .context("the CA did not write its root certificate")?;
        let ca = Ca {
            proc,
            config: path,
            root,
            http,
            grpc,
            store: sc.store.clone(),
            client: tls_client(&pem)?,
        };
        ca.wait_ready().await?;
        Ok(ca)
    }

    /// Trusts the roots of the PEM file `root` from now on (API calls and
    /// `cli`): during a root rotation, a file with both roots.
    pub fn trust(&mut self, root: &std::path::Path) -> Result<()> {
        self.client = tls_client(&std::fs::read_to_string(root)?)?;
        self.root = root.to_owned();
        Ok(())
    }

    /// Waits until `/healthz` says ready (200): the store answers and the
    /// health table is warm (every connector the store knows re-attached
    /// and reported, or `[health] warmup_ms` passed).
    pub async fn wait_ready(&self) -> Result<()> {
        retry(Duration::from_secs(30), || async {
            let (status, body) = self.healthz().await?;
            ensure!(status == 200, "healthz: {status} {body}");
            Ok(())
        })
        .await
        .context("CA did not become ready")
    }

    /// Waits until the CA serves: `/healthz` ready, or not ready only
    /// because it is warming up (connectors it knows have not re-attached).
    pub async fn wait_serving(&self) -> Result<()> {
        retry(Duration::from_secs(15), || async {
            let (status, body) = self.healthz().await?;
            ensure!(
                status == 200 || body.contains("warming_up"),
                "healthz: {status} {body}"
            );
            Ok(())
        })
        .await
        .context("CA did not start serving")
    }

    /// `GET /healthz`: status and body.
    pub async fn healthz(&self) -> Result<(u16, String)> {
        let r = self
            .client
            .get(format!("https://{}/healthz", self.http))
            .send()
            .await?;
        let status = r.status().as_u16();
        Ok((status, r.text().await?))
    }

    /// The gRPC URL connectors dial.
    pub fn url(&self) -> String {
        format!("https://{}", self.grpc)
    }

    /// Runs the operator CLI, `central-authority api --url … --ca-cert …
    /// --token-file … ARGS…`, with the scenario token: (exit code, stdout).
    pub async fn cli(&self, args: &[&str]) -> Result<(i32, String)> {
        let token = self
            .config
            .parent()
            .map_or_else(|| PathBuf::from("api-token"), |d| d.join("api-token"));
        std::fs::write(&token, TOKEN)?;
        let mut cmd = std::process::Command::new(bin_dir()?.join("central-authority"));
        cmd.arg("api")
            .arg("--url")
            .arg(format!("https://{}", self.http))
            .arg("--ca-cert")
            .arg(&self.root)
            .arg("--token-file")
            .arg(&token)
            .args(args);
        let what = format!("central-authority api {}", args.join(" "));
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await?
            .with_context(|| format!("running {what}"))?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !stderr.is_empty() {
            eprintln!("{what}: {stderr}");
        }
        Ok((
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        ))
    }

    /// A `POST` to the admin API; returns the HTTP status.
    pub async fn admin(&self, path: &str) -> Result<u16> {
        let r = self
            .client
            .post(format!("https://{}{path}", self.http))
            .bearer_auth(TOKEN)
            .send()
            .await?;
        Ok(r.status().as_u16())
    }

    /// `GET path` with the token; returns the JSON body.
    pub async fn get(&self, path: &str) -> Result<Value> {
        let r = self
            .client
            .get(format!("https://{}{path}", self.http))
            .bearer_auth(TOKEN)
            .send()
            .await?;
        let status = r.status();
        let body: Value = r
            .json()
            .await
            .with_context(|| format!("GET {path}: body"))?;
        if !status.is_success() {
            bail!("GET {path}: {status} {body}");
        }
        Ok(body)
    }

    /// `GET path` with the token; returns the body as text (e.g. `/metrics`).
    pub async fn get_text(&self, path: &str) -> Result<String> {
        let r = self
            .client
            .get(format!("https://{}{path}", self.http))
            .bearer_auth(TOKEN)
            .send()
            .await?;
        let status = r.status();
        let body = r
            .text()
            .await
            .with_context(|| format!("GET {path}: body"))?;
        if !status.is_success() {
            bail!("GET {path}: {status} {body}");
        }
        Ok(body)
    }

    /// `POST /api/v1/access`; returns the HTTP status and the JSON body.
    pub async fn access(&self, host: &str, protocol: &str, port: u16) -> Result<(u16, Value)> {
        self.access_body(&serde_json::json!({"host": host, "protocol": protocol, "port": port}))
            .await
    }

    /// `POST /api/v1/access` with `body` as it is (e.g. with a
    /// `user_location`); the status and the answer.
    pub async fn access_body(&self, body: &Value) -> Result<(u16, Value)> {
        let r = self
            .client
            .post(format!("https://{}/api/v1/access", self.http))
            .bearer_auth(TOKEN)
            .json(body)
            .send()
            .await?;
        let status = r.status().as_u16();
        let body: Value = r.json().await.context("access: body")?;
        Ok((status, body))
    }

    /// The status string (`up|unhealthy|down|unknown`) of an application as
    /// seen by one connector, or `None` when the table has no such row.
    pub async fn status(&self, app: &App, connector: &str) -> Result<Option<String>> {
        let health = self.get("/api/v1/health").await?;
        Ok(find_app(&health, app).and_then(|a| {
            a["connectors"]
                .as_array()?
                .iter()
                .find(|c| c["connector"] == connector)
                .and_then(|c| c["status"].as_str().map(str::to_owned))
        }))
    }

    /// Replaces the config file and sends SIGHUP. The file is replaced
    /// atomically (written beside it, then renamed over it), as an
    /// operator's deploy would: the CA also watches the file, and a poll
    /// that fell between a truncating write's start and end would load a
    /// truncated policy.
    pub fn reload(&self, config: &str) -> Result<()> {
        let next = self.config.with_extension("toml.next");
        std::fs::write(&next, with_store(config, self.store.as_deref()))?;
        std::fs::rename(&next, &self.config)?;
        self.proc.signal("HUP")
    }
}

/// An application key as the scenarios name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct App {
    /// Segment name.
    pub segment: String,
    /// Host (FQDN or IP literal).
    pub host: String,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// Port.
    pub port: u16,
}

impl App {
    /// Shorthand constructor.
    pub fn new(segment: &str, host: &str, protocol: &str, port: u16) -> Self {
        App {
            segment: segment.into(),
            host: host.into(),
            protocol: protocol.into(),
            port,
        }
    }
}

/// The row of `app` in a `/api/v1/health` body.
pub fn find_app<'a>(health: &'a Value, app: &App) -> Option<&'a Value> {
    health["applications"].as_array()?.iter().find(|a| {
        a["segment"] == app.segment.as_str()
            && a["host"] == app.host.as_str()
            && a["protocol"] == app.protocol.as_str()
            && a["port"] == app.port
    })
}

/// A running connector.
#[derive(Debug)]
pub struct Connector {
    /// The process.
    pub proc: Proc,
    /// Its name.
    pub name: String,
}

impl Connector {
    /// The flags that name connector `name` of `group` and point it at
    /// `ca`: its URL, the root to trust, and `<scenario>/state-<name>` for
    /// its enrollment.
    pub fn args(sc: &Scenario, ca: &Ca, name: &str, group: &str) -> Vec<String> {
        vec![
            "--ca".to_owned(),
            ca.url(),
            "--ca-cert".into(),
            ca.root.display().to_string(),
            "--state-dir".into(),
            sc.dir.join(format!("state-{name}")).display().to_string(),
            "--name".into(),
            name.into(),
            "--group".into(),
            group.into(),
        ]
    }

    /// Starts a connector of `group` against the CA URL `url` (e.g. a name
    /// that resolves to several replicas), trusting `root`, resolving
    /// through the scenario's DNS server; `extra` flags are appended.
    pub fn start_url(
        sc: &Scenario,
        url: &str,
        root: &std::path::Path,
        name: &str,
        group: &str,
        extra: &[&str],
    ) -> Result<Self> {
        Connector::start_url_from(&bin_dir()?, sc, url, root, (name, group), extra)
    }

    /// Like `start_url`, running the `connector-agent` in `bins` (e.g.
    /// another release's); `who` is (name, group).
    pub fn start_url_from(
        bins: &std::path::Path,
        sc: &Scenario,
        url: &str,
        root: &std::path::Path,
        who: (&str, &str),
        extra: &[&str],
    ) -> Result<Self> {
        let (name, group) = who;
        let mut args = vec![
            "--ca".to_owned(),
            url.to_owned(),
            "--ca-cert".into(),
            root.display().to_string(),
            "--state-dir".into(),
            sc.dir.join(format!("state-{name}")).display().to_string(),
            "--name".into(),
            name.into(),
            "--group".into(),
            group.into(),
            "--dns-server".into(),
            sc.dns().to_string(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let proc = Proc::spawn_from(
            bins,
            name,
            "connector-agent",
            &args,
            &[("REACH_PROVISIONING_KEY", group_key(group))],
            &sc.dir,
        )?;
        Ok(Connector {
            proc,
            name: name.into(),
        })
    }

    /// Starts a connector of `group` against `ca`, resolving through the
    /// scenario's DNS server. `extra` flags are appended. It trusts the
    /// CA's root and keeps its enrollment in `<scenario>/state-<name>`, so
    /// it enrolls on its first start and reuses the certificate after.
    pub fn start(sc: &Scenario, ca: &Ca, name: &str, group: &str, extra: &[&str]) -> Result<Self> {
        let mut args = Connector::args(sc, ca, name, group);
        if !extra.contains(&"--dns-server") {
            args.extend(["--dns-server".to_owned(), sc.dns().to_string()]);
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let proc = Proc::spawn(
            name,
            "connector-agent",
            &args,
            &[("REACH_PROVISIONING_KEY", group_key(group))],
            &sc.dir,
        )?;
        Ok(Connector {
            proc,
            name: name.into(),
        })
    }
}

/// Waits until `connector`'s status for `app` is `want`; returns how long
/// it took.
pub async fn wait_status(
    ca: &Ca,
    app: &App,
    connector: &str,
    want: &str,
    limit: Duration,
) -> Result<Duration> {
    let start = Instant::now();
    retry(limit, || async {
        let got = ca.status(app, connector).await?;
        if got.as_deref() == Some(want) {
            Ok(start.elapsed())
        } else {
            bail!("{connector}: {app:?} is {got:?}, want {want:?}")
        }
    })
    .await
}
