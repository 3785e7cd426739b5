//! Sessions: one gRPC `Connect` [`stream`] per CA replica, [`attach`]ed to
//! every address the `--ca` names resolve to; what every session shares
//! ([`options`]); whose assignment is in force when replicas differ
//! ([`follow`]); the host's [`status`] each heartbeat carries.

pub mod attach;
pub mod follow;
pub mod options;
pub mod status;
pub mod stream;
