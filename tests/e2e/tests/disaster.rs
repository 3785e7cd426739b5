//! End-to-end scenario "disaster_recovery": the PostgreSQL server lost and
//! restored from a dump taken under load, with the book's commands
//! (Operations, "Backup and restore" and "Disaster recovery").
//!
//! Two CA replicas on one database whose superuser is `postgres` and whose
//! owner is the ordinary role `reach` (made with the book's `createuser` /
//! `createdb`), three connectors attached to both, applications going down
//! and up on a schedule (status and address history flowing), `pg_dump`
//! (the book's) taken while they flap. After the dump: a fourth connector
//! enrolls and an admin revokes a provisioning key. Then the server is
//! killed and its data directory deleted. While it is gone the replicas
//! keep deciding access. A new server is initialised on the same address,
//! the book's role, database and `pg_restore` run, the replicas are
//! restarted one at a time, and the scenario measures what was lost
//! (rows of each table, by restoring the same dump into a scratch
//! database and comparing it with the lost database's rows read just
//! before the loss), how long until every connector is attached to every
//! replica and every application reports again, and what the connector
//! enrolled after the dump must do (`connector-agent enroll`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use e2e::replica_data_dir as data_dir;
use e2e::{Ca, Connector, DnsServer, Proc, Replica, Scenario, TcpApp, group_key, retry};
use test_support::{Postgres, Segment, book};

const LIMIT: Duration = Duration::from_secs(300);
const NAME: &str = "ca.reach.test";
const ROLE: &str = "reach";
/// The database URL in the book's PostgreSQL commands.
const BOOK_URL: &str = "postgres://reach@db.example.internal/reach";
const CONNECTORS: [&str; 3] = ["c1", "c2", "c3"];
/// The application that never goes down (access decisions during the
/// outage ask for it), then the ones that flap.
const STABLE: &str = "web.reach.test";
const FLAPPING: [&str; 3] = ["f1.reach.test", "f2.reach.test", "f3.reach.test"];
const INTERVAL: Duration = Duration::from_millis(500);
/// How long after a transition its history row may reach the database
/// (the replicas' history writes run once a second).
const WRITE_LAG_MS: i64 = 3_000;
/// The tables whose rows are counted: (table, its time column).
const TABLES: [(&str, &str); 4] = [
    ("health_events", "at_ms"),
    ("address_events", "at_ms"),
    ("admin_audit", "at_ms"),
    ("certificates", "issued_ms"),
];

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Replica `i`'s configuration: group `g` for the connectors, group
/// `spare` whose key an admin revokes after the dump.
fn replica_config(sc: &Scenario, i: usize, at: (SocketAddr, SocketAddr), store: &str) -> String {
    let head = Replica {
        i,
        at,
        store,
        name: NAME,
        groups: &["g", "spare"],
        extra_health: "",
        tls: "",
        first_root: true,
    }
    .config_head(sc);
    let mut hosts = vec![STABLE];
    hosts.extend(FLAPPING);
    head + &Segment::new("app")
        .apps(hosts)
        .tcp(["8080"])
        .interval_ms(INTERVAL.as_millis() as u64)
        .groups(["g"])
        .toml()
}

/// The environment of the book's PostgreSQL commands: the server's client
/// programs on `PATH`, libpq's defaults naming it and its superuser.
fn pg_env(pg: &Postgres) -> Vec<(&'static str, String)> {
    let tool = pg.tool("pg_dump");
    let bin = tool.parent().map(Path::to_owned).unwrap_or_default();
    vec![
        (
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        ),
        ("PGHOST", "127.0.0.1".into()),
        ("PGPORT", pg.port().to_string()),
        ("PGUSER", pg.superuser().into()),
    ]
}

