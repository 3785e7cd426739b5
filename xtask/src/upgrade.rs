//! `cargo xtask upgrade-test`: the rolling upgrade from the previous
//! release to this tree, under load (the e2e scenario
//! `tests/e2e/tests/upgrade.rs`). The previous release is the last version
//! CHANGELOG.md records with its commit; its binaries are built once per
//! commit, toolchain and `Cargo.lock` (their SHA-256 sums recorded and
//! checked at each use) and kept in `$XDG_CACHE_HOME/reach` (or
//! `$HOME/.cache/reach`) as `release-<commit>/`, outside the clone, so a
//! fresh clone of CI finds them.
//!
//! The cold build reuses this clone's target directory: the old commit is
//! checked out in a temporary git worktree and built with
//! `CARGO_TARGET_DIR` pointing here, so every registry crate the two
//! trees share (same `Cargo.lock` version, same features) is taken as
//! built and only the workspace's own crates compile. That build puts the
//! old binaries in `target/release` for a moment: they are copied into the
//! cache at once, and this tree's release build runs after it, which links
//! its own binaries there again; every binary's `--version` is checked
//! against the commit it must come from before the scenario starts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

use crate::{build_release, cargo, root, run, run_tests, target_dir};

/// The binaries the scenario runs from each build.
const BINARIES: &[&str] = &["central-authority", "connector-agent"];

/// What `build_release` builds: the previous release is built with the
/// same selection, so that features unify as there and every registry
/// crate is the one already built (the two binaries alone select fewer
/// features of tokio and others, and compiled those crates again).
const RELEASE_PACKAGES: &[&str] = &[
    "-p",
    "central-authority",
    "-p",
    "connector-agent",
    "-p",
    "e2e",
    "--bins",
];

/// A release CHANGELOG.md records: version and full commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub version: String,
    pub commit: String,
}

/// `cargo xtask upgrade-test`.
pub fn upgrade_test() -> Result<()> {
    let started = Instant::now();
    let changelog =
        std::fs::read_to_string(root().join("CHANGELOG.md")).context("reading CHANGELOG.md")?;
    let current = workspace_version()?;
    let previous = previous_release(&changelog, &current)?;
    ensure_commit(&previous)?;
    let old = previous_binaries(&previous)?;
    eprintln!(
        "xtask: previous release {} at {}: {} ({:.0} s)",
        previous.version,
        short(&previous.commit),
        old.display(),
        started.elapsed().as_secs_f64()
    );
    // After the old build, which used the same target directory.
    let bin_dir = build_release()?;
    let head = git(&["rev-parse", "--short=12", "HEAD"])?;
    for bin in BINARIES {
        check_version(&bin_dir.join(bin), &current, &head)?;
    }
    let mut test = cargo();
    test.args([
        "test",
        "--release",
        "--locked",
        "-p",
        "e2e",
        "--test",
        "upgrade",
        "--",
        "--ignored",
    ])
    .env("REACH_BIN_DIR", &bin_dir)
    .env("REACH_COMMIT", &head)
    .env("REACH_PREV_BIN_DIR", &old)
    .env("REACH_PREV_VERSION", &previous.version)
    .env("REACH_PREV_COMMIT", short(&previous.commit))
    .env("REACH_E2E_OUT", target_dir().join("e2e"));
    run_tests(test, "upgrade from the previous release")?;
    eprintln!(
        "xtask: upgrade-test took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The workspace's version (`[workspace.package] version`).
fn workspace_version() -> Result<String> {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).context("reading Cargo.toml")?;
    let manifest: toml::Table = text.parse().context("parsing Cargo.toml")?;
    manifest
        .get("workspace")
        .and_then(|w| w.get("package"))
        .and_then(|p| p.get("version"))
        .and_then(|v| v.as_str())
        .map(str::to_owned)
        .context("Cargo.toml has no [workspace.package] version")
}

/// The release before `current` in `changelog`: its first `## VERSION
/// (DATE, commit HASH)` heading. The top entry must be `current`'s: the
/// version bump comes with its entry.
pub fn previous_release(changelog: &str, current: &str) -> Result<Release> {
    let headings: Vec<&str> = changelog
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .collect();
    let top = headings.first().copied().unwrap_or_default();
    ensure!(
        top.split_whitespace().next() == Some(current),
        "CHANGELOG.md's newest entry is {top:?}, but the workspace is {current}: add `## {current} (unreleased)` with its upgrade notes"
    );
    let Some(heading) = headings.get(1) else {
        bail!("CHANGELOG.md names no release before {current}: nothing to upgrade from")
    };
    let version = heading.split_whitespace().next().unwrap_or_default();
    let commit = heading
        .split("commit ")
        .nth(1)
        .map(|c| c.trim_end_matches(')').trim())
        .unwrap_or_default();
    ensure!(
        commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
        "CHANGELOG.md: the entry {heading:?} names no full commit: write `## {version} (DATE, commit <40 hex digits>)`"
    );
    Ok(Release {
        version: version.to_owned(),
        commit: commit.to_owned(),
    })
}

/// Fails, saying how to fix it, when the clone lacks the release's commit.
fn ensure_commit(release: &Release) -> Result<()> {
    let present = Command::new("git")
        .current_dir(root())
        .args(["cat-file", "-e", &format!("{}^{{commit}}", release.commit)])
        .status()
        .is_ok_and(|s| s.success());
    ensure!(
        present,
        "commit {} of release {} (CHANGELOG.md) is not in this clone: a shallow clone? `git fetch --unshallow` (the upgrade test builds that release)",
        release.commit,
        release.version
    );
    Ok(())
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

fn git(args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .current_dir(root())
        .args(args)
        .output()
        .context("running git")?;
    ensure!(
        out.status.success(),
        "git {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The directory the cache lives in.
fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("reach"));
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("reach")),
        None => bail!(
            "neither XDG_CACHE_HOME nor HOME is set: no place for the previous release's binaries"
        ),
    }
}

