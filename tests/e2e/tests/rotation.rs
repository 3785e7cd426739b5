//! End-to-end scenario "root_rotation": the book's procedure for rotating
//! the issuing root (Operations, "Rotating the root"), run as written on
//! three CA replicas on one PostgreSQL database (127.B.0.{1,2,3}, one name
//! the test DNS server resolves to all three, the root shared through
//! `[tls] issuer_*_file`) with ten real connectors whose certificates live
//! 120 s, under access load round-robin on the three replicas. A new root
//! from `central-authority new-root`; introduce (every connector keeps
//! both roots in its state directory), switch (every connector renews onto
//! the new root: `api root` lists none on the old one), retire. Then: no
//! failed decision, no connector enrolled again (their group's
//! provisioning key was revoked after the first enrollments, and its use
//! count is still ten), every connector attached to all three replicas on
//! a certificate of the new root and trusting only it, and a certificate
//! of the old root, still valid and unrevoked, refused where it was
//! accepted before the retirement.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use e2e::replica_data_dir as data_dir;
use e2e::{
    Ca, Connector, DnsServer, Proc, Replica, Scenario, TOKEN, TcpApp, ca_config_head, group_key,
    raw, retry, tls_client,
};
use serde_json::Value;
use test_support::Segment;

const LIMIT: Duration = Duration::from_secs(420);
const NAME: &str = "ca.reach.test";
const INTERVAL: Duration = Duration::from_secs(4);
const CONNECTORS: usize = 10;

/// Connector `i`'s name (`c01` … `c10`).
fn connector(i: usize) -> String {
    format!("c{:02}", i + 1)
}

/// The `[tls]` of one rotation phase: the issuing root's files and the
/// other root's (`next_root_file` or `previous_root_file`), each a line.
#[derive(Clone, Default)]
struct Phase {
    issuer: Option<(PathBuf, PathBuf)>,
    other: Option<(&'static str, PathBuf)>,
}

impl Phase {
    fn lines(&self) -> String {
        let mut out = String::new();
        if let Some((cert, key)) = &self.issuer {
            out += &format!("issuer_cert_file = {cert:?}\nissuer_key_file = {key:?}\n");
        }
        if let Some((key, file)) = &self.other {
            out += &format!("{key} = {file:?}\n");
        }
        out
    }
}

/// Replica `i`'s configuration in `phase` (replica 1 generated the first
/// root; the others name it until a phase names another issuer).
fn replica_config(
    sc: &Scenario,
    i: usize,
    at: (SocketAddr, SocketAddr),
    store: &str,
    phase: &Phase,
) -> String {
    let tls = format!(
        "connector_cert_validity_s = 120\nrenewal_grace_s = 10\n{}",
        phase.lines()
    );
    let head = Replica {
        i,
        at,
        store,
        name: NAME,
        groups: &["g"],
        extra_health: "",
        tls: &tls,
        first_root: phase.issuer.is_none(),
    }
    .config_head(sc);
    // Ten connectors and the probe: more than the default ten uses.
    let head = head.replacen(
        &format!("provisioning_key = \"{}\"", group_key("g")),
        &format!("provisioning_key = \"{}\"\nmax_uses = 20", group_key("g")),
        1,
    );
    head + &Segment::new("app")
        .apps(["web.reach.test"])
        .tcp(["8080"])
        .interval_ms(INTERVAL.as_millis() as u64)
        .groups(["g"])
        .toml()
}

/// Every connector's status for `web.reach.test` on `ca`.
async fn table(ca: &Ca) -> Result<BTreeMap<String, String>> {
    let health = ca.get("/api/v1/health").await?;
    let mut out = BTreeMap::new();
    for app in health["applications"].as_array().into_iter().flatten() {
        for c in app["connectors"].as_array().into_iter().flatten() {
            out.insert(
                c["connector"].as_str().unwrap_or_default().to_owned(),
                c["status"].as_str().unwrap_or_default().to_owned(),
            );
        }
    }
    Ok(out)
}

/// Whether `ca` lists every connector attached to all three replicas.
async fn all_attached(ca: &Ca) -> Result<bool> {
    let v = ca.get("/api/v1/connectors").await?;
    let attached = v["connectors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["connected"] == true && c["replicas"]["sessions"] == 3)
        .count();
    Ok(attached == CONNECTORS)
}

/// How many certificates a PEM file holds (0 when it cannot be read).
fn certificates_in(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.matches("-----BEGIN CERTIFICATE-----").count())
        .unwrap_or(0)
}

/// `central-authority api root --json` on `ca`.
async fn root_status(ca: &Ca) -> Result<Value> {
    let (code, out) = ca.cli(&["--json", "root"]).await?;
    ensure!(code == 0, "api root: exit {code}: {out}");
    serde_json::from_str(&out).with_context(|| format!("api root: {out}"))
}

/// Reloads every replica into `phase`, one after the other (a rollout),
/// each once its `api root` shows `want`.
async fn roll(
    sc: &Scenario,
    cas: &[Ca],
    at: &[(SocketAddr, SocketAddr)],
    store: &str,
    phase: &Phase,
    want: &str,
) -> Result<()> {
    for (i, ca) in cas.iter().enumerate() {
        ca.reload(&replica_config(sc, i + 1, at[i], store, phase))?;
        retry(Duration::from_secs(15), || async {
            let v = root_status(ca).await?;
            ensure!(v["phase"] == want, "replica {}: {v}", i + 1);
            Ok(())
        })
        .await?;
    }
    Ok(())
}

/// Decisions of the load, made and failed.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
}

