//! The `ConnectorSession` gRPC service as the CA serves it: what
//! tonic-prost-build generates (`ConnectorSessionServer`), with the inbound
//! messages handed to the session still encoded
//! ([`protocol::scan::ConnectCodec`]), so that a health report is read
//! straight into the domain form (`protocol::scan`) and every other message
//! is decoded with prost as before. The wire contract is unchanged: same
//! path, same messages, same limits and errors.

use std::sync::Arc;
use std::task::{Context, Poll};

use protocol::scan::ConnectCodec;
use protocol::v1;
use tonic::codegen::{Body, BoxFuture, Bytes, EnabledCompressionEncodings, StdError, http};

use crate::intake::session::SessionService;

/// The `ConnectorSession` service (its one method, `Connect`).
#[derive(Clone, Debug)]
pub struct ConnectServer {
    inner: Arc<SessionService>,
    max_decoding_message_size: Option<usize>,
}

impl ConnectServer {
    /// The service over `inner`.
    pub fn new(inner: SessionService) -> Self {
        ConnectServer {
            inner: Arc::new(inner),
            max_decoding_message_size: None,
        }
    }

    /// Largest message accepted from a connector.
    #[must_use]
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.max_decoding_message_size = Some(limit);
        self
    }
}

/// `Connect` as tonic's streaming method.
struct Connect(Arc<SessionService>);

impl tonic::server::StreamingService<Bytes> for Connect {
    type Response = v1::AuthorityMessage;
    type ResponseStream = crate::intake::session::ConnectStream;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<tonic::Streaming<Bytes>>) -> Self::Future {
        let inner = Arc::clone(&self.0);
        Box::pin(async move { inner.connect(request).await })
    }
}

impl<B> tonic::codegen::Service<http::Request<B>> for ConnectServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() == "/reach.v1.ConnectorSession/Connect" {
            let max_decoding_message_size = self.max_decoding_message_size;
            let inner = self.inner.clone();
            return Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ConnectCodec)
                    .apply_compression_config(
                        EnabledCompressionEncodings::default(),
                        EnabledCompressionEncodings::default(),
                    )
                    .apply_max_message_size_config(max_decoding_message_size, None);
                Ok(grpc.streaming(Connect(inner), req).await)
            });
        }
        // As generated: any other method is unimplemented.
        Box::pin(async move {
            let mut response = http::Response::new(tonic::body::Body::default());
            let headers = response.headers_mut();
            headers.insert(
                tonic::Status::GRPC_STATUS,
                (tonic::Code::Unimplemented as i32).into(),
            );
            headers.insert(
                http::header::CONTENT_TYPE,
                tonic::metadata::GRPC_CONTENT_TYPE,
            );
            Ok(response)
        })
    }
}

impl tonic::server::NamedService for ConnectServer {
    const NAME: &'static str = v1::connector_session_server::SERVICE_NAME;
}
