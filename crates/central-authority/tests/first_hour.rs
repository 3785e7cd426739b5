//! The book's "Your first hour" (book/src/first-hour.md, sections 1–6) run
//! as written, from the chapter's own text: its `toml` block becomes
//! `ca.toml`, its `sh` blocks run one command after the other in one shell
//! of an unprivileged operator (`nobody`), in a scratch directory, with the
//! workspace's `central-authority` and `connector-agent` (copies) first on
//! the PATH. Editing the chapter changes what runs here.
//!
//! What a reader does by eye, the test asserts: `check-config` exits 0; the
//! health line the chapter shows appears once the connector reported;
//! `api access` selects `c1`, then refuses (exit 3) once the application is
//! stopped and `c1` reported it down; the revoke succeeds, the connector
//! logs "re-enrollment needed", `api audit` names the revoke and who did
//! it; enrolling again with the same flags brings `c1` back.
//!
//! The adaptations, each in one place below and nothing else:
//! - the chapter's fixed ports (7443, 7480, 8080) become free loopback
//!   ports, replaced as whole words in the extracted blocks only
//!   ([`on_free_ports`]); the API client's default URL names port 7480, so
//!   the operator's shell has `REACH_API_URL` for the replaced port;
//! - a background command (`… &`) logs to a file of its own and is killed
//!   at the end; the connector, which the chapter runs in the foreground
//!   and then continues in a second terminal, runs so too
//!   ([`second_terminal`]);
//! - a block of `sudo` commands runs as root without `sudo` (the test runs
//!   as root; the operator's shell cannot escalate);
//! - "stop the application" (prose) is a SIGTERM to the chapter's
//!   application, the `# the application` job.
//!
//! The setcap path of section 3 is the one taken (the `sysctl` line is a
//! comment there), on the copy of `connector-agent`, and the connector must
//! then report a raw ICMP socket. The test fails naming what is missing
//! when it cannot play the unprivileged operator (not root, no `setpriv`,
//! no `nobody`/`nogroup`, no `python3` for the application).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

const CA_BIN: &str = env!("CARGO_BIN_EXE_central-authority");
/// The unprivileged operator: user and group.
const OPERATOR: (&str, &str) = ("nobody", "nogroup");
/// The operator's PATH after the directory of the copied binaries.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long a change may take to show: the chapter's `report_interval_s =
/// 10`, several times over on a busy machine.
const REPORT_DEADLINE: Duration = Duration::from_secs(40);
/// Longest one foreground command may run (the API client's own timeout
/// is 30 s).
const COMMAND_DEADLINE: Duration = Duration::from_secs(60);
/// The line the shell prints after each command, with its exit code.
const DONE: &str = "@@first-hour-done";
/// The line the shell prints after starting a background command, with
/// its pid.
const STARTED: &str = "@@first-hour-started";

fn chapter() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../book/src/first-hour.md");
    std::fs::read_to_string(&path).expect("book/src/first-hour.md")
}

/// The text of section `n` ("## n. …") up to the next heading.
fn section(text: &str, n: u8) -> &str {
    let start = format!("\n## {n}. ");
    let (_, rest) = text
        .split_once(&start)
        .unwrap_or_else(|| panic!("first-hour.md has no section \"## {n}. \""));
    rest.split_once("\n## ").map_or(rest, |(body, _)| body)
}

/// The fenced blocks of language `lang` in `text`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some((_, after)) = rest.split_once(&fence) {
        let (block, tail) = after.split_once("```").expect("an unclosed code block");
        out.push(block.to_owned());
        rest = tail;
    }
    out
}

/// The commands of an `sh` block: continuation lines joined, comment-only
/// and empty lines left out.
fn commands(block: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = block.lines();
    while let Some(line) = lines.next() {
        let mut command = line.trim().to_owned();
        while command.ends_with('\\') {
            command.pop();
            command.push(' ');
            command.push_str(lines.next().unwrap_or_default().trim());
        }
        if !command.is_empty() && !command.starts_with('#') {
            out.push(command);
        }
    }
    out
}

