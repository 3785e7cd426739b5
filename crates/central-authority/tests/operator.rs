//! An operator's first hour with the real `central-authority` binary: the
//! usage without arguments, `check-config` showing every mistake of a file
//! at once, the book's demo commands (first-hour.md, "The demo") against
//! the demo config, and what
//! `central-authority api` prints (times, wildcard rows' ports, `--json`
//! anywhere, a path in `--url`).

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_central-authority");

fn root_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs the binary: (exit code, stdout, stderr).
async fn run(args: Vec<String>) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("REACH_CONFIG")
        .env_remove("REACH_API_TOKEN")
        .env_remove("REACH_API_URL");
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("run central-authority");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// `--url`, `--ca-cert` and `--token-file` for `ca` with `token`.
fn api_flags(ca: &Ca, token: &str) -> Vec<String> {
    let dir = scratch_dir("operator-cli");
    let cert = dir.join("ca.pem");
    std::fs::write(&cert, ca.root()).expect("write root");
    let token_file = dir.join("token");
    std::fs::write(&token_file, format!("{token}\n")).expect("write token");
    vec![
        "api".into(),
        "--url".into(),
        format!("https://{}", ca.http),
        "--ca-cert".into(),
        cert.display().to_string(),
        "--token-file".into(),
        token_file.display().to_string(),
    ]
}

#[tokio::test]
async fn no_arguments_prints_the_usage_and_exits_2() {
    let (code, out, err) = run(Vec::new()).await;
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("Usage: central-authority"), "{err}");
    assert!(
        err.contains("--config") && err.contains("check-config"),
        "{err}"
    );
}

#[tokio::test]
async fn check_config_shows_key_value_and_policy_mistakes_in_one_run() {
    let dir = scratch_dir("three-mistakes");
    let file = dir.join("ca.toml");
    std::fs::write(
        &file,
        r#"
[server]
grpc_listen = "127.0.0.1:7443"
http_lisen = "127.0.0.1:7480"

[selection]
strategy = "neareast"

[[connector_groups]]
name = "g"
provisioning_key = "key-g-apjEflVWTVON4JdN7kpnu3DA"

[[segments]]
name = "big"
applications = ["*.example.test"]
tcp_ports = ["1-11"]
connector_groups = ["g"]

[[segments]]
name = "small"
applications = ["small.example.test"]
tcp_ports = ["80"]
health_reporting = "continous"
connector_groups = ["g"]
"#,
    )
    .expect("write");
    let (code, out, err) = run(vec!["check-config".into(), file.display().to_string()]).await;
    assert_eq!(code, 1, "{out}{err}");
    for needle in [
        // TOML level: an unknown key, with its line.
        "line 4, column 1: unknown field `http_lisen`",
        "did you mean `http_listen`?",
        // Values.
        "health_reporting has unknown value \"continous\"",
        "did you mean \"continuous\"?",
        "selection.strategy: unknown strategy \"neareast\"",
        "did you mean \"nearest\"?",
        // A policy rule.
        "is not allowed with 11 ports (max 10)",
    ] {
        assert!(err.contains(needle), "{needle:?} missing in:\n{err}");
    }
}

/// The packaged configuration's listen addresses (every address) with no
/// `[tls] server_names`: valid, with a warning naming what the generated
/// server certificate will carry and the key to set; naming the CA's
/// names, or listening on loopback only, is quiet.
#[tokio::test]
async fn check_config_warns_when_the_ca_listens_beyond_loopback_without_server_names() {
    let dir = scratch_dir("beyond-loopback");
    let config = |listen: &str, tls: &str| {
        format!(
            "[server]\ngrpc_listen = \"{listen}:7443\"\nhttp_listen = \"{listen}:7480\"\n{tls}\n\
             [[connector_groups]]\nname = \"default\"\nprovisioning_key = \"key-default-aflNB8KzhbV0KCB5ZEUBtjWA\"\n"
        )
    };
    let check = |name: &str, text: String| {
        let file = dir.join(name);
        std::fs::write(&file, text).expect("write");
        run(vec!["check-config".into(), file.display().to_string()])
    };
    let (code, out, err) = check("packaged.toml", config("0.0.0.0", "")).await;
    assert_eq!(code, 0, "a warning is no error: {out}{err}");
    let host = std::process::Command::new("hostname")
        .output()
        .expect("hostname");
    let host = String::from_utf8_lossy(&host.stdout).trim().to_lowercase();
    for needle in [
        "warning: the CA listens on 0.0.0.0:7443 and 0.0.0.0:7480 beyond loopback",
        "add that name to [tls] server_names",
        &format!(", {host}"),
        "127.0.0.1",
    ] {
        assert!(err.contains(needle), "{needle:?} missing in:\n{err}");
    }
    for (name, text) in [
        (
            "named.toml",
            config(
                "0.0.0.0",
                "\n[tls]\nserver_names = [\"ca.example.internal\"]\n",
            ),
        ),
        ("loopback.toml", config("127.0.0.1", "")),
    ] {
        let (code, out, err) = check(name, text).await;
        assert_eq!(code, 0, "{name}: {out}{err}");
        assert!(!err.contains("warning"), "{name}: {err}");
    }
}

