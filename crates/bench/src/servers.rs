//! Servers the driver measures, each in a child process of `reach-bench` so
//! that its RSS and CPU time are its own: the real CA (`serve-ca`), and the
//! bare baselines (`serve-bare`): a tonic `ConnectorSession` that only counts
//! messages, a tonic `Access` and an axum `POST /api/v1/access` that answer
//! a fixed decision of the CA's size.
//!
//! A child prints `READY grpc=ADDR http=ADDR` once it listens, and exits when
//! its stdin closes, so it never outlives the driver.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use protocol::v1;
use protocol::v1::access_server::{Access, AccessServer};
use protocol::v1::authority_message::Kind as Out;
use protocol::v1::connector_session_server::{ConnectorSession, ConnectorSessionServer};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Runs `reach-bench <args>` to completion and parses the last line of its
/// output that starts with `{` (the child's JSON result; `what` names it in
/// errors).
pub async fn child_result<T: serde::de::DeserializeOwned>(
    args: &[String],
    what: &str,
) -> Result<T> {
    let exe = std::env::current_exe().context("locating reach-bench")?;
    let out = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("running the {what} child"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow!("{what} printed no result ({})", out.status))?;
    Ok(serde_json::from_str(line)?)
}

/// A running child server; killed when dropped.
#[derive(Debug)]
pub struct Server {
    child: Child,
    /// Its gRPC address.
    pub grpc: SocketAddr,
    /// Its HTTP address.
    pub http: SocketAddr,
}

impl Server {
    /// Starts `reach-bench <args>` and waits for its `READY` line.
    pub async fn spawn(args: &[&str]) -> Result<Server> {
        let exe = std::env::current_exe().context("locating reach-bench")?;
        // Profiling aid: `REACH_BENCH_WRAP_CA="valgrind --tool=callgrind"`
        // runs the CA child under that command, `REACH_BENCH_WRAP_BARE` the
        // bare servers (the driver runs as usual), so both sides' instruction
        // counts per message can be compared.
        let variable = match args.first() {
            Some(&"serve-ca") => Some("REACH_BENCH_WRAP_CA"),
            Some(&"serve-bare") => Some("REACH_BENCH_WRAP_BARE"),
            _ => None,
        };
        let wrap: Vec<String> = variable
            .and_then(|v| std::env::var(v).ok())
            .map(|w| w.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default();
        let mut command = match wrap.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        // A wrapped child (e.g. under valgrind) starts far more slowly.
        let ready_within = Duration::from_secs(if wrap.is_empty() { 30 } else { 600 });
        let mut child = command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting reach-bench {args:?}"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("child has no stdout"))?;
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(ready_within, lines.next_line())
            .await
            .with_context(|| format!("child did not get ready within {ready_within:?}"))??
            .ok_or_else(|| anyhow!("child exited before it was ready"))?;
        let (mut grpc, mut http) = (None, None);
        for word in line.split_whitespace() {
            if let Some(a) = word.strip_prefix("grpc=") {
                grpc = Some(a.parse()?);
            } else if let Some(a) = word.strip_prefix("http=") {
                http = Some(a.parse()?);
            }
        }
        // Keep draining its stdout so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        match (grpc, http) {
            (Some(grpc), Some(http)) if line.starts_with("READY") => {
                Ok(Server { child, grpc, http })
            }
            _ => bail!("unexpected first line from child: {line:?}"),
        }
    }

    /// Kills the child (SIGKILL) and waits for it to end.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// The child's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// `http://` URL of its gRPC endpoint.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }
}

/// Resolves when stdin reaches its end (the parent went away or is done).
async fn stdin_closed() {
    let mut buf = [0u8; 64];
    let mut stdin = tokio::io::stdin();
    while let Ok(n) = stdin.read(&mut buf).await {
        if n == 0 {
            break;
        }
    }
}

async fn bind_pair() -> Result<(TcpListener, TcpListener)> {
    let grpc = TcpListener::bind("127.0.0.1:0").await?;
    let http = TcpListener::bind("127.0.0.1:0").await?;
    announce(&grpc, &http)?;
    Ok((grpc, http))
}

