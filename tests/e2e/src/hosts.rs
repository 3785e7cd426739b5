//! Two hosts on one machine: two network namespaces the test creates,
//! joined by a veth pair, each with its own address and `lo` up, and a
//! hosts file (`/etc/netns/NS/hosts`, which `ip netns exec` mounts over
//! `/etc/hosts`) naming both, with a `resolv.conf` that points at the
//! namespace's own loopback so no lookup leaves it. Nothing is routed to
//! the test's own namespace: programs reach the hosts through
//! [`Host::command`]. Both namespaces and their `/etc/netns` directories
//! are removed on drop, also when the scenario fails.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};

/// One host: a network namespace with an address on the shared link.
#[derive(Debug, Clone)]
pub struct Host {
    /// The network namespace.
    pub ns: String,
    /// Its short host name (the hosts file's alias).
    pub name: String,
    /// Its fully qualified name (the hosts file's first name).
    pub fqdn: String,
    /// Its address on the link.
    pub ip: Ipv4Addr,
}

impl Host {
    /// `program` run on this host: `ip netns exec NS program`.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &self.ns]).arg(program);
        cmd
    }

    /// The words that run a program on this host under its own host name
    /// (a UTS namespace of its own, as a separate machine has): put before
    /// the program and its arguments.
    pub fn with_host_name(&self) -> Vec<String> {
        [
            "ip",
            "netns",
            "exec",
            &self.ns,
            "unshare",
            "--uts",
            "sh",
            "-c",
            &format!("hostname {} && exec \"$0\" \"$@\"", self.name),
        ]
        .map(str::to_owned)
        .to_vec()
    }

    fn etc(&self) -> PathBuf {
        PathBuf::from("/etc/netns").join(&self.ns)
    }
}

/// Two hosts on a /24, joined by a veth pair; removed on drop.
#[derive(Debug)]
pub struct TwoHosts {
    /// The first host.
    pub a: Host,
    /// The second host.
    pub b: Host,
}

/// Runs `ip` with arguments; errors carry its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl TwoHosts {
    /// Hosts `a` and `b` (`(name, domain, address)` each; addresses on one
    /// /24), in namespaces `reach-TAG-NAME`. `extra_names` are further
    /// hosts-file names for `a`'s address (aliases a certificate may lack).
    /// Needs root and iproute2; fails naming what is missing.
    pub fn create(
        tag: &str,
        a: (&str, &str, Ipv4Addr),
        b: (&str, &str, Ipv4Addr),
        extra_names: &[&str],
    ) -> Result<Self> {
        let host = |(name, domain, ip): (&str, &str, Ipv4Addr)| Host {
            ns: format!("reach-{tag}-{name}"),
            name: name.to_owned(),
            fqdn: format!("{name}.{domain}"),
            ip,
        };
        let hosts = TwoHosts {
            a: host(a),
            b: host(b),
        };
        for h in [&hosts.a, &hosts.b] {
            let _ = ip(&["netns", "del", &h.ns]);
        }
        hosts
            .build(tag, extra_names)
            .context("two hosts in network namespaces (needs root and iproute2)")?;
        Ok(hosts)
    }

    fn build(&self, tag: &str, extra_names: &[&str]) -> Result<()> {
        let mut hosts_file = String::from("127.0.0.1 localhost\n::1 localhost\n");
        for (h, extra) in [(&self.a, extra_names), (&self.b, &[][..])] {
            hosts_file += &format!("{} {} {} {}\n", h.ip, h.fqdn, h.name, extra.join(" "));
        }
        let (if_a, if_b) = (format!("r{tag}a"), format!("r{tag}b"));
        for h in [&self.a, &self.b] {
            ip(&["netns", "add", &h.ns])?;
            std::fs::create_dir_all(h.etc())
                .with_context(|| format!("creating {}", h.etc().display()))?;
            std::fs::write(h.etc().join("hosts"), &hosts_file)?;
            std::fs::write(h.etc().join("resolv.conf"), "nameserver 127.0.0.1\n")?;
        }
        ip(&[
            "link", "add", &if_a, "netns", &self.a.ns, "type", "veth", "peer", "name", &if_b,
            "netns", &self.b.ns,
        ])?;
        for (h, dev) in [(&self.a, &if_a), (&self.b, &if_b)] {
            let cidr = format!("{}/24", h.ip);
            ip(&["-n", &h.ns, "addr", "add", &cidr, "dev", dev])?;
            ip(&["-n", &h.ns, "link", "set", dev, "up"])?;
            ip(&["-n", &h.ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and with it the
        // pair.
        for h in [&self.a, &self.b] {
            let _ = ip(&["netns", "del", &h.ns]);
            let _ = std::fs::remove_dir_all(h.etc());
        }
        // `/etc/netns` itself, when no other namespace's files are in it.
        let _ = std::fs::remove_dir("/etc/netns");
    }
}