/// Access requests round-robin to the replicas' HTTPS listeners until
/// `running` turns false, trusting the roots of `roots` (both, from the
/// start: a client of the API is given the new root while it is
/// introduced).
fn load(
    https: Vec<SocketAddr>,
    roots: &str,
    running: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> Result<tokio::task::JoinHandle<()>> {
    let client = tls_client(roots)?;
    Ok(tokio::spawn(async move {
        let mut i = 0usize;
        while running.load(Ordering::Relaxed) {
            let r = i % https.len();
            i += 1;
            let sent = client
                .post(format!("https://{}/api/v1/access", https[r]))
                .bearer_auth(TOKEN)
                .timeout(Duration::from_secs(5))
                .json(
                    &serde_json::json!({"host": "web.reach.test", "protocol": "tcp", "port": 8080}),
                )
                .send()
                .await;
            match sent {
                Ok(resp) if resp.status().is_success() => {
                    tally.ok.fetch_add(1, Ordering::Relaxed);
                }
                Ok(resp) => {
                    let body = resp.text().await.unwrap_or_default();
                    eprintln!("replica {}: failed decision: {body}", r + 1);
                    tally.failed.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    eprintln!("replica {}: request failed: {e:#}", r + 1);
                    tally.failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }))
}

/// Runs `central-authority new-root --out DIR` as the book says.
async fn new_root(sc: &Scenario, dir: &Path) -> Result<()> {
    let args = vec!["new-root".into(), "--out".into(), dir.display().to_string()];
    let mut made = Proc::spawn("new-root", "central-authority", &args, &[], &sc.dir)?;
    let code = made.wait_exit(Duration::from_secs(30)).await?;
    ensure!(code == Some(0), "new-root: exit {code:?}: {}", made.log());
    Ok(())
}

/// Whether a session of connector `name` with `creds` on the replica at
/// `grpc` (trusting `roots`) is welcomed.
async fn welcomed(grpc: SocketAddr, roots: &str, creds: &raw::Creds, name: &str) -> bool {
    let url = format!("https://{grpc}");
    match raw::Spare::open(&url, roots, creds).await {
        Ok(spare) => spare.hello(name, "g").await.unwrap_or(false),
        Err(e) => {
            eprintln!("probe refused: {e:#}");
            false
        }
    }
}

/// Three replicas, ten connectors: a full root rotation under load.
#[tokio::test]
#[ignore = "end-to-end: run with `cargo xtask e2e`"]
async fn root_rotation() -> Result<()> {
    let sc = Scenario::new("root_rotation", 43)?;
    sc.run_alone(LIMIT, |sc| async move {
        let at: Vec<(SocketAddr, SocketAddr)> = (1..=3)
            .map(|i| (sc.addr(0, i, 7443), sc.addr(0, i, 7480)))
            .collect();
        let web = sc.ip(1, 1);
        let mut records = vec![("web.reach.test", web)];
        for (grpc, _) in &at {
            records.push((NAME, grpc.ip()));
        }
        let _dns = DnsServer::start(sc.dns(), "reach.test", &records).await?;
        let _app = TcpApp::start((web, 8080).into()).await?;
        let store = e2e::fresh_postgres_database()?;
        let steady = Phase::default();
        let mut cas = Vec::new();
        for i in 1..=3 {
            let cfg = replica_config(&sc, i, at[i - 1], &store, &steady);
            let (grpc, http) = at[i - 1];
            cas.push(
                Ca::start_replica(&sc, &format!("ca{i}"), &cfg, http, grpc, &data_dir(&sc, 1))
                    .await?,
            );
        }
        let old_root = data_dir(&sc, 1).join("ca.pem");
        let url = format!("https://{NAME}:7443");
        let mut connectors = Vec::new();
        for i in 0..CONNECTORS {
            connectors.push(Connector::start_url(
                &sc,
                &url,
                &old_root,
                &connector(i),
                "g",
                &["--ca-resolve-interval-s", "2"],
            )?);
        }
        retry(Duration::from_secs(60), || async {
            for ca in &cas {
                let t = table(ca).await?;
                let up = t.values().filter(|s| *s == "up").count();
                ensure!(up == CONNECTORS, "{}: {t:?}", ca.http);
                ensure!(
                    all_attached(ca).await?,
                    "{}: not every connector attached",
                    ca.http
                );
            }
            Ok(())
        })
        .await?;
        // A probe: a certificate of the old root that no process renews.
        let old_pem = std::fs::read_to_string(&old_root)?;
        let probe = raw::enroll(
            &format!("https://{}", at[0].0),
            &old_pem,
            "probe",
            "g",
            &group_key("g"),
        )
        .await?;
        // Nobody enrolls from here on: a connector that had to would fail.
        let (code, out) = cas[1].cli(&["keys", "revoke", "g"]).await?;
        ensure!(code == 0, "keys revoke: {out}");

        // The new root, and a bundle of both for the API's clients.
        let root_2 = sc.dir.join("root-2");
        new_root(&sc, &root_2).await?;
        let (new_cert, new_key) = (root_2.join("ca.pem"), root_2.join("ca.key"));
        let both = sc.dir.join("both-roots.pem");
        std::fs::write(
            &both,
            format!("{old_pem}{}", std::fs::read_to_string(&new_cert)?),
        )?;
        for ca in &mut cas {
            ca.trust(&both)?;
        }
        let running = Arc::new(AtomicBool::new(true));
        let tally = Arc::new(Tally::default());
        let https: Vec<SocketAddr> = at.iter().map(|(_, h)| *h).collect();
        let load = load(
            https,
            &std::fs::read_to_string(&both)?,
            running.clone(),
            tally.clone(),
        )?;
        let start = Instant::now();

        // Introduce: every connector keeps both roots.
        let introduce = Phase {
            issuer: None,
            other: Some(("next_root_file", new_cert.clone())),
        };
        roll(&sc, &cas, &at, &store, &introduce, "introduce").await?;
        retry(Duration::from_secs(30), || async {
            for i in 0..CONNECTORS {
                let trust = sc
                    .dir
                    .join(format!("state-{}", connector(i)))
                    .join("trust.pem");
                ensure!(
                    certificates_in(&trust) == 2,
                    "{}: {}",
                    connector(i),
                    trust.display()
                );
            }
            Ok(())
        })
        .await?;
        let v = root_status(&cas[0]).await?;
        ensure!(
            v["on_old_root"].as_array().map(Vec::len) == Some(CONNECTORS + 1),
            "introduced: every connector (and the probe) is on the old root: {v}"
        );
        ensure!(v["without_trust_bundle"] == serde_json::json!([]), "{v}");
        ensure!(
            welcomed(at[0].0, &old_pem, &probe, "probe").await,
            "the probe is accepted"
        );
        eprintln!("introduced after {:?}", start.elapsed());

        // Switch: the new root issues; connectors renew onto it.
        let switch = Phase {
            issuer: Some((new_cert.clone(), new_key.clone())),
            other: Some(("previous_root_file", old_root.clone())),
        };
        roll(&sc, &cas, &at, &store, &switch, "switch").await?;
        retry(Duration::from_secs(90), || async {
            let v = root_status(&cas[2]).await?;
            let left: Vec<&str> = v["on_old_root"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["name"].as_str())
                .collect();
            ensure!(left == ["probe"], "still on the old root: {left:?}");
            Ok(())
        })
        .await?;
        eprintln!(
            "every connector on the new root after {:?}",
            start.elapsed()
        );
        // What the operator reads: only the probe, which never renews,
        // holds the retirement up.
        let (code, text) = cas[2].cli(&["root"]).await?;
        ensure!(
            code == 0
                && text.starts_with("phase: switch")
                && text.contains("connectors still on the old root (1): probe (g)")
                && text.contains("next: wait until no connector is on the old root"),
            "api root: exit {code}: {text}"
        );
        let new_pem = std::fs::read_to_string(&new_cert)?;
        ensure!(
            welcomed(at[1].0, &new_pem, &probe, "probe").await,
            "the probe is accepted while switching"
        );

        // The probe's certificate is still valid and unrevoked: what
        // refuses it next is the retirement of its root.
        let listed = cas[0].get("/api/v1/connectors").await?;
        let probe_view = listed["connectors"]
            .as_array()
            .and_then(|l| l.iter().find(|c| c["name"] == "probe"))
            .cloned()
            .unwrap_or_default();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64;
        ensure!(
            probe_view["certificate_not_after"]
                .as_i64()
                .is_some_and(|t| t > now_ms + 20_000)
                && probe_view["certificates"][0]["state"] == "current",
            "the probe's certificate: {probe_view}"
        );

        // Retire: the old root is refused.
        let retire = Phase {
            issuer: Some((new_cert.clone(), new_key.clone())),
            other: None,
        };
        roll(&sc, &cas, &at, &store, &retire, "steady").await?;
        let (code, text) = cas[0].cli(&["root"]).await?;
        ensure!(
            code == 0
                && text.starts_with("phase: steady")
                && text.matches("issuing").count() == 1
                && text.contains("no rotation in progress"),
            "api root: exit {code}: {text}"
        );
        for (i, (grpc, _)) in at.iter().enumerate() {
            ensure!(
                !welcomed(*grpc, &new_pem, &probe, "probe").await,
                "replica {} accepted a certificate of the retired root",
                i + 1
            );
        }
        retry(Duration::from_secs(30), || async {
            for i in 0..CONNECTORS {
                let trust = sc
                    .dir
                    .join(format!("state-{}", connector(i)))
                    .join("trust.pem");
                ensure!(
                    certificates_in(&trust) == 1,
                    "{}: {}",
                    connector(i),
                    trust.display()
                );
                let kept = std::fs::read_to_string(&trust)?;
                ensure!(
                    kept.contains(new_pem.trim()),
                    "{}: not the new root",
                    connector(i)
                );
            }
            for ca in &cas {
                ensure!(
                    all_attached(ca).await?,
                    "{}: not every connector attached",
                    ca.http
                );
            }
            Ok(())
        })
        .await?;
        // Reports keep arriving on every replica after the rotation.
        tokio::time::sleep(INTERVAL).await;
        for ca in &cas {
            let t = table(ca).await?;
            ensure!(
                t.iter()
                    .filter(|(c, s)| c.starts_with('c') && *s == "up")
                    .count()
                    == CONNECTORS,
                "{}: {t:?}",
                ca.http
            );
        }
        running.store(false, Ordering::Relaxed);
        load.await?;
        let (ok, failed) = (
            tally.ok.load(Ordering::Relaxed),
            tally.failed.load(Ordering::Relaxed),
        );
        eprintln!(
            "rotation took {:?}: {ok} decisions, {failed} failed",
            start.elapsed()
        );
        ensure!(failed == 0, "failed decisions: {failed}");
        ensure!(ok > 100, "the load ran: {ok}");

        // Nobody enrolled again: eleven uses of the key (ten connectors and
        // the probe), each connector's certificates renewed, never
        // superseded by an enrollment.
        let keys = cas[0].get("/api/v1/provisioning_keys").await?;
        let uses = keys["provisioning_keys"][0]["uses"].as_u64();
        ensure!(uses == Some(CONNECTORS as u64 + 1), "key uses: {keys}");
        let listed = cas[0].get("/api/v1/connectors").await?;
        for c in listed["connectors"].as_array().into_iter().flatten() {
            let name = c["name"].as_str().unwrap_or_default();
            if name == "probe" {
                continue;
            }
            let certs = c["certificates"].as_array().map(Vec::len).unwrap_or(0);
            ensure!(certs >= 2, "{name} renewed: {c}");
        }
        for c in &mut connectors {
            ensure!(c.proc.is_running(), "{} exited", c.name);
            let enrolled = c.proc.log().matches("enrolled with the CA").count();
            ensure!(enrolled == 1, "{} enrolled {enrolled} times", c.name);
        }
        drop(connectors);
        Ok(())
    })
    .await
}

/// Runs one of the book's shell commands against `ca` (`sh -c`), with
/// the release binaries first on `PATH` and the CLI's connection in its
/// environment (`REACH_API_URL`, `REACH_CA_CERT`, `REACH_API_TOKEN_FILE`):
/// (exit code, stdout).
async fn book(sc: &Scenario, ca: &Ca, command: &str) -> Result<(i32, String)> {
    let token = sc.dir.join("api-token");
    std::fs::write(&token, TOKEN)?;
    let path = format!(
        "{}:{}",
        e2e::bin_dir()?.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(command)
        .current_dir(&sc.dir)
        .env("PATH", path)
        .env("REACH_API_URL", format!("https://{}", ca.http))
        .env("REACH_CA_CERT", &ca.root)
        .env("REACH_API_TOKEN_FILE", &token);
    let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.is_empty() {
        eprintln!("{command}: {stderr}");
    }
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}

/// Whether `ca`'s table has every one of `names` Up.
async fn all_up(ca: &Ca, names: &[&str]) -> Result<()> {
    let t = table(ca).await?;
    ensure!(
        names
            .iter()
            .all(|n| t.get(*n).map(String::as_str) == Some("up")),
        "{t:?}"
    );
    Ok(())
}

/// Whether `ca` lists `name` as connected.
async fn connected(ca: &Ca, name: &str) -> Result<bool> {
    let v = ca.get("/api/v1/connectors").await?;
    Ok(v["connectors"].as_array().is_some_and(|l| {
        l.iter()
            .any(|c| c["name"] == name && c["connected"] == true)
    }))
}

/// A connector `name` of group `g` started with the provisioning key `key`
/// and trusting the root file `root` (its own, as on its own host).
fn start_connector(sc: &Scenario, ca: &Ca, name: &str, root: &Path, key: &str) -> Result<Proc> {
    let args = connector_args(sc, ca, name, root);
    Proc::spawn(
        name,
        "connector-agent",
        &args,
        &[("REACH_PROVISIONING_KEY", key.to_owned())],
        &sc.dir,
    )
}

/// The flags of connector `name` (as its service would run it).
fn connector_args(sc: &Scenario, ca: &Ca, name: &str, root: &Path) -> Vec<String> {
    vec![
        "--ca".into(),
        ca.url(),
        "--ca-cert".into(),
        root.display().to_string(),
        "--state-dir".into(),
        sc.dir.join(format!("state-{name}")).display().to_string(),
        "--name".into(),
        name.into(),
        "--group".into(),
        "g".into(),
        "--dns-server".into(),
        sc.dns().to_string(),
    ]
}

/// The book's procedures for a leaked provisioning key and a compromised
/// root (Operations, "A compromised root or provisioning key"), run as
/// written on one CA with two connectors. The key: an intruder enrolled
/// with it; revoked, replaced, the intruder found by its enrollment time
/// and deleted, the connectors untouched. The root: replaced alone, every
/// session on the old root ends at once, every connector's certificates
/// revoked by the book's pipeline, each connector host given the new root
/// and enrolled again, then reporting; a certificate of the old root
/// refused.
#[tokio::test]
#[ignore = "end-to-end: run with `cargo xtask e2e`"]
async fn compromised_key_and_root() -> Result<()> {
    let sc = Scenario::new("compromised_key_and_root", 44)?;
    sc.run(LIMIT, |sc| async move {
        let web = sc.ip(1, 1);
        let _dns = DnsServer::start(sc.dns(), "reach.test", &[("web.reach.test", web)]).await?;
        let _app = TcpApp::start((web, 8080).into()).await?;
        let key_file = sc.dir.join("g.key");
        std::fs::write(&key_file, group_key("g"))?;
        let head = ca_config_head(&sc, &["g"], "", "healthy").replace(
            &format!("provisioning_key = \"{}\"", group_key("g")),
            &format!("provisioning_key_file = {:?}", key_file.display().to_string()),
        );
        let segment = Segment::new("app")
            .apps(["web.reach.test"])
            .tcp(["8080"])
            .interval_ms(INTERVAL.as_millis() as u64)
            .groups(["g"])
            .toml();
        let mut ca = Ca::start(&sc, &format!("{head}{segment}")).await?;
        let old_pem = std::fs::read_to_string(&ca.root)?;
        let names = ["c1", "c2"];
        let mut procs = Vec::new();
        for name in names {
            let root = sc.dir.join(format!("ca-{name}.pem"));
            std::fs::write(&root, &old_pem)?;
            procs.push(start_connector(&sc, &ca, name, &root, &group_key("g"))?);
        }
        retry(Duration::from_secs(30), || all_up(&ca, &names)).await?;

        // A. The key leaks: an intruder enrolls with it, later than the
        // connectors (ENROLLED_AT shows whole seconds).
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let leaked = group_key("g");
        let intruder = raw::enroll(&ca.url(), &old_pem, "intruder", "g", &leaked).await?;
        // 1. Revoked at once.
        let (code, out) = book(&sc, &ca, "central-authority api keys revoke g").await?;
        ensure!(code == 0, "keys revoke: {out}");
        ensure!(
            raw::enroll(&ca.url(), &old_pem, "intruder-2", "g", &leaked).await.is_err(),
            "the revoked key enrolls nobody"
        );
        // 2. A new key in the file, every replica reloaded.
        let new_key = "key-for-g-after-the-leak-bTryrvnXQ0gLBbJxZybBOAGB";
        std::fs::write(&key_file, new_key)?;
        ca.proc.signal("HUP")?;
        retry(Duration::from_secs(10), || async {
            let keys = ca.get("/api/v1/provisioning_keys").await?;
            ensure!(keys["provisioning_keys"][0]["usable"] == true, "{keys}");
            Ok(())
        })
        .await?;
        // 3. What enrolled since the leak: the intruder, by ENROLLED_AT.
        let (code, listed) = book(&sc, &ca, "central-authority api connectors").await?;
        ensure!(code == 0, "api connectors: {listed}");
        // NAME GROUP CONNECTED CHECKS/CYCLE CYCLE (2 words) OVER-BUDGET
        // ENROLLED_AT STATE.
        let enrolled_at = |name: &str| {
            listed
                .lines()
                .find(|l| l.split_whitespace().next() == Some(name))
                .and_then(|l| l.split_whitespace().nth(7))
                .map(str::to_owned)
                .unwrap_or_default()
        };
        ensure!(
            enrolled_at("intruder") > enrolled_at("c1") && enrolled_at("intruder") > enrolled_at("c2"),
            "ENROLLED_AT tells the intruder: {listed}"
        );
        let (code, out) = book(&sc, &ca, "central-authority api connectors delete intruder").await?;
        ensure!(code == 0, "delete: {out}");
        ensure!(
            !welcomed(ca.grpc, &old_pem, &intruder, "intruder").await,
            "the intruder's certificate is refused"
        );
        // The connectors were not touched.
        for name in names {
            ensure!(connected(&ca, name).await?, "{name} still connected");
        }
        all_up(&ca, &names).await?;

        // B. The root is compromised. 1. A new root, alone.
        let (code, out) = book(&sc, &ca, "central-authority new-root --out root-3").await?;
        ensure!(code == 0, "new-root: {out}");
        let (root_3, root_3_key) = (sc.dir.join("root-3/ca.pem"), sc.dir.join("root-3/ca.key"));
        let tls = format!(
            "[tls]\nissuer_cert_file = {:?}\nissuer_key_file = {:?}\n\n[[api_tokens]]",
            root_3.display().to_string(),
            root_3_key.display().to_string()
        );
        let old_c1 = raw::Creds {
            cert: std::fs::read_to_string(sc.dir.join("state-c1/connector.pem"))?,
            key: std::fs::read_to_string(sc.dir.join("state-c1/connector.key"))?,
        };
        ca.reload(&format!("{}{segment}", head.replacen("[[api_tokens]]", &tls, 1)))?;
        let reloaded = Instant::now();
        ca.trust(&root_3)?;
        // Every session on the old root ends at once.
        retry(Duration::from_secs(10), || async {
            for name in names {
                ensure!(!connected(&ca, name).await?, "{name} still connected");
            }
            Ok(())
        })
        .await?;
        eprintln!("sessions on the old root ended {:?} after the reload", reloaded.elapsed());
        // 2. Every connector's certificates revoked.
        let (code, out) = book(
            &sc,
            &ca,
            "export REACH_CA_CERT=root-3/ca.pem\ncentral-authority api connectors | awk 'NR > 1 { print $1 }' | xargs -r -n 1 central-authority api connectors revoke",
        )
        .await?;
        ensure!(code == 0, "revoke pipeline: {out}");
        let listed = ca.get("/api/v1/connectors").await?;
        for c in listed["connectors"].as_array().into_iter().flatten() {
            ensure!(
                c["certificates"][0]["state"] == "revoked",
                "{} not revoked: {c}",
                c["name"]
            );
        }
        // 4. Each connector host: the new root, enrolled again, restarted.
        let new_pem = std::fs::read_to_string(&root_3)?;
        for (i, name) in names.iter().enumerate() {
            procs[i].stop().await;
            let root = sc.dir.join(format!("ca-{name}.pem"));
            std::fs::copy(&root_3, &root)?;
            let mut args = connector_args(&sc, &ca, name, &root);
            args.push("enroll".into());
            let mut enroll = Proc::spawn(
                &format!("{name}-enroll"),
                "connector-agent",
                &args,
                &[("REACH_PROVISIONING_KEY", new_key.to_owned())],
                &sc.dir,
            )?;
            let code = enroll.wait_exit(Duration::from_secs(30)).await?;
            ensure!(code == Some(0), "{name} enroll: {}", enroll.log());
            procs[i] = start_connector(&sc, &ca, name, &root, new_key)?;
        }
        retry(Duration::from_secs(30), || all_up(&ca, &names)).await?;
        // The bundle learned under the old root is gone: the connectors
        // trust their new `--ca-cert` (the CA's bundle is that very root).
        for name in names {
            let kept = sc.dir.join(format!("state-{name}/trust.pem"));
            let t = std::fs::read_to_string(&kept).unwrap_or_default();
            ensure!(!t.contains(old_pem.trim()), "{name} still trusts the old root: {t}");
        }
        // A certificate of the old root is refused.
        ensure!(
            !welcomed(ca.grpc, &new_pem, &old_c1, "c1").await,
            "a certificate of the old root is refused"
        );
        drop(procs);
        Ok(())
    })
    .await
}
