//! Who a connector session belongs to. Its authentication, by
//! certificate or by provisioning key (a CA run with `[tls] enabled =
//! false`), is in `enroll`, next to the standing checks both pass.

use std::sync::Arc;

/// Who a session belongs to, from its (authenticated) metadata.
#[derive(Clone, Debug)]
pub struct Identity {
    /// Connector name.
    pub name: Arc<str>,
    /// Connector group (shared with every report the session stores).
    pub group: Arc<str>,
}
