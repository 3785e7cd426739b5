//! `cargo xtask demo`: the whole system on the built-in example, nothing to
//! set up. Starts a DNS server for the `demo.test` zone and sample
//! applications on loopback (in this process), then the real
//! `central-authority` on `deploy/examples/demo.toml` (TLS, its generated
//! root and database in `target/demo/ca-data`) and one `connector-agent`
//! that enrolls with the demo group's provisioning key on its first start
//! (its key and certificate in `target/demo/connector-state`), prints the
//! dashboard URL and runs until Ctrl-C or SIGTERM, then stops everything
//! it started. `cargo xtask demo` execs this binary, so the pid of
//! `cargo xtask demo` is this process.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use e2e::{DnsServer, Proc, TcpApp, UdpApp};

const DNS: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1)), 5354);
/// The CA's listeners in `deploy/examples/demo.toml`.
const CA_PORTS: [u16; 2] = [7443, 7480];

/// Fails, naming the port and the likely cause, when a fixed port the demo
/// needs is taken: usually by a demo still running.
fn check_ports_free() -> Result<()> {
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let taken = |what: String, e: std::io::Error| {
        anyhow::anyhow!(
            "{what}: {e}; a demo may still be running (find it with `ss -ltnup | grep -E ':(5354|7443|7480)'` and stop it)"
        )
    };
    for port in CA_PORTS {
        std::net::TcpListener::bind(SocketAddr::new(loopback, port))
            .map_err(|e| taken(format!("binding 127.0.0.1:{port} (the CA)"), e))?;
    }
    std::net::UdpSocket::bind(DNS).map_err(|e| taken(format!("binding DNS server to {DNS}"), e))?;
    std::net::TcpListener::bind(DNS)
        .map_err(|e| taken(format!("binding DNS server to {DNS} (TCP)"), e))?;
    Ok(())
}

/// Ctrl-C (SIGINT) or SIGTERM, whichever comes first. Both are taken over
/// when this is called (not when the future is first polled), so a signal
/// during start-up is kept and stops the demo once it is up, with
/// everything it started.
fn stop_signal() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}

fn ip(c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, c, d))
}

#[tokio::main]
async fn main() -> Result<()> {
    let config = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "deploy/examples/demo.toml".into()),
    );
    let dir = PathBuf::from("target/demo");
    std::fs::create_dir_all(&dir)?;
    check_ports_free()?;
    // Listened for from the start, so a signal during start-up also stops
    // what was started so far.
    let stop = stop_signal()?;
    tokio::pin!(stop);

    // intranet: both addresses listen → Up. wiki: one of two listens →
    // Unhealthy. erp: nothing listens → Down. tools: on access.
    let _dns = DnsServer::start(
        DNS,
        "demo.test",
        &[
            ("intranet.demo.test", ip(10, 1)),
            ("intranet.demo.test", ip(10, 2)),
            ("wiki.demo.test", ip(11, 1)),
            ("wiki.demo.test", ip(11, 2)),
            ("erp.demo.test", ip(12, 1)),
            ("git.tools.demo.test", ip(13, 1)),
            ("payroll.demo.test", ip(14, 1)),
        ],
    )
    .await
    .context("starting the demo DNS server (a demo may still be running)")?;
    let mut keep = Vec::new();
    for (c, d, port) in [
        (10, 1, 8080),
        (10, 2, 8080),
        (10, 3, 8080),
        (11, 1, 8080),
        (13, 1, 443),
        (14, 1, 443),
        (15, 1, 9100),
    ] {
        keep.push(TcpApp::start(SocketAddr::new(ip(c, d), port)).await?);
    }
    let _udp = UdpApp::start(SocketAddr::new(ip(10, 3), 5353)).await?;

    let data = std::path::absolute(dir.join("ca-data"))?;
    let root = data.join("ca.pem");
    let mut ca = Proc::spawn(
        "central-authority",
        "central-authority",
        &[
            "--config".into(),
            config.display().to_string(),
            "--data-dir".into(),
            data.display().to_string(),
        ],
        &[],
        &dir,
    )?;
    // The CA generates its root on first start; the connector trusts it.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !root.exists() {
        if std::time::Instant::now() > deadline || !ca.is_running() {
            anyhow::bail!(
                "central-authority did not start; see {}",
                ca.log_path().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let state = std::path::absolute(dir.join("connector-state"))?;
    let mut connector = Proc::spawn(
        "connector-agent",
        "connector-agent",
        &[
            "--ca".into(),
            "https://127.0.0.1:7443".into(),
            "--ca-cert".into(),
            root.display().to_string(),
            "--state-dir".into(),
            state.display().to_string(),
            "--name".into(),
            "demo-connector-1".into(),
            "--group".into(),
            "demo".into(),
            "--dns-server".into(),
            DNS.to_string(),
        ],
        &[(
            "REACH_PROVISIONING_KEY",
            "demo-key-TxzGXOgRdffgQ2jA0xNgDJE7gsFbGpnAvivlYImmkYS".into(),
        )],
        &dir,
    )?;
    println!();
    println!("reach demo is running:");
    let cacert = root.display();
    println!("  dashboard:  https://127.0.0.1:7480/  (TLS with the CA's own root: {cacert})");
    println!("  health API: curl --cacert {cacert} https://127.0.0.1:7480/api/v1/health");
    println!(
        "  access:     curl --cacert {cacert} -H 'Authorization: Bearer demo-EMFhYetP89OwAbiVQCajjTO6BFf1lnK1vd4WVoyMBfb' -d '{{\"host\":\"intranet.demo.test\",\"protocol\":\"tcp\",\"port\":8080}}' -H 'content-type: application/json' https://127.0.0.1:7480/api/v1/access"
    );
    println!("  logs:       {}/", dir.display());
    println!("Ctrl-C (or SIGTERM) stops everything.");
    tokio::select! {
        () = &mut stop => {}
        _ = async {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if !ca.is_running() {
                    eprintln!("central-authority exited; see {}", ca.log_path().display());
                    break;
                }
            }
        } => {}
    }
    connector.stop().await;
    ca.stop().await;
    Ok(())
}
