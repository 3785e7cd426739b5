//! End-to-end scenario "upgrade": the book's rolling upgrade ("Rolling
//! upgrades") from the previous release to this build, under load. The
//! previous release is the last one CHANGELOG.md names; `cargo xtask
//! upgrade-test` builds it once and passes its binaries
//! (`REACH_PREV_BIN_DIR`, with `REACH_PREV_VERSION` and `REACH_PREV_COMMIT`)
//! next to this build's (`REACH_BIN_DIR`, `REACH_COMMIT`). Every binary's
//! `--version` is checked first, so the two builds cannot be mixed up.
//!
//! Three replicas of the previous release on one real PostgreSQL, sharing
//! the issuing root, behind one name the test DNS server resolves to all
//! three; three connectors of the previous release attached to every
//! replica; history (an application down and up) and an audit row made;
//! the backup taken as the book says. Then, with access requests
//! round-robin to the ready replicas and every ready replica's table
//! sampled: each replica replaced in turn by this build (stopped, started
//! on the same address and data directory, ready), and each connector
//! (stopped, started from the same state directory: no enrollment). Held
//! in between, the mixed window both ways: the old connectors with new
//! replicas, and a connector of this build with an old replica, through a
//! certificate renewal of every connector.
//!
//! Asserted: no failed decision, no refused session (each replica's
//! `reach_ca_sessions_refused_total`, which a session without a
//! certificate, refused on purpose at each start, shows counting), every
//! application Up at every sample, the
//! schema as the CHANGELOG's upgrade notes say, everything listed before
//! the upgrade (connectors and their certificates, the audit trail, the
//! status history) still listed. A connector two minor releases ahead is
//! refused naming both releases. Last, the rollback path: the backup
//! restored into a new database, on which the previous release starts and
//! lists the same.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::replica_data_dir as data_dir;
use e2e::{Ca, Connector, DnsServer, Replica, Scenario, TOKEN, TcpApp, retry, tls_client};
use serde_json::Value;
use test_support::{Postgres, Segment};

const LIMIT: Duration = Duration::from_secs(600);
const NAME: &str = "ca.reach.test";
/// The connectors of the previous release, upgraded last.
const OLD: [&str; 3] = ["c1", "c2", "c3"];
/// The connector of this build that joins mid-rollout.
const ADDED: &str = "c4";
const HOSTS: [&str; 2] = ["app.reach.test", "web.reach.test"];
const INTERVAL: Duration = Duration::from_secs(2);
/// Connector certificates last 90 s, so each renews (at two thirds) within
/// the mixed window.
const CERT_S: u64 = 90;

/// A build's binaries and what their `--version` must say.
#[derive(Clone, Debug)]
struct Build {
    dir: PathBuf,
    version: String,
    commit: String,
}

fn env(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| {
        format!(
            "{name} is not set: run this scenario with `cargo xtask upgrade-test`, which builds the previous release"
        )
    })
}

impl Build {
    fn previous() -> Result<Build> {
        Ok(Build {
            dir: env("REACH_PREV_BIN_DIR")?.into(),
            version: env("REACH_PREV_VERSION")?,
            commit: env("REACH_PREV_COMMIT")?,
        })
    }

    fn current() -> Result<Build> {
        Ok(Build {
            dir: e2e::bin_dir()?,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            commit: env("REACH_COMMIT")?,
        })
    }

    /// Every binary this scenario starts from the build says its version
    /// and commit.
    fn verify(&self) -> Result<()> {
        for bin in ["central-authority", "connector-agent"] {
            let path = self.dir.join(bin);
            let out = std::process::Command::new(&path)
                .arg("--version")
                .output()
                .with_context(|| format!("running {} --version", path.display()))?;
            let said = String::from_utf8_lossy(&out.stdout);
            let want = format!("{} (commit {},", self.version, self.commit);
            ensure!(
                out.status.success() && said.contains(&want),
                "{} --version says {said:?}, want {want:?}: not the build this scenario expects",
                path.display()
            );
        }
        Ok(())
    }
}

/// Replica `i`'s configuration (the same policy for all; only the keys
/// both releases know): group `g` for the connectors, group `spare` whose
/// key an admin revokes; `health` is added to `[health]`.
fn replica_config(
    sc: &Scenario,
    at: (SocketAddr, SocketAddr),
    i: usize,
    store: &str,
    health: &str,
) -> String {
    let tls = format!("connector_cert_validity_s = {CERT_S}\n");
    let head = Replica {
        i,
        at,
        store,
        name: NAME,
        groups: &["g", "spare"],
        extra_health: health,
        tls: &tls,
        first_root: true,
    }
    .config_head(sc);
    head + &Segment::new("app")
        .apps(HOSTS)
        .tcp(["8080"])
        .interval_ms(INTERVAL.as_millis() as u64)
        .groups(["g"])
        .toml()
}

