//! A network path with a real, deterministic delay, built in user space:
//! `DelayLink` makes a network namespace and two TUN devices, one on the
//! host and one moved into the namespace, and a forwarder in this process
//! that copies every IP packet from one to the other after a fixed delay,
//! in both directions. The namespace's address (`far()`) is then reached
//! with a round-trip time of twice the one-way delay, plus microseconds.
//!
//! Why not `tc netem`: the CI machine's kernel has no `sch_netem` (nor the
//! classifiers and actions that could stand in for it), and a delay that a
//! kernel module adds cannot be asserted on where the module is missing.
//! TUN needs only `/dev/net/tun`, `ip` (iproute2) and root.
//!
//! Nothing has to run inside the namespace: its kernel answers ICMP echo,
//! and a TCP connect to a port nobody listens on with a reset, by itself.
//! A test that needs an application there runs it with `ip netns exec`.
//!
//! The forwarder runs on the Tokio runtime that called `DelayLink::create`;
//! dropping the link stops it and removes the namespace and both devices.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Links made by this process so far (each gets its own names and subnet).
static LINKS: AtomicU32 = AtomicU32::new(0);

/// Packets in flight per direction; beyond it, new packets are dropped (as
/// a full queue on a real link would drop them).
const QUEUE: usize = 4096;

/// A namespace reached from the host over a path that delays every packet
/// by `one_way` in each direction. Removed on drop.
#[derive(Debug)]
pub struct DelayLink {
    ns: String,
    host_if: String,
    near: Ipv4Addr,
    far: Ipv4Addr,
    one_way: Duration,
    tasks: Vec<JoinHandle<()>>,
}

impl DelayLink {
    /// Builds the namespace, both TUN devices and the forwarder, which
    /// holds every packet for `one_way` before passing it on (so the RTT to
    /// `far()` is `2 × one_way`). Needs root, `/dev/net/tun` and `ip`;
    /// fails with a message naming what is missing. Must be called inside a
    /// Tokio runtime (with its time and I/O drivers enabled).
    pub fn create(one_way: Duration) -> Result<DelayLink> {
        if tokio::runtime::Handle::try_current().is_err() {
            bail!("DelayLink must be created inside a Tokio runtime (its forwarder runs there)");
        }
        if !std::path::Path::new("/dev/net/tun").exists() {
            bail!("DelayLink needs /dev/net/tun (the tun kernel module), which this machine lacks");
        }
        let n = LINKS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // 198.19.0.0/16 (benchmarking range, never routed) split into /30s;
        // the process id and the link number pick one.
        let block = (pid.wrapping_mul(8).wrapping_add(n)) % 16_384;
        let base = u32::from(Ipv4Addr::new(198, 19, 0, 0)) + block * 4;
        let tag = format!("{}{}", pid % 100_000, n % 100);
        let mut link = DelayLink {
            ns: format!("reach-delay-{tag}"),
            host_if: format!("rdh{tag}"),
            near: Ipv4Addr::from(base + 1),
            far: Ipv4Addr::from(base + 2),
            one_way,
            tasks: Vec::new(),
        };
        let ns_if = format!("rdn{tag}");
        // Leftovers of an earlier process with the same id.
        let _ = ip(&["netns", "del", &link.ns]);
        let _ = ip(&["link", "del", &link.host_if]);
        let _ = ip(&["link", "del", &ns_if]);
        ip(&["netns", "add", &link.ns]).context(
            "DelayLink cannot create a network namespace (needs root and iproute2 with netns support)",
        )?;
        let host_tun = open_tun(&link.host_if)?;
        let ns_tun = open_tun(&ns_if)?;
        // A TUN device keeps its file when it moves: the forwarder writes
        // into the namespace through `ns_tun` from here.
        ip(&["link", "set", &ns_if, "netns", &link.ns])?;
        let (near, far) = (link.near.to_string(), link.far.to_string());
        ip(&["addr", "add", &near, "peer", &far, "dev", &link.host_if])?;
        ip(&["link", "set", &link.host_if, "up"])?;
        let ns = link.ns.clone();
        let in_ns = |args: &[&str]| {
            let mut full = vec!["netns", "exec", ns.as_str(), "ip"];
            full.extend_from_slice(args);
            ip(&full)
        };
        in_ns(&["addr", "add", &far, "peer", &near, "dev", &ns_if])?;
        in_ns(&["link", "set", &ns_if, "up"])?;
        in_ns(&["link", "set", "lo", "up"])?;
        let host_tun = Arc::new(register(host_tun)?);
        let ns_tun = Arc::new(register(ns_tun)?);
        link.tasks = forward(host_tun.clone(), ns_tun.clone(), one_way);
        link.tasks.extend(forward(ns_tun, host_tun, one_way));
        Ok(link)
    }

