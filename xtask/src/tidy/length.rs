//! Rule: no function over 80 lines in the shipped crates (from its `fn` line
//! to its closing brace, non-test code), except pure data tables named in
//! `LONG_FUNCTIONS_ALLOWED`. A long function is a sign of several concerns
//! in one place; split it where a reader would pause.

use std::path::Path;

use super::{Source, Violation, is_ident_char, locate, members, non_test_sources, planted, report};

/// The most lines a function may span.
const MAX_LINES: usize = 80;

/// Functions allowed to be longer: `crate::module::[Type::]fn` and why.
/// Only pure data tables qualify (a list read top to bottom, no logic to
/// split); every entry must still name a function over the limit.
const LONG_FUNCTIONS_ALLOWED: &[(&str, &str)] = &[];

/// A function found in a file: its name with the item path inside the file
/// (`Type::f` for a method), the line of its `fn`, and how many lines it
/// spans up to its closing brace.
#[derive(Debug, PartialEq)]
struct Function {
    name: String,
    line: usize,
    lines: usize,
}

/// A token of code: an identifier or one punctuation character.
#[derive(Clone, Copy, PartialEq)]
enum Token<'a> {
    Ident(&'a str),
    Punct(char),
}

/// The tokens of a file's code, each with its line.
fn tokens(code: &[(usize, String)]) -> Vec<(Token<'_>, usize)> {
    let mut out = Vec::new();
    for (n, line) in code {
        let mut rest = line.as_str();
        while let Some(c) = rest.chars().next() {
            if is_ident_char(c) {
                let len = rest.find(|c: char| !is_ident_char(c)).unwrap_or(rest.len());
                out.push((Token::Ident(&rest[..len]), *n));
                rest = &rest[len..];
            } else {
                if !c.is_whitespace() {
                    out.push((Token::Punct(c), *n));
                }
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    out
}

/// The self type of an `impl` header (`impl<T> Trait for a::Type<T>` →
/// `Type`), from the tokens after `impl` up to its `{`.
fn impl_type(header: &[Token<'_>]) -> String {
    // Skip the impl's own generics.
    let mut rest = header;
    if rest.first() == Some(&Token::Punct('<')) {
        let mut depth = 0;
        let mut skip = 0;
        for (i, t) in rest.iter().enumerate() {
            match t {
                Token::Punct('<') => depth += 1,
                Token::Punct('>') => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                skip = i + 1;
                break;
            }
        }
        rest = &rest[skip..];
    }
    if let Some(at) = rest.iter().rposition(|t| *t == Token::Ident("for")) {
        rest = &rest[at + 1..];
    }
    // The last path segment before generics or a where clause.
    let mut name = String::new();
    for t in rest {
        match t {
            Token::Ident("where" | "dyn" | "mut") => {
                if !name.is_empty() {
                    break;
                }
            }
            Token::Ident(word) => name = (*word).to_owned(),
            Token::Punct(':' | '&' | '\'') => {}
            Token::Punct(_) => break,
        }
    }
    name
}

/// Every function with a body in a file's code.
fn functions(code: &[(usize, String)]) -> Vec<Function> {
    let tokens = tokens(code);
    let mut out = Vec::new();
    // Open brace depth.
    let mut depth = 0usize;
    // Named scopes (impl, trait, inline mod, fn): name, depth of its body.
    let mut scopes: Vec<(String, usize, Option<usize>)> = Vec::new();
    // A header seen, waiting for its `{`: name, whether a fn (and its
    // line), the header's paren/bracket depth.
    let mut pending: Option<(String, Option<usize>, i32)> = None;
    let mut i = 0;
    while i < tokens.len() {
        let (token, line) = tokens[i];
        let next = tokens.get(i + 1).map(|t| t.0);
        match token {
            Token::Ident("fn") if pending.is_none() => {
                if let Some(Token::Ident(name)) = next {
                    pending = Some((name.to_owned(), Some(line), 0));
                    i += 1;
                }
            }
            Token::Ident("impl") if pending.is_none() => {
                let end = tokens[i + 1..]
                    .iter()
                    .position(|t| matches!(t.0, Token::Punct('{' | ';')))
                    .map_or(tokens.len(), |p| i + 1 + p);
                let header: Vec<Token<'_>> = tokens[i + 1..end].iter().map(|t| t.0).collect();
                pending = Some((impl_type(&header), None, 0));
            }
            Token::Ident("trait" | "mod") if pending.is_none() => {
                if let Some(Token::Ident(name)) = next {
                    pending = Some((name.to_owned(), None, 0));
                    i += 1;
                }
            }
            Token::Punct('(' | '[') => {
                if let Some(p) = pending.as_mut() {
                    p.2 += 1;
                }
            }
            Token::Punct(')' | ']') => {
                if let Some(p) = pending.as_mut() {
                    p.2 -= 1;
                }
            }
            Token::Punct(';') if pending.as_ref().is_some_and(|p| p.2 == 0) => {
                pending = None;
            }
            Token::Punct('{') => {
                depth += 1;
                // A `{` inside a header's parens or brackets (a const
                // generic block) leaves the header pending.
                if pending.as_ref().is_some_and(|p| p.2 == 0)
                    && let Some((name, fn_line, _)) = pending.take()
                {
                    scopes.push((name, depth, fn_line));
                }
            }
            Token::Punct('}') => {
                if scopes.last().is_some_and(|s| s.1 == depth)
                    && let Some((name, _, fn_line)) = scopes.pop()
                    && let Some(start) = fn_line
                {
                    let mut path: Vec<&str> = scopes.iter().map(|s| s.0.as_str()).collect();
                    path.push(&name);
                    out.push(Function {
                        name: path.join("::"),
                        line: start,
                        lines: line + 1 - start,
                    });
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        i += 1;
    }
    out.sort_by_key(|f| f.line);
    out
}

/// The functions over the limit in one crate (`krate`: its name as a path
/// segment; `src`: its source directory), but the allowed ones; and the
/// allow-list entries of this crate that name no long function.
fn long_functions(
    krate: &str,
    src: &Path,
    sources: &[Source],
    allowed: &[(&str, &str)],
) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut used = Vec::new();
    for source in sources {
        let Ok(rel) = source.path.strip_prefix(src) else {
            continue;
        };
        let (root, module) = locate(rel);
        let mut prefix = vec![krate.to_owned()];
        if !root.is_empty() {
            prefix.push(root.replace('/', "::"));
        }
        prefix.extend(module);
        for f in functions(&source.code) {
            if f.lines <= MAX_LINES {
                continue;
            }
            let name = format!("{}::{}", prefix.join("::"), f.name);
            if allowed.iter().any(|(a, _)| *a == name) {
                used.push(name);
                continue;
            }
            out.push(Violation {
                file: source.path.clone(),
                line: f.line,
                what: format!(
                    "`{name}` is {} lines (at most {MAX_LINES}): split it, or, if it is a pure data table, name it in LONG_FUNCTIONS_ALLOWED with the reason",
                    f.lines
                ),
            });
        }
    }
    for (name, _) in allowed {
        let ours = name.split("::").next() == Some(krate);
        if ours && !used.iter().any(|u| u == name) {
            out.push(Violation {
                file: src.to_path_buf(),
                line: 0,
                what: format!(
                    "LONG_FUNCTIONS_ALLOWED names `{name}`, which is no function over {MAX_LINES} lines here: drop the entry"
                ),
            });
        }
    }
    out
}

#[test]
fn no_function_over_80_lines_in_shipped_crates() {
    let mut violations = Vec::new();
    for member in members().into_iter().filter(|m| m.shipped) {
        let src = member.dir.join("src");
        violations.extend(long_functions(
            &member.name,
            &src,
            &non_test_sources(&src),
            LONG_FUNCTIONS_ALLOWED,
        ));
    }
    report("no function over 80 lines in shipped crates", &violations);
}

fn body(lines: usize) -> String {
    (0..lines)
        .map(|i| format!("    let _x{i} = {i};\n"))
        .collect()
}

#[test]
fn function_finder_names_methods_and_counts_lines() {
    let text = format!(
        "//! x\nimpl<T: Clone> fmt::Display for a::Thing<T> where T: Copy {{\n    fn fmt(&self) -> impl Iterator<Item = [u8; 2]> {{\n{}    }}\n}}\ntrait Tr {{\n    fn declared(&self);\n    fn provided(&self) {{}}\n}}\npub(crate) async fn free(\n    x: fn(u8) -> u8,\n) -> Result<(), ()> {{\n    let c = |y: u8| {{ y }};\n    Ok(())\n}}\nmod inner {{\n    fn f() {{}}\n}}\n",
        body(3)
    );
    let source = &planted(&[("src/x.rs", &text)])[0];
    let found = functions(&source.code);
    assert_eq!(
        found,
        [
            Function {
                name: "Thing::fmt".into(),
                line: 3,
                lines: 5
            },
            Function {
                name: "Tr::provided".into(),
                line: 11,
                lines: 1
            },
            Function {
                name: "free".into(),
                line: 13,
                lines: 6
            },
            Function {
                name: "inner::f".into(),
                line: 20,
                lines: 1
            },
        ]
    );
}

#[test]
fn long_function_rule_finds_a_planted_long_function() {
    let long = format!("//! x\npub fn long() {{\n{}}}\n", body(MAX_LINES - 1));
    let ok = format!("//! x\npub fn fits() {{\n{}}}\n", body(MAX_LINES - 2));
    let table = format!("//! x\npub fn table() {{\n{}}}\n", body(200));
    let test_only = format!(
        "//! x\n#[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{}    }}\n}}\n",
        body(200)
    );
    let fake = planted(&[
        ("src/lib.rs", &ok),
        ("src/a/mod.rs", &long),
        ("src/b.rs", &table),
        ("src/c.rs", &test_only),
    ]);
    let allowed = [("fake::b::table", "a table"), ("fake::gone", "stale")];
    let found = long_functions("fake", Path::new("src"), &fake, &allowed);
    let whats: Vec<String> = found.iter().map(Violation::line).collect();
    assert_eq!(found.len(), 2, "{whats:#?}");
    assert!(
        whats[0].starts_with("src/a/mod.rs:2: `fake::a::long` is 81 lines"),
        "{whats:#?}"
    );
    assert!(
        whats[1].contains("`fake::gone`, which is no function"),
        "{whats:#?}"
    );
}

#[test]
fn long_function_rule_passes_short_functions() {
    let ok = format!("//! x\npub fn fits() {{\n{}}}\n", body(MAX_LINES - 2));
    let fake = planted(&[("src/lib.rs", &ok)]);
    let found = long_functions("fake", Path::new("src"), &fake, &[]);
    assert!(
        found.is_empty(),
        "{:?}",
        found.iter().map(|v| &v.what).collect::<Vec<_>>()
    );
}
