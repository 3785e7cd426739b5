//! The conformance kit judged on known connectors: `connector-agent` passes
//! every rule, and a connector that breaks one rule on purpose
//! (`reach-broken-connector`) fails that rule while the rules it follows
//! pass. Each case runs the real `reach-conformance` binary, which starts
//! its own replicas, PostgreSQL, DNS server and applications.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use e2e::bin_dir;

/// Runs `reach-conformance` on block `block` with `command`; the verdict
/// of every rule it printed, and its exit code.
fn kit(block: u8, command: &[&str]) -> Result<(BTreeMap<String, bool>, Option<i32>, String)> {
    let out = e2e::out_dir().join(format!("conformance-{block}"));
    let run = std::process::Command::new(bin_dir()?.join("reach-conformance"))
        .args(["--block", &block.to_string(), "--out"])
        .arg(&out)
        .arg("--")
        .args(command)
        .output()
        .context("running reach-conformance")?;
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let verdicts = stdout
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let pass = match words.next()? {
                "PASS" => true,
                "FAIL" => false,
                _ => return None,
            };
            Some((words.next()?.to_owned(), pass))
        })
        .collect();
    let report = format!("{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    Ok((verdicts, run.status.code(), report))
}

const CONNECTOR_ARGS: [&str; 8] = [
    "--ca",
    "{ca_url}",
    "--ca-cert",
    "{ca_cert}",
    "--name",
    "{name}",
    "--group",
    "{group}",
];

fn broken(block: u8, fault: &str) -> Result<(BTreeMap<String, bool>, Option<i32>, String)> {
    let mut command = vec!["reach-broken-connector"];
    command.extend(CONNECTOR_ARGS);
    command.extend(["--dns", "{dns}", "--fault", fault]);
    kit(block, &command)
}

/// `fails` failed and every rule of `passes` passed, the exit code is 1.
fn judged(
    (verdicts, code, report): (BTreeMap<String, bool>, Option<i32>, String),
    fails: &str,
    passes: &[&str],
) -> Result<()> {
    ensure!(verdicts.len() == 11, "not every rule was judged:\n{report}");
    ensure!(
        verdicts.get(fails) == Some(&false),
        "{fails} did not fail:\n{report}"
    );
    for rule in passes {
        ensure!(
            verdicts.get(*rule) == Some(&true),
            "{rule} did not pass:\n{report}"
        );
    }
    ensure!(code == Some(1), "exit code {code:?}, want 1:\n{report}");
    Ok(())
}

#[test]
#[ignore = "end-to-end: run with `cargo xtask e2e`"]
fn connector_agent_conforms() -> Result<()> {
    let mut command = vec!["connector-agent"];
    command.extend(CONNECTOR_ARGS);
    command.extend(["--state-dir", "{state_dir}", "--dns-server", "{dns}"]);
    let (verdicts, code, report) = kit(230, &command)?;
    ensure!(
        verdicts.len() == 11 && verdicts.values().all(|p| *p),
        "connector-agent failed a rule:\n{report}"
    );
    ensure!(code == Some(0), "exit code {code:?}, want 0:\n{report}");
    Ok(())
}

#[test]
#[ignore = "end-to-end: run with `cargo xtask e2e`"]
fn a_connector_over_the_rate_fails_rate_limit() -> Result<()> {
    judged(
        broken(231, "too-fast")?,
        "rate-limit",
        &["enrollment", "every-address", "tcp-handshake", "renewal"],
    )
}

/// Renewing as it should (`Renew` calls while the replicas are away
/// included) and reconnecting with backoff, this connector passes
/// `renewal` and `reconnect-backoff`: neither renewals nor TLS handshakes
/// count as session attempts.
#[test]
#[ignore = "end-to-end: run with `cargo xtask e2e`"]
fn a_connector_that_skips_an_address_fails_every_address() -> Result<()> {
    judged(
        broken(232, "skip-address")?,
        "every-address",
        &["enrollment", "rate-limit", "renewal", "reconnect-backoff"],
    )
}

#[test]
#[ignore = "end-to-end: run with `cargo xtask e2e`"]
fn a_connector_that_ignores_flow_control_fails_flow_control() -> Result<()> {
    judged(
        broken(233, "ignore-flow-control")?,
        "flow-control",
        &["enrollment", "every-address", "rate-limit", "renewal"],
    )
}

/// The refused entries are dropped, not sent again: some applications never
/// have a result. Renewing as this connector does passes `renewal`.
#[test]
#[ignore = "end-to-end: run with `cargo xtask e2e`"]
fn a_connector_that_drops_refused_entries_fails_flow_control() -> Result<()> {
    judged(
        broken(235, "drop-refused")?,
        "flow-control",
        &["enrollment", "every-address", "rate-limit", "renewal"],
    )
}

/// The certificate expires and the connector enrolls again with the
/// provisioning key: the CA issued it a new certificate, but not by `Renew`.
#[test]
#[ignore = "end-to-end: run with `cargo xtask e2e`"]
fn a_connector_that_lets_its_certificate_expire_fails_renewal() -> Result<()> {
    judged(
        broken(234, "let-expire")?,
        "renewal",
        &[
            "enrollment",
            "every-address",
            "tcp-handshake",
            "rate-limit",
            "report-interval",
            "flow-control",
            "reconnect-backoff",
        ],
    )
}

/// Opening a session again at once after it failed, over and over: more
/// session attempts while the replicas are away than backoff makes.
#[test]
#[ignore = "end-to-end: run with `cargo xtask e2e`"]
fn a_connector_without_backoff_fails_reconnect_backoff() -> Result<()> {
    judged(
        broken(236, "no-backoff")?,
        "reconnect-backoff",
        &["enrollment", "every-address", "rate-limit", "renewal"],
    )
}