/// The inline code spans of `text` (outside fenced blocks).
fn inline_code(text: &str) -> Vec<String> {
    let mut prose = String::new();
    for (i, part) in text.split("```").enumerate() {
        if i % 2 == 0 {
            prose.push_str(part);
        }
    }
    prose
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// A command without its trailing comment.
fn without_comment(command: &str) -> &str {
    command.split_once(" #").map_or(command, |(c, _)| c).trim()
}

/// The loopback ports the test uses instead of the chapter's.
struct Ports {
    grpc: u16,
    http: u16,
    app: u16,
}

impl Ports {
    fn free() -> Self {
        let port = || test_support::net::free_port().expect("a free loopback port");
        Ports {
            grpc: port(),
            http: port(),
            app: port(),
        }
    }
}

/// `text` with the chapter's ports 7443 (gRPC), 7480 (HTTP) and 8080 (the
/// application) replaced, as whole numbers only, by `ports`.
fn on_free_ports(text: &str, ports: &Ports) -> String {
    let mut out = text.to_owned();
    for (fixed, free) in [
        ("7443", ports.grpc),
        ("7480", ports.http),
        ("8080", ports.app),
    ] {
        out = replace_number(&out, fixed, &free.to_string());
    }
    out
}

fn replace_number(text: &str, number: &str, by: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(number) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + number.len()..].chars().next();
        out.push_str(&rest[..at]);
        let whole = !before.is_some_and(|c| c.is_ascii_digit())
            && !after.is_some_and(|c| c.is_ascii_digit());
        out.push_str(if whole { by } else { number });
        rest = &rest[at + number.len()..];
    }
    out.push_str(rest);
    out
}

/// Whether the chapter runs `command` in the foreground for good (the
/// connector) and goes on in a second terminal: the test runs it in the
/// background.
fn second_terminal(command: &str) -> bool {
    command.starts_with("connector-agent ") && !without_comment(command).ends_with(" enroll")
}

/// Fails naming what is missing unless the test can play the operator.
fn preconditions() {
    assert!(
        test_support::caps::is_root(),
        "the first-hour test plays an unprivileged operator ({}) and runs the \
         chapter's sudo steps: it must run as root",
        OPERATOR.0
    );
    let has = |db: &str, name: &str| {
        Command::new("getent")
            .args([db, name])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    assert!(
        has("passwd", OPERATOR.0) && has("group", OPERATOR.1),
        "the first-hour test runs the operator as user {} group {}: missing \
         on this machine (getent)",
        OPERATOR.0,
        OPERATOR.1
    );
    assert!(
        Command::new("setpriv").arg("--version").output().is_ok(),
        "setpriv (util-linux) is missing: the first-hour test drops to the \
         unprivileged operator with it"
    );
}

/// The connector binary of this build (profile and target directory of
/// `central-authority`'s), built now (with the rest of the workspace's test
/// build) so it is never stale.
fn connector_agent_bin() -> PathBuf {
    let profile_dir = Path::new(CA_BIN).parent().expect("the binary's directory");
    let target = profile_dir.parent().expect("the target directory");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    let mut cargo = Command::new(env!("CARGO"));
    // What cargo sets for this test process would be tracked inputs of
    // that build (`env!("OUT_DIR")`, `REACH_VERSION`), and differ from a
    // plain `cargo build`'s: each would rebuild what the other built.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if ["OUT_DIR", "REACH_VERSION"].contains(&name.as_ref())
            || [
                "CARGO_PKG_",
                "CARGO_MANIFEST_",
                "CARGO_BIN_EXE_",
                "CARGO_CRATE_",
            ]
            .iter()
            .any(|p| name.starts_with(p))
        {
            cargo.env_remove(name.as_ref());
        }
    }
    // The workspace's test build (what `cargo test --workspace` and so CI
    // run): within that run it is fresh and builds nothing, where a build
    // of `-p connector-agent` alone unified other features and compiled
    // its dependencies a second time.
    cargo
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["test", "--workspace", "--no-run", "--quiet", "--target-dir"])
        .arg(target);
    if profile != "dev" {
        cargo.args(["--profile", profile]);
    }
    let out = cargo
        .output()
        .expect("running cargo to build connector-agent");
    assert!(
        out.status.success(),
        "building connector-agent failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    profile_dir.join("connector-agent")
}

/// A fresh directory owned by the operator, with copies of the binaries in
/// `bin/` (owned by root: the operator cannot alter the file whose
/// capability section 3 sets).
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("reach-first-hour-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("scratch dir");
    std::fs::copy(CA_BIN, bin.join("central-authority")).expect("copy central-authority");
    std::fs::copy(connector_agent_bin(), bin.join("connector-agent"))
        .expect("copy connector-agent");
    chown(&dir);
    dir
}

