//! CA replicas sharing one real PostgreSQL database (`crate::pg`), each a
//! `serve-ca` child process: a replica's configuration, and a running
//! replica (which can be killed and started again on the same
//! configuration). The `ha` and `replicas` groups build on it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::ca::{self, CaSetup};
use crate::servers::Server;

/// A replica's configuration: `[store] url` (none: the SQLite file in its
/// data directory), `[replica] id`, TLS on (with the issuing root of
/// `issuer`, another replica's data directory, when given) or off, the
/// shared sections, the `ingest` segment of `ingest_apps` applications
/// and `targets`, more TOML appended (the `ha` group's targets, other
/// connector groups).
pub fn replica_config(
    store: Option<&str>,
    id: &str,
    tls: Option<Option<&Path>>,
    ingest_apps: usize,
    targets: &str,
) -> String {
    let mut head = String::new();
    if let Some(url) = store {
        head += &format!("[store]\nurl = {url:?}\n\n");
    }
    head += &format!("[replica]\nid = {id:?}\n\n");
    let base = ca::config_text(&CaSetup {
        filler_segments: 0,
        ingest_apps,
        ..CaSetup::default()
    });
    let base = match tls {
        None => base,
        Some(None) => ca::with_tls(&base, ""),
        Some(Some(dir)) => ca::with_tls(
            &base,
            &format!(
                "issuer_cert_file = {:?}\nissuer_key_file = {:?}\n",
                dir.join("ca.pem").display().to_string(),
                dir.join("ca.key").display().to_string()
            ),
        ),
    };
    format!("{head}{base}{targets}")
}

/// A running replica and its data directory.
#[derive(Debug)]
pub struct Replica {
    /// The running CA.
    pub server: Server,
    /// Its data directory.
    pub data: PathBuf,
    /// Its configuration file.
    pub config: PathBuf,
}

impl Replica {
    /// Starts a replica on the configuration `text`.
    pub async fn start(text: &str) -> Result<Replica> {
        let (server, dir) = ca::start_text(text).await?;
        Ok(Replica {
            server,
            data: dir.join("reach-ca-data"),
            config: dir.join("ca.toml"),
        })
    }

    /// Kills the replica (SIGKILL).
    pub async fn kill(&mut self) {
        self.server.kill().await;
    }

    /// Starts the replica again on its configuration (and data
    /// directory), on new ports.
    pub async fn start_again(&mut self) -> Result<()> {
        let path = self
            .config
            .to_str()
            .context("temporary path is not UTF-8")?;
        self.server = Server::spawn(&["serve-ca", path]).await?;
        Ok(())
    }

    /// Waits for the generated root (TLS replicas) and returns its path.
    pub async fn root(&self) -> Result<PathBuf> {
        let root = self.data.join("ca.pem");
        let key = self.data.join("ca.key");
        ca::wait_until(Duration::from_secs(15), "the CA's root", || {
            let (r, k) = (root.clone(), key.clone());
            async move { Ok(r.exists() && k.exists()) }
        })
        .await?;
        Ok(root)
    }

    /// `https://` URL of its gRPC endpoint.
    pub fn https_grpc(&self) -> String {
        format!("https://{}", self.server.grpc)
    }
}
