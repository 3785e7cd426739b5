//! `cargo xtask`: the project's automation, in Rust (the cargo-xtask
//! convention). `ci` is what `.ci/run` and the README's test command run;
//! `proto` guards the wire contract with buf (`proto.rs`); `book` builds the
//! operator's book and checks its links (`book.rs`); `e2e` runs the
//! end-to-end scenarios against release binaries; `bench` measures every
//! hot path against its bare baseline (BENCHMARKS.md); `demo` runs the
//! system on the built-in example.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, bail};

mod book;
mod container;
mod debian;
mod dist;
#[cfg(test)]
mod manifests;
#[cfg(test)]
mod packaging;
mod proto;
mod testbed;
#[cfg(test)]
mod tidy;
mod upgrade;

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  ci      fmt check, clippy -D warnings, promtool on deploy/prometheus, proto, all
          unit/integration tests, e2e, upgrade-test, fuzz (brief), bench --quick
          (smoke: figures can be produced)
  proto [--update-baseline]  buf (npm @bufbuild/buf, pinned, in target/buf): lint
          proto/ with proto/buf.yaml, breaking changes against proto/baseline, and a
          self-check that a removed or renumbered field fails; --update-baseline
          records compatible additions in the baseline
  book    build the operator's book (mdBook, book/) into target/book and check
          that every relative link and #anchor in book/src resolves
  test    all unit and integration tests (no e2e)
  monitoring  promtool checks and unit tests of deploy/prometheus
  schemathesis [SECONDS]  validate docs/openapi.json (openapi-spec-validator) and
          run schemathesis against a real CA on loopback for SECONDS (default 300;
          `ci` runs it for 30); Python tools in a venv under target/schemathesis
  manifests   deploy/kubernetes against the Kubernetes schemas (kubernetes-validate)
  fuzz    run every fuzz target briefly (cargo-fuzz on stable, RUSTC_BOOTSTRAP=1),
          built unoptimised; `cargo xtask fuzz 300` gives each target 300 s, optimised
          (60 s or more); the build is kept in ~/.cache/reach/fuzz-target
  e2e     build release binaries and run every end-to-end scenario, then every
          single-replica one again on PostgreSQL (REACH_E2E_STORE=postgres)
  upgrade-test  rolling upgrade under load from the release before this one (the
          last CHANGELOG.md names with its commit; built once, cached in
          ~/.cache/reach/release-<commit>) to this tree's release build
  bench   criterion + load driver: table and target/bench/results.json
          (--quick: smoke mode, seconds; --only tcp,access,…: some groups)
  demo    run a CA, a connector and sample applications on loopback
          (REACH_BIN_DIR=DIR: that directory's binaries, no build)
  dist    release archives, Debian packages (cargo-deb), SHA256SUMS and a
          CycloneDX SBOM (cargo-cyclonedx) in target/dist
  package-test  install target/dist's packages here (root), run them as the
          packaged units would (CA and connector on two network-namespace
          hosts), see an application Up and an access routed, purge them and
          check nothing is left
  container-test  build deploy/container/Containerfile with podman from the
          release binaries on a Debian base made by mmdebstrap (cached in
          ~/.cache/reach), run PostgreSQL, two CA replicas and two connectors
          in containers (root), see an application Up and an access routed,
          replace a CA and a connector on their volumes, remove it all
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("test") => test().map(|()| summary()),
        Some("monitoring") => monitoring(),
        Some("proto") => proto::check(&args[1..]),
        Some("book") => book::book(),
        Some("schemathesis") => schemathesis(&args[1..]),
        Some("manifests") => manifests(),
        Some("e2e") => e2e(&args[1..]).map(|()| summary()),
        Some("upgrade-test") => upgrade::upgrade_test().map(|()| summary()),
        Some("fuzz") => fuzz(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("demo") => demo(&args[1..]),
        Some("dist") => dist::dist(),
        Some("package-test") => dist::package_test(),
        Some("container-test") => container::container_test(),
        Some("-h" | "--help" | "help") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(anyhow::anyhow!("unknown task {other:?}\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (xtask lives one level below it).
fn root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    // `cargo run` (the `xtask` alias) sets these for xtask itself; passed
    // on, they reach the fingerprints of build scripts that track them
    // (ring's: CARGO_MANIFEST_DIR and CARGO_PKG_*), which then run again
    // and rebuild everything above them whenever a build alternates
    // between xtask and a plain `cargo`.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
            ]
            .contains(&&*name)
        {
            cmd.env_remove(&*name);
        }
    }
    cmd
}

fn run(mut cmd: Command, what: &str) -> Result<()> {
    eprintln!("xtask: {what}: {cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// Tests counted over every `cargo test` run of this xtask invocation, for
/// the closing summary line.
static PASSED: AtomicU64 = AtomicU64::new(0);
static FAILED: AtomicU64 = AtomicU64::new(0);

/// Runs a `cargo test` command, echoing its output while adding up the
/// `test result:` lines, so the run can close with one total.
fn run_tests(mut cmd: Command, what: &str) -> Result<()> {
    eprintln!("xtask: {what}: {cmd:?}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("{what}: could not start {cmd:?}"))?;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line?;
            println!("{line}");
            if let Some(rest) = line.strip_prefix("test result: ") {
                for part in rest.split([';', '.']) {
                    let mut words = part.split_whitespace();
                    if let (Some(n), Some(kind)) = (words.next(), words.next())
                        && let Ok(n) = n.parse::<u64>()
                    {
                        match kind {
                            "passed" => PASSED.fetch_add(n, Ordering::Relaxed),
                            "failed" => FAILED.fetch_add(n, Ordering::Relaxed),
                            _ => 0,
                        };
                    }
                }
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        summary();
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// The closing line: every test of this run, in the plain
/// `N passed, N failed` form CI reads. (Tests `#[ignore]`d in the debug run
/// are the e2e scenarios, counted when `e2e` runs them.)
fn summary() {
    println!(
        "xtask: {} passed, {} failed",
        PASSED.load(Ordering::Relaxed),
        FAILED.load(Ordering::Relaxed)
    );
}

fn ci() -> Result<()> {
    let mut fmt = cargo();
    fmt.args(["fmt", "--all", "--check"]);
    run(fmt, "format check")?;

    let mut clippy = cargo();
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]);
    run(clippy, "clippy")?;

    monitoring()?;
    manifests()?;
    proto::check(&[])?;
    book::book()?;
    test()?;
    // On the debug binaries the tests just built.
    schemathesis(&["30".to_owned()])?;
    // Everything below runs on one release build (`build_release`): the
    // scenarios, the upgrade, the packages, the image and the benchmarks.
    e2e(&[])?;
    upgrade::upgrade_test()?;
    dist::dist()?;
    dist::package_test()?;
    container::container_test()?;
    fuzz(&[])?;
    // Benchmarks are not tests: CI only checks that every figure can still
    // be produced (quick mode, seconds), never their values.
    bench(&["--quick".to_owned()])?;
    summary();
    Ok(())
}

/// Checks the Prometheus files in `deploy/prometheus` with `promtool`: the
/// rules parse and their PromQL is valid, their unit tests pass, the
/// example config parses. (That every metric they and the Grafana dashboard
/// use is exported is the central-authority `observability` test.)
fn monitoring() -> Result<()> {
    let dir = root().join("deploy/prometheus");
    let installed = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        bail!("promtool is not installed: `apt-get install prometheus` (.ci/run does this)");
    }
    for (args, what) in [
        (
            &["check", "rules", "reach-alerts.yml"][..],
            "promtool check rules",
        ),
        (
            &["test", "rules", "reach-alerts.test.yml"][..],
            "promtool test rules",
        ),
        (
            &["check", "config", "--syntax-only", "prometheus.yml"][..],
            "promtool check config",
        ),
    ] {
        let mut cmd = Command::new("promtool");
        cmd.current_dir(&dir).args(args);
        run(cmd, what)?;
    }
    let scale = root().join("target/monitoring");
    std::fs::create_dir_all(&scale).with_context(|| format!("create {}", scale.display()))?;
    let test = scale.join("reach-alerts.scale.test.yml");
    std::fs::write(&test, scale_test(&dir.join("reach-alerts.yml"), 10_000))
        .with_context(|| format!("write {}", test.display()))?;
    let mut cmd = Command::new("promtool");
    cmd.arg("test").arg("rules").arg(&test);
    run(cmd, "promtool test rules (10,000 down applications)")
}

/// A promtool rule test in which `down` applications of one segment are
/// down, as the CA exports them (a `reach_ca_application_down` series each
/// and the segment's counts): it expects one `ReachSegmentApplicationsDown`
/// and one `ReachSegmentMostlyDown` alert, not one per application.
fn scale_test(rules: &Path, down: usize) -> String {
    use std::fmt::Write;
    let mut t = format!(
        "rule_files:\n  - {rules:?}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n"
    );
    let series = |t: &mut String, s: &str, v: &str| {
        let _ = write!(t, "      - series: '{s}'\n        values: \"{v}\"\n");
    };
    let ca = r#"job="reach-ca", instance="ca:7480""#;
    for i in 0..down {
        let host = format!("app-{i}.example");
        series(
            &mut t,
            &format!(
                r#"reach_ca_application_down{{{ca}, segment="big", host="{host}", protocol="tcp", port="443"}}"#
            ),
            "1x15",
        );
    }
    let counted = format!("{down}x15");
    for (status, v) in [("down", counted.as_str()), ("up", "0x15")] {
        series(
            &mut t,
            &format!(r#"reach_ca_segment_applications{{{ca}, segment="big", status="{status}"}}"#),
            v,
        );
    }
    let _ = write!(
        t,
        "    alert_rule_test:
      - eval_time: 11m
        alertname: ReachSegmentApplicationsDown
        exp_alerts:
          - exp_labels: {{severity: warning, job: reach-ca, segment: big}}
            exp_annotations:
              summary: \"{down} applications of segment big are down\"
              description: \"For 10 minutes no connector has reached {down} of the applications of segment big (100% of them); access requests for them are refused. The CA dashboard lists them (status Down, this segment), each with every connector's last result and error.\"
      - eval_time: 11m
        alertname: ReachSegmentMostlyDown
        exp_alerts:
          - exp_labels: {{severity: critical, job: reach-ca, segment: big}}
            exp_annotations:
              summary: \"100% of segment big is down\"
              description: \"At least half of the applications of segment big have been down for 5 minutes: more likely the path from the segment's connector groups to its network than the applications themselves. Check the groups' connectors and their route to it.\"
"
    );
    t
}

/// Validates every manifest in `deploy/kubernetes` against the Kubernetes
/// API schemas, strictly (unknown fields are errors), offline, with the
/// `kubernetes-validate` package from PyPI.
fn manifests() -> Result<()> {
    let installed = Command::new("kubernetes-validate")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        bail!(
            "kubernetes-validate is not installed: `pip install kubernetes-validate` (.ci/run does this)"
        );
    }
    let dir = root().join("deploy/kubernetes");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no manifests in {}", dir.display());
    }
    let mut cmd = Command::new("kubernetes-validate");
    cmd.args(["--strict", "--quiet"]).args(&files);
    run(cmd, "kubernetes-validate")
}

/// The fuzz targets (`fuzz/fuzz_targets/*.rs`).
const FUZZ_TARGETS: &[&str] = &["config", "wire_policy", "certificate", "csr", "http_bodies"];

/// Runs every fuzz target for a few seconds (default 10 each). libFuzzer
/// needs nightly flags; `RUSTC_BOOTSTRAP=1` lets the stable toolchain take
/// them. No sanitizer (`--sanitizer none`): the code forbids `unsafe`, so
/// the value is in finding panics. Inputs kept in
/// `fuzz/regressions/<target>/` (crashes found earlier) run first; a crash
/// fails the task and is left in `fuzz/artifacts/<target>/`.
///
/// The brief run (under [`FUZZ_OPTIMISED_FROM_S`] a target, as CI's) is
/// built unoptimised (`--dev`): overflow checks and debug assertions on,
/// which turn more slips into the panics it looks for, for about 440 CPU
/// seconds of build against about 1,100 optimised; longer runs, where
/// executions per second pay, are optimised. The build's target directory
/// is kept outside the clone ([`fuzz_target_dir`]), so a machine builds the
/// instrumented dependencies once; cargo's fingerprints rebuild whatever
/// changed, and every crate of a fresh clone.
fn fuzz(extra: &[String]) -> Result<()> {
    let seconds: u64 = match extra.first() {
        Some(s) => s
            .parse()
            .with_context(|| format!("fuzz: {s:?} is not a number of seconds"))?,
        None => 10,
    };
    let installed = cargo()
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        bail!(
            "cargo-fuzz is not installed: `cargo install cargo-fuzz --locked` (.ci/run does this)"
        );
    }
    let target_dir = fuzz_target_dir()?;
    for target in FUZZ_TARGETS {
        let corpus = root().join("fuzz/corpus").join(target);
        std::fs::create_dir_all(&corpus)
            .with_context(|| format!("creating {}", corpus.display()))?;
        let mut cmd = cargo();
        cmd.current_dir(root().join("fuzz"))
            .env("RUSTC_BOOTSTRAP", "1")
            .args(["fuzz", "run", "--sanitizer", "none"]);
        if seconds < FUZZ_OPTIMISED_FROM_S {
            cmd.arg("--dev");
        }
        cmd.arg("--target-dir")
            .arg(&target_dir)
            .arg(target)
            .arg(&corpus);
        let regressions = root().join("fuzz/regressions").join(target);
        if regressions.is_dir() {
            cmd.arg(&regressions);
        }
        cmd.args([
            "--",
            &format!("-max_total_time={seconds}"),
            "-max_len=65536",
        ]);
        run(cmd, &format!("fuzz {target}"))?;
    }
    Ok(())
}

/// Runs of at least this many seconds a target build optimised fuzzers.
const FUZZ_OPTIMISED_FROM_S: u64 = 60;

/// Above this size the kept fuzz target directory is emptied first: each
/// clone's own crates (their paths differ) add to it.
const FUZZ_TARGET_MAX_BYTES: u64 = 12 << 30;

/// The fuzz build's target directory: `$HOME/.cache/reach/fuzz-target`
/// (`target/fuzz` without a home), emptied when it grew past
/// [`FUZZ_TARGET_MAX_BYTES`].
fn fuzz_target_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".cache/reach/fuzz-target"),
        None => target_dir().join("fuzz"),
    };
    let size = Command::new("du")
        .args(["-sb"])
        .arg(&dir)
        .stderr(Stdio::null())
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
        })
        .unwrap_or(0);
    if size > FUZZ_TARGET_MAX_BYTES {
        eprintln!(
            "xtask: fuzz: {} holds {:.1} GB; emptied",
            dir.display(),
            size as f64 / 1e9
        );
        std::fs::remove_dir_all(&dir).with_context(|| format!("emptying {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn test() -> Result<()> {
    // `--workspace` includes this crate, so the tidy checks (`src/tidy.rs`)
    // run with every test run.
    let mut test = cargo();
    test.args(["test", "--workspace", "--locked"]);
    run_tests(test, "tests")
}

/// The one release build CI makes: the shipped binaries, the scenarios'
/// helpers and the load driver, in one cargo invocation. The scenarios
/// (`e2e`), the packages (`dist`), the benchmarks (`bench`), the demo and
/// the other release-binary tasks all start from it; `tests/e2e` depends
/// on every package built here, so the scenarios' own build shares every
/// dependency with it (`e2e` checks that none is compiled again).
fn build_release() -> Result<PathBuf> {
    build_release_bins(&[])
}

/// The release build of only `bins` (every binary when empty), with the
/// packages and so the features of the one release build: what it builds
/// is shared with it (the demo builds three binaries, not the driver).
fn build_release_bins(bins: &[&str]) -> Result<PathBuf> {
    let mut build = cargo();
    build
        .args(["build", "--release", "--locked"])
        .args(RELEASE_PACKAGES.iter().flat_map(|p| ["-p", p]));
    if bins.is_empty() {
        build.arg("--bins");
    } else {
        build.args(bins.iter().flat_map(|b| ["--bin", b]));
    }
    run(build, "release build")?;
    Ok(target_dir().join("release"))
}

/// The packages of the one release build (`build_release`).
const RELEASE_PACKAGES: &[&str] = &["central-authority", "connector-agent", "e2e", "bench"];

/// Compiles the scenarios (release) and fails if that compiled any
/// dependency again: a dependency whose features differ from the shared
/// release build's costs CI a second build of it and everything above it.
fn build_scenarios() -> Result<()> {
    let mut build = cargo();
    build.args([
        "test",
        "--release",
        "--locked",
        "-p",
        "e2e",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    eprintln!("xtask: scenarios build: {build:?}");
    let out = build
        .stderr(Stdio::inherit())
        .output()
        .context("starting the scenarios build")?;
    if !out.status.success() {
        bail!("the scenarios build failed ({})", out.status);
    }
    let mut again = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let registry = msg["package_id"]
            .as_str()
            .is_some_and(|id| id.starts_with("registry+"));
        if msg["reason"] == "compiler-artifact" && msg["fresh"] == false && registry {
            again.push(msg["target"]["name"].as_str().unwrap_or("?").to_owned());
        }
    }
    if !again.is_empty() {
        bail!(
            "the scenarios build compiled {} dependencies again ({}): their features differ from the shared release build's; make tests/e2e depend on what the release build selects ({RELEASE_PACKAGES:?})",
            again.len(),
            again.join(", ")
        );
    }
    Ok(())
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

fn e2e(extra: &[String]) -> Result<()> {
    // `cargo xtask e2e -- --test-threads 1 s03`: everything after `--` goes
    // to the test harness.
    let extra = match extra.first().map(String::as_str) {
        Some("--") => &extra[1..],
        _ => extra,
    };
    let bin_dir = build_release()?;
    build_scenarios()?;
    let out = target_dir().join("e2e");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut test = cargo();
    test.args([
        "test",
        "--release",
        "--locked",
        "-p",
        "e2e",
        "--",
        "--ignored",
    ])
    .args(extra)
    // `upgrade-test` runs it, with the previous release it builds.
    .args(["--skip", "rolling_upgrade_from_the_previous_release"])
    .env("REACH_BIN_DIR", &bin_dir)
    // The demo scenario runs `xtask demo` itself.
    .env("REACH_XTASK", std::env::current_exe()?)
    .env("REACH_E2E_OUT", &out)
    .env("REACH_E2E_STORE", "sqlite");
    run_tests(test, "end-to-end scenarios")?;
    // Every single-replica scenario again on PostgreSQL (everything that
    // passes on SQLite must pass there), each on a fresh
    // database of one server the test binary starts; `ha_replicas` runs on
    // PostgreSQL already. With explicit filters only the scenarios asked
    // for run, on both stores.
    let filters: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut pg = cargo();
    pg.args([
        "test",
        "--release",
        "--locked",
        "-p",
        "e2e",
        "--test",
        "scenarios",
        "--",
        "--ignored",
    ])
    .args(filters)
    .env("REACH_BIN_DIR", &bin_dir)
    .env("REACH_E2E_OUT", out.join("postgres"))
    .env("REACH_E2E_STORE", "postgres");
    run_tests(pg, "end-to-end scenarios on PostgreSQL")
}

/// `cargo xtask demo`: builds the release binaries (or takes them from
/// `REACH_BIN_DIR`) and becomes `reach-demo` (exec): the process `cargo
/// xtask demo` started (cargo itself execs this one) is the demo, so Ctrl-C
/// or `kill <pid>` reaches it and it stops everything it started.
fn demo(extra: &[String]) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let bin_dir = match std::env::var_os("REACH_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => build_release_bins(&["central-authority", "connector-agent", "reach-demo"])?,
    };
    let mut testbed = Command::new(bin_dir.join("reach-demo"));
    testbed
        .current_dir(root())
        .env("REACH_BIN_DIR", &bin_dir)
        .args(extra);
    let error = testbed.exec();
    Err(error).with_context(|| format!("starting {:?}", bin_dir.join("reach-demo")))
}

/// `cargo xtask bench [--quick] [--only GROUPS]`: criterion for the
/// in-process figures, then the load driver (`crates/bench`) for the rest;
/// the driver reads criterion's estimates, prints the table and writes
/// `target/bench/results.json`. It fails, naming why, when a group fails
/// or a figure is not produced. See BENCHMARKS.md.
fn bench(extra: &[String]) -> Result<()> {
    let quick = extra.iter().any(|a| a == "--quick");
    let only = extra
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| extra.get(i + 1));
    if only.is_none_or(|o| o.split(',').any(|g| g == "policy")) {
        let mut criterion = cargo();
        criterion.args([
            "bench", "--locked", "-p", "policy", "--bench", "policy", "--", "--noplot",
        ]);
        if quick {
            criterion.args([
                "--warm-up-time",
                "0.05",
                "--measurement-time",
                "0.1",
                "--sample-size",
                "10",
            ]);
        } else {
            // Criterion's 3 s + 5 s per benchmark took 88 s of the suite's
            // 10-minute budget; 1 s + 3 s keeps each mean within its noise.
            criterion.args(["--warm-up-time", "1", "--measurement-time", "3"]);
        }
        run(criterion, "criterion benches")?;
    }
    // The driver and, for the `ha` group, the real connector binary.
    build_release()?;
    let target = target_dir();
    // `starve` holds ~2,500 connections in the driver, `storm` and
    // `startup` 10,000 (and their CA the other ends): raise the soft
    // open-files limit to the hard limit through the shell's `ulimit`
    // (never lower it); a group says so clearly if it is still too low.
    let mut driver = Command::new("sh");
    driver
        .current_dir(root())
        .arg("-c")
        .arg(r#"ulimit -S -n "$(ulimit -H -n)" 2>/dev/null; exec "$0" "$@""#)
        .arg(target.join("release").join("reach-bench"))
        .arg("run")
        .arg("--criterion")
        .arg(target.join("criterion"))
        .arg("--out")
        .arg(target.join("bench").join("results.json"));
    if quick {
        driver.arg("--quick");
    }
    if let Some(only) = only {
        driver.args(["--only", only]);
    }
    run(driver, "load driver")
}

/// The Python tools `schemathesis` installs into its venv, pinned.
const PYTHON_TOOLS: &[&str] = &["schemathesis==4.32.5", "openapi-spec-validator==0.9.0"];
/// The API token the schemathesis run sends (scope `admin`: every route).
const SCHEMATHESIS_TOKEN: &str = "schemathesis-admin-token-cgCWHB9pWXI0g22V9TbFrf1U";

/// `cargo xtask schemathesis [SECONDS]`: validates `docs/openapi.json` with
/// openapi-spec-validator, starts a CA (debug build) on loopback with a
/// scratch data directory and an admin token, one real `connector-agent`
/// enrolled to it and a TCP application on 127.0.0.1 (the policy's only
/// segment), checks that `POST /api/v1/access` for that application answers
/// 200 naming the connector, and runs schemathesis against the served
/// document for SECONDS with every check (no 5xx, statuses, content types
/// and bodies as documented; see `xtask/schemathesis/schemathesis.toml`);
/// then checks that the CA still runs and answers an access with a
/// documented status (200 or 503, JSON). The tools live in a venv under
/// `target/schemathesis/venv` (python3 -m venv + pip, once).
fn schemathesis(extra: &[String]) -> Result<()> {
    let seconds: u64 = match extra.first() {
        Some(s) => s
            .parse()
            .with_context(|| format!("schemathesis: {s:?} is not a number of seconds"))?,
        None => 300,
    };
    let dir = target_dir().join("schemathesis");
    let bin = schemathesis_venv(&dir)?;
    let mut validate = Command::new(bin.join("openapi-spec-validator"));
    validate.arg(root().join("docs/openapi.json"));
    run(validate, "openapi-spec-validator")?;

    // The debug binaries the test suite builds (`cargo xtask test`; in
    // CI this is that build, done): overflow checks and debug assertions
    // on, so that an arithmetic slip is a 500 schemathesis reports.
    let mut build = cargo();
    build.args(["test", "--workspace", "--locked", "--no-run"]);
    run(build, "CA and connector build (the test suite's)")?;
    // Dropped on every return: the processes are killed, the application closed.
    let mut bed = testbed::Testbed::start(&dir, SCHEMATHESIS_TOKEN)?;
    bed.wait_access_ok(&bin.join("python"), std::time::Duration::from_secs(60))
        .context("before the schemathesis run")?;
    let mut st = Command::new(bin.join("schemathesis"));
    st.current_dir(&dir)
        // 429 `throttled` counts as refusing bad credentials (see hooks.py).
        .env(
            "SCHEMATHESIS_HOOKS",
            root().join("xtask/schemathesis/hooks.py"),
        )
        .arg("--config-file")
        .arg(root().join("xtask/schemathesis/schemathesis.toml"))
        .arg("run")
        .arg(format!("https://{}/api/v1/openapi.json", bed.http))
        .arg("--tls-verify")
        .arg(bed.root_pem())
        .args(["-H", &format!("Authorization: Bearer {SCHEMATHESIS_TOKEN}")])
        // The change stream never ends: schemathesis would wait on it.
        .args(["--exclude-path", "/api/v1/health/stream"])
        .args(["--checks", "all", "--workers", "1", "--no-color"])
        .args(["--max-time", &seconds.to_string()]);
    run(st, "schemathesis")?;
    // The run's admin token may have revoked the connector or its group's
    // key (the stateful phase follows links to real names), so afterwards
    // the CA is held to answering, not to selecting.
    bed.still_serving(&bin.join("python"))
        .context("after the schemathesis run")
}

/// The venv with [`PYTHON_TOOLS`] under `dir` (made once); its `bin`.
fn schemathesis_venv(dir: &Path) -> Result<PathBuf> {
    let venv = dir.join("venv");
    let bin = venv.join("bin");
    let ready = PYTHON_TOOLS.iter().all(|t| {
        let name = t.split("==").next().unwrap_or(t);
        bin.join(name).exists()
    }) && std::fs::read_to_string(venv.join("reach-tools"))
        .ok()
        .as_deref()
        == Some(PYTHON_TOOLS.join(" ").as_str());
    if !ready {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
        let mut make = Command::new(&python);
        make.args(["-m", "venv"]).arg(&venv);
        run(make, "python venv")?;
        let mut pip = Command::new(bin.join("pip"));
        pip.args(["install", "--quiet", "--disable-pip-version-check"])
            .args(PYTHON_TOOLS);
        run(pip, "pip install")?;
        std::fs::write(venv.join("reach-tools"), PYTHON_TOOLS.join(" "))?;
    }
    Ok(bin)
}
