//! Connector sessions: the `ConnectorSession` gRPC service, the session
//! loop and the intake of the reports it receives.

pub mod connect;
pub mod reports;
pub mod session;
pub mod transitions;
