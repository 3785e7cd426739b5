//! The CA under test: its configuration, starting it as a child process,
//! and small clients (access over gRPC and HTTP, metrics, connector list).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use protocol::v1;
use protocol::v1::access_client::AccessClient;
use protocol::v1::health_query_client::HealthQueryClient;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use crate::servers::Server;

/// API token of the benchmark configuration (all scopes).
pub const TOKEN: &str = "bench-token-dyAkDDkgcOjZeFDgUDsDveA3";
/// The one connector group.
pub const GROUP: &str = "bench";
/// Its provisioning key.
pub const KEY: &str = "bench-provisioning-key-EPHdus4dS4b2hqY4nP466TOp";
/// The application access benchmarks ask for.
pub const APP_HOST: &str = "app.bench.test";
/// Its port.
pub const APP_PORT: u16 = 443;

/// What the CA is configured with.
#[derive(Clone, Debug)]
pub struct CaSetup {
    /// Heartbeat interval imposed on connectors.
    pub heartbeat_ms: u64,
    /// Extra continuous segments (one FQDN each), so matching has a policy
    /// of realistic size.
    pub filler_segments: usize,
    /// IP applications of the `ingest` segment.
    pub ingest_apps: usize,
}

impl Default for CaSetup {
    fn default() -> Self {
        CaSetup {
            heartbeat_ms: 5000,
            filler_segments: 100,
            ingest_apps: 1000,
        }
    }
}

/// The `ingest` segment's `i`-th application (127.20.x.y).
pub fn ingest_host(i: usize) -> String {
    format!("127.20.{}.{}", (i / 250) % 256, i % 250 + 1)
}

/// The sections every benchmark CA shares: plain-text transport, lifted
/// limits, the API token and the connector group (then its segments).
pub fn shared_sections() -> String {
    format!(
        r#"# Plain text: connectors authenticate with the provisioning key in
# metadata, so thousands of simulated sessions cost no certificates. The
# session, report and access paths measured are the same as over TLS.
[tls]
enabled = false

# The per-session message and entry limits protect the CA from a hostile
# connector, the per-source connection caps from a crowd on one address,
# and the cap on HTTP/2 streams per connection from one connection's
# flood (and the 4,096 gRPC connections: `startup` opens one per
# connector, 10,000); lifted here so ingestion and access measure what the CA can
# handle (the load comes from one address), not the limits. The bare
# servers have no stream cap; with the CA's 64, a pause of the machine
# during the open loop of `access` let more than 64 requests per
# connection queue in the client, which then waited on the cap as well.
[limits]
connector_messages_per_second = 10000000
connector_message_burst = 10000000
connector_entries_per_second = 10000000
connector_entries_burst = 10000000
max_connections = 100000
http_max_connections_per_source = 100000
grpc_max_connections = 100000
grpc_max_connections_per_source = 100000
max_concurrent_streams = 100000

[[api_tokens]]
name = "bench"
token = "{TOKEN}"
scopes = ["access", "read", "admin"]

[[connector_groups]]
name = "{GROUP}"
provisioning_key = "{KEY}"

"#
    )
}

/// The `[tls]` section `shared_sections` writes: plain text.
const PLAIN_TEXT: &str = "[tls]\nenabled = false\n";

/// `text` (from [`config_text`]) with TLS on, `extra` (such as the issuer's
/// files) added to its `[tls]` section.
pub fn with_tls(text: &str, extra: &str) -> String {
    assert!(text.contains(PLAIN_TEXT), "no plain-text [tls] section");
    text.replacen(PLAIN_TEXT, &format!("[tls]\nenabled = true\n{extra}"), 1)
}

/// The configuration text.
pub fn config_text(setup: &CaSetup) -> String {
    let mut s = format!(
        r#"[server]
grpc_listen = "127.0.0.1:1"
http_listen = "127.0.0.1:2"
anonymous_read = false

[selection]
strategy = "healthy"
discovery_timeout_ms = 3000

[health]
heartbeat_interval_ms = {hb}

{shared}[[segments]]
name = "web"
applications = ["{APP_HOST}"]
tcp_ports = ["{APP_PORT}"]
health_reporting = "continuous"
report_interval_s = 60
connector_groups = ["{GROUP}"]

[[segments]]
name = "cold"
applications = ["127.78.0.0/16"]
tcp_ports = ["1-65535"]
health_reporting = "on_access"
report_interval_s = 60
connector_groups = ["{GROUP}"]
"#,
        hb = setup.heartbeat_ms,
        shared = shared_sections(),
    );
    if setup.ingest_apps > 0 {
        let apps: Vec<String> = (0..setup.ingest_apps)
            .map(|i| format!("\"{}\"", ingest_host(i)))
            .collect();
        let _ = write!(
            s,
            r#"
[[segments]]
name = "ingest"
applications = [{}]
tcp_ports = ["{APP_PORT}"]
health_reporting = "continuous"
report_interval_s = 60
connector_groups = ["{GROUP}"]
"#,
            apps.join(", ")
        );
    }
    for i in 0..setup.filler_segments {
        let _ = write!(
            s,
            r#"
[[segments]]
name = "filler-{i}"
applications = ["app{i}.filler.bench.test", "127.21.{}.{}"]
tcp_ports = ["80", "443"]
health_reporting = "continuous"
report_interval_s = 60
connector_groups = ["{GROUP}"]
"#,
            i / 250,
            i % 250 + 1
        );
    }
    s
}

