//! Reloading the TLS material with the configuration, and rotating the
//! issuing root without downtime. A rotation is three reloads of every
//! replica's configuration (`[tls]`): *introduce* (`next_root_file`: the
//! new root is trusted for client certificates and announced to
//! connectors, the old one still issues), *switch* (`issuer_*_file` name
//! the new root, `previous_root_file` the old one: the new root issues
//! client and server certificates, both are trusted) and *retire*
//! (`previous_root_file` removed: certificates of the old root are
//! refused, sessions on one end).
//!
//! Connectors learn the roots over their sessions (`TrustBundle`, after
//! every `Welcome` and to every session when the roots change); a session
//! whose certificate is not from the issuing root is asked to renew within
//! `Pki::renew_spread`. `GET /api/v1/root` shows where a rotation stands:
//! the roots, the phase and the connectors still on the old root.

use std::sync::Arc;

use protocol::v1;
use protocol::v1::authority_message::Kind as Out;
use serde::Serialize;

use crate::credentials::pki::{Phase, Pki, RootRole};
use crate::credentials::tls::Material;
use crate::ground::clock::now_ms;
use crate::state::authority::Authority;
use crate::state::registry::Outbound;
use crate::store::StoreError;
use crate::trust::enroll::SessionCert;

/// The reason a session on a certificate of a root no longer trusted ends.
const UNTRUSTED: &str = "certificate from a root this CA no longer trusts: enroll again";

/// A trusted root as `GET /api/v1/root` shows it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct RootView {
    /// Its part: `issuing`, `next` (introduced) or `previous` (switched
    /// from, until retired).
    pub role: RootRole,
    /// SHA-256 of the certificate (DER), lower-case hex.
    pub fingerprint: String,
    /// Its subject.
    pub subject: String,
    /// End of its validity, Unix ms.
    pub not_after: i64,
}

/// A connector whose current certificate is not from the new root.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Holdout {
    /// Connector name.
    pub name: String,
    /// Its group.
    pub group: String,
    /// Whether an administrator disabled it.
    pub disabled: bool,
    /// Fingerprint of the root of its current certificate (`null`:
    /// recorded before the CA recorded roots, so not the new one).
    pub root: Option<String>,
    /// End of that certificate's validity, Unix ms.
    pub certificate_not_after: Option<i64>,
}

/// Where a root rotation stands (`GET /api/v1/root`).
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct RootStatus {
    /// `steady` (one root), `introduce` (a new root trusted and announced,
    /// the old one issuing) or `switch` (the new root issuing, the old one
    /// trusted until retired).
    pub phase: Phase,
    /// Every trusted root, the issuing one first.
    pub roots: Vec<RootView>,
    /// Enrolled connectors whose current certificate (unrevoked, unexpired)
    /// is not from the new root (the `next` one while introducing, the
    /// issuing one after the switch); empty when no rotation is in
    /// progress. Retire the old root once it is empty.
    pub on_old_root: Vec<Holdout>,
    /// Connectors connected to this replica that do not keep the trust
    /// bundle (older than 0.2.0, or a connector that does not say it
    /// does): they trust only the root file they were started with, which
    /// must hold the new root before the switch.
    pub without_trust_bundle: Vec<String>,
}

/// The `TrustBundle` for a session on a certificate of `root`: the roots
/// of `pki`, and a request to renew when `root` is not the issuing one.
fn trust_bundle(pki: &Pki, root: Option<&str>) -> v1::AuthorityMessage {
    let renew = root.is_some_and(|r| r != pki.issuing_root());
    v1::AuthorityMessage {
        kind: Some(Out::TrustBundle(v1::TrustBundle {
            roots_pem: pki.bundle_pem(),
            renew_within_ms: if renew {
                u64::try_from(pki.renew_spread().as_millis()).unwrap_or(u64::MAX)
            } else {
                0
            },
        })),
    }
}

/// Whether `pki` trusts the root of fingerprint `root`.
fn trusts(pki: &Pki, root: &str) -> bool {
    pki.roots().iter().any(|r| r.fingerprint == root)
}

