//! Cold on-access decision: the time from an access request to its
//! decision for an application no connector has checked yet (the CA
//! forwards the access to the real connector agent, which checks it and
//! reports, and the waiting request is then decided), minus one bare TCP
//! handshake to the same application server.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use connector_agent::{Config, IcmpPreference};
use tokio::net::{TcpListener, TcpStream};

use super::Spec;
use super::ca::{self, CaSetup};
use crate::Mode;
use crate::report::{Figure, Goal};
use crate::stats::{ms, quantile};

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "cold_on_access_excess_ms",
        unit: "ms",
        goal: Goal::AtMost { limit: 2.0 },
    },
    Spec {
        name: "cold_on_access_decision_ms",
        unit: "ms",
        goal: Goal::Info,
    },
];

/// Measures `n` cold accesses (quick: 5, full: 50).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let n = mode.pick(5usize, 50);
    // Application servers on 127.78.0.k, inside the on-access segment's
    // subnet.
    let mut apps: Vec<SocketAddr> = Vec::new();
    let mut servers = Vec::new();
    for k in 0..n {
        let ip = IpAddr::V4(Ipv4Addr::new(127, 78, (k / 250) as u8, (k % 250) as u8 + 1));
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await?;
        apps.push(listener.local_addr()?);
        servers.push(tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                drop(s);
            }
        }));
    }
    let ca_server = ca::start(&CaSetup {
        filler_segments: 0,
        ingest_apps: 0,
        ..CaSetup::default()
    })
    .await?;

    // The real connector, in this process.
    let mut config = Config::new(ca_server.grpc_url(), "cold-1", ca::GROUP);
    config.provisioning_key = Some(ca::KEY.into());
    config.icmp = IcmpPreference::Off;
    config.state_dir = std::env::temp_dir().join(format!("reach-bench-{}", std::process::id()));
    // Names (the `web` segment's FQDN) resolve against a loopback port where
    // nothing answers: no query leaves the machine.
    config.dns_server = Some("127.0.5.2:53".parse()?);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent = tokio::spawn(connector_agent::run(config, async move {
        let _ = stop_rx.await;
    }));

    let channels = crate::sim::channels(&ca_server.grpc_url(), 1).await?;
    let ch = channels[0].clone();
    ca::wait_until(Duration::from_secs(15), "the connector to connect", || {
        let ch = ch.clone();
        async move {
            Ok(ca::connectors(ch)
                .await?
                .iter()
                .any(|c| c.name == "cold-1" && c.connected))
        }
    })
    .await?;
    // Let its first continuous round go by.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut decisions = Vec::with_capacity(n);
    let mut excess = Vec::with_capacity(n);
    let mut handshakes = Vec::with_capacity(n);
    for app in &apps {
        let t = Instant::now();
        let d = ca::resolve(ch.clone(), &app.ip().to_string(), app.port()).await?;
        let decision = t.elapsed();
        if !ca::selected(&d) {
            bail!("cold access to {app} was not selected: {d:?}");
        }
        let t = Instant::now();
        let s = TcpStream::connect(app)
            .await
            .with_context(|| format!("bare handshake to {app}"))?;
        let handshake = t.elapsed();
        drop(s);
        decisions.push(decision);
        handshakes.push(handshake);
        excess.push(decision.saturating_sub(handshake));
        // Apart by more than the pacer's period at 20/s, so every check
        // starts at once.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), agent).await;
    for s in servers {
        s.abort();
    }
    drop(ca_server);

    decisions.sort();
    excess.sort();
    handshakes.sort();
    let hs = ms(quantile(&handshakes, 0.5));
    let mut first = SPECS[0].figure(
        ms(quantile(&excess, 0.5)),
        Some(hs),
        format!(
            "median over {n} accesses to never-checked 127.78.0.x apps (on-access segment, real \
             connector-agent at 20 checks/s, CA in a child process); p90 {:.2} ms, max {:.2} ms; \
             baseline = median bare handshake",
            ms(quantile(&excess, 0.9)),
            ms(quantile(&excess, 1.0))
        ),
    );
    // A difference has no meaningful ratio to the handshake.
    first.ratio = None;
    Ok(vec![
        first,
        SPECS[1].figure(
            ms(quantile(&decisions, 0.5)),
            Some(hs),
            "median request-to-decision time over gRPC Access/Resolve",
        ),
    ])
}
