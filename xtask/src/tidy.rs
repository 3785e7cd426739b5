//! Tidy checks: the architecture's written invariants, checked on every
//! `cargo test` (and so by `cargo xtask ci`), in the spirit of
//! rust-analyzer's `xtask/src/tidy.rs`. Each failure names the file and line
//! that breaks the rule. Every rule is a function over file texts, so each
//! has a self-test that plants a violation and a clean input.
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
//! - No import circle inside any crate (`graph`).
//! - Every import points down the floors a crate's code-map section lists
//!   (`layers`).
//! - No function over 80 lines in a shipped crate, but the data tables
//!   named with a reason (`length`).
//! - Only the central-authority modules ARCHITECTURE.md lists take locks;
//!   its gRPC statuses are made in one file; hand-written codecs only in
//!   `protocol`; host syntax only in `policy` (`invariants`).
//! - The central-authority's `Authority` is implemented only in
//!   `state/authority.rs`; features are functions of their own modules
//!   (`composition`).
//!
//! Test code is what `#[cfg(test)]` or `#[cfg(all(test, …))]` marks (the
//! item after the attribute: an inline module, a function, an impl, or a
//! `mod x;` whose file is then skipped whole). Comments and string literals
//! are never searched. A directory or file that cannot be read fails the
//! check naming it.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::root;

mod composition;
mod docs;
mod graph;
mod invariants;
mod layers;
mod length;

/// A broken rule at `file:line` (line 0: the file or directory as a whole).
struct Violation {
    file: PathBuf,
    line: usize,
    what: String,
}

impl Violation {
    /// `file:line: what` (`file: what` for line 0), as a failure lists it.
    fn line(&self) -> String {
        if self.line == 0 {
            format!("{}: {}", self.file.display(), self.what)
        } else {
            format!("{}:{}: {}", self.file.display(), self.line, self.what)
        }
    }
}

/// Fails the test with every violation, one per line.
fn report(rule: &str, violations: &[Violation]) {
    if violations.is_empty() {
        return;
    }
    let mut text = format!("tidy: {rule}: {} violation(s)\n", violations.len());
    for v in violations {
        let _ = writeln!(text, "  {}", v.line());
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
    /// The package name, as a Rust path segment (`-` → `_`).
    name: String,
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
            let package = package
                .get("package")
                .unwrap_or_else(|| panic!("tidy: {}: no [package]", dir.display()));
            let publish = package.get("publish").and_then(toml::Value::as_bool);
            let name = package
                .get("name")
                .and_then(toml::Value::as_str)
                .unwrap_or_else(|| panic!("tidy: {}: no package name", dir.display()))
                .replace('-', "_");
            Member {
                dir,
                name,
                shipped: publish != Some(false),
            }
        })
        .collect()
}

/// Every `.rs` file below `dir` (relative to the root, or absolute), sorted.
/// A directory or entry that cannot be read fails the check naming it: a
/// rule must never pass because it saw less than the whole tree.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(root().join(&d))
            .unwrap_or_else(|e| panic!("tidy: reading directory {}: {e}", d.display()));
        for e in entries {
            let e = e.unwrap_or_else(|e| panic!("tidy: reading directory {}: {e}", d.display()));
            let path = d.join(e.file_name());
            let kind = e
                .file_type()
                .unwrap_or_else(|e| panic!("tidy: reading {}: {e}", path.display()));
            if kind.is_dir() {
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

/// One source file as the rules see it: its code outside tests (comments
/// and literals blanked, see `code_lines`), numbered from 1, and its raw
/// lines (for the few patterns that look inside a literal).
#[derive(Debug)]
struct Source {
    path: PathBuf,
    code: Vec<(usize, String)>,
    raw: Vec<String>,
}

impl Source {
    /// Raw line `n` (from 1).
    fn raw_line(&self, n: usize) -> &str {
        self.raw.get(n - 1).map_or("", String::as_str)
    }
}

/// The non-test code of a crate's files, given as (path, text): the test
/// items are blanked out of each file, and the files of test-only modules
/// (`#[cfg(test)] mod x;`) are left out.
fn non_test(files: Vec<(PathBuf, String)>) -> Vec<Source> {
    let mut test_files = BTreeSet::new();
    let mut out = Vec::new();
    for (path, text) in files {
        let (code, test_mods) = non_test_lines(&text);
        let dir = module_dir(&path);
        for m in test_mods {
            test_files.insert(dir.join(format!("{m}.rs")));
            test_files.insert(dir.join(&m).join("mod.rs"));
            test_files.insert(dir.join(&m));
        }
        let raw = text.lines().map(str::to_owned).collect();
        out.push(Source { path, code, raw });
    }
    out.retain(|s| !test_files.iter().any(|t| s.path.starts_with(t)));
    out
}

/// The non-test code of every `.rs` file under `src` (see `non_test`).
fn non_test_sources(src: &Path) -> Vec<Source> {
    non_test(
        rust_files(src)
            .into_iter()
            .map(|f| {
                let text = read(&f);
                (f, text)
            })
            .collect(),
    )
}

/// Planted sources for the rules' self-tests: (path, text) pairs.
fn planted(files: &[(&str, &str)]) -> Vec<Source> {
    non_test(
        files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), (*t).to_owned()))
            .collect(),
    )
}

