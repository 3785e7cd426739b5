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

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use policy::Location;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;

use crate::access::decide::{AccessRequest, Refusal, access_port, port_outside};
use crate::api::body::{
    AccessBody, ApplicationBody, ConnectorsBody, HealthBody, LoadBody, SelectedBody, error_body,
    refusal_status,
};
use crate::api::dashboard as assets;
use crate::api::listen::{Acceptor, Deadlines, Handshaking, JsonErrors, Ticket};
use crate::api::listing::MAX_EVENTS_PER_PAGE;
use crate::api::sessions::backchannel_logout;
use crate::error::ApiError;
use crate::state::authority::Authority;
use crate::state::warmup::Warmth;

type Shared = Arc<Authority>;

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

/// Largest request body the API reads (an access request is ~100 bytes).
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Largest HTTP/2 header list and HTTP/1 read buffer.
const MAX_HEADER_BYTES: u32 = 16 * 1024;

/// Serves the router on `listener` (HTTPS when the CA has certificates)
/// until `shutdown` resolves; open connections get a few seconds to finish.
///
/// Against a hostile crowd: at most `[limits] max_connections` open, at
/// most `http_max_connections_per_source` from one address (more are closed
/// at once); when full, the connections idle longest give way to those
/// waiting, as many at once as wait (`listen::Acceptor`);
/// a connection must send its first byte within `first_byte_timeout` (then
/// finish TLS within the handshake timeout, then send its first byte of
/// HTTP within `first_byte_timeout` again), HTTP/1 headers within
/// `header_timeout`, a body within `body_timeout`, and is closed after
/// `idle_timeout` without traffic while no request is in flight.
pub async fn serve(
    authority: Arc<Authority>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), crate::error::RunError> {
    let settings = authority.snapshot().settings().clone();
    let limits = settings.limits.clone();
    // With TLS, each connection's handshake takes the configuration in
    // force when it arrives (a reload swaps it).
    let tls = authority.tls().is_some().then(|| authority.clone());
    // Answers are gzipped when the client asks (`Accept-Encoding`); the
    // layer's default leaves server-sent events, gRPC and images alone.
    let router = router(authority)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(tower_http::compression::CompressionLayer::new());
    let server = Server {
        builder: Arc::new(connection_builder(&limits)),
        tls,
        router,
        handshake: settings.handshake_timeout,
        limits: limits.clone(),
    };
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let acceptor = Acceptor::new(
        listener,
        limits.max_connections,
        limits.http_max_connections_per_source,
    );
    let mut shutdown = std::pin::pin!(shutdown);
    'accepting: loop {
        let batch = tokio::select! {
            _ = &mut shutdown => break,
            batch = acceptor.next() => batch,
        };
        for (tcp, peer, ticket) in batch.accepted {
            // Full: a connection asked to close makes room.
            let permit = tokio::select! {
                _ = &mut shutdown => break 'accepting,
                permit = acceptor.slot() => match permit {
                    Some(p) => p,
                    None => break 'accepting,
                },
            };
            let ticket = Arc::new(ticket);
            let _ = tcp.set_nodelay(true);
            let server = server.clone();
            let watcher = graceful.watcher();
            tokio::spawn(async move {
                let _permit = permit;
                server.connection(tcp, peer, ticket, watcher).await;
            });
        }
    }
    drop(acceptor);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(std::time::Duration::from_secs(5)) => {}
    }
    Ok(())
}

/// HTTP/1.1 and HTTP/2 connection settings from the listener's limits.
fn connection_builder(limits: &crate::config::Limits) -> Builder<TokioExecutor> {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEADER_BYTES as usize * 4);
    // No HTTP/2 keep-alive pings: they would keep an idle connection
    // "moving"; `Deadlines` closes idle and dead peers instead.
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(MAX_HEADER_BYTES)
        .max_pending_accept_reset_streams(Some(20))
        .max_local_error_reset_streams(Some(100));
    builder
}

/// What every connection of the HTTP listener is served with.
#[derive(Clone)]
struct Server {
    builder: Arc<Builder<TokioExecutor>>,
    /// The CA whose TLS configuration in force each handshake takes
    /// (`None`: plain HTTP).
    tls: Option<Arc<Authority>>,
    router: Router,
    handshake: std::time::Duration,
    limits: crate::config::Limits,
}

impl Server {
    /// Serves one accepted connection (after the TLS handshake, when TLS
    /// is on) until it ends, the CA stops or it gives way to a new one.
    async fn connection(
        self,
        tcp: tokio::net::TcpStream,
        peer: std::net::SocketAddr,
        ticket: Arc<Ticket>,
        watcher: hyper_util::server::graceful::Watcher,
    ) {
        let service =
            connection_service(self.router, peer, ticket.clone(), self.limits.body_timeout);
        let (first_byte, idle) = (self.limits.first_byte_timeout, self.limits.idle_timeout);
        let builder = self.builder;
        let serve = async {
            let acceptor = self
                .tls
                .as_ref()
                .and_then(|a| a.tls())
                .map(|t| tokio_rustls::TlsAcceptor::from(t.current().http.clone()));
            match acceptor {
                Some(acceptor) => {
                    let handshake = self.handshake;
                    let Some(tls) =
                        tls_handshake(&acceptor, tcp, peer, &ticket, first_byte, handshake).await
                    else {
                        return Ok(());
                    };
                    let conn = builder.serve_connection(
                        TokioIo::new(JsonErrors::new(Deadlines::new(
                            tls,
                            ticket.clone(),
                            first_byte,
                            idle,
                        ))),
                        service,
                    );
                    watcher.watch(conn.into_owned()).await
                }
                None => {
                    let conn = builder.serve_connection(
                        TokioIo::new(JsonErrors::new(Deadlines::new(
                            tcp,
                            ticket.clone(),
                            first_byte,
                            idle,
                        ))),
                        service,
                    );
                    watcher.watch(conn.into_owned()).await
                }
            }
        };
        let result = tokio::select! {
            r = serve => r,
            () = ticket.evicted() => {
                tracing::debug!(%peer, "HTTPS: idle connection closed to make room");
                return;
            }
        };
        if let Err(e) = result {
            tracing::debug!(%peer, error = %e, "HTTP connection ended with an error");
        }
    }
}

/// The TLS handshake of an accepted connection: the first byte (of the
/// ClientHello) within `first_byte`, the whole handshake within
/// `handshake`, both counted from accept. `None` (logged) when it failed.
async fn tls_handshake(
    acceptor: &tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    ticket: &Arc<Ticket>,
    first_byte: std::time::Duration,
    handshake: std::time::Duration,
) -> Option<tokio_rustls::server::TlsStream<Handshaking<tokio::net::TcpStream>>> {
    let handshaken = tokio::time::timeout(handshake, async {
        let mut first = [0u8; 1];
        match tokio::time::timeout(first_byte, tcp.peek(&mut first)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => return Err("no first byte in time".to_owned()),
        }
        // Each byte of the handshake keeps it from counting as idle
        // (`Admission::evict_idle`).
        let tcp = Handshaking::new(tcp, ticket.clone());
        acceptor.accept(tcp).await.map_err(|e| e.to_string())
    })
    .await;
    match handshaken {
        Ok(Ok(mut tls)) => {
            // `Deadlines` records movement from here.
            tls.get_mut().0.done();
            Some(tls)
        }
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "HTTPS: TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "HTTPS: TLS handshake timed out");
            None
        }
    }
}