/// Tells the driver where the server listens (the `READY` line it waits for).
fn announce(grpc: &TcpListener, http: &TcpListener) -> Result<()> {
    println!(
        "READY grpc={} http={}",
        grpc.local_addr()?,
        http.local_addr()?
    );
    Ok(())
}

/// `reach-bench serve-ca CONFIG`: the real CA on loopback.
pub async fn serve_ca(config: &Path) -> Result<()> {
    let text =
        std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    let base = config.parent().unwrap_or_else(|| Path::new("."));
    let config = central_authority::Config::from_toml(&text, base)
        .map_err(|e| anyhow!("invalid CA config: {}", e.messages().join("; ")))?;
    // Bound as the CA's binary binds them (`listen::bind`, each backlog
    // its listener's connection limit).
    let loopback: std::net::SocketAddr = ([127, 0, 0, 1], 0).into();
    let limits = &config.settings.limits;
    use central_authority::api::listen::{backlog, bind};
    let grpc = bind(loopback, backlog(limits.grpc_max_connections))?;
    let http = bind(loopback, backlog(limits.max_connections))?;
    announce(&grpc, &http)?;
    central_authority::run(config, grpc, http, stdin_closed()).await?;
    Ok(())
}

/// The bare connector session: reads and counts every message, and when
/// the connector closes its side answers one `Ping` whose nonce is the
/// count.
#[derive(Clone, Debug, Default)]
struct BareSession;

#[tonic::async_trait]
impl ConnectorSession for BareSession {
    type ConnectStream = ReceiverStream<Result<v1::AuthorityMessage, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<v1::ConnectorMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            let mut count = 0u64;
            while let Ok(Some(m)) = inbound.message().await {
                std::hint::black_box(&m);
                count += 1;
            }
            let ping = v1::AuthorityMessage {
                kind: Some(Out::Ping(v1::Ping { nonce: count })),
            };
            let _ = tx.send(Ok(ping)).await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The bare access service: answers every request with one fixed decision.
#[derive(Clone, Debug)]
struct BareAccess {
    decision: Arc<v1::AccessDecision>,
}

#[tonic::async_trait]
impl Access for BareAccess {
    async fn resolve(
        &self,
        request: Request<v1::AccessRequest>,
    ) -> Result<Response<v1::AccessDecision>, Status> {
        std::hint::black_box(request.into_inner());
        Ok(Response::new((*self.decision).clone()))
    }
}

#[derive(serde::Deserialize)]
struct AccessBody {
    host: String,
    protocol: String,
    port: u32,
}

/// `reach-bench serve-bare [DECISION.pb JSON]`: the bare baselines. The
/// decision (protobuf) and JSON body files hold a real answer of the CA, so
/// the baseline moves the same bytes; without them both answers are empty.
pub async fn serve_bare(decision: Option<&Path>, json: Option<&Path>) -> Result<()> {
    use prost::Message;
    let decision = match decision {
        Some(p) => v1::AccessDecision::decode(std::fs::read(p)?.as_slice())?,
        None => v1::AccessDecision::default(),
    };
    let body = Bytes::from(match json {
        Some(p) => std::fs::read(p)?,
        None => b"{}".to_vec(),
    });
    let (grpc, http) = bind_pair().await?;
    let app = axum::Router::new().route(
        "/api/v1/access",
        axum::routing::post(move |request: Bytes| {
            let body = body.clone();
            async move {
                match serde_json::from_slice::<AccessBody>(&request) {
                    Ok(b) => {
                        std::hint::black_box((b.host, b.protocol, b.port));
                        ([(header::CONTENT_TYPE, "application/json")], body).into_response()
                    }
                    Err(_) => StatusCode::BAD_REQUEST.into_response(),
                }
            }
        }),
    );
    let http = tokio::spawn(async move {
        axum::serve(http, app)
            .with_graceful_shutdown(stdin_closed())
            .await
    });
    let incoming = tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(ConnectorSessionServer::new(BareSession))
        .add_service(AccessServer::new(BareAccess {
            decision: Arc::new(decision),
        }))
        .serve_with_incoming_shutdown(incoming, stdin_closed())
        .await?;
    http.abort();
    Ok(())
}
