//! The configuration file's shapes as serde reads them: one struct per
//! TOML table, with the defaults operators get when they leave a field out.
//! No rules here; `settings` and `secrets` check what these hold.

use std::path::PathBuf;

use policy::SegmentSpec;
use serde::Deserialize;

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    #[serde(default)]
    pub(super) server: ServerSection,
    #[serde(default)]
    pub(super) selection: SelectionSection,
    #[serde(default)]
    pub(super) health: HealthSection,
    #[serde(default)]
    pub(super) tls: TlsSection,
    #[serde(default)]
    pub(super) limits: LimitsSection,
    #[serde(default)]
    pub(super) api_tokens: Vec<TokenSection>,
    #[serde(default)]
    pub(super) connector_groups: Vec<GroupSection>,
    #[serde(default)]
    pub(super) segments: Vec<SegmentSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct ServerSection {
    pub(super) grpc_listen: String,
    pub(super) http_listen: String,
    pub(super) anonymous_read: bool,
    pub(super) reload_poll_ms: u64,
    pub(super) data_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct TlsSection {
    pub(super) enabled: Option<bool>,
    pub(super) cert_file: Option<PathBuf>,
    pub(super) key_file: Option<PathBuf>,
    pub(super) issuer_cert_file: Option<PathBuf>,
    pub(super) issuer_key_file: Option<PathBuf>,
    pub(super) server_names: Vec<String>,
    pub(super) connector_cert_days: Option<u32>,
    pub(super) handshake_timeout_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct LimitsSection {
    pub(super) max_concurrent_streams: u32,
    pub(super) max_connections: usize,
    pub(super) connector_messages_per_second: u32,
    pub(super) connector_message_burst: u32,
    pub(super) connector_entries_per_second: u32,
    pub(super) connector_entries_burst: u32,
}

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            max_concurrent_streams: 64,
            max_connections: 1024,
            connector_messages_per_second: 200,
            connector_message_burst: 400,
            connector_entries_per_second: 2000,
            connector_entries_burst: 10_000,
        }
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            grpc_listen: "127.0.0.1:7443".into(),
            http_listen: "127.0.0.1:7480".into(),
            anonymous_read: false,
            reload_poll_ms: 1000,
            data_dir: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct SelectionSection {
    pub(super) strategy: String,
    pub(super) discovery_timeout_ms: u64,
}

impl Default for SelectionSection {
    fn default() -> Self {
        SelectionSection {
            strategy: "healthy".into(),
            discovery_timeout_ms: 3000,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct HealthSection {
    pub(super) on_access_window_s: u64,
    pub(super) on_access_window_ms: Option<u64>,
    pub(super) stale_after_intervals: u32,
    pub(super) check_budget: u64,
    pub(super) heartbeat_interval_ms: u64,
    pub(super) access_forward_interval_ms: u64,
    pub(super) checks_per_second: u32,
    pub(super) check_timeout_ms: u32,
    pub(super) assumed_checks_per_second: u32,
    pub(super) transitions_kept: usize,
}

impl Default for HealthSection {
    fn default() -> Self {
        HealthSection {
            on_access_window_s: 1800,
            on_access_window_ms: None,
            stale_after_intervals: 3,
            check_budget: 6000,
            heartbeat_interval_ms: 5000,
            access_forward_interval_ms: 60_000,
            checks_per_second: 0,
            check_timeout_ms: 0,
            assumed_checks_per_second: 20,
            transitions_kept: 20,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TokenSection {
    pub(super) name: String,
    pub(super) token: Option<String>,
    pub(super) token_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) scopes: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GroupSection {
    pub(super) name: String,
    pub(super) provisioning_key: Option<String>,
    pub(super) provisioning_key_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) max_uses: Option<u32>,
    #[serde(default)]
    pub(super) expires_at: Option<String>,
}
