//! The book's log reference (book/src/logs.md) is what the binaries log:
//! every row's message, level, target and fields are a `tracing` call of
//! that binary's source, and the lines a real CA run (the binary, with
//! `--log-format json`) writes for the rows it meets are as the row says.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::*;
use protocol::v1::authority_message::Kind as Out;
use test_support::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_central-authority");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One row of a table of logs.md.
#[derive(Debug)]
struct Row {
    message: String,
    level: String,
    targets: Vec<String>,
    /// (field, always present).
    fields: Vec<(String, bool)>,
}

impl Row {
    /// Whether `message` (as logged, or a source literal) is this row's.
    fn matches(&self, message: &str) -> bool {
        match self.message.strip_suffix('…') {
            Some(prefix) => message.starts_with(prefix.trim_end()),
            None => message == self.message,
        }
    }
}

/// The backticked words of a cell.
fn code(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The rows of logs.md's table under `### {binary}`.
fn rows(binary: &str) -> Vec<Row> {
    let text = std::fs::read_to_string(root().join("book/src/logs.md")).expect("logs.md");
    let section = text
        .split(&format!("### {binary}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("logs.md has no section {binary}"));
    let rows: Vec<Row> = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 4, "logs.md: {line}");
            Row {
                message: code(cells[0]).concat(),
                level: cells[1].to_owned(),
                targets: code(cells[2]),
                fields: code(cells[3])
                    .into_iter()
                    .map(|f| match f.strip_suffix('?') {
                        Some(f) => (f.to_owned(), false),
                        None => (f, true),
                    })
                    .collect(),
            }
        })
        .collect();
    assert!(rows.len() >= 15, "logs.md: too few rows for {binary}");
    rows
}

/// One `tracing::LEVEL!(…)` call of a crate's source.
#[derive(Debug)]
struct Call {
    level: String,
    target: String,
    message: String,
    fields: BTreeSet<String>,
}

/// The top-level, comma-separated arguments of a macro call's body.
fn arguments(body: &str) -> Vec<String> {
    let (mut out, mut current, mut depth, mut quoted, mut escaped) =
        (Vec::new(), String::new(), 0i32, false, false);
    for c in body.chars() {
        if quoted {
            current.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut current).trim().to_owned());
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    out.push(current.trim().to_owned());
    out.retain(|a| !a.is_empty());
    out
}

/// The body of the call whose parenthesis opens just before `text`.
fn body(text: &str) -> &str {
    let (mut depth, mut quoted, mut escaped) = (1, false, false);
    for (i, c) in text.char_indices() {
        if quoted {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &text[..i];
                }
            }
            _ => {}
        }
    }
    text
}

/// A string literal's text: escapes undone, `\` line continuations joined.
fn literal(arg: &str) -> String {
    let inner = &arg[1..arg.len().saturating_sub(1)];
    let mut out = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.next_if(|_| c == '\\')) {
            ('\\', Some('\n')) => while chars.next_if(|c| c.is_whitespace()).is_some() {},
            ('\\', Some(e)) => out.push(e),
            (c, _) => out.push(c),
        }
    }
    out
}

/// Every `tracing` call outside the tests of the crate in `dir` (crate
/// name `krate`), with the target its module gives it.
fn calls(dir: &str, krate: &str) -> Vec<Call> {
    let src = root().join(dir).join("src");
    let mut out = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            let module = path
                .strip_prefix(&src)
                .expect("under src")
                .with_extension("");
            let mut parts: Vec<String> = module
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .filter(|p| !["mod", "lib", "main"].contains(&p.as_str()))
                .collect();
            parts.insert(0, krate.to_owned());
            for level in ["trace", "debug", "info", "warn", "error"] {
                let open = format!("tracing::{level}!(");
                for (at, _) in text.match_indices(&open) {
                    out.push(call(
                        level,
                        &parts.join("::"),
                        body(&text[at + open.len()..]),
                    ));
                }
            }
        }
    }
    out
}

fn call(level: &str, module: &str, body: &str) -> Call {
    let mut call = Call {
        level: level.to_uppercase(),
        target: module.to_owned(),
        message: String::new(),
        fields: BTreeSet::new(),
    };
    for arg in arguments(body) {
        if arg.starts_with('"') {
            call.message = literal(&arg);
            break;
        }
        if let Some(target) = arg.strip_prefix("target:") {
            call.target = literal(target.trim());
            continue;
        }
        let name: String = arg
            .trim_start_matches(['%', '?'])
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.')
            .collect();
        call.fields.insert(name);
    }
    call
}

/// Every row of `binary`'s table is a call of its source: each target it
/// names has one with that message and level, their fields are the row's
/// (a `?` field in some of them, the others in all).
fn check_source(binary: &str, dir: &str, krate: &str) {
    let calls = calls(dir, krate);
    for row in rows(binary) {
        let matching: Vec<&Call> = calls.iter().filter(|c| row.matches(&c.message)).collect();
        assert!(
            !matching.is_empty(),
            "logs.md: no {binary} line {:?}",
            row.message
        );
        for target in &row.targets {
            assert!(
                matching
                    .iter()
                    .any(|c| &c.target == target && c.level == row.level),
                "logs.md: {:?} is not logged at {} with target {target} by {binary}: {matching:?}",
                row.message,
                row.level
            );
        }
        let documented: BTreeSet<String> = row.fields.iter().map(|(f, _)| f.clone()).collect();
        let logged: BTreeSet<String> = matching.iter().flat_map(|c| c.fields.clone()).collect();
        assert_eq!(logged, documented, "logs.md: fields of {:?}", row.message);
        for (field, always) in &row.fields {
            assert!(
                !always || matching.iter().all(|c| c.fields.contains(field)),
                "logs.md: {field} of {:?} is not in every such line",
                row.message
            );
        }
    }
}

