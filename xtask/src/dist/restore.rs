//! `package-test`'s backup and restore: the book's "Backup and restore"
//! procedure (Operations chapter) run exactly as written on the installed
//! packages, with the packaged connector enrolled and reporting from the
//! other host.
//!
//! The scenario is the CA host rebuilt: the CA's package is purged (its
//! data directory, configuration and secrets go) and installed again,
//! while the connector package, on its own host, keeps its state directory
//! (its key and certificate) and its copy of the root, and keeps running,
//! re-dialling. Only the CA's package is purged, since purging both would
//! also delete the connector's state, which a separate connector host
//! never loses when the CA's host is rebuilt. The group's provisioning key
//! is revoked after the enrollment and before the backup, so a connector
//! that enrolled again would be refused: its reattaching is proof that it
//! did not.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use super::{Daemon, TestHost, output, package_file, route_access, wait_up};
use crate::{root, run, target_dir};

/// The CA's unit, as the book's `systemctl` lines name it.
const CA_UNIT: &str = "reach-central-authority.service";
/// The connector's name in the packaged `connector.env`.
const CONNECTOR: &str = "connector-1";
/// The backup directory's example date in the book's restore blocks.
const BOOK_BACKUP: &str = "/var/backups/reach-2026-12-01";

/// A fenced `sh` block of the book's Operations chapter: the one after the
/// line `<!-- book-test: NAME -->`, its lines without blanks and comments.
pub(super) fn book_block(name: &str) -> Result<Vec<String>> {
    let path = root().join("book/src/operations.md");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let marker = format!("<!-- book-test: {name} -->");
    let (_, rest) = text
        .split_once(&marker)
        .with_context(|| format!("{} has no {marker}", path.display()))?;
    let body = rest
        .trim_start()
        .strip_prefix("```sh\n")
        .with_context(|| format!("{marker} is not followed by a ```sh block"))?;
    let (body, _) = body
        .split_once("```")
        .with_context(|| format!("the block after {marker} is not closed"))?;
    Ok(body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

/// The CA host's part of `package-test`, run as the book says.
pub(super) struct Restore<'a> {
    pub work: &'a Path,
    pub ca_host: &'a TestHost,
    pub far: &'a TestHost,
    /// The CA's HTTP API, from `far`.
    pub api: &'a str,
}

/// Removes what the restore made outside the packages' footprint.
struct Leftovers(Vec<PathBuf>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

impl Restore<'_> {
    /// From a CA and a connector attached and reporting: the provisioning
    /// key revoked, the book's backup, the CA host rebuilt (CA stopped, its
    /// package purged and installed again), the book's restore, and the
    /// same connector back with the same certificate, Up and routed.
    pub fn run(&self, ca: Daemon, connector: &mut Daemon) -> Result<()> {
        self.api_post("/api/v1/provisioning_keys/default/revoke")?;
        let enrolled = self.enrolled()?;
        let state = state_files()?;
        let date = output(date_cmd(), "date +%F")?;
        let backup = PathBuf::from(format!("/var/backups/reach-{date}"));
        ensure!(
            !backup.exists(),
            "{} exists already: remove it (left by an earlier run?)",
            backup.display()
        );
        let _leftovers = Leftovers(vec![backup.clone()]);
        let mut ca = Some(ca);
        self.book("backup", &backup, &mut ca)?;
        owned_by_reach(Path::new("/var/lib/reach/ca"))?;

        // The CA host is lost and rebuilt: its package purged and
        // installed again; the connector's host keeps its state.
        let started = Instant::now();
        drop(ca.take());
        self.reinstall_ca()?;
        self.book("restore-sqlite", &backup, &mut ca)?;
        let mut ca = ca.context("the book's restore did not start the CA")?;
        wait_up(self.far, self.api, &mut ca, connector)?;
        let back = started.elapsed();
        route_access(self.far, self.api)?;

        let after = self.enrolled()?;
        ensure!(
            after.serial == enrolled.serial && after.connected,
            "{CONNECTOR} after the restore: {after:?}, before: {enrolled:?}"
        );
        ensure!(
            after.key_uses == 1 && after.key_revoked,
            "the restored store lost the key's history: {after:?}"
        );
        ensure!(
            state_files()? == state,
            "the connector's state directory changed: it enrolled again"
        );
        let log = std::fs::read_to_string(&connector.log)?;
        let enrollments = log.matches("not enrolled yet: enrolling").count();
        ensure!(
            enrollments == 1,
            "the connector enrolled {enrollments} times (once expected)"
        );
        eprintln!(
            "xtask: package-test: CA host rebuilt and restored from the book's backup; {CONNECTOR} reattached with certificate {} (not enrolled again), Up and routed {:.1} s after the CA stopped",
            after.serial,
            back.as_secs_f64()
        );
        std::fs::write(
            self.work.join("restore-to-up.txt"),
            format!("{:.1}\n", back.as_secs_f64()),
        )?;
        Ok(())
    }

    /// Runs the book's block `name` as root, as an operator types it, with
    /// `/var/backups/reach-2026-12-01` (the book's example) read as
    /// `backup`. `systemctl stop|start reach-central-authority` stop or
    /// start the CA's [`Daemon`] as `package-test` runs the unit (its
    /// `ExecStartPre` as `reach`, then its `ExecStart`); every other line
    /// runs in `bash -euo pipefail`.
    fn book(&self, name: &str, backup: &Path, ca: &mut Option<Daemon>) -> Result<()> {
        let unit = CA_UNIT.trim_end_matches(".service");
        for line in book_block(name)? {
            let line = line.replace(BOOK_BACKUP, &backup.display().to_string());
            eprintln!("xtask: package-test: book ({name}): {line}");
            if line == format!("systemctl stop {unit}") {
                drop(ca.take());
            } else if line == format!("systemctl start {unit}") {
                ensure!(ca.is_none(), "`{line}`: the CA runs already");
                exec_start_pre()?;
                *ca = Some(Daemon::start(
                    &self.ca_host.run_named(),
                    CA_UNIT,
                    None,
                    &[],
                    self.work.join("ca-restored.log"),
                )?);
            } else if line.starts_with("systemctl ") {
                bail!("the book's {name} block has `{line}`, which package-test does not run");
            } else {
                let mut sh = Command::new("bash");
                sh.args(["-euo", "pipefail", "-c", &line]);
                run(sh, &format!("the book's {name} block: {line}"))?;
            }
        }
        Ok(())
    }

    /// The CA's package purged and installed again; the connector's
    /// state and configuration are still there.
    fn reinstall_ca(&self) -> Result<()> {
        let package = "reach-central-authority";
        let mut purge = Command::new("dpkg");
        purge
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["--purge", package]);
        run(purge, &format!("dpkg --purge {package}"))?;
        for gone in ["/var/lib/reach/ca", "/etc/reach/ca.toml"] {
            ensure!(!Path::new(gone).exists(), "the purge left {gone}");
        }
        for kept in ["/var/lib/reach/connector", "/etc/reach/connector.env"] {
            ensure!(
                Path::new(kept).exists(),
                "purging the CA's package removed {kept}"
            );
        }
        let deb = package_file(&target_dir().join("dist"), package)?;
        let mut install = Command::new("dpkg");
        install
            .env("DEBIAN_FRONTEND", "noninteractive")
            .arg("-i")
            .arg(&deb);
        run(install, &format!("dpkg -i {}", deb.display()))
    }

    fn curl(&self, method: &str, path: &str) -> Result<Value> {
        let token = std::fs::read_to_string("/etc/reach/secrets/api.token")?;
        let mut curl = self.far.command("curl");
        curl.args(["-sS", "--fail-with-body", "-X", method])
            .args(["--cacert", "/var/lib/reach/ca/ca.pem", "-H"])
            .arg(format!("Authorization: Bearer {}", token.trim()))
            .arg(format!("{}{path}", self.api));
        let answer = output(curl, &format!("{method} {path}"))?;
        serde_json::from_str(&answer).with_context(|| format!("{method} {path}: {answer}"))
    }

    fn api_post(&self, path: &str) -> Result<Value> {
        self.curl("POST", path)
    }

    /// The connector's certificate and session, and the `default` key's
    /// uses and revocation, as the CA's store has them.
    fn enrolled(&self) -> Result<Enrolled> {
        let connectors = self.curl("GET", "/api/v1/connectors")?;
        let c = connectors["connectors"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == CONNECTOR))
            .with_context(|| format!("{CONNECTOR} is not listed: {connectors}"))?;
        let keys = self.curl("GET", "/api/v1/provisioning_keys")?;
        let k = keys["provisioning_keys"]
            .as_array()
            .and_then(|ks| ks.iter().find(|k| k["group"] == "default"))
            .with_context(|| format!("no key for group default: {keys}"))?;
        Ok(Enrolled {
            serial: c["certificate_serial"].as_str().unwrap_or("").to_owned(),
            connected: c["connected"] == true,
            key_uses: k["uses"].as_u64().unwrap_or(0),
            key_revoked: !k["revoked_at"].is_null(),
        })
    }
}

