//! A tiny application host for end-to-end tests: listens on every
//! `--tcp ADDR` and `--udp ADDR` given, accepting and closing TCP connections
//! and echoing UDP datagrams, until killed. Used inside network namespaces
//! the tests create.

use anyhow::{Context, Result, bail};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut apps = Vec::new();
    let mut udps = Vec::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let addr = it
            .next()
            .with_context(|| format!("{flag} needs an address"))?
            .parse()
            .with_context(|| format!("{flag}: bad address"))?;
        match flag.as_str() {
            "--tcp" => apps.push(e2e::TcpApp::start(addr).await?),
            "--udp" => udps.push(e2e::UdpApp::start(addr).await?),
            other => bail!("unknown flag {other:?} (use --tcp ADDR / --udp ADDR)"),
        }
    }
    if apps.is_empty() && udps.is_empty() {
        bail!("nothing to serve: give --tcp ADDR and/or --udp ADDR");
    }
    tokio::signal::ctrl_c().await?;
    Ok(())
}
