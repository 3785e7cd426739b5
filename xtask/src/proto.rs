//! `cargo xtask proto`: the wire contract (`proto/reach/v1`) guarded by
//! buf, the protobuf ecosystem's own tool, installed from npm
//! (`@bufbuild/buf`, pinned) into `target/buf`:
//! - `buf lint` with the rules of `proto/buf.yaml`;
//! - `buf breaking` against the baseline committed in `proto/baseline/`:
//!   a field removed (unless reserved), renumbered or retyped, a message,
//!   enum value, service or RPC renamed or removed all fail;
//! - the baseline is the build of the current tree (an addition is
//!   recorded with `cargo xtask proto --update-baseline`, which refuses a
//!   breaking change, so the new fields are guarded too);
//! - a self-check proves the guard bites: a copy of the tree with one
//!   field removed, and one with another field renumbered, must each fail
//!   `buf breaking`.
//!
//! The baseline is a buf image (`buf build --exclude-source-info`: the
//! compiled descriptors), not a copy of the `.proto` text: it is exactly
//! what `buf breaking` compares; a second copy of package `reach.v1` in the
//! tree would have to be kept out of buf's module, the build and every
//! tool that looks for `.proto` files; and comments, which may change
//! freely, are not in it. Review reads the `.proto` diff; the check that
//! the image is the build of the tree keeps the two from drifting.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{root, run, target_dir};

/// The `@bufbuild/buf` version, pinned (npm).
const BUF_VERSION: &str = "1.75.0";

/// The buf module (holds `buf.yaml`), relative to the root.
const MODULE: &str = "proto";

/// The committed baseline image, relative to the root.
const BASELINE: &str = "proto/baseline/reach-v1.binpb";

/// buf's exit code when it ran and found problems (lint or breaking); any
/// other failure is buf not running properly.
const FOUND_PROBLEMS: i32 = 100;

/// `cargo xtask proto [--update-baseline]`.
pub fn check(args: &[String]) -> Result<()> {
    let buf = Buf::install()?;
    match args.first().map(String::as_str) {
        None => {}
        Some("--update-baseline") => return update_baseline(&buf),
        Some(other) => bail!("proto: unknown argument {other:?} (only --update-baseline)"),
    }
    run(buf.command(&["lint", MODULE]), "buf lint")
        .context("the proto contract breaks a lint rule of proto/buf.yaml (see above)")?;
    breaking(&buf, &root().join(MODULE)).context(
        "the proto contract broke compatibility with proto/baseline (see above): v1 is additive only",
    )?;
    baseline_is_current(&buf)?;
    self_check(&buf)?;
    eprintln!("xtask: proto: lint, breaking and the self-check passed (buf {BUF_VERSION})");
    Ok(())
}

/// The buf binary in `target/buf`.
struct Buf {
    bin: PathBuf,
    dir: PathBuf,
}

impl Buf {
    /// Installs the pinned buf with npm unless it is there already.
    fn install() -> Result<Buf> {
        let dir = target_dir().join("buf");
        let buf = Buf {
            bin: dir.join("node_modules/.bin/buf"),
            dir,
        };
        if buf.version().as_deref() == Some(BUF_VERSION) {
            return Ok(buf);
        }
        let npm = Command::new("npm")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !npm {
            bail!("npm is not installed: `apt-get install nodejs npm` (.ci/run does this)");
        }
        std::fs::create_dir_all(&buf.dir)
            .with_context(|| format!("creating {}", buf.dir.display()))?;
        let mut install = Command::new("npm");
        install
            .arg("install")
            .arg("--prefix")
            .arg(&buf.dir)
            .args(["--save-exact", "--no-audit", "--no-fund"])
            .arg(format!("@bufbuild/buf@{BUF_VERSION}"));
        run(install, "npm install @bufbuild/buf")?;
        match buf.version() {
            Some(v) if v == BUF_VERSION => Ok(buf),
            other => bail!(
                "{} reports version {other:?} after installing {BUF_VERSION}",
                buf.bin.display()
            ),
        }
    }

    fn version(&self) -> Option<String> {
        let out = Command::new(&self.bin).arg("--version").output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// A buf command run from the root, its cache under `target/buf`.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.current_dir(root())
            .env("BUF_CACHE_DIR", self.dir.join("cache"))
            .args(args);
        cmd
    }
}

/// `buf breaking` of the module at `module` against the baseline.
fn breaking(buf: &Buf, module: &Path) -> Result<()> {
    let mut cmd = buf.command(&["breaking"]);
    cmd.arg(module).arg("--against").arg(root().join(BASELINE));
    run(cmd, "buf breaking")
}

/// Builds the module's image (no source info) to `out`.
fn build_image(buf: &Buf, out: &Path) -> Result<()> {
    let mut cmd = buf.command(&["build", MODULE, "--exclude-source-info", "-o"]);
    cmd.arg(out);
    run(cmd, "buf build")
}

/// Fails unless the baseline is the build of the current tree.
fn baseline_is_current(buf: &Buf) -> Result<()> {
    let current = buf.dir.join("current.binpb");
    build_image(buf, &current)?;
    let built =
        std::fs::read(&current).with_context(|| format!("reading {}", current.display()))?;
    let baseline = std::fs::read(root().join(BASELINE)).with_context(|| {
        format!("reading {BASELINE} (create it with `cargo xtask proto --update-baseline`)")
    })?;
    if built != baseline {
        bail!(
            "proto/reach/v1 has additions {BASELINE} lacks (they are compatible: `buf breaking` passed): \
             record them with `cargo xtask proto --update-baseline` and commit {BASELINE}, so they are guarded too"
        );
    }
    Ok(())
}