fn chown(path: &Path) {
    let status = Command::new("chown")
        .arg(format!("{}:{}", OPERATOR.0, OPERATOR.1))
        .arg(path)
        .status()
        .expect("running chown");
    assert!(status.success(), "chown {}", path.display());
}

/// A command started with `&`: its text as the chapter has it, its pid
/// and the file it logs to.
struct Job {
    command: String,
    pid: u32,
    log: PathBuf,
}

/// The operator's shell: `sh` as the unprivileged user, in the scratch
/// directory, fed one command at a time.
struct Operator {
    dir: PathBuf,
    path: String,
    shell: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    jobs: Vec<Job>,
}

impl Operator {
    fn start(dir: &Path, ports: &Ports) -> Self {
        let path = format!("{}:{SYSTEM_PATH}", dir.join("bin").display());
        let mut shell = Command::new("setpriv")
            .arg(format!("--reuid={}", OPERATOR.0))
            .arg(format!("--regid={}", OPERATOR.1))
            .args(["--clear-groups", "--inh-caps=-all", "sh", "-s"])
            .current_dir(dir)
            .env_clear()
            .env("PATH", &path)
            .env("HOME", dir)
            .env("REACH_API_URL", format!("https://127.0.0.1:{}", ports.http))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the operator's shell with setpriv");
        let stdin = shell.stdin.take().expect("shell stdin");
        let stdout = shell.stdout.take().expect("shell stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut op = Operator {
            dir: dir.to_owned(),
            path,
            shell,
            stdin,
            lines,
            jobs: Vec::new(),
        };
        op.send("exec 2>&1");
        op
    }

    fn send(&mut self, script: &str) {
        writeln!(self.stdin, "{script}").expect("writing to the operator's shell");
    }

    /// Reads the shell's output up to the line starting with `marker`:
    /// (the rest of that line, the output before it).
    fn until(&mut self, marker: &str, command: &str) -> (String, String) {
        let deadline = Instant::now() + COMMAND_DEADLINE;
        let mut output = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => match line.strip_prefix(marker) {
                    Some(rest) => return (rest.trim().to_owned(), output),
                    None => {
                        output.push_str(&line);
                        output.push('\n');
                    }
                },
                Err(RecvTimeoutError::Timeout) => {
                    panic!("`{command}` did not finish in {COMMAND_DEADLINE:?}:\n{output}")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("the operator's shell ended during `{command}`:\n{output}")
                }
            }
        }
    }

    /// Runs a foreground command: (exit code, output).
    fn run(&mut self, command: &str) -> (i32, String) {
        self.send(&format!("{command}\nprintf '\\n%s %s\\n' {DONE} \"$?\""));
        let (code, output) = self.until(DONE, command);
        let code = code.parse().expect("an exit code");
        (code, output.trim_start_matches('\n').to_owned())
    }

    /// Runs a command that must succeed; its output.
    fn ok(&mut self, command: &str) -> String {
        let (code, output) = self.run(command);
        assert_eq!(code, 0, "`{command}` failed:\n{output}");
        output
    }

    /// Starts `command` in the background, logging to a file of its own.
    fn background(&mut self, command: &str) -> usize {
        let body = without_comment(command).trim_end_matches('&').trim();
        let log = self.dir.join(format!("job-{}.log", self.jobs.len() + 1));
        self.send(&format!(
            "{body} > {} 2>&1 &\necho {STARTED} $!",
            log.display()
        ));
        let (pid, _) = self.until(STARTED, command);
        let pid = pid.parse().expect("a pid");
        self.jobs.push(Job {
            command: command.to_owned(),
            pid,
            log,
        });
        self.jobs.len() - 1
    }

    /// Runs each command of a block: `&` and [`second_terminal`] ones in
    /// the background, the others in the foreground, which must succeed.
    /// A block of `sudo` commands runs as root without `sudo`.
    fn block(&mut self, commands: &[String]) -> Vec<(String, String)> {
        let sudo: Vec<&str> = commands
            .iter()
            .filter_map(|c| c.strip_prefix("sudo "))
            .collect();
        if !sudo.is_empty() {
            assert_eq!(
                sudo.len(),
                commands.len(),
                "a block mixes sudo and the operator's commands: {commands:?}"
            );
            return sudo.iter().map(|c| self.as_root(c)).collect();
        }
        let mut outputs = Vec::new();
        for command in commands {
            if without_comment(command).ends_with('&') || second_terminal(command) {
                self.background(command);
            } else {
                let output = self.ok(command);
                outputs.push((command.clone(), output));
            }
        }
        outputs
    }

    fn as_root(&self, command: &str) -> (String, String) {
        let out = Command::new("sh")
            .args(["-c", command])
            .current_dir(&self.dir)
            .env("PATH", &self.path)
            .output()
            .expect("running sh as root");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "`sudo {command}` failed:\n{text}");
        (command.to_owned(), text)
    }

    /// The background job whose command contains `needle`.
    fn job(&self, needle: &str) -> &Job {
        self.jobs
            .iter()
            .find(|j| j.command.contains(needle))
            .unwrap_or_else(|| panic!("no background command with {needle:?}"))
    }

    fn log(&self, needle: &str) -> String {
        std::fs::read_to_string(&self.job(needle).log).unwrap_or_default()
    }

    /// Every background command with its log, for a failure message.
    fn logs(&self) -> String {
        let mut out = String::new();
        for job in &self.jobs {
            let log = std::fs::read_to_string(&job.log).unwrap_or_default();
            out.push_str(&format!("--- `{}` (pid {}):\n{log}", job.command, job.pid));
        }
        out
    }

    fn stop(&mut self, needle: &str) {
        let pid = self.job(needle).pid;
        terminate(pid);
        self.jobs.retain(|j| j.pid != pid);
    }
}

