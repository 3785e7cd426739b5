//! A real browser for the dashboard's end-to-end test and benchmark:
//! Debian's headless Chromium driven through ChromeDriver's W3C WebDriver
//! HTTP API (plain JSON over HTTP, so no extra client library).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// Where Debian installs them (`.ci/run` installs both).
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// ChromeDriver from Debian's `chromium-driver`.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A ChromeDriver process with one headless Chromium session.
#[derive(Debug)]
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
}

/// Whether Chromium and ChromeDriver are installed (the error says which
/// is missing and how to get it).
pub fn available() -> Result<()> {
    for tool in [CHROMIUM, CHROMEDRIVER] {
        if !Path::new(tool).exists() {
            bail!(
                "{tool} is missing: install Debian's chromium and chromium-driver (.ci/run does)"
            );
        }
    }
    Ok(())
}

impl Browser {
    /// Starts ChromeDriver and a headless Chromium with a fresh profile in
    /// `profile_dir`.
    pub async fn start(profile_dir: &Path) -> Result<Self> {
        Self::start_with(profile_dir, &[]).await
    }

    /// Like `start`, with extra Chromium command-line arguments (such as
    /// `--host-resolver-rules=MAP *.reach.test 127.0.0.1`, so that pages
    /// can be opened from several origins of one loopback server).
    pub async fn start_with(profile_dir: &Path, extra_args: &[String]) -> Result<Self> {
        available()?;
        // ChromeDriver speaks plain HTTP; reqwest still wants a TLS provider.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?;
        // The port is picked by binding and releasing it, so another process
        // can take it before ChromeDriver binds it (ChromeDriver then exits);
        // seen once in CI. Up to three tries, each on a fresh port.
        let mut tries = Vec::new();
        let (driver, base) = loop {
            let port = {
                let l = TcpListener::bind("127.0.0.1:0")?;
                l.local_addr()?.port()
            };
            let mut driver = Command::new(CHROMEDRIVER)
                .arg(format!("--port={port}"))
                .arg("--allowed-ips=127.0.0.1")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                // Its own process group, Chromium included, so that it all
                // ends with the Browser (`kill_group`), even when the
                // session could not be deleted or the test failed early.
                .process_group(0)
                .spawn()
                .context("starting chromedriver")?;
            let base = format!("http://127.0.0.1:{port}");
            let ready = crate::poll::retry(Duration::from_secs(15), || async {
                let v: Value = http
                    .get(format!("{base}/status"))
                    .send()
                    .await?
                    .json()
                    .await?;
                if v["value"]["ready"] == true {
                    Ok(())
                } else {
                    bail!("chromedriver not ready: {v}")
                }
            })
            .await;
            match ready {
                Ok(()) => break (driver, base),
                Err(e) => {
                    let exited = driver.try_wait().ok().flatten();
                    tries.push(format!("port {port}: {e:#} (exited: {exited:?})"));
                    kill_group(&mut driver).await;
                    if tries.len() == 3 {
                        bail!("chromedriver did not become ready: {}", tries.join("; "));
                    }
                }
            }
        };
        let profile: PathBuf = profile_dir.to_path_buf();
        std::fs::create_dir_all(&profile)?;
        let mut args: Vec<String> = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
            // The CA serves its dashboard over TLS with its own generated
            // root, which this throwaway profile does not trust; the
            // scenario checks the page, not the PKI.
            "--ignore-certificate-errors",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        args.extend(extra_args.iter().cloned());
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": args,
            }
        }}});
        let v: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await?
            .json()
            .await?;
        let session = v["value"]["sessionId"]
            .as_str()
            .with_context(|| format!("no WebDriver session: {v}"))?
            .to_owned();
        Ok(Browser {
            driver,
            base,
            session,
            http,
        })
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut req = self.http.request(method, &url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req.send().await?.json().await?;
        if v["value"].get("error").is_some() {
            bail!("WebDriver {path}: {}", v["value"]);
        }
        Ok(v["value"].clone())
    }

    /// The cookies of the current page's site, as WebDriver lists them
    /// (`HttpOnly` ones included).
    pub async fn cookies(&self) -> Result<Value> {
        self.call(reqwest::Method::GET, "/cookie", None).await
    }

    /// Loads `url`. A navigation that ends on Chromium's own error page
    /// (refused, reset, empty response, certificate) is tried again twice,
    /// half a second apart, with what the page said printed (an operator
    /// would press reload; seen once in CI, under load, on a first
    /// navigation); the third such page is an error naming it, never a
    /// page the caller goes on to inspect.
    pub async fn goto(&self, url: &str) -> Result<()> {
        let mut attempt = 1;
        loop {
            self.call(reqwest::Method::POST, "/url", Some(json!({"url": url})))
                .await?;
            let at = self.call(reqwest::Method::GET, "/url", None).await?;
            if !at.as_str().is_some_and(|u| u.starts_with("chrome-error:")) {
                return Ok(());
            }
            let text = self
                .eval(
                    "return document.body ? document.body.innerText : ''",
                    json!([]),
                )
                .await
                .unwrap_or_default();
            if attempt == 3 {
                bail!("opening {url} ended on Chromium's error page three times: {text}");
            }
            eprintln!(
                "browser: opening {url} ended on Chromium's error page (try {attempt}): {text}"
            );
            attempt += 1;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Runs `script` (a function body; `arguments[i]` are `args`) in the page.
    pub async fn eval(&self, script: &str, args: Value) -> Result<Value> {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// Opens a new tab and makes it the current one; returns its handle.
    pub async fn new_tab(&self) -> Result<String> {
        let v = self
            .call(
                reqwest::Method::POST,
                "/window/new",
                Some(json!({"type": "tab"})),
            )
            .await?;
        let handle = v["handle"]
            .as_str()
            .with_context(|| format!("no window handle: {v}"))?
            .to_owned();
        self.call(
            reqwest::Method::POST,
            "/window",
            Some(json!({"handle": handle})),
        )
        .await?;
        Ok(handle)
    }

    /// The current tab's handle.
    pub async fn current_tab(&self) -> Result<String> {
        let v = self.call(reqwest::Method::GET, "/window", None).await?;
        Ok(v.as_str()
            .with_context(|| format!("no window handle: {v}"))?
            .to_owned())
    }

    /// Makes the tab `handle` the current one.
    pub async fn switch_tab(&self, handle: &str) -> Result<()> {
        self.call(
            reqwest::Method::POST,
            "/window",
            Some(json!({"handle": handle})),
        )
        .await
        .map(|_| ())
    }

    /// Saves a PNG screenshot of the viewport.
    pub async fn screenshot(&self, path: &Path) -> Result<()> {
        let v = self.call(reqwest::Method::GET, "/screenshot", None).await?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().context("screenshot is not a string")?)?;
        std::fs::write(path, png)?;
        Ok(())
    }

    /// Ends the session and ChromeDriver (and whatever of Chromium a failed
    /// session left running).
    pub async fn close(mut self) {
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            self.call(reqwest::Method::DELETE, "", None),
        )
        .await;
        kill_group(&mut self.driver).await;
    }
}

impl Drop for Browser {
    /// A Browser dropped without `close` (a test that failed) still takes
    /// Chromium with it: ChromeDriver alone would leave it running.
    fn drop(&mut self) {
        signal_group(&self.driver);
    }
}

/// SIGKILL to the process group `driver` leads (ChromeDriver and the
/// Chromium it started).
#[allow(unsafe_code)]
fn signal_group(driver: &Child) {
    if let Some(pid) = driver.id().and_then(|p| libc::pid_t::try_from(p).ok()) {
        // SAFETY: kill(2) with a negative pid signals that process group;
        // it touches no memory of ours. The group is ChromeDriver's own
        // (`process_group(0)`), so nothing else is signalled.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

/// Kills `driver`'s process group and reaps ChromeDriver.
async fn kill_group(driver: &mut Child) {
    signal_group(driver);
    let _ = driver.kill().await;
}