/// Rewrites the baseline from the current tree, after lint and only if
/// the tree is compatible with the old baseline (when there is one).
fn update_baseline(buf: &Buf) -> Result<()> {
    run(buf.command(&["lint", MODULE]), "buf lint")?;
    let baseline = root().join(BASELINE);
    if baseline.exists() {
        breaking(buf, &root().join(MODULE))
            .context("refusing to record a breaking change in the baseline")?;
    }
    if let Some(dir) = baseline.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    build_image(buf, &baseline)?;
    eprintln!("xtask: proto: wrote {BASELINE}");
    Ok(())
}

/// A field line in a `.proto` file: its line index, name and number.
struct Field {
    index: usize,
    name: String,
    number: u64,
}

/// The fields declared in `text` (`[repeated|optional] Type name = N;`).
fn fields(text: &str) -> Vec<Field> {
    let mut out = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default().trim();
        let Some((decl, rest)) = code.split_once('=') else {
            continue;
        };
        let Some(number) = rest
            .trim()
            .strip_suffix(';')
            .and_then(|n| n.trim().parse::<u64>().ok())
        else {
            continue;
        };
        let words: Vec<&str> = decl.split_whitespace().collect();
        let name = match words.as_slice() {
            ["repeated" | "optional", _, name] => name,
            [ty, name] if !matches!(*ty, "option" | "reserved") => name,
            _ => continue,
        };
        out.push(Field {
            index,
            name: (*name).to_owned(),
            number,
        });
    }
    out
}

/// Copies the module (the `.proto` files and `buf.yaml`) to `to`.
fn copy_module(from: &Path, to: &Path) -> Result<()> {
    for entry in std::fs::read_dir(from).with_context(|| format!("listing {}", from.display()))? {
        let entry = entry.with_context(|| format!("listing {}", from.display()))?;
        let path = entry.path();
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            if path == root().join(BASELINE).parent().unwrap_or(Path::new("")) {
                continue;
            }
            std::fs::create_dir_all(&target)?;
            copy_module(&path, &target)?;
        } else if path.extension().is_some_and(|x| x == "proto") || entry.file_name() == "buf.yaml"
        {
            std::fs::copy(&path, &target).with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}

/// Runs `buf breaking` on a changed copy and requires it to report the
/// change (exit code 100, the field named: `… field "2" with name "end"
/// … was deleted …`), not to fail for another reason.
fn must_break(buf: &Buf, module: &Path, change: &str, field: &str) -> Result<()> {
    let mut cmd = buf.command(&["breaking"]);
    cmd.arg(module).arg("--against").arg(root().join(BASELINE));
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.code() != Some(FOUND_PROBLEMS)
        || !text.contains(&format!("with name \"{field}\""))
    {
        bail!(
            "proto self-check: `buf breaking` did not catch {change} ({}): {text}",
            out.status
        );
    }
    eprintln!("xtask: proto self-check: buf breaking caught {change}");
    Ok(())
}

/// Proves the guard bites: copies of the module with one field removed and
/// another renumbered each fail `buf breaking`; the unchanged copy passes.
fn self_check(buf: &Buf) -> Result<()> {
    let scratch = buf.dir.join("self-check");
    let _ = std::fs::remove_dir_all(&scratch);
    let module = root().join(MODULE);
    let file = Path::new("reach/v1/common.proto");
    let text = std::fs::read_to_string(module.join(file))
        .with_context(|| format!("reading {}", module.join(file).display()))?;
    let found = fields(&text);
    let [removed, renumbered, ..] = found.as_slice() else {
        bail!(
            "proto self-check: {} has fewer than two fields",
            file.display()
        );
    };
    let lines: Vec<&str> = text.lines().collect();

    let unchanged = scratch.join("unchanged");
    std::fs::create_dir_all(&unchanged)?;
    copy_module(&module, &unchanged)?;
    breaking(buf, &unchanged).context("proto self-check: the unchanged copy must pass")?;

    let without = scratch.join("field-removed");
    std::fs::create_dir_all(&without)?;
    copy_module(&module, &without)?;
    let mut edited: Vec<&str> = lines.clone();
    edited.remove(removed.index);
    std::fs::write(without.join(file), edited.join("\n") + "\n")?;
    let change = format!("field `{}` removed", removed.name);
    must_break(buf, &without, &change, &removed.name)?;

    let moved = scratch.join("field-renumbered");
    std::fs::create_dir_all(&moved)?;
    copy_module(&module, &moved)?;
    let new_number = found.iter().map(|f| f.number).max().unwrap_or(0) + 1000;
    let line = lines[renumbered.index].replacen(
        &format!("= {};", renumbered.number),
        &format!("= {new_number};"),
        1,
    );
    let mut edited: Vec<String> = lines.iter().map(|l| (*l).to_owned()).collect();
    edited[renumbered.index] = line;
    std::fs::write(moved.join(file), edited.join("\n") + "\n")?;
    let change = format!(
        "field `{}` renumbered {} → {new_number}",
        renumbered.name, renumbered.number
    );
    must_break(buf, &moved, &change, &renumbered.name)?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
