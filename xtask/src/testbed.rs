//! The system `cargo xtask schemathesis` runs against: the real
//! `central-authority` (debug build) on loopback, one real
//! `connector-agent` enrolled to it with its group's provisioning key, and
//! a TCP application on 127.0.0.1 that the policy names, so that
//! `POST /api/v1/access` for it answers 200. Everything is stopped when the
//! [`Testbed`] is dropped, on success and on every error path.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::target_dir;

/// The connector group of the run, its provisioning key and the connector.
const GROUP: &str = "dc-east";
const GROUP_KEY: &str = "schemathesis-key-east-B0osmy39tFGyyrktfUA4bq08";
const CONNECTOR: &str = "schemathesis-connector-1";

/// A CA, a connector and an application, stopped on drop.
pub struct Testbed {
    /// The CA's HTTP API.
    pub http: SocketAddr,
    /// The application's address (`127.0.0.1:port`).
    pub app: SocketAddr,
    dir: PathBuf,
    data: PathBuf,
    token: String,
    /// Children in start order; killed in reverse.
    children: Vec<(&'static str, Child)>,
}

/// A port free on 127.0.0.1 (bound, read, released; nothing else races here).
fn free_port() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The application: accepts and closes every connection, on its own thread
/// for the life of the process (xtask exits after the run).
fn start_app() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding the application")?;
    let addr = listener.local_addr()?;
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            drop(conn);
        }
    });
    Ok(addr)
}

fn ca_config(
    grpc: SocketAddr,
    http: SocketAddr,
    data: &Path,
    token: &str,
    app: SocketAddr,
) -> String {
    format!(
        r#"# Written by `cargo xtask schemathesis`.
[server]
grpc_listen = "{grpc}"
http_listen = "{http}"
data_dir = "{data}"

[[api_tokens]]
name = "schemathesis"
token = "{token}"
scopes = ["admin"]

[[connector_groups]]
name = "{GROUP}"
provisioning_key = "{GROUP_KEY}"

# The only segment: an application that listens, checked by the connector.
[[segments]]
name = "loopback-app"
applications = ["{ip}"]
tcp_ports = ["{port}"]
health_reporting = "continuous"
report_interval_s = 1
connector_groups = ["{GROUP}"]
"#,
        data = data.display(),
        ip = app.ip(),
        port = app.port(),
    )
}

impl Testbed {
    /// Starts the application, the CA (waits for its root and listener)
    /// and the connector, in `dir`.
    pub fn start(dir: &Path, token: &str) -> Result<Testbed> {
        let data = dir.join("ca-data");
        let _ = std::fs::remove_dir_all(&data);
        let _ = std::fs::remove_dir_all(dir.join("connector-state"));
        std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
        let app = start_app()?;
        let (http, grpc) = (free_port()?, free_port()?);
        let config = dir.join("ca.toml");
        std::fs::write(&config, ca_config(grpc, http, &data, token, app))?;
        let mut bed = Testbed {
            http,
            app,
            dir: dir.to_path_buf(),
            data,
            token: token.to_owned(),
            children: Vec::new(),
        };
        let mut ca = Command::new(target_dir().join("debug").join("central-authority"));
        ca.arg("--config").arg(&config);
        bed.spawn("ca", ca)?;
        bed.wait_ca()?;
        let mut connector = Command::new(target_dir().join("debug").join("connector-agent"));
        connector
            .arg("--ca")
            .arg(format!("https://{grpc}"))
            .arg("--ca-cert")
            .arg(bed.root_pem())
            .arg("--state-dir")
            .arg(dir.join("connector-state"))
            .args(["--name", CONNECTOR, "--group", GROUP])
            .env("REACH_PROVISIONING_KEY", GROUP_KEY);
        bed.spawn("connector", connector)?;
        Ok(bed)
    }

    /// The CA's root certificate (it writes it on its first start).
    pub fn root_pem(&self) -> PathBuf {
        self.data.join("ca.pem")
    }

    fn log(&self, what: &str) -> PathBuf {
        self.dir.join(format!("{what}.log"))
    }

    fn spawn(&mut self, what: &'static str, mut cmd: Command) -> Result<()> {
        let log = std::fs::File::create(self.log(what))?;
        let child = cmd
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting the {what}: {cmd:?}"))?;
        self.children.push((what, child));
        Ok(())
    }

    /// Fails naming the log of any process that exited.
    fn check_running(&mut self) -> Result<()> {
        for (what, child) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                let log = self.dir.join(format!("{what}.log"));
                bail!("the {what} exited ({status}); see {}", log.display());
            }
        }
        Ok(())
    }

    fn wait_ca(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.root_pem().exists() && TcpStream::connect(self.http).is_ok() {
                return Ok(());
            }
            self.check_running()?;
            if Instant::now() > deadline {
                bail!("the CA did not listen on {} within 30 s", self.http);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One `POST /api/v1/access` for the application (with the venv's
    /// `python`, which trusts the CA's root): its status and body.
    fn access(&self, python: &Path) -> Result<(u16, String)> {
        const SCRIPT: &str = r#"
import json, ssl, sys, urllib.error, urllib.request
url, cafile, token, host, port = sys.argv[1:]
body = json.dumps({"host": host, "protocol": "tcp", "port": int(port)}).encode()
req = urllib.request.Request(url, data=body, method="POST", headers={
    "Authorization": "Bearer " + token, "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=cafile), timeout=10) as r:
        print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
"#;
        let out = Command::new(python)
            .arg("-c")
            .arg(SCRIPT)
            .arg(format!("https://{}/api/v1/access", self.http))
            .arg(self.root_pem())
            .arg(&self.token)
            .arg(self.app.ip().to_string())
            .arg(self.app.port().to_string())
            .output()
            .with_context(|| format!("running {}", python.display()))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (status, body) = text.split_once('\n').unwrap_or((text.as_str(), ""));
        let status = status.trim().parse().with_context(|| {
            format!(
                "POST /api/v1/access: no status ({})",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })?;
        Ok((status, body.trim().to_owned()))
    }

    /// Waits until `POST /api/v1/access` for the application answers 200
    /// selecting the connector; fails with the last answer after `limit`.
    pub fn wait_access_ok(&mut self, python: &Path, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            self.check_running()?;
            let (status, body) = self.access(python)?;
            let selected = body.contains(&format!("\"connector\":\"{CONNECTOR}\""));
            if status == 200 && selected {
                eprintln!(
                    "xtask: POST /api/v1/access for {} → 200 ({CONNECTOR})",
                    self.app
                );
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "POST /api/v1/access for {} did not answer 200 selecting {CONNECTOR} within {limit:?}: last {status} {body}; see {} and {}",
                    self.app,
                    self.log("ca").display(),
                    self.log("connector").display()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Testbed {
    /// After a run that may have revoked the connector: every process still
    /// runs and `POST /api/v1/access` answers 200 or 503 with a JSON body
    /// that names a connector or an error.
    pub fn still_serving(&mut self, python: &Path) -> Result<()> {
        self.check_running()?;
        let (status, body) = self.access(python)?;
        let named = body.starts_with('{')
            && (body.contains("\"connector\":") || body.contains("\"error\":"));
        if !matches!(status, 200 | 503) || !named {
            bail!(
                "POST /api/v1/access → {status} {body}: want 200 or 503 naming a connector or an error"
            );
        }
        eprintln!("xtask: POST /api/v1/access for {} → {status}", self.app);
        Ok(())
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for (_, child) in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
