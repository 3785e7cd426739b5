//! Rules for the Architecture Invariants ARCHITECTURE.md states, each a
//! function over file texts (so its self-test can plant a violation):
//! - lock owners: only the central-authority modules ARCHITECTURE.md lists
//!   take locks, and each of them does;
//! - the central-authority's gRPC statuses are made in one file;
//! - hand-written gRPC codecs and protobuf encoding live only in `protocol`;
//! - host syntax is parsed and normalised only in `policy`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::{
    Source, Violation, is_ident_char, locate, members, module_name, non_test_sources, planted,
    read, report, uses,
};

/// The central-authority's sources.
const CA_SRC: &str = "crates/central-authority/src";

/// The one file of the central-authority where errors become gRPC
/// statuses (the `From<…> for tonic::Status` impls). Change it here when
/// the file moves.
const STATUS_MAPPING_FILE: &str = "crates/central-authority/src/error.rs";

/// The start of the line in ARCHITECTURE.md's central-authority section
/// that lists, in backticks, every module that takes a lock.
const LOCK_OWNERS_MARKER: &str = "**Architecture Invariant:** only these modules take locks:";

/// The module path's last segment of the CA's lock helpers (`sync::lock`,
/// `read`, `write`: poison-tolerant wrappers): the helpers lock on their
/// callers' behalf, so the module itself is no owner.
const LOCK_HELPERS: &str = "sync";

/// The crate where codecs and protobuf encoding by hand belong.
const CODEC_HOME: &str = "crates/protocol";

/// Legitimate uses of the host-syntax patterns in shipped crates other
/// than `policy`: (file, a fragment of the raw line, why it is not host
/// syntax). Each entry must still match a line.
const HOST_SYNTAX_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "crates/protocol/src/fuzzing.rs",
        "s.parse::<std::net::Ipv4Addr>()",
        "the `wire_policy` fuzz target's oracle: std's parse, checked against policy's",
    ),
    (
        "crates/protocol/src/fuzzing.rs",
        "s.parse::<std::net::IpAddr>()",
        "the `wire_policy` fuzz target's oracle: std's parse, checked against policy's",
    ),
    (
        "crates/protocol/src/convert.rs",
        "let address: IpAddr = r.address.parse()",
        "a probe result's resolved address: an IP address from the wire, not a host, checked where all wire input is",
    ),
    (
        "crates/central-authority/src/credentials/auth.rs",
        "scheme.eq_ignore_ascii_case(\"bearer\")",
        "the HTTP authentication scheme",
    ),
    (
        "crates/central-authority/src/api/metrics.rs",
        "let accept = accept.to_ascii_lowercase();",
        "the Accept header's media types",
    ),
    (
        "crates/connector-agent/src/metrics.rs",
        ".to_ascii_lowercase();",
        "the Accept header's media types",
    ),
    (
        "crates/central-authority/src/api/guard.rs",
        "String::from_utf8_lossy(site.as_bytes()).to_ascii_lowercase()",
        "the Sec-Fetch-Site header's value",
    ),
    (
        "crates/central-authority/src/api/guard.rs",
        "eq_ignore_ascii_case(\"application/json\")",
        "the Content-Type header",
    ),
    (
        "crates/central-authority/src/api/guard.rs",
        "scheme.to_ascii_lowercase()",
        "an Origin header's URL scheme",
    ),
    (
        "crates/central-authority/src/config/secrets.rs",
        "let lower = value.expose().to_lowercase();",
        "a token or key matched against the shipped placeholders (`change-me`), no host",
    ),
    (
        "crates/central-authority/src/api/listing.rs",
        "q: given(&raw.q).map(str::to_lowercase)",
        "the listing's search text, matched as a substring, never parsed as a host",
    ),
    (
        "crates/central-authority/src/api/listing.rs",
        "a.to_ascii_lowercase() == *b",
        "case-insensitive substring search in host names: text search, no host syntax",
    ),
    (
        "crates/central-authority/src/api/listing.rs",
        "host.to_lowercase().contains(needle)",
        "case-insensitive substring search in host names: text search, no host syntax",
    ),
    (
        "crates/central-authority/src/api/listing.rs",
        "p.to_ascii_lowercase().cmp(&q.to_ascii_lowercase())",
        "natural sort order of names, byte by byte",
    ),
];

