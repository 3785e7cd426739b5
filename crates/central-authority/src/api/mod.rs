//! The CA's surfaces: HTTP (JSON API, dashboard, metrics, OpenAPI) and
//! gRPC, the listener they share, and the read models they answer with.

pub mod auth;
pub mod body;
pub mod dashboard;
pub mod grpc;
pub mod guard;
pub mod http;
pub mod listen;
pub mod listing;
pub mod metrics;
pub mod openapi;
pub mod route;
pub mod sessions;
pub mod views;
