//! The central-authority's composition root composes and nothing else:
//! `Authority` has one `impl` block, in `state/authority.rs` (construction,
//! the accessors to its parts, the policy snapshot, the shared session
//! bookkeeping). A feature's behaviour is a function of its own module
//! taking `&Authority`, so a call names the room it goes to
//! (`access::decide::resolve_from(&a, …)`); an `impl Authority` (or an
//! `impl Trait for Authority`) anywhere else hangs that behaviour back on
//! the root, where a call no longer says where it lives.

use std::path::Path;

use super::{Source, Violation, is_ident_char, joined, line_at, non_test_sources, planted, report};

/// The central-authority's sources.
const CA_SRC: &str = "crates/central-authority/src";

/// The one file that may hold an `impl` of `Authority`. Change it here when
/// the file moves.
const COMPOSITION_ROOT: &str = "crates/central-authority/src/state/authority.rs";

/// The type the rule guards.
const ROOT_TYPE: &str = "Authority";

/// Every `impl` block of `ROOT_TYPE` outside `root_file` (and `root_file`
/// itself if it is not among `sources`).
fn impls_outside_root(root_file: &Path, sources: &[Source]) -> Vec<Violation> {
    let mut out = Vec::new();
    if !sources.iter().any(|s| s.path == root_file) {
        out.push(Violation {
            file: root_file.to_path_buf(),
            line: 0,
            what: "COMPOSITION_ROOT names no source file: point it at the file that defines `Authority`".to_owned(),
        });
    }
    for source in sources.iter().filter(|s| s.path != root_file) {
        let (text, starts) = joined(&source.code);
        for at in impl_offsets(&text) {
            if implements_root(&text[at + 4..]) {
                out.push(Violation {
                    file: source.path.clone(),
                    line: line_at(&starts, at),
                    what: format!(
                        "`impl {ROOT_TYPE}` outside {}: make the behaviour a function of this module taking `&{ROOT_TYPE}`",
                        root_file.display()
                    ),
                });
            }
        }
    }
    out
}

/// Where the word `impl` starts an item in `text`.
fn impl_offsets(text: &str) -> Vec<usize> {
    text.match_indices("impl")
        .map(|(i, _)| i)
        .filter(|&i| {
            let before = text[..i].trim_end_matches([' ', '\t']);
            let starts_item = before.is_empty()
                || before.ends_with(['\n', '}', ';', '{', ']'])
                || before.ends_with("unsafe");
            let ends_word = text[i + 4..].starts_with([' ', '<', '\n']);
            starts_item && ends_word && !text[..i].ends_with(is_ident_char)
        })
        .collect()
}

/// Whether the impl header that `rest` starts (after `impl`) is of
/// `ROOT_TYPE`: its self type (after `for` in a trait impl) is `ROOT_TYPE`
/// by any path.
fn implements_root(rest: &str) -> bool {
    let header = rest.split(['{', ';']).next().unwrap_or("");
    let header = header.split_whitespace().collect::<Vec<_>>().join(" ");
    let header = header.split(" where").next().unwrap_or(&header);
    let header = skip_generics(header).trim();
    let self_type = header
        .rsplit_once(" for ")
        .map_or(header, |(_, t)| t)
        .trim();
    self_type.rsplit("::").next() == Some(ROOT_TYPE)
}

/// `header` without a leading `<…>` (the impl's own generics).
fn skip_generics(header: &str) -> &str {
    if !header.starts_with('<') {
        return header;
    }
    let mut depth = 0;
    for (i, c) in header.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return &header[i + 1..];
        }
    }
    ""
}

#[test]
fn only_the_composition_root_implements_authority() {
    let violations = impls_outside_root(
        Path::new(COMPOSITION_ROOT),
        &non_test_sources(Path::new(CA_SRC)),
    );
    report(
        "`Authority` is implemented only in its composition root",
        &violations,
    );
}

#[test]
fn composition_rule_finds_planted_impls() {
    let root = (
        "src/state/authority.rs",
        "//! root\npub struct Authority;\nimpl Authority {\n    pub fn store(&self) {}\n}\n",
    );
    let clean = (
        "src/api/views.rs",
        "//! clean: functions, a look-alike type, an impl in a comment and in tests\n// impl Authority {}\npub fn rows(a: &Authority) {}\nstruct AuthorityView;\nimpl AuthorityView {}\nimpl From<Authority> for Views {}\nconst S: &str = \"impl Authority {\";\n#[cfg(test)]\nmod tests {\n    impl Authority {}\n}\n",
    );
    let fake = planted(&[
        root,
        (
            "src/access/decide.rs",
            "//! a feature\nuse crate::state::authority::Authority;\nimpl Authority {\n    pub fn resolve(&self) {}\n}\n",
        ),
        (
            "src/trust/enroll.rs",
            "//! a trait on the root, by path\nimpl<'a> Enrollment for crate::state::authority::Authority\nwhere\n    'a: 'static,\n{\n}\n",
        ),
        clean,
    ]);
    let found = impls_outside_root(Path::new("src/state/authority.rs"), &fake);
    let whats: Vec<String> = found.iter().map(Violation::line).collect();
    assert_eq!(whats.len(), 2, "{whats:#?}");
    assert!(
        whats[0]
            .starts_with("src/access/decide.rs:3: `impl Authority` outside src/state/authority.rs"),
        "{whats:#?}"
    );
    assert!(
        whats[1].starts_with("src/trust/enroll.rs:2: "),
        "{whats:#?}"
    );
    let passes = impls_outside_root(
        Path::new("src/state/authority.rs"),
        &planted(&[root, clean]),
    );
    let passes: Vec<String> = passes.iter().map(Violation::line).collect();
    assert!(passes.is_empty(), "{passes:#?}");
    let moved = impls_outside_root(Path::new("src/state/root.rs"), &planted(&[root]));
    assert_eq!(moved.len(), 2, "the root's own impl and the missing file");
}
