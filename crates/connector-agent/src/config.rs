//! The connector's command-line flags and environment variables (clap), and
//! the settings derived from them, among them the group's provisioning key
//! (redacted wherever it is printed).

use std::net::SocketAddr;

use ipnet::IpNet;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

/// `--state-dir`'s default: what the Debian package, the systemd unit and
/// the container image use.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/reach/connector";

/// How the connector opens its ICMP socket for UDP-port checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum IcmpPreference {
    /// A raw socket when permitted (CAP_NET_RAW), else an unprivileged
    /// datagram ICMP socket, else no ICMP (TCP fallback alone).
    Auto,
    /// Prefer a raw ICMP socket.
    Raw,
    /// Prefer an unprivileged (datagram) ICMP socket.
    Dgram,
    /// Never send ICMP: UDP ports are checked by the TCP fallback alone.
    Off,
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// reach connector: dials out to the central authority (CA), checks the
/// reachability of the applications of its connector group's segments from
/// where it runs, and reports Up / Unhealthy / Down / Unknown.
///
/// Every flag can also be set through the environment variable shown with
/// it. `RUST_LOG` filters the logs (default `info`).
#[derive(Clone, Debug, Parser)]
#[command(name = "connector-agent", version = env!("REACH_VERSION"), about, long_about)]
pub struct Config {
    /// What to do: run (default) or only enroll.
    #[command(subcommand)]
    pub command: Option<Command>,

