//! Backup and restore, as the book's "Backup and restore" section tells an
//! operator: the real `central-authority` binary (CA A) with the real
//! connector enrolled and reporting, `central-authority backup` while A
//! runs (and `pg_dump` for PostgreSQL), A stopped, the backup restored into
//! a new data directory (and a new database), CA B started from it on A's
//! addresses; the same connector, from the same state directory and
//! without a provisioning key, attaches to B and its application reads Up
//! there. Its certificate is the one A issued and the key was used once.
//!
//! PostgreSQL runs the book's own commands (`pg_dump`, `createdb --owner`,
//! `pg_restore` as the CA's role; `test_support::book`) on a server whose
//! superuser is `postgres` and where the CA's role `reach` is an ordinary
//! one, as in a deployment: the restored tables must be the role's, or the
//! CA cannot migrate them.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::{Http, KEY_EAST, READ_TOKEN, eventually, scratch_dir, spawn_agent};
use test_support::{Postgres, Segment, TcpApp, book, free_port};

const BIN: &str = env!("CARGO_BIN_EXE_central-authority");
const ADMIN_TOKEN: &str = "tok-admin-PlQ7jmHXY1X2oyup1UokZXlp";

/// Kills the CA process when the test ends, however it ends.
struct CaProcess(Child);

impl Drop for CaProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Where both CAs listen and what they serve.
struct Site {
    grpc: SocketAddr,
    http: SocketAddr,
    app: TcpApp,
}

impl Site {
    async fn new() -> Site {
        let port = |_| free_port().expect("free port");
        let app = TcpApp::start(([127, 0, 0, 1], port(())).into())
            .await
            .expect("application");
        Site {
            grpc: ([127, 0, 0, 1], port(())).into(),
            http: ([127, 0, 0, 1], port(())).into(),
            app,
        }
    }

    /// A CA configuration over `data_dir` and, when given, a PostgreSQL
    /// store.
    fn config(&self, dir: &Path, data_dir: &Path, store: Option<&str>) -> PathBuf {
        let store = store.map_or_else(String::new, |url| format!("[store]\nurl = \"{url}\"\n"));
        let text = format!(
            r#"
[server]
grpc_listen = "{grpc}"
http_listen = "{http}"
data_dir = "{data}"

{store}
[[api_tokens]]
name = "ops"
token = "{READ_TOKEN}"
scopes = ["read"]

[[api_tokens]]
name = "root"
token = "{ADMIN_TOKEN}"
scopes = ["admin"]

[[connector_groups]]
name = "dc-east"
provisioning_key = "{KEY_EAST}"
{segment}"#,
            grpc = self.grpc,
            http = self.http,
            data = data_dir.display(),
            segment = Segment::new("web")
                .apps(["127.0.0.1"])
                .tcp([self.app.addr().port()])
                .groups(["dc-east"])
                .toml(),
        );
        let path = dir.join("ca.toml");
        std::fs::write(&path, text).expect("config");
        path
    }

    /// Starts the CA binary on `config` and waits until its HTTP listener
    /// accepts and its root is in `data_dir`.
    async fn start(&self, config: &Path, data_dir: &Path, log: &Path) -> CaProcess {
        let log = std::fs::File::create(log).expect("log file");
        let child = Command::new(BIN)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn the CA");
        let ca = CaProcess(child);
        let http = self.http;
        eventually("the CA listens", || async move {
            tokio::net::TcpStream::connect(http).await.is_ok()
        })
        .await;
        let root = data_dir.join("ca.pem");
        eventually("the CA has its root", || {
            let exists = root.exists();
            async move { exists }
        })
        .await;
        ca
    }
}

/// The connector `east-1` with its state in `state`, trusting `root`;
/// `key` only for its first start.
fn agent(site: &Site, root: &Path, state: &Path, key: Option<&str>) -> connector_agent::Config {
    let mut config =
        connector_agent::Config::new(format!("https://{}", site.grpc), "east-1", "dc-east");
    config.ca_cert = Some(root.to_owned());
    config.state_dir = state.to_owned();
    config.provisioning_key = key.map(Into::into);
    config.icmp = connector_agent::IcmpPreference::Off;
    config
}

/// Every file of the connector's state directory with its content.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("state dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .map(|p| {
            let name = p.file_name().expect("name").to_string_lossy().into_owned();
            (name, std::fs::read(&p).expect("read"))
        })
        .collect()
}

