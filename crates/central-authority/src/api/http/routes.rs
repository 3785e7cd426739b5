//! The router: every route, and the browser-safety guard in front of them.

use std::sync::Arc;

use axum::Router;
use axum::routing::{delete, get, post};

use crate::api::dashboard as assets;
use crate::api::sessions::backchannel_logout;
use crate::state::authority::Authority;

use super::access::access;
use super::admin::{end_session, keys, log_receivers, revoke_key, sessions};
use super::audit::audit;
use super::connectors::{connector_action, connectors, delete_connector, load};
use super::drain::{drain_connector, undrain_connector, whatif};
use super::events::events;
use super::health::{application, health, overview};
use super::operations::{livez, metrics, openapi, readyz, replicas, root};
use super::pages::{dashboard, dashboard_app, dashboard_connectors};
use super::stream::{health_stream, stream_ticket};

/// The router over shared state, behind the browser-safety guard (`guard`:
/// JSON bodies only, no cross-origin state changes).
pub fn router(authority: Arc<Authority>) -> Router {
    routes(authority.clone()).layer(axum::middleware::from_fn_with_state(
        authority,
        crate::api::guard::check,
    ))
}

/// Every route (`docs/openapi.json` documents each one; a test keeps them
/// in step).
fn routes(authority: Arc<Authority>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/app", get(dashboard_app))
        .route("/connectors", get(dashboard_connectors))
        .route("/assets/dashboard.js", get(assets::script))
        .route("/assets/dashboard.css", get(assets::style))
        .route("/assets/dashboard-stream.js", get(assets::worker))
        .route("/favicon.ico", get(assets::favicon))
        .route("/api/v1/health", get(health))
        .route("/api/v1/health/stream", get(health_stream))
        .route("/api/v1/health/stream/ticket", post(stream_ticket))
        .route("/api/v1/application", get(application))
        .route("/api/v1/overview", get(overview))
        .route("/api/v1/events", get(events))
        .route("/api/v1/connectors", get(connectors))
        .route("/api/v1/load", get(load))
        .route("/api/v1/replicas", get(replicas))
        .route("/api/v1/root", get(root))
        .route("/api/v1/log_receivers", get(log_receivers))
        .route("/api/v1/access", post(access))
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/healthz", get(readyz))
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/provisioning_keys", get(keys))
        .route("/api/v1/provisioning_keys/{group}/revoke", post(revoke_key))
        .route("/api/v1/connectors/{name}/drain", post(drain_connector))
        .route("/api/v1/connectors/{name}/undrain", post(undrain_connector))
        .route("/api/v1/whatif", get(whatif))
        .route("/api/v1/connectors/{name}/{action}", post(connector_action))
        .route("/api/v1/connectors/{name}", delete(delete_connector))
        .route("/api/v1/audit", get(audit))
        .route("/auth/login", get(crate::api::auth::login))
        .route("/auth/callback", get(crate::api::auth::callback))
        .route("/auth/logout", post(crate::api::auth::logout))
        .route("/auth/cli", post(crate::api::auth::cli_exchange))
        .route("/auth/session", get(crate::api::auth::session))
        .route("/auth/backchannel-logout", post(backchannel_logout))
        .route("/api/v1/sessions", get(sessions))
        .route("/api/v1/sessions/{id}", delete(end_session))
        .with_state(authority)
}
