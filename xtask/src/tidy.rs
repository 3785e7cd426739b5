//! Tidy checks: the architecture's written invariants, checked on every
//! `cargo test` (and so by `cargo xtask ci`), in the spirit of
//! rust-analyzer's `xtask/src/tidy.rs`. Each failure names the file and line
//! that breaks the rule.
//!
//! The rules:
//! - `policy`'s `[dependencies]` name no crate called `tokio*` or `tonic*`,
//!   and its `src/` calls no clock (`::now(`, `.elapsed(`) outside test code.
//! - No `.unwrap()` or `.expect(` outside test code in the `src/` of every
//!   shipped crate (a workspace member without `publish = false`; the
//!   harnesses, the benchmark driver and xtask are not shipped).
//! - Every `message`, `enum`, field and enum value in `proto/reach/v1` has a
//!   `//` comment on the line before or at the end of its own line.
//! - ARCHITECTURE.md's code map has a `` ### `path` `` heading for every
//!   workspace member, and each such section names every top-level module of
//!   that crate in backticks.
//!
//! Test code is what `#[cfg(test)]` or `#[cfg(all(test, …))]` marks (the
//! item after the attribute: an inline module, a function, an impl, or a
//! `mod x;` whose file is then
//! skipped whole). Comments and string literals are never searched.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::root;

/// A broken rule at `file:line`.
struct Violation {
    file: PathBuf,
    line: usize,
    what: String,
}

/// Fails the test with every violation, one per line.
fn report(rule: &str, violations: &[Violation]) {
    if violations.is_empty() {
        return;
    }
    let mut text = format!("tidy: {rule}: {} violation(s)\n", violations.len());
    for v in violations {
        let _ = writeln!(text, "  {}:{}: {}", v.file.display(), v.line, v.what);
    }
    panic!("{text}");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(root().join(path))
        .unwrap_or_else(|e| panic!("tidy: reading {}: {e}", path.display()))
}

fn manifest(path: &Path) -> toml::Table {
    read(path)
        .parse()
        .unwrap_or_else(|e| panic!("tidy: parsing {}: {e}", path.display()))
}

/// A workspace member: its directory (relative to the root), and whether it
/// ships (`publish = false` marks the harnesses and tools).
struct Member {
    dir: PathBuf,
    shipped: bool,
}

fn members() -> Vec<Member> {
    let workspace = manifest(Path::new("Cargo.toml"));
    let list = workspace["workspace"]["members"]
        .as_array()
        .unwrap_or_else(|| panic!("tidy: Cargo.toml: no [workspace] members list"));
    list.iter()
        .filter_map(|m| m.as_str())
        .map(|dir| {
            let dir = PathBuf::from(dir);
            let package = manifest(&dir.join("Cargo.toml"));
            let publish = package
                .get("package")
                .and_then(|p| p.get("publish"))
                .and_then(toml::Value::as_bool);
            Member {
                dir,
                shipped: publish != Some(false),
            }
        })
        .collect()
}

