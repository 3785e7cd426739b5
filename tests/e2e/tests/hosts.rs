//! Scenarios across hosts: two network namespaces this test makes
//! (`e2e::hosts`), the CA on one and connectors on the other, each host
//! with its own address, host name and hosts file, as separate machines
//! are. The CA keeps its embedded SQLite store whatever `REACH_E2E_STORE`
//! says: the test's PostgreSQL listens on the test's own loopback, which
//! another host cannot reach.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use e2e::hosts::{Host, TwoHosts};
use e2e::{App, Proc, Scenario, TOKEN, find_app, group_key, retry};
use test_support::Segment;

const LIMIT: Duration = Duration::from_secs(180);

/// The CA's host and the connectors' host.
const CA_HOST: (&str, &str, Ipv4Addr) = ("reach-ca", "example.test", Ipv4Addr::new(10, 77, 0, 1));
const CONNECTOR_HOST: (&str, &str, Ipv4Addr) =
    ("reach-conn", "example.test", Ipv4Addr::new(10, 77, 0, 2));
/// A further name of the CA's host that its certificate cannot know.
const ALIAS: &str = "reach-ca-alias.example.test";
/// The application on the connectors' host.
const APP_PORT: u16 = 8080;

/// The packaged CA configuration's listen addresses, as the package ships
/// them (deploy/debian/ca.toml).
fn packaged_listen() -> Result<(SocketAddr, SocketAddr)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/debian/ca.toml");
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let value = |key: &str| -> Result<SocketAddr> {
        let quoted = text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim_start().strip_prefix('='))
            .and_then(|rest| rest.split('"').nth(1))
            .with_context(|| format!("{path} has no {key}"))?;
        quoted.parse().with_context(|| format!("{path}: {key}"))
    };
    Ok((value("grpc_listen")?, value("http_listen")?))
}

/// The CA's configuration: the packaged listen addresses, no `[tls]`
/// table (so no `server_names`), and an application on the connectors'
/// host.
fn ca_config(grpc: SocketAddr, http: SocketAddr, app: Ipv4Addr) -> String {
    let mut config = format!(
        r#"[server]
grpc_listen = "{grpc}"
http_listen = "{http}"

[health]
heartbeat_interval_ms = 1000

[[api_tokens]]
name = "e2e"
token = "{TOKEN}"
scopes = ["access", "read", "admin"]

[[connector_groups]]
name = "default"
provisioning_key = "{key}"
"#,
        key = group_key("default"),
    );
    config += &Segment::new("far")
        .apps([app])
        .tcp([APP_PORT])
        .groups(["default"])
        .toml();
    config
}