/// Waits until `east-1` is connected to the CA at `web` and reports the
/// application Up there; returns its certificate serial.
async fn attached_and_up(web: &Http, port: u16) -> String {
    eventually("the application reads Up", || async {
        web.app("web", "127.0.0.1", u64::from(port))
            .await
            .is_some_and(|a| a["status"] == "up")
    })
    .await;
    let (s, v) = web.get_json("/api/v1/connectors", Some(ADMIN_TOKEN)).await;
    assert_eq!(s, 200, "{v}");
    let c = v["connectors"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "east-1"))
        .unwrap_or_else(|| panic!("east-1 not listed: {v}"));
    assert_eq!(c["connected"], true, "{c}");
    c["certificate_serial"]
        .as_str()
        .unwrap_or_else(|| panic!("no serial: {c}"))
        .to_owned()
}

/// How often the group's provisioning key has been used.
async fn key_uses(web: &Http) -> u64 {
    let (s, v) = web
        .get_json("/api/v1/provisioning_keys", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(s, 200, "{v}");
    v["provisioning_keys"]
        .as_array()
        .and_then(|ks| ks.iter().find(|k| k["group"] == "dc-east"))
        .and_then(|k| k["uses"].as_u64())
        .unwrap_or_else(|| panic!("no uses for dc-east: {v}"))
}

/// Runs a command to success; its output otherwise.
fn run(command: &mut Command) -> String {
    let out = command.output().expect("run");
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The restore step for a data directory: a new directory of mode 0700
/// and the backup's files copied into it (`install -d -m 700`, `cp -p`).
fn restore_files(backup: &Path, data_dir: &Path, names: &[&str]) {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(data_dir)
        .expect("new data dir");
    for name in names {
        std::fs::copy(backup.join(name), data_dir.join(name)).expect("copy");
    }
}

/// The role the CA connects as, an ordinary one (the server's superuser
/// is `postgres`).
const ROLE: &str = "reach";
/// The database URL in the book's PostgreSQL commands.
const BOOK_URL: &str = "postgres://reach@db.example.internal/reach";

/// The environment the book's PostgreSQL commands run in: the server's
/// own client programs first on `PATH`, and libpq's defaults naming the
/// server and its superuser (what `sudo -iu postgres` on the database
/// server gives).
fn pg_env(pg: &Postgres) -> Vec<(&'static str, String)> {
    let bin = pg.tool("pg_dump");
    let bin = bin.parent().expect("bin dir").display().to_string();
    vec![
        (
            "PATH",
            format!("{bin}:{}", std::env::var("PATH").unwrap_or_default()),
        ),
        ("PGHOST", "127.0.0.1".into()),
        ("PGPORT", pg.port().to_string()),
        ("PGUSER", pg.superuser().into()),
    ]
}

/// The book's PostgreSQL restore: `createdb --owner=reach reach` as the
/// superuser, `pg_restore` as the CA's role into `url`; then every table
/// and sequence is the role's.
fn restore_database(pg: &Postgres, backup: &Path, url: &str) {
    let env = pg_env(pg);
    book::run_block("pg-createdb", &[], &env).expect("the book's createdb");
    let dir = backup.display().to_string();
    let ran = book::run_block(
        "pg-restore",
        &[("/var/backups/reach-2026-12-01", &dir), (BOOK_URL, url)],
        &env,
    )
    .expect("the book's pg_restore");
    assert!(ran.iter().any(|l| l.starts_with("pg_restore ")), "{ran:?}");
    let foreign = pg
        .psql(
            "reach",
            "SELECT string_agg(c.relname || ' (' || r.rolname || ')', ', ') FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_roles r ON r.oid = c.relowner \
             WHERE n.nspname = 'public' AND c.relkind IN ('r', 'S', 'v') AND r.rolname <> 'reach'",
        )
        .expect("owners");
    assert!(
        foreign.is_empty(),
        "restored, not owned by reach: {foreign}"
    );
    let tables = pg
        .psql(
            "reach",
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tableowner = 'reach'",
        )
        .expect("tables");
    assert_ne!(tables, "0", "the restore made no table");
}

/// Both stores: A enrolled and Up, backup, A stopped, `restore` (the
/// store-specific part), B started, the connector back without a key.
async fn backup_and_restore(tag: &str, pg: Option<&Postgres>) {
    let site = Site::new().await;
    let dir = scratch_dir(tag);
    let (dir_a, dir_b) = (dir.join("a"), dir.join("b"));
    for d in [&dir_a, &dir_b] {
        std::fs::create_dir_all(d).expect("dir");
    }
    let (url_a, url_b) = match pg {
        Some(pg) => {
            // A's database, owned by the CA's role as the book's createdb
            // makes it; B's is made by the book's restore.
            pg.psql("postgres", "CREATE DATABASE reach_a OWNER reach")
                .expect("database A");
            (
                Some(pg.url_as(ROLE, "reach_a")),
                Some(pg.url_as(ROLE, "reach")),
            )
        }
        None => (None, None),
    };
    let data_a = dir_a.join("data");
    let config_a = site.config(&dir_a, &data_a, url_a.as_deref());
    let ca_a = site.start(&config_a, &data_a, &dir_a.join("ca.log")).await;
    let root = dir.join("root.pem");
    std::fs::copy(data_a.join("ca.pem"), &root).expect("the root connectors trust");
    let state = dir.join("connector");
    let (stop, task) = spawn_agent(agent(&site, &root, &state, Some(KEY_EAST)));
    let root_pem = std::fs::read_to_string(&root).expect("root");
    let web_a = Http::new(site.http, &root_pem);
    let serial = attached_and_up(&web_a, site.app.addr().port()).await;
    assert_eq!(key_uses(&web_a).await, 1, "enrolled once");
    let enrolled = files(&state);

    // The backup, while A runs and the connector reports.
    let backup = dir.join("backup");
    let printed = run(Command::new(BIN)
        .arg("backup")
        .arg("--config")
        .arg(&config_a)
        .arg("--out")
        .arg(&backup));
    assert!(printed.contains("ca.key"), "{printed}");
    // A second backup into the same directory is refused: nothing is
    // overwritten.
    let again = Command::new(BIN)
        .arg("backup")
        .arg("--config")
        .arg(&config_a)
        .arg("--out")
        .arg(&backup)
        .output()
        .expect("run");
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("exists already"),
        "{again:?}"
    );
    if let (Some(pg), Some(url)) = (pg, &url_a) {
        assert!(printed.contains("pg_dump"), "{printed}");
        let ran = book::run_block(
            "pg-dump",
            &[
                (
                    "/var/backups/reach-$(date +%F)",
                    &backup.display().to_string(),
                ),
                (BOOK_URL, url),
            ],
            &pg_env(pg),
        )
        .expect("the book's pg_dump");
        assert!(ran.iter().any(|l| l.starts_with("pg_dump ")), "{ran:?}");
        assert!(backup.join("reach.dump").exists(), "{ran:?}");
    }

    let _ = stop.send(());
    let _ = task.await;
    drop(ca_a);

    // Restore into a new data directory (and a new, empty database).
    let data_b = dir_b.join("data");
    match (pg, &url_b) {
        (Some(pg), Some(url)) => {
            restore_files(&backup, &data_b, &["ca.pem", "ca.key"]);
            restore_database(pg, &backup, url);
        }
        _ => restore_files(&backup, &data_b, &["ca.pem", "ca.key", "reach.db"]),
    }
    let config_b = site.config(&dir_b, &data_b, url_b.as_deref());
    let _ca_b = site.start(&config_b, &data_b, &dir_b.join("ca.log")).await;

    // The same connector, no provisioning key: it can only attach.
    let (stop, task) = spawn_agent(agent(&site, &root, &state, None));
    let web_b = Http::new(site.http, &root_pem);
    let serial_b = attached_and_up(&web_b, site.app.addr().port()).await;
    assert_eq!(serial_b, serial, "the certificate A issued");
    assert_eq!(key_uses(&web_b).await, 1, "not enrolled again");
    assert_eq!(files(&state), enrolled, "its state is untouched");
    let _ = stop.send(());
    let _ = task.await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn sqlite_backup_restores_into_a_new_ca_that_connectors_reattach_to() {
    backup_and_restore("backup-sqlite", None).await;
}

#[tokio::test]
async fn postgres_backup_restores_into_a_new_database_that_connectors_reattach_to() {
    let pg = Postgres::start_with_superuser("postgres").expect("PostgreSQL");
    // The CA's role, made as the book makes it on a new server.
    book::run_block("pg-role", &[], &pg_env(&pg)).expect("the book's createuser");
    backup_and_restore("backup-pg", Some(&pg)).await;
}