pub use crate::api::listen::Peer;

/// One connection's service: marks the connection busy while a request is
/// in flight, reads the body within `body_timeout` (408 otherwise), records
/// the peer's address, then runs the router.
fn connection_service(
    router: Router,
    peer: std::net::SocketAddr,
    ticket: Arc<crate::api::listen::Ticket>,
    body_timeout: std::time::Duration,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<Response, std::convert::Infallible>> + Send,
> + Clone {
    use hyper::service::Service as _;
    let router = hyper_util::service::TowerToHyperService::new(router);
    hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let (router, ticket) = (router.clone(), ticket.clone());
        async move {
            let _busy = ticket.busy();
            let (mut parts, body) = request.into_parts();
            parts.extensions.insert(Peer(peer));
            let body = match read_body(&parts.headers, body, body_timeout).await {
                Ok(bytes) => bytes,
                Err(refusal) => return Ok(crate::api::guard::with_api_headers(refusal)),
            };
            let request = hyper::Request::from_parts(parts, axum::body::Body::from(body));
            router.call(request).await
        }
    })
}

/// A request's body, read whole within `body_timeout`. Refused: a
/// declared `Content-Length` over `MAX_BODY_BYTES` at once, before a byte
/// is read (so a client that sent `Expect: 100-continue` gets 413 instead
/// of `100 Continue`), a body that grows past it (413), a malformed one
/// (broken chunked framing, a connection lost mid-body: 400), a late one
/// (408).
async fn read_body(
    headers: &header::HeaderMap,
    body: hyper::body::Incoming,
    body_timeout: std::time::Duration,
) -> Result<Bytes, Response> {
    use http_body_util::BodyExt as _;
    let too_large = || {
        error_body(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request",
            &format!("request body over {MAX_BODY_BYTES} bytes"),
            None,
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let limited = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    match tokio::time::timeout(body_timeout, limited.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(error_body(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &format!("malformed request body: {e}"),
            None,
        )),
        Err(_) => Err(error_body(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            "the request body did not arrive in time",
            None,
        )),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let answer = self.answer();
        let mut r = error_body(answer.http, answer.reason, &self.message(), None);
        if let Some(s) = self.retry_after_s() {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(s));
        }
        if answer.http == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        r
    }
}

/// A handler argument that lets the request through only if its caller may
/// use scope `S` (`auth::authorize`; the rejection is the `ApiError`), so a
/// handler declares its scope in its signature.
#[derive(Debug)]
pub struct RequireScope<S>(PhantomData<S>);

/// The scopes as types, for [`RequireScope`].
pub mod scope {
    use crate::credentials::auth::Scope;

    /// A scope as a type.
    pub trait Required: Send + Sync + 'static {
        /// The scope.
        const SCOPE: Scope;
    }

    /// `Scope::Read`.
    #[derive(Debug)]
    pub struct Read;
    /// `Scope::Access`.
    #[derive(Debug)]
    pub struct Access;
    /// `Scope::Admin`.
    #[derive(Debug)]
    pub struct Admin;

    impl Required for Read {
        const SCOPE: Scope = Scope::Read;
    }
    impl Required for Access {
        const SCOPE: Scope = Scope::Access;
    }
    impl Required for Admin {
        const SCOPE: Scope = Scope::Admin;
    }
}

impl<S: scope::Required> FromRequestParts<Shared> for RequireScope<S> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, a: &Shared) -> Result<Self, ApiError> {
        // A person's session cookie (`api::auth`), when no token is sent.
        if let Some(s) =
            crate::api::auth::authorize_session(a, &parts.method, &parts.headers, S::SCOPE).await
        {
            return s.map(|_| RequireScope(PhantomData)).map_err(ApiError::from);
        }
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        // Guesses are throttled per source address (`trust::throttle`).
        let source = parts.extensions.get::<Peer>().map(|p| p.0.ip());
        a.authorize_from(source, header, S::SCOPE)?;
        Ok(RequireScope(PhantomData))
    }
}

/// The caller of an admin action: who (the token's configured name) and
/// from where. A token without the `admin` scope is let through with its
/// refusal, so the handler records the refused action before it answers
/// 403; no, malformed, unknown or throttled tokens are rejected here
/// (nobody to attribute the attempt to: the last three are counted per
/// source and minute, `refused_token`).
#[derive(Debug)]
pub struct Caller {
    actor: crate::trust::audit::Actor,
    source: Option<std::net::IpAddr>,
    refused: Option<ApiError>,
}

impl FromRequestParts<Shared> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, a: &Shared) -> Result<Self, ApiError> {
        use crate::credentials::auth::{AuthError, Scope};
        use crate::trust::audit::Actor;
        let source = parts.extensions.get::<Peer>().map(|p| p.0.ip());
        // A person's session cookie, when no token is sent.
        let session = match parts.headers.contains_key(header::AUTHORIZATION) {
            true => None,
            false => crate::api::auth::session_of(a, &parts.headers).await,
        };
        if let Some(s) = session {
            let s = s?;
            crate::api::auth::check_csrf(&parts.method, &parts.headers, &s)?;
            let refused = (!s.allows(Scope::Admin)).then(|| {
                ApiError::Auth(AuthError::PersonMissingScope {
                    person: s.person.clone(),
                    scope: Scope::Admin.as_str(),
                })
            });
            return Ok(Caller {
                actor: Actor::person(s.person, s.provider, s.subject),
                source,
                refused,
            });
        }
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match a.authorize_from(source, header, Scope::Admin) {
            Ok(()) => {}
            Err(AuthError::MissingScope { token, scope }) => {
                return Ok(Caller {
                    actor: Actor::token(token.clone()),
                    source,
                    refused: Some(ApiError::Auth(AuthError::MissingScope { token, scope })),
                });
            }
            Err(e) => {
                if matches!(
                    e,
                    AuthError::UnknownToken | AuthError::Malformed | AuthError::Throttled { .. }
                ) {
                    refused_token(a, source).await;
                }
                return Err(e.into());
            }
        }
        let state = a.snapshot();
        let name = crate::credentials::auth::bearer(&state.config.tokens, header, Scope::Admin)?;
        Ok(Caller {
            actor: Actor::token(name),
            source,
            refused: None,
        })
    }
}

/// Counts an admin request refused for an unknown, malformed or throttled
/// token in the audit trail: one `token.refused` entry per source and
/// minute with the count (the throttle bounds how many come). The request
/// is refused either way; a count the store cannot write is logged.
async fn refused_token(a: &Shared, source: Option<std::net::IpAddr>) {
    let source = source.map(|s| s.to_string()).unwrap_or_default();
    let minute = crate::ground::clock::now_ms() / 60_000 * 60_000;
    let counted = a
        .blocking(move |a| a.store().count_refusal(&source, minute))
        .await;
    if let Some(Err(e)) = counted {
        tracing::error!(error = %e, "audit trail: a refused token could not be counted");
    }
}