/// Where the submodules of the module in `file` live.
fn module_dir(file: &Path) -> PathBuf {
    let parent = file.parent().map(Path::to_path_buf).unwrap_or_default();
    match file.file_name().and_then(|f| f.to_str()) {
        Some("lib.rs" | "main.rs" | "mod.rs") => parent,
        _ => parent.join(file.file_stem().unwrap_or_default()),
    }
}

/// A module's path inside its crate (`[]` is the crate root).
type ModulePath = Vec<String>;

/// Where a file under a crate's `src/` sits: the crate root it belongs to
/// (`""` for `lib.rs`/`main.rs`, `bin/x` for a binary under `src/bin`) and
/// its module path (`foo.rs` and `foo/mod.rs` are `foo`).
fn locate(rel: &Path) -> (String, ModulePath) {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.last_mut()
        && let Some(stem) = last.strip_suffix(".rs")
    {
        *last = stem.to_owned();
    }
    let mut crate_root = String::new();
    if parts.len() >= 2 && parts[0] == "bin" {
        crate_root = format!("bin/{}", parts[1]);
        parts.drain(..2);
        if parts == ["main"] {
            parts.clear();
        }
    }
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if crate_root.is_empty() && (parts == ["lib"] || parts == ["main"]) {
        parts.clear();
    }
    (crate_root, parts)
}

/// `a::b` (or `<root>` for the crate root).
fn module_name(m: &[String]) -> String {
    if m.is_empty() {
        "<root>".to_owned()
    } else {
        m.join("::")
    }
}

/// A `use` declaration: whether it is public (`pub`, `pub(crate)`, …), the
/// line it starts on, and the paths it imports, a group `a::{b, c::d}`
/// expanded into `a::b` and `a::c::d`.
struct Use {
    public: bool,
    line: usize,
    paths: Vec<UsePath>,
}

/// One imported path and its `as` name.
struct UsePath {
    segments: Vec<String>,
    alias: Option<String>,
}