/// Every (host, connector) → status in a replica's `/api/v1/health`.
async fn table(ca: &Ca) -> Result<BTreeMap<(String, String), String>> {
    let health = ca.get("/api/v1/health").await?;
    let mut out = BTreeMap::new();
    for app in health["applications"].as_array().into_iter().flatten() {
        let host = app["host"].as_str().unwrap_or_default().to_owned();
        for c in app["connectors"].as_array().into_iter().flatten() {
            let name = c["connector"].as_str().unwrap_or_default().to_owned();
            let status = c["status"].as_str().unwrap_or_default().to_owned();
            out.insert((host.clone(), name), status);
        }
    }
    Ok(out)
}

/// Whether `ca` has every one of `connectors` attached and reporting every
/// application Up.
async fn whole(ca: &Ca, connectors: &[&str]) -> Result<bool> {
    let t = table(ca).await?;
    let mut hosts = vec![STABLE];
    hosts.extend(FLAPPING);
    Ok(hosts.iter().all(|h| {
        connectors
            .iter()
            .all(|c| t.get(&(h.to_string(), c.to_string())).map(String::as_str) == Some("up"))
    }))
}

async fn connected(ca: &Ca, name: &str) -> Result<bool> {
    let v = ca.get("/api/v1/connectors").await?;
    Ok(v["connectors"].as_array().is_some_and(|list| {
        list.iter()
            .any(|c| c["name"] == name && c["connected"] == true)
    }))
}

/// Each row of `table` in database `db`: seq → time.
fn rows(pg: &Postgres, db: &str, table: &str, time: &str) -> Result<BTreeMap<i64, i64>> {
    let text = pg.psql(db, &format!("SELECT seq || ' ' || {time} FROM {table}"))?;
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (seq, at) = line
            .split_once(' ')
            .with_context(|| format!("{table}: {line:?}"))?;
        out.insert(seq.parse()?, at.parse()?);
    }
    Ok(out)
}

/// Every counted table's rows.
fn snapshot(pg: &Postgres, db: &str) -> Result<BTreeMap<&'static str, BTreeMap<i64, i64>>> {
    TABLES
        .iter()
        .map(|(t, time)| Ok((*t, rows(pg, db, t, time)?)))
        .collect()
}

/// What the dump lost of one table, checked: the dump holds only rows
/// the lost database had, every row older than the dump's start (less
/// the write lag) is in it, none younger than its end.
#[derive(Debug)]
struct Lost {
    table: &'static str,
    before: usize,
    lost: usize,
    /// The lost rows' time span, ms.
    span_ms: i64,
}

fn lost(
    table: &'static str,
    before: &BTreeMap<i64, i64>,
    dumped: &BTreeMap<i64, i64>,
    dump: (i64, i64),
) -> Result<Lost> {
    for (seq, at) in dumped {
        ensure!(
            before.get(seq) == Some(at),
            "{table}: the dump has row {seq} ({at}) the lost database did not"
        );
    }
    let gone: Vec<i64> = before
        .iter()
        .filter(|(seq, _)| !dumped.contains_key(seq))
        .map(|(_, at)| *at)
        .collect();
    for at in &gone {
        ensure!(
            *at >= dump.0 - WRITE_LAG_MS,
            "{table}: a row of {at} ms, before the dump started at {} ms, was lost",
            dump.0
        );
    }
    for (seq, at) in dumped {
        ensure!(
            *at <= dump.1,
            "{table}: row {seq} of {at} ms is younger than the dump's end {}",
            dump.1
        );
    }
    let span_ms = match (gone.iter().min(), gone.iter().max()) {
        (Some(a), Some(b)) => b - a,
        _ => 0,
    };
    Ok(Lost {
        table,
        before: before.len(),
        lost: gone.len(),
        span_ms,
    })
}

/// The replicas' addresses.
fn replica_addrs(sc: &Scenario) -> Vec<(SocketAddr, SocketAddr)> {
    (1..=2)
        .map(|i| (sc.addr(0, i, 7443), sc.addr(0, i, 7480)))
        .collect()
}

async fn start_replica(sc: &Scenario, i: usize, store: &str) -> Result<Ca> {
    let at = replica_addrs(sc)[i - 1];
    let cfg = replica_config(sc, i, at, store);
    Ca::start_replica(sc, &format!("ca{i}"), &cfg, at.1, at.0, &data_dir(sc, 1)).await
}