    /// The namespace's address: reached over the delayed path.
    pub fn far(&self) -> Ipv4Addr {
        self.far
    }

    /// The host's address on the link (the source of packets to `far()`).
    pub fn near(&self) -> Ipv4Addr {
        self.near
    }

    /// The namespace's name (for `ip netns exec`).
    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// The delay each packet gets in each direction.
    pub fn one_way(&self) -> Duration {
        self.one_way
    }

    /// Runs `program args…` inside the namespace and waits for it; errors
    /// carry its stderr.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<()> {
        let mut full = vec!["netns", "exec", self.ns.as_str(), program];
        full.extend_from_slice(args);
        ip(&full)
    }
}

impl Drop for DelayLink {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        // Deleting the namespace removes the device inside it; the host's
        // goes when its file closes (the aborted tasks drop it), or here.
        let _ = ip(&["netns", "del", &self.ns]);
        let _ = ip(&["link", "del", &self.host_if]);
    }
}

/// Two tasks copying packets from `from` to `to`: one reads and stamps
/// each packet with its due time, the other writes it when it is due. The
/// delay is the same for every packet, so first in is first due.
fn forward(
    from: Arc<AsyncFd<File>>,
    to: Arc<AsyncFd<File>>,
    delay: Duration,
) -> Vec<JoinHandle<()>> {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        loop {
            let Ok(mut ready) = from.readable().await else {
                return;
            };
            match ready.try_io(|f| f.get_ref().read(&mut buf)) {
                Ok(Ok(n)) if n > 0 => {
                    let _ = tx.try_send((Instant::now() + delay, buf[..n].to_vec()));
                }
                Ok(Ok(_)) => {}
                // The device is gone (the link is being dropped).
                Ok(Err(_)) => return,
                Err(_would_block) => {}
            }
        }
    });
    let writer = tokio::spawn(async move {
        while let Some((due, packet)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            // A TUN write hands the packet to the kernel's receive path at
            // once; an error (the namespace is gone) drops the packet.
            let _ = to.get_ref().write(&packet);
        }
    });
    vec![reader, writer]
}

/// `struct ifreq` as `TUNSETIFF` reads it: the name, then the flags (the
/// rest of the 40-byte union unused).
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Opens `/dev/net/tun` as a new TUN device `name` (IP packets, no
/// packet-information header), non-blocking. One of the crate's two
/// `unsafe` calls (with `register`): the ioctl that names the device.
#[allow(unsafe_code)]
fn open_tun(name: &str) -> Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/net/tun")
        .context("DelayLink cannot open /dev/net/tun (needs root and the tun kernel module)")?;
    let mut req = IfReq {
        name: [0; 16],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    if name.len() >= req.name.len() {
        bail!("TUN device name {name:?} is longer than 15 bytes");
    }
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: the descriptor is open for the call's duration, and `req` is
    // a properly sized, initialised `struct ifreq` that outlives it; the
    // kernel only reads it and writes the chosen name back into it.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        bail!("DelayLink cannot create the TUN device {name} (TUNSETIFF: {e})");
    }
    Ok(file)
}

/// Registers a TUN device's file with the runtime's reactor.
#[allow(unsafe_code)]
fn register(file: File) -> Result<AsyncFd<File>> {
    // SAFETY: the `File` owns its descriptor and the `AsyncFd` owns the
    // `File`: the descriptor stays open, and the same, until the `AsyncFd`
    // is dropped.
    unsafe { AsyncFd::register(file) }
        .map_err(|e| anyhow::anyhow!("DelayLink cannot register its TUN device: {e}"))
}

/// Runs `ip args…`; errors carry its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("DelayLink cannot run `ip` (install iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP connect to a closed port in the namespace is refused (the
    /// SYN went in, the reset came back: both directions forward), and not
    /// before both delays passed. Only the lower bound is asserted: the
    /// link holds every packet at least `one_way`, whatever the load.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_far_address_answers_after_the_delay_both_ways() {
        let link = DelayLink::create(Duration::from_millis(20)).unwrap_or_else(|e| panic!("{e:#}"));
        for _ in 0..3 {
            let start = std::time::Instant::now();
            let e = tokio::net::TcpStream::connect((link.far(), 9))
                .await
                .expect_err("nothing listens in the namespace");
            let took = start.elapsed();
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
            assert!(took >= Duration::from_millis(40), "{took:?}");
        }
        let ns = link.namespace().to_owned();
        drop(link);
        let out = Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains(&ns),
            "the namespace is removed on drop"
        );
    }
}
