//! The Debian side of `cargo xtask dist` and `package-test`: each package's
//! `changelog.Debian.gz`, made from CHANGELOG.md, and gzip-compressed man
//! pages; the `-dbgsym` packages completed with the copyright, changelog and
//! priority Debian's checks ask for; lintian on every package (any error or
//! warning fails); the units' `Documentation=` present in their packages;
//! and an upgrade to a newer package that must keep the configuration,
//! secrets and state and carry the restart of a running unit.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::{cargo, root, run};

/// The Debian revision cargo-deb gives every package (`VERSION-1`).
pub const REVISION: &str = "1";

/// Where `dist` puts what only the Debian packages install (compressed man
/// pages, the changelog), under the release directory, which the packages'
/// `target/release/…` assets name.
pub fn staged(bin_dir: &Path, bin: &str) -> PathBuf {
    bin_dir.join("reach-deb").join(bin)
}

/// The `maintainer` of the crate's `[package.metadata.deb]`.
fn maintainer(bin: &str) -> Result<String> {
    let path = root().join("crates").join(bin).join("Cargo.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .skip_while(|l| l.trim() != "[package.metadata.deb]")
        .find_map(|l| l.strip_prefix("maintainer = \"")?.strip_suffix('"'))
        .map(str::to_owned)
        .with_context(|| format!("{}: no [package.metadata.deb] maintainer", path.display()))
}

/// `gzip -9n` (best, no name or time stamp: the same bytes every build)
/// of `from` into `to`.
fn gzip(from: &Path, to: &Path) -> Result<()> {
    let out = std::fs::File::create(to).with_context(|| format!("creating {}", to.display()))?;
    let status = Command::new("gzip")
        .args(["-9n", "-c"])
        .arg(from)
        .stdout(out)
        .status()
        .context("gzip is not installed (package gzip)")?;
    if !status.success() {
        bail!("gzip -9n {} failed ({status})", from.display());
    }
    Ok(())
}

/// Makes `staged(bin_dir, bin)`: every man page of `docs` gzip-compressed,
/// and the package's `changelog.Debian.gz` from CHANGELOG.md (the release
/// in development dated `mtime`, the commit's time), whose newest release
/// must be `version`, the workspace's.
pub fn stage(
    bin_dir: &Path,
    bin: &str,
    package: &str,
    version: &str,
    docs: &Path,
    mtime: u64,
) -> Result<()> {
    let dir = staged(bin_dir, bin);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for entry in std::fs::read_dir(docs).with_context(|| format!("listing {}", docs.display()))? {
        let path = entry?.path();
        if let Some(name) = path
            .file_name()
            .filter(|_| path.extension().is_some_and(|e| e == "1"))
        {
            let mut gz = name.to_owned();
            gz.push(".gz");
            gzip(&path, &dir.join(gz))?;
        }
    }
    let markdown = std::fs::read_to_string(root().join("CHANGELOG.md")).context("CHANGELOG.md")?;
    let text = changelog(&markdown, package, &maintainer(bin)?, mtime)?;
    let top = format!("{package} ({version}-{REVISION}) ");
    if !text.starts_with(&top) {
        bail!(
            "CHANGELOG.md's newest release is not {version}, the workspace's version: add `## {version} (unreleased)` with what changed"
        );
    }
    let plain = dir.join("changelog.Debian");
    std::fs::write(&plain, text)?;
    gzip(&plain, &dir.join("changelog.Debian.gz"))?;
    std::fs::remove_file(&plain)?;
    Ok(())
}

/// One block of a release in CHANGELOG.md.
enum Block {
    /// `### Heading`: the items after it are nested under it.
    Heading(String),
    /// `- item` (with its indented continuation lines) or a paragraph.
    Text(String),
}

/// The blocks of a release's lines.
fn blocks(lines: &[&str]) -> Vec<Block> {
    let mut blocks: Vec<Block> = Vec::new();
    // Whether the last block takes the next line (no blank line between).
    let mut open = false;
    for line in lines {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            open = false;
        } else if let Some(heading) = trimmed.strip_prefix("### ") {
            blocks.push(Block::Heading(heading.trim_end_matches(':').to_owned()));
            open = false;
        } else if let Some(item) = line.strip_prefix("- ") {
            blocks.push(Block::Text(item.trim().to_owned()));
            open = true;
        } else if let (true, Some(Block::Text(text))) = (open, blocks.last_mut()) {
            text.push(' ');
            text.push_str(trimmed);
        } else {
            blocks.push(Block::Text(trimmed.to_owned()));
            open = true;
        }
    }
    blocks
}