/// Runs admin `action` on `target` for `caller` off the async workers and
/// records it in the audit trail: `refused` (the caller lacks the `admin`
/// scope; `f` does not run), else `ok` (`f` found the target; the answer's
/// fields are the detail), `not_found` or `failed`.
async fn audited(
    a: &Shared,
    caller: Caller,
    action: &'static str,
    target: String,
    f: impl FnOnce(&Authority) -> Result<Option<serde_json::Value>, crate::store::StoreError>
    + Send
    + 'static,
) -> Result<Option<serde_json::Value>, Response> {
    audited_as(a, caller, action, target, move |a| {
        Ok(f(a)?.map_or(Acted::NotFound, Acted::Done))
    })
    .await
}

/// What an admin action's work came to.
enum Acted {
    /// Done: the answer's fields (also the audit entry's detail).
    Done(serde_json::Value),
    /// No such target; nothing changed.
    NotFound,
    /// Declined by the action's own rule (a drain that would leave an
    /// application without a connector): nothing changed; the answer, and
    /// why for the audit entry (`refused`).
    Declined(Response, String),
    /// A read (of the audit trail): the answer, and the entry's detail
    /// (the query, not the answer).
    Read(serde_json::Value, String),
}

/// Why an audited action was not done.
enum NotDone {
    /// The caller lacks the `admin` scope.
    Refused(ApiError),
    /// The action's own rule declined it (its answer).
    Declined(Box<Response>),
    /// The store failed.
    Store(crate::store::StoreError),
    /// The audit trail could not record it.
    Trail,
}

/// [`audited`] for an action that may also be declined (`Acted::Declined`,
/// recorded as `refused` with its reason).
async fn audited_as(
    a: &Shared,
    caller: Caller,
    action: &'static str,
    target: String,
    f: impl FnOnce(&Authority) -> Result<Acted, crate::store::StoreError> + Send + 'static,
) -> Result<Option<serde_json::Value>, Response> {
    use crate::trust::audit::{AdminAction, Outcome};
    let Caller {
        actor,
        source,
        refused,
    } = caller;
    let done = a
        .blocking(move |a| {
            let (result, outcome, detail) = match refused {
                Some(refusal) => {
                    let detail = refusal.message();
                    (Err(NotDone::Refused(refusal)), Outcome::Refused, detail)
                }
                None => match f(a) {
                    Ok(Acted::Done(v)) => {
                        let detail = v.to_string();
                        (Ok(Some(v)), Outcome::Ok, detail)
                    }
                    Ok(Acted::Read(v, query)) => (Ok(Some(v)), Outcome::Ok, query),
                    Ok(Acted::NotFound) => (Ok(None), Outcome::NotFound, String::new()),
                    Ok(Acted::Declined(answer, why)) => (
                        Err(NotDone::Declined(Box::new(answer))),
                        Outcome::Refused,
                        why,
                    ),
                    Err(e) => {
                        let detail = e.to_string();
                        (Err(NotDone::Store(e)), Outcome::Failed, detail)
                    }
                },
            };
            let recorded = a.audit(&AdminAction {
                actor: &actor,
                source,
                action,
                target: &target,
                outcome,
                detail,
            });
            // No action stands unrecorded: without its entry a done action
            // is answered as failed. One that was not done keeps its own
            // answer (a store that does not answer fails the entry too).
            match result {
                Ok(v) => recorded.map(|()| v).map_err(|_| NotDone::Trail),
                Err(not_done) => Err(not_done),
            }
        })
        .await;
    match done {
        Some(Ok(v)) => Ok(v),
        Some(Err(NotDone::Refused(refusal))) => Err(refusal.into_response()),
        Some(Err(NotDone::Declined(answer))) => Err(*answer),
        // A store that does not answer is 503 `store_unavailable`, any
        // other database failure 500 (`storage` logs either).
        Some(Err(NotDone::Store(e))) => Err(storage(e)),
        Some(Err(NotDone::Trail)) => Err(trail_unavailable()),
        None => Err(shutting_down()),
    }
}

/// `views` with `enrolled_unconnected` set (`Authority::note_unconnected`,
/// off the async workers: it reads the store), or as they are when none
/// needs it; `None` when the runtime is shutting down.
async fn noted_unconnected(
    a: &Shared,
    mut views: Vec<crate::api::views::ApplicationView>,
) -> Option<Vec<crate::api::views::ApplicationView>> {
    if !views
        .iter()
        .any(crate::api::views::ApplicationView::lacks_connectors)
    {
        return Some(views);
    }
    a.blocking(move |a| {
        a.note_unconnected(&mut views);
        views
    })
    .await
}

/// `GET /api/v1/health`: filtered, sorted and (when `page` or `per_page`
/// is given) paged; without them every row, as before paging existed.
async fn health(
    State(a): State<Shared>,
    _: RequireScope<scope::Read>,
    Query(raw): Query<crate::api::listing::RawQuery>,
) -> Response {
    let q = match crate::api::listing::ListQuery::parse(&raw) {
        Ok(q) => q,
        Err(e) => return e.into_response(),
    };
    // Read before the table: a transition after it shows in the stream.
    let version = a.history().version();
    let epoch = a.history().epoch_text();
    // Cheap rows first; views only for the page's rows.
    let rows = a.rows(&crate::api::views::RowFilter {
        segment: q.segment.as_deref(),
        group: q.group.as_deref(),
        connector: q.connector.as_deref(),
    });
    let mut page = crate::api::listing::run(rows, &q);
    let views = a.views(std::mem::take(&mut page.rows).into_iter().map(|r| r.item));
    let Some(mut views) = noted_unconnected(&a, views).await else {
        return shutting_down();
    };
    if q.summary {
        for v in &mut views {
            v.summarise();
        }
    }
    axum::Json(HealthBody {
        listing: crate::api::body::Listing::new(page, views),
        version,
        epoch,
    })
    .into_response()
}

#[derive(Debug, Deserialize)]
struct AppQuery {
    segment: Option<String>,
    host: Option<String>,
    protocol: Option<String>,
    port: Option<String>,
}

