//! The conformance kit for connectors written by others (`reach-conformance`):
//! it sets up a deployment on loopback whose every part it can observe (two
//! CA replicas on one PostgreSQL store, a real DNS server, real TCP and UDP
//! applications, an ICMP listener), starts the connector under test with a
//! command given on its command line, and judges the connector rule by rule
//! against the contract in `proto/`, each verdict with its evidence.
//!
//! What is measured where: check rates and addresses at the applications
//! (every accepted connection is a completed three-way handshake), ICMP
//! echo requests by a raw socket, sessions, results and certificates
//! through both replicas' HTTP APIs, enrollments and renewals through
//! `reach_ca_enrollments_total`, refused reports and reports sent before
//! their retry time through `reach_ca_reports_deferred_total` and
//! `reach_ca_reports_early_total` (refusals provoked by stopping the first
//! replica for a moment: the reports of that time reach it at once),
//! reconnect attempts by listeners that take the replicas' gRPC addresses
//! while the replicas are down and count the `Connect` streams that say
//! `Hello` there.

mod away;
mod deployment;
mod icmp;
mod judge;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

pub use deployment::{GROUP, NAME};

/// What to run and how long to watch it.
#[derive(Debug, Clone)]
pub struct Options {
    /// The command that starts the connector under test (program and
    /// arguments), with `{ca_url}`, `{ca_cert}`, `{name}`, `{group}`,
    /// `{provisioning_key}`, `{state_dir}` and `{dns}` replaced.
    pub command: Vec<String>,
    /// Second octet of the `127.N.0.0/16` block the kit's deployment uses.
    pub block: u8,
    /// How long the connector is watched after its first session (at
    /// least the certificate lifetime, so that a renewal falls inside).
    pub observe: Duration,
    /// Where configs and logs go.
    pub out: PathBuf,
}

/// One rule's verdict.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The rule's name (stable: scripts may match on it).
    pub rule: &'static str,
    /// What the rule requires, in one line.
    pub requires: &'static str,
    /// Whether the connector followed it.
    pub pass: bool,
    /// What was measured.
    pub evidence: String,
}

/// Every rule the kit judges, in the order it prints them.
pub const RULES: [(&str, &str); 11] = [
    (
        "enrollment",
        "enrolls with a CSR and the group's provisioning key, then opens an mTLS session",
    ),
    (
        "every-address",
        "checks every address the name resolves to and every explicit IP, on every port",
    ),
    (
        "tcp-handshake",
        "TCP by three-way handshake: open ports Up, a closed port Down",
    ),
    (
        "udp-icmp",
        "UDP applications by ICMP echo to each address (TCP only as the fallback)",
    ),
    (
        "rate-limit",
        "never more checks per second than the CA imposes (measured at the applications)",
    ),
    (
        "report-interval",
        "every application reported within its interval: results never go stale",
    ),
    (
        "on-access",
        "an access is checked at once, its result echoes the access id, checks stop after the window",
    ),
    (
        "flow-control",
        "a refused report is sent again after retry_after_ms, and nothing is lost",
    ),
    (
        "renewal",
        "renews its certificate (Renew, not a new enrollment) before it expires and keeps reporting on the new one",
    ),
    (
        "replicas",
        "holds a session to every replica the CA's name resolves to",
    ),
    (
        "reconnect-backoff",
        "reconnects after the CA goes away, with backoff between session attempts (no tight loop), and reports in full",
    ),
];

/// Runs the kit: the verdicts of every rule, in [`RULES`] order. An error
/// means the kit itself could not run (a missing dependency, a port taken),
/// not that the connector failed.
pub async fn run(options: &Options) -> Result<Vec<Verdict>> {
    let mut deployment = deployment::Deployment::start(options).await?;
    let result = judge::judge(&mut deployment, options).await;
    if result.is_err() {
        deployment.print_logs();
    }
    deployment.stop().await;
    result
}

/// Prints verdicts as a table an implementer reads, and a summary line.
pub fn print(verdicts: &[Verdict]) -> bool {
    let mut failed = 0;
    for v in verdicts {
        let mark = if v.pass { "PASS" } else { "FAIL" };
        println!("{mark}  {:<18} {}", v.rule, v.requires);
        println!("      {}", v.evidence);
        failed += usize::from(!v.pass);
    }
    println!(
        "{} of {} rules passed{}",
        verdicts.len() - failed,
        verdicts.len(),
        if failed == 0 {
            ""
        } else {
            "; the connector does not conform"
        }
    );
    failed == 0
}
