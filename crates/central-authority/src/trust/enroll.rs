//! Connector enrollment (the `Enrollment` gRPC service), session
//! authentication from the client certificate, and the administrator's
//! controls (disable / enable a connector, revoke its certificates, revoke a
//! group's provisioning key).
//!
//! Enrollment checks, in order: the name is well-formed, the group exists,
//! the key matches (constant time), the key has not expired; then, in one
//! database transaction, that the key is not revoked and has uses left and
//! that the connector is neither disabled nor enrolled in another group,
//! and that its name holds no valid certificate (unless an administrator
//! allowed one re-enrollment, `POST /api/v1/connectors/{name}/allow-reenroll`):
//! a group's provisioning key is shared by every host of the group, so it
//! must not be enough to take over a running connector's name. Only then is
//! the signed certificate returned.
//!
//! A session's standing (certificate not revoked or expired, connector not
//! disabled) is checked when its stream opens and again when it registers
//! (`check_standing`); disable, revoke and delete close registered and
//! pending (pre-`Hello`) streams alike.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use protocol::v1;
use protocol::v1::enrollment_server::Enrollment;
use serde::Serialize;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::credentials::auth::{AuthError, check_connector_name};
use crate::credentials::pki::PkiError;
use crate::error::EnrollError;
use crate::ground::clock::now_ms;
use crate::state::authority::Authority;
use crate::state::counters::Metrics;
use crate::store::{CertRecord, NewCertificate, StoreError};
use crate::trust;
use crate::trust::identity::Identity;

/// Certificate records by serial, and the disabled connectors' names.
type Standings = (HashMap<String, CertRecord>, HashSet<String>);

/// The `Enrollment` gRPC service.
#[derive(Clone, Debug)]
pub struct EnrollmentService {
    authority: Arc<Authority>,
}

impl EnrollmentService {
    /// The service over shared state.
    pub fn new(authority: Arc<Authority>) -> Self {
        EnrollmentService { authority }
    }
}

#[tonic::async_trait]
impl Enrollment for EnrollmentService {
    async fn enroll(
        &self,
        request: Request<v1::EnrollRequest>,
    ) -> Result<Response<v1::EnrollResponse>, Status> {
        let peer = request.remote_addr();
        let source = peer.map(|p| p.ip());
        let r = request.into_inner();
        let name: String = r.name.chars().take(128).collect();
        let group: String = r.group.chars().take(128).collect();
        // Signing and the database write run off the async workers.
        let enrolled = self
            .authority
            .blocking(move |a| enroll(a, &r))
            .await
            .unwrap_or(Err(EnrollError::Internal));
        match enrolled {
            Ok(response) => {
                Metrics::count(&self.authority.metrics().enrollments, "enrolled");
                tracing::info!(
                    connector = %name,
                    group = %group,
                    serial = %response.serial,
                    peer = ?peer,
                    "connector enrolled"
                );
                Ok(Response::new(response))
            }
            Err(e) => {
                // The key was compared first: only a failure counts, and
                // one over the source's allowance is answered "throttled"
                // (`trust::throttle`); a valid key is never refused by it.
                let e = match e {
                    EnrollError::NoTls | EnrollError::Internal => e,
                    e => match trust::throttle::failed(
                        &self.authority,
                        crate::state::limits::Guarded::Enrollment,
                        source,
                    ) {
                        Ok(()) => e,
                        Err(refused) => EnrollError::RateLimited {
                            retry_after_s: refused.retry_after_s,
                        },
                    },
                };
                Metrics::count(&self.authority.metrics().enrollments, e.label());
                // The key is never logged, only the reason; a throttled
                // failure is logged by the throttle (once a minute).
                if !matches!(e, EnrollError::RateLimited { .. }) {
                    tracing::warn!(connector = ?name, group = ?group, peer = ?peer, reason = e.label(), error = %e, "enrollment refused");
                }
                Err(e.into())
            }
        }
    }

