//! Rule: no import circle inside any crate. The module graph of every
//! workspace member's `src/` is computed from its non-test code and must
//! have no cycle: features depend on the owners of state in one direction,
//! never back.
//!
//! Nodes are module files (`foo.rs` and `foo/mod.rs` are `foo`; `lib.rs`
//! and `main.rs` are the crate root; every `src/bin/x` is a root of its
//! own). An edge is a path in non-test code that starts with `crate::`,
//! `super::` or `self::` (anywhere), or with a child module's name (in a
//! `use`), groups `use a::{b, c::d}` expanded, resolved to the longest
//! prefix that is a module. Not edges: a `pub use` in the crate root (the
//! crate's public face), and a path from a module to itself or one of its
//! ancestors (the parent declares the child; the child may use what the
//! parent holds).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{
    ModulePath, Source, Violation, is_ident_char, locate, members, module_name, non_test_sources,
    planted, report, uses,
};

/// Where an edge was first seen.
type Place = (PathBuf, usize);

/// One crate root's module graph: every module, and its edges with the
/// first place each is written.
#[derive(Default)]
struct Graph {
    edges: BTreeMap<ModulePath, BTreeMap<ModulePath, Place>>,
}

/// Paths written as `crate::…`, `super::…` or `self::…` on a code line.
fn relative_paths(line: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for start in ["crate", "super", "self"] {
        let mut from = 0;
        while let Some(at) = line[from..].find(start) {
            let i = from + at;
            from = i + start.len();
            if line[..i].ends_with(is_ident_char) {
                continue;
            }
            let mut segments = vec![start.to_owned()];
            let mut rest = &line[i + start.len()..];
            while let Some(after) = rest.strip_prefix("::") {
                let len = after
                    .find(|c: char| !is_ident_char(c))
                    .unwrap_or(after.len());
                if len == 0 {
                    break;
                }
                segments.push(after[..len].to_owned());
                rest = &after[len..];
            }
            // `self::super::x` and `super::super::x` are found once, from
            // their first word.
            let inside_longer = line[..i].ends_with("::");
            if segments.len() > 1 && !inside_longer {
                out.push(segments);
            }
        }
    }
    out
}

/// The module graphs of one crate's `src/` (relative paths under `src`), by
/// crate root (`""`, `bin/x`).
fn module_graphs(src: &Path, sources: &[Source]) -> BTreeMap<String, Graph> {
    let located: Vec<(String, ModulePath, &Source)> = sources
        .iter()
        .filter_map(|s| {
            let rel = s.path.strip_prefix(src).ok()?;
            let (root, module) = locate(rel);
            Some((root, module, s))
        })
        .collect();
    let mut modules: BTreeMap<String, BTreeSet<ModulePath>> = BTreeMap::new();
    for (root, module, _) in &located {
        modules
            .entry(root.clone())
            .or_default()
            .insert(module.clone());
    }
    let mut graphs: BTreeMap<String, Graph> = BTreeMap::new();
    for (root, me, source) in &located {
        let known = &modules[root];
        let graph = graphs.entry(root.clone()).or_default();
        graph.edges.entry(me.clone()).or_default();
        let children: BTreeSet<&str> = known
            .iter()
            .filter(|m| m.len() == me.len() + 1 && m.starts_with(me))
            .filter_map(|m| m.last().map(String::as_str))
            .collect();
        let mut paths: Vec<(Vec<String>, usize)> = Vec::new();
        for u in uses(&source.code) {
            if u.public && me.is_empty() {
                continue;
            }
            paths.extend(u.paths.into_iter().map(|p| (p.segments, u.line)));
        }
        for (n, line) in &source.code {
            paths.extend(relative_paths(line).into_iter().map(|p| (p, *n)));
        }
        for (segments, line) in paths {
            let Some(first) = segments.first() else {
                continue;
            };
            let (base, rest): (ModulePath, &[String]) = match first.as_str() {
                "crate" => (Vec::new(), &segments[1..]),
                "super" | "self" => {
                    let mut base = me.clone();
                    let mut rest = &segments[..];
                    while let Some(word) = rest.first() {
                        match word.as_str() {
                            "super" => {
                                base.pop();
                            }
                            "self" => {}
                            _ => break,
                        }
                        rest = &rest[1..];
                    }
                    (base, rest)
                }
                child if children.contains(child) => (me.clone(), &segments[..]),
                _ => continue,
            };
            let target = resolve(known, &base, rest).unwrap_or(base);
            if target != *me && !me.starts_with(&target) {
                graph
                    .edges
                    .entry(me.clone())
                    .or_default()
                    .entry(target)
                    .or_insert_with(|| (source.path.clone(), line));
            }
        }
    }
    graphs
}

