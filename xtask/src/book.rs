//! `cargo xtask book`: builds the operator's book (mdBook, `book/`) into
//! `target/book` and checks that every relative link and `#anchor` in
//! `book/src` resolves, which mdBook itself does not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Builds the book and checks its links and its figures.
pub fn book() -> Result<()> {
    let src = crate::root().join("book/src");
    let broken = broken_links(&src)?;
    if !broken.is_empty() {
        bail!("book: broken links:\n  {}", broken.join("\n  "));
    }
    let table = benchmark_table(&std::fs::read_to_string(
        crate::root().join("BENCHMARKS.md"),
    )?);
    let stale = figure_mismatches(&pages(&src)?, &table);
    if !stale.is_empty() {
        bail!(
            "book: figures that are not BENCHMARKS.md's:\n  {}",
            stale.join("\n  ")
        );
    }
    let mut build = Command::new("mdbook");
    build
        .arg("build")
        .arg(crate::root().join("book"))
        .arg("--dest-dir")
        .arg(crate::root().join("target/book"));
    crate::run(
        build,
        "mdbook build (cargo install mdbook --locked, as .ci/run does)",
    )
}

/// Every relative link in the Markdown files under `src` whose file or
/// `#anchor` is missing, as `file: target`.
pub fn broken_links(src: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    collect(src, &mut files)?;
    let mut broken = Vec::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap_or(src).join(path)
            };
            let ok = dest.is_file()
                && (anchor.is_empty()
                    || dest.extension().is_none_or(|e| e != "md")
                    || anchors(&std::fs::read_to_string(&dest)?).contains(anchor));
            if !ok {
                let name = file.strip_prefix(src).unwrap_or(file);
                broken.push(format!("{}: {target}", name.display()));
            }
        }
    }
    Ok(broken)
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, files)?;
        } else if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    Ok(())
}

/// The targets of inline links `[text](target)` outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            let target = rest[..end].split_whitespace().next().unwrap_or("");
            if !target.is_empty() {
                out.push(target.to_string());
            }
            rest = &rest[end..];
        }
    }
    out
}

/// The anchors mdBook gives a page's headings: lower case, spaces to
/// dashes, other punctuation dropped; repeats get `-1`, `-2`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let base: String = title
            .chars()
            .filter_map(|c| match c {
                c if c.is_whitespace() => Some('-'),
                c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c.to_ascii_lowercase()),
                _ => None,
            })
            .collect();
        let mut id = base.clone();
        let mut n = 1;
        while seen.contains(&id) {
            id = format!("{base}-{n}");
            n += 1;
        }
        seen.insert(id);
    }
    seen
}

/// BENCHMARKS.md's table: each figure's name and its value as written
/// (`| `name` | value | …`).
fn benchmark_table(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let mut cells = l.strip_prefix("| `")?.split('|');
            let name = cells.next()?.trim().strip_suffix('`')?;
            let value = cells.next()?.trim();
            Some((name.to_owned(), value.to_owned()))
        })
        .collect()
}

/// Whether a word is a number as the book and the table write them
/// (`62,136`, `0.72`, `13.40`).
fn number(word: &str) -> Option<(f64, usize)> {
    let w = word.trim_end_matches(['%', ',', '.']);
    if !w.starts_with(|c: char| c.is_ascii_digit())
        || !w
            .chars()
            .all(|c| c.is_ascii_digit() || c == ',' || c == '.')
    {
        return None;
    }
    let decimals = w.split_once('.').map_or(0, |(_, d)| d.len());
    w.replace(',', "").parse().ok().map(|v| (v, decimals))
}

/// Each figure a text quotes as `NUMBER [unit words] (`name`)`: the
/// number nearest before the parenthesis, at most six words back and not
/// across `, `, `;:|()`, with the name and the line. Only a figure's name
/// (lowercase, digits and `_`, at least one `_`) makes a quote, and a
/// parenthesis with no such number is none (a name for reference only).
fn quoted_figures(text: &str) -> Vec<(String, String, usize)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        let mut offset = 0;
        while let Some(at) = rest.find("(`") {
            let start = offset + at;
            let after = &line[start + 2..];
            let Some(end) = after.find("`)") else { break };
            let name = &after[..end];
            let before = &line[..start];
            let cut = [", ", ";", ":", "|", "(", ")"]
                .iter()
                .filter_map(|p| before.rfind(p).map(|at| at + p.len()))
                .max()
                .unwrap_or(0);
            let clause = &before[cut..];
            let found = clause
                .split_whitespace()
                .rev()
                .take(7)
                .find_map(|w| number(w).map(|_| w));
            let figure_like = name.contains('_')
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if let (Some(word), true) = (found, figure_like) {
                out.push((word.to_owned(), name.to_owned(), n + 1));
            }
            offset = start + 2 + end + 2;
            rest = &line[offset..];
        }
    }
    out
}