fn terminate(pid: u32) {
    let _ = Command::new("kill").arg(pid.to_string()).status();
}

impl Drop for Operator {
    fn drop(&mut self) {
        for job in &self.jobs {
            terminate(job.pid);
        }
        let _ = self.shell.kill();
        let _ = self.shell.wait();
    }
}

/// Runs `command` until `done(code, output)` holds; panics naming `what`
/// with the last output after [`REPORT_DEADLINE`].
fn poll(op: &mut Operator, command: &str, what: &str, done: impl Fn(i32, &str) -> bool) -> String {
    let deadline = Instant::now() + REPORT_DEADLINE;
    loop {
        let (code, output) = op.run(command);
        if done(code, &output) {
            return output;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {REPORT_DEADLINE:?}; `{command}` exited {code}:\n{output}\n{}",
            op.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether `output` has a line whose words are `words`.
fn has_line(output: &str, words: &str) -> bool {
    let words: Vec<&str> = words.split_whitespace().collect();
    output
        .lines()
        .any(|l| l.split_whitespace().collect::<Vec<_>>() == words)
}

/// The line of `output` whose first word is `first`, as words.
fn row<'a>(output: &'a str, first: &str) -> Vec<&'a str> {
    output
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.first() == Some(&first))
        .unwrap_or_default()
}

/// The commands of the `sh` blocks of section `n`, on the test's ports.
fn section_blocks(text: &str, n: u8, ports: &Ports) -> Vec<Vec<String>> {
    blocks(section(text, n), "sh")
        .iter()
        .map(|b| commands(&on_free_ports(b, ports)))
        .collect()
}