    async fn renew(
        &self,
        request: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::EnrollResponse>, Status> {
        crate::trust::renew::serve(&self.authority, request).await
    }
}

/// How long `allow-reenroll` lets the next enrollment of a name through.
pub const REENROLL_WINDOW: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// The certificate a session authenticated with.
#[derive(Clone, Debug)]
pub(crate) struct SessionCert {
    /// Serial (hex).
    pub serial: String,
    /// End of validity, Unix ms: the session ends then.
    pub not_after_ms: i64,
    /// The fingerprint of the trusted root whose key signed it (`None`
    /// only without TLS material to check it against).
    pub root: Option<String>,
}

/// A provisioning key as the admin API shows it (never the key itself).
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct KeyView {
    /// Group.
    pub group: String,
    /// Enrollments so far.
    pub uses: u32,
    /// Maximum.
    pub max_uses: u32,
    /// Expiry, Unix ms.
    pub expires_at: Option<i64>,
    /// Revocation time, Unix ms.
    pub revoked_at: Option<i64>,
    /// Last use, Unix ms.
    pub last_used_at: Option<i64>,
    /// Whether it would enroll a connector now.
    pub usable: bool,
}

/// Checks an enrollment request and, if acceptable, signs and records a
/// client certificate.
pub fn enroll(
    authority: &Authority,
    r: &v1::EnrollRequest,
) -> Result<v1::EnrollResponse, EnrollError> {
    let pki = authority.pki().ok_or(EnrollError::NoTls)?;
    check_connector_name(&r.name)?;
    let state = authority.snapshot();
    let unknown = || EnrollError::NoSuchGroup(r.group.chars().take(128).collect());
    let key = state.config.group_keys.get(&r.group).ok_or_else(unknown)?;
    let policy = state
        .config
        .key_policies
        .get(&r.group)
        .ok_or_else(unknown)?;
    if !key.matches(r.provisioning_key.as_bytes()) {
        return Err(AuthError::WrongKey(r.group.clone()).into());
    }
    let now = now_ms();
    if policy.expires_ms.is_some_and(|e| now >= e) {
        return Err(EnrollError::KeyExpired(r.group.clone()));
    }
    let issued = pki
        .issue(&r.name, &r.group, &r.csr_pem)
        .map_err(|e| match e {
            PkiError::InvalidCsr(m) => EnrollError::Csr(format!("invalid CSR: {m}")),
            other => {
                tracing::error!(error = %other, "cannot sign a client certificate");
                EnrollError::Internal
            }
        })?;
    authority
        .store()
        .enroll(&NewCertificate {
            name: &r.name,
            group: &r.group,
            key_sha256: &policy.key_sha256,
            max_uses: policy.max_uses,
            serial: &issued.serial,
            fingerprint: &issued.fingerprint,
            not_after_ms: issued.not_after_ms,
            now_ms: now,
            root_sha256: &issued.root,
        })
        .map_err(internal)??;
    // A re-enrolled connector's old certificates were superseded: end a
    // session (or a stream not yet registered) that still runs on one.
    authority.close_connector_streams(&r.name, "re-enrolled with a new certificate");
    Ok(v1::EnrollResponse {
        certificate_pem: issued.pem,
        issuer_pem: pki.issuer_pem.clone(),
        serial: issued.serial,
        not_after_unix_ms: issued.not_after_ms,
        identity_uri: issued.identity_uri,
    })
}

/// Authenticates a session by its client certificate: a reach identity
/// whose serial the CA issued, not revoked, of a connector that is not
/// disabled, in a group of the policy.
pub fn authenticate_cert(
    authority: &Authority,
    certs: Option<&[impl AsRef<[u8]>]>,
) -> Result<Identity, AuthError> {
    authenticate_session_cert(authority, certs).map(|(identity, _)| identity)
}

/// `authenticate_cert`, also returning the certificate the session
/// stands on (checked again at registration and ended at its expiry).
pub(crate) fn authenticate_session_cert(
    authority: &Authority,
    certs: Option<&[impl AsRef<[u8]>]>,
) -> Result<(Identity, SessionCert), AuthError> {
    let leaf = certs
        .and_then(|c| c.first())
        .ok_or(AuthError::NoClientCertificate)?;
    let id =
        crate::credentials::pki::identity_of(leaf.as_ref()).map_err(AuthError::BadCertificate)?;
    // TLS verified the chain against the roots in force at the
    // handshake; a connection from before a reload that removed a root
    // is checked against the roots in force now.
    let root = match authority.pki() {
        Some(pki) => Some(
            pki.root_of(leaf.as_ref())
                .map(|r| r.fingerprint.clone())
                .ok_or_else(|| AuthError::UntrustedRoot(id.serial.clone()))?,
        ),
        None => None,
    };
    let record = authority
        .store()
        .certificate(&id.serial)
        .map_err(|e| {
            tracing::error!(error = %e, "cannot look up a certificate");
            AuthError::Unavailable
        })?
        .ok_or_else(|| AuthError::UnknownCertificate(id.serial.clone()))?;
    // The certificate presented must be the one issued under that
    // serial, byte for byte: names and serial alone could be copied
    // into another certificate. Constant time, like every secret
    // comparison.
    let presented = crate::ground::digest::sha256_hex(leaf.as_ref());
    let same_cert: bool =
        subtle::ConstantTimeEq::ct_eq(presented.as_bytes(), record.fingerprint.as_bytes()).into();
    if record.connector != id.name || record.group != id.group || !same_cert {
        return Err(AuthError::UnknownCertificate(id.serial));
    }
    if let Some((_, reason)) = record.revoked {
        return Err(AuthError::CertificateRevoked {
            serial: id.serial,
            reason,
        });
    }
    if record.disabled {
        return Err(AuthError::ConnectorDisabled(id.name));
    }
    if record.not_after_ms <= now_ms() {
        return Err(AuthError::CertificateExpired(id.serial));
    }
    if !authority.snapshot().policy().has_group(&id.group) {
        return Err(AuthError::UnknownGroup(id.group));
    }
    let cert = SessionCert {
        serial: id.serial,
        not_after_ms: record.not_after_ms,
        root,
    };
    Ok((
        Identity {
            name: id.name.into(),
            group: id.group.into(),
        },
        cert,
    ))
}

/// Checks again, when a session registers (after `Hello`), what was
/// checked when its stream opened: its certificate (`None` for a
/// plain-text session) is not revoked or expired, or the provisioning
/// key that authenticated a plain-text session (its SHA-256,
/// `key_sha256`) is still its group's and not revoked; and the
/// connector is not disabled. Fails closed when the database cannot
/// answer.
pub(crate) fn check_standing(
    authority: &Authority,
    identity: &Identity,
    cert: Option<&SessionCert>,
    key_sha256: Option<&str>,
) -> Result<(), AuthError> {
    if !authority.snapshot().policy().has_group(&identity.group) {
        return Err(AuthError::UnknownGroup(identity.group.to_string()));
    }
    let Some(cert) = cert else {
        if let Some(key) = key_sha256 {
            check_key_standing(authority, &identity.group, key)?;
        }
        return check_not_disabled(authority, &identity.name);
    };
    check_root_trusted(authority, cert)?;
    let record = authority.store().certificate(&cert.serial).map_err(|e| {
        tracing::error!(error = %e, "cannot look up a certificate");
        AuthError::Unavailable
    })?;
    cert_standing(record.as_ref(), &cert.serial, &identity.name, now_ms())
}

/// `check_standing` without the store, for a session whose stream was
/// authenticated against the store when nothing that may end sessions
/// has been announced since (`Store::announced` reads the same): that
/// read still holds. A change committed after it is announced, and the
/// reconcile the announcement starts closes the session (or, if it is
/// still registering then, the periodic one a second later). What this
/// replica decides alone is checked again: the group still exists, a
/// key-authenticated session's key is still its group's key here, a
/// certificate has not expired.
pub(crate) fn check_standing_locally(
    authority: &Authority,
    identity: &Identity,
    cert: Option<&SessionCert>,
    key_sha256: Option<&str>,
) -> Result<(), AuthError> {
    let state = authority.snapshot();
    if !state.policy().has_group(&identity.group) {
        return Err(AuthError::UnknownGroup(identity.group.to_string()));
    }
    if let Some(cert) = cert {
        if cert.not_after_ms <= now_ms() {
            return Err(AuthError::CertificateExpired(cert.serial.clone()));
        }
        check_root_trusted(authority, cert)?;
    }
    match key_sha256 {
        Some(key) => key_is_current(&state, &identity.group, key),
        None => Ok(()),
    }
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
    check_not_disabled(authority, name)?;
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
    check_key_standing(authority, group, &key_sha256)?;
    Ok((
        Identity {
            name: name.into(),
            group: group.into(),
        },
        key_sha256,
    ))
}

/// Whether a session authenticated by the provisioning key of `group`
/// whose SHA-256 is `key_sha256` (metadata authentication) may go on:
/// that key is still the group's key in this replica's configuration
/// (a reload that replaced it ends the sessions it authenticated) and
/// not revoked, on any replica. The key checked is the session's own,
/// whichever key the group had when it was revoked. Fails closed when
/// the store cannot answer.
pub(crate) fn check_key_standing(
    authority: &Authority,
    group: &str,
    key_sha256: &str,
) -> Result<(), AuthError> {
    key_is_current(&authority.snapshot(), group, key_sha256)?;
    match authority.store().key_revoked(group, key_sha256) {
        Ok(true) => Err(AuthError::KeyRevoked(group.to_owned())),
        Ok(false) => Ok(()),
        Err(e) => {
            tracing::error!(error = %e, "cannot look up whether a provisioning key is revoked");
            Err(AuthError::Unavailable)
        }
    }
}

/// Whether the root `cert` was authenticated under is still trusted (a
/// reload may have retired it since).
fn check_root_trusted(authority: &Authority, cert: &SessionCert) -> Result<(), AuthError> {
    let (Some(pki), Some(root)) = (authority.pki(), &cert.root) else {
        return Ok(());
    };
    if pki.roots().iter().any(|r| &r.fingerprint == root) {
        Ok(())
    } else {
        Err(AuthError::UntrustedRoot(cert.serial.clone()))
    }
}

/// Refuses a connector an administrator disabled (also checked for
/// plain-text sessions). Fails closed: when the database cannot answer,
/// the connector is refused too.
pub(crate) fn check_not_disabled(authority: &Authority, name: &str) -> Result<(), AuthError> {
    match authority.store().is_disabled(name) {
        Ok(false) => Ok(()),
        Ok(true) => Err(AuthError::ConnectorDisabled(name.to_owned())),
        Err(e) => {
            tracing::error!(error = %e, "cannot look up whether a connector is disabled");
            Err(AuthError::Unavailable)
        }
    }
}

/// Disables (or enables) an enrolled connector. A disabled connector's
/// session ends at once and it can neither reconnect nor re-enroll.
/// `Ok(false)` when no such connector is enrolled.
pub fn set_connector_disabled(
    authority: &Authority,
    name: &str,
    disabled: bool,
) -> Result<bool, StoreError> {
    let found = authority.store().set_disabled(name, disabled, now_ms())?;
    if found && disabled {
        authority.close_connector_streams(name, "connector disabled by an administrator");
    }
    if found {
        tracing::info!(connector = name, disabled, "connector state changed");
    }
    Ok(found)
}

/// Revokes every certificate of a connector and ends its session; it must
/// enroll again (with a provisioning key) to reconnect. `Ok(None)` when
/// no such connector is enrolled, else how many certificates were
/// revoked.
pub fn revoke_connector(authority: &Authority, name: &str) -> Result<Option<usize>, StoreError> {
    let Some(n) =
        authority
            .store()
            .revoke_certificates(name, "revoked by an administrator", now_ms())?
    else {
        return Ok(None);
    };
    if n > 0 {
        authority.close_connector_streams(name, "certificate revoked by an administrator");
        tracing::info!(connector = name, certificates = n, "certificates revoked");
    }
    Ok(Some(n))
}

/// Allows the next enrollment of `name` with its group's provisioning
/// key although it holds a valid certificate (a host rebuilt without
/// its key), once, within `REENROLL_WINDOW`. The certificate in use
/// stays valid until that enrollment supersedes it. `Ok(false)` when no
/// such connector is enrolled.
pub fn allow_reenroll(authority: &Authority, name: &str) -> Result<bool, StoreError> {
    let now = now_ms();
    let until = now.saturating_add(i64::try_from(REENROLL_WINDOW.as_millis()).unwrap_or(i64::MAX));
    let found = authority.store().allow_reenroll(name, until, now)?;
    if found {
        tracing::info!(
            connector = name,
            until_ms = until,
            "re-enrollment allowed once"
        );
    }
    Ok(found)
}

/// Deletes an enrolled connector: revokes its certificates, ends its
/// session and pending streams, forgets it in the registry and frees
/// its name (for any group). `Ok(None)` when no such connector is
/// enrolled, else how many certificates were revoked.
pub fn delete_connector(authority: &Authority, name: &str) -> Result<Option<usize>, StoreError> {
    let Some(n) = authority.store().delete_connector(name, now_ms())? else {
        return Ok(None);
    };
    authority.close_connector_streams(name, "connector deleted by an administrator");
    authority.registry().forget(name);
    // The store ended its drain with it.
    authority.registry().undrained(name);
    // Its (now Unknown) reports go too: the name may come back as
    // another connector, in another group.
    authority
        .health()
        .retain(|_, connector, _| connector != name);
    authority.bump();
    tracing::info!(connector = name, certificates = n, "connector deleted");
    Ok(Some(n))
}

/// Revokes the current provisioning key of `group`; `Ok(false)` when the
/// group has no key. Connectors already enrolled keep working; a new key
/// in the config is a new, unrevoked key, and a key once revoked stays
/// revoked if a reload brings it back. Sessions that the key itself
/// authenticated (metadata authentication, `[tls] enabled = false`)
/// end: here at once, on the other replicas at their next reconcile;
/// streams it authenticated that have not registered yet are refused at
/// registration (`check_standing` checks the session's own key).
pub fn revoke_provisioning_key(authority: &Authority, group: &str) -> Result<bool, StoreError> {
    let state = authority.snapshot();
    let Some(policy) = state.config.key_policies.get(group) else {
        return Ok(false);
    };
    authority
        .store()
        .revoke_key(group, &policy.key_sha256, now_ms())?;
    tracing::info!(group, "provisioning key revoked");
    reconcile_sessions(authority);
    Ok(true)
}

/// Every group's current key: uses, limits, state.
pub fn provisioning_keys(authority: &Authority) -> Result<Vec<KeyView>, StoreError> {
    let state = authority.snapshot();
    let now = now_ms();
    let mut out = Vec::new();
    for g in &state.policy().connector_groups {
        let Some(p) = state.config.key_policies.get(&g.name) else {
            continue;
        };
        let u = authority.store().key_usage(&g.name, &p.key_sha256)?;
        out.push(KeyView {
            group: g.name.clone(),
            uses: u.uses,
            max_uses: p.max_uses,
            expires_at: p.expires_ms,
            revoked_at: u.revoked_ms,
            last_used_at: u.last_used_ms,
            usable: u.revoked_ms.is_none()
                && u.uses < p.max_uses
                && p.expires_ms.is_none_or(|e| now < e),
        });
    }
    Ok(out)
}

/// Whether `key_sha256` is still `group`'s provisioning key in `state`'s
/// configuration (a reload that replaced it ends what it authenticated).
fn key_is_current(
    state: &crate::state::policy_state::PolicyState,
    group: &str,
    key_sha256: &str,
) -> Result<(), AuthError> {
    let current = state.config.key_policies.get(group);
    if current.is_none_or(|p| p.key_sha256 != key_sha256) {
        return Err(AuthError::WrongKey(group.to_owned()));
    }
    Ok(())
}

/// Whether a session of connector `name` on certificate `serial` may go
/// on, given the certificate's record (`None`: never issued) at `now`:
/// not revoked, its connector not disabled, not expired. The one rule for
/// registration and the replicas' reconcile alike.
pub(crate) fn cert_standing(
    record: Option<&CertRecord>,
    serial: &str,
    name: &str,
    now: i64,
) -> Result<(), AuthError> {
    let record = record.ok_or_else(|| AuthError::UnknownCertificate(serial.to_owned()))?;
    if let Some((_, reason)) = &record.revoked {
        return Err(AuthError::CertificateRevoked {
            serial: serial.to_owned(),
            reason: reason.clone(),
        });
    }
    if record.disabled {
        return Err(AuthError::ConnectorDisabled(name.to_owned()));
    }
    if record.not_after_ms <= now {
        return Err(AuthError::CertificateExpired(serial.to_owned()));
    }
    Ok(())
}

fn internal(e: StoreError) -> EnrollError {
    tracing::error!(error = %e, "enrollment could not be recorded");
    EnrollError::Internal
}

/// Closes every live session the store no longer stands behind,
/// whichever replica changed it; returns how many. A session with a
/// client certificate: the certificate revoked, its connector disabled
/// or deleted, expired. A session authenticated by a provisioning key
/// (`[tls] enabled = false`): that very key revoked or no longer its
/// group's key here, or the connector disabled. When the store cannot answer, sessions are left
/// alone (they were admitted, and registration still fails closed).
pub fn reconcile_sessions(authority: &Authority) -> usize {
    let live = authority.registry().live_sessions();
    if live.is_empty() {
        return 0;
    }
    let (records, disabled) = match standings(authority, &live) {
        Ok(found) => found,
        Err(e) => {
            // An outage is logged once, by the store.
            if !e.is_unavailable() {
                tracing::warn!(error = %e, "cannot reconcile sessions with the store");
            }
            return 0;
        }
    };
    let now = crate::ground::clock::now_ms();
    // One key lookup per (group, key) of key-authenticated sessions.
    let mut keys: HashMap<(String, String), Result<(), AuthError>> = HashMap::new();
    let mut closed = 0;
    for s in live {
        let verdict = match &s.serial {
            Some(serial) => cert_standing(records.get(serial), serial, &s.name, now),
            None => match &s.key_sha256 {
                Some(key) => keys
                    .entry((s.group.clone(), key.clone()))
                    .or_insert_with(|| check_key_standing(authority, &s.group, key))
                    .clone(),
                None => Ok(()),
            }
            .and_then(|()| {
                if disabled.contains(&s.name) {
                    Err(AuthError::ConnectorDisabled(s.name.clone()))
                } else {
                    Ok(())
                }
            }),
        };
        // The store not answering is no verdict on the session.
        if let Err(e) = verdict
            && !matches!(e, AuthError::Unavailable)
            && let Some(session) = authority.registry().end(&s.name, s.id)
        {
            authority.close_session(&s.name, session, &e.to_string());
            closed += 1;
        }
    }
    closed
}

/// What the store says of `live` sessions, in one query each: the
/// records of their certificates, and (when any session is
/// key-authenticated) the disabled connectors (asking per session put a
/// query a second per session on the database: 10,000 a second at
/// 10,000 connectors).
fn standings(
    authority: &Authority,
    live: &[crate::state::registry::LiveRef],
) -> Result<Standings, StoreError> {
    let serials: Vec<String> = live.iter().filter_map(|s| s.serial.clone()).collect();
    let records = if serials.is_empty() {
        HashMap::new()
    } else {
        authority.store().certificates(&serials)?
    };
    let disabled = if live.iter().any(|s| s.serial.is_none()) {
        authority.store().disabled_connectors()?
    } else {
        HashSet::new()
    };
    Ok((records, disabled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use tonic::metadata::MetadataMap;

    const POLICY: &str = r#"
        [server]
        allow_short_secrets = true
        [[connector_groups]]
        name = "g"
        provisioning_key = "k"
    "#;

    fn authority(store: Store) -> Authority {
        let config = crate::Config::from_toml(POLICY, std::path::Path::new(".")).expect("valid");
        Authority::with_trust(config, None, store)
    }

    fn metadata(name: &str, key: &str) -> MetadataMap {
        use protocol::metadata as md;
        let mut m = MetadataMap::new();
        for (k, v) in [
            (md::CONNECTOR, name),
            (md::GROUP, "g"),
            (md::PROVISIONING_KEY, key),
        ] {
            m.insert(k, v.parse().expect("ascii"));
        }
        m
    }

    #[test]
    fn standing_is_checked_again_against_the_store() {
        let store = Store::in_memory().expect("db");
        let far = now_ms() + 3_600_000;
        for (name, not_after_ms) in [("c1", far), ("c2", far), ("c3", far), ("old", 10)] {
            let c = crate::store::NewCertificate {
                name,
                group: "g",
                key_sha256: "k1",
                max_uses: 5,
                serial: name,
                fingerprint: "f",
                not_after_ms,
                now_ms: 1,
                root_sha256: "r",
            };
            assert_eq!(store.enroll(&c).expect("db"), Ok(()));
        }
        let a = authority(store);
        let standing = |name: &str| {
            let identity = Identity {
                name: name.into(),
                group: "g".into(),
            };
            let cert = SessionCert {
                serial: name.into(),
                not_after_ms: 0,
                root: None,
            };
            check_standing(&a, &identity, Some(&cert), None)
        };
        assert_eq!(standing("c1"), Ok(()));
        assert!(revoke_connector(&a, "c2").expect("db") == Some(1));
        assert!(matches!(
            standing("c2"),
            Err(AuthError::CertificateRevoked { .. })
        ));
        assert!(set_connector_disabled(&a, "c3", true).expect("db"));
        assert_eq!(
            standing("c3"),
            Err(AuthError::ConnectorDisabled("c3".into()))
        );
        assert_eq!(
            standing("old"),
            Err(AuthError::CertificateExpired("old".into()))
        );
        assert_eq!(
            standing("never"),
            Err(AuthError::UnknownCertificate("never".into()))
        );
    }

    #[test]
    fn a_disabled_connector_is_refused_and_others_are_not() {
        let store = Store::in_memory().expect("db");
        let cert = |name| crate::store::NewCertificate {
            name,
            group: "g",
            key_sha256: "k1",
            max_uses: 5,
            serial: name,
            fingerprint: "f",
            not_after_ms: 10,
            now_ms: 1,
            root_sha256: "r",
        };
        assert_eq!(store.enroll(&cert("c1")).expect("db"), Ok(()));
        assert_eq!(store.enroll(&cert("c2")).expect("db"), Ok(()));
        let a = authority(store);
        assert!(set_connector_disabled(&a, "c1", true).expect("db"));
        assert_eq!(
            authenticate(&a, &metadata("c1", "k")).map(|i| i.name),
            Err(AuthError::ConnectorDisabled("c1".into()))
        );
        assert_eq!(
            authenticate(&a, &metadata("c2", "k")).map(|i| i.name),
            Ok("c2".into())
        );
        assert_eq!(
            authenticate(&a, &metadata("c3", "k")).map(|i| i.name),
            Ok("c3".into())
        );
    }

    /// A certificate is accepted only if it is, byte for byte, the one
    /// recorded under its serial.
    #[test]
    fn the_presented_certificate_must_match_the_stored_fingerprint() {
        let dir = std::env::temp_dir().join(format!("reach-trust-fp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pki = crate::credentials::pki::Pki::load(
            &dir,
            &crate::credentials::pki::TlsSources::default(),
            &[],
            std::time::Duration::from_secs(86_400),
        )
        .expect("pki");
        let key = rcgen::KeyPair::generate().expect("key");
        let csr = rcgen::CertificateParams::new(Vec::<String>::new())
            .expect("params")
            .serialize_request(&key)
            .expect("csr")
            .pem()
            .expect("pem");
        let issued = pki.issue("c1", "g", &csr).expect("issued");
        let der = {
            use rustls::pki_types::CertificateDer;
            use rustls::pki_types::pem::PemObject;
            CertificateDer::from_pem_slice(issued.pem.as_bytes())
                .expect("pem")
                .to_vec()
        };
        for (fingerprint, accepted) in [("0".repeat(64), false), (issued.fingerprint.clone(), true)]
        {
            let store = Store::in_memory().expect("db");
            let record = crate::store::NewCertificate {
                name: "c1",
                group: "g",
                key_sha256: "k1",
                max_uses: 5,
                serial: &issued.serial,
                fingerprint: &fingerprint,
                not_after_ms: issued.not_after_ms,
                now_ms: 1,
                root_sha256: "r",
            };
            assert_eq!(store.enroll(&record).expect("db"), Ok(()));
            let a = authority(store);
            let result = authenticate_cert(&a, Some(&[der.clone()][..])).map(|i| i.name);
            if accepted {
                assert_eq!(result, Ok("c1".into()));
            } else {
                assert_eq!(
                    result,
                    Err(AuthError::UnknownCertificate(issued.serial.clone()))
                );
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_failing_database_refuses_the_session() {
        let store = Store::in_memory().expect("db");
        store.break_for_tests();
        let a = authority(store);
        // With the right key, but the CA cannot tell whether the connector
        // was disabled: it must not let it in.
        assert_eq!(
            authenticate(&a, &metadata("c1", "k")).map(|i| i.name),
            Err(AuthError::Unavailable)
        );
    }
}
