//! The configuration file's shapes as serde reads them: one struct per
//! TOML table, with the defaults operators get when they leave a field out.
//! No rules here; `settings` and `secrets` check what these hold.

use std::path::PathBuf;

use policy::SegmentSpec;
use serde::Deserialize;

use crate::ground::secret::Secret;

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
    pub(super) store: StoreSection,
    #[serde(default)]
    pub(super) replica: ReplicaSection,
    #[serde(default)]
    pub(super) audit: AuditSection,
    #[serde(default)]
    pub(super) api_tokens: Vec<TokenSection>,
    #[serde(default)]
    pub(super) oidc: Vec<OidcSection>,
    #[serde(default)]
    pub(super) connector_groups: Vec<GroupSection>,
    #[serde(default)]
    pub(super) segments: Vec<SegmentSpec>,
    #[serde(default)]
    pub(super) log_receivers: Vec<ReceiverSection>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct ServerSection {
    pub(super) grpc_listen: String,
    pub(super) http_listen: String,
    pub(super) anonymous_read: bool,
    pub(super) public_names: Vec<String>,
    pub(super) reload_poll_ms: u64,
    pub(super) data_dir: Option<PathBuf>,
    /// Tests only: accept API tokens and provisioning keys estimated under
    /// 64 bits.
    pub(super) allow_short_secrets: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct TlsSection {
    pub(super) enabled: Option<bool>,
    pub(super) cert_file: Option<PathBuf>,
    pub(super) key_file: Option<PathBuf>,
    pub(super) issuer_cert_file: Option<PathBuf>,
    pub(super) issuer_key_file: Option<PathBuf>,
    pub(super) next_root_file: Option<PathBuf>,
    pub(super) previous_root_file: Option<PathBuf>,
    pub(super) server_names: Vec<String>,
    pub(super) connector_cert_days: Option<u32>,
    pub(super) connector_cert_validity_s: Option<u64>,
    pub(super) renewal_grace_s: Option<u64>,
    pub(super) handshake_timeout_ms: Option<u64>,
}

/// `[store]`: where the CA keeps its enrolled state.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct StoreSection {
    /// Absent: `reach.db` in the data directory. `postgres://…`: a
    /// PostgreSQL database; `sqlite:PATH`: another SQLite file. Read into a
    /// `Secret`, since a URL may carry a password.
    pub(super) url: Option<Secret>,
    pub(super) password_file: Option<PathBuf>,
}

/// `[replica]`: how this CA process names itself among replicas.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct ReplicaSection {
    pub(super) id: Option<String>,
    pub(super) advertise: Vec<String>,
}

/// `[audit]`: the audit trail of admin actions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct AuditSection {
    pub(super) retention_s: u64,
}

