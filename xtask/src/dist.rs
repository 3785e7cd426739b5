//! `cargo xtask dist` (release archives, Debian packages, SHA-256 sums and
//! a CycloneDX SBOM in `target/dist`) and `cargo xtask package-test`
//! (installs those packages on this machine, runs the packaged CA and
//! connector as the `reach` user with the packaged configs, sees an
//! application Up and an access routed, purges them and checks the machine
//! is as it was).

use std::io::Read;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{build_release, cargo, root, run, target_dir};

/// The shipped binaries: (binary, Debian package / archive name).
const BINARIES: &[(&str, &str)] = &[
    ("central-authority", "reach-central-authority"),
    ("connector-agent", "reach-connector-agent"),
];

/// Each shipped (stripped) binary must stay under this size.
const MAX_BINARY_BYTES: u64 = 30 * 1024 * 1024;

fn output(mut cmd: Command, what: &str) -> Result<String> {
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !out.status.success() {
        bail!("{what} failed ({})", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn installed(cmd: &str, arg: &str) -> bool {
    Command::new(cmd)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The workspace version (`[workspace.package] version`).
fn version() -> Result<String> {
    let text = std::fs::read_to_string(root().join("Cargo.toml"))?;
    text.lines()
        .find_map(|l| {
            let v = l.strip_prefix("version = \"")?;
            v.strip_suffix('"').map(str::to_owned)
        })
        .context("no version in Cargo.toml")
}

/// `cargo xtask dist`: see the module doc. Reuses the release build the
/// end-to-end scenarios and the demo run (`build_release`).
pub fn dist() -> Result<()> {
    for (tool, hint) in [
        ("objcopy", "apt-get install binutils"),
        ("tar", "apt-get install tar"),
        ("sha256sum", "apt-get install coreutils"),
    ] {
        if !installed(tool, "--version") {
            bail!("{tool} is not installed: `{hint}`");
        }
    }
    for (sub, krate) in [("deb", "cargo-deb"), ("cyclonedx", "cargo-cyclonedx")] {
        let ok = cargo()
            .args([sub, "--version"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            bail!("{krate} is not installed: `cargo install {krate} --locked` (.ci/run does this)");
        }
    }
    let started = Instant::now();
    let bin_dir = build_release()?;
    let version = version()?;
    let arch = std::env::consts::ARCH;
    let dist = target_dir().join("dist");
    let _ = std::fs::remove_dir_all(&dist);
    let stage = target_dir().join("dist-stage");
    let _ = std::fs::remove_dir_all(&stage);
    std::fs::create_dir_all(dist.join("debug"))?;
    // Reproducible archives: every entry dated at the commit.
    let mut log = Command::new("git");
    log.current_dir(root()).args(["log", "-1", "--format=%ct"]);
    let mtime = output(log, "git log").unwrap_or_else(|_| "0".into());

    for (bin, package) in BINARIES {
        let built = bin_dir.join(bin);
        // Man pages and completions, from the binary's own clap definitions;
        // also where the Debian package's assets point (`target/release/reach-docs`).
        let docs = bin_dir.join("reach-docs").join(bin);
        let _ = std::fs::remove_dir_all(&docs);
        let mut generate = Command::new(&built);
        generate.arg("--generate-docs").arg(&docs);
        run(generate, &format!("{bin} --generate-docs"))?;

        let name = format!("{package}-{version}-{arch}-linux");
        let top = stage.join(&name);
        for sub in ["bin", "man", "completions", "config", "systemd"] {
            std::fs::create_dir_all(top.join(sub))?;
        }
        // Debug info split beside the binary: the archive ships the
        // stripped binary, `debug/<bin>.debug` (linked by
        // .gnu_debuglink) symbolises its backtraces and core dumps.
        let debug = dist.join("debug").join(format!("{bin}.debug"));
        let mut keep = Command::new("objcopy");
        keep.args(["--only-keep-debug", "--compress-debug-sections=zlib"])
            .arg(&built)
            .arg(&debug);
        run(keep, &format!("objcopy --only-keep-debug {bin}"))?;
        let shipped = top.join("bin").join(bin);
        let mut strip = Command::new("objcopy");
        strip
            .arg("--strip-debug")
            .arg(format!("--add-gnu-debuglink={}", debug.display()))
            .arg(&built)
            .arg(&shipped);
        run(strip, &format!("objcopy --strip-debug {bin}"))?;
        let size = std::fs::metadata(&shipped)?.len();
        eprintln!(
            "xtask: {bin}: {:.1} MB shipped (built {:.1} MB, debug info {:.1} MB)",
            size as f64 / 1e6,
            std::fs::metadata(&built)?.len() as f64 / 1e6,
            std::fs::metadata(&debug)?.len() as f64 / 1e6
        );
        if size > MAX_BINARY_BYTES {
            bail!("{bin} is {size} bytes stripped, over the {MAX_BINARY_BYTES}-byte budget");
        }
        for entry in std::fs::read_dir(&docs)? {
            let path = entry?.path();
            let sub = if path.extension().is_some_and(|e| e == "1") {
                "man"
            } else {
                "completions"
            };
            if let Some(file) = path.file_name() {
                std::fs::copy(&path, top.join(sub).join(file))?;
            }
        }
        let deploy = root().join("deploy");
        let mut files: Vec<(PathBuf, PathBuf)> = vec![
            (root().join("LICENSE"), top.join("LICENSE")),
            (root().join("README.md"), top.join("README.md")),
        ];
        match *bin {
            "central-authority" => files.extend([
                (deploy.join("debian/ca.toml"), top.join("config/ca.toml")),
                (
                    deploy.join("examples/ca.toml"),
                    top.join("config/ca.example.toml"),
                ),
                (
                    deploy.join("systemd/reach-central-authority.service"),
                    top.join("systemd/reach-central-authority.service"),
                ),
            ]),
            _ => files.extend([
                (
                    deploy.join("debian/connector.env"),
                    top.join("config/connector.env"),
                ),
                (
                    deploy.join("systemd/reach-connector-agent.service"),
                    top.join("systemd/reach-connector-agent.service"),
                ),
            ]),
        }
        for (from, to) in files {
            std::fs::copy(&from, &to)
                .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        }
        let mut tar = Command::new("tar");
        tar.current_dir(&stage)
            .args([
                "--sort=name",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
                &format!("--mtime=@{mtime}"),
                "-czf",
            ])
            .arg(dist.join(format!("{name}.tar.gz")))
            .arg(&name);
        run(tar, &format!("archive {name}"))?;

        // The Debian package, on the same release binary: cargo-deb strips
        // it and moves its debug info into a `-dbgsym` package.
        let mut deb = cargo();
        deb.args([
            "deb",
            "--locked",
            "--no-build",
            "-p",
            bin,
            "--dbgsym",
            "--compress-debug-symbols=zlib",
            "--output",
        ])
        .arg(&dist);
        run(deb, &format!("cargo deb {package}"))?;
    }

    // The SBOM: every crate each binary is built from. cargo-cyclonedx
    // writes one file beside every workspace member's manifest; the two
    // binaries' are moved into dist, the rest removed.
    const SBOM: &str = "reach-sbom";
    let mut sbom = cargo();
    sbom.args([
        "cyclonedx",
        "--format",
        "json",
        "--spec-version",
        "1.5",
        "--all",
        "--override-filename",
        SBOM,
    ]);
    let sbom_result = run(sbom, "cargo cyclonedx");
    let mut moved = Vec::new();
    for (bin, package) in BINARIES {
        let written = root().join("crates").join(bin).join(format!("{SBOM}.json"));
        let to = dist.join(format!("{package}-{version}.cdx.json"));
        moved.push(
            std::fs::copy(&written, &to)
                .with_context(|| format!("moving {} to {}", written.display(), to.display())),
        );
    }
    let mut dirs = vec![root(), root().join("xtask")];
    for parent in ["crates", "tests"] {
        if let Ok(entries) = std::fs::read_dir(root().join(parent)) {
            dirs.extend(entries.filter_map(|e| e.ok().map(|e| e.path())));
        }
    }
    for dir in dirs {
        let _ = std::fs::remove_file(dir.join(format!("{SBOM}.json")));
    }
    sbom_result?;
    for m in moved {
        m?;
    }

    // SHA256SUMS over everything shipped (archives, packages, SBOMs, debug files).
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dist)? {
        let path = entry?.path();
        if path.is_file()
            && let Some(name) = path.file_name()
        {
            names.push(PathBuf::from(name));
        }
    }
    for entry in std::fs::read_dir(dist.join("debug"))? {
        if let Some(name) = entry?.path().file_name() {
            names.push(Path::new("debug").join(name));
        }
    }
    names.sort();
    let mut sums = Command::new("sha256sum");
    sums.current_dir(&dist).args(&names);
    let text = output(sums, "sha256sum")?;
    std::fs::write(dist.join("SHA256SUMS"), text + "\n")?;
    let _ = std::fs::remove_dir_all(&stage);
    eprintln!(
        "xtask: dist: {} in {:.0} s:",
        dist.display(),
        started.elapsed().as_secs_f64()
    );
    for name in names {
        eprintln!("  {}", name.display());
    }
    Ok(())
}

/// The `reach` footprint on this machine: what `package-test` requires to
/// be absent before and after.
fn footprint() -> Vec<String> {
    let mut found = Vec::new();
    for (what, cmd, args) in [
        ("user reach", "getent", &["passwd", "reach"][..]),
        ("group reach", "getent", &["group", "reach"][..]),
    ] {
        if Command::new(cmd)
            .args(args)
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
        {
            found.push(what.to_owned());
        }
    }
    for path in [
        "/etc/reach",
        "/var/lib/reach",
        "/usr/bin/central-authority",
        "/usr/bin/connector-agent",
    ] {
        if Path::new(path).exists() {
            found.push(path.to_owned());
        }
    }
    for dir in [
        "/lib/systemd/system",
        "/usr/lib/systemd/system",
        "/etc/systemd/system",
    ] {
        for unit in [
            "reach-central-authority.service",
            "reach-connector-agent.service",
        ] {
            let path = Path::new(dir).join(unit);
            if path.exists() {
                found.push(path.display().to_string());
            }
        }
    }
    for (_, package) in BINARIES {
        let status = Command::new("dpkg-query")
            .args(["-W", "-f=${db:Status-Status}", package])
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        if !status.is_empty() && status != "not-installed" {
            found.push(format!("package {package} ({status})"));
        }
    }
    found
}

/// The packages `dist` built, by Debian package name.
fn package_file(dist: &Path, package: &str) -> Result<PathBuf> {
    let prefix = format!("{package}_");
    std::fs::read_dir(dist)
        .with_context(|| format!("{}: run `cargo xtask dist` first", dist.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.extension().is_some_and(|e| e == "deb")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .with_context(|| format!("no {prefix}*.deb in {}", dist.display()))
}

fn free_port() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The command line of the installed unit's `ExecStart=`.
fn exec_start(unit: &str) -> Result<Vec<String>> {
    let path = Path::new("/lib/systemd/system").join(unit);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("the package did not install {}", path.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .with_context(|| format!("no ExecStart= in {}", path.display()))
}

/// A packaged daemon run as `reach`, like its unit would (killed on drop).
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// `setpriv` to the `reach` user and group, with the unit's ambient
    /// capabilities (`caps`, e.g. `+net_raw`), running the unit's command
    /// line with the unit's environment.
    fn start(
        unit: &str,
        caps: Option<&str>,
        env: &[(String, String)],
        log: PathBuf,
    ) -> Result<Daemon> {
        let argv = exec_start(unit)?;
        let file = std::fs::File::create(&log)?;
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=reach", "--regid=reach", "--init-groups"]);
        if let Some(caps) = caps {
            cmd.arg(format!("--inh-caps={caps}"))
                .arg(format!("--ambient-caps={caps}"));
        }
        cmd.arg("--")
            .args(&argv)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        eprintln!("xtask: package-test: {unit}: {cmd:?}");
        let child = cmd.spawn().with_context(|| format!("starting {unit}"))?;
        Ok(Daemon { child, log })
    }

    fn check_running(&mut self, what: &str) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!("{what} exited ({status}):\n{log}");
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `cargo xtask package-test`: see the module doc. Needs root (dpkg) and a
/// machine without any reach package, user or directory (refuses
/// otherwise, so it never removes what it did not make).
pub fn package_test() -> Result<()> {
    let uid = output(
        {
            let mut c = Command::new("id");
            c.arg("-u");
            c
        },
        "id -u",
    )?;
    if uid != "0" {
        bail!("package-test installs packages: run it as root");
    }
    for tool in ["dpkg", "setpriv", "curl"] {
        if !installed(tool, "--version") {
            bail!("{tool} is not installed (package-test needs it)");
        }
    }
    let before = footprint();
    if !before.is_empty() {
        bail!(
            "this machine already has reach installed or left over ({}): package-test only runs on a machine without it",
            before.join(", ")
        );
    }
    let dist = target_dir().join("dist");
    let debs: Vec<PathBuf> = BINARIES
        .iter()
        .map(|(_, p)| package_file(&dist, p))
        .collect::<Result<_>>()?;
    let work = target_dir().join("package-test");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;

    let started = Instant::now();
    let mut install = Command::new("dpkg");
    install
        .env("DEBIAN_FRONTEND", "noninteractive")
        .arg("-i")
        .args(&debs);
    let result = run(install, "dpkg -i").and_then(|()| exercise(&work, started));
    // Purged whatever happened, then the machine must be as it was.
    let mut purge = Command::new("dpkg");
    purge
        .env("DEBIAN_FRONTEND", "noninteractive")
        .arg("--purge")
        .args(BINARIES.iter().map(|(_, p)| p));
    let purged = run(purge, "dpkg --purge");
    let after = footprint();
    result?;
    purged?;
    if !after.is_empty() {
        bail!("purging left {} behind", after.join(", "));
    }
    eprintln!(
        "xtask: package-test: installed, Up, access routed, purged, nothing left ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Between install and purge: configure, run, see Up, route an access.
fn exercise(work: &Path, installed_at: Instant) -> Result<()> {
    // The packaged configs, pointed at free loopback ports and at an
    // application this test serves.
    let app = TcpListener::bind("127.0.0.1:0")?;
    let app_port = app.local_addr()?.port();
    std::thread::spawn(move || {
        for stream in app.incoming() {
            drop(stream);
        }
    });
    let (grpc, http) = (free_port()?, free_port()?);
    let ca_toml = Path::new("/etc/reach/ca.toml");
    let text = std::fs::read_to_string(ca_toml)
        .with_context(|| format!("the package did not install {}", ca_toml.display()))?;
    let mut edited = String::new();
    for line in text.lines() {
        if line.starts_with("grpc_listen") {
            edited += &format!("grpc_listen = \"{grpc}\"\n");
        } else if line.starts_with("http_listen") {
            edited += &format!("http_listen = \"{http}\"\n");
        } else {
            edited += line;
            edited.push('\n');
        }
    }
    edited += &format!(
        "\n[[segments]]\nname = \"package-test\"\napplications = [\"127.0.0.1\"]\ntcp_ports = [\"{app_port}\"]\nhealth_reporting = \"continuous\"\nreport_interval_s = 1\nconnector_groups = [\"default\"]\n"
    );
    std::fs::write(ca_toml, edited)?;
    let env_file = Path::new("/etc/reach/connector.env");
    let text = std::fs::read_to_string(env_file)
        .with_context(|| format!("the package did not install {}", env_file.display()))?;
    let mut connector_env = Vec::new();
    let mut edited = String::new();
    for line in text.lines() {
        let line = if line.starts_with("REACH_CA=") {
            format!("REACH_CA=https://{grpc}")
        } else {
            line.to_owned()
        };
        if !line.starts_with('#')
            && let Some((k, v)) = line.split_once('=')
        {
            connector_env.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        edited += &line;
        edited.push('\n');
    }
    std::fs::write(env_file, edited)?;

    // `--version` names the version, the commit and the build date.
    let version = version()?;
    for (bin, _) in BINARIES {
        let mut cmd = Command::new(Path::new("/usr/bin").join(bin));
        cmd.arg("--version");
        let said = output(cmd, &format!("{bin} --version"))?;
        eprintln!("xtask: package-test: {said}");
        if !(said.contains(&version) && said.contains("commit ") && said.contains("built ")) {
            bail!("`{bin} --version` says {said:?}: no version, commit and build date");
        }
    }
    let mut check = Command::new("/usr/bin/central-authority");
    check.args(["check-config", "/etc/reach/ca.toml"]);
    run(
        check,
        "central-authority check-config (the unit's ExecStartPre)",
    )?;
    let mut ca = Daemon::start(
        "reach-central-authority.service",
        None,
        &[],
        work.join("ca.log"),
    )?;
    let root = Path::new("/var/lib/reach/ca/ca.pem");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !root.exists() || std::net::TcpStream::connect(http).is_err() {
        ca.check_running("the packaged CA")?;
        if Instant::now() > deadline {
            bail!("the packaged CA did not listen on {http} within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut connector = Daemon::start(
        "reach-connector-agent.service",
        Some("+net_raw"),
        &connector_env,
        work.join("connector.log"),
    )?;
    let token = "/etc/reach/secrets/api.token";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        ca.check_running("the packaged CA")?;
        connector.check_running("the packaged connector")?;
        let mut health = Command::new("/usr/bin/central-authority");
        health
            .args(["api", "--url"])
            .arg(format!("https://{http}"))
            .arg("--ca-cert")
            .arg(root)
            .args(["--token-file", token])
            .args(["health", "--status", "up", "--segment", "package-test"]);
        let out = health.output()?;
        if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("127.0.0.1") {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "127.0.0.1:{app_port} was not Up within 60 s; health said:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let up = installed_at.elapsed();
    eprintln!(
        "xtask: package-test: install to Up: {:.1} s",
        up.as_secs_f64()
    );

    // An access, over HTTPS with the CA's generated root.
    let mut token_text = String::new();
    std::fs::File::open(token)?.read_to_string(&mut token_text)?;
    let mut access = Command::new("curl");
    access
        .args(["-sS", "--fail-with-body", "--cacert"])
        .arg(root)
        .arg("-H")
        .arg(format!("Authorization: Bearer {}", token_text.trim()))
        .args(["-H", "content-type: application/json", "-d"])
        .arg(format!(
            r#"{{"host":"127.0.0.1","protocol":"tcp","port":{app_port}}}"#
        ))
        .arg(format!("https://{http}/api/v1/access"));
    let answer = output(access, "POST /api/v1/access")?;
    eprintln!("xtask: package-test: access: {answer}");
    if !answer.contains("connector-1") {
        bail!("the access was not routed through the packaged connector: {answer}");
    }
    std::fs::write(
        work.join("install-to-up.txt"),
        format!("{:.1}\n", up.as_secs_f64()),
    )?;
    drop(connector);
    drop(ca);
    Ok(())
}