/// `GET /api/v1/application?segment=&host=&protocol=&port=`: one row of
/// the listing (port 0 for a wildcard or subnet entry's row).
async fn application(
    State(a): State<Shared>,
    _: RequireScope<scope::Read>,
    Query(q): Query<AppQuery>,
) -> Response {
    let missing = |name: &str| {
        ApiError::InvalidRequest(format!(
            "{name}: missing (segment, host, protocol and port are required)"
        ))
        .into_response()
    };
    let Some(segment) = q.segment.filter(|s| !s.is_empty()) else {
        return missing("segment");
    };
    let Some(host) = q.host.filter(|s| !s.is_empty()) else {
        return missing("host");
    };
    let Some(protocol) = q.protocol else {
        return missing("protocol");
    };
    let protocol = match crate::api::body::api_protocol(&protocol) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let Some(port) = q.port else {
        return missing("port");
    };
    let Ok(port) = port.parse::<u16>() else {
        return ApiError::InvalidRequest(format!(
            "port: {:?} is not a port (0-65535)",
            port.chars().take(16).collect::<String>()
        ))
        .into_response();
    };
    let host = policy::host::lookup_key(&host);
    // Read before the view: a transition after it shows in the stream.
    let version = a.history().version();
    let epoch = a.history().epoch_text();
    let row = a
        .rows(&crate::api::views::RowFilter {
            segment: Some(&segment),
            ..Default::default()
        })
        .into_iter()
        .find(|r| r.host == host && r.protocol == protocol && r.port == port);
    let key = match row.as_ref().map(|r| &r.item) {
        Some(crate::api::views::RowItem::App(key)) => Some(key.clone()),
        _ => None,
    };
    let views = row.map(|r| a.views([r.item])).unwrap_or_default();
    let Some(mut views) = noted_unconnected(&a, views).await else {
        return shutting_down();
    };
    match views.pop() {
        Some(application) => axum::Json(ApplicationBody {
            application,
            rtt_series: key.as_ref().map(|k| a.rtt_series(k)).unwrap_or_default(),
            address_history: key.map(|k| a.address_history(&k)).unwrap_or_default(),
            version,
            epoch,
        })
        .into_response(),
        None => error_body(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such application (or it is hidden)",
            None,
        ),
    }
}

/// `GET /api/v1/load`: each connector's check-load estimate over the last
/// day against the budget.
async fn load(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
    axum::Json(LoadBody {
        check_budget: a.snapshot().settings().check_budget,
        connectors: a.load_series(),
    })
    .into_response()
}

#[derive(Debug, Deserialize)]
struct StreamQuery {
    ticket: Option<String>,
}

/// `GET /api/v1/health/stream`: server-sent events, one `transition` per
/// status change (data: the `GET /api/v1/events` shape plus `seq`), a
/// `lagged` event when this client fell behind (re-read the listing), and
/// a comment every 15 s to keep proxies from closing it. Authorized by the
/// read scope (`Authorization`, or `anonymous_read`) or by a one-time
/// `ticket` (`POST /api/v1/health/stream/ticket`), since a browser's
/// `EventSource` cannot send a header.
async fn health_stream(
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
async fn stream_ticket(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
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

#[derive(Serialize)]
struct ConnectorCounts {
    total: usize,
    connected: usize,
    disconnected: usize,
    over_budget: usize,
    disabled: usize,
    drained: usize,
}

/// `GET /api/v1/overview`: counts by status of every visible application
/// and of the connectors.
async fn overview(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
    let Some(connectors) = a.blocking(Authority::connectors).await else {
        return shutting_down();
    };
    let version = a.history().version();
    let rows = a.rows(&crate::api::views::RowFilter::default());
    axum::Json(json!({
        "applications": crate::api::listing::Counts::of(rows.iter().map(|r| r.status)),
        "applications_total": rows.len(),
        "connectors": ConnectorCounts {
            total: connectors.len(),
            connected: connectors.iter().filter(|c| c.connected).count(),
            disconnected: connectors.iter().filter(|c| !c.connected).count(),
            // Over budget now: a disconnected connector's load is as of
            // when it was last seen.
            over_budget: connectors.iter().filter(|c| c.connected && c.over_budget).count(),
            disabled: connectors.iter().filter(|c| c.disabled).count(),
            drained: connectors.iter().filter(|c| c.drained.is_some()).count(),
        },
        "check_budget": a.snapshot().settings().check_budget,
        "version": version,
        "epoch": a.history().epoch_text(),
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
struct EventsQuery {
    app: Option<String>,
    segment: Option<String>,
    host: Option<String>,
    protocol: Option<String>,
    port: Option<String>,
    connector: Option<String>,
    address: Option<String>,
    since: Option<String>,
    until: Option<String>,
    page: Option<String>,
    per_page: Option<String>,
}

/// An events filter's address: an IP address (in its normal form), or `*`
/// for every address.
fn event_address(a: &str) -> Result<String, ApiError> {
    if a == "*" {
        return Ok(a.to_owned());
    }
    a.parse::<policy::Host>()
        .ok()
        .and_then(|h| h.ip())
        .map(|ip| ip.to_string())
        .ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "address: {:?} is neither an IP address nor *",
                a.chars().take(64).collect::<String>()
            ))
        })
}

/// A time parameter: Unix milliseconds or RFC 3339.
fn parse_time(name: &str, v: &str) -> Result<i64, ApiError> {
    if let Ok(ms) = v.parse::<i64>() {
        return Ok(ms);
    }
    time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc3339)
        .map(|t| i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX))
        .map_err(|_| {
            ApiError::InvalidRequest(format!(
                "{name}: {:?} is neither Unix milliseconds nor an RFC 3339 time",
                v.chars().take(64).collect::<String>()
            ))
        })
}

/// Parses `GET /api/v1/events`' query into a filter and paging.
/// An events filter's port: 0-65535.
fn event_port(p: &str) -> Result<i64, ApiError> {
    p.parse::<u16>().map(i64::from).map_err(|_| {
        ApiError::InvalidRequest(format!(
            "port: {:?} is not a port (0-65535)",
            p.chars().take(16).collect::<String>()
        ))
    })
}

fn events_query(q: EventsQuery) -> Result<(crate::store::EventFilter, u64, u32), ApiError> {
    let given = |v: Option<String>| v.filter(|s| !s.is_empty());
    let mut f = crate::store::EventFilter {
        segment: given(q.segment),
        host: given(q.host).map(|h| policy::host::lookup_key(&h)),
        protocol: given(q.protocol),
        connector: given(q.connector),
        address: given(q.address).map(|a| event_address(&a)).transpose()?,
        ..Default::default()
    };
    let mut port = given(q.port);
    // Each parameter is checked as sent, even when `app` then replaces it.
    if let Some(p) = &f.protocol {
        crate::api::body::api_protocol(p)?;
    }
    if let Some(p) = &port {
        event_port(p)?;
    }
    if let Some(app) = given(q.app) {
        // segment/host/protocol/port; a subnet host has a '/' of its own.
        let mut tail = app.rsplitn(3, '/');
        let (p, proto, rest) = (tail.next(), tail.next(), tail.next());
        let (Some(p), Some(proto), Some((segment, host))) =
            (p, proto, rest.and_then(|r| r.split_once('/')))
        else {
            return Err(ApiError::InvalidRequest(
                "app: expected segment/host/protocol/port".into(),
            ));
        };
        f.segment = Some(segment.to_owned());
        f.host = Some(policy::host::lookup_key(host));
        f.protocol = Some(proto.to_owned());
        port = Some(p.to_owned());
    }
    if let Some(p) = &f.protocol {
        crate::api::body::api_protocol(p)?;
    }
    if let Some(p) = port {
        f.port = Some(event_port(&p)?);
    }
    f.since_ms = given(q.since)
        .map(|v| parse_time("since", &v))
        .transpose()?;
    f.until_ms = given(q.until)
        .map(|v| parse_time("until", &v))
        .transpose()?;
    let (page, per_page) = history_paging(q.page, q.per_page)?;
    Ok((f, page, per_page))
}

