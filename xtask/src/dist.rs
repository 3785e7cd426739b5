//! `cargo xtask dist` (release archives, Debian packages, SHA-256 sums and
//! a CycloneDX SBOM in `target/dist`) and `cargo xtask package-test`
//! (lintian on those packages, then installs them on this machine, runs the
//! packaged CA and connector as the `reach` user with the packaged configs
//! on two test hosts (network namespaces), the connector dialling the CA
//! host by name, sees an application on the connector's host Up and an
//! access routed, backs the CA up, rebuilds its host and restores it as the
//! book says (`restore`), upgrades them to a newer package, purges them and
//! checks the machine is as it was). The Debian details are in `debian`.

mod admin;
mod restore;

use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{build_release, cargo, debian, root, run, target_dir};

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
pub(crate) fn version() -> Result<String> {
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
    let epoch: u64 = mtime.parse().unwrap_or(0);

    for (bin, package) in BINARIES {
        let built = bin_dir.join(bin);
        // Man pages and completions, from the binary's own clap definitions;
        // also where the Debian package's assets point (`target/release/reach-docs`).
        let docs = bin_dir.join("reach-docs").join(bin);
        let _ = std::fs::remove_dir_all(&docs);
        let mut generate = Command::new(&built);
        generate.arg("--generate-docs").arg(&docs);
        run(generate, &format!("{bin} --generate-docs"))?;
        debian::stage(&bin_dir, bin, package, &version, &docs, epoch)?;

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
        debian::complete_dbgsym(&dist, &bin_dir, package, epoch)?;
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
        ("group reach-admin", "getent", &["group", admin::GROUP][..]),
        (
            "user reach-pt-admin",
            "getent",
            &["passwd", admin::ADMIN][..],
        ),
        (
            "user reach-pt-other",
            "getent",
            &["passwd", admin::OTHER][..],
        ),
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
    /// line with the unit's environment, on `host` (see [`TestHost::run`]).
    fn start(
        host: &[String],
        unit: &str,
        caps: Option<&str>,
        env: &[(String, String)],
        log: PathBuf,
    ) -> Result<Daemon> {
        let argv = exec_start(unit)?;
        let file = std::fs::File::create(&log)?;
        let mut cmd = match host.split_first() {
            Some((program, rest)) => {
                let mut cmd = Command::new(program);
                cmd.args(rest).arg("setpriv");
                cmd
            }
            None => Command::new("setpriv"),
        };
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
    // Debian's checks, and the newer packages the upgrade installs.
    debian::lintian(&dist)?;
    for deb in &debs {
        debian::check_documentation(deb, &work)?;
    }
    let (newer, newer_version) = debian::newer_packages(&work, &version()?, BINARIES)?;
    let packages: Vec<&str> = BINARIES.iter().map(|(_, p)| *p).collect();
    let units: Vec<String> = packages.iter().map(|p| format!("{p}.service")).collect();

    let started = Instant::now();
    let mut install = Command::new("dpkg");
    install
        .env("DEBIAN_FRONTEND", "noninteractive")
        .arg("-i")
        .args(&debs);
    let result = run(install, "dpkg -i")
        .and_then(|()| exercise(&work, started))
        .and_then(|()| debian::verify_units(&units))
        .and_then(|()| debian::upgrade(&newer, &newer_version, &packages));
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
        "xtask: package-test: lintian clean, installed, Up, access routed, upgraded, purged, nothing left ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The CA's host and the connector's in `package-test`: network
/// namespaces joined by a veth pair ([`TwoHosts`]).
const CA_HOST: TestHost = TestHost {
    ns: "reach-pt-ca",
    name: "reach-ca",
    fqdn: "reach-ca.example.test",
    ip: "10.78.0.1",
};
const CONNECTOR_HOST: TestHost = TestHost {
    ns: "reach-pt-connector",
    name: "reach-connector",
    fqdn: "reach-connector.example.test",
    ip: "10.78.0.2",
};
/// The application's port on the connector's host.
const APP_PORT: u16 = 8080;

/// Between install and purge, on two hosts (the CA package's and the
/// connector package's): configure, run, see Up, route an access.
fn exercise(work: &Path, installed_at: Instant) -> Result<()> {
    let hosts = TwoHosts::create()?;
    let (ca_host, far) = (&hosts.ca, &hosts.connector);
    // The application, on the connector's host.
    let testhost = target_dir().join("release").join("reach-testhost");
    if !testhost.exists() {
        bail!(
            "{} is missing (the application package-test serves): run `cargo xtask e2e` or `cargo xtask dist` first",
            testhost.display()
        );
    }
    let mut serve = far.command(&testhost);
    serve
        .args(["--tcp", &format!("{}:{APP_PORT}", far.ip)])
        .stdin(Stdio::null());
    let _app = Killed(serve.spawn().context("starting the application")?);
    let (grpc_port, http_port) = configure(ca_host, far)?;
    // The connector's host has its own copy of the CA's root, as
    // connector.env says for a connector on another host.
    let connector_root = Path::new("/etc/reach/ca.pem");
    let _copied = Removed(connector_root);
    let connector_env = connector_env(
        &format!("https://{}:{grpc_port}", ca_host.fqdn),
        connector_root,
    )?;
    check_versions()?;
    check_config()?;
    let mut ca = Daemon::start(
        &ca_host.run_named(),
        "reach-central-authority.service",
        None,
        &[],
        work.join("ca.log"),
    )?;
    let root = Path::new("/var/lib/reach/ca/ca.pem");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !root.exists() {
        ca.check_running("the packaged CA")?;
        if Instant::now() > deadline {
            bail!("the packaged CA wrote no {} within 30 s", root.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // As an operator copies a public certificate to another host: readable
    // by all (the CA's own copy is for reach-admin, 0640).
    std::fs::copy(root, connector_root)?;
    std::fs::set_permissions(
        connector_root,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o644),
    )?;
    let mut connector = Daemon::start(
        &far.run(),
        "reach-connector-agent.service",
        Some("+net_raw"),
        &connector_env,
        work.join("connector.log"),
    )?;
    // The CA's HTTP API from the connector's host, by the CA host's name.
    let api = format!("https://{}:{http_port}", ca_host.fqdn);
    wait_up(far, &api, &mut ca, &mut connector)?;
    let up = installed_at.elapsed();
    eprintln!(
        "xtask: package-test: install to Up: {:.1} s",
        up.as_secs_f64()
    );
    route_access(far, &api)?;
    admin::check(ca_host, &api, "connector-1")?;
    std::fs::write(
        work.join("install-to-up.txt"),
        format!("{:.1}\n", up.as_secs_f64()),
    )?;
    let restore = restore::Restore {
        work,
        ca_host,
        far,
        api: &api,
    };
    restore.run(ca, &mut connector)?;
    drop(connector);
    Ok(())
}

/// A file removed when dropped.
struct Removed<'a>(&'a Path);

impl Drop for Removed<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// The packaged `ca.toml` with a segment for the application on `far`
/// appended, its listen addresses as shipped (every address); returns the
/// gRPC and HTTP ports it listens on.
fn configure(ca_host: &TestHost, far: &TestHost) -> Result<(u16, u16)> {
    let ca_toml = Path::new("/etc/reach/ca.toml");
    let mut text = std::fs::read_to_string(ca_toml)
        .with_context(|| format!("the package did not install {}", ca_toml.display()))?;
    let port = |key: &str| -> Result<u16> {
        let listen = text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim_start().strip_prefix('='))
            .and_then(|rest| rest.split('"').nth(1))
            .with_context(|| format!("{} has no {key}", ca_toml.display()))?;
        let addr: SocketAddr = listen
            .parse()
            .with_context(|| format!("{}: {key} = {listen:?}", ca_toml.display()))?;
        if !addr.ip().is_unspecified() {
            bail!(
                "{}: {key} = {listen:?}; the package listens on every address, so that a connector on {} reaches the CA on {}",
                ca_toml.display(),
                far.name,
                ca_host.name
            );
        }
        Ok(addr.port())
    };
    let ports = (port("grpc_listen")?, port("http_listen")?);
    text += &format!(
        "\n[[segments]]\nname = \"package-test\"\napplications = [\"{}\"]\ntcp_ports = [\"{APP_PORT}\"]\nhealth_reporting = \"continuous\"\nreport_interval_s = 1\nconnector_groups = [\"default\"]\n",
        far.ip
    );
    std::fs::write(ca_toml, text)?;
    Ok(ports)
}

/// The packaged `connector.env` with `REACH_CA` set to `ca` and
/// `REACH_CA_CERT` to `root` (the rest as shipped); returns its variables.
fn connector_env(ca: &str, root: &Path) -> Result<Vec<(String, String)>> {
    let env_file = Path::new("/etc/reach/connector.env");
    let text = std::fs::read_to_string(env_file)
        .with_context(|| format!("the package did not install {}", env_file.display()))?;
    let mut connector_env = Vec::new();
    let mut edited = String::new();
    for line in text.lines() {
        let line = if line.starts_with("REACH_CA=") {
            format!("REACH_CA={ca}")
        } else if line.starts_with("REACH_CA_CERT=") {
            format!("REACH_CA_CERT={}", root.display())
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
    Ok(connector_env)
}

/// `--version` names the version, the commit and the build date.
fn check_versions() -> Result<()> {
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
    Ok(())
}

/// The unit's `ExecStartPre`: the packaged config (every address, no
/// `[tls] server_names`) is valid, with the warning that says what the
/// generated server certificate names and the key to set.
fn check_config() -> Result<()> {
    let out = Command::new("/usr/bin/central-authority")
        .args(["check-config", "/etc/reach/ca.toml"])
        .output()
        .context("running central-authority check-config")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("xtask: package-test: check-config: {said}");
    if !out.status.success() {
        bail!("central-authority check-config (the unit's ExecStartPre) failed: {said}");
    }
    if !said.contains("warning: ") || !said.contains("[tls] server_names") {
        bail!("check-config did not warn that [tls] server_names is empty: {said}");
    }
    Ok(())
}

/// Waits until the application on `far` is Up, asking the CA's API at
/// `api` from `far`.
fn wait_up(far: &TestHost, api: &str, ca: &mut Daemon, connector: &mut Daemon) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        ca.check_running("the packaged CA")?;
        connector.check_running("the packaged connector")?;
        let mut health = far.command("/usr/bin/central-authority");
        health
            .args(["api", "--url", api, "--ca-cert", "/var/lib/reach/ca/ca.pem"])
            .args(["--token-file", "/etc/reach/secrets/api.token"])
            .args(["health", "--status", "up", "--segment", "package-test"]);
        let out = health.output()?;
        if out.status.success() && String::from_utf8_lossy(&out.stdout).contains(far.ip) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{}:{APP_PORT} was not Up within 60 s; health said:\n{}{}",
                far.ip,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An access from `far`, over HTTPS to the CA's API at `api` with the
/// CA's generated root, routed through the packaged connector.
fn route_access(far: &TestHost, api: &str) -> Result<()> {
    let mut token = String::new();
    std::fs::File::open("/etc/reach/secrets/api.token")?.read_to_string(&mut token)?;
    let mut access = far.command("curl");
    access
        .args([
            "-sS",
            "--fail-with-body",
            "--cacert",
            "/var/lib/reach/ca/ca.pem",
        ])
        .arg("-H")
        .arg(format!("Authorization: Bearer {}", token.trim()))
        .args(["-H", "content-type: application/json", "-d"])
        .arg(format!(
            r#"{{"host":"{}","protocol":"tcp","port":{APP_PORT}}}"#,
            far.ip
        ))
        .arg(format!("{api}/api/v1/access"));
    let answer = output(access, "POST /api/v1/access")?;
    eprintln!("xtask: package-test: access: {answer}");
    if !answer.contains("connector-1") {
        bail!("the access was not routed through the packaged connector: {answer}");
    }
    Ok(())
}

/// A child killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One test host: a network namespace with an address on the link to the
/// other and a hosts file (`/etc/netns/NS/hosts`, which `ip netns exec`
/// mounts over `/etc/hosts`) naming both.
struct TestHost {
    ns: &'static str,
    name: &'static str,
    fqdn: &'static str,
    ip: &'static str,
}

impl TestHost {
    /// The words that run a program on this host: `ip netns exec NS`.
    fn run(&self) -> Vec<String> {
        ["ip", "netns", "exec", self.ns].map(str::to_owned).to_vec()
    }

    /// Those words with the host's own host name (a UTS namespace of its
    /// own, as a separate machine has), which the CA's generated server
    /// certificate names.
    fn run_named(&self) -> Vec<String> {
        let mut words = self.run();
        words.extend(
            [
                "unshare",
                "--uts",
                "sh",
                "-c",
                &format!("hostname {} && exec \"$0\" \"$@\"", self.name),
            ]
            .map(str::to_owned),
        );
        words
    }

    /// `program` run on this host.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.ns]).arg(program);
        cmd
    }

    fn etc(&self) -> PathBuf {
        Path::new("/etc/netns").join(self.ns)
    }
}

/// [`CA_HOST`] and [`CONNECTOR_HOST`], joined by a veth pair on a /24 and
/// each with `lo` up, a hosts file naming both and a `resolv.conf` naming
/// its own loopback (no lookup leaves the host); removed on drop, also
/// when the test fails.
struct TwoHosts {
    ca: TestHost,
    connector: TestHost,
}

fn ip(args: &[&str]) -> Result<()> {
    let mut cmd = Command::new("ip");
    cmd.args(args).stdout(Stdio::null());
    run(cmd, &format!("ip {}", args.join(" ")))
}

impl TwoHosts {
    fn create() -> Result<TwoHosts> {
        let hosts = TwoHosts {
            ca: CA_HOST,
            connector: CONNECTOR_HOST,
        };
        for h in [&hosts.ca, &hosts.connector] {
            // Left over by a run that was killed.
            let _ = Command::new("ip")
                .args(["netns", "del", h.ns])
                .stderr(Stdio::null())
                .status();
        }
        hosts
            .build()
            .context("two hosts in network namespaces (needs iproute2)")?;
        Ok(hosts)
    }

    fn build(&self) -> Result<()> {
        let mut names = String::from("127.0.0.1 localhost\n::1 localhost\n");
        for h in [&self.ca, &self.connector] {
            names += &format!("{} {} {}\n", h.ip, h.fqdn, h.name);
        }
        for h in [&self.ca, &self.connector] {
            ip(&["netns", "add", h.ns])?;
            std::fs::create_dir_all(h.etc())?;
            std::fs::write(h.etc().join("hosts"), &names)?;
            std::fs::write(h.etc().join("resolv.conf"), "nameserver 127.0.0.1\n")?;
        }
        ip(&[
            "link",
            "add",
            "rpt-ca",
            "netns",
            self.ca.ns,
            "type",
            "veth",
            "peer",
            "name",
            "rpt-connector",
            "netns",
            self.connector.ns,
        ])?;
        for (h, dev) in [(&self.ca, "rpt-ca"), (&self.connector, "rpt-connector")] {
            ip(&[
                "-n",
                h.ns,
                "addr",
                "add",
                &format!("{}/24", h.ip),
                "dev",
                dev,
            ])?;
            ip(&["-n", h.ns, "link", "set", dev, "up"])?;
            ip(&["-n", h.ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for h in [&self.ca, &self.connector] {
            let _ = Command::new("ip").args(["netns", "del", h.ns]).status();
            let _ = std::fs::remove_dir_all(h.etc());
        }
        // `/etc/netns` itself, when no other namespace's files are in it.
        let _ = std::fs::remove_dir("/etc/netns");
    }
}
