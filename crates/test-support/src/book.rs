//! The book's procedures as the tests run them: a fenced `sh` block of
//! book/src/operations.md, found by the line `<!-- book-test: NAME -->`
//! before it, run line by line through `bash -euo pipefail`, with only the
//! placeholders the caller names replaced (the database's address, the
//! backup's date). A test that runs a block runs what an operator reads.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The book's Operations chapter.
pub fn operations_chapter() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../book/src/operations.md")
}

/// The lines of the block after `<!-- book-test: NAME -->` in `text`,
/// blanks and comment lines left out.
pub fn block_in(text: &str, name: &str) -> anyhow::Result<Vec<String>> {
    let marker = format!("<!-- book-test: {name} -->");
    let (_, rest) = text
        .split_once(&marker)
        .with_context(|| format!("the book has no {marker}"))?;
    let body = rest
        .trim_start()
        .strip_prefix("```sh\n")
        .with_context(|| format!("{marker} is not followed by a ```sh block"))?;
    let (body, _) = body
        .split_once("```")
        .with_context(|| format!("the block after {marker} is not closed"))?;
    Ok(body
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

/// The block `name` of the Operations chapter.
pub fn block(name: &str) -> anyhow::Result<Vec<String>> {
    let path = operations_chapter();
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    block_in(&text, name)
}

/// Runs the block `name` line by line, each line with every `(from, to)`
/// of `replace` applied, in `bash -euo pipefail` with `env` added; returns
/// the lines as run. A failing line is an error with its output.
pub fn run_block(
    name: &str,
    replace: &[(&str, &str)],
    env: &[(&str, String)],
) -> anyhow::Result<Vec<String>> {
    let mut ran = Vec::new();
    for line in block(name)? {
        let line = replace
            .iter()
            .fold(line, |l, (from, to)| l.replace(from, to));
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &line])
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .with_context(|| format!("cannot run bash for {line:?}"))?;
        if !out.status.success() {
            bail!(
                "the book's {name} block: `{line}` failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        ran.push(line);
    }
    Ok(ran)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_found_by_its_marker_and_read_without_comments() {
        let text = "x\n<!-- book-test: a -->\n```sh\n# note\necho 1   # why\n\necho 2\n```\n<!-- book-test: b -->\ntext\n";
        assert_eq!(
            block_in(text, "a").expect("a"),
            ["echo 1   # why", "echo 2"]
        );
        assert!(block_in(text, "b").is_err(), "no block after b");
        assert!(block_in(text, "c").is_err(), "no marker c");
    }
}