impl UsePath {
    /// The name the import binds in the file.
    fn bound_name(&self) -> Option<&str> {
        self.alias
            .as_deref()
            .or_else(|| self.segments.last().map(String::as_str))
    }
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// A file's code lines joined with `\n`, and where each line starts (byte
/// offset, line number), to map an offset back to its line.
fn joined(code: &[(usize, String)]) -> (String, Vec<(usize, usize)>) {
    let mut text = String::new();
    let mut starts = Vec::new();
    for (n, line) in code {
        starts.push((text.len(), *n));
        text.push_str(line);
        text.push('\n');
    }
    (text, starts)
}

/// The line number of byte `offset` of a `joined` text.
fn line_at(starts: &[(usize, usize)], offset: usize) -> usize {
    let i = starts.partition_point(|(o, _)| *o <= offset);
    i.checked_sub(1).map_or(0, |i| starts[i].1)
}

/// Every `use` declaration in a file's code.
fn uses(code: &[(usize, String)]) -> Vec<Use> {
    let (text, starts) = joined(code);
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find("use") {
        let i = from + at;
        from = i + 3;
        let starts_word = !text[..i].ends_with(is_ident_char);
        let ends_word = text[i + 3..].starts_with(char::is_whitespace);
        if !(starts_word && ends_word) {
            continue;
        }
        let Some(end) = text[i..].find(';') else {
            break;
        };
        out.push(Use {
            public: is_pub_before(&text[..i]),
            line: line_at(&starts, i),
            paths: expand_use(&[], &text[i + 3..i + end]),
        });
        from = i + end + 1;
    }
    out
}

/// Whether the text before a `use` ends with a visibility (`pub`,
/// `pub(crate)`, `pub(super)`, …).
fn is_pub_before(before: &str) -> bool {
    let mut b = before.trim_end();
    if b.ends_with(')')
        && let Some(open) = b.rfind('(')
    {
        b = b[..open].trim_end();
    }
    b.strip_suffix("pub")
        .is_some_and(|rest| !rest.ends_with(is_ident_char))
}

/// The paths of a `use` body below `prefix`: `a::{b, c::{d, e}} ` gives
/// `a::b`, `a::c::d`, `a::c::e`.
fn expand_use(prefix: &[String], body: &str) -> Vec<UsePath> {
    let mut items = Vec::new();
    let mut depth = 0;
    let mut current = String::new();
    for c in body.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            items.push(std::mem::take(&mut current));
        } else {
            current.push(c);
        }
    }
    items.push(current);
    let segments = |p: &str| -> Vec<String> {
        p.split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let mut out = Vec::new();
    for item in &items {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let group = if let Some(inner) = item.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
            Some(("", inner))
        } else {
            item.split_once("::{")
                .and_then(|(head, rest)| Some((head, rest.strip_suffix('}')?)))
        };
        let mut path = prefix.to_vec();
        if let Some((head, inner)) = group {
            path.extend(segments(head));
            out.extend(expand_use(&path, inner));
        } else {
            let words: Vec<&str> = item.split_whitespace().collect();
            let (p, alias) = match words.as_slice() {
                [p, "as", alias] => ((*p).to_owned(), Some((*alias).to_owned())),
                _ => (words.concat(), None),
            };
            path.extend(segments(&p));
            out.push(UsePath {
                segments: path,
                alias,
            });
        }
    }
    out
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

/// The `tokio*`/`tonic*` dependencies of a manifest (`path`, `text`),
/// platform-specific ones included; dev-dependencies are free.
fn async_dependencies(path: &Path, text: &str) -> Vec<Violation> {
    let package: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("tidy: parsing {}: {e}", path.display()));
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
                violations.push(Violation {
                    file: path.to_path_buf(),
                    line: dependency_line(text, name),
                    what: format!(
                        "`policy` depends on `{name}`; it stays free of async runtimes and RPC"
                    ),
                });
            }
        }
    }
    violations
}

#[test]
fn policy_depends_on_neither_tokio_nor_tonic() {
    let path = Path::new("crates/policy/Cargo.toml");
    report(
        "policy depends on neither tokio nor tonic",
        &async_dependencies(path, &read(path)),
    );
}

#[test]
fn dependency_rule_finds_planted_dependencies() {
    let text = "[package]\nname = \"policy\"\n\n[dependencies]\nrand = \"0.10\"\ntokio.workspace = true\n\n[target.'cfg(unix)'.dependencies]\ntonic-health = \"0.14\"\n\n[dev-dependencies]\ntokio-test = \"0.4\"\n";
    let found = async_dependencies(Path::new("Cargo.toml"), text);
    let lines: Vec<(usize, &str)> = found.iter().map(|v| (v.line, v.what.as_str())).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0].0, 6, "{lines:?}");
    assert!(lines[1].1.contains("`tonic-health`"), "{lines:?}");
    let clean = "[package]\nname = \"policy\"\n\n[dependencies]\nrand = \"0.10\"\n\n[dev-dependencies]\ntokio = \"1\"\n";
    assert!(async_dependencies(Path::new("Cargo.toml"), clean).is_empty());
}