/// Every `.rs` file below `dir` (relative to the root), sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(root().join(&d)) else {
            continue;
        };
        for e in entries.flatten() {
            let path = d.join(e.file_name());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// `text` with comments and the contents of string and character literals
/// blanked, line by line (so line numbers stay), for searching code only.
fn code_lines(text: &str) -> Vec<String> {
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        Code,
        Block(usize),
        Str,
        Raw(usize),
    }
    let mut state = State::Code;
    let mut lines = Vec::new();
    for line in text.lines() {
        let chars: Vec<char> = line.chars().collect();
        let mut out = String::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            match state {
                State::Block(depth) => {
                    if c == '*' && next == Some('/') {
                        state = if depth == 1 {
                            State::Code
                        } else {
                            State::Block(depth - 1)
                        };
                        i += 1;
                    } else if c == '/' && next == Some('*') {
                        state = State::Block(depth + 1);
                        i += 1;
                    }
                }
                State::Str => {
                    if c == '\\' {
                        i += 1;
                    } else if c == '"' {
                        out.push('"');
                        state = State::Code;
                    }
                }
                State::Raw(hashes) => {
                    let closes = c == '"'
                        && chars[i + 1..]
                            .iter()
                            .take(hashes)
                            .filter(|h| **h == '#')
                            .count()
                            == hashes;
                    if closes {
                        out.push('"');
                        i += hashes;
                        state = State::Code;
                    }
                }
                State::Code => {
                    if c == '/' && next == Some('/') {
                        break;
                    } else if c == '/' && next == Some('*') {
                        state = State::Block(1);
                        i += 1;
                    } else if c == '"' {
                        out.push('"');
                        state = State::Str;
                    } else if c == 'r'
                        && matches!(next, Some('"' | '#'))
                        && !out.ends_with(|p: char| p.is_alphanumeric() || p == '_')
                    {
                        let hashes = chars[i + 1..].iter().take_while(|h| **h == '#').count();
                        if chars.get(i + 1 + hashes) == Some(&'"') {
                            out.push('"');
                            state = State::Raw(hashes);
                            i += hashes + 1;
                        } else {
                            out.push(c);
                        }
                    } else if c == '\'' {
                        // A character literal ('x', '\n', '\u{7f}'), not a
                        // lifetime ('a).
                        if next == Some('\\') {
                            let end = chars[i + 2..].iter().position(|x| *x == '\'');
                            out.push_str("' '");
                            i += end.map_or(chars.len(), |e| e + 2);
                        } else if chars.get(i + 2) == Some(&'\'') {
                            out.push_str("' '");
                            i += 2;
                        } else {
                            out.push(c);
                        }
                    } else {
                        out.push(c);
                    }
                }
            }
            i += 1;
        }
        lines.push(out);
    }
    lines
}

/// The lines of a source file outside test code, numbered from 1, and the
/// names of modules it declares test-only (`#[cfg(test)] mod x;`).
fn non_test_lines(text: &str) -> (Vec<(usize, String)>, Vec<String>) {
    let mut kept = Vec::new();
    let mut test_mods = Vec::new();
    // After `#[cfg(test)]`, until its item starts.
    let mut pending = false;
    // Inside a test item: its brace depth, and whether its body has opened.
    let mut skipping: Option<(i64, bool)> = None;
    for (n, line) in code_lines(text).into_iter().enumerate() {
        let mut item = line.trim();
        if let Some(rest) = test_cfg(item) {
            pending = true;
            item = rest.trim();
        }
        if pending && !(item.is_empty() || item.starts_with("#[")) {
            pending = false;
            if let Some(name) = declared_mod(item) {
                test_mods.push(name);
                continue;
            }
            skipping = Some((0, false));
        }
        if let Some((depth, opened)) = skipping.as_mut() {
            if skip_line(item, depth, opened) {
                skipping = None;
            }
            continue;
        }
        if !pending {
            kept.push((n + 1, line));
        }
    }
    (kept, test_mods)
}

/// The rest of a line that opens with a test-only `cfg`: `#[cfg(test)]`, or
/// `#[cfg(all(test, …))]` (test code that also needs, say, unix).
fn test_cfg(item: &str) -> Option<&str> {
    if let Some(rest) = item.strip_prefix("#[cfg(test)]") {
        return Some(rest);
    }
    let inner = item.strip_prefix("#[cfg(all(test,")?;
    let end = inner.find(")]")?;
    Some(&inner[end + 2..])
}

/// Steps over one line of a skipped test item; true when the item ends on
/// it (its body closed, or a `;` before any body: `use`, a declaration).
fn skip_line(item: &str, depth: &mut i64, opened: &mut bool) -> bool {
    let ends_without_body = !*opened
        && item
            .find(';')
            .is_some_and(|semi| item.find('{').is_none_or(|o| semi < o));
    *depth += brace_balance(item);
    *opened |= item.contains('{');
    ends_without_body || (*opened && *depth <= 0)
}

/// `{` minus `}` on a code line.
fn brace_balance(line: &str) -> i64 {
    line.chars().fold(0, |n, c| match c {
        '{' => n + 1,
        '}' => n - 1,
        _ => n,
    })
}

/// `x` of a `mod x;` declaration (any visibility).
fn declared_mod(trimmed: &str) -> Option<String> {
    let rest = trimmed
        .strip_prefix("pub ")
        .or_else(|| trimmed.strip_prefix("pub(crate) "))
        .unwrap_or(trimmed);
    let name = rest.strip_prefix("mod ")?.strip_suffix(';')?.trim();
    Some(name.to_owned())
}

