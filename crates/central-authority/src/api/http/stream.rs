//! The change stream: `GET /api/v1/health/stream` (server-sent events)
//! and its one-time tickets, `POST /api/v1/health/stream/ticket`.

use axum::extract::{FromRequestParts, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::api::body::error_body;
use crate::api::route::{Auth, Method, Op, Route, error_ref, route};
use crate::credentials::auth::Scope;

use super::Shared;
use super::extract::{RequireScope, scope};

#[derive(Debug, Deserialize)]
pub(super) struct StreamQuery {
    ticket: Option<String>,
}

/// `GET /api/v1/health/stream`, served by `health_stream`, and its document.
pub(super) fn health_stream_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/health/stream",
            auth: Auth::Scope(Scope::Read),
            spec: json!({
                "operationId": "streamHealth",
                "summary": "Status transitions as they happen (server-sent events)",
                "description": "Events: `hello` (data `{\"version\", \"epoch\"}`: every transition numbered after `version` is in this stream; `epoch` is new in every CA process, so data read under another epoch (a restart, another replica) must be re-read whatever its version), `transition` (data: one entry of `GET /api/v1/events` plus `seq`, also the event id), `lagged` (this client fell behind: re-read the listing); a comment every 15 s keeps proxies from closing the stream. Ends when the CA shuts down. Auth: the read scope, or instead a one-time `ticket` from `POST /api/v1/health/stream/ticket` (for browsers: `EventSource` cannot send `Authorization`).",
                "tags": ["health"],
                "parameters": [{"name": "ticket", "in": "query", "required": false,
                    "description": "a one-time stream ticket (64 hex digits; opens one stream within 30 s of its issue); replaces the bearer token",
                    "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the stream",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}}}},
            }),
        },
        health_stream,
    )
}

/// `GET /api/v1/health/stream`: server-sent events, one `transition` per
/// status change (data: the `GET /api/v1/events` shape plus `seq`), a
/// `lagged` event when this client fell behind (re-read the listing), and
/// a comment every 15 s to keep proxies from closing it. Authorized by the
/// read scope (`Authorization`, or `anonymous_read`) or by a one-time
/// `ticket` (`POST /api/v1/health/stream/ticket`), since a browser's
/// `EventSource` cannot send a header.
pub(super) async fn health_stream(
    State(a): State<Shared>,
    Query(q): Query<StreamQuery>,
    parts: axum::http::request::Parts,
) -> Response {
    use crate::state::history::Live;
    use axum::response::sse::{Event, KeepAlive, Sse};
    use futures::StreamExt as _;

    match q.ticket.as_deref() {
        Some(ticket) => {
            if !a.stream_tickets().redeem(ticket, std::time::Instant::now()) {
                return error_body(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "ticket: unknown, already used or expired (a stream ticket opens one \
                     stream within 30 s; get one with POST /api/v1/health/stream/ticket)",
                    None,
                );
            }
        }
        None => {
            let mut parts = parts;
            if let Err(e) = RequireScope::<scope::Read>::from_request_parts(&mut parts, &a).await {
                return e.into_response();
            }
        }
    }
    // Subscribe before reading the version: every transition numbered
    // after the version the hello names is then in this stream, so a page
    // whose data is at least that version missed nothing.
    let events = a.history().subscribe();
    let hello = Event::default().event("hello").data(
        json!({ "version": a.history().version(), "epoch": a.history().epoch_text() }).to_string(),
    );
    let events = events.map(|item| {
        Ok::<_, std::convert::Infallible>(match item {
            Live::Transition(e) => {
                let data = serde_json::to_string(&*e).unwrap_or_default();
                let event = Event::default().event("transition").data(data);
                match e.seq {
                    Some(seq) => event.id(seq.to_string()),
                    None => event,
                }
            }
            Live::Lagged(n) => Event::default().event("lagged").data(n.to_string()),
        })
    });
    let stream = futures::stream::once(async move { Ok(hello) })
        .chain(events)
        .take_until(a.history().closed());
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(15)))
        .into_response();
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    response
}

/// `POST /api/v1/health/stream/ticket`, served by `stream_ticket`, and its document.
pub(super) fn stream_ticket_route() -> Route {
    route(
        Op {
            method: Method::Post,
            path: "/api/v1/health/stream/ticket",
            auth: Auth::Scope(Scope::Read),
            spec: json!({
                "operationId": "streamTicket",
                "summary": "A one-time ticket that opens the change stream (for browsers)",
                "description": "Trades the read token for a ticket to put in `GET /api/v1/health/stream?ticket=`: 256 random bits, valid for one stream opened within 30 s, granting nothing else. At most 10,000 unused tickets exist at once (503 past that). The request body is ignored (send `{}` as `application/json`).",
                "tags": ["health"],
                "responses": {
                    "200": {"description": "the ticket",
                        "content": {"application/json": {"schema": {"type": "object",
                            "required": ["ticket", "expires_in_ms"],
                            "properties": {"ticket": {"type": "string"}, "expires_in_ms": {"type": "integer"}}},
                            "example": {"ticket": "9f2c…", "expires_in_ms": 30000}}}},
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        stream_ticket,
    )
}

/// `POST /api/v1/health/stream/ticket`: a one-time ticket for
/// `GET /api/v1/health/stream?ticket=` (read scope; the body is ignored).
pub(super) async fn stream_ticket(
    State(a): State<Shared>,
    _: RequireScope<scope::Read>,
) -> Response {
    match a.stream_tickets().issue(std::time::Instant::now()) {
        Ok(ticket) => axum::Json(json!({
            "ticket": ticket,
            "expires_in_ms": u64::try_from(crate::state::tickets::TICKET_TTL.as_millis()).unwrap_or(u64::MAX),
        }))
        .into_response(),
        Err(e) => error_body(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            &e.to_string(),
            None,
        ),
    }
}