// ---------------------------------------------------------------- locks

/// The first line where a file takes a lock: `.lock()`, `.read()`,
/// `.write()` (and their `try_` forms) on a lock, or a call of the lock
/// helpers (`sync::lock(…)`, or `lock(…)` imported from a `sync` module).
/// Locking stdin/stdout/stderr does not count.
fn first_lock(source: &Source) -> Option<usize> {
    let helpers: BTreeSet<String> = uses(&source.code)
        .iter()
        .flat_map(|u| &u.paths)
        .filter(|p| {
            let s = &p.segments;
            s.len() >= 2
                && s[s.len() - 2] == LOCK_HELPERS
                && matches!(s[0].as_str(), "crate" | "super" | "self")
                && matches!(s[s.len() - 1].as_str(), "lock" | "read" | "write")
        })
        .filter_map(|p| p.bound_name().map(str::to_owned))
        .collect();
    for (n, line) in &source.code {
        for method in [
            ".lock()",
            ".read()",
            ".write()",
            ".try_lock()",
            ".try_read()",
            ".try_write()",
        ] {
            let stdio = ["stdin()", "stdout()", "stderr()"];
            if line
                .match_indices(method)
                .any(|(i, _)| !stdio.iter().any(|s| line[..i].ends_with(s)))
            {
                return Some(*n);
            }
        }
        for helper in ["lock", "read", "write"] {
            if line.contains(&format!("{LOCK_HELPERS}::{helper}(")) {
                return Some(*n);
            }
        }
        for helper in &helpers {
            let call = format!("{helper}(");
            let called = line.match_indices(&call).any(|(i, _)| {
                let before = &line[..i];
                !before.ends_with(|c: char| is_ident_char(c) || c == '.' || c == ':')
                    && !before.trim_end().ends_with("fn")
            });
            if called {
                return Some(*n);
            }
        }
    }
    None
}

/// The lines of ARCHITECTURE.md's `### \`dir\`` section: (first line
/// number, lines).
fn section<'a>(text: &'a str, dir: &str) -> Option<(usize, Vec<&'a str>)> {
    let lines: Vec<&str> = text.lines().collect();
    let heading = format!("### `{dir}`");
    let start = lines.iter().position(|l| l.trim() == heading)?;
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("## ") || l.starts_with("### "))
        .map_or(lines.len(), |i| start + 1 + i);
    Some((start + 1, lines[start..end].to_vec()))
}

/// The backticked names listed right after `marker` (`a`, `b` and `c`),
/// the list possibly wrapped over several lines; and the marker's line.
fn listed_after(lines: &[&str], first: usize, marker: &str) -> Option<(usize, Vec<String>)> {
    let at = lines.iter().position(|l| l.contains(marker))?;
    let text = lines[at..].join(" ");
    let mut rest = &text[text.find(marker)? + marker.len()..];
    let mut names = Vec::new();
    loop {
        rest = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
        if let Some(r) = rest
            .strip_prefix("and ")
            .or_else(|| rest.strip_prefix("or "))
        {
            rest = r;
            continue;
        }
        let Some(open) = rest.strip_prefix('`') else {
            break;
        };
        let Some(close) = open.find('`') else {
            break;
        };
        let name = &open[..close];
        names.push(name.strip_prefix("crate::").unwrap_or(name).to_owned());
        rest = &open[close + 1..];
    }
    Some((first + at, names))
}