/// Three replica slots on one database.
struct Fleet {
    sc: Scenario,
    /// (gRPC, HTTP) of each replica.
    at: Vec<(SocketAddr, SocketAddr)>,
    store: String,
    cas: Vec<Option<Ca>>,
    /// Sessions refused by replicas that were stopped, as they counted.
    refused: u64,
}

impl Fleet {
    fn ca(&self, i: usize) -> Result<&Ca> {
        self.cas[i - 1]
            .as_ref()
            .with_context(|| format!("replica {i} is not running"))
    }

    fn live(&self) -> Vec<&Ca> {
        self.cas.iter().flatten().collect()
    }

    /// `central-authority check-config` of replica `i`'s file, by each
    /// build: a key one release does not know fails here, not mid-upgrade.
    fn check_config(&self, i: usize, builds: &[&Build]) -> Result<()> {
        let path = self.sc.dir.join(format!("check-ca{i}.toml"));
        std::fs::write(
            &path,
            replica_config(&self.sc, self.at[i - 1], i, &self.store, ""),
        )?;
        for build in builds {
            let out = std::process::Command::new(build.dir.join("central-authority"))
                .arg("check-config")
                .arg(&path)
                .output()?;
            ensure!(
                out.status.success(),
                "{} refuses replica {i}'s configuration: {}{}",
                build.version,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// Starts replica `i` from `build`, waits until it is ready, and has it
    /// refuse one session (the control, showing its refusals are counted
    /// where `refused` reads them, whatever its release).
    async fn start(&mut self, i: usize, build: &Build) -> Result<()> {
        let (grpc, http) = self.at[i - 1];
        let config = replica_config(&self.sc, (grpc, http), i, &self.store, "");
        let ca = Ca::start_replica_from(
            &build.dir,
            &self.sc,
            &format!("ca{i}"),
            &config,
            (http, grpc),
            &data_dir(&self.sc, 1),
            &[],
        )
        .await
        .with_context(|| format!("replica {i} ({})", build.version))?;
        refusal_control(&ca).await?;
        self.cas[i - 1] = Some(ca);
        Ok(())
    }

    /// Stops replica `i` gracefully, keeping the sessions it refused.
    async fn stop(&mut self, i: usize) -> Result<()> {
        if let Some(mut ca) = self.cas[i - 1].take() {
            self.refused += refused(&ca).await?;
            ca.proc.stop().await;
        }
        Ok(())
    }

    /// Replaces replica `i` by `build` under traffic: users leave it
    /// first (as a load balancer would), it is stopped, started again on
    /// the same address and data directory, and users return once it is
    /// ready, with every connector's results in its table.
    async fn replace(
        &mut self,
        i: usize,
        build: &Build,
        traffic: &Traffic,
        connectors: &[&str],
    ) -> Result<()> {
        traffic.drain(i).await?;
        self.stop(i).await?;
        let started = Instant::now();
        self.start(i, build).await?;
        let ca = self.ca(i)?;
        ensure!(
            whole(&table(ca).await?, connectors),
            "replica {i} said ready with a table that is not whole"
        );
        traffic.ready[i - 1].store(true, Ordering::Relaxed);
        eprintln!(
            "replica {i} now {}: ready {:?} after its start",
            build.version,
            started.elapsed()
        );
        Ok(())
    }
}

/// Every (host, connector) → status in a replica's `/api/v1/health`.
async fn table(ca: &Ca) -> Result<BTreeMap<(String, String), String>> {
    let health = ca.get("/api/v1/health").await?;
    let mut out = BTreeMap::new();
    for app in health["applications"].as_array().into_iter().flatten() {
        let host = app["host"].as_str().unwrap_or_default().to_owned();
        for c in app["connectors"].as_array().into_iter().flatten() {
            out.insert(
                (
                    host.clone(),
                    c["connector"].as_str().unwrap_or_default().to_owned(),
                ),
                c["status"].as_str().unwrap_or_default().to_owned(),
            );
        }
    }
    Ok(out)
}

/// Whether every one of `connectors` reports both applications Up in `t`.
fn whole(t: &BTreeMap<(String, String), String>, connectors: &[&str]) -> bool {
    HOSTS.iter().all(|h| {
        connectors
            .iter()
            .all(|c| t.get(&(h.to_string(), c.to_string())).map(String::as_str) == Some("up"))
    })
}

/// Waits until every live replica's table has `connectors` at `want`
/// for `hosts`.
async fn agree(fleet: &Fleet, hosts: &[&str], connectors: &[&str], want: &str) -> Result<()> {
    for ca in fleet.live() {
        retry(Duration::from_secs(30), || async {
            let t = table(ca).await?;
            let at = |h: &str, c: &str| t.get(&(h.to_owned(), c.to_owned())).cloned();
            for h in hosts {
                for c in connectors {
                    ensure!(
                        at(h, c).as_deref() == Some(want),
                        "{} {h} at {c}: {:?}, want {want}",
                        ca.http,
                        at(h, c)
                    );
                }
            }
            Ok(())
        })
        .await?;
    }
    Ok(())
}

/// A replica's `/api/v1/connectors` entry of `name`.
async fn connector(ca: &Ca, name: &str) -> Result<Value> {
    let v = ca.get("/api/v1/connectors").await?;
    v["connectors"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .cloned()
        .with_context(|| format!("{} does not list connector {name}", ca.http))
}

/// Waits until every live replica lists each of `names` connected, on
/// `version`, with a session to each of the three replicas.
async fn attached(fleet: &Fleet, names: &[&str], version: &str) -> Result<()> {
    for ca in fleet.live() {
        for name in names {
            retry(Duration::from_secs(30), || async {
                let c = connector(ca, name).await?;
                ensure!(
                    c["connected"] == true
                        && c["version"] == version
                        && c["replicas"]["sessions"] == 3,
                    "{} lists {name} as {c}, want connected on {version} with 3 sessions",
                    ca.http
                );
                Ok(())
            })
            .await?;
        }
    }
    Ok(())
}

/// Sessions `ca` refused since it started, besides the control
/// (`refusal_control`): the sum over every reason of
/// `reach_ca_sessions_refused_total` less one.
async fn refused(ca: &Ca) -> Result<u64> {
    let counted = refused_by_reason(ca).await?;
    let control = counted.get("no_certificate").copied().unwrap_or(0);
    ensure!(
        control >= 1,
        "{} lost count of the control's refusal: {counted:?}",
        ca.http
    );
    Ok(counted.values().sum::<u64>() - 1)
}

/// `reach_ca_sessions_refused_total` of `ca` per reason (a family with no
/// sample yet is not exported: none).
async fn refused_by_reason(ca: &Ca) -> Result<BTreeMap<String, u64>> {
    let text = ca.get_text("/metrics").await?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("reach_ca_sessions_refused_total{") else {
            continue;
        };
        let (labels, value) = rest.split_once("} ").context("a sample line")?;
        let reason = labels
            .split("outcome=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_default();
        let value: f64 = value.split_whitespace().next().unwrap_or("").parse()?;
        out.insert(reason.to_owned(), value as u64);
    }
    Ok(out)
}

/// A session without a client certificate, which every release refuses
/// (`UNAUTHENTICATED`) and counts as `no_certificate`: once it is counted,
/// `refused` reads real counts on this replica.
async fn refusal_control(ca: &Ca) -> Result<()> {
    let pem = std::fs::read_to_string(&ca.root)?;
    let status = say_hello(&pem, ca.grpc, None, "").await?;
    ensure!(
        status.code() == tonic::Code::Unauthenticated,
        "{}: a session without a certificate: {status:?}",
        ca.http
    );
    retry(Duration::from_secs(5), || async {
        let counted = refused_by_reason(ca).await?;
        ensure!(
            counted.get("no_certificate") == Some(&1),
            "{} counted {counted:?}",
            ca.http
        );
        Ok(())
    })
    .await
}

/// What users and a load balancer see: access requests round-robin to the
/// replicas that are ready, and every ready replica's table sampled.
#[derive(Default)]
struct Traffic {
    ready: [AtomicBool; 3],
    running: AtomicBool,
    /// Completed iterations of the request loop and of the sampling loop.
    requested: AtomicU64,
    sampled: AtomicU64,
    decided: [AtomicU64; 3],
    samples: [AtomicU64; 3],
    /// Failed decisions and samples with an application not Up, described.
    failed: Mutex<Vec<String>>,
    not_up: Mutex<Vec<String>>,
}

impl Traffic {
    fn start(
        fleet: &Fleet,
        root_pem: &str,
    ) -> Result<(Arc<Traffic>, Vec<tokio::task::JoinHandle<()>>)> {
        let t = Arc::new(Traffic::default());
        for r in &t.ready {
            r.store(true, Ordering::Relaxed);
        }
        t.running.store(true, Ordering::Relaxed);
        let https: Vec<SocketAddr> = fleet.at.iter().map(|(_, h)| *h).collect();
        let client = tls_client(root_pem)?;
        let load = tokio::spawn(Traffic::requests(t.clone(), client.clone(), https.clone()));
        let sample = tokio::spawn(Traffic::samples(t.clone(), client, https));
        Ok((t, vec![load, sample]))
    }

    /// One request at a time; every refusal of `web.reach.test`, which
    /// stays up throughout, is a failed decision.
    async fn requests(t: Arc<Traffic>, client: reqwest::Client, https: Vec<SocketAddr>) {
        let started = Instant::now();
        let mut i = 0usize;
        while t.running.load(Ordering::Relaxed) {
            let r = i % 3;
            i += 1;
            if t.ready[r].load(Ordering::Relaxed) {
                let sent = client
                    .post(format!("https://{}/api/v1/access", https[r]))
                    .bearer_auth(TOKEN)
                    .timeout(Duration::from_secs(2))
                    .json(&serde_json::json!({"host": "web.reach.test", "protocol": "tcp", "port": 8080}))
                    .send()
                    .await;
                let failure = match sent {
                    Ok(resp) if resp.status().is_success() => None,
                    Ok(resp) => Some(resp.text().await.unwrap_or_default()),
                    Err(e) => Some(format!("{e:#}")),
                };
                match failure {
                    None => {
                        t.decided[r].fetch_add(1, Ordering::Relaxed);
                    }
                    Some(why) => t.note(
                        &t.failed,
                        format!("{:?} replica {}: {why}", started.elapsed(), r + 1),
                    ),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            t.requested.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every 250 ms, each ready replica's table: every application Up.
    async fn samples(t: Arc<Traffic>, client: reqwest::Client, https: Vec<SocketAddr>) {
        let started = Instant::now();
        while t.running.load(Ordering::Relaxed) {
            for (r, http) in https.iter().enumerate() {
                if !t.ready[r].load(Ordering::Relaxed) {
                    continue;
                }
                let seen = sample(&client, *http).await;
                match seen {
                    Ok(apps) if apps.len() == HOSTS.len() && apps.values().all(|s| s == "up") => {
                        t.samples[r].fetch_add(1, Ordering::Relaxed);
                    }
                    other => t.note(
                        &t.not_up,
                        format!("{:?} replica {}: {other:?}", started.elapsed(), r + 1),
                    ),
                }
            }
            t.sampled.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn note(&self, list: &Mutex<Vec<String>>, what: String) {
        eprintln!("{what}");
        if let Ok(mut l) = list.lock() {
            l.push(what);
        }
    }

    /// Takes replica `i` out of both loops and waits until neither has a
    /// request to it in flight.
    async fn drain(&self, i: usize) -> Result<()> {
        self.ready[i - 1].store(false, Ordering::Relaxed);
        let (req, smp) = (
            self.requested.load(Ordering::Relaxed),
            self.sampled.load(Ordering::Relaxed),
        );
        retry(Duration::from_secs(10), || async {
            ensure!(
                self.requested.load(Ordering::Relaxed) >= req + 2
                    && self.sampled.load(Ordering::Relaxed) >= smp + 2,
                "the loops still run a round that may reach replica {i}"
            );
            Ok(())
        })
        .await
    }

    fn decided(&self) -> Vec<u64> {
        self.decided
            .iter()
            .map(|d| d.load(Ordering::Relaxed))
            .collect()
    }
}

/// Each application's overall status in the table at `http`.
async fn sample(client: &reqwest::Client, http: SocketAddr) -> Result<BTreeMap<String, String>> {
    let resp = client
        .get(format!("https://{http}/api/v1/health"))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(2))
        .send()
        .await?;
    let status = resp.status();
    let v: Value = resp.json().await?;
    ensure!(status.is_success(), "{status} {v}");
    Ok(v["applications"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            (
                a["host"].as_str().unwrap_or_default().to_owned(),
                a["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect())
}

/// What the store holds that an upgrade must keep, as the API lists it.
#[derive(Debug, Default)]
struct Kept {
    /// (connector, certificate serial).
    certificates: BTreeSet<(String, String)>,
    audit: Vec<Value>,
    events: Vec<Value>,
}

impl Kept {
    async fn read(ca: &Ca) -> Result<Kept> {
        let mut certificates = BTreeSet::new();
        let listed = ca.get("/api/v1/connectors").await?;
        for c in listed["connectors"].as_array().into_iter().flatten() {
            let name = c["name"].as_str().unwrap_or_default();
            for cert in c["certificates"].as_array().into_iter().flatten() {
                let serial = cert["serial"].as_str().unwrap_or_default();
                certificates.insert((name.to_owned(), serial.to_owned()));
            }
        }
        let audit = ca.get("/api/v1/audit?per_page=1000").await?["entries"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let events = ca.get("/api/v1/events?per_page=1000").await?["events"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(Kept {
            certificates,
            audit,
            events,
        })
    }

    /// What `self` lists that `now` does not.
    fn lost_in(&self, now: &Kept) -> Vec<String> {
        let mut lost: Vec<String> = self
            .certificates
            .difference(&now.certificates)
            .map(|(c, s)| format!("certificate {s} of {c}"))
            .collect();
        for (what, before, after) in [
            ("audit entry", &self.audit, &now.audit),
            ("status change", &self.events, &now.events),
        ] {
            lost.extend(
                before
                    .iter()
                    .filter(|e| !after.contains(e))
                    .map(|e| format!("{what} {e}")),
            );
        }
        lost
    }
}

/// The schema version the database is at.
fn schema(store: &str) -> Result<i64> {
    let db = Postgres::database_of(store).context("the store's database")?;
    let v = Postgres::shared().psql(db, "SELECT version FROM reach_schema")?;
    v.parse()
        .with_context(|| format!("reach_schema says {v:?}"))
}

/// What CHANGELOG.md's entry for this build says of the schema: "stays at
/// version N" or "goes from version A to B".
fn schema_notes(version: &str) -> Result<String> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../CHANGELOG.md"))
        .context("reading CHANGELOG.md")?;
    let heading = format!("## {version} ");
    let entry = text
        .split("\n## ")
        .find(|e| format!("## {e}").starts_with(&heading))
        .with_context(|| format!("CHANGELOG.md has no entry for {version}"))?;
    Ok(entry.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Runs `program` with `args` to success (a step of the book's backup and
/// restore).
fn run(program: &Path, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "{} {} failed: {text}",
        program.display(),
        args.join(" ")
    );
    Ok(text)
}

/// A TLS endpoint to the replica at `grpc`, trusting `root_pem`, with
/// `identity` as client certificate if given.
fn endpoint(
    root_pem: &str,
    grpc: SocketAddr,
    identity: Option<tonic::transport::Identity>,
) -> Result<tonic::transport::Endpoint> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(root_pem))
        .domain_name(NAME);
    if let Some(id) = identity {
        tls = tls.identity(id);
    }
    Ok(Endpoint::from_shared(format!("https://{grpc}"))?.tls_config(tls)?)
}

/// Enrolls `name` in group `g` at the replica at `grpc`, as a connector
/// written from proto/ alone does: its certificate and key.
async fn enroll(
    root_pem: &str,
    grpc: SocketAddr,
    name: &str,
) -> Result<tonic::transport::Identity> {
    use protocol::v1;
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let csr = params.serialize_request(&key)?.pem()?;
    let enrolled = v1::enrollment_client::EnrollmentClient::new(
        endpoint(root_pem, grpc, None)?.connect().await?,
    )
    .enroll(v1::EnrollRequest {
        name: name.into(),
        group: "g".into(),
        provisioning_key: e2e::group_key("g"),
        csr_pem: csr,
    })
    .await?
    .into_inner();
    Ok(tonic::transport::Identity::from_pem(
        &enrolled.certificate_pem,
        key.serialize_pem(),
    ))
}

/// Opens a session to the replica at `grpc` as connector `stranger` with
/// `identity` (none: no client certificate) and says `Hello` stating
/// `release`: the status the CA refuses it with.
async fn say_hello(
    root_pem: &str,
    grpc: SocketAddr,
    identity: Option<tonic::transport::Identity>,
    release: &str,
) -> Result<tonic::Status> {
    use protocol::v1;
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tx.send(v1::ConnectorMessage {
        kind: Some(v1::connector_message::Kind::Hello(v1::Hello {
            name: "stranger".into(),
            group: "g".into(),
            version: "1.0.0".into(),
            release: release.into(),
            capabilities: None,
        })),
    })
    .await?;
    let channel = endpoint(root_pem, grpc, identity)?.connect().await?;
    let opened = v1::connector_session_client::ConnectorSessionClient::new(channel)
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await;
    let mut inbound = match opened {
        Err(status) => return Ok(status),
        Ok(response) => response.into_inner(),
    };
    match tokio::time::timeout(Duration::from_secs(10), inbound.message()).await {
        Ok(Err(status)) => Ok(status),
        other => bail!("the session was not refused: {other:?}"),
    }
}

/// Three replicas and three connectors of `prev`, ready, with history and
/// an audit row; returns the fleet, the connectors and the root's path.
async fn old_deployment(
    sc: &Scenario,
    prev: &Build,
    cur: &Build,
) -> Result<(Fleet, Vec<Connector>, PathBuf)> {
    let mut fleet = Fleet {
        sc: sc.clone(),
        at: (1..=3)
            .map(|i| (sc.addr(0, i, 7443), sc.addr(0, i, 7480)))
            .collect(),
        store: e2e::fresh_postgres_database()?,
        cas: vec![None, None, None],
        refused: 0,
    };
    // Both releases take the configuration; the first replica generates the
    // root the others' files name.
    fleet.check_config(1, &[prev, cur])?;
    fleet.start(1, prev).await?;
    for i in 2..=3 {
        fleet.check_config(i, &[prev, cur])?;
        fleet.start(i, prev).await?;
    }
    let listed = fleet.ca(1)?.get("/api/v1/replicas").await?;
    let versions: Vec<(&str, &str)> = listed["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["live"] == true)
        .filter_map(|r| Some((r["id"].as_str()?, r["version"].as_str()?)))
        .collect();
    let want: Vec<(&str, &str)> = ["ca1", "ca2", "ca3"]
        .into_iter()
        .map(|id| (id, prev.version.as_str()))
        .collect();
    ensure!(versions == want, "replicas: {listed}");
    let root = fleet.ca(1)?.root.clone();
    let mut connectors = Vec::new();
    for name in OLD {
        connectors.push(Connector::start_url_from(
            &prev.dir,
            sc,
            &format!("https://{NAME}:7443"),
            &root,
            (name, "g"),
            &["--ca-resolve-interval-s", "2"],
        )?);
    }
    agree(&fleet, &HOSTS, &OLD, "up").await?;
    attached(&fleet, &OLD, &prev.version).await?;
    Ok((fleet, connectors, root))
}

/// Starts connector `name` of `build` from its state directory (an
/// enrolled one reuses its certificate).
fn start_connector(sc: &Scenario, build: &Build, root: &Path, name: &str) -> Result<Connector> {
    Connector::start_url_from(
        &build.dir,
        sc,
        &format!("https://{NAME}:7443"),
        root,
        (name, "g"),
        &["--ca-resolve-interval-s", "2"],
    )
}

/// The current certificate serial of each of `names` on `ca`.
async fn serials(ca: &Ca, names: &[&str]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for name in names {
        let c = connector(ca, name).await?;
        out.insert(
            (*name).to_owned(),
            c["certificate_serial"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    Ok(out)
}

/// The mixed window both ways, held through a certificate renewal of
/// every connector and three stale windows: the old connectors with the
/// new replicas 1 and 2, and `ADDED` of this build with the old replica 3.
async fn mixed_window(fleet: &Fleet, prev: &Build, cur: &Build) -> Result<()> {
    let all = [OLD[0], OLD[1], OLD[2], ADDED];
    attached(fleet, &OLD, &prev.version).await?;
    attached(fleet, &[ADDED], &cur.version).await?;
    let replicas = fleet.ca(1)?.get("/api/v1/replicas").await?;
    eprintln!("mixed window: replicas {}", replicas["replicas"]);
    let opened = Instant::now();
    let at_start = serials(fleet.ca(1)?, &all).await?;
    retry(Duration::from_secs(CERT_S), || async {
        let now = serials(fleet.ca(1)?, &all).await?;
        let same: Vec<&String> = now
            .iter()
            .filter(|(n, s)| at_start.get(*n) == Some(*s))
            .map(|(n, _)| n)
            .collect();
        ensure!(same.is_empty(), "not renewed yet: {same:?}");
        Ok(())
    })
    .await
    .context("every connector renews its certificate within the mixed window")?;
    let stale = 3 * 3 * INTERVAL;
    tokio::time::sleep(stale.saturating_sub(opened.elapsed())).await;
    for ca in fleet.live() {
        ensure!(
            whole(&table(ca).await?, &all),
            "{}: a table lost entries in the mixed window",
            ca.http
        );
    }
    attached(fleet, &OLD, &prev.version).await?;
    attached(fleet, &[ADDED], &cur.version).await?;
    eprintln!(
        "mixed window held {:?}: every connector renewed, every table whole",
        opened.elapsed()
    );
    Ok(())
}

/// The rollback path: every replica stopped, the backup restored into a
/// new database as "Backup and restore" says, the previous release
/// started on it; it lists what it listed before the upgrade.
async fn rollback(
    fleet: &mut Fleet,
    prev: &Build,
    backup: &Path,
    before: &Kept,
    migrated: bool,
) -> Result<()> {
    for i in 1..=3 {
        fleet.stop(i).await?;
    }
    let sc = fleet.sc.clone();
    if migrated {
        // The previous release refuses the migrated database, naming the
        // schema versions.
        let path = sc.dir.join("downgrade.toml");
        std::fs::write(
            &path,
            replica_config(&sc, fleet.at[0], 1, &fleet.store, "warmup_ms = 0"),
        )?;
        let mut old = e2e::Proc::spawn_from(
            &prev.dir,
            "downgrade",
            "central-authority",
            &["--config".into(), path.display().to_string()],
            &[],
            &sc.dir,
        )?;
        let code = old.wait_exit(Duration::from_secs(30)).await?;
        let said = old.log();
        ensure!(
            code != Some(0) && said.contains("is newer than this binary's"),
            "the previous release on the migrated database: exit {code:?}, {said}"
        );
    }
    let pg = Postgres::shared();
    let restored = pg.fresh_database()?;
    run(
        &pg.tool("pg_restore"),
        &[
            "--no-owner",
            "--dbname",
            &restored,
            &backup.join("reach.dump").display().to_string(),
        ],
    )?;
    let data = sc.dir.join("ca-before");
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&data)?;
    }
    for file in ["ca.pem", "ca.key"] {
        std::fs::copy(backup.join(file), data.join(file))?;
    }
    let (grpc, http) = fleet.at[0];
    let config = replica_config(&sc, (grpc, http), 1, &restored, "warmup_ms = 0");
    let data_arg = data.display().to_string();
    let ca = Ca::start_replica_from(
        &prev.dir,
        &sc,
        "ca1-restored",
        &config,
        (http, grpc),
        &data,
        &["--data-dir", &data_arg],
    )
    .await?;
    let listed = ca.get("/api/v1/replicas").await?;
    ensure!(
        listed["replicas"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["id"] == "ca1"
                && r["live"] == true
                && r["version"] == prev.version.as_str()),
        "the restored replica: {listed}"
    );
    let lost = before.lost_in(&Kept::read(&ca).await?);
    ensure!(lost.is_empty(), "the restored backup lacks: {lost:#?}");
    eprintln!(
        "rollback: {} starts on the restored backup and lists everything",
        prev.version
    );
    Ok(())
}

#[tokio::test]
#[ignore = "end-to-end: run with `cargo xtask upgrade-test`"]
async fn rolling_upgrade_from_the_previous_release() -> Result<()> {
    let (prev, cur) = (Build::previous()?, Build::current()?);
    prev.verify()?;
    cur.verify()?;
    ensure!(
        prev.version != cur.version,
        "the previous release and this build are both {}: bump the version with its CHANGELOG.md entry",
        cur.version
    );
    let sc = Scenario::new("upgrade", 61)?;
    sc.run_alone(LIMIT, |sc| async move { upgrade(sc, prev, cur).await })
        .await
}

async fn upgrade(sc: Scenario, prev: Build, cur: Build) -> Result<()> {
    let (a1, a2) = (sc.ip(1, 1), sc.ip(1, 2));
    let mut records = vec![("app.reach.test", a1), ("web.reach.test", a2)];
    for i in 1..=3 {
        records.push((NAME, sc.ip(0, i)));
    }
    let _dns = DnsServer::start(sc.dns(), "reach.test", &records).await?;
    let mut app = TcpApp::start((a1, 8080).into()).await?;
    let _web = TcpApp::start((a2, 8080).into()).await?;
    let (mut fleet, mut connectors, root) = old_deployment(&sc, &prev, &cur).await?;
    eprintln!(
        "{} deployed: three replicas, three connectors",
        prev.version
    );

    // History and an audit row, from before the upgrade.
    app.stop();
    agree(&fleet, &HOSTS[..1], &OLD, "down").await?;
    app.resume().await?;
    agree(&fleet, &HOSTS, &OLD, "up").await?;
    let status = fleet
        .ca(2)?
        .admin("/api/v1/provisioning_keys/spare/revoke")
        .await?;
    ensure!(status == 200, "revoking group spare's key: {status}");

    // The book's first step: a backup, by the running release.
    let backup = sc.dir.join("backup-before-upgrade");
    let said = run(
        &prev.dir.join("central-authority"),
        &[
            "backup",
            "--config",
            &fleet.ca(1)?.config.display().to_string(),
            "--out",
            &backup.display().to_string(),
        ],
    )?;
    ensure!(
        said.contains("pg_dump"),
        "backup on PostgreSQL names pg_dump: {said}"
    );
    run(
        &Postgres::shared().tool("pg_dump"),
        &[
            "--format=custom",
            "--file",
            &backup.join("reach.dump").display().to_string(),
            &fleet.store,
        ],
    )?;
    let before = Kept::read(fleet.ca(1)?).await?;
    ensure!(
        !before.audit.is_empty() && !before.events.is_empty() && before.certificates.len() >= 3,
        "nothing to keep: {before:?}"
    );
    let schema_before = schema(&fleet.store)?;

    let pem = std::fs::read_to_string(&root)?;
    let (traffic, loops) = Traffic::start(&fleet, &pem)?;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Replicas one at a time; after two, a connector of this build joins
    // and the mixed window is held both ways.
    fleet.replace(1, &cur, &traffic, &OLD).await?;
    let schema_after = schema(&fleet.store)?;
    fleet.replace(2, &cur, &traffic, &OLD).await?;
    connectors.push(start_connector(&sc, &cur, &root, ADDED)?);
    mixed_window(&fleet, &prev, &cur).await?;
    let all = [OLD[0], OLD[1], OLD[2], ADDED];
    fleet.replace(3, &cur, &traffic, &all).await?;
    // Then the connectors, one at a time, from their state directories.
    let key_uses = |v: &Value| -> Option<u64> {
        v["provisioning_keys"]
            .as_array()?
            .iter()
            .find(|k| k["group"] == "g")?["uses"]
            .as_u64()
    };
    let uses = key_uses(&fleet.ca(1)?.get("/api/v1/provisioning_keys").await?);
    for (i, name) in OLD.iter().enumerate() {
        connectors[i].proc.stop().await;
        connectors[i] = start_connector(&sc, &cur, &root, name)?;
        attached(&fleet, &[name], &cur.version).await?;
        agree(&fleet, &HOSTS, &all, "up").await?;
        eprintln!("connector {name} now {}", cur.version);
    }
    let uses_after = key_uses(&fleet.ca(1)?.get("/api/v1/provisioning_keys").await?);
    ensure!(
        uses.is_some() && uses == uses_after,
        "a connector enrolled again: group g's key uses {uses:?} → {uses_after:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    traffic.running.store(false, Ordering::Relaxed);
    for l in loops {
        l.await?;
    }

    // The verdict.
    let decided = traffic.decided();
    let samples: Vec<u64> = traffic
        .samples
        .iter()
        .map(|s| s.load(Ordering::Relaxed))
        .collect();
    eprintln!("decisions per replica {decided:?}, table samples per replica {samples:?}");
    let failed = traffic.failed.lock().map(|f| f.clone()).unwrap_or_default();
    ensure!(failed.is_empty(), "failed decisions: {failed:#?}");
    let not_up = traffic.not_up.lock().map(|f| f.clone()).unwrap_or_default();
    ensure!(
        not_up.is_empty(),
        "samples with an application not Up: {not_up:#?}"
    );
    ensure!(
        decided.iter().all(|d| *d > 0) && samples.iter().all(|s| *s > 0),
        "every replica decided and was sampled"
    );
    let mut refused_total = fleet.refused;
    for ca in fleet.live() {
        refused_total += refused(ca).await?;
    }
    ensure!(
        refused_total == 0,
        "{refused_total} sessions refused during the upgrade"
    );
    let lost = before.lost_in(&Kept::read(fleet.ca(1)?).await?);
    ensure!(lost.is_empty(), "lost in the upgrade: {lost:#?}");
    let notes = schema_notes(&cur.version)?;
    let said = if schema_after == schema_before {
        format!("schema stays at version {schema_before}")
    } else {
        format!("schema goes from version {schema_before} to {schema_after}")
    };
    ensure!(
        schema_after >= schema_before && notes.contains(&said),
        "the database went from schema version {schema_before} to {schema_after}: CHANGELOG.md's {} entry must say \"{said}\" (and whether {} replicas keep working on it)",
        cur.version,
        prev.version
    );
    eprintln!("{said}; nothing refused, failed, lost or down");

    // A connector two minor releases ahead of this build is refused,
    // naming both releases, and counted.
    let ours = protocol::release::Release::current();
    let ahead = format!("{}.{}", ours.major, ours.minor + 2);
    let stranger = enroll(&pem, fleet.at[1].0, "stranger").await?;
    let status = say_hello(&pem, fleet.at[1].0, Some(stranger), &ahead).await?;
    ensure!(
        status.code() == tonic::Code::FailedPrecondition
            && status.message().contains(&format!(
                "connector release {ahead} is too new for this CA (release {ours})"
            )),
        "a too-new connector: {status:?}"
    );
    let counted = refused_by_reason(fleet.ca(2)?).await?;
    ensure!(
        counted.get("release_too_new") == Some(&1) && counted.values().sum::<u64>() == 2,
        "replica 2 counted {counted:?}, want its control and the too-new Hello"
    );

    for mut c in connectors {
        c.proc.stop().await;
    }
    rollback(
        &mut fleet,
        &prev,
        &backup,
        &before,
        schema_after > schema_before,
    )
    .await
}
