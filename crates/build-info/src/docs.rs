//! A binary's man pages and shell completions, from its clap command:
//! `NAME --generate-docs DIR` (hidden, the only argument, kept out of the
//! parser so it shows in neither `--help` nor the pages it writes).

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// The directory `--generate-docs DIR` names, when that is the whole
/// command line.
pub fn requested() -> Option<PathBuf> {
    let mut args = std::env::args_os().skip(1);
    match (args.next(), args.next(), args.next()) {
        (Some(flag), Some(dir), None) if flag == "--generate-docs" => Some(dir.into()),
        _ => None,
    }
}

/// Writes `NAME.1` (and one page per subcommand) and the bash, zsh and
/// fish completions of `cmd` into `dir`.
pub fn write(mut cmd: clap::Command, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let name = cmd.get_name().to_owned();
    clap_mangen::generate_to(cmd.clone(), dir)
        .with_context(|| format!("writing man pages to {}", dir.display()))?;
    for shell in [
        clap_complete::Shell::Bash,
        clap_complete::Shell::Zsh,
        clap_complete::Shell::Fish,
    ] {
        clap_complete::generate_to(shell, &mut cmd, &name, dir)
            .with_context(|| format!("writing {shell} completions to {}", dir.display()))?;
    }
    Ok(())
}
