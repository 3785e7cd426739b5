//! The HTTP surface (axum): the Health dashboard's pages (`/`, `/app`,
//! `/connectors`, `/assets/…`; see `dashboard`), the JSON API
//! (`/api/v1/health` with filters and paging, `/api/v1/application`,
//! `/api/v1/overview`, `/api/v1/events`, `/api/v1/root` (where a rotation
//! of the issuing root stands), the change stream
//! `/api/v1/health/stream` as server-sent events, `/api/v1/connectors`,
//! `POST /api/v1/access`),
//! `/metrics`, `/livez`, `/readyz` (`/healthz`) and `/api/v1/openapi.json` (the API's OpenAPI
//! document, `openapi`), plus the admin API (scope `admin`):
//! `GET /api/v1/provisioning_keys`, `POST /api/v1/provisioning_keys/{group}/revoke`,
//! `POST /api/v1/connectors/{name}/{disable,enable,revoke,allow-reenroll}`,
//! `POST /api/v1/connectors/{name}/{drain,undrain}`,
//! `DELETE /api/v1/connectors/{name}`, each recorded in the audit trail
//! (`trust::audit`) with the caller's token name and address, also when
//! refused; and `GET /api/v1/audit`, that trail. `GET /api/v1/whatif`
//! (scope `read`) answers what draining connectors would do.
//!
//! Served over TLS (rustls) when the CA has certificates: one task per
//! connection, a TLS handshake timeout, a bound on open connections, header
//! read timeouts and HTTP/2 stream limits, so a hostile client costs one
//! connection and nothing else.
//!
//! Refusal reasons map to statuses as follows (also in docs/decisions.md):
//! `invalid_request` 400, `unauthorized` 401, `forbidden` 403,
//! `cross_origin` 403, `unsupported_media_type` 415 (both from `guard`),
//! `port_not_in_segment` 403, `no_segment` 404, and `no_connector`,
//! `all_down`, `no_health_report`, `discovery_timeout`, `all_drained` 503.
//!
//! The serving machinery stands apart from the handlers: `serve` (the
//! listener, its connection slots, the TLS handshake, the body read),
//! `routes` (the router: the list of every route, which the OpenAPI
//! document is made from too), `extract` (`RequireScope`, `Caller`),
//! `respond` (shared answers) and `audited` (admin actions in the audit
//! trail). The handlers are grouped by resource: `pages`, `health`,
//! `stream`, `events`, `audit`, `access`, `connectors`, `drain`, `admin`
//! and `operations`; each declares its routes next to its handlers, with
//! their operations' documents (`api::route`).

mod access;
mod admin;
mod audit;
mod audited;
mod connectors;
mod drain;
mod events;
mod extract;
mod health;
mod operations;
mod pages;
mod respond;
mod routes;
mod serve;
mod stream;

use std::sync::{Arc, LazyLock};

use crate::state::authority::Authority;

pub use crate::api::listen::Peer;
pub(crate) use access::parse_access_body;
pub use extract::{Caller, RequireScope, scope};
pub use routes::router;
pub use serve::serve;

type Shared = Arc<Authority>;

/// The HTTP API's OpenAPI document, of every route the router serves
/// (`routes`), rendered once (`api::openapi`): served at
/// `/api/v1/openapi.json` and kept as `docs/openapi.json`.
pub fn openapi_text() -> &'static str {
    static TEXT: LazyLock<String> = LazyLock::new(|| crate::api::openapi::render(routes::ops()));
    &TEXT
}