/// The lock-owner rule over ARCHITECTURE.md's text and the CA's sources.
fn lock_owner_violations(
    architecture: (&Path, &str),
    src: &Path,
    sources: &[Source],
) -> Vec<Violation> {
    let (arch_path, arch_text) = architecture;
    let mut lockers: Vec<(String, PathBuf, usize)> = Vec::new();
    let mut modules = BTreeSet::new();
    for source in sources {
        let Ok(rel) = source.path.strip_prefix(src) else {
            continue;
        };
        let module = module_name(&locate(rel).1);
        modules.insert(module.clone());
        if module.rsplit("::").next() == Some(LOCK_HELPERS) {
            continue;
        }
        if let Some(line) = first_lock(source) {
            lockers.push((module, source.path.clone(), line));
        }
    }
    let dir = src.parent().unwrap_or(src).to_string_lossy().into_owned();
    let listed = section(arch_text, &dir)
        .and_then(|(first, lines)| listed_after(&lines, first, LOCK_OWNERS_MARKER));
    let Some((marker_line, owners)) = listed else {
        let today: Vec<String> = lockers
            .iter()
            .map(|(m, f, l)| format!("`{m}` ({}:{l})", f.display()))
            .collect();
        return vec![Violation {
            file: arch_path.to_path_buf(),
            line: 0,
            what: format!(
                "the `{dir}` section has no line `{LOCK_OWNERS_MARKER} `a`, `b`, …`; the modules that lock today: {}",
                today.join(", ")
            ),
        }];
    };
    let mut out = Vec::new();
    for (module, file, line) in &lockers {
        if !owners.contains(module) {
            out.push(Violation {
                file: file.clone(),
                line: *line,
                what: format!(
                    "`{module}` takes a lock but is not among the lock owners {} lists (go through an owner's API, or name the module there)",
                    arch_path.display()
                ),
            });
        }
    }
    for owner in &owners {
        if !lockers.iter().any(|(m, _, _)| m == owner) {
            let why = if modules.contains(owner) {
                "takes no lock"
            } else {
                "is no module of the crate"
            };
            out.push(Violation {
                file: arch_path.to_path_buf(),
                line: marker_line,
                what: format!("lock owner `{owner}` {why}: drop it from the list"),
            });
        }
    }
    out
}

#[test]
fn only_the_listed_modules_take_locks() {
    let arch = Path::new("ARCHITECTURE.md");
    let src = Path::new(CA_SRC);
    let violations = lock_owner_violations((arch, &read(arch)), src, &non_test_sources(src));
    report(
        "only the lock owners ARCHITECTURE.md lists take locks",
        &violations,
    );
}

#[test]
fn lock_owner_rule_finds_planted_lockers() {
    let arch = "# A\n## Code map\n### `fake`\nText.\n\n**Architecture Invariant:** only these modules take locks: `state::table`, `gone`\nand `idle`; no lock is held across an `.await`.\n### `other`\n";
    let fake = planted(&[
        (
            "fake/src/lib.rs",
            "//! root\nmod sync;\nfn main() {\n    let _ = std::io::stdout().lock();\n}\n",
        ),
        (
            "fake/src/sync.rs",
            "//! helpers\npub fn lock<T>(m: &Mutex<T>) -> Guard<T> {\n    m.lock().unwrap()\n}\n",
        ),
        (
            "fake/src/state/table.rs",
            "//! owner\nuse crate::sync::{lock as take, read};\nfn f(&self) {\n    take(&self.m);\n}\n",
        ),
        (
            "fake/src/idle.rs",
            "//! listed, locks only in tests\nfn read(p: &Path) {}\nfn f() {\n    read(&p);\n}\n#[cfg(test)]\nmod tests {\n    fn t() {\n        m.lock();\n    }\n}\n",
        ),
        (
            "fake/src/sneaky.rs",
            "//! not listed\nfn f() {\n    let _g = crate::sync::write(&self.table);\n}\n",
        ),
        (
            "fake/src/rw.rs",
            "//! not listed\nfn f() {\n    let n = self.map.read().len();\n}\n",
        ),
    ]);
    let found = lock_owner_violations((Path::new("A.md"), arch), Path::new("fake/src"), &fake);
    let whats: Vec<String> = found.iter().map(Violation::line).collect();
    assert_eq!(whats.len(), 4, "{whats:#?}");
    assert!(
        whats[0].starts_with("fake/src/sneaky.rs:3: `sneaky` takes a lock"),
        "{whats:#?}"
    );
    assert!(
        whats[1].starts_with("fake/src/rw.rs:3: `rw` takes a lock"),
        "{whats:#?}"
    );
    assert!(
        whats[2].ends_with("lock owner `gone` is no module of the crate: drop it from the list"),
        "{whats:#?}"
    );
    assert!(
        whats[3].starts_with("A.md:6: lock owner `idle` takes no lock"),
        "{whats:#?}"
    );

    let missing = lock_owner_violations(
        (Path::new("A.md"), "### `fake`\nNo list.\n"),
        Path::new("fake/src"),
        &fake,
    );
    assert_eq!(missing.len(), 1);
    assert!(
        missing[0].what.contains("has no line"),
        "{}",
        missing[0].what
    );
    assert!(
        missing[0]
            .what
            .contains("`state::table` (fake/src/state/table.rs:4)"),
        "{}",
        missing[0].what
    );
}