    /// URL of the CA's gRPC endpoint, e.g. `https://ca.example:7443`.
    /// `http://` (plain text, provisioning key sent with every session)
    /// works only against a CA run with `[tls] enabled = false`. When the
    /// name resolves to several addresses (CA replicas behind one name,
    /// e.g. a Kubernetes headless Service) the connector holds one session
    /// per address, each verifying the server certificate against the
    /// name. Repeat the flag (or separate URLs with commas in `REACH_CA`)
    /// for replicas under several names.
    #[arg(
        long,
        env = "REACH_CA",
        value_name = "URL",
        required = true,
        value_delimiter = ','
    )]
    pub ca: Vec<String>,

    /// How often the `--ca` names are resolved again, in seconds (also after
    /// any lost session): sessions are opened to new addresses and closed
    /// to addresses that went away.
    #[arg(long, env = "REACH_CA_RESOLVE_INTERVAL_S", value_name = "S", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub ca_resolve_interval_s: u32,

    /// PEM file with the CA's root certificate, which the connector trusts
    /// (the CA writes it to `ca.pem` in its data directory).
    #[arg(long, env = "REACH_CA_CERT", value_name = "PATH")]
    pub ca_cert: Option<PathBuf>,

    /// Where the connector keeps its private key and enrolled certificate.
    /// Without an enrollment there, the connector enrolls on start.
    #[arg(long, env = "REACH_STATE_DIR", value_name = "PATH", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,

    /// This connector's name, unique in the deployment.
    #[arg(long, env = "REACH_NAME", value_name = "NAME")]
    pub name: String,

    /// The connector group this connector belongs to.
    #[arg(long, env = "REACH_GROUP", value_name = "GROUP")]
    pub group: String,

    /// File holding the group's provisioning key (surrounding whitespace is
    /// ignored). Alternatively set `REACH_PROVISIONING_KEY`.
    #[arg(long, env = "REACH_PROVISIONING_KEY_FILE", value_name = "PATH")]
    pub provisioning_key_file: Option<PathBuf>,

    /// The group's provisioning key itself. Prefer the environment variable
    /// or `--provisioning-key-file`: command lines are visible to every user
    /// of the host.
    #[arg(
        long,
        env = "REACH_PROVISIONING_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub provisioning_key: Option<ProvisioningKey>,

    /// DNS server (`ADDR:PORT`) to resolve application names with, instead
    /// of the system configuration (/etc/resolv.conf).
    #[arg(long, env = "REACH_DNS_SERVER", value_name = "ADDR:PORT")]
    pub dns_server: Option<SocketAddr>,

    /// Seconds after a name's answer expired during which its last known
    /// addresses are still checked while the DNS fails transiently
    /// (timeouts, SERVFAIL; never after NXDOMAIN), with the DNS error shown
    /// beside the results (serve-stale, RFC 8767). 0 turns it off: the
    /// application is Down from the first failed lookup.
    #[arg(long, env = "REACH_DNS_STALE_GRACE_S", value_name = "S", default_value_t = 300,
          value_parser = clap::value_parser!(u32).range(0..=86_400))]
    pub dns_stale_grace_s: u32,

    /// Most checks started per second, over all segments (smoothly paced).
    /// The CA may override it.
    #[arg(long, env = "REACH_CHECKS_PER_SECOND", value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub checks_per_second: u32,

    /// Timeout of one probe (TCP handshake or ICMP echo), in milliseconds.
    /// The CA may override it.
    #[arg(long, env = "REACH_CHECK_TIMEOUT_MS", value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=600_000))]
    pub check_timeout_ms: u32,

    /// Ceiling on the CA's `checks_per_second`: a higher value from the CA
    /// is clamped to this (with a warning), so a compromised or
    /// misconfigured CA cannot turn the connector into a fast scanner.
    /// `--checks-per-second`, when higher, raises it to that.
    #[arg(long, env = "REACH_MAX_CHECKS_PER_SECOND", value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_checks_per_second: u32,

    /// Ceiling on the CA's `check_timeout_ms` (a higher value is clamped,
    /// with a warning): long timeouts hold sockets open on the watched
    /// networks.
    #[arg(long, env = "REACH_MAX_CHECK_TIMEOUT_MS", value_name = "MS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=600_000))]
    pub max_check_timeout_ms: u32,

    /// Networks the connector may probe, as comma-separated CIDRs
    /// (`10.0.0.0/8,fd00::/8`). An address outside them is never probed,
    /// whatever the policy says (explicit IPs, DNS answers, subnet members):
    /// it is reported down as "not allowed". No restriction when absent.
    #[arg(
        long,
        env = "REACH_ALLOW_NETWORKS",
        value_name = "CIDR",
        value_delimiter = ','
    )]
    pub allow_networks: Vec<IpNet>,

    /// Most checks in flight at once (bounds sockets and memory; slow
    /// timeouts never stall the pace below this).
    #[arg(long, env = "REACH_MAX_IN_FLIGHT", value_name = "N", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=65_535))]
    pub max_in_flight: u32,

    /// ICMP socket for UDP-port checks: `auto` a raw socket when permitted
    /// (CAP_NET_RAW), else an unprivileged one, else none; `off` never
    /// sends ICMP. Without ICMP, UDP ports are checked by the TCP fallback
    /// alone (a warning says so at start).
    #[arg(long, env = "REACH_ICMP", value_enum, default_value_t = IcmpPreference::Auto)]
    pub icmp: IcmpPreference,

    /// Address to serve Prometheus metrics on (`/metrics`), e.g.
    /// `127.0.0.1:9464`. No metrics endpoint when absent.
    #[arg(long, env = "REACH_METRICS_LISTEN", value_name = "ADDR:PORT")]
    pub metrics_listen: Option<SocketAddr>,

    /// Log format: `text` (colour codes only on a terminal) or `json` (one
    /// object per line). `RUST_LOG` filters (default `info`).
    #[arg(long, env = "REACH_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Seconds the connector drains before it stops on SIGTERM (or
    /// Ctrl-C): it tells every CA replica it is draining, so the CA selects
    /// it for no new access, and keeps its sessions, checks and reports
    /// meanwhile; then it stops. A second signal stops it at once. 0 stops
    /// at once. Keep it below the service manager's stop timeout.
    #[arg(long, env = "REACH_DRAIN_SECONDS", value_name = "S", default_value_t = DEFAULT_DRAIN_SECONDS,
          value_parser = clap::value_parser!(u32).range(0..=3600))]
    pub drain_seconds: u32,
}

/// `--drain-seconds`' default: long enough for the users' requests decided
/// just before to be under way, well inside systemd's default stop timeout
/// (90 s) and Kubernetes' default grace period (30 s).
pub const DEFAULT_DRAIN_SECONDS: u32 = 10;

/// Subcommands.
#[derive(Clone, Debug, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Enroll with the CA (new key pair, CSR, provisioning key) and exit;
    /// replaces an earlier enrollment in the state directory. Flags go
    /// before the subcommand: `connector-agent --ca … --name … --group …
    /// --ca-cert … enroll`.
    Enroll,
}

impl Config {
    /// A configuration with defaults for everything but the identity; used
    /// by tests and embedders.
    pub fn new(ca: impl Into<String>, name: impl Into<String>, group: impl Into<String>) -> Self {
        Config {
            command: None,
            ca: vec![ca.into()],
            ca_resolve_interval_s: 30,
            ca_cert: None,
            state_dir: PathBuf::from("reach-connector-state"),
            name: name.into(),
            group: group.into(),
            provisioning_key_file: None,
            provisioning_key: None,
            dns_server: None,
            dns_stale_grace_s: 300,
            checks_per_second: 20,
            check_timeout_ms: 1000,
            max_checks_per_second: 20,
            max_check_timeout_ms: 10_000,
            allow_networks: Vec::new(),
            max_in_flight: 256,
            icmp: IcmpPreference::Auto,
            metrics_listen: None,
            log_format: LogFormat::Text,
            // An embedder stops the connector with the future it passes
            // to `run`, when it means to; the drain is the binary's answer
            // to SIGTERM.
            drain_seconds: 0,
        }
    }

