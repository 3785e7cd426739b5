//! Log receivers a SIEM would run, for the tests of the CA's log streaming:
//! a real `rsyslogd` (Debian's `rsyslog` and `rsyslog-gnutls`) listening
//! with `imtcp` over TLS, parsing RFC 5424 with its own parser and
//! `mmpstrucdata`, and writing what it parsed (header fields and
//! structured data) as one JSON object per line, which the test reads; and
//! a TCP JSON-lines receiver (a listener in the test process) that keeps
//! or only counts the lines it takes.
//!
//! rsyslogd needs no privilege here (a port above 1024, files in its own
//! directory): started by root, it runs as `nobody` (uid and gid 65534)
//! through `setpriv`, in a directory under the system's temporary
//! directory that `nobody` owns; otherwise as the calling user. A machine
//! without rsyslogd, its gtls driver or (as root) setpriv fails the caller
//! naming what is missing.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

/// The user rsyslogd runs as when the tests run as root (Debian's `nobody`).
const NOBODY: u32 = 65534;

/// A test CA, the receiver's certificate for a name and a client
/// certificate the receiver can require, as PEM files in one directory.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The test CA's certificate (the sender's `root_file`; the receiver's
    /// CA for client certificates).
    pub root: PathBuf,
    /// The receiver's certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// A client certificate for the sender.
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
    /// The name in the receiver's certificate.
    pub server_name: String,
    /// The name in the client certificate.
    pub client_name: String,
}

impl TlsFiles {
    /// Issues a CA, a server certificate for `server_name` and a client
    /// certificate for `client_name`, written to `dir`.
    pub fn issue(dir: &Path, server_name: &str, client_name: &str) -> Result<TlsFiles> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        };
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "reach test SIEM CA");
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;
        let leaf = |name: &str, usage: ExtendedKeyUsagePurpose| -> Result<(String, String)> {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(vec![name.to_owned()])?;
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &ca)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let (cert_pem, key_pem) = leaf(server_name, ExtendedKeyUsagePurpose::ServerAuth)?;
        let (client_pem, client_key_pem) = leaf(client_name, ExtendedKeyUsagePurpose::ClientAuth)?;
        let files = TlsFiles {
            root: dir.join("siem-root.pem"),
            cert: dir.join("siem-cert.pem"),
            key: dir.join("siem-key.pem"),
            client_cert: dir.join("client-cert.pem"),
            client_key: dir.join("client-key.pem"),
            server_name: server_name.to_owned(),
            client_name: client_name.to_owned(),
        };
        for (path, pem) in [
            (&files.root, ca.pem()),
            (&files.cert, cert_pem),
            (&files.key, key_pem),
            (&files.client_cert, client_pem),
            (&files.client_key, client_key_pem),
        ] {
            std::fs::write(path, pem).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(files)
    }
}

/// How rsyslog authenticates the sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// Any client (TLS encrypts; the client checks the receiver).
    Anon,
    /// A client certificate from the test CA naming `TlsFiles::client_name`
    /// (`StreamDriver.AuthMode="x509/name"`, `PermittedPeer`).
    X509Name,
}

/// The rsyslogd binary, or an error naming what to install.
pub fn rsyslogd() -> Result<PathBuf> {
    let install = "install Debian's rsyslog and rsyslog-gnutls (.ci/run does)";
    let dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let bin = dirs
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join("rsyslogd"))
        .find(|p| p.is_file())
        .with_context(|| format!("rsyslogd is not installed: {install}"))?;
    let gtls = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("rsyslog/lmnsd_gtls.so"))
        .chain([PathBuf::from("/usr/lib/rsyslog/lmnsd_gtls.so")])
        .any(|p| p.is_file());
    if !gtls {
        bail!("rsyslog's GnuTLS driver (lmnsd_gtls.so) is not installed: {install}");
    }
    Ok(bin)
}