/// A field named `message` replaces the line's message in JSON (the
/// object keeps the last key of a name): no line has one.
#[test]
fn no_line_has_a_field_named_message() {
    for (dir, krate) in [
        ("crates/central-authority", "central_authority"),
        ("crates/connector-agent", "connector_agent"),
    ] {
        let calls = calls(dir, krate);
        assert!(calls.len() > 50, "the scan found too few calls in {dir}");
        for c in calls {
            assert!(!c.fields.contains("message"), "{c:?}");
        }
    }
}

#[test]
fn every_line_of_the_log_reference_is_in_the_source_as_documented() {
    check_source(
        "central-authority",
        "crates/central-authority",
        "central_authority",
    );
    check_source(
        "connector-agent",
        "crates/connector-agent",
        "connector_agent",
    );
}

/// The CA binary's JSON lines of a run with an enrollment, a session, a
/// refused access, a refused admin action, a reload and a shutdown.
async fn a_run() -> String {
    let dir = scratch_dir("logs");
    let path = dir.join("ca.toml");
    let (grpc, http) = (free_port().expect("port"), free_port().expect("port"));
    let config = |extra: &str| {
        config_text("", "discovery_timeout_ms = 400", extra)
            .replace(
                "grpc_listen = \"127.0.0.1:0\"",
                &format!("grpc_listen = \"127.0.0.1:{grpc}\""),
            )
            .replace(
                "http_listen = \"127.0.0.1:1\"",
                &format!("http_listen = \"127.0.0.1:{http}\""),
            )
            .replace("reload_poll_ms = 50", "reload_poll_ms = 600000")
    };
    std::fs::write(&path, config("")).expect("write");
    let child = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .args(["--log-format", "json"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id().to_string();
    let root_path = dir.join("reach-ca-data").join("ca.pem");
    eventually("the CA listens", || async {
        root_path.exists()
            && tokio::net::TcpStream::connect(("127.0.0.1", http))
                .await
                .is_ok()
            && tokio::net::TcpStream::connect(("127.0.0.1", grpc))
                .await
                .is_ok()
    })
    .await;
    let root = std::fs::read_to_string(&root_path).expect("root");
    let web = Http::new(format!("127.0.0.1:{http}").parse().expect("addr"), &root);
    let target = Target {
        grpc: format!("127.0.0.1:{grpc}").parse().expect("addr"),
        root,
    };
    let mut east = open(&target, "east-1", "dc-east", KEY_EAST)
        .await
        .expect("authenticated");
    assert!(matches!(east.next().await, Some(Out::Welcome(_))));
    east.trust_bundle().await;
    let (_, refused) = web.access("nowhere.test.reach", "tcp", 80).await;
    assert!(refused["connector"].is_null(), "{refused}");
    let (status, _) = web
        .send(
            "POST",
            "/api/v1/connectors/east-1/disable",
            Some(READ_TOKEN),
            None,
        )
        .await;
    assert_eq!(status, 403, "a read token cannot disable");
    let added = segment("added")
        .apps(["added.test.reach"])
        .tcp(["80"])
        .mode("none")
        .groups(["dc-east"])
        .toml();
    std::fs::write(&path, config(&added)).expect("write");
    let kill = |signal: &str| {
        let status = Command::new("kill")
            .args([signal, &pid])
            .status()
            .expect("kill");
        assert!(status.success());
    };
    kill("-HUP");
    assert!(matches!(east.next().await, Some(Out::PolicyUpdate(_))));
    kill("-TERM");
    assert!(matches!(east.next().await, Some(Out::Shutdown(_))));
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("wait");
    assert!(out.status.success(), "{out:?}");
    let _ = std::fs::remove_dir_all(dir);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn the_cas_json_lines_are_as_the_log_reference_says() {
    let logs = a_run().await;
    let rows = rows("central-authority");
    let mut met = BTreeSet::new();
    for line in logs.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        let fields = v["fields"].as_object().expect("fields");
        let message = fields["message"].as_str().expect("message");
        let Some(row) = rows.iter().find(|r| r.matches(message)) else {
            continue;
        };
        met.insert(row.message.clone());
        assert_eq!(v["level"], row.level.as_str(), "{line}");
        assert!(
            row.targets.iter().any(|t| v["target"] == t.as_str()),
            "{line}"
        );
        let logged: BTreeSet<&str> = fields
            .keys()
            .map(String::as_str)
            .filter(|k| *k != "message")
            .collect();
        let documented: BTreeSet<&str> = row.fields.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(logged, documented, "{line}");
    }
    for expected in [
        "generated the CA's root certificate",
        "issued the TLS server certificate from the root",
        "store opened",
        "central authority listening",
        "policy update pushed",
        "connector enrolled",
        "connector connected",
        "access refused",
        "admin action",
        "configuration reloaded",
        "session closed",
        "central authority stopped",
    ] {
        assert!(
            met.contains(expected),
            "the run logged no {expected:?}:\n{logs}"
        );
    }
}