/// The `page` and `per_page` of a history listing (`/api/v1/events`,
/// `/api/v1/audit`), taken as sent (an empty value is not given): page
/// from 1, 1 to [`MAX_EVENTS_PER_PAGE`] rows, 100 unless given.
fn history_paging(page: Option<String>, per_page: Option<String>) -> Result<(u64, u32), ApiError> {
    let given = |v: Option<String>| v.filter(|s| !s.is_empty());
    let page = match given(page) {
        None => 1,
        Some(p) => p
            .parse::<u64>()
            .ok()
            .filter(|p| (1..=crate::api::listing::MAX_PAGE as u64).contains(p))
            .ok_or_else(|| {
                ApiError::InvalidRequest(format!(
                    "page: not a whole number from 1 to {}",
                    crate::api::listing::MAX_PAGE
                ))
            })?,
    };
    let per_page = match given(per_page) {
        None => 100,
        Some(p) => p
            .parse::<u32>()
            .ok()
            .filter(|p| (1..=MAX_EVENTS_PER_PAGE).contains(p))
            .ok_or_else(|| {
                ApiError::InvalidRequest(format!(
                    "per_page: not a whole number from 1 to {MAX_EVENTS_PER_PAGE}"
                ))
            })?,
    };
    Ok((page, per_page))
}

/// `GET /api/v1/events`: the stored status history, newest first.
async fn events(
    State(a): State<Shared>,
    _: RequireScope<scope::Read>,
    Query(q): Query<EventsQuery>,
) -> Response {
    let (filter, page, per_page) = match events_query(q) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    match admin(&a, move |a| {
        crate::intake::transitions::events(a, filter, page, per_page)
    })
    .await
    {
        Ok(page) => axum::Json(page).into_response(),
        Err(response) => response,
    }
}

#[derive(Debug, Deserialize)]
struct AuditQuery {
    since: Option<String>,
    action: Option<String>,
    target: Option<String>,
    actor: Option<String>,
    page: Option<String>,
    per_page: Option<String>,
}

/// Parses `GET /api/v1/audit`'s query into a filter and paging (as
/// `GET /api/v1/events` pages).
fn audit_query(q: AuditQuery) -> Result<(crate::store::AuditFilter, u64, u32), ApiError> {
    let given = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let (page, per_page) = history_paging(q.page, q.per_page)?;
    let filter = crate::store::AuditFilter {
        since_ms: given(q.since)
            .map(|v| parse_time("since", &v))
            .transpose()?,
        action: given(q.action),
        target: given(q.target),
        actor: given(q.actor),
    };
    Ok((filter, page, per_page))
}

/// `GET /api/v1/audit`: the audit trail of admin actions, newest first.
/// The read is itself an entry (`audit.read`, its query as the detail),
/// recorded once the page is read; a refused one too.
async fn audit(
    State(a): State<Shared>,
    caller: Caller,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
    Query(q): Query<AuditQuery>,
) -> Response {
    let (filter, page, per_page) = match audit_query(q) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let query = raw.unwrap_or_default();
    let read = audited_as(&a, caller, "audit.read", String::new(), move |a| {
        let page = a.audit_page(&filter, page, per_page)?;
        let answer = serde_json::to_value(page).unwrap_or_default();
        Ok(Acted::Read(answer, query))
    })
    .await;
    match read {
        Ok(page) => axum::Json(page.unwrap_or_default()).into_response(),
        Err(response) => response,
    }
}

/// Whether the caller of a read route (let through by its scope) also has
/// the `admin` scope: it then sees what only administrators see.
async fn caller_is_admin(a: &Shared, headers: &axum::http::HeaderMap) -> bool {
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match crate::api::auth::session_of(a, headers).await {
        Some(Ok(s)) if header.is_none() => s.allows(crate::credentials::auth::Scope::Admin),
        _ => crate::credentials::auth::authorize(
            &a.snapshot().config.tokens,
            false,
            header,
            crate::credentials::auth::Scope::Admin,
        )
        .is_ok(),
    }
}

async fn connectors(
    State(a): State<Shared>,
    headers: axum::http::HeaderMap,
    _: RequireScope<scope::Read>,
) -> Response {
    let admin = caller_is_admin(&a, &headers).await;
    // Enrolled connectors come from the database: off the async workers.
    match a.blocking(Authority::connectors).await {
        Some(connectors) => axum::Json(ConnectorsBody {
            connectors: connectors
                .into_iter()
                .map(|c| if admin { c } else { c.without_admin_fields() })
                .collect(),
            check_budget: a.snapshot().settings().check_budget,
        })
        .into_response(),
        None => shutting_down(),
    }
}