/// Puts `material`, loaded for a reloaded configuration, in force (new
/// handshakes get it, connections open before keep theirs). When the
/// trusted roots change, every session learns the new ones, and
/// sessions on a root no longer trusted end. Returns the new server
/// certificate's serial (`None` without TLS).
pub fn install_material(authority: &Authority, material: Option<Material>) -> Option<String> {
    let (Some(tls), Some(material)) = (authority.tls(), material) else {
        return None;
    };
    let serial = material.pki.server_serial();
    let old = tls.replace(material);
    if old.pki.server_serial() != serial {
        tracing::info!(
            serial = serial.as_deref().unwrap_or("?"),
            old_serial = old.pki.server_serial().as_deref().unwrap_or("?"),
            "server certificate replaced: new TLS handshakes get it, connections open before keep theirs"
        );
    }
    retrust(authority, &old.pki, &tls.current().pki);
    serial
}

/// After a reload from `old` to `new` material: when the roots changed,
/// ends the sessions on a root `new` does not trust and sends every
/// other certificate session the new bundle.
fn retrust(authority: &Authority, old: &Pki, new: &Pki) {
    if old.bundle_pem() == new.bundle_pem() {
        return;
    }
    let (closed, kept) = authority.registry().sort_by_root(|root| trusts(new, root));
    tracing::info!(
        phase = ?new.phase(),
        issuing = new.issuing_root(),
        roots = new.roots().len(),
        ended = closed.len(),
        told = kept.len(),
        "trusted roots changed: sessions told the new trust bundle"
    );
    for (name, session) in closed {
        authority.close_session(&name, session, UNTRUSTED);
    }
    for (name, tx, root) in kept {
        if tx.try_send(Ok(trust_bundle(new, Some(&root)))).is_err() {
            authority.close_connector(&name, "outbound queue full during a trust bundle update");
        }
    }
}

/// Tells the session of `name` just registered on `cert` the trust
/// bundle in force (after its `Welcome`; nothing for a plain-text
/// session). A reload between reading the material and registering may
/// have told the sessions it saw before this one: then the newer bundle
/// follows, and a root that reload stopped trusting ends the session.
pub(crate) fn announce_trust(
    authority: &Authority,
    name: &str,
    tx: &Outbound,
    cert: Option<&SessionCert>,
) {
    let (Some(tls), Some(root)) = (authority.tls(), cert.map(|c| c.root.as_deref())) else {
        return;
    };
    let sent = tls.current();
    let _ = tx.try_send(Ok(trust_bundle(&sent.pki, root)));
    let now = tls.current();
    if !Arc::ptr_eq(&sent, &now) {
        let _ = tx.try_send(Ok(trust_bundle(&now.pki, root)));
    }
    if let Some(root) = root
        && !trusts(&now.pki, root)
    {
        authority.close_connector(name, UNTRUSTED);
    }
}

/// Where a root rotation stands: the roots, the phase, the enrolled
/// connectors still on the old root (from the store) and the connected
/// ones that do not keep the trust bundle. `None` without TLS.
pub fn root_status(authority: &Authority) -> Result<Option<RootStatus>, StoreError> {
    let Some(pki) = authority.pki() else {
        return Ok(None);
    };
    let phase = pki.phase();
    let new_root = match phase {
        Phase::Steady => None,
        Phase::Introduce => pki.roots().get(1).map(|r| r.fingerprint.clone()),
        Phase::Switch => Some(pki.issuing_root().to_owned()),
    };
    let now = now_ms();
    let on_old_root = match &new_root {
        None => Vec::new(),
        Some(new_root) => authority
            .store()
            .connectors()?
            .into_iter()
            .filter(|c| c.serial.is_some() && c.not_after_ms.is_some_and(|t| t > now))
            .filter(|c| c.root_sha256.as_deref() != Some(new_root.as_str()))
            .map(|c| Holdout {
                name: c.name,
                group: c.group,
                disabled: c.disabled,
                root: c.root_sha256,
                certificate_not_after: c.not_after_ms,
            })
            .collect(),
    };
    Ok(Some(RootStatus {
        phase,
        roots: pki
            .roots()
            .iter()
            .map(|r| RootView {
                role: r.role,
                fingerprint: r.fingerprint.clone(),
                subject: r.subject.clone(),
                not_after: r.not_after_ms,
            })
            .collect(),
        on_old_root,
        without_trust_bundle: authority.registry().without_trust_bundle(),
    }))
}
