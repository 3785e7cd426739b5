//! The change stream: `GET /api/v1/health/stream` (server-sent events)
//! and its one-time tickets, `POST /api/v1/health/stream/ticket`.

use axum::extract::{FromRequestParts, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::api::body::error_body;

use super::Shared;
use super::extract::{RequireScope, scope};

#[derive(Debug, Deserialize)]
pub(super) struct StreamQuery {
    ticket: Option<String>,
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