/// `text` filled to 79 columns, the first line after `first`, the others
/// after `rest`.
fn wrap(first: &str, rest: &str, text: &str) -> String {
    let mut out = String::new();
    let mut line = first.to_owned();
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && line.chars().count() + 1 + word.chars().count() > 79 {
            out += line.trim_end();
            out.push('\n');
            line = rest.to_owned();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line += word;
        empty = false;
    }
    out += line.trim_end();
    out.push('\n');
    out
}

/// A Debian changelog (deb-changelog(5)) for `package` from CHANGELOG.md:
/// one entry per `## VERSION (…)` release, newest first, each block a
/// `*` item (a `### Heading`'s items nested as `-` under it), dated the
/// release's day, or `unreleased` (the release in development) at the Unix
/// time `unreleased`.
pub fn changelog(
    markdown: &str,
    package: &str,
    maintainer: &str,
    unreleased: u64,
) -> Result<String> {
    let mut releases: Vec<(&str, Vec<&str>)> = Vec::new();
    for line in markdown.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            releases.push((heading.trim(), Vec::new()));
        } else if let Some((_, lines)) = releases.last_mut() {
            lines.push(line);
        }
    }
    if releases.is_empty() {
        bail!("CHANGELOG.md has no `## VERSION (…)` release");
    }
    let mut out = String::new();
    for (heading, lines) in releases {
        let (version, rest) = heading.split_once(' ').unwrap_or((heading, ""));
        if version.is_empty()
            || !version.starts_with(|c: char| c.is_ascii_digit())
            || !version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".+~".contains(c))
        {
            bail!("CHANGELOG.md: `## {heading}`: {version:?} is not a version");
        }
        let when = match rest
            .strip_prefix('(')
            .and_then(|r| r.split([',', ')']).next())
        {
            Some("unreleased") => unreleased,
            Some(day) => day_seconds(day.trim()).with_context(|| {
                format!("CHANGELOG.md: `## {heading}`: the release day is not YYYY-MM-DD")
            })?,
            None => bail!(
                "CHANGELOG.md: `## {heading}` says neither `(unreleased)` nor `(YYYY-MM-DD, commit …)`"
            ),
        };
        let mut items = String::new();
        let mut nested = false;
        for block in blocks(&lines) {
            match block {
                Block::Heading(h) => {
                    items += &wrap("  * ", "    ", &format!("{h}:"));
                    nested = true;
                }
                Block::Text(t) if nested => items += &wrap("    - ", "      ", &t),
                Block::Text(t) => items += &wrap("  * ", "    ", &t),
            }
        }
        if items.is_empty() {
            bail!("CHANGELOG.md: release {version} says nothing");
        }
        out += &format!(
            "{package} ({version}-{REVISION}) unstable; urgency=medium\n\n{items}\n -- {maintainer}  {}\n\n",
            rfc2822(when)
        );
    }
    out.pop();
    Ok(out)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The Unix time of 00:00 UTC on `day` (`YYYY-MM-DD`).
fn day_seconds(day: &str) -> Result<u64> {
    let parts: Vec<&str> = day.split('-').collect();
    let [y, m, d] = parts.as_slice() else {
        bail!("{day:?} is not YYYY-MM-DD");
    };
    let (y, m, d): (i64, i64, i64) = (y.parse()?, m.parse()?, d.parse()?);
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        bail!("{day:?} is not a date");
    }
    Ok(u64::try_from(days_from_civil(y, m, d) * 86_400)?)
}

/// An RFC 2822 date in UTC, as deb-changelog(5) wants it.
fn rfc2822(unix: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Hinnant's `civil_from_days`.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{}, {d:02} {} {y} {:02}:{:02}:{:02} +0000",
        DAYS[(days % 7) as usize],
        MONTHS[(m - 1) as usize],
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// The one file in `dir` named `PREFIX*.EXT`.
fn find(dir: &Path, prefix: &str, ext: &str) -> Result<PathBuf> {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == ext)
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "{} has {} {prefix}*.{ext} files, not one",
            dir.display(),
            found.len()
        ),
    }
}