#[test]
fn lock_owner_rule_passes_when_owners_match() {
    let arch = "### `fake`\n**Architecture Invariant:** only these modules take locks: `owner`.\n";
    let fake = planted(&[
        ("fake/src/lib.rs", "//! root\n"),
        (
            "fake/src/owner.rs",
            "//! owner\nfn f() {\n    self.m.lock();\n}\n",
        ),
        (
            "fake/src/user.rs",
            "//! user\nfn f() {\n    owner.get();\n    file.read(&mut buf);\n}\n",
        ),
    ]);
    let found = lock_owner_violations((Path::new("A.md"), arch), Path::new("fake/src"), &fake);
    assert!(
        found.is_empty(),
        "{:?}",
        found.iter().map(|v| &v.what).collect::<Vec<_>>()
    );
}

// ---------------------------------------------------------- gRPC status

/// `tonic::Status`'s constructors.
const STATUS_CONSTRUCTORS: &[&str] = &[
    "new",
    "with_details",
    "with_metadata",
    "with_details_and_metadata",
    "from_error",
    "ok",
    "cancelled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
];

/// Every `tonic::Status` constructed outside `mapping_file` (and the
/// mapping file itself if it is not among `sources`).
fn status_constructions(mapping_file: &Path, sources: &[Source]) -> Vec<Violation> {
    let mut out = Vec::new();
    if !sources.iter().any(|s| s.path == mapping_file) {
        out.push(Violation {
            file: mapping_file.to_path_buf(),
            line: 0,
            what: "STATUS_MAPPING_FILE names no source file: point it at the file that maps errors to statuses".to_owned(),
        });
    }
    for source in sources.iter().filter(|s| s.path != mapping_file) {
        // The names tonic's `Status` goes by in this file.
        let names: BTreeSet<String> = uses(&source.code)
            .iter()
            .flat_map(|u| &u.paths)
            .filter(|p| {
                p.segments
                    .ends_with(&["tonic".to_owned(), "Status".to_owned()])
            })
            .filter_map(|p| p.bound_name().map(str::to_owned))
            .collect();
        for (n, line) in &source.code {
            let made = STATUS_CONSTRUCTORS.iter().find(|ctor| {
                line.contains(&format!("tonic::Status::{ctor}("))
                    || names.iter().any(|name| {
                        line.match_indices(&format!("{name}::{ctor}("))
                            .any(|(i, _)| {
                                !line[..i].ends_with(|c: char| is_ident_char(c) || c == ':')
                            })
                    })
            });
            if let Some(ctor) = made {
                out.push(Violation {
                    file: source.path.clone(),
                    line: *n,
                    what: format!(
                        "`Status::{ctor}` outside {}: map the error there (a `From<…> for tonic::Status`), once",
                        mapping_file.display()
                    ),
                });
            }
        }
    }
    out
}

