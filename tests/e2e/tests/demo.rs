//! End-to-end scenario "demo": `xtask demo` (what `cargo xtask demo` runs;
//! it execs `reach-demo`) is sent SIGTERM once it is up, as an operator's
//! `kill <pid>` would: the demo, its CA and its connector must all be gone
//! and the demo's fixed ports free, so the next demo starts.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// The demo's fixed ports (deploy/examples/demo.toml, reach-demo's DNS).
const TCP_PORTS: [u16; 3] = [7443, 7480, 5354];
const UDP_PORT: u16 = 5354;

fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Alive and not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1.split_whitespace().next()?.to_owned();
            Some(after != "Z")
        })
        .unwrap_or(false)
}

/// Every process whose parent is `pid`, and theirs, recursively.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        if let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok())
        {
            parents.push((p, ppid));
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found.remove(0);
    found
}

fn ports_free() -> Result<()> {
    for port in TCP_PORTS {
        TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
            .with_context(|| format!("TCP port {port} is still taken"))?;
    }
    UdpSocket::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, UDP_PORT)))
        .with_context(|| format!("UDP port {UDP_PORT} is still taken"))?;
    Ok(())
}

#[test]
#[ignore = "needs the release binaries and the xtask binary: cargo xtask e2e"]
fn demo_stops_everything_on_sigterm() -> Result<()> {
    let xtask = std::env::var_os("REACH_XTASK")
        .map(PathBuf::from)
        .context("REACH_XTASK is not set: run the scenarios with `cargo xtask e2e`")?;
    let bin_dir = e2e::bin_dir()?;
    ports_free().context("the demo's ports must be free before the test")?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut demo = Command::new(&xtask)
        .arg("demo")
        .current_dir(&root)
        .env("REACH_BIN_DIR", &bin_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} demo", xtask.display()))?;
    let pid = demo.id();
    let stdout = demo.stdout.take().context("demo stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("demo: {line}");
            if line.contains("reach demo is running") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = demo.kill();
        let _ = demo.wait();
        bail!("the demo did not say it was running within 60 s");
    }
    // `xtask demo` became reach-demo (exec): the pid an operator kills is
    // the one that owns the children.
    ensure!(
        comm(pid).as_deref() == Some("reach-demo"),
        "pid {pid} is {:?}, not reach-demo: xtask did not exec the demo",
        comm(pid)
    );
    let children = descendants(pid);
    let names: Vec<String> = children.iter().filter_map(|p| comm(*p)).collect();
    for expected in ["central-authori", "connector-agent"] {
        ensure!(
            names.iter().any(|n| n.starts_with(expected)),
            "no {expected} among the demo's processes {names:?}"
        );
    }

    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    ensure!(status.success(), "kill -TERM {pid} failed");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if demo.try_wait()?.is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = demo.kill();
            bail!("the demo did not exit within 20 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<(u32, Option<String>)> = children
            .iter()
            .filter(|p| alive(**p))
            .map(|p| (*p, comm(*p)))
            .collect();
        if left.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            for (p, _) in &left {
                let _ = Command::new("kill")
                    .args(["-KILL", &p.to_string()])
                    .status();
            }
            bail!("still running 10 s after the demo exited: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    ports_free().context("after SIGTERM")
}