/// Every clock read (`::now(`, `.elapsed(`) in `sources`.
fn clock_reads(sources: &[Source]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for source in sources {
        for (n, line) in &source.code {
            for pattern in ["::now(", ".elapsed("] {
                if line.contains(pattern) {
                    violations.push(Violation {
                        file: source.path.clone(),
                        line: *n,
                        what: format!(
                            "`{pattern}` reads a clock in `policy`; take the time as an argument"
                        ),
                    });
                }
            }
        }
    }
    violations
}

#[test]
fn policy_reads_no_clock() {
    report(
        "policy reads no clock outside tests",
        &clock_reads(&non_test_sources(Path::new("crates/policy/src"))),
    );
}

#[test]
fn clock_rule_finds_a_planted_clock_read() {
    let fake = planted(&[
        (
            "src/a.rs",
            "//! a\nfn f() {\n    let t = Instant::now();\n    // Instant::now() in a comment\n    let s = \"x.elapsed()\";\n}\n#[cfg(test)]\nmod tests {\n    fn t() { Instant::now(); }\n}\n",
        ),
        (
            "src/b.rs",
            "//! b\nfn f(now: Instant) -> bool {\n    now > deadline\n}\n",
        ),
    ]);
    let found = clock_reads(&fake);
    assert_eq!(found.len(), 1);
    assert_eq!(
        (found[0].file.as_path(), found[0].line),
        (Path::new("src/a.rs"), 3)
    );
    assert!(clock_reads(&fake[1..]).is_empty());
}

/// Places where a panic is proven impossible and no rewrite reads better:
/// (file, the trimmed line, why). Keep it tiny.
const UNWRAP_ALLOWED: &[(&str, &str, &str)] = &[];

/// Every `.unwrap()` and `.expect(` in `sources`, but the allowed lines.
fn unwraps(sources: &[Source], allowed: &[(&str, &str, &str)]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for source in sources {
        for (n, line) in &source.code {
            for pattern in [".unwrap()", ".expect("] {
                if !line.contains(pattern) {
                    continue;
                }
                let allowed = allowed
                    .iter()
                    .any(|(f, l, _)| source.path == Path::new(f) && line.trim() == *l);
                if !allowed {
                    violations.push(Violation {
                        file: source.path.clone(),
                        line: *n,
                        what: format!("`{pattern}` outside tests: handle the error or make the case impossible by type"),
                    });
                }
            }
        }
    }
    violations
}

#[test]
fn no_unwrap_or_expect_outside_tests() {
    let mut violations = Vec::new();
    for member in members().into_iter().filter(|m| m.shipped) {
        violations.extend(unwraps(
            &non_test_sources(&member.dir.join("src")),
            UNWRAP_ALLOWED,
        ));
    }
    report("no unwrap/expect outside tests", &violations);
}

#[test]
fn unwrap_rule_finds_planted_unwraps() {
    let fake = planted(&[
        (
            "src/a.rs",
            "//! a\nfn f() {\n    let x = y.unwrap();\n    let z = w\n        .expect(\"z\");\n    let ok = v.unwrap_or(0);\n    let fine = proven.unwrap();\n}\n#[cfg(test)]\nmod tests {\n    fn t() { x.unwrap(); }\n}\n",
        ),
        (
            "src/b.rs",
            "//! b\nfn f() -> Option<u8> {\n    let s = \".unwrap()\";\n    y?.checked_add(1)\n}\n",
        ),
    ]);
    let allowed = [("src/a.rs", "let fine = proven.unwrap();", "proven")];
    let found = unwraps(&fake, &allowed);
    let lines: Vec<usize> = found.iter().map(|v| v.line).collect();
    assert_eq!(lines, [3, 5]);
    assert!(unwraps(&fake[1..], &[]).is_empty());
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

/// Every message, enum, field and enum value of a `.proto` file without a
/// comment on the line before or at the end of its own line.
fn undocumented_proto(path: &Path, text: &str) -> Vec<Violation> {
    let mut violations = Vec::new();
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
                file: path.to_path_buf(),
                line: n + 1,
                what: format!("{what} `{code}` has no comment"),
            });
        }
        previous = trimmed;
    }
    violations
}