/// Completes cargo-deb's `PACKAGE-dbgsym` .ddeb in `dist` as Debian's own
/// dbgsym packages are: cargo-deb gives it no /usr/share/doc (so no
/// copyright or changelog), the retired `Priority: extra` and only a
/// Recommends of its package (three lintian errors). Unpacked, given
/// `/usr/share/doc/PACKAGE-dbgsym` as a link to the package's (which holds
/// both; lintian accepts it from a package of the same source that depends
/// on it), `Depends: PACKAGE (= VERSION)` and `Priority: optional`, and
/// packed again with dpkg-deb, its entries dated `mtime`.
pub fn complete_dbgsym(dist: &Path, bin_dir: &Path, package: &str, mtime: u64) -> Result<()> {
    let name = format!("{package}-dbgsym");
    let ddeb = find(dist, &format!("{name}_"), "ddeb")?;
    let tree = bin_dir.join("reach-deb").join(&name);
    let _ = std::fs::remove_dir_all(&tree);
    let mut unpack = Command::new("dpkg-deb");
    unpack.arg("--raw-extract").arg(&ddeb).arg(&tree);
    run(unpack, &format!("dpkg-deb --raw-extract {name}"))?;
    let control = tree.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control)?;
    let version = text
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .with_context(|| format!("{name}: no Version in its control file"))?;
    let mut mended = String::new();
    for line in text.lines() {
        if line.starts_with("Priority:") {
            mended += "Priority: optional\n";
        } else if line.starts_with("Recommends:") || line.starts_with("Depends:") {
            // Replaced by the Depends below.
        } else {
            mended += line;
            mended.push('\n');
            if line.starts_with("Architecture:") {
                mended += &format!("Depends: {package} (= {version})\n");
            }
        }
    }
    if !mended.contains("\nDepends: ") {
        bail!("{name}: no Architecture in its control file");
    }
    std::fs::write(&control, mended)?;
    let docs = tree.join("usr/share/doc");
    std::fs::create_dir_all(&docs)?;
    std::os::unix::fs::symlink(package, docs.join(&name))?;
    let mut pack = Command::new("dpkg-deb");
    pack.env("SOURCE_DATE_EPOCH", mtime.to_string())
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&tree)
        .arg(&ddeb)
        .stdout(Stdio::null());
    run(pack, &format!("dpkg-deb --build {name}"))?;
    std::fs::remove_dir_all(&tree)?;
    Ok(())
}

/// lintian (Debian's package checker) on every package in `dist`, the
/// `-dbgsym` .ddeb files included (lintian judges them too): any error or
/// warning fails, each named. The only overrides are those a package
/// carries in /usr/share/lintian/overrides, each with its reason.
pub fn lintian(dist: &Path) -> Result<()> {
    let present = Command::new("lintian")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !present {
        bail!("lintian is not installed: `apt-get install lintian` (.ci/run does this)");
    }
    let mut packages: Vec<PathBuf> = std::fs::read_dir(dist)
        .with_context(|| format!("{}: run `cargo xtask dist` first", dist.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "deb" || e == "ddeb"))
        .collect();
    packages.sort();
    if packages.is_empty() {
        bail!(
            "no packages in {}: run `cargo xtask dist` first",
            dist.display()
        );
    }
    let mut cmd = Command::new("lintian");
    cmd.args([
        "--fail-on",
        "error,warning",
        "--display-info",
        "--tag-display-limit",
        "0",
    ])
    .args(&packages);
    eprintln!("xtask: package-test: {cmd:?}");
    let out = cmd.output().context("starting lintian")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    eprint!("{text}");
    let findings: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("E: ") || l.starts_with("W: "))
        .collect();
    if !findings.is_empty() || !out.status.success() {
        bail!(
            "lintian ({}): {} errors and warnings:\n{}",
            out.status,
            findings.len(),
            findings.join("\n")
        );
    }
    eprintln!(
        "xtask: package-test: lintian: {} packages, no error or warning",
        packages.len()
    );
    Ok(())
}