/// The operator CLI on `host` against the CA's HTTP API at `url`:
/// `central-authority api --json ARGS…`; its output when it exits 0.
async fn api(host: &Host, url: &str, root: &Path, token: &Path, args: &[&str]) -> Result<String> {
    let out = host
        .command(e2e::bin_dir()?.join("central-authority"))
        .args(["api", "--json", "--url", url, "--ca-cert"])
        .arg(root)
        .arg("--token-file")
        .arg(token)
        .args(args)
        .output()
        .await
        .context("running central-authority api")?;
    ensure!(
        out.status.success(),
        "central-authority api {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A connector on `host` named `name`, dialling the CA at `url`.
fn connector(sc: &Scenario, host: &Host, name: &str, url: &str, root: &Path) -> Result<Proc> {
    let args = [
        "--ca",
        url,
        "--ca-cert",
        &root.display().to_string(),
        "--state-dir",
        &sc.dir.join(format!("state-{name}")).display().to_string(),
        "--name",
        name,
        "--group",
        "default",
    ]
    .map(str::to_owned);
    let wrapper = ["ip", "netns", "exec", &host.ns].map(str::to_owned);
    Proc::spawn_in(
        &wrapper,
        name,
        "connector-agent",
        &args,
        &[("REACH_PROVISIONING_KEY", group_key("default"))],
        &sc.dir,
    )
}

/// 20. Two hosts: the CA on one with the packaged listen addresses (every
/// address) and no `[tls] server_names`; on the other an application and
/// two connectors, one dialling the CA by address, one by its host's fully
/// qualified name. Both enroll (the generated server certificate names
/// the host's name and addresses) and report the application Up, seen
/// through the HTTP API from the connectors' host by name. A third
/// connector dials a name the host has but the certificate cannot know,
/// and its log names the fix.
#[tokio::test]
#[ignore = "end-to-end: run with `cargo xtask e2e`"]
async fn s20_two_hosts() -> Result<()> {
    let sc = Scenario::new("s20_two_hosts", 54)?;
    let tag = format!("{}", std::process::id() % 100_000);
    let hosts = TwoHosts::create(&tag, CA_HOST, CONNECTOR_HOST, &[ALIAS])?;
    let hosts = &hosts;
    sc.run(LIMIT, |sc| async move { two_hosts(&sc, hosts).await })
        .await
}

async fn two_hosts(sc: &Scenario, hosts: &TwoHosts) -> Result<()> {
    let (ca_host, far) = (&hosts.a, &hosts.b);
    let (grpc, http) = packaged_listen()?;
    ensure!(
        grpc.ip().is_unspecified() && http.ip().is_unspecified(),
        "the packaged configuration listens on {grpc} and {http}, not on every address"
    );
    let mut service = far
        .command(e2e::bin_dir()?.join("reach-testhost"))
        .args(["--tcp", &format!("{}:{APP_PORT}", far.ip)])
        .kill_on_drop(true)
        .spawn()
        .context("starting the application on the connectors' host")?;
    let config = sc.dir.join("ca.toml");
    std::fs::write(&config, ca_config(grpc, http, far.ip))?;
    let mut ca = Proc::spawn_in(
        &ca_host.with_host_name(),
        "ca",
        "central-authority",
        &["--config".into(), config.display().to_string()],
        &[],
        &sc.dir,
    )?;
    let root: PathBuf = sc.dir.join("reach-ca-data").join("ca.pem");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !root.exists() {
        ensure!(ca.is_running(), "the CA exited:\n{}", ca.log());
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the CA wrote no {} within 15 s",
            root.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names = retry(Duration::from_secs(5), || async {
        ca.log()
            .lines()
            .find(|l| l.contains("issued the TLS server certificate"))
            .map(str::to_owned)
            .context("the CA did not log its server certificate's names")
    })
    .await?;
    for name in [
        ca_host.name.as_str(),
        ca_host.fqdn.as_str(),
        &ca_host.ip.to_string(),
    ] {
        ensure!(names.contains(name), "{name} missing in: {names}");
    }

    let token = sc.dir.join("api-token");
    std::fs::write(&token, TOKEN)?;
    let by_name = |port: u16| format!("https://{}:{port}", ca_host.fqdn);
    let _by_address = connector(
        sc,
        far,
        "by-address",
        &format!("https://{}:{}", ca_host.ip, grpc.port()),
        &root,
    )?;
    let _by_name = connector(sc, far, "by-name", &by_name(grpc.port()), &root)?;
    let alias = connector(
        sc,
        far,
        "by-alias",
        &format!("https://{ALIAS}:{}", grpc.port()),
        &root,
    )?;

    let app = App::new("far", &far.ip.to_string(), "tcp", APP_PORT);
    let http_url = by_name(http.port());
    retry(Duration::from_secs(60), || async {
        let text = api(far, &http_url, &root, &token, &["health"]).await?;
        let health: serde_json::Value = serde_json::from_str(&text).context("health JSON")?;
        let row = find_app(&health, &app).with_context(|| format!("no row for {app:?}"))?;
        for connector in ["by-address", "by-name"] {
            let status = row["connectors"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["connector"] == connector))
                .and_then(|c| c["status"].as_str());
            ensure!(status == Some("up"), "{connector}: {status:?} in {row}");
        }
        Ok(())
    })
    .await?;

    let want = format!("add \"{ALIAS}\" to [tls] server_names on the CA");
    retry(Duration::from_secs(20), || async {
        ensure!(alias.log().contains(&want), "no {want:?} in the log yet");
        Ok(())
    })
    .await?;
    let text = api(far, &http_url, &root, &token, &["connectors"]).await?;
    if text.contains("by-alias") {
        bail!("the connector dialling {ALIAS} enrolled: {text}");
    }
    let _ = service.kill().await;
    Ok(())
}