/// The connector flags of `name`, for `connector-agent` and its `enroll`.
fn connector_args(sc: &Scenario, root: &Path, name: &str) -> Vec<String> {
    [
        "--ca",
        &format!("https://{NAME}:7443"),
        "--ca-cert",
        &root.display().to_string(),
        "--state-dir",
        &sc.dir.join(format!("state-{name}")).display().to_string(),
        "--name",
        name,
        "--group",
        "g",
        "--dns-server",
        &sc.dns().to_string(),
        "--ca-resolve-interval-s",
        "2",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Applications going down and up, one a time, every 700 ms, until
/// `running` is cleared; then every one is up again.
fn flap(
    mut apps: Vec<TcpApp>,
    running: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Result<Vec<TcpApp>>> {
    tokio::spawn(async move {
        let mut i = 0usize;
        while running.load(Ordering::Relaxed) {
            let app = &mut apps[i % FLAPPING.len()];
            if (i / FLAPPING.len()).is_multiple_of(2) {
                app.stop();
            } else {
                app.resume().await?;
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        for app in &mut apps {
            app.stop();
            app.resume().await?;
        }
        Ok(apps)
    })
}

#[tokio::test]
#[ignore = "end-to-end: run with `cargo xtask e2e`"]
async fn disaster_recovery() -> Result<()> {
    let sc = Scenario::new("disaster_recovery", 61)?;
    sc.run_alone(LIMIT, |sc| async move { scenario(&sc).await })
        .await
}

async fn scenario(sc: &Scenario) -> Result<()> {
    let pg = Postgres::start_with_superuser("postgres")?;
    let env = pg_env(&pg);
    book::run_block("pg-role", &[], &env)?;
    book::run_block("pg-createdb", &[], &env)?;
    let store = pg.url_as(ROLE, "reach");

    let mut records: Vec<(&str, IpAddr)> = replica_addrs(sc)
        .iter()
        .map(|(g, _)| (NAME, g.ip()))
        .collect();
    let mut hosts = vec![STABLE];
    hosts.extend(FLAPPING);
    for (i, h) in hosts.iter().enumerate() {
        records.push((h, sc.ip(1, i as u8 + 1)));
    }
    let _dns = DnsServer::start(sc.dns(), "reach.test", &records).await?;
    let mut apps = Vec::new();
    for i in 0..hosts.len() {
        apps.push(TcpApp::start((sc.ip(1, i as u8 + 1), 8080).into()).await?);
    }
    let flapping = apps.split_off(1);
    let mut cas = vec![start_replica(sc, 1, &store).await?];
    cas.push(start_replica(sc, 2, &store).await?);
    let root = cas[0].root.clone();
    let mut connectors = Vec::new();
    for name in CONNECTORS {
        connectors.push(start_connector(sc, &root, name)?);
    }
    for ca in &cas {
        retry(Duration::from_secs(30), || async {
            ensure!(whole(ca, &CONNECTORS).await?, "not whole at {}", ca.http);
            Ok(())
        })
        .await?;
    }
    let running = Arc::new(AtomicBool::new(true));
    let flapper = flap(flapping, running.clone());
    tokio::time::sleep(Duration::from_secs(6)).await;

    // The dump, the book's, under load.
    let backup = sc.dir.join("backup");
    std::fs::create_dir_all(&backup)?;
    let dump_started = now_ms();
    book::run_block(
        "pg-dump",
        &[
            (
                "/var/backups/reach-$(date +%F)",
                &backup.display().to_string(),
            ),
            (BOOK_URL, &store),
        ],
        &env,
    )?;
    let dump_ended = now_ms();
    eprintln!("pg_dump under load: {} ms", dump_ended - dump_started);

    // After the dump: an enrollment and an admin action, and more
    // transitions.
    let late = start_connector(sc, &root, "c4")?;
    retry(Duration::from_secs(20), || async {
        ensure!(connected(&cas[0], "c4").await?, "c4 not attached");
        Ok(())
    })
    .await?;
    let status = cas[0]
        .admin("/api/v1/provisioning_keys/spare/revoke")
        .await?;
    ensure!(status == 200, "revoking spare's key: {status}");
    tokio::time::sleep(Duration::from_secs(5)).await;

    let before = snapshot(&pg, "reach")?;
    running.store(false, Ordering::Relaxed);
    let lost_at = Instant::now();
    let lost_at_ms = now_ms();
    pg.lose()?;
    let _flapped = flapper.await??;
    outage(&cas).await?;

    // Recovery: a new server, the book's role, database and restore.
    let rebuilt = Instant::now();
    pg.rebuild()?;
    let dump_dir = backup.display().to_string();
    let replace = [
        ("/var/backups/reach-2026-12-01", dump_dir.as_str()),
        (BOOK_URL, &store),
    ];
    book::run_block("pg-role", &[], &env)?;
    book::run_block("pg-createdb", &[], &env)?;
    book::run_block("pg-restore", &replace, &env)?;
    let restored_in = rebuilt.elapsed();
    check_lost(
        &pg,
        &backup,
        &before,
        (dump_started, dump_ended),
        lost_at_ms,
    )?;

    // The replicas restarted one at a time, each ready before the next.
    for i in 1..=2 {
        cas[i - 1].proc.stop().await;
        cas[i - 1] = start_replica(sc, i, &store).await?;
    }
    for ca in &cas {
        retry(Duration::from_secs(60), || async {
            ensure!(whole(ca, &CONNECTORS).await?, "not whole at {}", ca.http);
            Ok(())
        })
        .await?;
    }
    let recovered = rebuilt.elapsed();
    // Transitions seen while the database was gone, written once the
    // restored one answered (the replicas' history outboxes).
    let kept = pg.psql(
        "reach",
        &format!(
            "SELECT count(*) FROM health_events WHERE at_ms > {lost_at_ms} AND at_ms < {}",
            lost_at_ms + lost_at.elapsed().as_millis() as i64 - recovered.as_millis() as i64
        ),
    )?;
    eprintln!("status history rows of the outage written after the restore: {kept}");
    eprintln!(
        "recovery: restore {restored_in:?}; every connector attached to both replicas and every application Up {recovered:?} after the new server was started ({:?} after the loss)",
        lost_at.elapsed()
    );
    reenroll_late(sc, &cas, &root, late).await?;
    drop(connectors);
    Ok(())
}

fn start_connector(sc: &Scenario, root: &Path, name: &str) -> Result<Connector> {
    let args = connector_args(sc, root, name);
    let proc = Proc::spawn(
        name,
        "connector-agent",
        &args,
        &[("REACH_PROVISIONING_KEY", group_key("g"))],
        &sc.dir,
    )?;
    Ok(Connector {
        proc,
        name: name.into(),
    })
}

/// While the database is gone: every replica keeps deciding access and
/// says its store is down.
async fn outage(cas: &[Ca]) -> Result<()> {
    let gone = Instant::now();
    let mut decisions = 0;
    while gone.elapsed() < Duration::from_secs(4) {
        for ca in cas {
            let (status, body) = ca.access(STABLE, "tcp", 8080).await?;
            ensure!(
                status == 200,
                "a decision during the outage at {}: {status} {body}",
                ca.http
            );
            decisions += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for ca in cas {
        retry(Duration::from_secs(10), || async {
            let v = ca.get("/api/v1/replicas").await?;
            ensure!(
                v["store"]["up"] == false,
                "store still up at {}: {v}",
                ca.http
            );
            Ok(())
        })
        .await?;
    }
    eprintln!("database gone: {decisions} access decisions in 4 s, none failed; store.up false");
    Ok(())
}

/// The same dump restored into a scratch database and compared with the
/// lost database's rows.
fn check_lost(
    pg: &Postgres,
    backup: &Path,
    before: &BTreeMap<&'static str, BTreeMap<i64, i64>>,
    dump: (i64, i64),
    lost_at_ms: i64,
) -> Result<()> {
    pg.psql("postgres", "CREATE DATABASE dumped OWNER reach")?;
    let out = std::process::Command::new(pg.tool("pg_restore"))
        .args(["-h", "127.0.0.1", "-p", &pg.port().to_string(), "-U", ROLE])
        .args(["--single-transaction", "--dbname=dumped"])
        .arg(backup.join("reach.dump"))
        .output()?;
    if !out.status.success() {
        bail!(
            "pg_restore into dumped: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dumped = snapshot(pg, "dumped")?;
    let mut report = Vec::new();
    for (t, _) in TABLES {
        let l = lost(t, &before[t], &dumped[t], dump)?;
        report.push(l);
    }
    eprintln!(
        "dump started {} ms before the loss, took {} ms",
        lost_at_ms - dump.0,
        dump.1 - dump.0
    );
    for l in &report {
        eprintln!(
            "lost {}: {} of {} rows, spanning {:.1} s",
            l.table,
            l.lost,
            l.before,
            l.span_ms as f64 / 1000.0
        );
    }
    let count = |t: &str| report.iter().find(|l| l.table == t).map_or(0, |l| l.lost);
    ensure!(
        count("health_events") > 0,
        "no status history after the dump was lost: {report:?}"
    );
    ensure!(
        count("admin_audit") >= 1,
        "the key's revocation after the dump survived: {report:?}"
    );
    ensure!(count("certificates") == 1, "c4's certificate: {report:?}");
    let c4 = pg.psql(
        "dumped",
        "SELECT count(*) FROM connectors WHERE name = 'c4'",
    )?;
    ensure!(c4 == "0", "c4 is in the dump");
    let spare = pg.psql(
        "dumped",
        "SELECT count(*) FROM provisioning_keys WHERE grp = 'spare' AND revoked_ms IS NOT NULL",
    )?;
    ensure!(spare == "0", "the revocation after the dump is in it");
    let tables: BTreeSet<String> = pg
        .psql(
            "reach",
            "SELECT tableowner FROM pg_tables WHERE schemaname = 'public'",
        )?
        .lines()
        .map(str::to_owned)
        .collect();
    ensure!(
        tables == BTreeSet::from([ROLE.to_owned()]),
        "restored tables' owners: {tables:?}"
    );
    Ok(())
}

/// c4 enrolled after the dump: the restored store does not know its
/// certificate, it says it needs re-enrollment; `connector-agent enroll`
/// with the same flags and the key, then a start, attaches it.
async fn reenroll_late(sc: &Scenario, cas: &[Ca], root: &Path, mut late: Connector) -> Result<()> {
    retry(Duration::from_secs(20), || async {
        ensure!(
            late.proc.log().contains("re-enrollment needed"),
            "c4 does not say it needs re-enrollment"
        );
        Ok(())
    })
    .await?;
    for ca in cas {
        ensure!(
            !connected(ca, "c4").await?,
            "c4 attached with an unknown certificate"
        );
    }
    late.proc.stop().await;
    let started = Instant::now();
    let mut args = connector_args(sc, root, "c4");
    args.push("enroll".into());
    let mut enroll = Proc::spawn(
        "c4-enroll",
        "connector-agent",
        &args,
        &[("REACH_PROVISIONING_KEY", group_key("g"))],
        &sc.dir,
    )?;
    let code = enroll.wait_exit(Duration::from_secs(30)).await?;
    ensure!(
        code == Some(0),
        "connector-agent enroll: {code:?}\n{}",
        enroll.log()
    );
    let _late = start_connector(sc, root, "c4")?;
    for ca in cas {
        retry(Duration::from_secs(30), || async {
            ensure!(connected(ca, "c4").await?, "c4 not attached at {}", ca.http);
            Ok(())
        })
        .await?;
    }
    eprintln!(
        "c4 (enrolled after the dump) enrolled again and attached in {:?}",
        started.elapsed()
    );
    Ok(())
}