/// The files a unit's `Documentation=` URIs name, relative to `/`:
/// `man:NAME(SECTION)` the gzip-compressed page, `file:` its path. A
/// `http(s):` URI names no file of the package.
pub fn documentation_paths(unit: &str) -> Result<Vec<String>> {
    let mut paths = Vec::new();
    for line in unit.lines() {
        let Some(uris) = line.trim().strip_prefix("Documentation=") else {
            continue;
        };
        for uri in uris.split_whitespace() {
            if let Some(page) = uri.strip_prefix("man:") {
                let (name, section) = page
                    .strip_suffix(')')
                    .and_then(|p| p.split_once('('))
                    .filter(|(n, s)| !n.is_empty() && s.starts_with(|c: char| c.is_ascii_digit()))
                    .with_context(|| format!("Documentation={uri}: not man:NAME(SECTION)"))?;
                let dir = &section[..1];
                paths.push(format!("usr/share/man/man{dir}/{name}.{section}.gz"));
            } else if let Some(path) = uri
                .strip_prefix("file://")
                .or_else(|| uri.strip_prefix("file:"))
            {
                paths.push(path.trim_start_matches('/').to_owned());
            } else if !(uri.starts_with("https://") || uri.starts_with("http://")) {
                bail!("Documentation={uri}: not a man:, file: or http(s): URI");
            }
        }
    }
    Ok(paths)
}

/// Checks that every `Documentation=` of every unit `deb` installs names a
/// file `deb` installs (unpacked under `work`).
pub fn check_documentation(deb: &Path, work: &Path) -> Result<()> {
    let name = deb
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tree = work.join("contents").join(&name);
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(&tree)?;
    let mut unpack = Command::new("dpkg-deb");
    unpack.arg("--extract").arg(deb).arg(&tree);
    run(unpack, &format!("dpkg-deb --extract {name}"))?;
    let units = tree.join("lib/systemd/system");
    let mut checked = 0;
    for entry in std::fs::read_dir(&units).with_context(|| format!("{name} installs no unit"))? {
        let unit = entry?.path();
        let text = std::fs::read_to_string(&unit)?;
        let paths =
            documentation_paths(&text).with_context(|| format!("{name}: {}", unit.display()))?;
        if paths.is_empty() {
            bail!(
                "{name}: {} has no Documentation= naming a file",
                unit.display()
            );
        }
        for path in paths {
            if !tree.join(&path).is_file() {
                bail!(
                    "{name}: {} documents itself with /{path}, which the package does not install",
                    unit.display()
                );
            }
            checked += 1;
        }
    }
    eprintln!("xtask: package-test: {name}: {checked} Documentation= files installed");
    Ok(())
}

/// `systemd-analyze verify` of each installed unit (`units`, file names in
/// /lib/systemd/system): every directive one systemd knows, every command
/// it runs installed, every `man:` page of its `Documentation=` found by
/// man. It needs no running systemd.
pub fn verify_units(units: &[String]) -> Result<()> {
    for unit in units {
        let path = format!("/lib/systemd/system/{unit}");
        let out = Command::new("systemd-analyze")
            .args(["verify", &path])
            .output()
            .context(
                "systemd-analyze is not installed: `apt-get install systemd` (.ci/run does this)",
            )?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        if !out.status.success() || !text.trim().is_empty() {
            bail!("systemd-analyze verify {path} ({}):\n{text}", out.status);
        }
    }
    eprintln!(
        "xtask: package-test: systemd-analyze verify: {} installed units clean",
        units.len()
    );
    Ok(())
}

/// The packages of `bins` (binary, Debian package) again, from the same
/// release binaries and files, at a version above `dist`'s
/// (`VERSION-1+upgrade1`), in `work/upgrade`: what `upgrade` installs over
/// them. Returns the packages and their version.
pub fn newer_packages(
    work: &Path,
    version: &str,
    bins: &[(&str, &str)],
) -> Result<(Vec<PathBuf>, String)> {
    let newer = format!("{version}-{REVISION}+upgrade1");
    let out = work.join("upgrade");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let mut debs = Vec::new();
    for (bin, package) in bins {
        let mut deb = cargo();
        deb.args([
            "deb",
            "--locked",
            "--no-build",
            "-p",
            bin,
            "--deb-version",
            &newer,
            "--output",
        ])
        .arg(&out);
        run(deb, &format!("cargo deb {package} {newer}"))?;
        debs.push(find(&out, &format!("{package}_"), "deb")?);
    }
    Ok((debs, newer))
}

/// A file or directory as the upgrade must leave it: path, mode, owner,
/// group and (a file's) bytes.
type Kept = (PathBuf, u32, u32, u32, Vec<u8>);

