//! Generated sections of the book: the tables of a binary's flags
//! (`build_info::docs::flag_table`, made from the same `clap::Command` the
//! binary parses with) stand between `<!-- generated: NAME -->` and
//! `<!-- end: NAME -->` in a book page, so a flag, its environment variable
//! and its default cannot drift from the code. A test compares;
//! `REACH_BLESS=1` writes.

use std::path::Path;

use anyhow::{Context, bail};

/// Holds the part of `page` between `<!-- generated: NAME -->` and
/// `<!-- end: NAME -->` to `content`: an error naming the bless command
/// when they differ, or (`REACH_BLESS=1`) the page rewritten.
pub fn check_generated(page: &Path, name: &str, content: &str, bless: &str) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(page).with_context(|| format!("reading {}", page.display()))?;
    let start = format!("<!-- generated: {name} -->\n");
    let end = format!("<!-- end: {name} -->");
    let (Some(a), Some(b)) = (text.find(&start), text.find(&end)) else {
        bail!("{} has no `{start}` … `{end}` section", page.display());
    };
    let body = a + start.len();
    if body > b {
        bail!("{}: `{end}` comes before its start", page.display());
    }
    if &text[body..b] == content {
        return Ok(());
    }
    if std::env::var_os("REACH_BLESS").is_some() {
        let new = format!("{}{content}{}", &text[..body], &text[b..]);
        std::fs::write(page, new).with_context(|| format!("writing {}", page.display()))?;
        return Ok(());
    }
    bail!(
        "{}'s `{name}` section differs from the code: run `REACH_BLESS=1 {bless}`",
        page.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_section_is_refused_and_blessing_is_named() {
        let dir = std::env::temp_dir().join(format!("flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let page = dir.join("p.md");
        std::fs::write(&page, "# P\n<!-- generated: f -->\nold\n<!-- end: f -->\n").expect("write");
        let err = check_generated(&page, "f", "new\n", "cargo test x").expect_err("stale");
        assert!(
            err.to_string().contains("REACH_BLESS=1 cargo test x"),
            "{err}"
        );
        check_generated(&page, "f", "old\n", "x").expect("current");
        let err = check_generated(&page, "g", "", "x").expect_err("missing");
        assert!(err.to_string().contains("<!-- generated: g -->"), "{err}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