/// What a cache entry was built from: the release, its commit, the
/// toolchain (`rustc -vV`: version, commit hash, host, LLVM) and the
/// SHA-256 of the commit's `Cargo.lock`. A cache entry is taken only when
/// its stamp starts with exactly this, so a change to any of them builds
/// again.
fn stamp(release: &Release) -> Result<String> {
    let out = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .current_dir(root())
        .arg("-vV")
        .output()
        .context("running rustc -vV")?;
    ensure!(out.status.success(), "rustc -vV failed");
    let rustc = String::from_utf8_lossy(&out.stdout)
        .trim()
        .replace('\n', "\nrustc ");
    let lock = Command::new("git")
        .current_dir(root())
        .args(["show", &format!("{}:Cargo.lock", release.commit)])
        .output()
        .context("running git show COMMIT:Cargo.lock")?;
    ensure!(
        lock.status.success(),
        "git show {}:Cargo.lock failed: {}",
        release.commit,
        String::from_utf8_lossy(&lock.stderr).trim()
    );
    let lock_path = std::env::temp_dir().join(format!("reach-lock-{}", std::process::id()));
    std::fs::write(&lock_path, &lock.stdout)?;
    let lock_sum = sha256(&lock_path);
    let _ = std::fs::remove_file(&lock_path);
    Ok(format!(
        "version {}\ncommit {}\nrustc {rustc}\nCargo.lock sha256 {}\n",
        release.version, release.commit, lock_sum?
    ))
}

/// The SHA-256 of `path` in hex (coreutils' `sha256sum`).
fn sha256(path: &Path) -> Result<String> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .context("running sha256sum (coreutils)")?;
    ensure!(
        out.status.success(),
        "sha256sum {} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let sum = text.split_whitespace().next().unwrap_or_default();
    ensure!(
        sum.len() == 64,
        "sha256sum {} said {text:?}",
        path.display()
    );
    Ok(sum.to_owned())
}

/// The lines a stamp records for the binaries in `dir`: `sha256 HEX BIN`.
fn binary_sums(dir: &Path) -> Result<String> {
    let mut out = String::new();
    for bin in BINARIES {
        out.push_str(&format!("sha256 {} {bin}\n", sha256(&dir.join(bin))?));
    }
    Ok(out)
}

