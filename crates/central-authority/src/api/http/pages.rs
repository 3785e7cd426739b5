//! The Health dashboard's pages (`/`, `/app`, `/connectors`; see
//! `api::dashboard`), and the routes of the assets they load (the
//! script, style sheet, worker and icon `api::dashboard` serves).

use axum::response::Response;
use serde_json::json;

use crate::api::route::{Auth, Method, Op, Route, asset_op, route};

/// `GET /`, served by `dashboard`, and its document.
pub(super) fn dashboard_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/",
            auth: Auth::None,
            spec: json!({
                "operationId": "dashboard",
                "summary": "The Health dashboard (HTML)",
                "tags": ["dashboard"],
                "responses": {"200": {"description": "the dashboard page",
                    "content": {"text/html": {"schema": {"type": "string"}}}}},
            }),
        },
        dashboard,
    )
}

pub(super) async fn dashboard() -> Response {
    crate::api::dashboard::page(crate::api::dashboard::Page::List)
}

/// `GET /app`, served by `dashboard_app`, and its document.
pub(super) fn dashboard_app_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/app",
            auth: Auth::None,
            spec: json!({
                "operationId": "dashboardApplication",
                "summary": "The dashboard's application detail page (HTML shell; data from the JSON API)",
                "tags": ["dashboard"],
                "responses": {"200": {"description": "the page",
                    "content": {"text/html": {"schema": {"type": "string"}}}}},
            }),
        },
        dashboard_app,
    )
}

pub(super) async fn dashboard_app() -> Response {
    crate::api::dashboard::page(crate::api::dashboard::Page::Application)
}

/// `GET /connectors`, served by `dashboard_connectors`, and its document.
pub(super) fn dashboard_connectors_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/connectors",
            auth: Auth::None,
            spec: json!({
                "operationId": "dashboardConnectors",
                "summary": "The dashboard's connectors page (HTML shell; data from the JSON API)",
                "tags": ["dashboard"],
                "responses": {"200": {"description": "the page",
                    "content": {"text/html": {"schema": {"type": "string"}}}}},
            }),
        },
        dashboard_connectors,
    )
}

pub(super) async fn dashboard_connectors() -> Response {
    crate::api::dashboard::page(crate::api::dashboard::Page::Connectors)
}

/// `GET /assets/dashboard.js`, served by `script`, and its document.
pub(super) fn script_route() -> Route {
    route(
        asset_op(
            "/assets/dashboard.js",
            "dashboardScript",
            "The dashboard's script",
            "text/javascript",
            "JavaScript (with an `ETag`: a hash of the embedded asset)",
        ),
        crate::api::dashboard::script,
    )
}

/// `GET /assets/dashboard.css`, served by `style`, and its document.
pub(super) fn style_route() -> Route {
    route(
        asset_op(
            "/assets/dashboard.css",
            "dashboardStyle",
            "The dashboard's style sheet",
            "text/css",
            "CSS (with an `ETag`: a hash of the embedded asset)",
        ),
        crate::api::dashboard::style,
    )
}

/// `GET /assets/dashboard-stream.js`, served by `worker`, and its document.
pub(super) fn worker_route() -> Route {
    route(
        asset_op(
            "/assets/dashboard-stream.js",
            "dashboardStreamWorker",
            "The dashboard's SharedWorker: one change stream shared by a browser's tabs over HTTP/1.1",
            "text/javascript",
            "JavaScript (with an `ETag`: a hash of the embedded asset)",
        ),
        crate::api::dashboard::worker,
    )
}

/// `GET /favicon.ico`, served by `favicon`, and its document.
pub(super) fn favicon_route() -> Route {
    route(
        asset_op(
            "/favicon.ico",
            "favicon",
            "The dashboard's icon (SVG)",
            "image/svg+xml",
            "SVG (with an `ETag`: a hash of the embedded icon)",
        ),
        crate::api::dashboard::favicon,
    )
}
