//! Simulated connectors: they speak the `ConnectorSession.Connect` proto
//! like the real agent (metadata, `Hello`, then reports and heartbeats) but
//! check nothing, so one process can hold thousands of sessions.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures::{Stream, StreamExt};
use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use protocol::v1::connector_message::Kind as In;
use protocol::v1::connector_session_client::ConnectorSessionClient;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};

/// Who a simulated connector is.
#[derive(Clone, Debug)]
pub struct Identity {
    /// Connector name.
    pub name: String,
    /// Its group.
    pub group: String,
    /// The group's provisioning key.
    pub key: String,
}

/// Opens `n` HTTP/2 connections to `url`.
pub async fn channels(url: &str, n: usize) -> Result<Vec<Channel>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let ch = Endpoint::from_shared(url.to_owned())?
            .tcp_nodelay(true)
            .connect()
            .await
            .with_context(|| format!("connecting to {url}"))?;
        out.push(ch);
    }
    Ok(out)
}

/// The `Hello` of `id`.
pub fn hello(id: &Identity) -> v1::ConnectorMessage {
    v1::ConnectorMessage {
        kind: Some(In::Hello(v1::Hello {
            name: id.name.clone(),
            group: id.group.clone(),
            version: "reach-bench".to_owned(),
            release: protocol::release::RELEASE.to_owned(),
            capabilities: Some(v1::Capabilities {
                icmp: false,
                icmp_mode: "none".to_owned(),
                checks_per_second: 20,
                trust_bundle: false,
            }),
        })),
    }
}

/// A heartbeat whose `queue_depth` carries `marker`, so the driver can see
/// in `ListConnectors` which heartbeat the CA handled last.
pub fn heartbeat(marker: u32) -> v1::ConnectorMessage {
    v1::ConnectorMessage {
        kind: Some(In::Heartbeat(v1::Heartbeat {
            load: Some(v1::CheckLoad {
                targets: 10,
                checks_per_cycle: 10,
                cycle_seconds: 0.5,
                queue_depth: marker,
                checks_per_second: 20.0,
                in_flight: 0,
                rate_limit: 20,
            }),
            replicas: None,
            status: None,
        })),
    }
}

/// A report of one application with one address (the host itself when it
/// is an IP literal, else 127.0.9.1).
pub fn report(segment: &str, host: &str, port: u16, up: bool, rtt_us: u64) -> v1::ConnectorMessage {
    let address = if host.parse::<std::net::IpAddr>().is_ok() {
        host.to_owned()
    } else {
        "127.0.9.1".to_owned()
    };
    let status = if up {
        v1::HealthStatus::Up
    } else {
        v1::HealthStatus::Down
    } as i32;
    v1::ConnectorMessage {
        kind: Some(In::Report(v1::HealthReport {
            applications: vec![v1::ApplicationHealth {
                app: Some(v1::ApplicationKey {
                    segment: segment.to_owned(),
                    host: host.to_owned(),
                    protocol: v1::Protocol::Tcp as i32,
                    port: u32::from(port),
                }),
                status,
                addresses: vec![v1::AddressResult {
                    reason: None,
                    certificate_not_after_unix_s: None,
                    address,
                    status,
                    method: v1::CheckMethod::Tcp as i32,
                    rtt_us,
                    failure: 0,
                    detail: String::new(),
                }],
                checked_at_unix_ms: 1_700_000_000_000,
                dns_error: String::new(),
                expired: false,
                age_ms: 0,
                access_id: String::new(),
            }],
            full_state: false,
            sequence: 0,
        })),
    }
}

/// One report of several applications of `segment` on `port` (each as
/// [`report`] makes it), the connector's full state when `full_state`.
pub fn report_of(
    segment: &str,
    port: u16,
    results: &[(String, bool)],
    full_state: bool,
) -> v1::ConnectorMessage {
    let mut applications = Vec::with_capacity(results.len());
    for (host, up) in results {
        if let Some(In::Report(r)) = report(segment, host, port, *up, 300).kind {
            applications.extend(r.applications);
        }
    }
    v1::ConnectorMessage {
        kind: Some(In::Report(v1::HealthReport {
            applications,
            full_state,
            sequence: 0,
        })),
    }
}

/// Opens a session for `id` on `channel` that sends `Hello` and then
/// everything `rest` yields; waits for the `Welcome` and returns the
/// inbound stream after it.
pub async fn connect(
    channel: Channel,
    id: &Identity,
    rest: impl Stream<Item = v1::ConnectorMessage> + Send + 'static,
) -> Result<tonic::Streaming<v1::AuthorityMessage>> {
    let outbound = futures::stream::once(futures::future::ready(hello(id))).chain(rest);
    let mut request = tonic::Request::new(outbound);
    let md = request.metadata_mut();
    md.insert(
        protocol::metadata::CONNECTOR,
        MetadataValue::try_from(&id.name)?,
    );
    md.insert(
        protocol::metadata::GROUP,
        MetadataValue::try_from(&id.group)?,
    );
    md.insert(
        protocol::metadata::PROVISIONING_KEY,
        MetadataValue::try_from(&id.key)?,
    );
    let mut client =
        ConnectorSessionClient::new(channel).max_decoding_message_size(protocol::MAX_MESSAGE_BYTES);
    let mut inbound = client
        .connect(request)
        .await
        .with_context(|| format!("connector {} could not open its session", id.name))?
        .into_inner();
    match tokio::time::timeout(Duration::from_secs(30), inbound.message()).await {
        Err(_) => bail!("no Welcome for {} within 30 s", id.name),
        Ok(Err(status)) => bail!("session of {} refused: {status}", id.name),
        Ok(Ok(None)) => bail!("session of {} closed before Welcome", id.name),
        Ok(Ok(Some(v1::AuthorityMessage {
            kind: Some(Out::Welcome(_)),
        }))) => Ok(inbound),
        Ok(Ok(Some(other))) => Err(anyhow!("expected Welcome, got {other:?}")),
    }
}

/// Reads and discards what the CA sends, so its queue toward us never fills.
pub fn drain(mut inbound: tonic::Streaming<v1::AuthorityMessage>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} })
}
