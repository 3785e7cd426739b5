//! A route of the HTTP API, declared once: the operation it serves (its
//! method, path, who may call it, and its OpenAPI document) with the
//! handler that answers it. Each handler's module declares its routes next
//! to the handler (`fn …_route() -> Route`); `http::routes` lists them, and
//! both the router and the document (`api::openapi`) are made from that
//! list: the router serves the method and path read from the operation, so
//! a route and its document cannot disagree.
//!
//! Also the pieces operations share: JSON bodies of a component schema,
//! the reusable error responses by name, path and query parameters.

use std::sync::Arc;

use axum::handler::Handler;
use axum::routing::{MethodFilter, MethodRouter};
use serde_json::{Value, json};

use crate::state::authority::Authority;

/// One served route: its operation and the handler that answers it. Made
/// only by [`route`].
#[derive(Debug)]
pub struct Route {
    op: Op,
    handler: MethodRouter<Arc<Authority>>,
}

impl Route {
    /// Its operation and its handler, apart.
    pub fn into_parts(self) -> (Op, MethodRouter<Arc<Authority>>) {
        (self.op, self.handler)
    }
}

/// The route serving `op.method` at `op.path` with `handler`.
pub fn route<H, T>(op: Op, handler: H) -> Route
where
    H: Handler<T, Arc<Authority>>,
    T: 'static,
{
    let filter = match op.method {
        Method::Get => MethodFilter::GET,
        Method::Post => MethodFilter::POST,
        Method::Delete => MethodFilter::DELETE,
    };
    Route {
        handler: axum::routing::on(filter, handler),
        op,
    }
}

/// Who may call a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Auth {
    /// No token (load balancers, the document itself).
    None,
    /// A token with this scope (`admin` grants every scope).
    Scope(crate::credentials::auth::Scope),
}

/// The HTTP method of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `GET` (and `HEAD`, which the router answers with it).
    Get,
    /// `POST`.
    Post,
    /// `DELETE`.
    Delete,
}

impl Method {
    /// The method's key in a path item of the document (`get`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "get",
            Method::Post => "post",
            Method::Delete => "delete",
        }
    }

    /// Whether a request with this method may change state (documented
    /// with the errors of a body, refused from another origin).
    pub fn changes_state(self) -> bool {
        match self {
            Method::Get => false,
            Method::Post | Method::Delete => true,
        }
    }
}

/// One documented operation: what a route serves, and its document. The
/// router serves the method and path read from here (`http::routes`).
#[derive(Debug)]
pub struct Op {
    /// The method the route serves.
    pub method: Method,
    /// The router's path, `{param}` for parameters.
    pub path: &'static str,
    /// The operation's JSON (summary, parameters, bodies, responses).
    pub spec: Value,
    /// Who may call it.
    pub auth: Auth,
}

/// A dashboard asset served from the binary: `200` with `content_type`
/// (described by `body`), or `304` when `If-None-Match` names its `ETag`.
pub(crate) fn asset_op(
    path: &'static str,
    id: &str,
    summary: &str,
    content_type: &str,
    body: &str,
) -> Op {
    Op {
        method: Method::Get,
        path,
        auth: Auth::None,
        spec: json!({
            "operationId": id,
            "summary": summary,
            "tags": ["dashboard"],
            "responses": {"200": {"description": body,
                "content": {content_type: {"schema": {"type": "string"}}}},
                "304": {"description": "Not modified: `If-None-Match` names the current `ETag`"}},
        }),
    }
}

/// A JSON body of the component schema `schema`, with its example.
pub(crate) fn json_body(schema: &str, example: Value) -> Value {
    json!({"application/json": {
        "schema": {"$ref": format!("#/components/schemas/{schema}")},
        "example": example,
    }})
}

/// One of the reusable error responses (`error_responses`), by name.
pub(crate) fn error_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/responses/{name}")})
}

/// A path parameter `name`: a non-empty string.
pub(crate) fn name_param(name: &str, description: &str) -> Value {
    json!({
        "name": name, "in": "path", "required": true, "description": description,
        "schema": {"type": "string", "minLength": 1},
    })
}

/// The schema of the query parameter `name` of the listing, history and
/// detail routes: exactly what the handlers accept (`None`: free text).
pub(crate) fn query_schema(name: &str) -> Option<Value> {
    const STATUS: &str = "(up|unhealthy|down|unknown)";
    const PORT: &str =
        "([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])";
    let max_page = json!(crate::api::listing::MAX_PAGE);
    Some(match name {
        "status" => json!({"type": "string", "pattern": format!("^{STATUS}?(,{STATUS}?)*$")}),
        "mode" => json!({"type": "string", "enum": ["continuous", "on_access", "none"]}),
        "sort" => json!({"type": "string",
            "enum": ["host", "segment", "status", "port", "protocol", "mode", "changed"]}),
        "order" => json!({"type": "string", "enum": ["asc", "desc"]}),
        "view" => json!({"type": "string", "enum": ["full", "summary"]}),
        "page" => json!({"type": "integer", "minimum": 1, "maximum": max_page}),
        "protocol" => json!({"type": "string", "enum": ["tcp", "udp"]}),
        "port" => json!({"type": "integer", "minimum": 0, "maximum": 65535}),
        "since" | "until" => json!({"anyOf": [
            {"type": "integer", "minimum": i64::MIN, "maximum": i64::MAX},
            {"type": "string", "format": "date-time"}]}),
        "address" => json!({"anyOf": [
            {"type": "string", "format": "ipv4"},
            {"type": "string", "format": "ipv6"},
            {"type": "string", "enum": ["*"]}]}),
        "app" => json!({"type": "string",
            "pattern": format!("^[^/]+/.+/(tcp|udp)/{PORT}$")}),
        _ => return None,
    })
}

/// `schema`, or the empty string: an optional filter sent empty
/// (`?status=`, as a form sends it) is not given.
pub(crate) fn or_empty(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "string", "maxLength": 0}]})
}

/// A query parameter typed by [`query_schema`].
pub(crate) fn query_param(name: &str, required: bool, description: &str) -> Value {
    let schema = match query_schema(name) {
        Some(s) if !required => or_empty(s),
        Some(s) => s,
        None => json!({"type": "string"}),
    };
    json!({"name": name, "in": "query", "required": required, "description": description,
        "schema": schema})
}

/// The answer of a route that names a thing: none such (`not_found`).
pub(crate) fn not_found(what: &str) -> Value {
    json!({
        "description": format!("no such {what} (reason `not_found`)"),
        "content": json_body("Error", json!({"error": {"reason": "not_found",
            "message": format!("no {what} \"x\"")}})),
    })
}
