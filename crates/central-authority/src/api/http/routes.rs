//! The router: every route, listed once, and the browser-safety guard in
//! front of them. Each route is declared next to its handler with its
//! operation's document (`api::route`); the router serves each at the
//! method and path its operation names, and the OpenAPI document
//! (`api::openapi`) is made from the same list ([`ops`]), so nothing is
//! served undocumented and nothing documented goes unserved.

use std::sync::Arc;

use axum::Router;

use crate::api::route::{Op, Route};
use crate::state::authority::Authority;

use super::Shared;
use super::{access, admin, audit, connectors, drain, events, health, operations, pages, stream};

/// The router over shared state, behind the browser-safety guard (`guard`:
/// JSON bodies only, no cross-origin state changes).
pub fn router(authority: Arc<Authority>) -> Router {
    served()
        .with_state(authority.clone())
        .layer(axum::middleware::from_fn_with_state(
            authority,
            crate::api::guard::check,
        ))
}

/// Every route of [`routes`] in one router, each at the path and for the
/// method its operation names (the routes of one path merged).
fn served() -> Router<Shared> {
    let mut router = Router::new();
    for r in routes() {
        let (op, handler) = r.into_parts();
        router = router.route(op.path, handler);
    }
    router
}

/// Every route's operation, in the order of [`routes`].
pub(crate) fn ops() -> Vec<Op> {
    routes().into_iter().map(|r| r.into_parts().0).collect()
}

/// Every route the CA's HTTP surface serves.
fn routes() -> Vec<Route> {
    vec![
        pages::dashboard_route(),
        pages::dashboard_app_route(),
        pages::dashboard_connectors_route(),
        pages::script_route(),
        pages::style_route(),
        pages::worker_route(),
        pages::favicon_route(),
        health::health_route(),
        stream::health_stream_route(),
        stream::stream_ticket_route(),
        health::application_route(),
        health::overview_route(),
        events::events_route(),
        connectors::connectors_route(),
        connectors::load_route(),
        operations::replicas_route(),
        operations::root_route(),
        admin::log_receivers_route(),
        access::access_route(),
        operations::metrics_route(),
        operations::livez_route(),
        operations::readyz_route(),
        operations::healthz_route(),
        operations::openapi_route(),
        admin::keys_route(),
        admin::revoke_key_route(),
        drain::drain_connector_route(),
        drain::undrain_connector_route(),
        drain::whatif_route(),
        connectors::connector_action_route(),
        connectors::delete_connector_route(),
        audit::audit_route(),
        crate::api::auth::login_route(),
        crate::api::auth::callback_route(),
        crate::api::auth::logout_route(),
        crate::api::auth::cli_exchange_route(),
        crate::api::auth::session_route(),
        crate::api::sessions::backchannel_logout_route(),
        admin::sessions_route(),
        admin::end_session_route(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route is one operation: no method and path twice (the router
    /// refuses overlapping routes, the document would keep one of them),
    /// no operation id twice, and the document holds each of them.
    #[test]
    fn every_route_is_one_operation_of_the_document() {
        let _router = served();
        let ops = ops();
        assert!(ops.len() >= 10, "too few routes: {}", ops.len());
        let mut keys: Vec<(&str, &str)> = ops.iter().map(|o| (o.method.as_str(), o.path)).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), ops.len(), "a method and path served twice");
        let mut ids: Vec<String> = ops
            .iter()
            .map(|o| {
                o.spec["operationId"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), ops.len(), "an operationId twice, or none");
        let doc = crate::api::openapi::document(super::ops());
        let documented: usize = doc["paths"]
            .as_object()
            .expect("paths")
            .values()
            .map(|item| item.as_object().expect("path item").len())
            .sum();
        assert_eq!(documented, ops.len());
        for (method, path) in keys {
            assert!(doc["paths"][path][method].is_object(), "{method} {path}");
        }
    }

    /// The crate's non-test source files under `src`: (path from `src`,
    /// text up to its `#[cfg(test)]`).
    fn non_test_sources() -> Vec<(String, String)> {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut out = Vec::new();
        let mut dirs = vec![src.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("src dir") {
                let path = entry.expect("entry").path();
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                if path.is_dir() && name != "tests" {
                    dirs.push(path);
                } else if name.ends_with(".rs") && name != "tests.rs" {
                    let text = std::fs::read_to_string(&path).expect("read");
                    let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                    let shown = path.strip_prefix(&src).expect("under src");
                    out.push((shown.display().to_string(), code.to_owned()));
                }
            }
        }
        out
    }

    /// Nothing adds a route to the router but [`served`], from the list:
    /// axum's routing (method routers, `route`, `nest`, `merge`,
    /// `fallback`) is named only in this file, once, with the path of a
    /// [`Route`]'s operation, and in `api::route`, where a `Route` is made
    /// from its operation. So a route cannot be served without its document.
    #[test]
    fn the_router_serves_the_route_list_only() {
        let routing = [
            "axum::routing",
            "routing::",
            ".route(",
            ".route_service(",
            ".nest(",
            ".nest_service(",
            ".merge(",
            ".fallback(",
        ];
        let sources = non_test_sources();
        assert!(sources.len() > 50, "the scan found too few files");
        for (path, code) in &sources {
            if path == "api/route.rs" {
                continue;
            }
            if path == "api/http/routes.rs" {
                let calls: Vec<_> = code.match_indices(".route(").collect();
                assert_eq!(calls.len(), 1, "{path}: {calls:?}");
                assert!(code.contains(".route(op.path, handler)"), "{path}");
                continue;
            }
            for name in routing {
                assert!(
                    !code.contains(name),
                    "{path} names `{name}`: a route is declared with `route(Op, handler)` in its handler's module and listed in api/http/routes.rs"
                );
            }
        }
    }
}
