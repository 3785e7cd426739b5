//! The configuration reference: one row per key of `ca.toml` (section, key,
//! type, default, allowed values, reload or restart, what it does), made
//! from each section's declaration in `file` (the segments' rows from
//! `policy::SegmentSpec`'s). The book's `configuration.md` is generated from
//! it; tests hold it to the parser (serde's keys and defaults, the bounds
//! enforced) and to `deploy/examples/ca.toml`.

use std::fmt::Write as _;

pub use super::declare::{Applies, Entry, KeyDefault};
use super::file;

/// How a section is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// `[name]`, once.
    Table,
    /// `[[name]]`, repeated; each needs a `name`.
    Array,
}

/// A section of the file.
#[derive(Clone, Copy, Debug)]
pub struct Section {
    /// Its name.
    pub name: &'static str,
    /// Table or array of tables.
    pub shape: Shape,
    /// One line on what it holds.
    pub about: &'static str,
    /// Its keys' rows, from its declaration.
    pub keys: fn() -> Vec<Entry>,
}

/// Every section, in the order the reference lists them.
#[rustfmt::skip]
pub const SECTIONS: &[Section] = &[
    Section { name: "server", shape: Shape::Table, about: "Listen addresses, the data directory, reloads.", keys: file::ServerSection::entries },
    Section { name: "store", shape: Shape::Table, about: "Where enrolled state lives: SQLite (default) or PostgreSQL.", keys: file::StoreSection::entries },
    Section { name: "replica", shape: Shape::Table, about: "How this process names itself among replicas sharing the store.", keys: file::ReplicaSection::entries },
    Section { name: "audit", shape: Shape::Table, about: "The audit trail of admin actions.", keys: file::AuditSection::entries },
    Section { name: "tls", shape: Shape::Table, about: "Certificates of both listeners and of connectors.", keys: file::TlsSection::entries },
    Section { name: "limits", shape: Shape::Table, about: "Bounds on what one peer may cost the CA.", keys: file::LimitsSection::entries },
    Section { name: "selection", shape: Shape::Table, about: "How a connector is chosen for an access.", keys: file::SelectionSection::entries },
    Section { name: "health", shape: Shape::Table, about: "Health checking: windows, rates, retention.", keys: file::HealthSection::entries },
    Section { name: "api_tokens", shape: Shape::Array, about: "Bearer tokens for the HTTP and gRPC APIs.", keys: file::TokenSection::entries },
    Section { name: "oidc", shape: Shape::Array, about: "OpenID providers people sign in with (the dashboard, `api login`).", keys: file::OidcSection::entries },
    Section { name: "connector_groups", shape: Shape::Array, about: "Groups of connectors and their provisioning keys.", keys: file::GroupSection::entries },
    Section { name: "segments", shape: Shape::Array, about: "Applications, their ports and how their health is known.", keys: segment_entries },
    Section { name: "log_receivers", shape: Shape::Array, about: "SIEM receivers the CA streams connector status, health transitions, access decisions and audit records to (Log streaming).", keys: file::ReceiverSection::entries },
];

/// Every key of every section, in the reference's order.
pub fn entries() -> Vec<Entry> {
    SECTIONS.iter().flat_map(|s| (s.keys)()).collect()
}

/// `[[segments]]`' keys. Their shape is `policy::SegmentSpec`, which the
/// policy crate declares for the connector and `check-config` alike; the
/// rows are held to it by `every_sections_keys_are_the_ones_serde_accepts`
/// and `documented_defaults_are_what_the_parser_fills_in`. A reload applies
/// every one.
#[rustfmt::skip]
fn segment_entries() -> Vec<Entry> {
    let value = |v: &str| KeyDefault::Value(v.to_owned());
    let absent = KeyDefault::Absent;
    let segment = |key, ty, default, values, about| Entry {
        section: "segments",
        key,
        ty,
        default,
        bounds: None,
        values,
        applies: Applies::Reload,
        about,
    };
    vec![
        segment("name", "string", absent("required"), "unique", "The segment's name."),
        segment("applications", "array of strings", value("[]"), "FQDN, IP, `*.wildcard`, CIDR", "The applications it covers."),
        segment("tcp_ports", "array of strings", value("[]"), "`80`, `8000-8100`", "TCP ports and ranges."),
        segment("udp_ports", "array of strings", value("[]"), "`53`, `5000-5100`", "UDP ports and ranges."),
        segment("health_reporting", "string", absent("`continuous`"), "`continuous`, `on_access`, `none`", "How health is known."),
        segment("report_interval_s", "integer", absent("60"), "", "Report interval."),
        segment("report_interval_ms", "integer", absent("`report_interval_s`"), "", "Finer interval in ms (tests, demos); wins."),
        segment("multimatch", "bool", value("false"), "", "Inclusive matching."),
        segment("client_hostname_validation", "bool", value("false"), "", "Hide from the health dashboard and API."),
        segment("connector_groups", "array of strings", value("[]"), "group names", "Groups serving the segment."),
        segment("rise", "integer", absent("1"), "", "Flap damping: reachable results in a row before Up."),
        segment("fall", "integer", absent("1"), "", "Flap damping: failed results in a row before Down."),
        segment("strategy", "string", absent("`[selection] strategy`"), "`healthy`, `group`, `nearest`", "This segment's selection strategy."),
        segment("check", "string", absent("`tcp`"), "`tcp`, `tls`, `http`, `https`", "What a TCP port's check does after the handshake (UDP ports: as always)."),
        segment("check_path", "string", absent("`/`"), "starts with `/`; `http`, `https` only", "The path of the check's `GET`."),
        segment("check_expect", "string", absent("`200-399`"), "`200,204,300-399` within 100-599; `http`, `https` only", "The statuses that count as Up."),
        segment("check_ca_file", "path", absent("no verification"), "PEM, 1+ certificates; `tls`, `https` only", "Roots the server's certificate is verified with (sent to connectors)."),
    ]
}