async fn access(State(a): State<Shared>, _: RequireScope<scope::Access>, body: Bytes) -> Response {
    match access_inner(&a, &body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Parses a `POST /api/v1/access` body (untrusted JSON: the fuzz target
/// `http_bodies` runs it on arbitrary bytes): the request and the user's
/// location, if it names one.
pub(crate) fn parse_access_body(
    body: &[u8],
) -> Result<(AccessRequest, Option<Location>), ApiError> {
    // serde reads a struct from a JSON array too (`["h","tcp",80]`); the
    // document says object.
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        return Err(ApiError::InvalidRequest(
            "body: expected a JSON object {\"host\", \"protocol\", \"port\"}".into(),
        ));
    }
    let body: AccessBody =
        serde_json::from_slice(body).map_err(|e| ApiError::InvalidRequest(format!("body: {e}")))?;
    let protocol = crate::api::body::api_protocol(&body.protocol)?;
    let integral = body.port.as_i64().or_else(|| {
        body.port
            .as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
            .map(|f| f as i64)
    });
    let port = integral
        .ok_or_else(|| port_outside(&body.port))
        .and_then(access_port)?;
    let user_location = body
        .user_location
        .map(|l| Location::new(l.latitude, l.longitude))
        .transpose()
        .map_err(|e| ApiError::InvalidRequest(format!("user_location.{e}")))?;
    Ok((
        AccessRequest {
            host: body.host,
            protocol,
            port: u32::from(port),
        },
        user_location,
    ))
}

async fn access_inner(a: &Authority, body: &[u8]) -> Result<Response, ApiError> {
    let (request, user_location) = parse_access_body(body)?;
    let outcome = a.resolve_from(request, user_location).await?;
    Ok(match outcome.decision {
        Ok(s) => json_response(selected_json(&SelectedBody {
            connector: s.connector,
            group: s.group,
            segment: s.segment,
            explanation: outcome.explanation,
        })),
        Err(Refusal { reason, message }) => error_body(
            refusal_status(reason),
            reason.as_str(),
            &message,
            serde_json::to_value(&outcome.explanation).ok(),
        ),
    })
}

/// The JSON of `body` (the same bytes as serde's; a test compares them),
/// written by hand into a buffer sized for it (see
/// `ExplanationView::write_json`).
fn selected_json(body: &SelectedBody) -> Vec<u8> {
    use crate::access::explain::json;
    let candidates = body
        .explanation
        .selection
        .as_ref()
        .map_or(0, |e| e.candidates.len());
    let mut out = Vec::with_capacity(512 + 160 * candidates);
    out.extend_from_slice(b"{\"connector\":");
    json::str(&mut out, &body.connector);
    out.extend_from_slice(b",\"group\":");
    json::str(&mut out, &body.group);
    out.extend_from_slice(b",\"segment\":");
    json::str(&mut out, &body.segment);
    out.extend_from_slice(b",\"explanation\":");
    body.explanation.write_json(&mut out);
    out.push(b'}');
    out
}

/// JSON `body` as a 200 response, as `axum::Json` answers it.
fn json_response(body: Vec<u8>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// `GET /metrics`: OpenMetrics, or the classic Prometheus text format
/// (0.0.4) to a client whose `Accept` asks for `text/plain` and not
/// OpenMetrics (`promtool check metrics`, older scrapers).
async fn metrics(
    State(a): State<Shared>,
    _: RequireScope<scope::Read>,
    headers: axum::http::HeaderMap,
) -> Response {
    let text = crate::api::metrics::scrape(&a);
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if crate::api::metrics::wants_classic_text(accept) {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            crate::api::metrics::classic_text(&text),
        )
            .into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response()
    }
}

/// `GET /livez`: liveness. `ok` while the process serves HTTP, whatever
/// its store or health table do: only a CA that stopped answering is to
/// be restarted.
async fn livez() -> Response {
    "ok\n".into_response()
}

/// `GET /readyz` (and `/healthz`, its older name): readiness, whether this
/// replica decides access. `ok` once its policy is loaded (it is, from the
/// start) and its health table is warm. 503 `warming_up` after a start
/// until the connectors the store knows have re-attached and reported, at
/// most `[health] warmup_ms` (`state::warmup`): until then this replica
/// would answer `no_connector`. 503 `unavailable` while shutting down.
/// Once warm, a store outage does not make it unready: access decisions
/// need no store (its state shows in `/api/v1/replicas` and
/// `reach_ca_store_up`).
async fn readyz(State(a): State<Shared>) -> Response {
    let now = Instant::now();
    match a.blocking(move |a: &Authority| warmth(a, now)).await {
        Some(Ok(Warmth::Warm)) => "ok\n".into_response(),
        Some(Ok(warming)) => error_body(
            StatusCode::SERVICE_UNAVAILABLE,
            "warming_up",
            &format!("not ready: {}", warming.message()),
            None,
        ),
        Some(Err(e)) => {
            tracing::warn!(error = %e, "not ready: warming up, and the store does not answer");
            error_body(
                StatusCode::SERVICE_UNAVAILABLE,
                "warming_up",
                "not ready: warming up, and the store (database) that names the connectors to wait for does not answer",
                None,
            )
        }
        None => shutting_down(),
    }
}

/// `GET /api/v1/openapi.json`: the document (no token: it is public).
async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::api::openapi::document_text(),
    )
        .into_response()
}

fn storage(e: crate::store::StoreError) -> Response {
    if e.is_unavailable() {
        tracing::warn!(error = %e, "admin API: refused, the store does not answer");
        return ApiError::StoreUnavailable.into_response();
    }
    tracing::error!(error = %e, "admin API: database error");
    error_body(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "the CA's database failed; see its log",
        None,
    )
}

/// The answer to admin work that names a target: its body as JSON, 404
/// `not_found` saying `missing` when there was no such target, or the
/// refusal the work was answered with.
fn found_or_404<T: serde::Serialize>(
    done: Result<Option<T>, Response>,
    missing: impl AsRef<str>,
) -> Response {
    match done {
        Ok(Some(body)) => axum::Json(body).into_response(),
        Ok(None) => error_body(StatusCode::NOT_FOUND, "not_found", missing.as_ref(), None),
        Err(response) => response,
    }
}

/// The answer to an action the audit trail could not record (503
/// `audit_unavailable`; `Authority::audit` logged the failure).
pub(crate) fn trail_unavailable() -> Response {
    error_body(
        StatusCode::SERVICE_UNAVAILABLE,
        "audit_unavailable",
        "the audit trail could not record this action, so it is answered as failed; the CA's log says what it came to and why the trail failed",
        None,
    )
}

/// The admin API's database work, off the async workers (`None`: the
/// runtime is shutting down).
async fn admin<T: Send + 'static>(
    a: &Shared,
    f: impl FnOnce(&Authority) -> Result<T, crate::store::StoreError> + Send + 'static,
) -> Result<T, Response> {
    match a.blocking(f).await {
        Some(Ok(t)) => Ok(t),
        Some(Err(e)) => Err(storage(e)),
        None => Err(shutting_down()),
    }
}

/// The answer when blocking work cannot run because the runtime stops.
fn shutting_down() -> Response {
    ApiError::ShuttingDown.into_response()
}

/// `GET /api/v1/replicas`: the CA replicas sharing this one's store, with
/// their last heartbeat and policy hash.
async fn replicas(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
    // The store's state is what an administrator looks here for during an
    // outage: answered without the list when the store does not answer.
    let replicas = match a.blocking(|a| a.replicas(a.replica_id())).await {
        Some(Ok(replicas)) => replicas,
        Some(Err(e)) if e.is_unavailable() => Vec::new(),
        Some(Err(e)) => return storage(e),
        None => return shutting_down(),
    };
    axum::Json(json!({
        "this": a.replica_id(),
        "store": a.store().status(),
        "replicas": replicas,
    }))
    .into_response()
}

/// `GET /api/v1/log_receivers`: this replica's log receivers and their
/// state.
async fn log_receivers(State(a): State<Shared>, _: RequireScope<scope::Admin>) -> Response {
    axum::Json(crate::api::openapi::LogReceiversBody {
        replica: a.replica_id().map(str::to_owned),
        log_receivers: a
            .log_stream()
            .states()
            .into_iter()
            .map(crate::api::openapi::LogReceiverView::from)
            .collect(),
    })
    .into_response()
}

/// `GET /api/v1/root`: where a rotation of the issuing root stands.
async fn root(State(a): State<Shared>, _: RequireScope<scope::Read>) -> Response {
    found_or_404(
        admin(&a, Authority::root_status).await,
        "this CA runs without TLS ([tls] enabled = false): it has no roots",
    )
}

async fn keys(State(a): State<Shared>, _: RequireScope<scope::Admin>) -> Response {
    match admin(&a, |a| a.provisioning_keys()).await {
        Ok(keys) => axum::Json(json!({ "provisioning_keys": keys })).into_response(),
        Err(response) => response,
    }
}

