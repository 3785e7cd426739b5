//! The real binaries as child processes: started with their logs captured to
//! files, stopped (SIGTERM, then SIGKILL) when dropped, and their logs
//! printed when a scenario fails.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};

/// Directories a program set for itself (`reach-conformance`), in place of
/// the environment's.
static BIN_DIR: OnceLock<PathBuf> = OnceLock::new();
static OUT_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Makes `bin_dir()` and `out_dir()` answer `bin` and `out` for the rest
/// of the process (first call wins).
pub fn use_dirs(bin: PathBuf, out: PathBuf) {
    let _ = BIN_DIR.set(bin);
    let _ = OUT_DIR.set(out);
}

/// Directory holding the release binaries (`REACH_BIN_DIR`, set by
/// `cargo xtask e2e`).
pub fn bin_dir() -> Result<PathBuf> {
    if let Some(dir) = BIN_DIR.get() {
        return Ok(dir.clone());
    }
    match std::env::var_os("REACH_BIN_DIR") {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => bail!("REACH_BIN_DIR is not set: run the scenarios with `cargo xtask e2e`"),
    }
}

/// Directory for logs, configs and screenshots (`REACH_E2E_OUT`, default
/// `target/e2e`).
pub fn out_dir() -> PathBuf {
    if let Some(dir) = OUT_DIR.get() {
        return dir.clone();
    }
    std::env::var_os("REACH_E2E_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/e2e"))
}

/// A running child process with its log file.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Starts `bin` (a binary name in `bin_dir()`) with `args` and `envs`,
    /// logging to `<log_dir>/<name>.log`.
    pub fn spawn(
        name: &str,
        bin: &str,
        args: &[String],
        envs: &[(&str, String)],
        log_dir: &Path,
    ) -> Result<Self> {
        Self::spawn_full(&[], &bin_dir()?, name, bin, args, envs, log_dir)
    }

    /// Like [`Proc::spawn`], with `wrapper` before the binary's path (e.g.
    /// `ip netns exec NS`: the binary runs on another test host). Each
    /// wrapper must exec the binary, so that signals reach it.
    pub fn spawn_in(
        wrapper: &[String],
        name: &str,
        bin: &str,
        args: &[String],
        envs: &[(&str, String)],
        log_dir: &Path,
    ) -> Result<Self> {
        Self::spawn_full(wrapper, &bin_dir()?, name, bin, args, envs, log_dir)
    }

    /// Like `spawn`, with `bin` from `dir` (e.g. another release's
    /// binaries) instead of `bin_dir()`.
    pub fn spawn_from(
        dir: &Path,
        name: &str,
        bin: &str,
        args: &[String],
        envs: &[(&str, String)],
        log_dir: &Path,
    ) -> Result<Self> {
        Self::spawn_full(&[], dir, name, bin, args, envs, log_dir)
    }

    /// `bin` from `dir`, behind `wrapper` (empty: none).
    fn spawn_full(
        wrapper: &[String],
        dir: &Path,
        name: &str,
        bin: &str,
        args: &[String],
        envs: &[(&str, String)],
        log_dir: &Path,
    ) -> Result<Self> {
        let path = dir.join(bin);
        std::fs::create_dir_all(log_dir)?;
        let log = log_dir.join(format!("{name}.log"));
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut cmd = Command::new(program);
                cmd.args(rest).arg(&path);
                cmd
            }
            None => Command::new(&path),
        };
        cmd.args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", path.display()))?;
        Ok(Proc {
            name: name.to_owned(),
            child: Some(child),
            log,
        })
    }

    /// The process name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The OS process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends a signal (e.g. `"HUP"`) with kill(1).
    pub fn signal(&self, signal: &str) -> Result<()> {
        let Some(pid) = self.pid() else {
            bail!("{} is not running", self.name);
        };
        let status = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()?;
        if !status.success() {
            bail!("kill -{signal} {pid} failed");
        }
        Ok(())
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
            let _ = child.wait().await;
        }
    }

    /// Stops the process gracefully (SIGTERM, then SIGKILL after 5 s) and
    /// returns its exit status code.
    pub async fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        if let Some(pid) = child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => {
                let _ = child.kill().await;
                None
            }
        }
    }

    /// Waits for the process to exit by itself (up to `limit`).
    pub async fn wait_exit(&mut self, limit: Duration) -> Result<Option<i32>> {
        let Some(child) = self.child.as_mut() else {
            bail!("{} is not running", self.name);
        };
        let status = tokio::time::timeout(limit, child.wait())
            .await
            .with_context(|| format!("{} did not exit within {limit:?}", self.name))??;
        self.child = None;
        Ok(status.code())
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Path of the log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}