/// The reference as Markdown (the book's `configuration.md`).
pub fn markdown() -> String {
    let mut out = String::from(
        "<!-- Generated from crates/central-authority/src/config/reference.rs: \
         REACH_BLESS=1 cargo test -p central-authority --lib config::reference -->\n\n\
         # Configuration reference\n\n\
         The CA reads one TOML file (`central-authority --config ca.toml`); \
         `central-authority check-config ca.toml` lists every problem at once. \
         Unknown keys are errors. Edits are picked up without a restart (the file, \
         and the certificate and key files `[tls]` names, are polled; `kill -HUP` \
         also reloads), but for the keys whose Applies column says *restart*: \
         those are read once, at start, and a reload that changes them logs that \
         they take effect at the next start. `deploy/examples/ca.toml` shows every \
         key below.\n\n\
         The connector has no configuration file: its flags and environment \
         variables are listed by `connector-agent --help` and its man page.\n",
    );
    for s in SECTIONS {
        let header = match s.shape {
            Shape::Table => format!("[{}]", s.name),
            Shape::Array => format!("[[{}]]", s.name),
        };
        let _ = write!(
            out,
            "\n## `{header}`\n\n{}\n\n| Key | Type | Default | Allowed | Applies | Description |\n|---|---|---|---|---|---|\n",
            s.about
        );
        for entry in &(s.keys)() {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} | {} |",
                entry.key,
                entry.ty,
                default_text(&entry.default),
                allowed_text(entry),
                match entry.applies {
                    Applies::Restart => "restart",
                    Applies::Reload => "reload",
                },
                entry.about
            );
        }
    }
    out
}

fn default_text(d: &KeyDefault) -> String {
    match d {
        KeyDefault::Value(v) => format!("`{v}`"),
        KeyDefault::Absent(a) => (*a).to_owned(),
    }
}

