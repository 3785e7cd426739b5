//! Counts the ICMP echo requests that reach each loopback address: a raw
//! ICMPv4 socket receives a copy of every ICMP packet the host takes in,
//! the connector's pings to the kit's UDP application among them.

use std::collections::HashMap;
use std::io::Read;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use socket2::{Domain, Protocol, Socket, Type};

/// ICMP type of an echo request.
const ECHO_REQUEST: u8 = 8;

/// Echo requests seen per destination, while it runs.
pub struct EchoCounter {
    seen: Arc<Mutex<HashMap<Ipv4Addr, usize>>>,
    stop: Arc<AtomicBool>,
}

impl EchoCounter {
    /// Opens the raw socket and starts reading on a thread of its own.
    pub fn start() -> Result<Self> {
        let socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))
            .context("opening a raw ICMP socket")?;
        socket.set_read_timeout(Some(Duration::from_millis(200)))?;
        let seen: Arc<Mutex<HashMap<Ipv4Addr, usize>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        std::thread::spawn(move || read(&socket, &s, &st));
        Ok(EchoCounter { seen, stop })
    }

    /// Echo requests to `ip` so far.
    pub fn requests_to(&self, ip: Ipv4Addr) -> usize {
        self.seen
            .lock()
            .map(|m| m.get(&ip).copied().unwrap_or(0))
            .unwrap_or(0)
    }
}

impl Drop for EchoCounter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn read(socket: &Socket, seen: &Mutex<HashMap<Ipv4Addr, usize>>, stop: &AtomicBool) {
    let mut buf = [0u8; 2048];
    let mut reader = socket;
    while !stop.load(Ordering::Relaxed) {
        let Ok(n) = reader.read(&mut buf) else {
            continue;
        };
        if let Some(dst) = echo_request_to(&buf[..n])
            && let Ok(mut m) = seen.lock()
        {
            *m.entry(dst).or_default() += 1;
        }
    }
}

/// The destination of an IPv4 packet carrying an ICMP echo request.
fn echo_request_to(packet: &[u8]) -> Option<Ipv4Addr> {
    let ihl = usize::from(packet.first()? & 0x0f) * 4;
    let dst: [u8; 4] = packet.get(16..20)?.try_into().ok()?;
    (*packet.get(ihl)? == ECHO_REQUEST).then_some(Ipv4Addr::from(dst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_destination_of_an_echo_request_only() {
        let mut p = vec![0x45u8; 20];
        p[16..20].copy_from_slice(&[127, 9, 2, 1]);
        p.extend([ECHO_REQUEST, 0, 0, 0]);
        assert_eq!(echo_request_to(&p), Some(Ipv4Addr::new(127, 9, 2, 1)));
        p[20] = 0; // echo reply
        assert_eq!(echo_request_to(&p), None);
        assert_eq!(echo_request_to(&p[..10]), None);
    }
}
