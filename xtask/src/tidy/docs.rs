//! Rules for the project's prose: the decision record and the benchmark
//! page stay to size (each decision in a few lines, each figure's reason
//! in one), and no document tells history: what changed and when is
//! git's, the docs say what the system is.

use std::path::Path;

use super::{Violation, read, report};

/// Documents with a line budget, and why.
const LINE_BUDGETS: &[(&str, usize, &str)] = &[
    (
        "docs/decisions.md",
        700,
        "each decision in a few lines with its reason",
    ),
    (
        "BENCHMARKS.md",
        400,
        "the method, the table and one line of reason per unmet figure",
    ),
];

/// Phrases that only tell history (matched case-insensitively as words).
const HISTORY_PHRASES: &[&str] = &[
    "used to be",
    "formerly",
    "previously",
    "before the change",
    "in the past",
];

/// The prose the history rule reads: the top-level documents, the
/// decisions and the book (the generated reference included: its lines
/// come from the code's doc strings).
const PROSE: &[&str] = &[
    "README.md",
    "ARCHITECTURE.md",
    "CONTRIBUTING.md",
    "BENCHMARKS.md",
    "docs/decisions.md",
    "book/src",
];

/// Documents over their line budget.
fn over_budget(docs: &[(&str, &str)], budgets: &[(&str, usize, &str)]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (path, limit, why) in budgets {
        let Some((_, text)) = docs.iter().find(|(p, _)| p == path) else {
            continue;
        };
        let lines = text.lines().count();
        if lines > *limit {
            out.push(Violation {
                file: path.into(),
                line: 0,
                what: format!("{lines} lines, over its budget of {limit} ({why})"),
            });
        }
    }
    out
}

/// Whether `phrase` occurs in `line` as whole words.
fn has_phrase(line: &str, phrase: &str) -> bool {
    let lower = line.to_lowercase();
    lower.match_indices(phrase).any(|(at, _)| {
        let before = lower[..at].chars().next_back();
        let after = lower[at + phrase.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

/// Lines that tell history.
fn history(docs: &[(&str, &str)]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (path, text) in docs {
        for (n, line) in text.lines().enumerate() {
            if let Some(p) = HISTORY_PHRASES.iter().find(|p| has_phrase(line, p)) {
                out.push(Violation {
                    file: path.into(),
                    line: n + 1,
                    what: format!("\"{p}\" tells history: say what is, git keeps what was"),
                });
            }
        }
    }
    out
}

/// Every Markdown file of the prose, as (path, text).
fn prose() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in PROSE {
        let path = Path::new(p);
        if p.ends_with(".md") {
            out.push((p.to_string(), read(path)));
            continue;
        }
        let dir = crate::root().join(path);
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("tidy: reading {}: {e}", dir.display()));
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".md"))
            .collect();
        names.sort();
        for n in names {
            let rel = format!("{p}/{n}");
            out.push((rel.clone(), read(Path::new(&rel))));
        }
    }
    out
}

#[test]
fn decisions_and_benchmarks_stay_to_size() {
    let docs = prose();
    let docs: Vec<(&str, &str)> = docs.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
    for (path, _, _) in LINE_BUDGETS {
        assert!(
            docs.iter().any(|(p, _)| p == path),
            "tidy: {path} has a line budget but is not read"
        );
    }
    report(
        "documents within their line budget",
        &over_budget(&docs, LINE_BUDGETS),
    );
}

#[test]
fn size_rule_finds_a_planted_overflow() {
    let long = "a line\n".repeat(11);
    let docs = [("d.md", long.as_str()), ("e.md", "short\n")];
    let v = over_budget(&docs, &[("d.md", 10, "x"), ("e.md", 10, "y")]);
    assert_eq!(v.len(), 1);
    assert!(
        v[0].what.starts_with("11 lines, over its budget of 10"),
        "{}",
        v[0].what
    );
}

#[test]
fn no_document_tells_history() {
    let docs = prose();
    let docs: Vec<(&str, &str)> = docs.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
    report("no document tells history", &history(&docs));
}

#[test]
fn history_rule_finds_planted_phrases() {
    let docs = [(
        "d.md",
        "The limit used to be 10.\nFormerly, reports were kept.\nThe key used to sign.\nPreviouslyish is no word.\n",
    )];
    let v = history(&docs);
    let lines: Vec<usize> = v.iter().map(|v| v.line).collect();
    assert_eq!(lines, vec![1, 2]);
}
