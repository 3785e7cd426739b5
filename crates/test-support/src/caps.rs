//! What the machine must permit for the tests that need it (ICMP sockets,
//! IPv6 loopback), checked up front: a test that needs one fails naming
//! what is missing instead of skipping, and where the machine permits it
//! the test can assert that the code under test used it.

use std::net::{Ipv6Addr, SocketAddr};

use anyhow::{Result, bail};

/// Whether the process runs as root (effective uid 0, read from
/// `/proc/self/status`).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The ICMP socket type this machine lets the process open for IPv4,
/// `"raw"` (root or `CAP_NET_RAW`) tried first, then `"dgram"`
/// (unprivileged, `net.ipv4.ping_group_range`): the one an agent asking
/// for `auto` must end up with. An error names what is missing.
pub fn icmp_socket() -> Result<&'static str> {
    use socket2::{Domain, Protocol, Socket, Type};
    let raw = match Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4)) {
        Ok(_) => return Ok("raw"),
        Err(e) => e,
    };
    if is_root() {
        bail!("running as root, yet a raw ICMP socket cannot be opened: {raw}");
    }
    match Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::ICMPV4)) {
        Ok(_) => Ok("dgram"),
        Err(dgram) => {
            let range = std::fs::read_to_string("/proc/sys/net/ipv4/ping_group_range").map_or_else(
                |e| format!("unreadable: {e}"),
                |r| r.split_whitespace().collect::<Vec<_>>().join(" "),
            );
            bail!(
                "no ICMP socket can be opened: raw needs root or CAP_NET_RAW ({raw}); \
                 unprivileged needs the process's group in net.ipv4.ping_group_range \
                 (now {range}) ({dgram}). Run as root, or widen the range, e.g. \
                 `sysctl -w net.ipv4.ping_group_range=\"0 2147483647\"`"
            )
        }
    }
}

/// Fails naming what is missing unless `[::1]` can be bound (IPv6 on the
/// loopback interface).
pub fn ipv6_loopback() -> Result<()> {
    match std::net::TcpListener::bind(SocketAddr::from((Ipv6Addr::LOCALHOST, 0))) {
        Ok(_) => Ok(()),
        Err(e) => bail!(
            "no IPv6 loopback: binding [::1] failed ({e}); enable IPv6 on lo \
             (net.ipv6.conf.lo.disable_ipv6 = 0)"
        ),
    }
}