/// Whether `dir` holds the binaries `stamp` describes: its stamp file is
/// `stamp` followed by the binaries' SHA-256 sums as they were built, the
/// binaries still have them, and each says the release's version and
/// commit.
fn cache_holds(dir: &Path, stamp: &str, release: &Release) -> bool {
    let Ok(recorded) = std::fs::read_to_string(dir.join("stamp")) else {
        return false;
    };
    let Some(sums) = recorded.strip_prefix(stamp) else {
        eprintln!(
            "xtask: {} was built from another commit, toolchain or Cargo.lock: building again",
            dir.display()
        );
        return false;
    };
    let intact = binary_sums(dir).is_ok_and(|now| now == sums);
    if !intact {
        eprintln!(
            "xtask: the binaries in {} are not the ones built there (SHA-256 differs): building again",
            dir.display()
        );
    }
    intact
        && BINARIES
            .iter()
            .all(|b| check_version(&dir.join(b), &release.version, &release.commit).is_ok())
}

/// Fails unless `bin --version` names `version` and `commit` (12 digits).
fn check_version(bin: &Path, version: &str, commit: &str) -> Result<()> {
    let out = Command::new(bin)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", bin.display()))?;
    let said = String::from_utf8_lossy(&out.stdout);
    let want = format!("{version} (commit {},", short(commit));
    ensure!(
        out.status.success() && said.contains(&want),
        "{} --version says {:?}, want {want:?}: the builds got mixed up",
        bin.display(),
        said.trim()
    );
    Ok(())
}

/// The cached binaries of `release`, built first if the cache has none
/// for this commit and toolchain.
fn previous_binaries(release: &Release) -> Result<PathBuf> {
    let cache = cache_root()?;
    let dir = cache.join(format!("release-{}", release.commit));
    let stamp = stamp(release)?;
    if cache_holds(&dir, &stamp, release) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let partial = cache.join(format!(
        ".release-{}.{}",
        release.commit,
        std::process::id()
    ));
    let built = build_previous(release, &partial, &stamp);
    let moved = built.and_then(|()| {
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("removing the stale {}", dir.display()))?;
        }
        std::fs::rename(&partial, &dir)
            .with_context(|| format!("moving {} to {}", partial.display(), dir.display()))
    });
    if moved.is_err() {
        let _ = std::fs::remove_dir_all(&partial);
    }
    moved.map(|()| dir)
}

/// Builds `release` in a temporary worktree with this clone's target
/// directory and copies its binaries and `stamp` into `out`.
fn build_previous(release: &Release, out: &Path, stamp: &str) -> Result<()> {
    let src = out.with_extension("src");
    let _ = std::fs::remove_dir_all(&src);
    let _ = git(&["worktree", "prune"]);
    git(&[
        "worktree",
        "add",
        "--detach",
        &src.display().to_string(),
        &release.commit,
    ])?;
    let built = (|| -> Result<()> {
        report_lock_drift(&src)?;
        let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        build
            .current_dir(&src)
            .env("CARGO_TARGET_DIR", target_dir())
            .args(["build", "--release", "--locked"])
            .args(RELEASE_PACKAGES);
        let started = Instant::now();
        run(build, &format!("release build of {}", release.version))?;
        eprintln!(
            "xtask: {} built in {:.0} s",
            release.version,
            started.elapsed().as_secs_f64()
        );
        std::fs::create_dir_all(out)?;
        for bin in BINARIES {
            let from = target_dir().join("release").join(bin);
            std::fs::copy(&from, out.join(bin))
                .with_context(|| format!("copying {}", from.display()))?;
            check_version(&out.join(bin), &release.version, &release.commit)?;
        }
        std::fs::write(out.join("stamp"), format!("{stamp}{}", binary_sums(out)?))?;
        Ok(())
    })();
    let removed = git(&["worktree", "remove", "--force", &src.display().to_string()]);
    built?;
    removed.map(|_| ())
}