/// Every file and directory under `dirs`.
fn snapshot(dirs: &[&str]) -> Result<Vec<Kept>> {
    use std::os::unix::fs::MetadataExt;
    let mut todo: Vec<PathBuf> = dirs.iter().map(PathBuf::from).collect();
    let mut seen = Vec::new();
    while let Some(path) = todo.pop() {
        let meta =
            std::fs::symlink_metadata(&path).with_context(|| format!("{}", path.display()))?;
        let bytes = if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                todo.push(entry?.path());
            }
            Vec::new()
        } else {
            std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?
        };
        seen.push((path, meta.mode(), meta.uid(), meta.gid(), bytes));
    }
    seen.sort();
    Ok(seen)
}

/// Installs `newer` (at `version`) over the installed packages, as
/// `apt-get install` of a newer release does, and checks: dpkg configures
/// them (each postinst run with `configure OLD-VERSION`, its upgrade path);
/// every file under /etc/reach and /var/lib/reach (the conffiles, edited
/// here first as an operator would, the secrets, the CA's data, the
/// connector's enrollment) is as it was, modes and owners included; each
/// postinst carries the restart of a running unit; the upgraded CA accepts
/// the kept config (its unit's ExecStartPre). The restart itself needs a
/// running systemd (`/run/systemd/system`), which this machine has not.
pub fn upgrade(newer: &[PathBuf], version: &str, packages: &[&str]) -> Result<()> {
    use std::io::Write;
    for conffile in ["/etc/reach/ca.toml", "/etc/reach/connector.env"] {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(conffile)
            .with_context(|| format!("opening {conffile}"))?;
        writeln!(
            file,
            "# package-test: an operator's edit, which the upgrade keeps"
        )?;
    }
    let before = snapshot(&["/etc/reach", "/var/lib/reach"])?;
    let mut install = Command::new("dpkg");
    install
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .arg("--install")
        .args(newer);
    run(install, "dpkg --install (upgrade)")?;
    for package in packages {
        let mut query = Command::new("dpkg-query");
        query.args(["-W", "-f=${Version} ${db:Status-Status}", package]);
        let out = query.output().context("dpkg-query")?;
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        if said != format!("{version} installed") {
            bail!("after the upgrade {package} is {said:?}, not {version} installed");
        }
        let script = format!("/var/lib/dpkg/info/{package}.postinst");
        let text = std::fs::read_to_string(&script).with_context(|| format!("reading {script}"))?;
        let restart = format!("deb-systemd-invoke try-restart {package}.service");
        if !(text.contains("[ -n \"$2\" ]") && text.contains(&restart)) {
            bail!(
                "{script} does not restart a running {package}.service on upgrade (`{restart}` when $2 is set)"
            );
        }
    }
    let after = snapshot(&["/etc/reach", "/var/lib/reach"])?;
    if after != before {
        let paths = |s: &[Kept]| s.iter().map(|e| e.0.clone()).collect::<Vec<_>>();
        let changed: Vec<String> = before
            .iter()
            .filter(|b| !after.contains(b))
            .map(|b| b.0.display().to_string())
            .chain(
                paths(&after)
                    .iter()
                    .filter(|p| !paths(&before).contains(p))
                    .map(|p| format!("{} (new)", p.display())),
            )
            .collect();
        bail!("the upgrade changed {}", changed.join(", "));
    }
    let mut check = Command::new("/usr/bin/central-authority");
    check.args(["check-config", "/etc/reach/ca.toml"]);
    run(
        check,
        "the upgraded central-authority check-config (the unit's ExecStartPre)",
    )?;
    eprintln!(
        "xtask: package-test: upgraded to {version}: {} files and directories under /etc/reach and /var/lib/reach kept as they were",
        before.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_rfc_2822_in_utc() {
        for (day, said) in [
            ("1970-01-01", "Thu, 01 Jan 1970 00:00:00 +0000"),
            ("2026-12-05", "Sat, 05 Dec 2026 00:00:00 +0000"),
            ("2024-02-29", "Thu, 29 Feb 2024 00:00:00 +0000"),
            ("2000-03-01", "Wed, 01 Mar 2000 00:00:00 +0000"),
            ("2100-03-01", "Mon, 01 Mar 2100 00:00:00 +0000"),
        ] {
            assert_eq!(rfc2822(day_seconds(day).expect(day)), said, "{day}");
        }
        assert_eq!(rfc2822(1_796_000_000), "Mon, 30 Nov 2026 00:53:20 +0000");
        for bad in ["2026-13-01", "2026-12", "yesterday", "1969-12-31"] {
            assert!(day_seconds(bad).is_err(), "{bad} taken as a day");
        }
    }

    /// `dpkg-parsechangelog FIELD` of the changelog file `path`, entry
    /// `offset` (0: the newest).
    fn parsed(path: &Path, offset: usize, field: &str) -> String {
        let out = Command::new("dpkg-parsechangelog")
            .arg("-l")
            .arg(path)
            .args(["--offset", &offset.to_string(), "--count", "1", "--show-field", field])
            .output()
            .expect("dpkg-parsechangelog is not installed: `apt-get install dpkg-dev` (lintian, which .ci/run installs, brings it)");
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "dpkg-parsechangelog {field} of entry {offset}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    #[test]
    fn the_packages_changelog_is_changelog_md_in_debian_form() {
        let markdown = std::fs::read_to_string(root().join("CHANGELOG.md")).expect("CHANGELOG.md");
        let maintainer = maintainer("central-authority").expect("maintainer");
        let text = changelog(
            &markdown,
            "reach-central-authority",
            &maintainer,
            1_796_000_000,
        )
        .expect("CHANGELOG.md converts");
        let dir = root().join("target/xtask-debian");
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let path = dir.join("changelog");
        std::fs::write(&path, &text).expect("write the changelog");
        let releases: Vec<&str> = markdown
            .lines()
            .filter_map(|l| l.strip_prefix("## ")?.split(' ').next())
            .collect();
        assert!(releases.len() >= 2, "CHANGELOG.md: {releases:?}");
        let workspace = crate::dist::version().expect("workspace version");
        assert_eq!(
            releases[0], workspace,
            "CHANGELOG.md's newest release is not the workspace's version"
        );
        for (i, release) in releases.iter().enumerate() {
            assert_eq!(parsed(&path, i, "Source"), "reach-central-authority");
            assert_eq!(parsed(&path, i, "Version"), format!("{release}-1"));
            assert_eq!(parsed(&path, i, "Distribution"), "unstable");
            assert_eq!(parsed(&path, i, "Maintainer"), maintainer);
        }
        // The release in development is dated at the given time, a released
        // one on its day; the text is CHANGELOG.md's, as items.
        assert_eq!(parsed(&path, 0, "Date"), "Mon, 30 Nov 2026 00:53:20 +0000");
        let first = markdown
            .lines()
            .find_map(|l| {
                let (version, rest) = l.strip_prefix("## ")?.split_once(" (")?;
                let day = rest.split(',').next().filter(|d| d.len() == 10)?;
                Some((version, day))
            })
            .expect("a dated release in CHANGELOG.md");
        let index = releases
            .iter()
            .position(|r| *r == first.0)
            .expect("its entry");
        assert_eq!(
            parsed(&path, index, "Date"),
            rfc2822(day_seconds(first.1).expect("its day"))
        );
        let changes = parsed(&path, index, "Changes");
        assert!(changes.contains("* The first release."), "{changes}");
        assert!(
            text.contains("  * Upgrading from 0.1.0:\n    - Take a backup before upgrading"),
            "{text}"
        );
        assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
    }

    #[test]
    fn a_changelog_md_debian_cannot_take_is_refused_with_the_reason() {
        for (markdown, reason) in [
            ("# Changelog\n", "no `## VERSION"),
            ("## 0.3.0\n\n- x\n", "neither `(unreleased)`"),
            ("## 0.3.0 (5 May 2026, commit 0)\n\n- x\n", "not YYYY-MM-DD"),
            ("## next (unreleased)\n\n- x\n", "is not a version"),
            ("## 0.3.0 (unreleased)\n\n", "says nothing"),
        ] {
            let error = changelog(markdown, "p", "m <m@example.invalid>", 0)
                .expect_err(markdown)
                .to_string();
            assert!(error.contains(reason), "{markdown:?}: {error}");
        }
    }

    #[test]
    fn documentation_uris_name_the_files_a_package_installs() {
        let unit = "[Unit]\nDocumentation=man:central-authority(1) https://example.invalid/book\nDocumentation=file:///usr/share/doc/p/examples/ca.toml\n";
        assert_eq!(
            documentation_paths(unit).expect("paths"),
            [
                "usr/share/man/man1/central-authority.1.gz",
                "usr/share/doc/p/examples/ca.toml"
            ]
        );
        for bad in [
            "Documentation=man:central-authority",
            "Documentation=info:reach",
        ] {
            assert!(documentation_paths(bad).is_err(), "{bad}");
        }
    }
}