impl Default for AuditSection {
    fn default() -> Self {
        AuditSection {
            retention_s: 365 * 24 * 3600,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct LimitsSection {
    pub(super) max_concurrent_streams: u32,
    pub(super) max_connections: usize,
    pub(super) connector_messages_per_second: u32,
    pub(super) connector_message_burst: u32,
    pub(super) first_byte_timeout_ms: u64,
    pub(super) idle_timeout_ms: u64,
    pub(super) header_timeout_ms: u64,
    pub(super) body_timeout_ms: u64,
    pub(super) http_max_connections_per_source: usize,
    pub(super) grpc_max_connections: usize,
    pub(super) grpc_max_connections_per_source: usize,
    pub(super) grpc_max_connection_age_s: u64,
    pub(super) connector_entries_per_second: u32,
    pub(super) connector_entries_burst: u32,
    pub(super) throttle_ipv4_prefix: u8,
    pub(super) throttle_ipv6_prefix: u8,
    pub(super) throttle_max_sources: usize,
    pub(super) login_per_source_per_minute: u32,
    pub(super) login_per_second: u32,
}

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            max_concurrent_streams: 64,
            max_connections: 1024,
            connector_messages_per_second: 200,
            connector_message_burst: 400,
            first_byte_timeout_ms: 5_000,
            idle_timeout_ms: 60_000,
            header_timeout_ms: 10_000,
            body_timeout_ms: 10_000,
            http_max_connections_per_source: 64,
            grpc_max_connections: 4096,
            grpc_max_connections_per_source: 256,
            grpc_max_connection_age_s: 86_400,
            connector_entries_per_second: 2000,
            connector_entries_burst: 10_000,
            throttle_ipv4_prefix: 32,
            throttle_ipv6_prefix: 64,
            throttle_max_sources: 65_536,
            login_per_source_per_minute: 10,
            login_per_second: 5,
        }
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            grpc_listen: "127.0.0.1:7443".into(),
            http_listen: "127.0.0.1:7480".into(),
            anonymous_read: false,
            public_names: Vec::new(),
            reload_poll_ms: 1000,
            data_dir: None,
            allow_short_secrets: false,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct SelectionSection {
    pub(super) strategy: String,
    pub(super) discovery_timeout_ms: u64,
    pub(super) nearest_tolerance_percent: u32,
    pub(super) nearest_tolerance_ms: u64,
}

impl Default for SelectionSection {
    fn default() -> Self {
        SelectionSection {
            strategy: "healthy".into(),
            discovery_timeout_ms: 3000,
            nearest_tolerance_percent: 20,
            nearest_tolerance_ms: 2,
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
    /// Default: `settings::default_forward_interval` of the window.
    pub(super) access_forward_interval_ms: Option<u64>,
    pub(super) checks_per_second: u32,
    pub(super) check_timeout_ms: u32,
    pub(super) assumed_checks_per_second: u32,
    pub(super) transitions_kept: usize,
    pub(super) min_subnet_prefix_v4: u8,
    pub(super) min_subnet_prefix_v6: u8,
    pub(super) on_access_retention_s: u64,
    pub(super) max_windows_per_connector: usize,
    pub(super) max_windows_per_segment: usize,
    pub(super) history_retention_s: u64,
    pub(super) warmup_ms: u64,
    /// Warn about a TLS certificate expiring within this many days.
    pub(super) certificate_warn_days: u64,
}

impl Default for HealthSection {
    fn default() -> Self {
        HealthSection {
            on_access_window_s: 1800,
            on_access_window_ms: None,
            stale_after_intervals: 3,
            check_budget: 6000,
            heartbeat_interval_ms: 5000,
            access_forward_interval_ms: None,
            checks_per_second: 0,
            check_timeout_ms: 0,
            assumed_checks_per_second: 20,
            transitions_kept: 20,
            min_subnet_prefix_v4: policy::DEFAULT_MIN_SUBNET_PREFIX_V4,
            min_subnet_prefix_v6: policy::DEFAULT_MIN_SUBNET_PREFIX_V6,
            on_access_retention_s: 3600,
            max_windows_per_connector: 10_000,
            max_windows_per_segment: 5_000,
            history_retention_s: 7 * 24 * 3600,
            warmup_ms: 30_000,
            certificate_warn_days: 14,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TokenSection {
    pub(super) name: String,
    /// Read straight into a `Secret` so that `Debug` of the file never
    /// shows it.
    pub(super) token: Option<Secret>,
    pub(super) token_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) scopes: Vec<String>,
}

/// `[[oidc]]`: an OpenID provider people sign in with.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct OidcSection {
    pub(super) name: String,
    #[serde(default)]
    pub(super) issuer: String,
    #[serde(default)]
    pub(super) client_id: String,
    pub(super) client_secret: Option<Secret>,
    pub(super) client_secret_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) redirect_url: String,
    #[serde(default = "default_oidc_scopes")]
    pub(super) scopes: Vec<String>,
    pub(super) ca_file: Option<PathBuf>,
    #[serde(default = "default_roles_claim")]
    pub(super) roles_claim: String,
    #[serde(default)]
    pub(super) roles: std::collections::BTreeMap<String, Vec<String>>,
    #[serde(default = "default_session_lifetime_s")]
    pub(super) session_lifetime_s: u64,
    #[serde(default = "default_keys_refresh_s")]
    pub(super) keys_refresh_s: u64,
    #[serde(default = "default_revalidate_s")]
    pub(super) revalidate_s: u64,
}

fn default_oidc_scopes() -> Vec<String> {
    vec!["profile".to_owned(), "email".to_owned()]
}

fn default_roles_claim() -> String {
    "groups".to_owned()
}

fn default_session_lifetime_s() -> u64 {
    28_800
}

fn default_keys_refresh_s() -> u64 {
    3600
}

fn default_revalidate_s() -> u64 {
    300
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GroupSection {
    pub(super) name: String,
    pub(super) provisioning_key: Option<Secret>,
    pub(super) provisioning_key_file: Option<PathBuf>,
    #[serde(default)]
    pub(super) max_uses: Option<u32>,
    #[serde(default)]
    pub(super) expires_at: Option<String>,
    /// `ipv4`, `ipv6` or `dual` (default).
    #[serde(default)]
    pub(super) dns_resolution: Option<String>,
    /// `{ latitude, longitude }` in degrees: where its connectors are, for
    /// `nearest` with a user's location (optional).
    #[serde(default)]
    pub(super) location: Option<policy::LocationSpec>,
}

/// The most field errors one read reports (each costs one more pass).
const MAX_FIELD_ERRORS: usize = 64;

/// Reads the file's shapes, going past field errors: an unknown key or a
/// value of the wrong type or variant is reported (its span and serde's
/// message), then left out, and the read goes on, so one run shows every
/// such error beside the rules the rest breaks. Errors: TOML that does not
/// parse, or a field error with no span to leave out.
pub(super) fn read(
    text: &str,
) -> Result<(FileConfig, Vec<toml::de::Error>), (Vec<toml::de::Error>, toml::de::Error)> {
    let mut root = toml::de::DeTable::parse(text).map_err(|e| (Vec::new(), e))?;
    let mut errors = Vec::new();
    loop {
        let e = match FileConfig::deserialize(toml::de::Deserializer::from(root.clone())) {
            Ok(file) => return Ok((file, errors)),
            Err(e) => e,
        };
        let left_out = match e.span() {
            Some(span) if errors.len() < MAX_FIELD_ERRORS => leave_out(root.get_mut(), &span),
            _ => false,
        };
        if !left_out {
            return Err((errors, e));
        }
        errors.push(e);
    }
}

/// Removes the key (or array element) whose key or value `span` points at,
/// searching every table and array (a `[table]`'s own span is its header
/// only); whether one was found.
fn leave_out(table: &mut toml::de::DeTable<'_>, span: &std::ops::Range<usize>) -> bool {
    let inside = |s: &std::ops::Range<usize>| s.start <= span.start && span.end <= s.end;
    let hit = table.iter().find_map(|(k, v)| {
        let exact = k.span() == *span || v.span() == *span || inside(&k.span());
        exact.then(|| k.clone())
    });
    if let Some(key) = hit {
        return table.remove(&key).is_some();
    }
    table
        .iter_mut()
        .any(|(_, v)| leave_out_value(v.get_mut(), span))
}

fn leave_out_value(value: &mut toml::de::DeValue<'_>, span: &std::ops::Range<usize>) -> bool {
    match value {
        toml::de::DeValue::Table(t) => leave_out(t, span),
        toml::de::DeValue::Array(items) => {
            if let Some(i) = items.iter().position(|v| v.span() == *span) {
                let kept: toml::de::DeArray<'_> =
                    std::mem::replace(items, toml::de::DeArray::new())
                        .into_iter()
                        .enumerate()
                        .filter_map(|(j, v)| (j != i).then_some(v))
                        .collect();
                *items = kept;
                return true;
            }
            items.iter_mut().any(|v| leave_out_value(v.get_mut(), span))
        }
        _ => false,
    }
}

/// `[[log_receivers]]`: where records stream to.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReceiverSection {
    pub(super) name: String,
    #[serde(default)]
    pub(super) destination: String,
    #[serde(default = "default_receiver_format")]
    pub(super) format: String,
    pub(super) types: Option<Vec<String>>,
    pub(super) root_file: Option<PathBuf>,
    pub(super) server_name: Option<String>,
    pub(super) client_cert_file: Option<PathBuf>,
    pub(super) client_key_file: Option<PathBuf>,
    #[serde(default = "default_spool_bytes")]
    pub(super) spool_bytes: u64,
    pub(super) file_max_bytes: Option<u64>,
    pub(super) file_keep: Option<u32>,
    #[serde(default)]
    pub(super) filter: ReceiverFilterSection,
}

/// `[log_receivers.filter]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct ReceiverFilterSection {
    pub(super) groups: Vec<String>,
    pub(super) segments: Vec<String>,
    pub(super) statuses: Vec<String>,
}

fn default_receiver_format() -> String {
    "json".to_owned()
}

/// 64 MiB.
pub(super) fn default_spool_bytes() -> u64 {
    64 << 20
}

/// 100 MiB.
pub(super) const DEFAULT_FILE_MAX_BYTES: u64 = 100 << 20;
/// Rotated files kept by default.
pub(super) const DEFAULT_FILE_KEEP: u32 = 5;