/// Says how many registry packages the old `Cargo.lock` pins differently
/// from this one: those compile anew in the cold build.
fn report_lock_drift(src: &Path) -> Result<()> {
    let packages = |path: &Path| -> Result<std::collections::BTreeSet<(String, String)>> {
        let lock: toml::Table = std::fs::read_to_string(path)
            .with_context(|| format!("reading {}", path.display()))?
            .parse()
            .with_context(|| format!("parsing {}", path.display()))?;
        Ok(lock
            .get("package")
            .and_then(|p| p.as_array())
            .into_iter()
            .flatten()
            .filter(|p| p.get("source").is_some())
            .filter_map(|p| {
                Some((
                    p.get("name")?.as_str()?.to_owned(),
                    p.get("version")?.as_str()?.to_owned(),
                ))
            })
            .collect())
    };
    let old = packages(&src.join("Cargo.lock"))?;
    let new = packages(&root().join("Cargo.lock"))?;
    let differ: Vec<String> = old
        .difference(&new)
        .map(|(n, v)| format!("{n} {v}"))
        .collect();
    if differ.is_empty() {
        eprintln!(
            "xtask: the old Cargo.lock pins the same registry packages: only workspace crates compile"
        );
    } else {
        eprintln!(
            "xtask: the old Cargo.lock pins {} registry packages this one does not (they compile anew): {}",
            differ.len(),
            differ.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "# Changelog\n\n## 0.3.0 (unreleased)\n\n- x\n\n## 0.2.0 (2027-01-02, commit 1111111111111111111111111111111111111111)\n\n## 0.1.0 (2026-12-05, commit 89b71cb8de37eadf7fe98b6d6cda84c6dc777b47)\n";

    #[test]
    fn the_previous_release_is_the_newest_with_a_commit() {
        assert_eq!(
            previous_release(LOG, "0.3.0").ok(),
            Some(Release {
                version: "0.2.0".into(),
                commit: "1111111111111111111111111111111111111111".into()
            })
        );
        // A bump without its entry, and an entry without its commit, fail.
        let e = previous_release(LOG, "0.4.0").err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("add `## 0.4.0 (unreleased)`")));
        let short = LOG.replace(
            "commit 1111111111111111111111111111111111111111",
            "commit 1111",
        );
        assert!(previous_release(&short, "0.3.0").is_err());
        assert!(previous_release("## 0.1.0 (unreleased)\n", "0.1.0").is_err());
    }

    #[test]
    fn this_repository_names_its_previous_release() {
        let text = std::fs::read_to_string(root().join("CHANGELOG.md")).expect("CHANGELOG.md");
        let current = workspace_version().expect("workspace version");
        let previous = previous_release(&text, &current).expect("a previous release");
        assert_ne!(previous.version, current);
    }
    #[test]
    fn a_cache_entry_is_taken_only_as_stamped() {
        let release = Release {
            version: "0.1.0".into(),
            commit: "89b71cb8de37eadf7fe98b6d6cda84c6dc777b47".into(),
        };
        let dir = std::env::temp_dir().join(format!("reach-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let write_bins = |said: &str| {
            for bin in BINARIES {
                let path = dir.join(bin);
                std::fs::write(&path, format!("#!/bin/sh\necho '{bin} {said}'\n")).expect("bin");
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                    .expect("chmod");
            }
        };
        write_bins("0.1.0 (commit 89b71cb8de37, built 2026-12-05)");
        let stamp = stamp(&release).expect("stamp");
        assert!(stamp.contains("Cargo.lock sha256 ") && stamp.contains("rustc binary: rustc"));
        let sums = binary_sums(&dir).expect("sums");
        std::fs::write(dir.join("stamp"), format!("{stamp}{sums}")).expect("stamp file");
        assert!(cache_holds(&dir, &stamp, &release));
        // Another toolchain (or commit, or Cargo.lock) is another stamp.
        let other = stamp.replace("rustc binary: rustc", "rustc binary: rustc-other");
        assert!(!cache_holds(&dir, &other, &release));
        // Binaries that are not the ones built there.
        write_bins("0.1.0 (commit 89b71cb8de37, built 2026-12-06)");
        assert!(!cache_holds(&dir, &stamp, &release));
        // Recorded as built, but saying another commit.
        std::fs::write(
            dir.join("stamp"),
            format!("{stamp}{}", binary_sums(&dir).expect("sums")),
        )
        .expect("stamp file");
        assert!(cache_holds(&dir, &stamp, &release));
        write_bins("0.1.0 (commit 000000000000, built 2026-12-05)");
        std::fs::write(
            dir.join("stamp"),
            format!("{stamp}{}", binary_sums(&dir).expect("sums")),
        )
        .expect("stamp file");
        assert!(!cache_holds(&dir, &stamp, &release));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
