//! PostgreSQL for the groups that run the CA on it: a server of the run's
//! own (`test_support::Postgres`), and what the server says about its work
//! (`pg_stat_database`, the WAL position) and the CPU its processes used.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use test_support::Postgres;

use crate::sys;

/// A PostgreSQL server owned by a thread of its own: the server's
/// parent-death signal fires when the thread that started it ends, so it
/// must not be a pooled (blocking-task) thread that ends when idle.
#[derive(Debug)]
pub struct PgHost {
    pg: Arc<Postgres>,
    stop: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PgHost {
    /// Starts a server of its own.
    pub async fn start() -> Result<PgHost> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ha-postgres".into())
            .spawn(move || match Postgres::start() {
                Ok(pg) => {
                    let pg = Arc::new(pg);
                    let _ = tx.send(Ok(pg.clone()));
                    // Until told to stop (or the driver is gone).
                    let _ = stopped.recv();
                    drop(pg);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            })
            .context("starting the PostgreSQL thread")?;
        let pg = rx
            .await
            .context("the PostgreSQL thread ended")?
            .context("starting PostgreSQL (test_support::Postgres: initdb and postgres on PATH or in /usr/lib/postgresql)")?;
        Ok(PgHost {
            pg,
            stop,
            thread: Some(thread),
        })
    }

    /// A new, empty database in the C.UTF-8 locale (what Debian's cluster
    /// takes in a container, where text compares through strcoll); its URL.
    pub async fn fresh_database(&self) -> Result<String> {
        let pg = self.pg.clone();
        tokio::task::spawn_blocking(move || pg.fresh_database_in("C.UTF-8"))
            .await
            .context("createdb panicked")?
    }

    /// Runs `measure` on a server of its own, then stops the server, also
    /// when `measure` failed.
    pub async fn around<T>(measure: impl AsyncFnOnce(&PgHost) -> Result<T>) -> Result<T> {
        let pg = PgHost::start().await?;
        let result = measure(&pg).await;
        pg.stop().await;
        result
    }

    /// Stops the server (`pg_ctl`, blocking: off the runtime's threads).
    pub async fn stop(mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let pg = self.pg.clone();
            let _ = tokio::task::spawn_blocking(move || {
                drop(pg);
                let _ = t.join();
            })
            .await;
        }
    }
}

/// A connection that reads the server's own statistics of one database.
pub struct PgStats {
    client: tokio_postgres::Client,
    connection: tokio::task::JoinHandle<()>,
    postmaster: u32,
}

/// The server's counters at one moment.
#[derive(Clone, Copy, Debug)]
pub struct PgSample {
    /// When it was read.
    pub at: Instant,
    /// Committed transactions in the database (`xact_commit`).
    pub commits: i64,
    /// Rows inserted, updated and deleted in the database.
    pub rows: i64,
    /// The WAL position in bytes (the whole server).
    pub wal: i64,
    /// CPU of the postmaster and every server process.
    pub cpu: Duration,
}

impl PgStats {
    /// Connects to `url` (the database the CA uses).
    pub async fn connect(url: &str) -> Result<PgStats> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .with_context(|| format!("connecting to {url}"))?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        let row = client.query_one("SELECT pg_backend_pid()", &[]).await?;
        let backend = u32::try_from(row.get::<_, i32>(0))?;
        let postmaster = sys::parent(backend)
            .ok_or_else(|| anyhow!("/proc/{backend}/stat (a PostgreSQL backend) unreadable"))?;
        Ok(PgStats {
            client,
            connection,
            postmaster,
        })
    }

    /// The counters now.
    pub async fn sample(&self) -> Result<PgSample> {
        let row = self
            .client
            .query_one(
                "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted,
                        (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint
                 FROM pg_stat_database WHERE datname = current_database()",
                &[],
            )
            .await
            .context("reading pg_stat_database")?;
        Ok(PgSample {
            at: Instant::now(),
            commits: row.get(0),
            rows: row.get(1),
            wal: row.get(2),
            cpu: sys::family_cpu_time(self.postmaster),
        })
    }

    /// Ends the database's other connections, so that their statistics are
    /// published now: a backend publishes what it counted at most once a
    /// second while busy and, when it went idle just after, only 10 s later
    /// (PostgreSQL 15's `PGSTAT_IDLE_INTERVAL`), but always when it exits.
    /// Their owner's pool opens new ones; call it only while they are idle.
    pub async fn publish(&self) -> Result<()> {
        self.client
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .context("ending the database's other connections")?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(())
    }

    /// Leaves `files` WAL files ready for reuse, as a server past its
    /// first checkpoints has: a fresh cluster creates each new 16-MB file
    /// and writes it with zeros first, a quarter of PostgreSQL's CPU in
    /// `database`'s windows, which a server in service does not pay (it
    /// renames the files a checkpoint no longer needs). Switches through
    /// `files` files (each created now), raises `min_wal_size` so that
    /// they are all kept, and checkpoints, which leaves them to be reused.
    /// Needs the superuser.
    pub async fn recycle_wal(&self, files: u32) -> Result<()> {
        let c = &self.client;
        c.batch_execute(&format!(
            "ALTER SYSTEM SET min_wal_size = '{}MB'",
            files * 16 + 64
        ))
        .await
        .context("ALTER SYSTEM SET min_wal_size")?;
        c.batch_execute("SELECT pg_reload_conf()").await?;
        c.batch_execute("CREATE TABLE bench_wal (n int)").await?;
        for n in 0..files {
            c.execute("INSERT INTO bench_wal VALUES ($1)", &[&(n as i32)])
                .await
                .context("writing WAL")?;
            c.batch_execute("SELECT pg_switch_wal()")
                .await
                .context("pg_switch_wal()")?;
        }
        c.batch_execute("DROP TABLE bench_wal; CHECKPOINT")
            .await
            .context("CHECKPOINT")?;
        Ok(())
    }

    /// `SELECT count(*) FROM table`.
    pub async fn count(&self, table: &str) -> Result<i64> {
        let row = self
            .client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .with_context(|| format!("counting {table}"))?;
        Ok(row.get(0))
    }
}

impl std::fmt::Debug for PgStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStats")
            .field("postmaster", &self.postmaster)
            .finish_non_exhaustive()
    }
}

impl Drop for PgStats {
    fn drop(&mut self) {
        self.connection.abort();
    }
}