/// The longest module `base::rest[..k]` that exists.
fn resolve(known: &BTreeSet<ModulePath>, base: &[String], rest: &[String]) -> Option<ModulePath> {
    let mut best = None;
    let mut current = base.to_vec();
    for segment in rest {
        current.push(segment.clone());
        if known.contains(&current) {
            best = Some(current.clone());
        } else {
            break;
        }
    }
    best
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(graph: &Graph) -> Vec<Vec<ModulePath>> {
    struct Tarjan<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g ModulePath, usize>,
        low: BTreeMap<&'g ModulePath, usize>,
        stack: Vec<&'g ModulePath>,
        on_stack: BTreeSet<&'g ModulePath>,
        found: Vec<Vec<ModulePath>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g ModulePath) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.edges.get(v).into_iter().flat_map(BTreeMap::keys) {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found.sort();
    t.found
}

/// One violation per import circle in a crate's `src/`, naming its modules
/// and the edges between them, each with the line that makes it.
fn import_circles(src: &Path, sources: &[Source]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (root, graph) in module_graphs(src, sources) {
        for component in cycles(&graph) {
            let members: BTreeSet<&ModulePath> = component.iter().collect();
            let names: Vec<String> = component.iter().map(|m| module_name(m)).collect();
            let mut what = format!(
                "import circle of {} modules: {}",
                component.len(),
                names.join(", ")
            );
            for from in &component {
                let edges: Vec<String> = graph.edges[from]
                    .iter()
                    .filter(|(to, _)| members.contains(to))
                    .map(|(to, (file, line))| {
                        format!("{} ({}:{line})", module_name(to), file.display())
                    })
                    .collect();
                what.push_str(&format!(
                    "\n      {} -> {}",
                    module_name(from),
                    edges.join(", ")
                ));
            }
            out.push(Violation {
                file: src.join(&root),
                line: 0,
                what,
            });
        }
    }
    out
}

#[test]
fn no_import_circle_inside_any_crate() {
    let mut violations = Vec::new();
    for member in members() {
        let src = member.dir.join("src");
        violations.extend(import_circles(&src, &non_test_sources(&src)));
    }
    report("no import circle inside any crate", &violations);
}

#[test]
fn import_circle_rule_finds_a_planted_circle() {
    let fake = planted(&[
        (
            "src/lib.rs",
            "pub mod a;\npub mod b;\npub mod c;\npub use a::A;\n",
        ),
        (
            "src/a.rs",
            "//! a\nuse crate::b::{B, helper};\npub struct A;\n#[cfg(test)]\nmod tests {\n    use crate::c::C;\n}\n",
        ),
        ("src/b.rs", "//! b\nuse super::c::C;\npub struct B;\n"),
        (
            "src/c/mod.rs",
            "//! c\nmod inner;\npub fn f() {\n    let _ = crate::a::A;\n}\n",
        ),
        (
            "src/c/inner.rs",
            "//! inner: the parent is not an edge\nuse super::C;\nuse crate::c;\n",
        ),
        ("src/bin/tool.rs", "//! a root of its own\nmod x;\n"),
        ("src/bin/tool/x.rs", "//! x\nuse crate::y;\n"),
    ]);
    let found = import_circles(Path::new("src"), &fake);
    assert_eq!(
        found.len(),
        1,
        "{:?}",
        found.iter().map(|v| &v.what).collect::<Vec<_>>()
    );
    let what = &found[0].what;
    assert!(
        what.starts_with("import circle of 3 modules: a, b, c"),
        "{what}"
    );
    assert!(what.contains("a -> b (src/a.rs:2)"), "{what}");
    assert!(what.contains("b -> c (src/b.rs:2)"), "{what}");
    assert!(what.contains("c -> a (src/c/mod.rs:4)"), "{what}");
    // Test code makes no edge: a -> c only exists in a's tests.
    assert!(!what.contains("a -> b (src/a.rs:2), c"), "{what}");
}

#[test]
fn import_circle_rule_passes_a_layered_crate() {
    let fake = planted(&[
        ("src/lib.rs", "pub mod a;\npub mod b;\npub use b::B;\n"),
        (
            "src/a.rs",
            "//! a\nuse crate::b::B;\nuse self::inner::I;\nmod inner;\n",
        ),
        (
            "src/a/inner.rs",
            "//! inner\nuse super::super::b;\nuse crate::a;\n",
        ),
        (
            "src/b.rs",
            "//! b\npub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n",
        ),
        ("src/main.rs", "//! main\nuse crate::a;\n"),
    ]);
    let found = import_circles(Path::new("src"), &fake);
    let whats: Vec<&String> = found.iter().map(|v| &v.what).collect();
    assert!(found.is_empty(), "{whats:?}");
}

#[test]
fn use_groups_and_aliases_expand() {
    let code = vec![(
        3,
        "pub(crate) use crate::{a::{self, B as C}, d};".to_owned(),
    )];
    let found = uses(&code);
    assert_eq!(found.len(), 1);
    assert!(found[0].public);
    assert_eq!(found[0].line, 3);
    let paths: Vec<(String, Option<&str>)> = found[0]
        .paths
        .iter()
        .map(|p| (p.segments.join("::"), p.alias.as_deref()))
        .collect();
    assert_eq!(
        paths,
        [
            ("crate::a::self".to_owned(), None),
            ("crate::a::B".to_owned(), Some("C")),
            ("crate::d".to_owned(), None),
        ]
    );
}
