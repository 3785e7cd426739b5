//! Fixtures the workspace's tests share, so each is written once: a real
//! authoritative DNS server on loopback, TCP and UDP test applications that
//! record what reached them, a network path with a real delay (TUN devices
//! and a network namespace), HTTP test clients, polling helpers for events
//! whose timing a test does not control, a real PostgreSQL server, free
//! loopback ports, a builder for segments in both their config (TOML) and
//! wire (protobuf) forms, a web application with test certificates for
//! application-level checks, and checks of what the machine permits (ICMP
//! sockets, IPv6 loopback) that fail naming what is missing, the book's
//! procedures read from book/src as the tests run them, and the log
//! receivers a SIEM runs (a real rsyslogd over TLS, a TCP JSON-lines
//! receiver).
//!
//! A dev-dependency of the shipped crates; never a dependency of them.

pub mod apps;
pub mod book;
pub mod browser;
pub mod caps;
pub mod delay;
pub mod dns;
pub mod flags;
pub mod http;
pub mod net;
pub mod poll;
pub mod postgres;
pub mod segment;
pub mod siem;
pub mod web;

pub use apps::{Blackhole, TcpApp, UdpApp, closed_port, listeners, max_in_window};
pub use delay::DelayLink;
pub use dns::DnsServer;
pub use http::{HttpsClient, client_tls, http_get};
pub use net::free_port;
pub use poll::{eventually, retry};
pub use postgres::Postgres;
pub use segment::Segment;
pub use siem::{JsonReceiver, Rsyslog};
pub use web::{Certs, WebApp};