#[test]
fn grpc_statuses_are_made_in_one_file() {
    let src = Path::new(CA_SRC);
    let violations = status_constructions(Path::new(STATUS_MAPPING_FILE), &non_test_sources(src));
    report("the CA's gRPC statuses are made in one file", &violations);
}

#[test]
fn status_rule_finds_planted_constructions() {
    let fake = planted(&[
        (
            "src/error.rs",
            "//! maps\nimpl From<E> for tonic::Status {\n    fn from(e: E) -> Self {\n        tonic::Status::internal(e.to_string())\n    }\n}\n",
        ),
        (
            "src/a.rs",
            "//! a\nuse tonic::{Request, Status as GrpcStatus};\nfn f() -> GrpcStatus {\n    GrpcStatus::unavailable(\"x\")\n}\n",
        ),
        (
            "src/b.rs",
            "//! b\nfn f() {\n    Err(tonic::Status::new(Code::Internal, \"x\"))\n}\n",
        ),
        (
            "src/c.rs",
            "//! policy's Status, not tonic's\nuse policy::Status;\nfn f() {\n    Status::best(x);\n    Status::unknown();\n}\n#[cfg(test)]\nmod tests {\n    fn t() { tonic::Status::internal(\"ok in tests\"); }\n}\n",
        ),
    ]);
    let found = status_constructions(Path::new("src/error.rs"), &fake);
    let whats: Vec<String> = found.iter().map(Violation::line).collect();
    assert_eq!(whats.len(), 2, "{whats:#?}");
    assert!(
        whats[0].starts_with("src/a.rs:4: `Status::unavailable` outside src/error.rs"),
        "{whats:#?}"
    );
    assert!(
        whats[1].starts_with("src/b.rs:3: `Status::new`"),
        "{whats:#?}"
    );
    let clean = status_constructions(Path::new("src/error.rs"), &fake[..1]);
    assert!(clean.is_empty());
    let moved = status_constructions(Path::new("src/api/error.rs"), &fake[..1]);
    assert_eq!(moved.len(), 2);
    assert!(
        moved[0]
            .what
            .starts_with("STATUS_MAPPING_FILE names no source file")
    );
}

// ---------------------------------------------------------------- codecs

/// Every implementation of tonic's codec traits and every direct use of
/// `prost::encoding` in `sources`.
fn hand_written_codecs(sources: &[Source]) -> Vec<Violation> {
    let traits = ["Codec", "Encoder", "Decoder"];
    let mut out = Vec::new();
    for source in sources {
        let imported: BTreeSet<String> = uses(&source.code)
            .iter()
            .flat_map(|u| &u.paths)
            .filter(|p| {
                p.segments.len() == 3
                    && p.segments[..2] == ["tonic", "codec"]
                    && traits.contains(&p.segments[2].as_str())
            })
            .filter_map(|p| p.bound_name().map(str::to_owned))
            .collect();
        for (n, line) in &source.code {
            let what = if line.contains("prost::encoding") {
                Some("uses `prost::encoding` directly".to_owned())
            } else {
                let item = line.trim_start();
                let item = item.strip_prefix("unsafe ").unwrap_or(item);
                item.strip_prefix("impl")
                    .filter(|rest| rest.starts_with([' ', '<']))
                    .and_then(|rest| rest.split_once(" for "))
                    .and_then(|(head, _)| {
                        let head = head.trim();
                        let name = head
                            .rsplit(|c: char| !is_ident_char(c))
                            .find(|w| !w.is_empty())?;
                        let tonic = head.contains("tonic::codec::") && traits.contains(&name);
                        (tonic || imported.contains(name))
                            .then(|| format!("implements tonic's `{name}`"))
                    })
            };
            if let Some(what) = what {
                out.push(Violation {
                    file: source.path.clone(),
                    line: *n,
                    what: format!("{what}: hand-written codecs live in `protocol`"),
                });
            }
        }
    }
    out
}