/// The `target/release/central-authority api …` commands of the book's demo
/// section (book/src/first-hour.md, continuation lines joined), as argument
/// lists after `api`.
fn readme_demo_commands() -> Vec<Vec<String>> {
    let path = root_dir().join("book/src/first-hour.md");
    let text = std::fs::read_to_string(&path).expect("book/src/first-hour.md");
    let demo = text
        .split_once("## The demo")
        .map(|(_, demo)| demo)
        .expect("first-hour.md has a section \"The demo\"");
    let mut commands = Vec::new();
    let mut lines = demo.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.strip_prefix("target/release/central-authority api ") else {
            continue;
        };
        let mut text = rest.to_owned();
        while text.ends_with('\\') {
            text.pop();
            text.push(' ');
            text.push_str(lines.next().unwrap_or_default());
        }
        commands.push(text.split_whitespace().map(str::to_owned).collect());
    }
    commands
}

/// `--ca-cert X` and `--token-file X` left out: the test passes its own.
fn without_files(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip = false;
    for a in args {
        if skip {
            skip = false;
        } else if a == "--ca-cert" || a == "--token-file" {
            skip = true;
        } else {
            out.push(a.clone());
        }
    }
    out
}

#[tokio::test]
async fn the_books_demo_commands_work_against_the_demo_config() {
    let demo = root_dir().join("deploy/examples/demo.toml");
    let text = std::fs::read_to_string(&demo).expect("demo.toml");
    let token = text
        .lines()
        .find_map(|l| l.strip_prefix("token = \""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("the demo's API token");
    let ca = Ca::start_file(&demo).await;
    // The connector `cargo xtask demo` runs, enrolled as the demo does.
    enroll(
        &ca.target(),
        "demo-connector-1",
        "demo",
        "demo-key-TxzGXOgRdffgQ2jA0xNgDJE7gsFbGpnAvivlYImmkYS",
    )
    .await
    .expect("the demo connector enrolls");
    let commands = readme_demo_commands();
    let admin = ["keys", "connectors"];
    assert!(
        commands
            .iter()
            .filter(|c| without_files(c)
                .first()
                .is_some_and(|w| admin.contains(&w.as_str())))
            .count()
            >= 2,
        "the book's demo section shows no admin commands: {commands:?}"
    );
    for command in &commands {
        let mut args = api_flags(&ca, token);
        args.extend(without_files(command));
        let (code, out, err) = run(args).await;
        // `access` is refused (no connector session here): exit 3.
        let expected = if command.contains(&"access".to_owned()) {
            3
        } else {
            0
        };
        assert_eq!(code, expected, "{command:?}:\n{out}{err}");
        assert!(!err.contains("403"), "{command:?}: {err}");
    }
    ca.stop().await;
}

/// The CLI given another CA's root says what the troubleshooting page's
/// entry says, naming the file.
#[tokio::test]
async fn the_cli_with_another_cas_root_names_the_file_to_fix() {
    let ca = Ca::start(&default_config()).await;
    let other = Ca::start(&default_config()).await;
    let mut args = api_flags(&ca, "unused-token-for-a-handshake-only");
    let dir = scratch_dir("operator-wrong-root");
    let wrong = dir.join("other-ca.pem");
    std::fs::write(&wrong, other.root()).expect("write root");
    let at = args
        .iter()
        .position(|a| a == "--ca-cert")
        .expect("--ca-cert")
        + 1;
    args[at] = wrong.display().to_string();
    args.push("connectors".into());
    let (code, out, err) = run(args).await;
    assert_ne!(code, 0, "{out}{err}");
    let hint = format!(
        "the CA's certificate does not chain to the root in {} (--ca-cert): check that the file is the CA's data_dir/ca.pem",
        wrong.display()
    );
    assert!(err.contains(&hint), "{err}");
    let see = build_info::hints::see(build_info::hints::CHAIN);
    assert!(err.contains(&see), "the hint names its entry: {err}");
    let page = std::fs::read_to_string(root_dir().join("book/src/troubleshooting.md"))
        .expect("troubleshooting.md");
    assert!(
        page.contains(&format!("## {}", build_info::hints::CHAIN)),
        "the troubleshooting page has the entry"
    );
    ca.stop().await;
    other.stop().await;
}

/// The book's command-line reference is the binary's own.
#[tokio::test]
async fn the_books_command_reference_is_the_binarys() {
    let (code, out, err) = run(strings(&["--generate-reference"])).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("#### `central-authority api health`"), "{out}");
    test_support::flags::check_generated(
        &root_dir().join("book/src/cli.md"),
        "central-authority commands",
        &out,
        "cargo test -p central-authority --test operator the_books_command_reference",
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// `YYYY-MM-DDTHH:MM:SSZ`.
fn is_rfc3339_utc(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 20
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

#[tokio::test]
async fn cli_prints_dates_wildcard_ports_and_takes_json_anywhere() {
    let ca = Ca::start(&config_text(
        "",
        "discovery_timeout_ms = 400",
        "[[api_tokens]]\nname = \"root\"\ntoken = \"tok-admin-PlQ7jmHXY1X2oyup1UokZXlp\"\nscopes = [\"admin\"]\n",
    ))
    .await;
    enroll(&ca.target(), "c1", "dc-east", KEY_EAST)
        .await
        .expect("enroll");
    let flags = api_flags(&ca, "tok-admin-PlQ7jmHXY1X2oyup1UokZXlp");
    let with = |more: &[&str]| {
        let mut args = flags.clone();
        args.extend(strings(more));
        args
    };
    let (code, _, err) = run(with(&["keys", "revoke", "dc-west"])).await;
    assert_eq!(code, 0, "{err}");

    // Keys: times as RFC 3339 UTC, never epoch milliseconds.
    let (code, out, err) = run(with(&["keys", "list"])).await;
    assert_eq!(code, 0, "{err}");
    let row = |group: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.starts_with(group))
            .unwrap_or_else(|| panic!("no {group} row in:\n{out}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    // GROUP USES EXPIRES_AT REVOKED_AT LAST_USED_AT USABLE
    let east = row("dc-east");
    assert!(is_rfc3339_utc(&east[4]), "last used: {east:?}\n{out}");
    let west = row("dc-west");
    assert!(is_rfc3339_utc(&west[3]), "revoked: {west:?}\n{out}");

    // `--json` after the command, as before it.
    let (code, out, err) = run(with(&["health", "--json"])).await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("--json after the command");
    let wildcard: Vec<&serde_json::Value> = v["applications"]
        .as_array()
        .expect("applications")
        .iter()
        .filter(|a| a["port"] == 0)
        .collect();
    assert!(!wildcard.is_empty(), "no wildcard or subnet row: {v}");

    // The table shows those rows' declared ports, not port 0.
    let (code, table, err) = run(with(&["health"])).await;
    assert_eq!(code, 0, "{err}");
    for a in wildcard {
        let host = a["host"].as_str().expect("host");
        let line = table
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(host))
            .unwrap_or_else(|| panic!("no {host} row in:\n{table}"));
        let ports = a["ports"].as_str().expect("ports of a wildcard row");
        assert!(line.contains(ports), "{line:?} lacks {ports:?}");
        assert_eq!(line.split_whitespace().nth(3), Some("tcp"), "{line:?}");
        assert!(!line.contains(" 0 "), "{line:?}");
    }
    ca.stop().await;
}

#[tokio::test]
async fn a_path_in_the_url_prefixes_every_api_path_and_a_query_is_refused() {
    // A proxy stand-in: answers one request and keeps its request line.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        let body = r#"{"applications":[]}"#;
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        String::from_utf8_lossy(&head).into_owned()
    });
    let (code, out, err) = run(strings(&[
        "api",
        "--url",
        &format!("http://{addr}/reach/"),
        "health",
    ]))
    .await;
    assert_eq!(code, 0, "{out}{err}");
    let head = server.join().expect("server");
    assert!(
        head.starts_with("GET /reach/api/v1/health HTTP/1.1\r\n"),
        "{head}"
    );

    let (code, _, err) = run(strings(&[
        "api",
        "--url",
        "http://127.0.0.1:1/reach?x=1",
        "health",
    ]))
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--url") && err.contains("query"), "{err}");
}
