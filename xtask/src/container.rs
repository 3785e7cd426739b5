//! `cargo xtask container-test`: builds the container image
//! (`deploy/container/Containerfile`) with podman from the release binaries,
//! on a Debian base that mmdebstrap bootstraps from Debian's archive (cached
//! under `~/.cache/reach`, keyed by how it is made), and runs it the way
//! book/src/install.md says: the image's own configuration refused for its
//! placeholder secrets; PostgreSQL, two CA replicas sharing one issuing root
//! and two connectors attached to both, on one podman network; the
//! application (the PostgreSQL server) Up, over ICMP too; an access routed
//! over HTTPS from the host; every reach container non-root on a read-only
//! root; a CA and a connector replaced by new containers on their volumes,
//! keeping their root and certificate. Everything it made is removed at the
//! end, also on failure; the base image stays, tagged by its key.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::{build_release, root, run, target_dir};

/// How the base is made: `mmdebstrap ARGS bookworm OUT`. Changing any of it
/// changes the cache key. PostgreSQL is in the base so that one bootstrap
/// serves both the image's build and the database container (114 s cold
/// against 70 s for the base alone plus a second bootstrap).
const MMDEBSTRAP_ARGS: &[&str] = &[
    "--variant=minbase",
    "--include=ca-certificates,postgresql-15",
    "--format=tar",
];
const SUITE: &str = "bookworm";
/// The base images' repository; the tag is the key.
const BASE_REPO: &str = "localhost/reach-container-test-base";
/// The label on the base image naming the key it was made with.
const BASE_KEY_LABEL: &str = "org.reach.base-key";
/// The image built and run (removed at the end).
const IMAGE: &str = "localhost/reach:container-test";
/// On everything the test makes except the base: what the clean-up removes.
const LABEL: &str = "org.reach.container-test=1";
const NETWORK: &str = "reach";
/// The test network's addresses: `NET.LAST`.
const NET: &str = "10.213.41";
/// The image's size goal (BENCHMARKS.md), in bytes as podman counts them.
const IMAGE_GOAL_BYTES: u64 = 60_000_000;
/// The image's user.
const UID: &str = "10001";
const POSTGRES: &str = "/usr/lib/postgresql/15/bin";
/// The name connectors dial: it resolves to both replicas.
const CA_NAME: &str = "ca.reach.test";
const DB_NAME: &str = "db.reach.test";
/// What the image's own configuration is refused with.
const REFUSALS: &[&str] = &[
    r#"api_tokens "admin": token is a placeholder (it contains "change-me")"#,
    r#"connector_groups "dc-east": provisioning_key is a placeholder (it contains "change-me")"#,
];

/// A container of the test: its name and the last byte of its address.
#[derive(Clone, Copy)]
struct Node {
    name: &'static str,
    last: u8,
}

impl Node {
    fn ip(self) -> String {
        format!("{NET}.{}", self.last)
    }
}

const DB: Node = Node {
    name: "reach-db",
    last: 10,
};
const CAS: [Node; 2] = [
    Node {
        name: "reach-ca1",
        last: 11,
    },
    Node {
        name: "reach-ca2",
        last: 12,
    },
];
const CONNECTORS: [Node; 2] = [
    Node {
        name: "reach-c1",
        last: 21,
    },
    Node {
        name: "reach-c2",
        last: 22,
    },
];

/// `podman --runtime runc`: crun refuses this kind of machine's hybrid
/// cgroups.
fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["--runtime", "runc"]);
    cmd
}

