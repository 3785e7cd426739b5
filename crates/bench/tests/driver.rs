//! The driver's exit status: `reach-bench run` fails, naming why, when a
//! group fails or a figure is not produced, so `cargo xtask bench --quick`
//! in CI cannot pass with a figure lost. The `policy` group (criterion's
//! output read back from a directory) stands in for every group: it runs
//! instantly on files the test writes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The criterion benchmarks the `policy` group reads.
const IDS: &[&str] = &[
    "select/healthy/10",
    "select/healthy/100",
    "select/healthy/1000",
    "select/group/10",
    "select/group/100",
    "select/group/1000",
    "select/nearest/100",
    "match/segments/10",
    "match/segments/10000",
    "explain/healthy/32",
    "explain/healthy/10000",
    "explain/roster/10000",
];

/// A criterion output directory with an estimate for every id.
fn criterion_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("reach-bench-driver-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for id in IDS {
        let new = dir.join(id).join("new");
        std::fs::create_dir_all(&new).expect("criterion dir");
        std::fs::write(
            new.join("estimates.json"),
            r#"{"mean":{"point_estimate":123.0}}"#,
        )
        .expect("estimates.json");
    }
    dir
}

fn run(criterion: &Path, extra: &[&str]) -> Output {
    let out = criterion.join("results.json");
    let output = Command::new(env!("CARGO_BIN_EXE_reach-bench"))
        .args(["run", "--quick", "--only", "policy", "--criterion"])
        .arg(criterion)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .expect("running reach-bench");
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    output
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn every_figure_produced_exits_zero() {
    let dir = criterion_dir("whole");
    let o = run(&dir, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let results = std::fs::read_to_string(dir.join("results.json")).expect("results.json");
    assert!(results.contains("policy_select_ns_100"), "{results}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_group_fails_the_run_naming_it() {
    let dir = criterion_dir("planted");
    let o = run(&dir, &["--plant-failure", "policy"]);
    let err = stderr(&o);
    assert!(!o.status.success(), "a failed group exited 0: {err}");
    assert!(
        err.contains("group policy failed: planted failure"),
        "the group and its error are named: {err}"
    );
    assert!(
        err.contains("policy_select_ns_100 not produced"),
        "its figures are named: {err}"
    );
    // The results and the table are still written, for the post-mortem.
    assert!(dir.join("results.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_figure_not_produced_fails_the_run_naming_it() {
    let dir = criterion_dir("missing");
    std::fs::remove_dir_all(dir.join("select/nearest")).expect("remove one benchmark");
    let o = run(&dir, &[]);
    let err = stderr(&o);
    assert!(!o.status.success(), "a missing figure exited 0: {err}");
    assert!(
        err.contains("policy_select_nearest_ns_100 not produced") && err.contains("1 failure(s)"),
        "exactly the missing figure is named, with why: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_group_fails_the_run() {
    let dir = criterion_dir("unknown");
    let o = Command::new(env!("CARGO_BIN_EXE_reach-bench"))
        .args(["run", "--quick", "--only", "polcy", "--criterion"])
        .arg(&dir)
        .output()
        .expect("running reach-bench");
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("no group named \"polcy\""), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
