//! Build script: stamps the binary's `--version` with the git commit and
//! the build date (`REACH_VERSION`), so a running or shipped binary names
//! the source it came from. The date honours `SOURCE_DATE_EPOCH`
//! (reproducible builds); outside a git checkout the commit is
//! `REACH_GIT_COMMIT`, or `unknown`.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn date(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

fn main() {
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
    // Outside a checkout (a container build's context has no .git) the
    // builder can say which commit it is.
    let commit = git(&["rev-parse", "--short=12", "HEAD"])
        .or_else(|| {
            std::env::var("REACH_GIT_COMMIT")
                .ok()
                .filter(|c| !c.is_empty())
        })
        .unwrap_or_else(|| "unknown".into());
    let secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        });
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    println!(
        "cargo::rustc-env=REACH_VERSION={version} (commit {commit}, built {})",
        date(secs.div_euclid(86_400))
    );
}