/// Runs `cmd`, returning its stdout; on failure the error carries stderr.
fn output(mut cmd: Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn podman_out(args: &[&str], what: &str) -> Result<String> {
    let mut cmd = podman();
    cmd.args(args);
    output(cmd, what)
}

/// `cargo xtask container-test`: see the module doc.
pub fn container_test() -> Result<()> {
    preflight()?;
    let started = Instant::now();
    let work = target_dir().join("container-test");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    // Leftovers of an interrupted run first; everything again at the end.
    let cleanup = Cleanup::now()?;
    let result = exercise(&work, started);
    if result.is_err() {
        cleanup.show_logs();
    }
    drop(cleanup);
    let size = result?;
    let left = labelled()?;
    ensure!(left.is_empty(), "the clean-up left {}", left.join(", "));
    eprintln!(
        "xtask: container-test: image {:.1} MB, two replicas and two connectors Up, access \
         routed, volumes kept, everything removed ({:.0} s)",
        size as f64 / 1e6,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Everything between the clean-ups; the image's size.
fn exercise(work: &Path, started: Instant) -> Result<u64> {
    let base = base_image()?;
    eprintln!(
        "xtask: container-test: base {base} ready at {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let binaries = stage_binaries(&build_release()?, work)?;
    let size = build_image(&base, &binaries)?;
    refuses_placeholders()?;
    let bed = Bed::start(work, &base)?;
    eprintln!(
        "xtask: container-test: started at {:.0} s",
        started.elapsed().as_secs_f64()
    );
    bed.wait_whole(Duration::from_secs(90))?;
    bed.access()?;
    non_root_and_read_only()?;
    bed.replace_connector()?;
    bed.replace_ca()?;
    Ok(size)
}

/// Podman, runc and mmdebstrap are installed, and this is root (static
/// addresses on a podman network and `chown` of the secrets need it).
fn preflight() -> Result<()> {
    let mut missing = Vec::new();
    for tool in [
        "podman",
        "runc",
        "mmdebstrap",
        "objcopy",
        "curl",
        "sha256sum",
        "tar",
    ] {
        let found = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            missing.push(tool);
        }
    }
    if !missing.is_empty() {
        bail!(
            "container-test needs what is not installed here: {} (apt-get install podman runc \
             uidmap slirp4netns fuse-overlayfs mmdebstrap binutils curl; .ci/run does this)",
            missing.join(", ")
        );
    }
    let uid = output(
        {
            let mut c = Command::new("id");
            c.arg("-u");
            c
        },
        "id -u",
    )?;
    ensure!(
        uid == "0",
        "container-test runs rootful podman: run it as root"
    );
    Ok(())
}

/// `$XDG_CACHE_HOME/reach/container-base`, else
/// `$HOME/.cache/reach/container-base`: outside the clone, which CI makes
/// afresh; a directory of its own, since older keys' files are removed.
fn cache_dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cache"),
    };
    let dir = base.join("reach").join("container-base");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// The lower-case hex SHA-256 of a file, by `sha256sum`.
fn sha256_file(path: &Path) -> Result<String> {
    let mut cmd = Command::new("sha256sum");
    cmd.arg(path);
    let out = output(cmd, "sha256sum")?;
    out.split_whitespace()
        .next()
        .map(str::to_owned)
        .context("sha256sum printed nothing")
}

/// The base's cache key: the SHA-256 of how it is made (the mmdebstrap
/// command and mmdebstrap's version), 16 hex digits.
fn base_key() -> Result<String> {
    let mut version = Command::new("mmdebstrap");
    version.arg("--version");
    let recipe = format!(
        "{}\nmmdebstrap {} {SUITE} OUT\n",
        output(version, "mmdebstrap --version")?,
        MMDEBSTRAP_ARGS.join(" ")
    );
    let file = std::env::temp_dir().join(format!("reach-base-recipe-{}", std::process::id()));
    std::fs::write(&file, recipe)?;
    let sum = sha256_file(&file);
    let _ = std::fs::remove_file(&file);
    Ok(sum?[..16].to_owned())
}

/// The base image for this key: the tagged image when it carries the key,
/// else imported from the cached tarball (made first when missing or not
/// matching its checksum). Bases of other keys are removed.
fn base_image() -> Result<String> {
    let key = base_key()?;
    let tag = format!("{BASE_REPO}:{key}");
    let label = podman_out(
        &[
            "image",
            "inspect",
            "--format",
            &format!("{{{{index .Labels \"{BASE_KEY_LABEL}\"}}}}"),
            &tag,
        ],
        "podman image inspect",
    );
    if label.as_deref().is_ok_and(|l| l == key) {
        return Ok(tag);
    }
    let tarball = cached_tarball(&key)?;
    let started = Instant::now();
    let mut import = podman();
    import
        .args(["import", "--change"])
        .arg(format!("LABEL {BASE_KEY_LABEL}={key}"))
        .arg(&tarball)
        .arg(&tag);
    run(import, "podman import (the base)")?;
    eprintln!(
        "xtask: container-test: imported {tag} in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let others = podman_out(
        &[
            "images",
            "--filter",
            &format!("reference={BASE_REPO}"),
            "--format",
            "{{.Repository}}:{{.Tag}}",
        ],
        "podman images",
    )?;
    for other in others.lines().filter(|o| *o != tag) {
        let _ = podman_out(&["rmi", other], "podman rmi (an older base)");
    }
    Ok(tag)
}

/// `base-KEY.tar` in the cache: used when its stored checksum matches;
/// otherwise mmdebstrap writes it under a temporary name, `tar -tf` reads it
/// whole, and only then it and its checksum are renamed into place. Older
/// keys' files are removed.
fn cached_tarball(key: &str) -> Result<PathBuf> {
    let dir = cache_dir()?;
    let tarball = dir.join(format!("base-{key}.tar"));
    let sum_file = dir.join(format!("base-{key}.tar.sha256"));
    if let Ok(sum) = std::fs::read_to_string(&sum_file)
        && tarball.exists()
    {
        if sha256_file(&tarball)? == sum.trim() {
            return Ok(tarball);
        }
        eprintln!(
            "xtask: container-test: {} does not match its checksum: bootstrapping again",
            tarball.display()
        );
    }
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        if name.is_some_and(|n| n.starts_with("base-")) {
            let _ = std::fs::remove_file(&path);
        }
    }
    let partial = dir.join(format!("base-{key}.partial-{}.tar", std::process::id()));
    let started = Instant::now();
    let made = make_tarball(&partial).and_then(|()| sha256_file(&partial));
    let sum = match made {
        Ok(sum) => sum,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    std::fs::rename(&partial, &tarball)?;
    let sum_partial = dir.join(format!("base-{key}.tar.sha256.partial"));
    std::fs::write(&sum_partial, format!("{sum}\n"))?;
    std::fs::rename(&sum_partial, &sum_file)?;
    eprintln!(
        "xtask: container-test: bootstrapped {} in {:.0} s",
        tarball.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(tarball)
}

/// mmdebstrap into `out`, then `tar -tf` over all of it.
fn make_tarball(out: &Path) -> Result<()> {
    let mut mm = Command::new("mmdebstrap");
    mm.args(MMDEBSTRAP_ARGS).arg(SUITE).arg(out);
    run(mm, "mmdebstrap (the base, from Debian's archive)")?;
    let mut list = Command::new("tar");
    list.arg("-tf").arg(out).stdout(Stdio::null());
    run(list, "tar -tf (the new base)")
}

/// Stripped copies of the release binaries (as `dist` ships them), in a
/// directory given to the build as `--build-context reach-binaries`.
fn stage_binaries(release: &Path, work: &Path) -> Result<PathBuf> {
    let dir = work.join("binaries");
    std::fs::create_dir_all(&dir)?;
    for bin in ["central-authority", "connector-agent"] {
        let mut strip = Command::new("objcopy");
        strip
            .arg("--strip-debug")
            .arg(release.join(bin))
            .arg(dir.join(bin));
        run(strip, &format!("objcopy --strip-debug {bin}"))?;
    }
    Ok(dir)
}

/// Builds [`IMAGE`] from `binaries` on `base`, exactly as install.md shows;
/// returns its size, which must meet the goal.
fn build_image(base: &str, binaries: &Path) -> Result<u64> {
    let started = Instant::now();
    let mut build = podman();
    build
        .current_dir(root())
        .args(["build", "--pull=never", "--layers=false"])
        .args(["-f", "deploy/container/Containerfile"])
        .args(["--build-arg", "REACH_BINARIES=prebuilt", "--build-context"])
        .arg(format!("reach-binaries={}", binaries.display()))
        .args(["--build-arg", &format!("REACH_BASE={base}")])
        .args(["--label", LABEL, "-t", IMAGE, "."]);
    run(build, "podman build")?;
    let size: u64 = podman_out(
        &["image", "inspect", "--format", "{{.Size}}", IMAGE],
        "podman image inspect",
    )?
    .parse()
    .context("podman image inspect: the size is not a number")?;
    eprintln!(
        "xtask: container-test: built {IMAGE} in {:.0} s: {:.1} MB",
        started.elapsed().as_secs_f64(),
        size as f64 / 1e6
    );
    ensure!(
        size <= IMAGE_GOAL_BYTES,
        "the image is {size} bytes, over the {IMAGE_GOAL_BYTES}-byte goal (BENCHMARKS.md)"
    );
    Ok(size)
}

/// The limits to run with. Podman asks for more open files and processes
/// than such a host permits (runc: "setrlimit: operation not permitted"):
/// the open-files hard limit this process has (`ulimit -Hn`), and 4,096
/// processes (more fails here).
fn ulimits() -> Result<[String; 4]> {
    let limits = std::fs::read_to_string("/proc/self/limits")?;
    let nofile = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .context("no open-files limit in /proc/self/limits")?;
    let nofile = match nofile {
        "unlimited" => "1048576",
        n => n,
    };
    Ok([
        "--ulimit".into(),
        format!("nofile={nofile}:{nofile}"),
        "--ulimit".into(),
        "nproc=4096:4096".into(),
    ])
}

/// The image's own configuration: the CA exits, naming both placeholders.
fn refuses_placeholders() -> Result<()> {
    let mut cmd = podman();
    cmd.args(["run", "--rm", "--read-only", "--label", LABEL])
        .args(ulimits()?)
        .arg(IMAGE);
    let out = cmd.stdin(Stdio::null()).output()?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        !out.status.success(),
        "the image's own configuration started a CA: {said}"
    );
    for refusal in REFUSALS {
        ensure!(
            said.contains(refusal),
            "the CA on the image's own configuration did not say {refusal:?}:\n{said}"
        );
    }
    eprintln!("xtask: container-test: the image's own configuration is refused: {said}");
    Ok(())
}

/// A free TCP port on the host's loopback, for a published port.
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// 64 random hex digits, 256 bits (the test's secrets).
fn random_hex() -> Result<String> {
    let mut bytes = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The running deployment.
struct Bed {
    work: PathBuf,
    base: String,
    token: String,
    /// The replicas' published HTTP ports on the host, by replica.
    http: [u16; 2],
    /// The issuing root, copied out of replica 1's volume.
    root: PathBuf,
}

impl Bed {
    /// Secrets, the network, PostgreSQL, the replicas (the first generating
    /// the root), then the connectors.
    fn start(work: &Path, base: &str) -> Result<Bed> {
        let secrets = work.join("secrets");
        std::fs::create_dir_all(&secrets)?;
        let token = random_hex()?;
        let db_password = random_hex()?;
        for (file, value) in [
            ("api.token", token.as_str()),
            ("dc-east.key", &random_hex()?),
            ("db-password", &db_password),
        ] {
            let path = secrets.join(file);
            std::fs::write(&path, format!("{value}\n"))?;
            owned_by_reach(&path, 0o400)?;
        }
        owned_by_reach(&secrets, 0o500)?;
        podman_out(
            &[
                "network",
                "create",
                "--label",
                LABEL,
                "--subnet",
                &format!("{NET}.0/24"),
                NETWORK,
            ],
            "podman network create",
        )?;
        let bed = Bed {
            work: work.to_owned(),
            base: base.to_owned(),
            token,
            http: [free_port()?, free_port()?],
            root: work.join("ca.pem"),
        };
        bed.start_db(&db_password)?;
        for (i, ca) in CAS.iter().enumerate() {
            let volume = podman_out(
                &["volume", "create", "--label", LABEL, ca.name],
                "podman volume create",
            )?;
            ensure!(volume == ca.name, "podman volume create said {volume:?}");
            std::fs::write(work.join(format!("{}.toml", ca.name)), ca_config(i))?;
            bed.run_ca(i)?;
            bed.wait_ready(i, Duration::from_secs(60))?;
            if i == 0 {
                bed.copy_root()?;
            }
        }
        for c in CONNECTORS {
            podman_out(
                &["volume", "create", "--label", LABEL, c.name],
                "podman volume create",
            )?;
            bed.run_connector(c)?;
        }
        Ok(bed)
    }
}

/// `path` owned by the image's user with `mode`, as a real deployment
/// keeps its secrets.
fn owned_by_reach(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut chown = Command::new("chown");
    chown.arg(format!("{UID}:{UID}")).arg(path);
    run(chown, "chown (a secret)")?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// The options every container of the test runs with: name, label,
/// network and address, limits.
fn container(node: Node) -> Result<Vec<String>> {
    let mut args: Vec<String> = [
        "run",
        "-d",
        "--name",
        node.name,
        "--hostname",
        node.name,
        "--label",
        LABEL,
        "--network",
        NETWORK,
    ]
    .map(str::to_owned)
    .into();
    args.extend(["--ip".to_owned(), node.ip()]);
    args.extend(ulimits()?);
    Ok(args)
}

/// Replica `i`'s configuration (0-based): every replica the same policy,
/// tokens and key, the database, the name connectors dial; replica 1
/// generates the issuing root in its data directory, the other loads it
/// from replica 1's volume (mounted read-only).
fn ca_config(i: usize) -> String {
    let issuer = if i == 0 {
        String::new()
    } else {
        "issuer_cert_file = \"/etc/reach/root/ca.pem\"\n\
         issuer_key_file = \"/etc/reach/root/ca.key\"\n"
            .to_owned()
    };
    format!(
        r#"[server]
grpc_listen = "0.0.0.0:7443"
http_listen = "0.0.0.0:7480"
data_dir = "/var/lib/reach"

[tls]
server_names = ["{CA_NAME}"]
{issuer}
[store]
url = "postgres://reach@{DB_NAME}:5432/reach?sslmode=disable"
password_file = "/etc/reach/secrets/db-password"

[replica]
id = "ca{n}"

[[api_tokens]]
name = "admin"
token_file = "/etc/reach/secrets/api.token"
scopes = ["access", "read", "admin"]

# Two enrollments: a connector that lost its volume could not enroll again.
[[connector_groups]]
name = "dc-east"
provisioning_key_file = "/etc/reach/secrets/dc-east.key"
max_uses = 2

# The database server is the application: TCP, and ICMP echo for the UDP port.
[[segments]]
name = "database"
applications = ["{DB_NAME}"]
tcp_ports = ["5432"]
udp_ports = ["5432"]
health_reporting = "continuous"
report_interval_s = 1
connector_groups = ["dc-east"]
"#,
        n = i + 1
    )
}

impl Bed {
    /// PostgreSQL from the base image: a cluster made at start (superuser
    /// `reach` with the password, scram over the network), database `reach`.
    fn start_db(&self, password: &str) -> Result<()> {
        let script = format!(
            "set -e; d=/tmp/pg; \
             {POSTGRES}/initdb -D $d -U reach --pwfile=<(printf %s \"$REACH_DB_PASSWORD\") \
               --auth-local=trust --auth-host=scram-sha-256 >/dev/null; \
             echo 'host all all {NET}.0/24 scram-sha-256' >> $d/pg_hba.conf; \
             echo 'CREATE DATABASE reach' | {POSTGRES}/postgres --single -D $d postgres >/dev/null; \
             exec {POSTGRES}/postgres -D $d -c listen_addresses='*' -k /tmp"
        );
        let mut cmd = podman();
        cmd.args(container(DB)?)
            .args(["--user", "postgres", "-e", "REACH_DB_PASSWORD"])
            .env("REACH_DB_PASSWORD", password)
            .args([&self.base, "bash", "-c", &script]);
        run(cmd, "podman run (PostgreSQL)")?;
        wait_for(
            "PostgreSQL accepting connections",
            Duration::from_secs(60),
            || {
                podman_out(
                    &[
                        "exec",
                        DB.name,
                        &format!("{POSTGRES}/pg_isready"),
                        "-h",
                        "127.0.0.1",
                        "-d",
                        "reach",
                    ],
                    "pg_isready",
                )
                .map(|_| ())
            },
        )
    }

    /// Replica `i` (0-based), as install.md runs a CA: read-only, its
    /// volume, its configuration and the secrets mounted, HTTP published
    /// on the host's loopback.
    fn run_ca(&self, i: usize) -> Result<()> {
        let ca = CAS[i];
        let mut cmd = podman();
        cmd.args(container(ca)?)
            .arg("--read-only")
            .args(["--add-host", &format!("{DB_NAME}:{}", DB.ip())])
            .args(["-p", &format!("127.0.0.1:{}:7480", self.http[i])])
            .args(["-v", &format!("{}:/var/lib/reach", ca.name)])
            .arg("-v")
            .arg(format!(
                "{}:/etc/reach/ca.toml:ro",
                self.work.join(format!("{}.toml", ca.name)).display()
            ))
            .arg("-v")
            .arg(format!(
                "{}:/etc/reach/secrets:ro",
                self.work.join("secrets").display()
            ));
        if i > 0 {
            cmd.args(["-v", &format!("{}:/etc/reach/root:ro", CAS[0].name)]);
        }
        cmd.arg(IMAGE);
        run(cmd, &format!("podman run ({})", ca.name))
    }

    /// A connector, as install.md runs one: read-only, the sysctl that
    /// allows its unprivileged ICMP socket, its volume, the root and its
    /// group's key mounted, dialling the name of both replicas.
    fn run_connector(&self, c: Node) -> Result<()> {
        let mut cmd = podman();
        cmd.args(container(c)?)
            .args([
                "--read-only",
                "--sysctl",
                "net.ipv4.ping_group_range=0 2147483647",
            ])
            .args(["--add-host", &format!("{DB_NAME}:{}", DB.ip())]);
        for ca in CAS {
            cmd.args(["--add-host", &format!("{CA_NAME}:{}", ca.ip())]);
        }
        let name = c.name.trim_start_matches("reach-");
        cmd.args(["-v", &format!("{}:/var/lib/reach", c.name)])
            .arg("-v")
            .arg(format!("{}:/etc/reach/ca.pem:ro", self.root.display()))
            .arg("-v")
            .arg(format!(
                "{}:/etc/reach/dc-east.key:ro",
                self.work.join("secrets/dc-east.key").display()
            ))
            .args(["-e", &format!("REACH_CA=https://{CA_NAME}:7443")])
            .args(["-e", "REACH_CA_CERT=/etc/reach/ca.pem"])
            .args([
                "-e",
                &format!("REACH_NAME={name}"),
                "-e",
                "REACH_GROUP=dc-east",
            ])
            .args(["-e", "REACH_PROVISIONING_KEY_FILE=/etc/reach/dc-east.key"])
            .args([IMAGE, "connector-agent"]);
        run(cmd, &format!("podman run ({})", c.name))
    }

    /// The issuing root out of replica 1's volume (`podman cp`, as the
    /// book does), readable by the connectors.
    fn copy_root(&self) -> Result<()> {
        let mut cp = podman();
        cp.arg("cp")
            .arg(format!("{}:/var/lib/reach/ca.pem", CAS[0].name))
            .arg(&self.root);
        run(cp, "podman cp (the root)")?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o444))?;
        Ok(())
    }

    /// `curl` to replica `i`'s HTTPS API from the host, with the root and
    /// the admin token; the body as JSON.
    fn api(&self, i: usize, path: &str, body: Option<&str>) -> Result<Value> {
        let mut curl = Command::new("curl");
        curl.args(["-sS", "--fail-with-body", "--max-time", "10", "--cacert"])
            .arg(&self.root)
            .args(["-H", &format!("Authorization: Bearer {}", self.token)]);
        if let Some(body) = body {
            curl.args(["-H", "content-type: application/json", "-d", body]);
        }
        curl.arg(format!("https://127.0.0.1:{}{path}", self.http[i]));
        let text = output(curl, &format!("{path} on replica {}", i + 1))?;
        serde_json::from_str(&text).with_context(|| format!("{path}: not JSON: {text}"))
    }

    /// Replica `i` answers `/readyz` 200 over HTTPS on its published port.
    fn wait_ready(&self, i: usize, limit: Duration) -> Result<()> {
        wait_for(&format!("replica {} ready", i + 1), limit, || {
            let running = podman_out(
                &["inspect", "--format", "{{.State.Running}}", CAS[i].name],
                "podman inspect",
            )?;
            ensure!(running == "true", "{} exited", CAS[i].name);
            let mut curl = Command::new("curl");
            curl.args(["-sS", "--fail", "--max-time", "5", "-k"])
                .arg(format!("https://127.0.0.1:{}/readyz", self.http[i]));
            output(curl, "GET /readyz").map(|_| ())
        })
    }
}

/// Polls `check` every 250 ms until it succeeds, or fails after `limit`
/// with its last error.
fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> Result<()>) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        match check() {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(e.context(format!("{what}: not within {} s", limit.as_secs())));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

impl Bed {
    /// Both replicas see both connectors attached to both of them, and
    /// the application Up from both connectors: TCP by handshake, the UDP
    /// port by ICMP echo (the sysctl works).
    fn wait_whole(&self, limit: Duration) -> Result<()> {
        let started = Instant::now();
        wait_for("the deployment whole", limit, || {
            for i in 0..CAS.len() {
                self.attached(i)?;
                self.application_up(i)?;
            }
            Ok(())
        })?;
        eprintln!(
            "xtask: container-test: two connectors attached to both replicas, the application \
             Up on both, in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Replica `i` lists both connectors connected, each with a session to
    /// both replicas.
    fn attached(&self, i: usize) -> Result<()> {
        for c in CONNECTORS {
            let name = c.name.trim_start_matches("reach-");
            let view = self.connector_view(i, name)?;
            ensure!(
                view["connected"] == true && view["replicas"]["sessions"] == 2,
                "replica {}: {name} is not attached to both replicas: {view}",
                i + 1
            );
        }
        Ok(())
    }

    /// Replica `i` shows the application Up on TCP and UDP, from both
    /// connectors, the UDP port by ICMP.
    fn application_up(&self, i: usize) -> Result<()> {
        let health = self.api(i, "/api/v1/health?segment=database", None)?;
        let rows = health["applications"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for protocol in ["tcp", "udp"] {
            let row = rows
                .iter()
                .find(|r| r["protocol"] == protocol)
                .with_context(|| format!("replica {}: no {protocol} row: {health}", i + 1))?;
            ensure!(row["status"] == "up", "replica {}: {row}", i + 1);
            let connectors = row["connectors"].as_array().cloned().unwrap_or_default();
            ensure!(connectors.len() == 2, "replica {}: {row}", i + 1);
            for c in &connectors {
                ensure!(c["status"] == "up", "replica {}: {c}", i + 1);
                let method = if protocol == "udp" { "icmp" } else { "tcp" };
                let addresses = c["addresses"].as_array().cloned().unwrap_or_default();
                ensure!(
                    !addresses.is_empty() && addresses.iter().all(|a| a["method"] == method),
                    "replica {}: {protocol} not checked by {method}: {c}",
                    i + 1
                );
            }
        }
        Ok(())
    }

    /// An access for the application, over HTTPS from the host to each
    /// replica, is routed through one of the connectors.
    fn access(&self) -> Result<()> {
        let body = format!(r#"{{"host":"{DB_NAME}","protocol":"tcp","port":5432}}"#);
        for i in 0..CAS.len() {
            let answer = self.api(i, "/api/v1/access", Some(&body))?;
            let chosen = answer["connector"].as_str().unwrap_or_default();
            ensure!(
                ["c1", "c2"].contains(&chosen),
                "replica {}: the access was not routed through a connector: {answer}",
                i + 1
            );
            eprintln!(
                "xtask: container-test: access through replica {}: {chosen}",
                i + 1
            );
        }
        Ok(())
    }
}

/// Every reach container runs as the image's user (the kernel's view of
/// its process) and on a read-only root (even root cannot write to it).
fn non_root_and_read_only() -> Result<()> {
    for node in CAS.iter().chain(&CONNECTORS) {
        let pid = podman_out(
            &["inspect", "--format", "{{.State.Pid}}", node.name],
            "podman inspect",
        )?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let uids = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .context("no Uid line")?;
        ensure!(
            uids.split_whitespace().all(|u| u == UID),
            "{} runs as uids {uids}, not {UID}",
            node.name
        );
        let mut write = podman();
        write.args([
            "exec",
            "--user",
            "0",
            node.name,
            "central-authority",
            "--generate-docs",
            "/written",
        ]);
        let out = write.output()?;
        let said = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && said.contains("Read-only file system"),
            "{}: root wrote to / (or failed otherwise): {said}",
            node.name
        );
    }
    eprintln!("xtask: container-test: every reach container runs as uid {UID} on a read-only root");
    Ok(())
}

impl Bed {
    /// Connector 1 replaced by a new container on its volume: it attaches
    /// again (new sessions on both replicas) with the certificate it had
    /// (its key's two enrollments are spent, so it could not enroll again).
    fn replace_connector(&self) -> Result<()> {
        let before: Vec<Value> = (0..CAS.len())
            .map(|i| self.connector_view(i, "c1"))
            .collect::<Result<_>>()?;
        let serial = before[0]["certificate_serial"].clone();
        ensure!(serial.is_string(), "c1 has no certificate: {}", before[0]);
        podman_out(&["rm", "-f", "-t", "5", CONNECTORS[0].name], "podman rm")?;
        self.run_connector(CONNECTORS[0])?;
        wait_for("c1 in new sessions", Duration::from_secs(60), || {
            for (i, old) in before.iter().enumerate() {
                let now = self.connector_view(i, "c1")?;
                ensure!(
                    now["connected"] == true && now["session_id"] != old["session_id"],
                    "replica {}: c1 has no new session: {now}",
                    i + 1
                );
                ensure!(
                    now["certificate_serial"] == serial,
                    "c1 came back with another certificate, not {serial}: {now}"
                );
            }
            Ok(())
        })?;
        self.wait_whole(Duration::from_secs(60))
            .context("after connector c1 was replaced")?;
        eprintln!("xtask: container-test: c1 replaced, attached with its certificate {serial}");
        Ok(())
    }

    /// How replica `i` lists connector `name`.
    fn connector_view(&self, i: usize, name: &str) -> Result<Value> {
        let listed = self.api(i, "/api/v1/connectors", None)?;
        listed["connectors"]
            .as_array()
            .and_then(|all| all.iter().find(|v| v["name"] == name))
            .cloned()
            .with_context(|| format!("replica {} does not list {name}", i + 1))
    }

    /// Replica 1 replaced by a new container on its volume: the same root,
    /// ready again once the connectors are back, and routing accesses.
    fn replace_ca(&self) -> Result<()> {
        let before = std::fs::read(&self.root)?;
        podman_out(&["rm", "-f", "-t", "5", CAS[0].name], "podman rm")?;
        self.run_ca(0)?;
        self.wait_ready(0, Duration::from_secs(60))?;
        let copied = self.work.join("ca-after.pem");
        let mut cp = podman();
        cp.arg("cp")
            .arg(format!("{}:/var/lib/reach/ca.pem", CAS[0].name))
            .arg(&copied);
        run(cp, "podman cp (the root again)")?;
        ensure!(
            std::fs::read(&copied)? == before,
            "replica 1 came back with another root: its volume lost it"
        );
        self.wait_whole(Duration::from_secs(60))
            .context("after replica 1 was replaced")?;
        self.access()?;
        eprintln!("xtask: container-test: replica 1 replaced, same root, connectors back");
        Ok(())
    }
}

/// What carries [`LABEL`] (containers, volumes, networks, images), by kind
/// and name.
fn labelled() -> Result<Vec<String>> {
    let filter = format!("label={LABEL}");
    let mut found = Vec::new();
    for (kind, args) in [
        ("container", &["ps", "-a", "--format", "{{.Names}}"][..]),
        ("volume", &["volume", "ls", "--format", "{{.Name}}"]),
        ("network", &["network", "ls", "--format", "{{.Name}}"]),
        ("image", &["images", "--format", "{{.ID}}"]),
    ] {
        let mut cmd = podman();
        cmd.args(args).args(["--filter", &filter]);
        let listed = output(cmd, &format!("listing {kind}s"))?;
        found.extend(
            listed
                .lines()
                .filter(|l| !l.is_empty())
                .map(|l| format!("{kind} {l}")),
        );
    }
    Ok(found)
}

/// Removes everything labelled [`LABEL`] when made and when dropped.
struct Cleanup;

impl Cleanup {
    fn now() -> Result<Cleanup> {
        let cleanup = Cleanup;
        cleanup.remove()?;
        Ok(cleanup)
    }

    fn remove(&self) -> Result<()> {
        for item in labelled()? {
            let Some((kind, name)) = item.split_once(' ') else {
                continue;
            };
            let args: &[&str] = match kind {
                "container" => &["rm", "-f", "-t", "0", "-v", name],
                "volume" => &["volume", "rm", "-f", name],
                "network" => &["network", "rm", "-f", name],
                _ => &["rmi", "-f", name],
            };
            // Containers first (the listing's order), so nothing is in use.
            podman_out(args, &format!("removing {item}"))?;
        }
        Ok(())
    }

    /// The last lines each container logged, for a failed run. (Podman
    /// 4.3's `logs --tail` drops what the container wrote to stderr.)
    fn show_logs(&self) {
        for node in [DB].iter().chain(&CAS).chain(&CONNECTORS) {
            let mut logs = podman();
            logs.args(["logs", node.name]);
            if let Ok(out) = logs.output() {
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                let lines: Vec<&str> = text.lines().collect();
                eprintln!(
                    "xtask: container-test: {} logged (last 40 lines):\n{}",
                    node.name,
                    lines[lines.len().saturating_sub(40)..].join("\n")
                );
            }
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("xtask: container-test: clean-up: {e:#}");
        }
    }
}