/// Starts the CA in a child process on `setup`.
pub async fn start(setup: &CaSetup) -> Result<Server> {
    Ok(start_text(&config_text(setup)).await?.0)
}

/// Starts the CA in a child process on the configuration `text`; also
/// returns its directory (the data directory is `reach-ca-data` in it).
pub async fn start_text(text: &str) -> Result<(Server, std::path::PathBuf)> {
    let dir = std::env::temp_dir().join(format!("reach-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // One directory per CA: its data directory defaults to one next to the
    // configuration file, so no state carries over between CAs.
    let dir = dir.join(format!(
        "ca-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("ca.toml");
    std::fs::write(&path, text)?;
    let path_str = path
        .to_str()
        .ok_or_else(|| anyhow!("temporary path is not UTF-8"))?;
    Ok((Server::spawn(&["serve-ca", path_str]).await?, dir))
}

/// Adds the bearer token to a request.
pub fn authorized<T>(message: T) -> Result<tonic::Request<T>> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut().insert(
        protocol::metadata::AUTHORIZATION,
        MetadataValue::try_from(format!("Bearer {TOKEN}"))?,
    );
    Ok(r)
}

/// The access request for `host:port` over TCP.
pub fn access_request(host: &str, port: u16) -> v1::AccessRequest {
    v1::AccessRequest {
        host: host.to_owned(),
        protocol: v1::Protocol::Tcp as i32,
        port: u32::from(port),
        user_location: None,
    }
}

/// One access over gRPC.
pub async fn resolve(channel: Channel, host: &str, port: u16) -> Result<v1::AccessDecision> {
    let mut client = AccessClient::new(channel);
    Ok(client
        .resolve(authorized(access_request(host, port))?)
        .await?
        .into_inner())
}

/// Whether a decision selected a connector.
pub fn selected(d: &v1::AccessDecision) -> bool {
    matches!(d.outcome, Some(v1::access_decision::Outcome::Selected(_)))
}

/// Every connector the CA knows.
pub async fn connectors(channel: Channel) -> Result<Vec<v1::ConnectorView>> {
    let mut client = HealthQueryClient::new(channel).max_decoding_message_size(256 << 20);
    Ok(client
        .list_connectors(authorized(v1::ListConnectorsRequest::default())?)
        .await?
        .into_inner()
        .connectors)
}

/// Simulated connectors (`sim-{i:05}`) whose last heartbeat `sent[i]`
/// (0: none sent) the CA on `ch` does not show yet: how many.
pub async fn behind(ch: Channel, sent: &[u32]) -> Result<usize> {
    let views = connectors(ch).await?;
    let seen: HashMap<&str, u32> = views
        .iter()
        .filter(|v| v.connected)
        .map(|v| {
            (
                v.name.as_str(),
                v.load.as_ref().map_or(0, |l| l.queue_depth),
            )
        })
        .collect();
    Ok(sent
        .iter()
        .enumerate()
        .filter(|(i, k)| {
            **k > 0
                && seen
                    .get(format!("sim-{i:05}").as_str())
                    .is_none_or(|d| d < *k)
        })
        .count())
}

/// The CA's `reach_ca_reports_received` counter, from `/metrics`.
pub async fn reports_received(http: &reqwest::Client, base: &str) -> Result<u64> {
    metric(http, base, "reach_ca_reports_received_total")
        .await?
        .ok_or_else(|| anyhow!("no reach_ca_reports_received_total in /metrics"))
}

/// `GET {base}{path}` with the bench's admin token, as JSON.
pub async fn get_json(http: &reqwest::Client, base: &str, path: &str) -> Result<serde_json::Value> {
    Ok(http
        .get(format!("{base}{path}"))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// The value of the CA's `/metrics` line `name`, if listed.
async fn metric(http: &reqwest::Client, base: &str, name: &str) -> Result<Option<u64>> {
    Ok(metric_in(&metrics_text(http, base).await?, name))
}

/// The CA's `/metrics` exposition, read with the bench's admin token.
pub async fn metrics_text(http: &reqwest::Client, base: &str) -> Result<String> {
    Ok(http
        .get(format!("{base}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?)
}

/// The value of line `name` (a series name with its labels, if any) in a
/// `/metrics` exposition, if listed.
pub fn metric_in(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Polls `cond` every 20 ms until it holds or `limit` passes.
pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut cond: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let t0 = Instant::now();
    loop {
        if cond()
            .await
            .with_context(|| format!("waiting for {what}"))?
        {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > limit {
            bail!("{what}: not reached within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A counter of the CA's `/metrics` (`reach_ca_…_total`), 0 when absent
/// (a counter not incremented yet is still listed, so absent means renamed:
/// the figure's note then shows 0, which the reader can check).
pub async fn counter(http: &reqwest::Client, base: &str, name: &str) -> Result<u64> {
    Ok(metric(http, base, name).await?.unwrap_or(0))
}
