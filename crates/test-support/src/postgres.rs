//! A real PostgreSQL server for tests: `initdb` into a temporary directory,
//! the server on a free loopback port (and a Unix socket in that
//! directory), stopped with `pg_ctl` when the handle drops.
//!
//! When the tests run as root (CI does), PostgreSQL refuses to start; the
//! server then runs as an unprivileged user (`REACH_TEST_PG_USER`, else
//! `postgres` when the system has it, else `nobody`) through `setpriv`, and
//! the directory is handed to that user. Binaries come from `PATH`, else
//! from the newest `/usr/lib/postgresql/*/bin`. A server that cannot start
//! is an error naming the step that failed: tests never skip silently.
//!
//! `Postgres::start_with_superuser` names the superuser, so that a test
//! can give the name `reach` to an ordinary role, as a deployment does.
//! `lose` kills the server and deletes its data directory (a lost database
//! host) and `rebuild` initialises a new, empty one on the same port.
//!
//! `Postgres::shared()` is one server per test binary (the server costs
//! about a second to create). The server is started with a parent-death
//! signal from a thread that lives as long as the process, so it also stops
//! when the test binary exits without running destructors; each test takes
//! a database of its own from it (`fresh_database`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::net::free_port;

/// The superuser the tests connect as (trust authentication on loopback).
pub const SUPERUSER: &str = "reach";

/// A running PostgreSQL server.
#[derive(Debug)]
pub struct Postgres {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    /// `setpriv` arguments that run a command as the server's owner.
    run_as: Vec<String>,
    child: Mutex<Option<Child>>,
    /// The `-c` settings it was started with (`resume` starts it so again).
    settings: Vec<String>,
    /// The shared server is never stopped by a destructor (statics are not
    /// dropped); its parent-death signal stops it.
    owned: bool,
    /// The superuser `initdb` created ([`SUPERUSER`] unless named).
    superuser: String,
}

static SHARED: OnceLock<Result<Postgres, String>> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(1);