/// The non-test lines of every `.rs` file under `src`, by file; files of
/// test-only modules are left out.
fn non_test_sources(src: &Path) -> Vec<(PathBuf, Vec<(usize, String)>)> {
    let files = rust_files(src);
    let mut test_files = BTreeSet::new();
    let mut out = Vec::new();
    for file in &files {
        let (lines, test_mods) = non_test_lines(&read(file));
        let dir = module_dir(file);
        for m in test_mods {
            test_files.insert(dir.join(format!("{m}.rs")));
            test_files.insert(dir.join(&m).join("mod.rs"));
            test_files.insert(dir.join(&m));
        }
        out.push((file.clone(), lines));
    }
    out.retain(|(file, _)| !test_files.iter().any(|t| file.starts_with(t)));
    out
}

/// Where the submodules of the module in `file` live.
fn module_dir(file: &Path) -> PathBuf {
    let parent = file.parent().map(Path::to_path_buf).unwrap_or_default();
    match file.file_name().and_then(|f| f.to_str()) {
        Some("lib.rs" | "main.rs" | "mod.rs") => parent,
        _ => parent.join(file.file_stem().unwrap_or_default()),
    }
}

/// The line (from 1) of dependency `name` in a manifest: the first line
/// naming it after a `dependencies` table header, so a dev-dependency of the
/// same name is not mistaken for it.
fn dependency_line(manifest: &str, name: &str) -> usize {
    let mut in_dependencies = false;
    for (i, line) in manifest.lines().enumerate() {
        let line = line.trim();
        if line.starts_with('[') {
            in_dependencies =
                line.trim_end_matches(']').ends_with(".dependencies") || line == "[dependencies]";
        } else if in_dependencies
            && line
                .strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '=', '.']))
        {
            return i + 1;
        }
    }
    0
}

#[test]
fn policy_depends_on_neither_tokio_nor_tonic() {
    let path = Path::new("crates/policy/Cargo.toml");
    let text = read(path);
    let package = manifest(path);
    let mut tables: Vec<&toml::Table> = Vec::new();
    if let Some(t) = package.get("dependencies").and_then(toml::Value::as_table) {
        tables.push(t);
    }
    // Platform-specific dependencies count too.
    if let Some(targets) = package.get("target").and_then(toml::Value::as_table) {
        for t in targets.values() {
            if let Some(d) = t.get("dependencies").and_then(toml::Value::as_table) {
                tables.push(d);
            }
        }
    }
    let mut violations = Vec::new();
    for table in tables {
        for name in table.keys() {
            if name.starts_with("tokio") || name.starts_with("tonic") {
                let line = dependency_line(&text, name);
                violations.push(Violation {
                    file: path.to_path_buf(),
                    line,
                    what: format!(
                        "`policy` depends on `{name}`; it stays free of async runtimes and RPC"
                    ),
                });
            }
        }
    }
    report("policy depends on neither tokio nor tonic", &violations);
}

#[test]
fn policy_reads_no_clock() {
    let mut violations = Vec::new();
    for (file, lines) in non_test_sources(Path::new("crates/policy/src")) {
        for (n, line) in lines {
            for pattern in ["::now(", ".elapsed("] {
                if line.contains(pattern) {
                    violations.push(Violation {
                        file: file.clone(),
                        line: n,
                        what: format!(
                            "`{pattern}` reads a clock in `policy`; take the time as an argument"
                        ),
                    });
                }
            }
        }
    }
    report("policy reads no clock outside tests", &violations);
}

/// Places where a panic is proven impossible and no rewrite reads better:
/// (file, the trimmed line, why). Keep it tiny.
const UNWRAP_ALLOWED: &[(&str, &str, &str)] = &[];

#[test]
fn no_unwrap_or_expect_outside_tests() {
    let mut violations = Vec::new();
    for member in members().into_iter().filter(|m| m.shipped) {
        for (file, lines) in non_test_sources(&member.dir.join("src")) {
            for (n, line) in lines {
                for pattern in [".unwrap()", ".expect("] {
                    if !line.contains(pattern) {
                        continue;
                    }
                    let allowed = UNWRAP_ALLOWED
                        .iter()
                        .any(|(f, l, _)| file == Path::new(f) && line.trim() == *l);
                    if !allowed {
                        violations.push(Violation {
                            file: file.clone(),
                            line: n,
                            what: format!("`{pattern}` outside tests: handle the error or make the case impossible by type"),
                        });
                    }
                }
            }
        }
    }
    report("no unwrap/expect outside tests", &violations);
}

