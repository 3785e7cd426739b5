//! Rule: no import circle inside any crate. The module graph of every
//! workspace member's `src/` is computed from its non-test code and must
//! have no cycle: features depend on the owners of state in one direction,
//! never back.
//!
//! Nodes are module files (`foo.rs` and `foo/mod.rs` are `foo`; `lib.rs`
//! and `main.rs` are the crate root; every `src/bin/x` is a root of its
//! own). An edge is a path in non-test code (in a `use`, groups
//! `use a::{b, c::d}` expanded, or anywhere in the code) that starts with
//! `crate::`, `super::`, `self::` or a child module's name, resolved to the
//! longest prefix that is a module. Not edges: a `pub use` in the crate root (the
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

/// The paths on a code line that start with `crate`, `super`, `self` or
/// one of `children` (the module's own submodules), each as its segments.
fn relative_paths(line: &str, children: &BTreeSet<&str>) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < line.len() {
        let rest = &line[i..];
        let Some(c) = rest.chars().next() else {
            break;
        };
        if !is_ident_char(c) {
            i += c.len_utf8();
            continue;
        }
        let len = rest.find(|c: char| !is_ident_char(c)).unwrap_or(rest.len());
        let word = &rest[..len];
        // A path's first word: not a later segment (`a::b`), a field or
        // method (`x.b`), or a macro's `$crate`.
        let before = &line[..i];
        let starts_path = !before.ends_with("::") && !before.ends_with('.');
        let relative = matches!(word, "crate" | "super" | "self") || children.contains(word);
        let mut segments = vec![word.to_owned()];
        let mut after = &rest[len..];
        while let Some(tail) = after.strip_prefix("::") {
            let n = tail.find(|c: char| !is_ident_char(c)).unwrap_or(tail.len());
            if n == 0 {
                break;
            }
            segments.push(tail[..n].to_owned());
            after = &tail[n..];
        }
        if starts_path && relative && segments.len() > 1 {
            out.push(segments);
        }
        i = line.len() - after.len();
    }
    out
}

/// Every module path written in one crate root's non-test code: (from,
/// to, file, line) for each path, in file and line order. `to` is the
/// longest prefix of the path that is a module (the crate root `[]` for a
/// name the root holds); paths to the module itself are left out, those
/// to its ancestors kept. A `pub use` in the crate root (the crate's
/// public face) is no path.
pub(super) struct Edge {
    pub(super) from: ModulePath,
    pub(super) to: ModulePath,
    pub(super) file: PathBuf,
    pub(super) line: usize,
}

/// The module paths of one crate's `src/` (relative paths under `src`), by
/// crate root (`""`, `bin/x`): see `Edge`.
pub(super) fn module_edges(src: &Path, sources: &[Source]) -> BTreeMap<String, Vec<Edge>> {
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
    let mut out: BTreeMap<String, Vec<Edge>> = BTreeMap::new();
    for (root, me, source) in &located {
        let edges = out.entry(root.clone()).or_default();
        for (to, line) in paths_of(me, source, &modules[root]) {
            if to != *me {
                edges.push(Edge {
                    from: me.clone(),
                    to,
                    file: source.path.clone(),
                    line,
                });
            }
        }
    }
    out
}

/// The modules that `source` (module `me`, among `known`) names, each
/// with its line, in line order.
fn paths_of(
    me: &ModulePath,
    source: &Source,
    known: &BTreeSet<ModulePath>,
) -> Vec<(ModulePath, usize)> {
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
        paths.extend(relative_paths(line, &children).into_iter().map(|p| (p, *n)));
    }
    paths.sort_by_key(|(_, line)| *line);
    let mut out = Vec::new();
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
        out.push((resolve(known, &base, rest).unwrap_or(base), line));
    }
    out
}

/// The module graphs of one crate's `src/` (relative paths under `src`), by
/// crate root (`""`, `bin/x`): `module_edges` without the paths to a
/// module's ancestors, each edge at the first place it is written.
fn module_graphs(src: &Path, sources: &[Source]) -> BTreeMap<String, Graph> {
    let mut graphs: BTreeMap<String, Graph> = BTreeMap::new();
    for (root, edges) in module_edges(src, sources) {
        let graph = graphs.entry(root).or_default();
        for e in edges {
            graph.edges.entry(e.from.clone()).or_default();
            if !e.from.starts_with(&e.to) {
                graph
                    .edges
                    .entry(e.from)
                    .or_default()
                    .entry(e.to)
                    .or_insert((e.file, e.line));
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
                file: if root.is_empty() {
                    src.to_path_buf()
                } else {
                    src.join(&root)
                },
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
            "//! c\nmod inner;\npub fn f() {\n    let _ = crate::a::A;\n    inner::g();\n}\n",
        ),
        (
            "src/c/inner.rs",
            "//! inner: the parent is not an edge\nuse super::C;\nuse crate::c;\npub fn g() {\n    let _ = x.inner::<u8>();\n    crate::b::B\n}\n",
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
        what.starts_with("import circle of 4 modules: a, b, c, c::inner"),
        "{what}"
    );
    assert!(what.contains("a -> b (src/a.rs:2)"), "{what}");
    assert!(what.contains("b -> c (src/b.rs:2)"), "{what}");
    // A child module named in code, not only in a `use`.
    assert!(
        what.contains("c -> a (src/c/mod.rs:4), c::inner (src/c/mod.rs:5)"),
        "{what}"
    );
    assert!(what.contains("c::inner -> b (src/c/inner.rs:6)"), "{what}");
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