#[test]
fn every_proto_message_and_field_is_documented() {
    let dir = Path::new("proto/reach/v1");
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("tidy: reading {}: {e}", dir.display()))
        .map(|e| {
            let e = e.unwrap_or_else(|e| panic!("tidy: reading {}: {e}", dir.display()));
            dir.join(e.file_name())
        })
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    files.sort();
    let mut violations = Vec::new();
    for file in files {
        violations.extend(undocumented_proto(&file, &read(&file)));
    }
    report("every proto message and field has a comment", &violations);
}

#[test]
fn proto_comment_rule_finds_planted_gaps() {
    let text = "syntax = \"proto3\";\n// Documented.\nmessage A {\n  // Documented.\n  string a = 1;\n  uint32 b = 2; // Documented at the end.\n  repeated string c = 3;\n  reserved 4;\n}\nmessage B {\n}\nenum E {\n  // Documented.\n  E_UNSPECIFIED = 0;\n  E_ONE = 1;\n}\n";
    let found = undocumented_proto(Path::new("x.proto"), text);
    let lines: Vec<usize> = found.iter().map(|v| v.line).collect();
    assert_eq!(lines, [7, 10, 12, 15]);
    let clean = "// A.\nmessage A {\n  // a.\n  string a = 1;\n}\n";
    assert!(undocumented_proto(Path::new("x.proto"), clean).is_empty());
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
    let entries = std::fs::read_dir(root().join(src))
        .unwrap_or_else(|e| panic!("tidy: reading directory {}: {e}", src.display()));
    for e in entries {
        let e = e.unwrap_or_else(|e| panic!("tidy: reading directory {}: {e}", src.display()));
        let name = e.file_name().to_string_lossy().into_owned();
        let is_dir = e
            .file_type()
            .unwrap_or_else(|e| panic!("tidy: reading {}/{name}: {e}", src.display()))
            .is_dir();
        if is_dir && name != "bin" {
            modules.insert(name);
        } else if let Some(stem) = name.strip_suffix(".rs")
            && !matches!(stem, "lib" | "main")
        {
            modules.insert(stem.to_owned());
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

/// The code-map rule over ARCHITECTURE.md's text (`path`, `text`) and the
/// workspace members, each as (directory, its top-level modules).
fn code_map_gaps(path: &Path, text: &str, crates: &[(String, BTreeSet<String>)]) -> Vec<Violation> {
    let lines: Vec<&str> = text.lines().collect();
    let Some(start) = lines.iter().position(|l| l.trim() == "## Code map") else {
        return vec![Violation {
            file: path.to_path_buf(),
            line: 0,
            what: "no `## Code map` section".to_owned(),
        }];
    };
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("## "))
        .map_or(lines.len(), |i| start + 1 + i);
    let mut violations = Vec::new();
    for (dir, modules) in crates {
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
        for module in modules {
            if !names_in_code(&section, module) {
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
    violations
}

#[test]
fn architecture_code_map_names_every_crate_and_module() {
    let path = Path::new("ARCHITECTURE.md");
    let crates: Vec<(String, BTreeSet<String>)> = members()
        .into_iter()
        .map(|m| {
            let dir = m.dir.to_string_lossy().replace('\\', "/");
            (dir, top_level_modules(&m.dir.join("src")))
        })
        .collect();
    report(
        "ARCHITECTURE.md's code map names every crate and module",
        &code_map_gaps(path, &read(path), &crates),
    );
}

#[test]
fn code_map_rule_finds_planted_gaps() {
    let text = "# A\n## Code map\n### `crates/a`\nHolds `one` and `two::x`.\n### `crates/b`\nNothing.\n## Later\n### `crates/c`\n";
    let modules = |names: &[&str]| {
        names
            .iter()
            .map(|n| (*n).to_owned())
            .collect::<BTreeSet<_>>()
    };
    let crates = [
        ("crates/a".to_owned(), modules(&["one", "two"])),
        ("crates/b".to_owned(), modules(&["three"])),
        ("crates/c".to_owned(), modules(&[])),
    ];
    let found = code_map_gaps(Path::new("A.md"), text, &crates);
    let whats: Vec<(usize, &str)> = found.iter().map(|v| (v.line, v.what.as_str())).collect();
    assert_eq!(whats.len(), 2, "{whats:?}");
    assert!(
        whats[0].1.contains("does not name module `three`"),
        "{whats:?}"
    );
    assert!(
        whats[1].1.contains("no `### `crates/c`` section"),
        "{whats:?}"
    );
    assert!(code_map_gaps(Path::new("A.md"), text, &crates[..1]).is_empty());
}

/// The message of a caught panic.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[test]
fn the_walk_fails_on_what_it_cannot_read() {
    let scratch = std::env::temp_dir().join(format!("tidy-walk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    // A directory that cannot be listed (here: is not there).
    let missing = scratch.join("missing");
    let err = std::panic::catch_unwind(|| rust_files(&missing))
        .expect_err("an unlistable directory must fail the walk");
    let text = panic_text(err.as_ref());
    assert!(
        text.contains("reading directory") && text.contains(&missing.display().to_string()),
        "{text}"
    );
    // A file that cannot be read as text.
    let src = scratch.join("src");
    std::fs::create_dir_all(&src).expect("scratch dir");
    std::fs::write(src.join("lib.rs"), "//! fine\n").expect("lib.rs");
    std::fs::write(src.join("bad.rs"), [0xff, 0xfe, 0x00]).expect("bad.rs");
    let err = std::panic::catch_unwind(|| non_test_sources(&src))
        .expect_err("an unreadable file must fail the walk");
    let text = panic_text(err.as_ref());
    assert!(
        text.contains(&src.join("bad.rs").display().to_string()),
        "{text}"
    );
    std::fs::remove_file(src.join("bad.rs")).expect("remove bad.rs");
    assert_eq!(non_test_sources(&src).len(), 1);
    let _ = std::fs::remove_dir_all(&scratch);
}

/// Packages `fuzz/Cargo.lock` locks at a version `Cargo.lock` does not
/// have. The fuzz workspace is resolved on its own (cargo-fuzz takes no
/// `--locked`), so without this check it drifts to newer releases than
/// the ones the suite tests (`cargo update -p NAME --precise VERSION` in
/// `fuzz/` brings one back).
fn fuzz_lock_drift(main: &str, fuzz: &str) -> Vec<Violation> {
    let versions = |text: &str| -> Vec<(String, String)> {
        let table: toml::Table = text
            .parse()
            .unwrap_or_else(|e| panic!("tidy: parsing a Cargo.lock: {e}"));
        table
            .get("package")
            .and_then(toml::Value::as_array)
            .map(|packages| {
                packages
                    .iter()
                    .filter_map(|p| {
                        Some((
                            p.get("name")?.as_str()?.to_owned(),
                            p.get("version")?.as_str()?.to_owned(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let main = versions(main);
    versions(fuzz)
        .into_iter()
        .filter(|(name, version)| {
            main.iter().any(|(n, _)| n == name)
                && !main.iter().any(|(n, v)| n == name && v == version)
        })
        .map(|(name, version)| Violation {
            file: PathBuf::from("fuzz/Cargo.lock"),
            line: 0,
            what: format!("{name} {version}: Cargo.lock has another version"),
        })
        .collect()
}

#[test]
fn the_fuzz_build_uses_the_versions_the_suite_tests() {
    let drift = fuzz_lock_drift(
        &read(Path::new("Cargo.lock")),
        &read(Path::new("fuzz/Cargo.lock")),
    );
    report("fuzz/Cargo.lock versions", &drift);
}

#[test]
fn fuzz_lock_rule_finds_a_planted_drift() {
    let main = "[[package]]\nname = \"url\"\nversion = \"2.5.8\"\n";
    let same = "[[package]]\nname = \"url\"\nversion = \"2.5.8\"\n\n[[package]]\nname = \"libfuzzer-sys\"\nversion = \"0.4.9\"\n";
    assert!(fuzz_lock_drift(main, same).is_empty());
    let newer = "[[package]]\nname = \"url\"\nversion = \"2.5.9\"\n";
    let found = fuzz_lock_drift(main, newer);
    assert_eq!(found.len(), 1);
    assert!(found[0].what.contains("url 2.5.9"), "{}", found[0].what);
}
