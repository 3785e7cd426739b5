//! The `central-authority` binary: parses flags, sets up logging, binds the
//! listeners and hands off to `central_authority::run`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use central_authority::Config;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(version = env!("REACH_VERSION"), about = "reach central authority")]
struct Cli {
    /// Configuration file (TOML).
    #[arg(long, env = "REACH_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Data directory (database, generated certificates); overrides
    /// `[server] data_dir`.
    #[arg(long, env = "REACH_DATA_DIR", global = true)]
    data_dir: Option<PathBuf>,
    /// Log format: `text` (colour codes only on a terminal) or `json` (one
    /// object per line). `RUST_LOG` filters (default `info`).
    #[arg(long, env = "REACH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a configuration file, print every error, exit non-zero if any.
    CheckConfig { file: PathBuf },
    /// Dry-run a configuration: validate it, then show per connector group
    /// the checks per cycle, cycle time and budget warnings, and with
    /// `--current` what the change adds and removes. Starts nothing.
    Plan {
        /// The new configuration.
        file: PathBuf,
        /// The configuration running now.
        #[arg(long)]
        current: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        format: LogFormat,
    },
    /// Use the CA's HTTP API: health, connectors, access, admin actions.
    /// Exit codes: 0 done (access: selected), 3 access refused, 1 error,
    /// 2 usage.
    Api(central_authority::tools::cli::ApiArgs),
    /// Convert the commercial product's application segments (JSON) into
    /// `[[segments]]` TOML. Exit codes: 0 everything carried over, 3 some
    /// fields or server groups not, 4 some segments not, 1 nothing imported.
    Import {
        /// The product's API output: an array, or a `{"list": [...]}` page.
        file: PathBuf,
        /// Map a server group (name or id) to a reach connector group.
        #[arg(long, value_name = "SERVER_GROUP=CONNECTOR_GROUP", value_parser = central_authority::tools::import::parse_group_map)]
        group_map: Vec<(String, String)>,
        /// Write the TOML here instead of to stdout.
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Back up a CA, also while it runs, into a new directory: the issuing
    /// root and its key and, with the SQLite store, a consistent copy of
    /// the database. A PostgreSQL store is dumped with pg_dump. Restore by
    /// copying the files into a new data directory.
    Backup {
        /// The directory to write (created with mode 0700).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Make a new issuing root for a root rotation: DIR/ca.pem and
    /// DIR/ca.key (mode 0600), never over existing files. Prints the
    /// root's fingerprint (as `api root` shows it).
    NewRoot {
        /// The directory to write into (created with mode 0700).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    if build_info::docs::reference_requested() {
        print!(
            "{}",
            build_info::docs::reference(&Cli::command().name("central-authority"))
        );
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(dir) = build_info::docs::requested() {
        build_info::docs::write(Cli::command().name("central-authority"), &dir)?;
        return Ok(ExitCode::SUCCESS);
    }
    let cli = Cli::parse();
    central_authority::init_logging(cli.log_format == LogFormat::Json);
    let path = match &cli.command {
        Some(Command::CheckConfig { file }) => file.clone(),
        Some(Command::Plan {
            file,
            current,
            format,
        }) => return Ok(plan(file, current.as_deref(), *format == LogFormat::Json)),
        Some(Command::Import {
            file,
            group_map,
            output,
        }) => return import(file, group_map, output.as_deref()),
        Some(Command::Api(args)) => return Ok(api(args).await),
        Some(Command::Backup { out }) => return Ok(backup(&cli, out)),
        Some(Command::NewRoot { out }) => return Ok(new_root(out)),
        None => match cli.config.clone() {
            Some(path) => path,
            None => return Ok(usage()),
        },
    };
    let config = match Config::load(&path) {
        Ok(mut config) => {
            if let Some(dir) = &cli.data_dir {
                config.settings.data_dir = dir.clone();
            }
            config
        }
        Err(e) => {
            e.messages().iter().for_each(|m| eprintln!("error: {m}"));
            eprintln!(
                "{}: configuration is invalid; {}",
                path.display(),
                build_info::hints::see(build_info::hints::CONFIG)
            );
            return Ok(ExitCode::FAILURE);
        }
    };
    if cli.command.is_some() {
        let s = &config.settings;
        if let Some(warning) = central_authority::credentials::pki::beyond_loopback_warning(
            s.tls_enabled,
            &s.tls,
            &[s.grpc_listen, s.http_listen],
            central_authority::credentials::host::HostIdentity::of_this_host,
        ) {
            eprintln!("warning: {warning}");
        }
        println!("{}: OK ({})", path.display(), config.summary());
        return Ok(ExitCode::SUCCESS);
    }
    let (grpc, http) = (config.settings.grpc_listen, config.settings.http_listen);
    let limits = &config.settings.limits;
    use central_authority::api::listen::{backlog, bind};
    let grpc = bind(grpc, backlog(limits.grpc_max_connections))
        .with_context(|| format!("binding gRPC on {grpc}"))?;
    let http = bind(http, backlog(limits.max_connections))
        .with_context(|| format!("binding HTTP on {http}"))?;
    central_authority::run(config, grpc, http, central_authority::terminated()).await?;
    Ok(ExitCode::SUCCESS)
}

/// `central-authority --config CA.toml backup --out DIR`.
fn backup(cli: &Cli, out: &Path) -> ExitCode {
    let Some(path) = &cli.config else {
        eprintln!("error: backup needs --config FILE (or REACH_CONFIG): the CA to back up");
        return ExitCode::from(2);
    };
    let Ok(mut config) = load_or_report(path) else {
        return ExitCode::FAILURE;
    };
    if let Some(dir) = &cli.data_dir {
        config.settings.data_dir = dir.clone();
    }
    match central_authority::tools::backup::run(&config, out) {
        Ok(done) => {
            done.files
                .iter()
                .for_each(|f| println!("wrote {}", f.display()));
            if let Some(store) = done.database_not_included {
                println!(
                    "the store is {store}: dump it with pg_dump as well (book: Operations, Backup and restore)"
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: backup failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `central-authority new-root --out DIR`.
fn new_root(out: &Path) -> ExitCode {
    match central_authority::tools::root::run(out) {
        Ok(made) => {
            println!("wrote {}", made.key.display());
            println!("wrote {}", made.cert.display());
            println!("fingerprint {}", made.fingerprint);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: new-root: {e}");
            ExitCode::FAILURE
        }
    }
}

/// No command and no `--config`: the usage on stderr, exit 2 (clap's code
/// for a usage error).
fn usage() -> ExitCode {
    let mut command = Cli::command().name("central-authority");
    eprintln!("error: run the CA with --config FILE (or REACH_CONFIG), or give a command\n");
    let _ = command.write_help(&mut std::io::stderr());
    ExitCode::from(2)
}

/// Loads a config, printing every error on stderr when it is invalid.
fn load_or_report(path: &Path) -> Result<Config, Vec<String>> {
    Config::load(path).map_err(|e| {
        let messages = e.messages();
        messages.iter().for_each(|m| eprintln!("error: {m}"));
        eprintln!(
            "{}: configuration is invalid; {}",
            path.display(),
            build_info::hints::see(build_info::hints::CONFIG)
        );
        messages
    })
}

fn plan(file: &Path, current: Option<&Path>, json: bool) -> ExitCode {
    let new = load_or_report(file);
    let old = current.map(|p| (p, load_or_report(p)));
    let (new, old) = match (new, old) {
        (Ok(new), None) => (new, None),
        (Ok(new), Some((p, Ok(old)))) => (new, Some((p, old))),
        (new, old) => {
            if json {
                let mut errors = new.err().unwrap_or_default();
                if let Some((p, Err(e))) = old {
                    errors.extend(e.into_iter().map(|m| format!("{}: {m}", p.display())));
                }
                let name = file.display().to_string();
                let _ =
                    stdout(&(central_authority::tools::plan::invalid_json(&name, &errors) + "\n"));
            }
            return ExitCode::FAILURE;
        }
    };
    let name = |p: &Path| p.display().to_string();
    let old = old.map(|(p, c)| (name(p), c));
    let report = central_authority::tools::plan::report(
        &name(file),
        &new,
        old.as_ref().map(|(p, c)| (p.as_str(), c)),
    );
    let text = if json {
        report.json() + "\n"
    } else {
        report.text()
    };
    match stdout(&text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::FAILURE,
    }
}

/// Writes to stdout; a closed pipe (`| head`) is an error, not a panic.
fn stdout(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    // `Stdout` locks per call; one `write_all` is one call.
    let mut out = std::io::stdout();
    out.write_all(text.as_bytes())?;
    out.flush()
}

fn import(
    file: &Path,
    group_map: &[(String, String)],
    output: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    use central_authority::tools::import;
    let options = import::Options::from_pairs(group_map).map_err(anyhow::Error::msg)?;
    let text =
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let imported = import::convert(&text, &options)
        .with_context(|| format!("importing {}", file.display()))?;
    imported.findings.iter().for_each(|f| eprintln!("{f}"));
    let toml = imported.toml(&file.display().to_string())?;
    match output {
        Some(path) => {
            std::fs::write(path, &toml).with_context(|| format!("writing {}", path.display()))?
        }
        None => stdout(&toml).context("writing to stdout")?,
    }
    let outcome = imported.outcome();
    eprintln!(
        "{}: {} segment(s) imported, {} finding(s); exit code {}",
        file.display(),
        imported.segments.len(),
        imported.findings.len(),
        outcome.exit_code()
    );
    Ok(ExitCode::from(outcome.exit_code()))
}

/// `central-authority api …`: the table or JSON on stdout, errors on stderr.
async fn api(args: &central_authority::tools::cli::ApiArgs) -> ExitCode {
    match central_authority::tools::cli::run(args).await {
        Ok((text, code)) => match stdout(&text) {
            Ok(()) => ExitCode::from(code),
            Err(_) => ExitCode::from(central_authority::tools::cli::EXIT_ERROR),
        },
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