/// The rsyslog configuration: one TLS `imtcp` input on `addr` whose
/// ruleset parses the structured data and writes the parsed message as
/// JSON to `<work>/received.jsonl`.
fn config(addr: SocketAddr, work: &Path, tls: &TlsFiles, auth: &Auth) -> String {
    let auth = match auth {
        Auth::Anon => "streamDriver.authMode=\"anon\"".to_owned(),
        Auth::X509Name => format!(
            "streamDriver.authMode=\"x509/name\" permittedPeer=[\"{}\"]",
            tls.client_name
        ),
    };
    format!(
        r#"# Written by the reach tests: one TLS input, RFC 5424 parsed by rsyslog,
# what it parsed written as JSON lines.
global(workDirectory="{work}" maxMessageSize="256k")
module(load="imtcp")
module(load="mmpstrucdata")
template(name="rfc3339" type="string" string="%timereported:::date-rfc3339%")
template(name="parsed" type="list") {{
  property(name="$!all-json-plain")
  constant(value="\n")
}}
ruleset(name="siem") {{
  action(type="mmpstrucdata")
  set $!hostname = $hostname;
  set $!appname = $app-name;
  set $!procid = $procid;
  set $!msgid = $msgid;
  set $!pri = $pri;
  set $!timestamp = exec_template("rfc3339");
  set $!msg = $msg;
  action(type="omfile" file="{work}/received.jsonl" template="parsed")
}}
input(type="imtcp" address="{ip}" port="{port}" ruleset="siem"
  streamDriver.name="gtls" streamDriver.mode="1" {auth}
  streamDriver.caFile="{root}" streamDriver.certFile="{cert}" streamDriver.keyFile="{key}")
"#,
        work = work.display(),
        ip = addr.ip(),
        port = addr.port(),
        root = tls.root.display(),
        cert = tls.cert.display(),
        key = tls.key.display(),
    )
}

/// One message as rsyslog parsed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// HOSTNAME.
    pub hostname: String,
    /// APP-NAME.
    pub appname: String,
    /// PROCID.
    pub procid: String,
    /// MSGID.
    pub msgid: String,
    /// PRI (facility × 8 + severity).
    pub pri: u32,
    /// TIMESTAMP, as rsyslog writes it in RFC 3339.
    pub timestamp: String,
    /// MSG.
    pub msg: String,
    /// Structured data: SD-ID → (PARAM-NAME → value), names lower-cased
    /// by rsyslog.
    pub sd: BTreeMap<String, BTreeMap<String, String>>,
}

impl Parsed {
    /// Reads one line of the output.
    fn from_line(line: &str) -> Result<Parsed> {
        let v: Value = serde_json::from_str(line).with_context(|| format!("not JSON: {line}"))?;
        let text = |k: &str| -> Result<String> {
            v[k].as_str()
                .map(str::to_owned)
                .with_context(|| format!("no {k} in {line}"))
        };
        let mut sd = BTreeMap::new();
        if let Some(elements) = v["rfc5424-sd"].as_object() {
            for (id, params) in elements {
                let params = params
                    .as_object()
                    .with_context(|| format!("SD element {id} is not an object: {line}"))?;
                let params = params
                    .iter()
                    .map(|(k, p)| (k.clone(), p.as_str().unwrap_or_default().to_owned()))
                    .collect();
                sd.insert(id.clone(), params);
            }
        }
        Ok(Parsed {
            hostname: text("hostname")?,
            appname: text("appname")?,
            procid: text("procid")?,
            msgid: text("msgid")?,
            pri: text("pri")?
                .parse()
                .with_context(|| format!("PRI in {line}"))?,
            timestamp: text("timestamp")?,
            msg: text("msg")?,
            sd,
        })
    }

    /// The parameter `name` of SD element `id`.
    pub fn param(&self, id: &str, name: &str) -> Option<&str> {
        self.sd.get(id)?.get(name).map(String::as_str)
    }
}

/// A running rsyslogd receiving RFC 5424 over TLS; killed when dropped.
#[derive(Debug)]
pub struct Rsyslog {
    addr: SocketAddr,
    work: PathBuf,
    log: PathBuf,
    tls: TlsFiles,
    child: Option<Child>,
}