/// What the CA knows of the connector's enrollment.
#[derive(Debug)]
struct Enrolled {
    serial: String,
    connected: bool,
    key_uses: u64,
    key_revoked: bool,
}

fn date_cmd() -> Command {
    let mut date = Command::new("date");
    date.arg("+%F");
    date
}

/// The unit's `ExecStartPre=` as its `User=` (`reach`): the restored
/// configuration and secrets must be readable by the CA's user.
fn exec_start_pre() -> Result<()> {
    let path = Path::new("/lib/systemd/system").join(CA_UNIT);
    let text = std::fs::read_to_string(&path)?;
    let argv: Vec<&str> = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStartPre="))
        .with_context(|| format!("no ExecStartPre= in {}", path.display()))?
        .split_whitespace()
        .collect();
    let mut pre = Command::new("setpriv");
    pre.args(["--reuid=reach", "--regid=reach", "--init-groups", "--"])
        .args(&argv)
        .current_dir("/");
    output(pre, "the unit's ExecStartPre (as reach)").map(drop)
}

/// The connector's state directory (key and certificate), file by file.
fn state_files() -> Result<BTreeMap<PathBuf, Vec<u8>>> {
    let dir = Path::new("/var/lib/reach/connector");
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_file() {
            let bytes = std::fs::read(&path)?;
            files.insert(path, bytes);
        }
    }
    ensure!(!files.is_empty(), "{} is empty", dir.display());
    Ok(files)
}

/// Every file under `dir` belongs to `reach` (a backup run as root must
/// leave none of root's, such as a SQLite `-wal` it created).
fn owned_by_reach(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let uid: u32 = output(
        {
            let mut id = Command::new("id");
            id.args(["-u", "reach"]);
            id
        },
        "id -u reach",
    )?
    .parse()
    .context("id -u reach")?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let owner = entry.metadata()?.uid();
        ensure!(
            owner == uid,
            "{} belongs to uid {owner}, not reach ({uid}), after the backup",
            entry.path().display()
        );
    }
    Ok(())
}
