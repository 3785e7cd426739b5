//! Loopback ports for processes a test or benchmark starts: a port that is
//! free now (bound on loopback, then released), for a server that takes its
//! port from its command line or config rather than from a bound socket.

use std::net::{Ipv4Addr, TcpListener};

use anyhow::Context;

/// A TCP port on 127.0.0.1 that nothing listens on now. Another process may
/// take it before the caller binds it; callers that can pass a bound socket
/// should.
pub fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("cannot probe a free port")?;
    Ok(l.local_addr()
        .context("cannot read the probed port")?
        .port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_port_can_be_bound() {
        let port = free_port().expect("port");
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("the port is free");
    }
}
