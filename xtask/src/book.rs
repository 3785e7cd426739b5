//! `cargo xtask book`: builds the operator's book (mdBook, `book/`) into
//! `target/book` and checks that every relative link and `#anchor` in
//! `book/src` resolves, which mdBook itself does not.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Builds the book and checks its links.
pub fn book() -> Result<()> {
    let src = crate::root().join("book/src");
    let broken = broken_links(&src)?;
    if !broken.is_empty() {
        bail!("book: broken links:\n  {}", broken.join("\n  "));
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
}