#[test]
fn the_first_hour_runs_as_written() {
    preconditions();
    let text = chapter();
    let ports = Ports::free();
    let dir = scratch();

    // Section 1, a CA: the chapter's ca.toml.
    let toml = blocks(section(&text, 1), "toml");
    assert_eq!(toml.len(), 1, "section 1 has one toml block");
    std::fs::write(dir.join("ca.toml"), on_free_ports(&toml[0], &ports)).expect("ca.toml");
    chown(&dir.join("ca.toml"));
    let mut op = Operator::start(&dir, &ports);
    let (code, _) = op.run("command -v python3");
    assert_eq!(
        code, 0,
        "python3 is not on the operator's PATH ({SYSTEM_PATH}): the chapter's application needs it"
    );

    step_2(&mut op, &text, &ports);
    let connector = step_3(&mut op, &text, &ports);
    step_4(&mut op, &text, &ports);
    step_5(&mut op, &text, &ports);
    step_6(&mut op, &text, &ports, &connector);
    drop(op);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Section 2, a key and a token: the CA and the application start, check-config
/// passes.
fn step_2(op: &mut Operator, text: &str, ports: &Ports) {
    for block in section_blocks(text, 2, ports) {
        for (command, output) in op.block(&block) {
            if command.contains("check-config") {
                assert!(output.contains("OK"), "`{command}`:\n{output}");
            }
        }
    }
    op.job("central-authority --config");
    op.job("# the application");
    // The operator sees the CA start before going on.
    let ca_pem = op.dir.join("ca-data/ca.pem");
    let deadline = Instant::now() + REPORT_DEADLINE;
    while !ca_pem.exists() {
        assert!(
            Instant::now() < deadline,
            "the CA wrote no ca-data/ca.pem:\n{}",
            op.log("central-authority --config")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Section 3, the connector as the operator, after the chapter's setcap; returns
/// the connector's command.
fn step_3(op: &mut Operator, text: &str, ports: &Ports) -> String {
    let blocks = section_blocks(text, 3, ports);
    for block in &blocks {
        op.block(block);
    }
    let connector = blocks
        .iter()
        .flatten()
        .find(|c| second_terminal(c))
        .expect("section 3 starts connector-agent")
        .clone();
    assert!(
        connector.contains("--name c1"),
        "the connector is c1: {connector}"
    );
    connector
}

/// Section 4, the application Up: the chapter's health line appears; the
/// unprivileged connector has its raw ICMP socket.
fn step_4(op: &mut Operator, text: &str, ports: &Ports) {
    let body = section(text, 4);
    let expected = inline_code(body)
        .into_iter()
        .find(|c| c.starts_with("web "))
        .map(|c| on_free_ports(&c, ports))
        .expect("section 4 shows the health line");
    let mut health = None;
    for block in section_blocks(text, 4, ports) {
        op.block(&block);
        health = health.or(block.into_iter().find(|c| c.ends_with("api health")));
    }
    let health = health.expect("section 4 runs `api health`");
    poll(op, &health, "the application Up", |code, out| {
        code == 0 && has_line(out, &expected)
    });
    let log = op.log("connector-agent");
    assert!(
        log.lines()
            .any(|l| l.contains("probes ready") && l.contains("raw")),
        "the connector, unprivileged after setcap, has no raw ICMP socket:\n{log}"
    );
}

/// Section 5, an access: c1 selected, then refused once the application stopped.
fn step_5(op: &mut Operator, text: &str, ports: &Ports) {
    let blocks = section_blocks(text, 5, ports);
    let access = blocks
        .iter()
        .flatten()
        .find(|c| c.contains(" api access "))
        .expect("section 5 runs `api access`")
        .clone();
    for block in &blocks {
        for (_, output) in op.block(block) {
            assert!(
                output.contains("selected: connector c1") && row(&output, "c1").contains(&"yes"),
                "`{access}` selects c1 and shows it eligible:\n{output}"
            );
        }
    }
    op.stop("# the application");
    let refused = poll(
        op,
        &access,
        "the refusal once c1 reports down",
        |code, _| code == 3,
    );
    assert!(refused.starts_with("refused"), "{refused}");
    let c1 = row(&refused, "c1");
    assert!(
        c1.contains(&"down") && c1.contains(&"no"),
        "c1 down and not eligible:\n{refused}"
    );
}

/// Section 6, a revoke: the connector learns it, the audit names it, and enrolling
/// again with the same flags brings c1 back.
fn step_6(op: &mut Operator, text: &str, ports: &Ports, connector: &str) {
    for block in section_blocks(text, 6, ports) {
        op.block(&block);
    }
    let deadline = Instant::now() + REPORT_DEADLINE;
    while !op.log("connector-agent").contains("re-enrollment needed") {
        assert!(
            Instant::now() < deadline,
            "the connector did not log \"re-enrollment needed\":\n{}",
            op.log("connector-agent")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let code = inline_code(section(text, 6));
    let audit = code
        .iter()
        .find(|c| c.starts_with("central-authority api audit"))
        .expect("section 6 names `central-authority api audit`");
    let out = op.ok(audit);
    assert!(
        out.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.contains(&"connector.revoke") && w.contains(&"c1") && w.contains(&"token:me")
        }),
        "`{audit}` shows the revoke of c1 by token me:\n{out}"
    );
    // Bring it back: stop it, `connector-agent … enroll` with the same
    // flags, start it again.
    assert!(code.iter().any(|c| c == "connector-agent … enroll"));
    op.stop("connector-agent");
    op.ok(&format!("{} enroll", without_comment(connector)));
    op.background(connector);
    poll(
        op,
        "central-authority api connectors",
        "c1 back",
        |code, out| {
            let c1 = row(out, "c1");
            code == 0 && c1.get(2) == Some(&"yes") && c1.contains(&"enrolled")
        },
    );
}
