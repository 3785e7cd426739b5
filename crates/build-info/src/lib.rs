//! What a shipped binary says about itself. Both binaries' build scripts
//! call [`stamp`]: `--version` names the git commit and the build date
//! (`REACH_VERSION`), so a running or shipped binary names the source it
//! came from. With the `docs` feature, [`docs`] writes a binary's man pages
//! and shell completions (`--generate-docs DIR`, packed by `cargo xtask
//! dist`). The date honours
//! `SOURCE_DATE_EPOCH` (reproducible builds); outside a git checkout (a
//! container build's context has no `.git`) the commit is
//! `REACH_GIT_COMMIT`, or `unknown`. [`hints`] holds the hints both
//! binaries print with an error an operator can fix, each naming its
//! Troubleshooting heading.

#![forbid(unsafe_code)]

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

#[cfg(feature = "docs")]
pub mod docs;
pub mod hints;

/// Emits the cargo instructions of a build script: `REACH_VERSION` for
/// the crate being built (read it with `env!("REACH_VERSION")`), and when
/// to run again.
pub fn stamp() {
    // Rerun when HEAD moves (a commit, a checkout), not on every build. A
    // path that does not exist would make cargo rerun this every time.
    let head = git(&["symbolic-ref", "-q", "HEAD"]);
    for name in ["HEAD", "packed-refs"].into_iter().chain(head.as_deref()) {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", name])
            && std::path::Path::new(&path).exists()
        {
            println!("cargo::rerun-if-changed={path}");
        }
    }
    println!("cargo::rerun-if-env-changed=SOURCE_DATE_EPOCH");
    println!("cargo::rerun-if-env-changed=REACH_GIT_COMMIT");
    let commit = git(&["rev-parse", "--short=12", "HEAD"])
        .or_else(|| {
            std::env::var("REACH_GIT_COMMIT")
                .ok()
                .filter(|c| !c.is_empty())
        })
        .unwrap_or_else(|| "unknown".into());
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!(
        "cargo::rustc-env=REACH_VERSION={}",
        version_line(&version, &commit, build_secs())
    );
}

/// `0.1.0 (commit abc, built 2026-12-02)`.
pub fn version_line(version: &str, commit: &str, unix_secs: i64) -> String {
    let date = time::OffsetDateTime::from_unix_timestamp(unix_secs)
        .map(|t| t.date())
        .unwrap_or(time::Date::MIN);
    let (year, month, day) = (date.year(), u8::from(date.month()), date.day());
    format!("{version} (commit {commit}, built {year:04}-{month:02}-{day:02})")
}

/// `SOURCE_DATE_EPOCH` when set, else now.
fn build_secs() -> i64 {
    std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        })
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_version_commit_and_the_day() {
        assert_eq!(
            version_line("0.1.0", "abc123", 1_796_256_000),
            "0.1.0 (commit abc123, built 2026-12-03)"
        );
        assert_eq!(
            version_line("1.2.3", "unknown", 0),
            "1.2.3 (commit unknown, built 1970-01-01)"
        );
    }
}