/// Quotes that disagree with the table: a figure not in it, or a number
/// that is not the table's value rounded to the quote's decimals.
fn figure_mismatches(pages: &[(String, String)], table: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (page, text) in pages {
        for (quoted, name, line) in quoted_figures(text) {
            let Some(value) = table.get(&name) else {
                out.push(format!(
                    "{page}:{line}: `{name}` is not in BENCHMARKS.md's table"
                ));
                continue;
            };
            let (Some((b, decimals)), Some((t, _))) = (number(&quoted), number(value)) else {
                out.push(format!(
                    "{page}:{line}: `{name}`: cannot compare {quoted} with {value}"
                ));
                continue;
            };
            let scale = 10f64.powi(decimals as i32);
            if ((t * scale).round() - b * scale).abs() > 1e-6 {
                out.push(format!(
                    "{page}:{line}: `{name}` quoted as {quoted}, the table says {value}"
                ));
            }
        }
    }
    out
}

/// The Markdown pages of the book, as (file name, text).
fn pages(src: &Path) -> Result<Vec<(String, String)>> {
    let mut files = Vec::new();
    collect(src, &mut files)?;
    files
        .into_iter()
        .map(|f| {
            let text =
                std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
            let name = f.strip_prefix(src).unwrap_or(&f).display().to_string();
            Ok((name, text))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_books_links_resolve() {
        let broken = broken_links(&crate::root().join("book/src")).expect("read book/src");
        assert!(broken.is_empty(), "{broken:?}");
    }

    /// `api.md`'s endpoint table lists every method and path of the
    /// generated `docs/openapi.json` (JSON read as YAML, its superset).
    #[test]
    fn the_api_page_lists_every_endpoint() {
        let text = std::fs::read_to_string(crate::root().join("docs/openapi.json"))
            .expect("read docs/openapi.json");
        let doc: serde_norway::Value = serde_norway::from_str(&text).expect("parse openapi.json");
        let page = std::fs::read_to_string(crate::root().join("book/src/api.md"))
            .expect("read book/src/api.md");
        let paths = doc["paths"].as_mapping().expect("paths");
        let mut missing = Vec::new();
        for (path, ops) in paths {
            let path = path.as_str().expect("path");
            for method in ops.as_mapping().expect("operations").keys() {
                let method = method.as_str().expect("method").to_uppercase();
                let row = format!("| {method} | `{path}` |");
                if !page.contains(&row) {
                    missing.push(row);
                }
            }
        }
        assert!(paths.len() > 10, "only {} paths read", paths.len());
        assert!(
            missing.is_empty(),
            "book/src/api.md does not list {missing:?}"
        );
    }

    /// A planted broken file link and a broken anchor are both reported;
    /// good ones are not.
    #[test]
    fn planted_broken_links_are_found() {
        let dir = std::env::temp_dir().join(format!("xtask-book-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
        std::fs::write(
            dir.join("a.md"),
            "# Top\n## Backup and restore\n[ok](sub/b.md#the-end) [ok](#backup-and-restore) \
             [web](https://example.com/x) [gone](missing.md) [bad](sub/b.md#nowhere)\n\
             ```\n[code](ignored.md)\n```\n",
        )
        .expect("write a");
        std::fs::write(dir.join("sub/b.md"), "# The end\n[up](../a.md#top)\n").expect("write b");
        let broken = broken_links(&dir).expect("check");
        std::fs::remove_dir_all(&dir).expect("clean up");
        assert_eq!(broken, vec!["a.md: missing.md", "a.md: sub/b.md#nowhere"]);
    }

    /// Every figure the book quotes is the current run's, from
    /// BENCHMARKS.md's table.
    #[test]
    fn the_books_figures_are_the_benchmarks() {
        let table = benchmark_table(
            &std::fs::read_to_string(crate::root().join("BENCHMARKS.md"))
                .expect("read BENCHMARKS.md"),
        );
        assert!(table.len() > 50, "only {} figures read", table.len());
        let pages = pages(&crate::root().join("book/src")).expect("read book/src");
        let quotes: usize = pages.iter().map(|(_, t)| quoted_figures(t).len()).sum();
        assert!(quotes >= 20, "the book quotes only {quotes} figures");
        let wrong = figure_mismatches(&pages, &table);
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// A stale quote, a renamed figure and a rounding are told apart.
    #[test]
    fn a_planted_stale_figure_is_found() {
        let table = benchmark_table(
            "| figure | value |\n| --- | --- |\n| `a_per_s` | 62,136 | — |\n| `b_us` | 0.7192 | x |\n",
        );
        let page = "| x | 33,000 a second (`a_per_s`) and 0.72 µs CPU (`b_us`) |\n\
                    62,136 decisions a second over gRPC (`a_per_s`); 0.7 µs (`b_us`), 9 (`gone_s`)\n\
                    named only (`a_per_s`), see 3 apples: (`b_us`)\n";
        let wrong = figure_mismatches(&[("p.md".into(), page.into())], &table);
        assert_eq!(
            wrong,
            vec![
                "p.md:1: `a_per_s` quoted as 33,000, the table says 62,136",
                "p.md:2: `gone_s` is not in BENCHMARKS.md's table",
            ]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>()
        );
    }
}
