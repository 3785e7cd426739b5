//! Who a connector session belongs to, and its authentication by
//! provisioning key (a CA run with `[tls] enabled = false`); certificate
//! authentication is in `enroll`, next to the certificates' standing.

use std::sync::Arc;

use tonic::metadata::MetadataMap;

use crate::credentials::auth::{AuthError, check_connector_name};
use crate::state::authority::Authority;
use crate::trust;

/// Who a session belongs to, from its (authenticated) metadata.
#[derive(Clone, Debug)]
pub struct Identity {
    /// Connector name.
    pub name: Arc<str>,
    /// Connector group (shared with every report the session stores).
    pub group: Arc<str>,
}

/// Authenticates a connector from its metadata: a known group and that
/// group's provisioning key (compared in constant time).
pub fn authenticate(authority: &Authority, metadata: &MetadataMap) -> Result<Identity, AuthError> {
    authenticate_key(authority, metadata).map(|(identity, _)| identity)
}

/// `authenticate`, also returning the SHA-256 of the key that
/// authenticated the connector (the session stands on that key).
pub(crate) fn authenticate_key(
    authority: &Authority,
    metadata: &MetadataMap,
) -> Result<(Identity, String), AuthError> {
    use protocol::metadata as md;
    let get = |key: &'static str| {
        metadata
            .get(key)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .ok_or(AuthError::MissingMetadata(key))
    };
    let name = get(md::CONNECTOR)?;
    let group = get(md::GROUP)?;
    let key = get(md::PROVISIONING_KEY)?;
    check_connector_name(name)?;
    trust::enroll::check_not_disabled(authority, name)?;
    let state = authority.snapshot();
    let expected = state
        .config
        .group_keys
        .get(group)
        .ok_or_else(|| AuthError::UnknownGroup(group.chars().take(128).collect()))?;
    if !expected.matches(key.as_bytes()) {
        return Err(AuthError::WrongKey(group.to_owned()));
    }
    let key_sha256 = expected.sha256();
    trust::enroll::check_key_standing(authority, group, &key_sha256)?;
    Ok((
        Identity {
            name: name.into(),
            group: group.into(),
        },
        key_sha256,
    ))
}