async fn revoke_key(
    State(a): State<Shared>,
    Path(group): Path<String>,
    caller: Caller,
) -> Response {
    let revoke = group.clone();
    let answer = json!({ "group": group, "revoked": true });
    let done = audited(
        &a,
        caller,
        "provisioning_key.revoke",
        group.clone(),
        move |a| {
            a.revoke_provisioning_key(&revoke)
                .map(|found| found.then_some(answer))
        },
    )
    .await;
    found_or_404(
        done,
        format!(
            "no connector group {:?}",
            group.chars().take(128).collect::<String>()
        ),
    )
}

async fn connector_action(
    State(a): State<Shared>,
    Path((name, action)): Path<(String, String)>,
    caller: Caller,
) -> Response {
    let shown: String = name.chars().take(128).collect();
    let body = shown.clone();
    let target = name.clone();
    let result = match action.as_str() {
        _ if caller.refused.is_some() && !ACTIONS.contains(&action.as_str()) => {
            return caller
                .refused
                .map_or_else(shutting_down, IntoResponse::into_response);
        }
        "disable" => {
            audited(&a, caller, "connector.disable", target, move |a| {
                a.set_connector_disabled(&name, true)
                    .map(|found| found.then(|| json!({ "name": body, "disabled": true })))
            })
            .await
        }
        "enable" => {
            audited(&a, caller, "connector.enable", target, move |a| {
                a.set_connector_disabled(&name, false)
                    .map(|found| found.then(|| json!({ "name": body, "disabled": false })))
            })
            .await
        }
        "revoke" => {
            audited(&a, caller, "connector.revoke", target, move |a| {
                a.revoke_connector(&name)
                    .map(|n| n.map(|n| json!({ "name": body, "certificates_revoked": n })))
            })
            .await
        }
        "allow-reenroll" => {
            audited(&a, caller, "connector.allow-reenroll", target, move |a| {
                a.allow_reenroll(&name).map(|found| {
                    found.then(|| {
                    json!({
                        "name": body,
                        "reenroll_allowed_for_s": crate::trust::enroll::REENROLL_WINDOW.as_secs(),
                    })
                })
                })
            })
            .await
        }
        _ => {
            return error_body(
                StatusCode::NOT_FOUND,
                "not_found",
                "unknown action (expected disable, enable, revoke or allow-reenroll)",
                None,
            );
        }
    };
    found_or_404(result, format!("no enrolled connector {shown:?}"))
}

/// The actions of `POST /api/v1/connectors/{name}/{action}`.
const ACTIONS: [&str; 4] = ["disable", "enable", "revoke", "allow-reenroll"];

/// `?force=` of `POST /api/v1/connectors/{name}/drain`.
#[derive(Debug, Deserialize)]
struct DrainQuery {
    force: Option<String>,
}

/// `POST /api/v1/connectors/{name}/drain`: the connector is selected for
/// no new access on every replica (its session and reports go on); refused
/// (409 `last_healthy_connector`, with what it would strand) when an
/// application would be left without a healthy, undrained connector,
/// unless `force=true`.
async fn drain_connector(
    State(a): State<Shared>,
    Path(name): Path<String>,
    Query(q): Query<DrainQuery>,
    caller: Caller,
) -> Response {
    use crate::access::drain::DrainAnswer;
    let force = match q.force.as_deref() {
        None | Some("" | "false") => false,
        Some("true") => true,
        Some(other) => {
            return ApiError::InvalidRequest(format!(
                "force: {:?} is neither true nor false",
                other.chars().take(16).collect::<String>()
            ))
            .into_response();
        }
    };
    let shown: String = name.chars().take(128).collect();
    let (actor, body, target) = (caller.actor.clone(), shown.clone(), name.clone());
    let done = audited_as(&a, caller, "connector.drain", target, move |a| {
        Ok(match a.drain_connector(&name, &actor, force)? {
            DrainAnswer::NotFound => Acted::NotFound,
            DrainAnswer::Refused(whatif) => drain_refused(&body, whatif),
            DrainAnswer::Drained {
                record,
                already,
                whatif,
            } => Acted::Done(json!({
                "name": body,
                "drained": true,
                "already": already,
                "since": record.since_ms,
                "by": {"kind": record.actor_kind, "name": record.actor},
                "forced": force && whatif.stranded > 0,
                "stranded": whatif.stranded,
            })),
        })
    })
    .await;
    admin_answer(done, &shown)
}

/// A drain declined because it would leave applications without a
/// healthy, undrained connector: 409 naming them, with the whole answer
/// of `GET /api/v1/whatif` for the connector.
fn drain_refused(name: &str, whatif: crate::access::drain::WhatIfView) -> Acted {
    let lines = crate::access::drain::stranded_lines(&whatif);
    let message = format!(
        "draining {name:?} would leave {} application(s) without a healthy, undrained connector: {}; force it (CLI --force, API ?force=true) to drain anyway",
        whatif.stranded,
        lines.join("; ")
    );
    let answer = (
        StatusCode::CONFLICT,
        axum::Json(json!({
            "error": {"reason": "last_healthy_connector", "message": message},
            "whatif": whatif,
        })),
    )
        .into_response();
    Acted::Declined(answer, message)
}

/// `POST /api/v1/connectors/{name}/undrain`: ends an administrator's
/// drain on every replica.
async fn undrain_connector(
    State(a): State<Shared>,
    Path(name): Path<String>,
    caller: Caller,
) -> Response {
    let shown: String = name.chars().take(128).collect();
    let (body, target) = (shown.clone(), name.clone());
    let done = audited(&a, caller, "connector.undrain", target, move |a| {
        a.undrain_connector(&name)
            .map(|was| was.map(|was| json!({"name": body, "drained": false, "was_drained": was})))
    })
    .await;
    admin_answer(done, &shown)
}

/// The answer of a drain or undrain: its fields, or 404 for a connector
/// this CA does not know.
fn admin_answer(done: Result<Option<serde_json::Value>, Response>, shown: &str) -> Response {
    found_or_404(
        done,
        format!("no connector {shown:?} (enrolled, or connected since this CA started)"),
    )
}

/// `?without=` of `GET /api/v1/whatif`.
#[derive(Debug, Deserialize)]
struct WhatIfQuery {
    without: Option<String>,
}

/// `GET /api/v1/whatif?without=NAME[,NAME…]`: which applications would
/// lose their last healthy, undrained connector without the named
/// connectors (a group's name: every connector of it). Changes nothing.
async fn whatif(
    State(a): State<Shared>,
    headers: axum::http::HeaderMap,
    _: RequireScope<scope::Read>,
    Query(q): Query<WhatIfQuery>,
) -> Response {
    use crate::access::drain::WithoutError;
    let admin = caller_is_admin(&a, &headers).await;
    let Some(spec) = q.without.filter(|w| !w.trim().is_empty()) else {
        return ApiError::InvalidRequest(
            "without: name a connector or connector group (?without=NAME[,NAME…])".into(),
        )
        .into_response();
    };
    let answer = a
        .blocking(move |a| {
            a.resolve_without(&spec)
                .map(|r| r.map(|without| a.what_if(&without, admin)))
        })
        .await;
    match answer {
        Some(Ok(Ok(view))) => axum::Json(view).into_response(),
        Some(Ok(Err(e @ WithoutError::Unknown(_)))) => {
            error_body(StatusCode::NOT_FOUND, "not_found", &e.to_string(), None)
        }
        Some(Ok(Err(e))) => ApiError::InvalidRequest(e.to_string()).into_response(),
        Some(Err(e)) => storage(e),
        None => shutting_down(),
    }
}

