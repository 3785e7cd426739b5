//! Checks: everything that opens a socket toward an application. The
//! [`pacer`] starts every check at the configured rate; [`probe`] runs the
//! TCP handshake, ICMP echo and TCP fallback; [`appcheck`] a segment's TLS
//! handshake or HTTP `GET`.

pub mod appcheck;
pub mod pacer;
pub mod probe;
