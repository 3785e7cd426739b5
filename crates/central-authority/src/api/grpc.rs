//! The gRPC surface: the access and health query services (the connector
//! session lives in `intake::session`), plus the standard health and reflection
//! services, all on one tonic server.

use std::sync::Arc;

use protocol::v1;
use protocol::v1::access_server::{Access, AccessServer};
use protocol::v1::enrollment_server::EnrollmentServer;
use protocol::v1::health_query_server::{HealthQuery, HealthQueryServer};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use crate::access;
use crate::access::decide::AccessRequest;
use crate::api;
use crate::credentials::auth::Scope;
use crate::error::ApiError;
use crate::intake::session::SessionService;
use crate::state::authority::Authority;
use crate::trust;

/// Checks the `authorization` metadata for `scope` (`auth::authorize`).
/// Guesses are throttled per source address (`trust::throttle`).
fn check<T>(authority: &Authority, request: &Request<T>, scope: Scope) -> Result<(), Status> {
    let header = request
        .metadata()
        .get(protocol::metadata::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    trust::throttle::authorize_from(
        authority,
        request.remote_addr().map(|a| a.ip()),
        header,
        scope,
    )
    .map_err(|e| ApiError::from(e).into())
}

/// The `Access` service.
#[derive(Clone, Debug)]
pub struct AccessService {
    authority: Arc<Authority>,
}

#[tonic::async_trait]
impl Access for AccessService {
    async fn resolve(
        &self,
        request: Request<v1::AccessRequest>,
    ) -> Result<Response<v1::AccessDecision>, Status> {
        check(&self.authority, &request, Scope::Access)?;
        let r = request.into_inner();
        let protocol = protocol::convert::protocol_from_wire("protocol", r.protocol)
            .map_err(ApiError::from)?;
        let user_location = r
            .user_location
            .map(|l| policy::Location::new(l.latitude, l.longitude))
            .transpose()
            .map_err(|e| ApiError::InvalidRequest(format!("user_location.{e}")))?;
        let outcome = access::decide::resolve_from(
            &self.authority,
            AccessRequest {
                host: r.host,
                protocol,
                port: r.port,
            },
            user_location,
        )
        .await?;
        Ok(Response::new(outcome.into_wire()))
    }
}

/// The `HealthQuery` service.
#[derive(Clone, Debug)]
pub struct HealthQueryService {
    authority: Arc<Authority>,
}

/// The stream `WatchHealth` answers with.
type TransitionStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<v1::HealthTransition, Status>> + Send>>;

/// The wire form of a transition streamed under `epoch`.
fn transition_to_wire(e: &crate::state::history::EventView, epoch: u64) -> v1::HealthTransition {
    let status = |s: policy::Status| v1::HealthStatus::from(s) as i32;
    v1::HealthTransition {
        app: Some(v1::ApplicationKey {
            segment: e.segment.clone(),
            host: e.host.clone(),
            protocol: v1::Protocol::from(e.protocol) as i32,
            port: u32::try_from(e.port).unwrap_or(0),
        }),
        connector: e.connector.clone(),
        from: status(e.from),
        to: status(e.to),
        cause: e.cause.clone(),
        at_unix_ms: e.at,
        seq: e.seq.unwrap_or(0),
        lagged: 0,
        epoch,
    }
}

#[tonic::async_trait]
impl HealthQuery for HealthQueryService {
    type WatchHealthStream = TransitionStream;

    async fn watch_health(
        &self,
        request: Request<v1::WatchHealthRequest>,
    ) -> Result<Response<TransitionStream>, Status> {
        use crate::state::history::Live;
        use futures::StreamExt as _;

        check(&self.authority, &request, Scope::Read)?;
        let filter = request.into_inner();
        let epoch = self.authority.history().epoch();
        let stream = self
            .authority
            .history()
            .subscribe()
            .filter_map(move |item| {
                let out = match item {
                    Live::Transition(e) => ((filter.segment.is_empty()
                        || filter.segment == e.segment)
                        && (filter.connector.is_empty() || filter.connector == e.connector))
                        .then(|| Ok(transition_to_wire(&e, epoch))),
                    Live::Lagged(n) => Some(Ok(v1::HealthTransition {
                        lagged: n,
                        epoch,
                        ..Default::default()
                    })),
                };
                std::future::ready(out)
            });
        let closed = self.authority.history().closed();
        Ok(Response::new(Box::pin(stream.take_until(closed))))
    }

    async fn list_applications(
        &self,
        request: Request<v1::ListApplicationsRequest>,
    ) -> Result<Response<v1::ListApplicationsResponse>, Status> {
        check(&self.authority, &request, Scope::Read)?;
        let r = request.into_inner();
        let number = |n: u32| (n > 0).then(|| n.to_string());
        // Paged as `GET /api/v1/health` pages, with its rules and errors.
        let query = crate::api::listing::ListQuery::parse(&crate::api::listing::RawQuery {
            page: number(r.page),
            per_page: number(r.per_page),
            ..Default::default()
        })?;
        let segment = (!r.segment.is_empty()).then_some(r.segment.as_str());
        // Read before the table: a transition after it is in the stream.
        let version = self.authority.history().version();
        let epoch = self.authority.history().epoch();
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let answer = if query.paging.is_none() {
            let apps = api::views::applications(&self.authority, segment);
            let total = apps.len();
            (apps, total, 1, total.max(1), 1)
        } else {
            let rows = api::views::rows(
                &self.authority,
                &crate::api::views::RowFilter {
                    segment,
                    ..Default::default()
                },
            );
            let mut page = crate::api::listing::run(rows, &query);
            let rows = std::mem::take(&mut page.rows);
            let apps = api::views::views(&self.authority, rows.into_iter().map(|r| r.item));
            (apps, page.total, page.page, page.per_page, page.pages)
        };
        let (mut apps, total, page, per_page, pages) = answer;
        // As the HTTP listing: the store is read, off the async workers,
        // only when an application lists no connector.
        if apps
            .iter()
            .any(crate::api::views::ApplicationView::lacks_connectors)
        {
            apps = self
                .authority
                .blocking(move |a| {
                    api::views::note_unconnected(a, &mut apps);
                    apps
                })
                .await
                .ok_or(crate::error::ApiError::ShuttingDown)?;
        }
        Ok(Response::new(v1::ListApplicationsResponse {
            applications: apps.iter().map(|a| a.to_wire()).collect(),
            version,
            epoch,
            total: total as u64,
            page: count(page),
            per_page: count(per_page),
            pages: count(pages),
        }))
    }

    async fn list_connectors(
        &self,
        request: Request<v1::ListConnectorsRequest>,
    ) -> Result<Response<v1::ListConnectorsResponse>, Status> {
        check(&self.authority, &request, Scope::Read)?;
        let admin = check(&self.authority, &request, Scope::Admin).is_ok();
        // Enrolled connectors come from the database: off the async workers.
        let connectors = self
            .authority
            .blocking(api::views::connectors)
            .await
            .ok_or(ApiError::ShuttingDown)?;
        Ok(Response::new(v1::ListConnectorsResponse {
            connectors: connectors
                .into_iter()
                .map(|c| if admin { c } else { c.without_admin_fields() })
                .map(|c| c.to_wire())
                .collect(),
        }))
    }
}

/// Serves every gRPC service on `listener` until `shutdown` resolves.
pub async fn serve(
    authority: Arc<Authority>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), crate::error::RunError> {
    let settings = authority.snapshot().settings().clone();
    let limits = &settings.limits;
    // Capped in total and per source address (`listen`).
    let admitted = crate::api::listen::grpc_incoming(
        listener,
        limits.grpc_max_connections,
        limits.grpc_max_connections_per_source,
    );
    let router = services(&authority, transport(&settings)).await?;
    match authority.tls() {
        // The TLS handshake is the listener's own, with the configuration
        // in force when the connection arrives (a reload swaps it), within
        // the handshake timeout; tonic serves what it yields.
        Some(_) => {
            let tls = authority.clone();
            let incoming = crate::api::listen::grpc_tls_incoming(
                admitted,
                move || tls.tls().map(|t| t.current().grpc.clone()),
                settings.handshake_timeout,
            );
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?;
        }
        None => {
            router
                .serve_with_incoming_shutdown(admitted, shutdown)
                .await?;
        }
    }
    Ok(())
}

/// Every service of the CA on `builder`.
async fn services(
    authority: &Arc<Authority>,
    mut builder: tonic::transport::Server,
) -> Result<tonic::transport::server::Router, crate::error::RunError> {
    let max = protocol::MAX_MESSAGE_BYTES;
    let health_service = health_service().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(protocol::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| crate::error::RunError::Reflection(e.to_string()))?;
    // The same descriptors under the older `v1alpha` name: grpcio-reflection
    // and older grpcurl speak only that.
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(protocol::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| crate::error::RunError::Reflection(e.to_string()))?;
    // Reflection lists every service and message: reconnaissance, so it
    // needs a `read` token (or `anonymous_read`) like the health query. The
    // standard health service stays open: load balancers probe it without
    // credentials and it says only "serving".
    let reflection_auth = authority.clone();
    let reflection = tonic::service::interceptor::InterceptedService::new(
        reflection,
        move |request: tonic::Request<()>| {
            check(&reflection_auth, &request, Scope::Read).map(|()| request)
        },
    );
    let reflection_auth = authority.clone();
    let reflection_v1alpha = tonic::service::interceptor::InterceptedService::new(
        reflection_v1alpha,
        move |request: tonic::Request<()>| {
            check(&reflection_auth, &request, Scope::Read).map(|()| request)
        },
    );
    let router = builder
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(
            crate::intake::connect::ConnectServer::new(SessionService::new(authority.clone()))
                .max_decoding_message_size(max),
        )
        .add_service(
            EnrollmentServer::new(crate::trust::enroll::EnrollmentService::new(
                authority.clone(),
            ))
            .max_decoding_message_size(64 * 1024),
        )
        .add_service(
            AccessServer::new(AccessService {
                authority: authority.clone(),
            })
            .max_decoding_message_size(max),
        )
        .add_service(
            HealthQueryServer::new(HealthQueryService {
                authority: authority.clone(),
            })
            .max_decoding_message_size(max),
        );
    Ok(router)
}

/// The standard health service, saying every reach service is serving.
async fn health_service()
-> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in [
        "reach.v1.ConnectorSession",
        "reach.v1.Access",
        "reach.v1.HealthQuery",
        "reach.v1.Enrollment",
    ] {
        health
            .set_service_status(name, tonic_health::ServingStatus::Serving)
            .await;
    }
    health_service
}

/// The gRPC server's transport: connection ages, keep-alives and the
/// bounds against hostile input (TLS is the listener's: `listen`).
fn transport(settings: &crate::config::Settings) -> tonic::transport::Server {
    let limits = &settings.limits;
    tonic::transport::Server::builder()
        // No connection lives forever: GOAWAY at the age, closed a minute
        // later (connectors reconnect).
        .max_connection_age(limits.grpc_max_connection_age)
        .max_connection_age_grace(std::time::Duration::from_secs(60))
        // Dead peers are noticed even when a connector sends nothing.
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        // Hostile input: bounded streams and headers per connection, and
        // HTTP/2 reset floods end the offending connection only.
        .max_concurrent_streams(settings.limits.max_concurrent_streams)
        .http2_max_header_list_size(16 * 1024)
        .http2_max_pending_accept_reset_streams(Some(20))
        .http2_max_local_error_reset_streams(Some(100))
        .tcp_keepalive(Some(std::time::Duration::from_secs(60)))
}
