//! The Health dashboard's pages (`/`, `/app`, `/connectors`; see
//! `api::dashboard`).

use axum::response::Response;

pub(super) async fn dashboard() -> Response {
    crate::api::dashboard::page(crate::api::dashboard::Page::List)
}

pub(super) async fn dashboard_app() -> Response {
    crate::api::dashboard::page(crate::api::dashboard::Page::Application)
}

pub(super) async fn dashboard_connectors() -> Response {
    crate::api::dashboard::page(crate::api::dashboard::Page::Connectors)
}