#[test]
fn hand_written_codecs_only_in_protocol() {
    let mut violations = Vec::new();
    for member in members() {
        if member.dir == Path::new(CODEC_HOME) {
            continue;
        }
        violations.extend(hand_written_codecs(&non_test_sources(
            &member.dir.join("src"),
        )));
    }
    report("hand-written codecs only in protocol", &violations);
}

#[test]
fn codec_rule_finds_planted_codecs() {
    let fake = planted(&[
        (
            "src/a.rs",
            "//! a\nuse tonic::codec::{Codec, Decoder as D};\nimpl Codec for Raw {\n}\nimpl<T> D for Raw<T> {\n}\nimpl Decoder for Other {\n}\n",
        ),
        (
            "src/b.rs",
            "//! b\nfn f(out: &mut Vec<u8>) {\n    prost::encoding::encode_varint(1, out);\n}\nimpl tonic::codec::Encoder for E {\n}\n",
        ),
        (
            "src/c.rs",
            "//! clean\nimpl Display for Codec {\n}\n#[cfg(test)]\nmod tests {\n    use prost::encoding::encode_varint;\n}\n",
        ),
    ]);
    let found = hand_written_codecs(&fake);
    let whats: Vec<String> = found.iter().map(Violation::line).collect();
    assert_eq!(
        whats,
        [
            "src/a.rs:3: implements tonic's `Codec`: hand-written codecs live in `protocol`",
            "src/a.rs:5: implements tonic's `D`: hand-written codecs live in `protocol`",
            "src/b.rs:3: uses `prost::encoding` directly: hand-written codecs live in `protocol`",
            "src/b.rs:5: implements tonic's `Encoder`: hand-written codecs live in `protocol`",
        ]
    );
    assert!(hand_written_codecs(&fake[2..]).is_empty());
}

// ----------------------------------------------------------- host syntax

/// The IP types whose parsing is host syntax.
const IP_TYPES: &[&str] = &[
    "IpAddr", "Ipv4Addr", "Ipv6Addr", "IpNet", "Ipv4Net", "Ipv6Net",
];

/// Why a code line (and its raw text) looks like host syntax by hand.
fn host_syntax(code: &str, raw: &str) -> Option<&'static str> {
    let names_ip_type = code
        .split(|c: char| !is_ident_char(c))
        .any(|w| IP_TYPES.contains(&w));
    if names_ip_type && (code.contains("parse::<") || code.contains(".parse()")) {
        return Some("parses an IP address");
    }
    if names_ip_type && code.contains("::from_str(") {
        return Some("parses an IP address");
    }
    for case in [
        "to_ascii_lowercase",
        "to_lowercase",
        "make_ascii_lowercase",
        "eq_ignore_ascii_case",
    ] {
        if code.contains(case) {
            return Some("folds case");
        }
    }
    for dot in [
        "trim_end_matches('.')",
        "trim_end_matches(\".\")",
        "strip_suffix('.')",
        "strip_suffix(\".\")",
    ] {
        if raw.contains(dot) {
            return Some("strips a trailing dot");
        }
    }
    None
}