/// `DELETE /api/v1/connectors/{name}`: revokes the connector's
/// certificates, ends its session and frees its name.
async fn delete_connector(
    State(a): State<Shared>,
    Path(name): Path<String>,
    caller: Caller,
) -> Response {
    let shown: String = name.chars().take(128).collect();
    let body = shown.clone();
    let target = name.clone();
    let done = audited(&a, caller, "connector.delete", target, move |a| {
        a.delete_connector(&name).map(|n| {
            n.map(|n| {
                json!({
                    "name": body,
                    "deleted": true,
                    "certificates_revoked": n,
                })
            })
        })
    })
    .await;
    found_or_404(done, format!("no enrolled connector {shown:?}"))
}

/// `GET /api/v1/sessions`: people's live sessions, newest first, with
/// the scopes their roles map to now.
async fn sessions(State(a): State<Shared>, _: RequireScope<scope::Admin>) -> Response {
    let now = crate::ground::clock::now_ms();
    let records = match admin(&a, move |a| a.store().sessions(now)).await {
        Ok(r) => r,
        Err(response) => return response,
    };
    let snapshot = a.snapshot();
    let providers = &snapshot.config.oidc;
    let rows: Vec<serde_json::Value> = records
        .iter()
        .map(|r| {
            let scopes: Vec<&str> = providers
                .iter()
                .find(|p| p.name == r.provider)
                .map(|p| crate::api::sessions::scopes_of(p, r))
                .unwrap_or_default()
                .iter()
                .map(|s| s.as_str())
                .collect();
            json!({
                "id": r.id_sha256,
                "person": r.person,
                "provider": r.provider,
                "subject": r.subject,
                "scopes": scopes,
                "created_at": r.created_ms,
                "expires_at": r.expires_ms,
                "checked_at": r.checked_ms,
            })
        })
        .collect();
    axum::Json(json!({ "sessions": rows })).into_response()
}

/// `DELETE /api/v1/sessions/{id}`: ends a person's session on every
/// replica (audited `session.end`).
async fn end_session(State(a): State<Shared>, Path(id): Path<String>, caller: Caller) -> Response {
    let shown: String = id.chars().take(128).collect();
    let target = shown.clone();
    let now = crate::ground::clock::now_ms();
    let done = audited(&a, caller, "session.end", target, move |a| {
        let Some(r) = a.store().session(&id)? else {
            return Ok(None);
        };
        let ended = a.store().revoke_session(&id, now)?;
        Ok(ended.then(|| json!({ "id": id, "person": r.person, "ended": true })))
    })
    .await;
    found_or_404(done, format!("no live session {shown:?}"))
}

async fn dashboard() -> Response {
    crate::api::dashboard::page(crate::api::dashboard::Page::List)
}

async fn dashboard_app() -> Response {
    crate::api::dashboard::page(crate::api::dashboard::Page::Application)
}

async fn dashboard_connectors() -> Response {
    crate::api::dashboard::page(crate::api::dashboard::Page::Connectors)
}

/// Whether the health table is warm at `now` (see the module doc). Reads
/// the enrolled connectors from the store while warming up, never after.
fn warmth(a: &Authority, now: Instant) -> Result<Warmth, crate::store::StoreError> {
    let warmup = a.warmup();
    if warmup.is_warm() {
        return Ok(Warmth::Warm);
    }
    let state = a.snapshot();
    let policy = state.policy();
    let wall = crate::ground::clock::now_ms();
    let known = a.store().connectors()?;
    let expected = known.iter().filter(|c| {
        c.enrolled_ms < warmup.started_ms()
            && !c.disabled
            && c.serial.is_some()
            && c.not_after_ms.is_some_and(|t| t > wall)
            && policy.has_group(&c.group)
    });
    Ok(warmup.check(
        expected.map(|c| c.name.as_str()),
        state.settings().warmup,
        now,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `port` and `protocol` are refused when invalid even when `app`
    /// replaces them: a parameter is never silently dropped.
    #[test]
    fn events_query_checks_what_app_replaces() {
        let query = |port: Option<&str>, protocol: Option<&str>| EventsQuery {
            app: Some("s/h.test/tcp/80".into()),
            segment: None,
            host: None,
            protocol: protocol.map(Into::into),
            port: port.map(Into::into),
            connector: None,
            address: None,
            since: None,
            until: None,
            page: None,
            per_page: None,
        };
        assert!(matches!(
            events_query(query(Some("null"), None)),
            Err(ApiError::InvalidRequest(m)) if m.contains("port")
        ));
        assert!(matches!(
            events_query(query(None, Some("icmp"))),
            Err(ApiError::InvalidRequest(_))
        ));
        // An address is an IP address in its normal form, or `*`.
        let with = |a: &str| {
            events_query(EventsQuery {
                address: Some(a.into()),
                ..query(None, None)
            })
            .map(|(f, _, _)| f.address)
        };
        assert_eq!(
            with("2001:DB8:0::1").ok().flatten().as_deref(),
            Some("2001:db8::1")
        );
        assert_eq!(with("*").ok().flatten().as_deref(), Some("*"));
        assert!(matches!(
            with("web.test"),
            Err(ApiError::InvalidRequest(m)) if m.contains("address")
        ));
        let (f, _, _) = events_query(query(Some("81"), Some("udp"))).expect("valid");
        assert_eq!((f.port, f.protocol.as_deref()), (Some(80), Some("tcp")));
    }

    /// The access answer written by hand is serde's JSON of `SelectedBody`.
    #[test]
    fn selected_json_is_serdes() {
        let candidates = [policy::Candidate {
            connector: "c\"1".into(),
            group: "g".into(),
            connected: true,
            drained: false,
            status: policy::Status::Up,
            rtt: Some(std::time::Duration::from_micros(500)),
            location: None,
        }];
        let mut explanation =
            crate::access::explain::ExplanationView::new(policy::Strategy::Healthy);
        explanation.selection = Some(policy::explain(
            &candidates,
            policy::HealthReporting::Continuous,
            policy::Strategy::Healthy,
        ));
        let body = SelectedBody {
            connector: "c\"1".into(),
            group: "g\\".into(),
            segment: "web".into(),
            explanation,
        };
        assert_eq!(
            String::from_utf8_lossy(&selected_json(&body)),
            String::from_utf8_lossy(&serde_json::to_vec(&body).expect("json"))
        );
    }
}
