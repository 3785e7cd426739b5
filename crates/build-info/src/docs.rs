//! A binary's man pages and shell completions, from its clap command:
//! `NAME --generate-docs DIR` (hidden, the only argument, kept out of the
//! parser so it shows in neither `--help` nor the pages it writes); and
//! the book's command-line reference, `NAME --generate-reference` (printed
//! in Markdown: every flag with its environment variable and default, and
//! every subcommand).

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

/// Whether `--generate-reference` is the whole command line.
pub fn reference_requested() -> bool {
    let mut args = std::env::args_os().skip(1);
    matches!((args.next(), args.next()), (Some(flag), None) if flag == "--generate-reference")
}

/// The command-line reference of `cmd` in Markdown: its flags' table, then
/// each subcommand (depth first) with its usage and its own flags.
pub fn reference(cmd: &clap::Command) -> String {
    let mut cmd = cmd.clone();
    cmd.build();
    let mut out = flag_table(&cmd, false);
    subcommands(&cmd, cmd.get_name(), &mut out);
    out
}

/// Appends each visible subcommand of `cmd` (named `path …`), then theirs.
fn subcommands(cmd: &clap::Command, path: &str, out: &mut String) {
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        let full = format!("{path} {}", sub.get_name());
        let about = sub
            .get_long_about()
            .or_else(|| sub.get_about())
            .map(|a| sentence(&a.to_string()))
            .unwrap_or_default();
        let usage = one_line(&sub.clone().render_usage().to_string());
        let usage = usage.strip_prefix("Usage: ").unwrap_or(&usage);
        out.push_str(&format!("\n#### `{full}`\n\n{about}\n\n`{usage}`\n"));
        let table = flag_table(sub, true);
        if table.lines().count() > 2 {
            out.push('\n');
            out.push_str(&table);
        }
        subcommands(sub, &full, out);
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

/// A help text as one sentence or more ending in a period (clap drops a
/// one-paragraph help's final period).
fn sentence(text: &str) -> String {
    let text = one_line(text);
    if text.is_empty() || text.ends_with(['.', ':']) {
        text
    } else {
        format!("{text}.")
    }
}

/// One line of text from a help text: paragraphs joined, code spans kept.
fn one_line(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The Markdown table of `cmd`'s flags (not `--help`/`--version`): the
/// flag with its value, the environment variable, the default and the
/// flag's help as the code writes it.
/// `skip_global`: leave out the flags a parent passes down (listed
/// with it).
pub fn flag_table(cmd: &clap::Command, skip_global: bool) -> String {
    // Value counts and the like are settled when the command is built.
    let mut cmd = cmd.clone();
    cmd.build();
    let mut out = String::from("| flag | env | default | meaning |\n| --- | --- | --- | --- |\n");
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") || (skip_global && arg.is_global_set()) {
            continue;
        }
        let takes_value = arg.get_num_args().is_some_and(|n| n.takes_values());
        let value = if !takes_value {
            String::new()
        } else {
            let possible: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_owned())
                .collect();
            if possible.is_empty() {
                let names = arg
                    .get_value_names()
                    .map(|n| {
                        n.iter()
                            .map(|s| s.as_str().to_owned())
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
                format!(" {names}")
            } else {
                format!(" {}", possible.join("\\|"))
            }
        };
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let default: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let default = if default.is_empty() || !takes_value {
            String::new()
        } else {
            format!("`{}`", default.join(","))
        };
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| one_line(&h.to_string()))
            .unwrap_or_default();
        let help = sentence(&help);
        out.push_str(&format!(
            "| `--{long}{value}` | {env} | {default} | {help} |\n"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Demo {
        /// How often, in seconds.
        /// Second line.
        #[arg(long, env = "DEMO_EVERY_S", default_value_t = 30)]
        every_s: u32,
        /// A mode.
        #[arg(long, value_enum, default_value_t = Mode::A)]
        mode: Mode,
        /// A switch.
        #[arg(long)]
        quiet: bool,
    }

    #[derive(Clone, Copy, clap::ValueEnum)]
    enum Mode {
        A,
        B,
    }

    #[test]
    fn a_table_names_each_flag_its_env_default_and_help() {
        use clap::CommandFactory;
        let table = flag_table(&Demo::command(), false);
        assert_eq!(
            table,
            "| flag | env | default | meaning |\n| --- | --- | --- | --- |\n\
             | `--every-s EVERY_S` | `DEMO_EVERY_S` | `30` | How often, in seconds. Second line. |\n\
             | `--mode a\\|b` |  | `a` | A mode. |\n\
             | `--quiet` |  |  | A switch. |\n"
        );
    }

    #[derive(clap::Parser)]
    #[command(name = "tool")]
    struct Tool {
        /// Configuration file.
        #[arg(long, global = true)]
        config: Option<String>,
        #[command(subcommand)]
        command: Sub,
    }

    #[derive(clap::Subcommand)]
    enum Sub {
        /// Check a file
        Check {
            /// The file.
            file: String,
            /// Be strict.
            #[arg(long)]
            strict: bool,
        },
    }

    #[test]
    fn a_reference_lists_each_subcommand_without_the_global_flags() {
        use clap::CommandFactory;
        let text = reference(&Tool::command());
        assert!(
            text.starts_with("| flag | env | default | meaning |"),
            "{text}"
        );
        assert!(
            text.contains("| `--config CONFIG` |  |  | Configuration file. |"),
            "{text}"
        );
        assert!(
            text.contains("#### `tool check`\n\nCheck a file.\n\n`tool check [OPTIONS] <FILE>`\n"),
            "{text}"
        );
        assert!(text.contains("| `--strict` |  |  | Be strict. |"), "{text}");
        assert_eq!(text.matches("--config").count(), 1, "{text}");
    }
}