impl Rsyslog {
    /// Starts rsyslogd listening on `addr` with `tls` (issued by
    /// [`TlsFiles::issue`]) and `auth`, its output (stdout and stderr) in
    /// `<log_dir>/rsyslog.log`; returns once it accepts connections.
    pub async fn start(
        addr: SocketAddr,
        tls: &TlsFiles,
        auth: Auth,
        log_dir: &Path,
    ) -> Result<Rsyslog> {
        rsyslogd()?;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let work = std::env::temp_dir().join(format!(
            "reach-rsyslog-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
        std::fs::create_dir_all(log_dir)?;
        // rsyslogd reads its certificates from its own directory (as
        // `nobody`, it could not read the test's).
        let own = TlsFiles {
            root: work.join("root.pem"),
            cert: work.join("cert.pem"),
            key: work.join("key.pem"),
            ..tls.clone()
        };
        for (from, to) in [
            (&tls.root, &own.root),
            (&tls.cert, &own.cert),
            (&tls.key, &own.key),
        ] {
            std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
        }
        std::fs::write(work.join("rsyslog.conf"), config(addr, &work, &own, &auth))?;
        if crate::caps::is_root() {
            for entry in std::fs::read_dir(&work)?.flatten() {
                std::os::unix::fs::chown(entry.path(), Some(NOBODY), Some(NOBODY))?;
            }
            std::os::unix::fs::chown(&work, Some(NOBODY), Some(NOBODY))?;
        }
        let mut rsyslog = Rsyslog {
            addr,
            work,
            log: log_dir.join("rsyslog.log"),
            tls: own,
            child: None,
        };
        rsyslog.restart().await?;
        Ok(rsyslog)
    }

    /// Starts rsyslogd again on its configuration (after [`Rsyslog::stop`]);
    /// returns once it accepts connections.
    pub async fn restart(&mut self) -> Result<()> {
        if self.child.is_some() {
            bail!("rsyslogd is running");
        }
        let bin = rsyslogd()?;
        let out = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let mut cmd = if crate::caps::is_root() {
            let mut cmd = Command::new("setpriv");
            let id = NOBODY.to_string();
            cmd.args(["--reuid", &id, "--regid", &id, "--clear-groups"])
                .arg(&bin);
            cmd
        } else {
            Command::new(&bin)
        };
        cmd.arg("-n")
            .arg("-f")
            .arg(self.work.join("rsyslog.conf"))
            .arg("-i")
            .arg(self.work.join("rsyslogd.pid"))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true);
        let child = cmd.spawn().with_context(|| {
            if crate::caps::is_root() {
                format!("starting {} through setpriv (util-linux)", bin.display())
            } else {
                format!("starting {}", bin.display())
            }
        })?;
        self.child = Some(child);
        self.wait_listening().await
    }

    /// Waits until the input accepts TCP connections (or rsyslogd exited).
    async fn wait_listening(&mut self) -> Result<()> {
        let t0 = std::time::Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                bail!(
                    "rsyslogd exited ({status}) before listening on {}: {}",
                    self.addr,
                    self.log_text()
                );
            }
            if tokio::net::TcpStream::connect(self.addr).await.is_ok() {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(15) {
                bail!(
                    "rsyslogd did not listen on {} within 15 s: {}",
                    self.addr,
                    self.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops rsyslogd as an operator would (SIGTERM: it closes its
    /// connections and writes what it queued), SIGKILL after 10 s.
    pub async fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            bail!("rsyslogd is not running");
        };
        if let Some(pid) = child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
            Ok(status) => {
                status?;
            }
            Err(_) => {
                let _ = child.kill().await;
                bail!("rsyslogd did not stop within 10 s of SIGTERM");
            }
        }
        Ok(())
    }

    /// Whether rsyslogd runs.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The certificates it serves with (the root is the sender's
    /// `root_file`).
    pub fn tls(&self) -> &TlsFiles {
        &self.tls
    }

    /// Every message written so far, as rsyslog parsed it (a line being
    /// written is left for the next call).
    pub fn received(&self) -> Result<Vec<Parsed>> {
        let path = self.work.join("received.jsonl");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        complete
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(Parsed::from_line)
            .collect()
    }

    /// rsyslogd's own output so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
        }
        // What it received stays beside its log for a failed test's reader.
        if let Some(dir) = self.log.parent() {
            let _ = std::fs::copy(
                self.work.join("received.jsonl"),
                dir.join("rsyslog-received.jsonl"),
            );
        }
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// What a [`JsonReceiver`] took.
#[derive(Debug, Default)]
struct Taken {
    /// Lines (records) taken.
    lines: AtomicU64,
    /// Bytes taken.
    bytes: AtomicU64,
    /// Connections accepted.
    connections: AtomicU64,
    /// The records, parsed (when kept).
    records: Mutex<Vec<Value>>,
    /// Lines that were not JSON objects (when kept).
    bad: Mutex<Vec<String>>,
}

/// A TCP receiver of JSON lines on loopback; stops when dropped.
#[derive(Debug)]
pub struct JsonReceiver {
    addr: SocketAddr,
    taken: Arc<Taken>,
    task: tokio::task::JoinHandle<()>,
}

impl JsonReceiver {
    /// Listens on `addr` (port 0: any), keeping every record it takes.
    pub async fn start(addr: SocketAddr) -> Result<JsonReceiver> {
        JsonReceiver::listen(addr, true).await
    }

    /// Listens on `addr`, only counting lines and bytes (a fast reader).
    pub async fn counting(addr: SocketAddr) -> Result<JsonReceiver> {
        JsonReceiver::listen(addr, false).await
    }

    async fn listen(addr: SocketAddr, keep: bool) -> Result<JsonReceiver> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the JSON receiver on {addr}"))?;
        let addr = listener.local_addr()?;
        let taken = Arc::new(Taken::default());
        let state = taken.clone();
        let task = tokio::spawn(async move {
            // Dropping the set (when this task is aborted) ends every
            // connection.
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                state.connections.fetch_add(1, Ordering::Relaxed);
                conns.spawn(read_lines(stream, state.clone(), keep));
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(JsonReceiver { addr, taken, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Lines taken so far.
    pub fn count(&self) -> u64 {
        self.taken.lines.load(Ordering::Relaxed)
    }

    /// Bytes taken so far.
    pub fn bytes(&self) -> u64 {
        self.taken.bytes.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.taken.connections.load(Ordering::Relaxed)
    }

    /// The records taken so far (empty for a counting receiver).
    pub fn records(&self) -> Vec<Value> {
        self.taken
            .records
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Lines that were not JSON objects.
    pub fn bad_lines(&self) -> Vec<String> {
        self.taken.bad.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for JsonReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one connection's lines into `taken`.
async fn read_lines(mut stream: tokio::net::TcpStream, taken: Arc<Taken>, keep: bool) {
    let mut buf = vec![0u8; 256 * 1024];
    let mut partial: Vec<u8> = Vec::new();
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let chunk = &buf[..n];
        taken.bytes.fetch_add(n as u64, Ordering::Relaxed);
        if !keep {
            let lines = chunk.iter().filter(|b| **b == b'\n').count();
            taken.lines.fetch_add(lines as u64, Ordering::Relaxed);
            continue;
        }
        partial.extend_from_slice(chunk);
        let Some(end) = partial.iter().rposition(|b| *b == b'\n') else {
            continue;
        };
        let rest = partial.split_off(end + 1);
        let (mut good, mut bad) = (Vec::new(), Vec::new());
        for line in partial.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            match serde_json::from_slice::<Value>(line) {
                Ok(v) if v.is_object() => good.push(v),
                _ => bad.push(String::from_utf8_lossy(line).into_owned()),
            }
        }
        partial = rest;
        taken
            .lines
            .fetch_add((good.len() + bad.len()) as u64, Ordering::Relaxed);
        if let Ok(mut r) = taken.records.lock() {
            r.extend(good);
        }
        if let Ok(mut b) = taken.bad.lock() {
            b.extend(bad);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::AsyncWriteExt;

    use super::*;

    /// A fresh directory for one test's files.
    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("reach-siem-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn loopback() -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), crate::free_port().unwrap())
    }

    /// `msg` framed as RFC 6587 octet counting.
    fn octet_counted(msg: &str) -> String {
        format!("{} {msg}", msg.len())
    }

    /// Sends `frames` over one TLS connection checking the receiver's name,
    /// presenting the client certificate when `client` is set.
    async fn send(tls: &TlsFiles, addr: SocketAddr, client: bool, frames: &[String]) -> Result<()> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&tls.root)? {
            roots.add(c?)?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
        let config = if client {
            let chain =
                CertificateDer::pem_file_iter(&tls.client_cert)?.collect::<Result<Vec<_>, _>>()?;
            let key = PrivateKeyDer::from_pem_file(&tls.client_key)?;
            builder.with_client_auth_cert(chain, key)?
        } else {
            builder.with_no_client_auth()
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = ServerName::try_from(tls.server_name.clone())?;
        let mut stream = connector.connect(name, tcp).await?;
        for f in frames {
            stream.write_all(f.as_bytes()).await?;
        }
        stream.flush().await?;
        stream.shutdown().await?;
        Ok(())
    }

    /// Waits until rsyslog has written `n` messages; returns them.
    async fn wait_for(rsyslog: &Rsyslog, n: usize) -> Vec<Parsed> {
        crate::retry(Duration::from_secs(15), || async {
            let got = rsyslog.received()?;
            anyhow::ensure!(got.len() >= n, "{} of {n} messages: {got:?}", got.len());
            Ok(got)
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\nrsyslogd: {}", rsyslog.log_text()))
    }

    #[tokio::test]
    async fn rsyslog_parses_rfc5424_sent_over_tls() {
        let d = dir("parse");
        let tls = TlsFiles::issue(&d.join("tls"), "siem.reach.test", "ca.reach.test").unwrap();
        let rsyslog = Rsyslog::start(loopback(), &tls, Auth::Anon, &d)
            .await
            .unwrap();
        let frames = [
            octet_counted(
                r#"<134>1 2026-12-07T11:30:00.123Z ca-1 central-authority 42 access [reach@32473 type="access" replica="ca1" seq="7" reason="a \"quoted\" \] and \\ back é"] allowed jira:443"#,
            ),
            // No structured data, no PROCID; a second SD element.
            octet_counted("<133>1 2026-12-07T11:30:01Z ca-1 central-authority - health - down"),
            octet_counted(
                r#"<134>1 2026-12-07T11:30:02.5+01:00 ca-2 central-authority 7 audit [reach@32473 type="audit" seq="1"][other@1 k="v"] reload"#,
            ),
        ];
        send(&tls, rsyslog.addr(), false, &frames).await.unwrap();
        let got = wait_for(&rsyslog, 3).await;
        assert_eq!(got.len(), 3, "{got:?}");
        let access = &got[0];
        assert_eq!(access.hostname, "ca-1");
        assert_eq!(access.appname, "central-authority");
        assert_eq!(access.procid, "42");
        assert_eq!(access.msgid, "access");
        assert_eq!(access.pri, 134);
        assert_eq!(access.timestamp, "2026-12-07T11:30:00.123Z");
        assert_eq!(access.msg, "allowed jira:443");
        assert_eq!(access.param("reach@32473", "seq"), Some("7"));
        assert_eq!(access.param("reach@32473", "replica"), Some("ca1"));
        assert_eq!(
            access.param("reach@32473", "reason"),
            Some(r#"a "quoted" ] and \ back é"#)
        );
        let health = &got[1];
        assert_eq!(
            (health.msgid.as_str(), health.procid.as_str()),
            ("health", "-")
        );
        assert!(health.sd.is_empty(), "{health:?}");
        assert_eq!(health.msg, "down");
        let audit = &got[2];
        assert_eq!(audit.timestamp, "2026-12-07T11:30:02.5+01:00");
        assert_eq!(audit.param("other@1", "k"), Some("v"));
        assert_eq!(audit.param("reach@32473", "type"), Some("audit"));
    }

    #[tokio::test]
    async fn rsyslog_with_x509_name_takes_the_permitted_client_only() {
        let d = dir("x509");
        let tls = TlsFiles::issue(&d.join("tls"), "siem.reach.test", "ca.reach.test").unwrap();
        let rsyslog = Rsyslog::start(loopback(), &tls, Auth::X509Name, &d)
            .await
            .unwrap();
        let frame = |n: u32| {
            octet_counted(&format!(
                "<134>1 2026-12-07T11:30:00Z ca-1 central-authority - audit [reach@32473 seq=\"{n}\"] m"
            ))
        };
        // Without a client certificate the handshake or the stream fails,
        // and nothing is written.
        let _ = send(&tls, rsyslog.addr(), false, &[frame(1)]).await;
        send(&tls, rsyslog.addr(), true, &[frame(2)]).await.unwrap();
        let got = wait_for(&rsyslog, 1).await;
        let seqs: Vec<_> = got.iter().map(|p| p.param("reach@32473", "seq")).collect();
        assert_eq!(seqs, [Some("2")], "{got:?}");
    }

    #[tokio::test]
    async fn rsyslog_stops_and_restarts_on_its_port_keeping_its_output() {
        let d = dir("restart");
        let tls = TlsFiles::issue(&d.join("tls"), "siem.reach.test", "ca.reach.test").unwrap();
        let mut rsyslog = Rsyslog::start(loopback(), &tls, Auth::Anon, &d)
            .await
            .unwrap();
        let frame = |n: u32| {
            octet_counted(&format!(
                "<134>1 2026-12-07T11:30:00Z h central-authority - access [reach@32473 seq=\"{n}\"] m"
            ))
        };
        send(&tls, rsyslog.addr(), false, &[frame(1)])
            .await
            .unwrap();
        wait_for(&rsyslog, 1).await;
        rsyslog.stop().await.unwrap();
        assert!(!rsyslog.is_running());
        assert!(
            tokio::net::TcpStream::connect(rsyslog.addr())
                .await
                .is_err()
        );
        rsyslog.restart().await.unwrap();
        send(&tls, rsyslog.addr(), false, &[frame(2)])
            .await
            .unwrap();
        let got = wait_for(&rsyslog, 2).await;
        let seqs: Vec<_> = got.iter().map(|p| p.param("reach@32473", "seq")).collect();
        assert_eq!(seqs, [Some("1"), Some("2")]);
    }

    #[tokio::test]
    async fn json_receiver_keeps_lines_split_across_writes() {
        let rx = JsonReceiver::start(loopback()).await.unwrap();
        let mut s = tokio::net::TcpStream::connect(rx.addr()).await.unwrap();
        s.write_all(b"{\"type\":\"access\",\"seq\":1}\n{\"type\":\"au")
            .await
            .unwrap();
        s.flush().await.unwrap();
        s.write_all(b"dit\",\"seq\":2}\nnot json\n").await.unwrap();
        s.shutdown().await.unwrap();
        crate::retry(Duration::from_secs(15), || async {
            anyhow::ensure!(rx.count() == 3, "{} lines", rx.count());
            Ok(())
        })
        .await
        .unwrap();
        let seqs: Vec<_> = rx.records().iter().map(|r| r["seq"].clone()).collect();
        assert_eq!(seqs, [1, 2]);
        assert_eq!(rx.bad_lines(), ["not json"]);
        assert_eq!(rx.connections(), 1);
        let counting = JsonReceiver::counting(loopback()).await.unwrap();
        let mut s = tokio::net::TcpStream::connect(counting.addr())
            .await
            .unwrap();
        s.write_all(b"{}\n{}\n{}\n").await.unwrap();
        s.shutdown().await.unwrap();
        crate::retry(Duration::from_secs(15), || async {
            anyhow::ensure!(counting.count() == 3, "{} lines", counting.count());
            Ok(())
        })
        .await
        .unwrap();
        assert!(counting.records().is_empty());
        assert_eq!(counting.bytes(), 9);
    }
}