/// Is `line` (trimmed, a `//` comment removed) a field of a message?
fn is_field(line: &str) -> bool {
    let Some((decl, number)) = line.split_once('=') else {
        return false;
    };
    let number = number.trim().trim_end_matches(';');
    let number = number.split('[').next().unwrap_or_default().trim();
    if number.parse::<u64>().is_err() {
        return false;
    }
    let words: Vec<&str> = decl.split_whitespace().collect();
    // `reserved 3;` and `option …` are not fields; `TYPE name`,
    // `repeated TYPE name` and enum values `NAME` are.
    !words.is_empty() && !matches!(words[0], "reserved" | "option")
}

#[test]
fn every_proto_message_and_field_is_documented() {
    let dir = Path::new("proto/reach/v1");
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("tidy: reading {}: {e}", dir.display()))
        .flatten()
        .map(|e| dir.join(e.file_name()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    let mut violations = Vec::new();
    for file in files {
        let text = read(&file);
        let mut previous = "";
        for (n, raw) in text.lines().enumerate() {
            let trimmed = raw.trim();
            let (code, trailing) = match trimmed.split_once("//") {
                Some((code, _)) => (code.trim(), true),
                None => (trimmed, false),
            };
            let what = if code.starts_with("message ") {
                Some("message")
            } else if code.starts_with("enum ") {
                Some("enum")
            } else if is_field(code) {
                Some("field or enum value")
            } else {
                None
            };
            if let Some(what) = what
                && !trailing
                && !previous.starts_with("//")
            {
                violations.push(Violation {
                    file: file.clone(),
                    line: n + 1,
                    what: format!("{what} `{code}` has no comment"),
                });
            }
            previous = trimmed;
        }
    }
    report("every proto message and field has a comment", &violations);
}

/// The top-level modules of a crate: `mod x;` in `src/lib.rs` or
/// `src/main.rs`, and every file or directory directly under `src/` (but
/// `lib.rs`, `main.rs` and `bin/`).
fn top_level_modules(src: &Path) -> BTreeSet<String> {
    let mut modules = BTreeSet::new();
    for root_file in ["lib.rs", "main.rs"] {
        let path = src.join(root_file);
        if root().join(&path).is_file() {
            for line in code_lines(&read(&path)) {
                if let Some(name) = declared_mod(line.trim()) {
                    modules.insert(name);
                }
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(root().join(src)) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if is_dir && name != "bin" {
                modules.insert(name);
            } else if let Some(stem) = name.strip_suffix(".rs")
                && !matches!(stem, "lib" | "main")
            {
                modules.insert(stem.to_owned());
            }
        }
    }
    modules
}

/// Does a backticked span of `section` contain `word` as a whole word?
fn names_in_code(section: &str, word: &str) -> bool {
    section.split('`').skip(1).step_by(2).any(|span| {
        span.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == word)
    })
}

#[test]
fn architecture_code_map_names_every_crate_and_module() {
    let path = Path::new("ARCHITECTURE.md");
    let text = read(path);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim() == "## Code map")
        .unwrap_or_else(|| panic!("tidy: {}: no `## Code map` section", path.display()));
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("## "))
        .map_or(lines.len(), |i| start + 1 + i);
    let mut violations = Vec::new();
    for member in members() {
        let dir = member.dir.to_string_lossy().replace('\\', "/");
        let heading = format!("### `{dir}`");
        let Some(at) = (start..end).find(|i| lines[*i].trim() == heading) else {
            violations.push(Violation {
                file: path.to_path_buf(),
                line: start + 1,
                what: format!("the code map has no `{heading}` section for workspace member {dir}"),
            });
            continue;
        };
        let stop = (at + 1..end)
            .find(|i| lines[*i].starts_with("### "))
            .unwrap_or(end);
        let section = lines[at + 1..stop].join("\n");
        for module in top_level_modules(&member.dir.join("src")) {
            if !names_in_code(&section, &module) {
                violations.push(Violation {
                    file: path.to_path_buf(),
                    line: at + 1,
                    what: format!(
                        "the `{dir}` section does not name module `{module}` (in backticks) of {dir}/src"
                    ),
                });
            }
        }
    }
    report(
        "ARCHITECTURE.md's code map names every crate and module",
        &violations,
    );
}
