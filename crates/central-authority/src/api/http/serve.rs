//! The listener's serving machinery: accepting into connection slots, the
//! TLS handshake, each connection's HTTP/1.1 and HTTP/2 settings, and the
//! request body read within its bounds before the router runs.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::Response;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::TcpListener;

use crate::api::body::error_body;
use crate::api::listen::{Accepted, Acceptor, Deadlines, Handshaking, JsonErrors, Ticket};
use crate::state::authority::Authority;

use super::Peer;
use super::routes::router;

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
    // What each connection's task holds: not the listening socket, which
    // closes when the loop ends.
    let seats = acceptor.seats().clone();
    let first_byte = limits.first_byte_timeout;
    let mut shutdown = std::pin::pin!(shutdown);
    'accepting: loop {
        let taken = tokio::select! {
            _ = &mut shutdown => break,
            taken = acceptor.next() => taken,
        };
        for (tcp, peer, ticket) in taken {
            let _ = tcp.set_nodelay(true);
            let ticket = Arc::new(ticket);
            // Full: wait (holding no slot) for a place, then the first byte.
            let place = match seats.try_seat() {
                Some(slot) => Place::Seated(slot),
                None => tokio::select! {
                    _ = &mut shutdown => break 'accepting,
                    place = seats.waiting_place(&ticket) => match place {
                        Some(place) => Place::Waiting(place),
                        None => break 'accepting,
                    },
                },
            };
            let tcp = Accepted::new(tcp, ticket.clone());
            let (server, seats) = (server.clone(), seats.clone());
            let watcher = graceful.watcher();
            tokio::spawn(async move {
                let _slot = match place {
                    Place::Seated(slot) => slot,
                    Place::Waiting(place) => {
                        let Some(slot) = seats.seat_once_heard(&tcp, first_byte).await else {
                            tracing::debug!(%peer, "HTTPS: no first byte while waiting for a slot");
                            return;
                        };
                        drop(place);
                        slot
                    }
                };
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

/// Where an accepted connection is: holding a slot, or a place to wait
/// for one.
enum Place {
    Seated(tokio::sync::OwnedSemaphorePermit),
    Waiting(tokio::sync::OwnedSemaphorePermit),
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
        tcp: Accepted,
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
    tcp: Accepted,
    peer: std::net::SocketAddr,
    ticket: &Arc<Ticket>,
    first_byte: std::time::Duration,
    handshake: std::time::Duration,
) -> Option<tokio_rustls::server::TlsStream<Handshaking<Accepted>>> {
    let handshaking = async {
        if !tcp.heard_within(first_byte).await {
            return Err("no first byte in time".to_owned());
        }
        // Each byte of the handshake keeps it from counting as idle
        // (`Admission::evict_idle`).
        let tcp = Handshaking::new(tcp, ticket.clone());
        acceptor.accept(tcp).await.map_err(|e| e.to_string())
    };
    // Held here, so a handshake that runs out of time is marked for a
    // reset before its stream drops.
    let mut handshaking = std::pin::pin!(handshaking);
    let handshaken = tokio::select! {
        r = &mut handshaking => Ok(r),
        () = tokio::time::sleep(handshake) => {
            ticket.reset_on_close();
            Err(())
        }
    };
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