/// Every line of `sources` that looks like host syntax by hand, but the
/// `allowed` ones; and the entries of `allowed` (for files among
/// `sources`) that match no line.
fn host_syntax_by_hand(sources: &[Source], allowed: &[(&str, &str, &str)]) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut used = BTreeSet::new();
    for source in sources {
        for (n, code) in &source.code {
            let raw = source.raw_line(*n);
            let Some(why) = host_syntax(code, raw) else {
                continue;
            };
            let allowance = allowed
                .iter()
                .position(|(f, fragment, _)| source.path == Path::new(f) && raw.contains(fragment));
            if let Some(i) = allowance {
                used.insert(i);
                continue;
            }
            out.push(Violation {
                file: source.path.clone(),
                line: *n,
                what: format!(
                    "{why} (`{}`): host syntax belongs to `policy` (or, if this is no host, add it to HOST_SYNTAX_ALLOWED with the reason)",
                    raw.trim()
                ),
            });
        }
    }
    for (i, (file, fragment, _)) in allowed.iter().enumerate() {
        let ours = sources.iter().any(|s| s.path == Path::new(file));
        if !used.contains(&i) && ours {
            out.push(Violation {
                file: PathBuf::from(file),
                line: 0,
                what: format!("HOST_SYNTAX_ALLOWED entry `{fragment}` matches no line: drop it"),
            });
        }
    }
    out
}

#[test]
fn host_syntax_only_in_policy() {
    let mut sources = Vec::new();
    for member in members().into_iter().filter(|m| m.shipped) {
        if member.dir == Path::new("crates/policy") {
            continue;
        }
        sources.extend(non_test_sources(&member.dir.join("src")));
    }
    let mut violations = host_syntax_by_hand(&sources, HOST_SYNTAX_ALLOWED);
    // An entry whose file is gone is stale too.
    for (file, fragment, _) in HOST_SYNTAX_ALLOWED {
        if !sources.iter().any(|s| s.path == Path::new(file)) {
            violations.push(Violation {
                file: PathBuf::from(file),
                line: 0,
                what: format!("HOST_SYNTAX_ALLOWED entry `{fragment}`: no such file"),
            });
        }
    }
    report("host syntax only in policy", &violations);
}

#[test]
fn host_syntax_rule_finds_planted_parsing() {
    let fake = planted(&[
        (
            "crates/a/src/lib.rs",
            "//! a\nfn f(host: &str) {\n    let ip = host.parse::<IpAddr>().ok();\n    let h = host.trim_end_matches('.').to_ascii_lowercase();\n    let n: Ipv4Net = host.parse().unwrap();\n    let ok = scheme.eq_ignore_ascii_case(\"bearer\");\n}\n",
        ),
        (
            "crates/a/src/clean.rs",
            "//! nothing\nfn f(port: &str) {\n    let p = port.parse::<u16>();\n    let name = name.trim_end_matches('/');\n}\n#[cfg(test)]\nmod tests {\n    fn t() { \"a.\".trim_end_matches('.'); }\n}\n",
        ),
    ]);
    let allowed = [
        (
            "crates/a/src/lib.rs",
            "eq_ignore_ascii_case(\"bearer\")",
            "an auth scheme",
        ),
        ("crates/a/src/lib.rs", "never there", "stale"),
    ];
    let found = host_syntax_by_hand(&fake, &allowed);
    let whats: Vec<String> = found.iter().map(Violation::line).collect();
    assert_eq!(whats.len(), 4, "{whats:#?}");
    assert!(
        whats[0].starts_with("crates/a/src/lib.rs:3: parses an IP address"),
        "{whats:#?}"
    );
    assert!(
        whats[1].starts_with("crates/a/src/lib.rs:4: folds case"),
        "{whats:#?}"
    );
    assert!(
        whats[2].starts_with("crates/a/src/lib.rs:5: parses an IP address"),
        "{whats:#?}"
    );
    assert!(
        whats[3].contains("`never there` matches no line"),
        "{whats:#?}"
    );
    assert!(host_syntax_by_hand(&fake[1..], &[]).is_empty());
    // The trailing dot alone is found too.
    let dot = planted(&[("x.rs", "fn f() {\n    h.strip_suffix('.');\n}\n")]);
    assert_eq!(
        host_syntax_by_hand(&dot, &[])[0]
            .what
            .split(' ')
            .take(4)
            .collect::<Vec<_>>(),
        ["strips", "a", "trailing", "dot"]
    );
}
