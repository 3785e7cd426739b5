//! reach's wire contract: Rust bindings generated from `proto/reach/v1` (by
//! protox + tonic-prost-build in `build.rs`; no protoc anywhere), the
//! conversions between wire messages and `policy` types, and the two
//! hand-written codecs of health reports: the CA's reading ([`scan`]) and
//! the connector's composing from shared entries ([`compose`]); and the
//! contract's release with the rule of which connector releases a CA
//! accepts ([`release`]).
//!
//! **Invariant:** this crate holds no logic beyond conversions and that
//! rule; a malformed message is rejected here, at the border, with a
//! `WireError` naming what is wrong, and never reaches `policy` or the
//! binaries.

#![forbid(unsafe_code)]

pub mod compose;
pub mod convert;
pub mod fuzzing;
pub mod release;
pub mod scan;

pub use convert::WireError;

/// Generated code for the `reach.v1` protobuf package.
#[allow(missing_debug_implementations, clippy::all, clippy::pedantic)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/reach.v1.rs"));
}

/// The encoded `FileDescriptorSet` of `proto/reach/v1`, for gRPC server
/// reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/reach_descriptor.bin"));

/// gRPC metadata keys of the connector session: how a connector
/// authenticates to a CA run with `[tls] enabled = false` (local
/// experiments); with TLS the client certificate does.
pub mod metadata {
    /// Connector name.
    pub const CONNECTOR: &str = "x-reach-connector";
    /// Connector group.
    pub const GROUP: &str = "x-reach-group";
    /// Provisioning key of the group (a secret: never logged).
    pub const PROVISIONING_KEY: &str = "x-reach-provisioning-key";
    /// API token header for the access and health services.
    pub const AUTHORIZATION: &str = "authorization";
}

/// Largest message either side accepts, in bytes. A full-state report of a
/// connector at the 6,000-check budget is well under 2 MiB; anything larger
/// is hostile or broken.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