impl Postgres {
    /// The server this test binary shares, started on first use. Panics
    /// with the reason when PostgreSQL cannot be started.
    pub fn shared() -> &'static Postgres {
        let shared = SHARED.get_or_init(|| {
            // The server's parent-death signal fires when the *thread* that
            // started it ends: a test thread ends with its test, so a
            // thread that lives as long as the process starts it.
            let (tx, rx) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name("postgres-parent".into())
                .spawn(move || {
                    let started = Postgres::start_inner(false).map_err(|e| format!("{e:#}"));
                    let _ = tx.send(started);
                    loop {
                        std::thread::park();
                    }
                });
            match spawned {
                Ok(_) => rx
                    .recv()
                    .unwrap_or_else(|_| Err("the PostgreSQL starter thread died".into())),
                Err(e) => Err(format!("cannot start a thread: {e}")),
            }
        });
        match shared {
            Ok(pg) => pg,
            Err(e) => panic!("PostgreSQL for the tests could not be started: {e}"),
        }
    }

    /// A server of the caller's own, stopped and removed when dropped.
    pub fn start() -> anyhow::Result<Postgres> {
        Self::start_inner(true)
    }

    /// A server of the caller's own that also serves TLS (`ssl = on`) with
    /// `cert_pem` (the server certificate, then any intermediates) and
    /// `key_pem`; plain connections are still accepted.
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> anyhow::Result<Postgres> {
        Self::start_with(true, Some((cert_pem, key_pem)))
    }

    /// A server of the caller's own whose superuser is `superuser`
    /// (Debian's is `postgres`), stopped and removed when dropped.
    pub fn start_with_superuser(superuser: &str) -> anyhow::Result<Postgres> {
        Self::start_full(true, None, superuser)
    }

    fn start_inner(owned: bool) -> anyhow::Result<Postgres> {
        Self::start_with(owned, None)
    }

    fn start_with(owned: bool, tls: Option<(&str, &str)>) -> anyhow::Result<Postgres> {
        Self::start_full(owned, tls, SUPERUSER)
    }

    fn start_full(
        owned: bool,
        tls: Option<(&str, &str)>,
        superuser: &str,
    ) -> anyhow::Result<Postgres> {
        let bin = find_bin_dir()?;
        remove_stale_dirs();
        let dir =
            std::env::temp_dir().join(format!("reach-pg-{}-{}", std::process::id(), unique()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let run_as = run_as(&dir)?;
        initdb(&run_as, &bin, &dir, superuser)?;
        let mut settings = Vec::new();
        if let Some((cert, key)) = tls {
            // The server reads them as its own user; the key must not be
            // readable by others.
            let (cert_path, key_path) = (dir.join("server.crt"), dir.join("server.key"));
            std::fs::write(&cert_path, cert).context("cannot write server.crt")?;
            std::fs::write(&key_path, key).context("cannot write server.key")?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600))
                .context("cannot restrict server.key")?;
            if let Some(owner) = owner(&run_as) {
                for p in [&cert_path, &key_path] {
                    std::os::unix::fs::chown(p, Some(owner.0), Some(owner.1))
                        .with_context(|| format!("cannot hand {} to the server", p.display()))?;
                }
            }
            settings.extend([
                "ssl=on".to_owned(),
                format!("ssl_cert_file={}", cert_path.display()),
                format!("ssl_key_file={}", key_path.display()),
            ]);
        }
        // Free ports can be taken between the probe and the bind: retry.
        let mut last = None;
        for _ in 0..3 {
            let port = free_port()?;
            match start_server(&run_as, &bin, &dir, port, &settings) {
                Ok(child) => {
                    return Ok(Postgres {
                        dir,
                        bin,
                        port,
                        run_as,
                        child: Mutex::new(Some(child)),
                        settings,
                        owned,
                        superuser: superuser.to_owned(),
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("PostgreSQL did not start")))
    }

    /// The server's TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The path of one of the server's client programs (`pg_dump`,
    /// `pg_restore`, `psql`): the ones of the server's own version.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }

    /// The URL of database `db` as the superuser, over TCP on loopback.
    pub fn url(&self, db: &str) -> String {
        self.url_as(&self.superuser, db)
    }

    /// The URL of database `db` as role `role`, over TCP on loopback.
    pub fn url_as(&self, role: &str, db: &str) -> String {
        format!(
            "postgres://{role}@127.0.0.1:{}/{db}?sslmode=disable",
            self.port
        )
    }

    /// The superuser's name.
    pub fn superuser(&self) -> &str {
        &self.superuser
    }

    /// The database a URL of `url` or `fresh_database` names (what `psql`
    /// takes).
    pub fn database_of(url: &str) -> Option<&str> {
        url.rsplit('/').next()?.split('?').next()
    }

    /// Creates a new, empty database and returns its URL: each test gets
    /// its own schema state on the shared server.
    pub fn fresh_database(&self) -> anyhow::Result<String> {
        self.create(&[])
    }

    /// A new, empty database with `locale` (collation and character
    /// classes) instead of the cluster's `C`, as a cluster created in
    /// another locale gives (Debian's in a container: `C.UTF-8`); its URL.
    pub fn fresh_database_in(&self, locale: &str) -> anyhow::Result<String> {
        self.create(&["--template=template0", &format!("--locale={locale}")])
    }

    fn create(&self, options: &[&str]) -> anyhow::Result<String> {
        let name = format!(
            "reach_{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::Relaxed)
        );
        let mut createdb = Command::new(self.bin.join("createdb"));
        createdb
            .args(["-h", "127.0.0.1", "-U", &self.superuser, "-p"])
            .arg(self.port.to_string())
            .args(options)
            .arg(&name);
        run(&mut createdb, "createdb")?;
        Ok(self.url(&name))
    }

    /// Runs SQL through `psql` on database `db` (test setup and inspection);
    /// returns its unaligned output.
    pub fn psql(&self, db: &str, sql: &str) -> anyhow::Result<String> {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-U",
                &self.superuser,
                "-X",
                "-A",
                "-t",
                "-q",
            ])
            .args(["-v", "ON_ERROR_STOP=1", "-p"])
            .arg(self.port.to_string())
            .args(["-d", db, "-c", sql])
            .stdin(Stdio::null())
            .output()
            .context("cannot run psql")?;
        if !out.status.success() {
            bail!(
                "psql failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Stops the server (fast shutdown) and keeps its data: a database
    /// outage until `resume`.
    pub fn halt(&self) -> anyhow::Result<()> {
        let mut stop = command(&self.run_as, &self.bin.join("pg_ctl"));
        stop.arg("-D")
            .arg(self.dir.join("data"))
            .args(["stop", "-m", "fast", "-w", "-t", "20"]);
        run(&mut stop, "pg_ctl stop")?;
        let mut child = self
            .child
            .lock()
            .map_err(|_| anyhow::anyhow!("the server's handle is poisoned"))?;
        if let Some(mut c) = child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        Ok(())
    }

    /// Starts a server `halt` stopped again, on the same port with the
    /// same data, and waits until it accepts connections.
    pub fn resume(&self) -> anyhow::Result<()> {
        let started = start_server(
            &self.run_as,
            &self.bin,
            &self.dir,
            self.port,
            &self.settings,
        )
        .context("cannot restart PostgreSQL on its port")?;
        let mut child = self
            .child
            .lock()
            .map_err(|_| anyhow::anyhow!("the server's handle is poisoned"))?;
        *child = Some(started);
        Ok(())
    }

    /// The database host lost: the server killed (`SIGKILL`, no shutdown)
    /// and its data directory deleted. Nothing answers on its port until
    /// `rebuild`.
    pub fn lose(&self) -> anyhow::Result<()> {
        let mut child = self
            .child
            .lock()
            .map_err(|_| anyhow::anyhow!("the server's handle is poisoned"))?;
        if let Some(mut c) = child.take() {
            c.kill().context("cannot kill postgres")?;
            let _ = c.wait();
        }
        // Its backends notice the postmaster's death and exit; none may
        // answer on the port afterwards.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, self.port)).is_ok() {
            if Instant::now() > deadline {
                bail!("port {} still answers 10 s after the kill", self.port);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let data = self.dir.join("data");
        std::fs::remove_dir_all(&data).with_context(|| format!("cannot delete {}", data.display()))
    }

    /// A new, empty server (`initdb` anew, the same superuser and settings)
    /// started on the port of the one `lose` destroyed.
    pub fn rebuild(&self) -> anyhow::Result<()> {
        let mut child = self
            .child
            .lock()
            .map_err(|_| anyhow::anyhow!("the server's handle is poisoned"))?;
        if child.is_some() {
            bail!("rebuild: the server runs; `lose` it first");
        }
        initdb(&self.run_as, &self.bin, &self.dir, &self.superuser)?;
        let started = start_server(
            &self.run_as,
            &self.bin,
            &self.dir,
            self.port,
            &self.settings,
        )
        .context("cannot start the new PostgreSQL on the old port")?;
        *child = Some(started);
        Ok(())
    }

    fn stop(&self) {
        let mut stop = command(&self.run_as, &self.bin.join("pg_ctl"));
        stop.arg("-D")
            .arg(self.dir.join("data"))
            .args(["stop", "-m", "fast", "-w", "-t", "20"]);
        let _ = stop.stdout(Stdio::null()).stderr(Stdio::null()).status();
        if let Ok(mut child) = self.child.lock()
            && let Some(mut c) = child.take()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if self.owned {
            self.stop();
        }
    }
}

fn unique() -> u32 {
    static N: AtomicU32 = AtomicU32::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// `initdb` into `dir/data` with trust authentication and `superuser`.
fn initdb(run_as: &[String], bin: &Path, dir: &Path, superuser: &str) -> anyhow::Result<()> {
    let mut initdb = command(run_as, &bin.join("initdb"));
    initdb
        .arg("-D")
        .arg(dir.join("data"))
        .args(["-A", "trust", "-U", superuser, "-E", "UTF8", "--locale=C"])
        .arg("--no-sync");
    run(&mut initdb, "initdb")
}

/// Starts `postgres` as a child with a parent-death signal (fast shutdown)
/// and waits until it accepts connections.
fn start_server(
    run_as: &[String],
    bin: &Path,
    dir: &Path,
    port: u16,
    settings: &[String],
) -> anyhow::Result<Child> {
    let log = std::fs::File::create(dir.join("server.log")).context("cannot create server.log")?;
    let err = log.try_clone().context("cannot clone server.log")?;
    let mut cmd = Command::new("setpriv");
    cmd.args(run_as).arg("--pdeathsig=INT").arg("--");
    cmd.arg(bin.join("postgres"))
        .arg("-D")
        .arg(dir.join("data"))
        .arg("-p")
        .arg(port.to_string())
        .arg("-k")
        .arg(dir)
        .args(["-c", "listen_addresses=127.0.0.1"])
        .args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
        .args(["-c", "full_page_writes=off", "-c", "max_connections=300"])
        .args(settings.iter().flat_map(|s| ["-c", s.as_str()]))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err);
    let mut child = cmd.spawn().context("cannot run setpriv/postgres")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().context("cannot wait for postgres")? {
            let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
            bail!("postgres exited at start ({status}): {}", log.trim());
        }
        let ready = Command::new(bin.join("pg_isready"))
            .args(["-q", "-h", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .status()
            .context("cannot run pg_isready")?;
        if ready.success() {
            return Ok(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("postgres did not accept connections within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `setpriv` arguments that drop root to the server's user (after handing
/// `dir` to it); none when not root.
fn run_as(dir: &Path) -> anyhow::Result<Vec<String>> {
    let uid = id(&["-u"])?;
    if uid != 0 {
        return Ok(Vec::new());
    }
    let user = std::env::var("REACH_TEST_PG_USER").ok().unwrap_or_else(|| {
        if id(&["-u", "postgres"]).is_ok() {
            "postgres".into()
        } else {
            "nobody".into()
        }
    });
    let u = id(&["-u", &user]).with_context(|| format!("no user {user:?} to run PostgreSQL"))?;
    let g = id(&["-g", &user])?;
    std::os::unix::fs::chown(dir, Some(u), Some(g))
        .with_context(|| format!("cannot hand {} to {user}", dir.display()))?;
    Ok(vec![
        format!("--reuid={u}"),
        format!("--regid={g}"),
        "--clear-groups".into(),
    ])
}

/// The (uid, gid) `run_as` switches to, if any.
fn owner(run_as: &[String]) -> Option<(u32, u32)> {
    let get = |prefix: &str| {
        run_as
            .iter()
            .find_map(|a| a.strip_prefix(prefix))
            .and_then(|v| v.parse().ok())
    };
    Some((get("--reuid=")?, get("--regid=")?))
}

/// `id ARGS` as a number.
fn id(args: &[&str]) -> anyhow::Result<u32> {
    let out = Command::new("id")
        .args(args)
        .output()
        .context("cannot run id")?;
    if !out.status.success() {
        bail!(
            "id {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .with_context(|| format!("id {args:?} printed no number"))
}

/// A command run as the server's user.
fn command(run_as: &[String], program: &Path) -> Command {
    let mut c = Command::new("setpriv");
    c.args(run_as).arg("--").arg(program);
    c.stdin(Stdio::null());
    c
}

/// Runs `cmd`, failing with its output when it fails.
fn run(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The directory holding `initdb`, `postgres`, `pg_ctl`, `pg_isready`,
/// `createdb` and `psql`: the one of `initdb` on `PATH`, else the newest
/// Debian-style `/usr/lib/postgresql/*/bin`.
fn find_bin_dir() -> anyhow::Result<PathBuf> {
    let complete = |d: &Path| {
        [
            "initdb",
            "postgres",
            "pg_ctl",
            "pg_isready",
            "createdb",
            "psql",
        ]
        .iter()
        .all(|b| d.join(b).exists())
    };
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            let initdb = d.join("initdb");
            if initdb.exists() {
                // Debian links /usr/local/bin/initdb into the versioned dir.
                let real = std::fs::canonicalize(&initdb).unwrap_or(initdb);
                if let Some(parent) = real.parent()
                    && complete(parent)
                {
                    return Ok(parent.to_path_buf());
                }
                if complete(&d) {
                    return Ok(d);
                }
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, d)| complete(d))
        .collect();
    versions.sort();
    versions.pop().map(|(_, d)| d).context(
        "PostgreSQL is not installed: no initdb on PATH or under /usr/lib/postgresql/*/bin \
         (install Debian's `postgresql` package; .ci/run does)",
    )
}

/// Removes the directories of servers whose test process is gone.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("reach-pg-")) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or("");
        if !pid.is_empty() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_starts_serves_sql_and_stops_on_drop() {
        let pg = Postgres::start().expect("PostgreSQL starts");
        let url = pg.fresh_database().expect("createdb");
        let db = Postgres::database_of(&url).expect("db name");
        assert_eq!(pg.psql(db, "SELECT 40 + 2").expect("query"), "42");
        pg.psql(db, "CREATE TABLE kept (n INT); INSERT INTO kept VALUES (7)")
            .expect("write");
        pg.halt().expect("halts");
        assert!(pg.psql(db, "SELECT 1").is_err(), "halted");
        pg.resume().expect("resumes");
        assert_eq!(pg.psql(db, "SELECT n FROM kept").expect("query"), "7");
        let port = pg.port();
        let dir = pg.dir.clone();
        drop(pg);
        assert!(
            std::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port)).is_err(),
            "stopped"
        );
        assert!(!dir.exists(), "directory removed");
    }

    #[test]
    fn a_lost_server_is_rebuilt_empty_on_its_port() {
        let pg = Postgres::start_with_superuser("postgres").expect("PostgreSQL starts");
        assert_eq!(pg.superuser(), "postgres");
        pg.psql("postgres", "CREATE ROLE reach LOGIN")
            .expect("role");
        let url = pg.fresh_database().expect("createdb");
        let db = Postgres::database_of(&url).expect("db name").to_owned();
        pg.lose().expect("lost");
        assert!(pg.psql("postgres", "SELECT 1").is_err(), "nothing answers");
        pg.rebuild().expect("rebuilt");
        let roles = pg
            .psql(
                "postgres",
                "SELECT count(*) FROM pg_roles WHERE rolname = 'reach'",
            )
            .expect("query");
        assert_eq!(roles, "0", "the new server has no role reach");
        assert!(pg.psql(&db, "SELECT 1").is_err(), "nor the old database");
    }
}