    /// How long the connector drains before it stops (`--drain-seconds`).
    pub fn drain(&self) -> Duration {
        Duration::from_secs(u64::from(self.drain_seconds))
    }

    /// How often the `--ca` names are resolved again.
    pub fn ca_resolve_interval(&self) -> Duration {
        Duration::from_secs(u64::from(self.ca_resolve_interval_s))
    }

    /// How long stale DNS answers are used (`--dns-stale-grace-s`).
    pub fn dns_stale_grace(&self) -> Duration {
        Duration::from_secs(u64::from(self.dns_stale_grace_s))
    }

    /// The probe timeout.
    pub fn check_timeout(&self) -> Duration {
        Duration::from_millis(u64::from(self.check_timeout_ms))
    }

    /// The ceilings on what the CA may impose: the `--max-…` flags, or the
    /// connector's own `--checks-per-second` / `--check-timeout-ms` where
    /// those are higher (an operator who set the local rate to 500 has
    /// accepted that rate; the CA still cannot go beyond it).
    pub fn ceilings(&self) -> Ceilings {
        Ceilings {
            checks_per_second: self.max_checks_per_second.max(self.checks_per_second),
            check_timeout: Duration::from_millis(u64::from(
                self.max_check_timeout_ms.max(self.check_timeout_ms),
            )),
        }
    }
}

/// A group's provisioning key: what the connector shows once to enroll
/// (and, against a CA without TLS, with every session). Its `Debug` output
/// is redacted so that logging a value that holds it can never leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct ProvisioningKey(String);

impl ProvisioningKey {
    /// Wraps a key (the caller checks it is present and printable ASCII,
    /// as `run` and `enroll_only` do).
    pub fn new(key: impl Into<String>) -> Self {
        ProvisioningKey(key.into())
    }

    /// The key itself, for the one place it is sent.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// For `--provisioning-key`: the flag is read straight into the redacted
/// type, so `Debug` of the connector's `Config` never shows it.
impl std::str::FromStr for ProvisioningKey {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(ProvisioningKey::new(s))
    }
}

impl From<&str> for ProvisioningKey {
    fn from(s: &str) -> Self {
        ProvisioningKey::new(s)
    }
}

impl std::fmt::Debug for ProvisioningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProvisioningKey(<redacted>)")
    }
}

/// Local ceilings on the CA's `ConnectorSettings` (`--max-checks-per-second`,
/// `--max-check-timeout-ms`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ceilings {
    /// Most checks per second the CA may ask for.
    pub checks_per_second: u32,
    /// Longest probe timeout the CA may ask for.
    pub check_timeout: Duration,
}

impl Default for Ceilings {
    fn default() -> Self {
        Ceilings {
            checks_per_second: 20,
            check_timeout: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The book's flag table is these flags, as clap parses them.
    #[test]
    fn the_books_flag_table_is_the_code() {
        use clap::CommandFactory;
        let page =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../book/src/connector.md");
        let table = build_info::docs::flag_table(&Config::command(), false);
        test_support::flags::check_generated(
            &page,
            "connector-agent flags",
            &table,
            "cargo test -p connector-agent --lib config::tests::the_books_flag_table_is_the_code",
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    }

    #[test]
    fn debug_never_shows_the_provisioning_key() {
        let config = Config::try_parse_from([
            "connector-agent",
            "--ca",
            "https://ca.example:7443",
            "--name",
            "c1",
            "--group",
            "g",
            "--provisioning-key",
            "s3cret-group-key",
            "--allow-networks",
            "10.0.0.0/8,fd00::/8",
        ])
        .expect("parses");
        let shown = format!("{config:?}");
        assert!(shown.contains("c1"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(config.allow_networks.len(), 2);
    }

    #[test]
    fn drain_seconds_default_to_ten_and_are_bounded() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["connector-agent", "--ca", "https://ca.example:7443"];
            args.extend_from_slice(&["--name", "c1", "--group", "g"]);
            args.extend_from_slice(extra);
            Config::try_parse_from(args)
        };
        let config = parse(&[]).expect("parses");
        assert_eq!(config.drain(), Duration::from_secs(10));
        let off = parse(&["--drain-seconds", "0"]).expect("parses");
        assert_eq!(off.drain(), Duration::ZERO);
        let e = parse(&["--drain-seconds", "3601"]).expect_err("over an hour");
        assert!(e.to_string().contains("--drain-seconds"), "{e}");
    }
}