fn allowed_text(entry: &Entry) -> String {
    let bounds = match entry.bounds {
        Some((lo, Some(hi))) => format!("{lo}–{hi}"),
        Some((lo, None)) => format!("≥ {lo}"),
        None => String::new(),
    };
    match (bounds.is_empty(), entry.values.is_empty()) {
        (true, _) => entry.values.to_string(),
        (false, true) => bounds,
        (false, false) => format!("{bounds}; {}", entry.values),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::super::{Config, ConfigError, Problem, file};
    use super::*;

    fn root() -> &'static Path {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
    }

    /// The names serde lists as expected after an unknown key in `text`.
    fn expected_keys(text: &str) -> BTreeSet<String> {
        let (_, errors) = file::read(text).expect("reads past the unknown key");
        let message = errors
            .first()
            .map(|e| e.message().to_string())
            .expect("the unknown key is an error");
        let list = message
            .split_once("expected one of ")
            .map(|(_, rest)| rest)
            .or_else(|| message.split_once("expected ").map(|(_, rest)| rest))
            .unwrap_or_else(|| panic!("no expected list in {message:?}"));
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    }

    /// The start of a section, for tests: arrays need a `name`.
    fn opening(s: &Section) -> String {
        match s.shape {
            Shape::Table => format!("[{}]\n", s.name),
            Shape::Array => format!("[[{}]]\nname = \"x\"\n", s.name),
        }
    }

    #[test]
    fn sections_are_the_files_tables() {
        let serde: BTreeSet<String> = expected_keys("zz_unknown = 1\n");
        let ours: BTreeSet<String> = SECTIONS.iter().map(|s| s.name.to_string()).collect();
        assert_eq!(serde, ours);
    }

    #[test]
    fn every_sections_keys_are_the_ones_serde_accepts() {
        for s in SECTIONS {
            let serde = expected_keys(&format!("{}zz_unknown = 1\n", opening(s)));
            let ours: BTreeSet<String> = entries()
                .iter()
                .filter(|e| e.section == s.name)
                .map(|e| e.key.to_string())
                .collect();
            assert_eq!(serde, ours, "keys of [{}]", s.name);
        }
    }

    #[test]
    fn documented_defaults_are_what_the_parser_fills_in() {
        let mut checked = 0;
        for entry in entries() {
            let KeyDefault::Value(value) = &entry.default else {
                continue;
            };
            let s = SECTIONS
                .iter()
                .find(|s| s.name == entry.section)
                .expect("its section is listed");
            let empty = file::read(&opening(s)).expect("empty section reads").0;
            let written = format!("{}{} = {value}\n", opening(s), entry.key);
            let (given, errors) = file::read(&written).expect("default reads");
            assert!(errors.is_empty(), "{written}: {errors:?}");
            assert_eq!(
                format!("{empty:?}"),
                format!("{given:?}"),
                "{}.{}: documented default {value} is not the parser's",
                entry.section,
                entry.key
            );
            checked += 1;
        }
        assert!(checked > 40, "only {checked} defaults checked");
    }

    fn problems(text: &str) -> Vec<Problem> {
        match Config::from_toml(text, Path::new("/tmp")) {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid(problems)) => problems,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    fn names_field(problems: &[Problem], field: &str) -> bool {
        problems
            .iter()
            .any(|p| matches!(p, Problem::Setting { field: f, .. } if f == field))
    }

    /// Every declared bound is enforced, at both ends, in every section
    /// (an array's entry is named by its `name`).
    #[test]
    fn documented_bounds_are_the_ones_enforced() {
        let mut checked = 0;
        for entry in entries() {
            let Some((lo, hi)) = entry.bounds else {
                continue;
            };
            let s = SECTIONS
                .iter()
                .find(|s| s.name == entry.section)
                .expect("its section is listed");
            let field = match s.shape {
                Shape::Table => format!("{}.{}", entry.section, entry.key),
                Shape::Array => format!("{} \"x\".{}", entry.section, entry.key),
            };
            let at = |v: u64| problems(&format!("{}{} = {v}\n", opening(s), entry.key));
            assert!(!names_field(&at(lo), &field), "{field} = {lo} refused");
            if lo > 0 {
                assert!(
                    names_field(&at(lo - 1), &field),
                    "{field} = {} taken",
                    lo - 1
                );
            }
            if let Some(hi) = hi {
                assert!(!names_field(&at(hi), &field), "{field} = {hi} refused");
                assert!(
                    names_field(&at(hi + 1), &field),
                    "{field} = {} taken",
                    hi + 1
                );
            }
            checked += 1;
        }
        assert!(checked > 50, "only {checked} bounds checked");
    }

    /// Keys each section of the example sets or shows commented out.
    fn example_keys(text: &str) -> BTreeSet<(String, String)> {
        let mut section = String::new();
        let mut keys = BTreeSet::new();
        for line in text.lines() {
            let line = line.trim_start_matches(['#', ' ']);
            if let Some(name) = line.strip_prefix('[') {
                let name = name.trim_start_matches('[');
                if let Some((name, _)) = name.split_once(']') {
                    section = name.to_string();
                }
                continue;
            }
            if let Some((key, _)) = line.split_once(" = ") {
                let key = key.trim();
                if key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                {
                    keys.insert((section.clone(), key.to_string()));
                }
            }
        }
        keys
    }

    #[test]
    fn the_example_shows_every_key() {
        let text = std::fs::read_to_string(root().join("deploy/examples/ca.toml"))
            .expect("read deploy/examples/ca.toml");
        let shown = example_keys(&text);
        let missing: Vec<String> = entries()
            .iter()
            .filter(|e| !shown.contains(&(e.section.to_string(), e.key.to_string())))
            .map(|e| format!("{}.{}", e.section, e.key))
            .collect();
        assert!(
            missing.is_empty(),
            "deploy/examples/ca.toml does not show {missing:?}"
        );
    }

    #[test]
    fn example_keys_sees_set_and_commented_keys() {
        let keys = example_keys("[a]\nx = 1\n# y = 2\n[[b]]\nz = 3 # w = 4\n");
        let want: BTreeSet<(String, String)> = [("a", "x"), ("a", "y"), ("b", "z")]
            .iter()
            .map(|(s, k)| (s.to_string(), k.to_string()))
            .collect();
        assert_eq!(keys, want);
    }

    /// `book/src/configuration.md` is what `markdown` generates
    /// (`REACH_BLESS=1` rewrites it).
    #[test]
    fn committed_reference_is_fresh() {
        let generated = markdown();
        let path = root().join("book/src/configuration.md");
        if std::env::var_os("REACH_BLESS").is_some() {
            std::fs::write(&path, &generated).expect("write book/src/configuration.md");
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "book/src/configuration.md is stale: run `REACH_BLESS=1 cargo test -p central-authority --lib config::reference` and commit it"
        );
    }
}
