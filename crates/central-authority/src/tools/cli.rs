//! `central-authority api …`: the operator CLI for the HTTP API, so nobody
//! hand-writes curl for the admin routes. Human-readable tables by default,
//! the API's JSON with `--json`; exit codes scripts can rely on
//! ([`EXIT_OK`], [`EXIT_ERROR`], [`EXIT_USAGE`], [`EXIT_REFUSED`]).
//!
//! The client is hyper's HTTP/1 connection over tokio-rustls (both already
//! in the CA), one connection per command, trusting only `--ca-cert`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{Value, json};

/// Success (for `access`: a connector was selected).
pub const EXIT_OK: u8 = 0;
/// An error: the CA could not be reached, refused the token, or answered
/// an error (not found, invalid request, server error).
pub const EXIT_ERROR: u8 = 1;
/// Bad command line (also clap's own usage errors).
pub const EXIT_USAGE: u8 = 2;
/// `access`: the CA answered with a refusal (no segment, no connector, all
/// down, …); `connectors drain`: the CA refused the drain, which would
/// leave applications without a healthy, undrained connector; `whatif`:
/// some application would be left so. An answer, not an error.
pub const EXIT_REFUSED: u8 = 3;

/// How long one command may take (connect, TLS, request, answer).
const TIMEOUT: Duration = Duration::from_secs(30);

/// `central-authority api`'s flags and command.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// The CA's HTTP API; a path (`https://proxy.example/reach`) is the
    /// prefix every API path is put under.
    #[arg(long, env = "REACH_API_URL", default_value = "https://127.0.0.1:7480")]
    pub url: String,
    /// The CA's root certificate (its `data_dir/ca.pem`); needed for https.
    #[arg(long, env = "REACH_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// A file holding the API token (or `REACH_API_TOKEN`); none for a CA
    /// with `anonymous_read` (reads only).
    #[arg(long, env = "REACH_API_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Where `api login` keeps a person's short-lived credential (0600);
    /// used when no token is given. Default
    /// `$XDG_CONFIG_HOME/reach/credential.json` (or `~/.config/…`).
    #[arg(long, env = "REACH_API_CREDENTIAL_FILE")]
    pub credential_file: Option<PathBuf>,
    /// Print the API's JSON instead of a table (before or after the
    /// command).
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: ApiCommand,
}

/// The API commands.
#[derive(Debug, Subcommand)]
pub enum ApiCommand {
    /// Applications with their status per connector (`GET /api/v1/health`).
    Health {
        /// Only applications with this overall status (up, unhealthy, down, unknown).
        #[arg(long)]
        status: Option<String>,
        /// Only applications of this segment.
        #[arg(long)]
        segment: Option<String>,
    },
    /// Connectors with their load and enrollment (`GET /api/v1/connectors`),
    /// or an admin action on one.
    Connectors {
        /// An admin action (scope `admin`).
        #[command(subcommand)]
        action: Option<ConnectorAction>,
    },
    /// Which connector would carry a request, and why (`POST /api/v1/access`).
    /// Exit 0 selected, 3 refused.
    Access {
        /// Host (FQDN or IP).
        host: String,
        /// tcp or udp.
        protocol: String,
        /// Port.
        port: u16,
        /// The user's latitude in degrees (with `--longitude`): `nearest`
        /// then weighs the distance to each connector group's location.
        #[arg(long, requires = "longitude", allow_negative_numbers = true)]
        latitude: Option<f64>,
        /// The user's longitude in degrees (with `--latitude`).
        #[arg(long, requires = "latitude", allow_negative_numbers = true)]
        longitude: Option<f64>,
    },
    /// Which applications would lose their last healthy, undrained
    /// connector without these connectors (`GET /api/v1/whatif`); changes
    /// nothing. Exit 0 when none would, 3 when some would.
    Whatif {
        /// A connector or connector group (a group: every connector of
        /// it); repeat for several. `connector:NAME` or `group:NAME` when a
        /// name is both.
        #[arg(long, required = true)]
        without: Vec<String>,
    },
    /// The audit trail of admin actions, newest first (`GET /api/v1/audit`,
    /// scope `admin`); times in UTC.
    Audit {
        /// Only entries from this time on (Unix ms or RFC 3339).
        #[arg(long)]
        since: Option<String>,
        /// Only this action (e.g. connector.revoke, config.reload).
        #[arg(long)]
        action: Option<String>,
        /// Only actions on this target (connector, group, config file).
        #[arg(long)]
        target: Option<String>,
        /// Only this actor (a token's configured name).
        #[arg(long)]
        actor: Option<String>,
        /// Page, from 1.
        #[arg(long)]
        page: Option<u64>,
        /// Entries per page (1-1000, default 100).
        #[arg(long)]
        per_page: Option<u32>,
    },
    /// Sign in as a person with the CA's OpenID provider: open the URL
    /// printed, sign in, and the CLI keeps a credential of at most an hour.
    Login {
        /// An `[[oidc]]` provider name (default: the CA's first).
        #[arg(long)]
        provider: Option<String>,
        /// The loopback port the browser comes back to (default: a free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
    /// Sign out: the credential's session is revoked and its file removed.
    Logout,
    /// Where a rotation of the issuing root stands (`GET /api/v1/root`):
    /// the trusted roots, the phase, the connectors still on the old root
    /// and those that do not keep the trust bundle, and what to do next.
    Root,
    /// The log receivers this replica streams records to (`GET
    /// /api/v1/log_receivers`, scope `admin`): connected, spool, sent,
    /// dropped, last error.
    LogReceivers,
    /// Provisioning keys (scope `admin`).
    Keys {
        /// What to do.
        #[command(subcommand)]
        action: KeyAction,
    },
    /// People's signed-in sessions on every replica (`GET
    /// /api/v1/sessions`, scope `admin`), or end one.
    Sessions {
        /// End one (without: list them).
        #[command(subcommand)]
        action: Option<SessionAction>,
    },
}

/// Actions on a person's session.
#[derive(Debug, Subcommand)]
pub enum SessionAction {
    /// End a session on every replica (`DELETE /api/v1/sessions/ID`): its
    /// next request is refused.
    End {
        /// The session's ID, as `api sessions` lists it.
        id: String,
    },
}

/// Admin actions on one connector.
#[derive(Debug, Subcommand)]
pub enum ConnectorAction {
    /// End its session; it can neither reconnect nor re-enroll.
    Disable {
        /// Connector name.
        name: String,
    },
    /// Undo `disable`.
    Enable {
        /// Connector name.
        name: String,
    },
    /// Revoke its certificates and end its session.
    Revoke {
        /// Connector name.
        name: String,
    },
    /// Allow its next enrollment although it holds a valid certificate
    /// (once, within 15 minutes).
    AllowReenroll {
        /// Connector name.
        name: String,
    },
    /// Revoke its certificates, end its session and forget it.
    Delete {
        /// Connector name.
        name: String,
    },
    /// Select it for no new access, on every replica (its session and
    /// reports go on): before maintenance. Refused (exit 3, listing them)
    /// when applications would be left without a healthy, undrained
    /// connector, unless `--force`.
    Drain {
        /// Connector name.
        name: String,
        /// Drain even if applications are left without a connector.
        #[arg(long)]
        force: bool,
    },
    /// Undo `drain`.
    Undrain {
        /// Connector name.
        name: String,
    },
}

/// Provisioning key actions.
#[derive(Debug, Subcommand)]
pub enum KeyAction {
    /// Each group's key: uses, expiry, revocation (never the key).
    List,
    /// Revoke a group's key (no more enrollments with it).
    Revoke {
        /// Connector group.
        group: String,
    },
}

/// What went wrong, with the exit code it maps to.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line or a file it names is unusable.
    #[error("{0}")]
    Usage(String),
    /// The CA could not be reached or spoke no HTTP.
    #[error("{0}")]
    Transport(String),
    /// The CA answered an error.
    #[error("{status}: {reason}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The error's reason.
        reason: String,
        /// The error's message.
        message: String,
    },
}

impl CliError {
    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            CliError::Transport(_) | CliError::Api { .. } => EXIT_ERROR,
        }
    }
}

/// Runs one command: what to print on stdout and the exit code (errors are
/// the caller's to print on stderr).
pub async fn run(args: &ApiArgs) -> Result<(String, u8), CliError> {
    run_with(args, |url| {
        eprintln!("Open this URL in a browser to sign in:\n  {url}");
    })
    .await
}

/// The credential file of `args`.
fn credential_path(args: &ApiArgs) -> Result<PathBuf, CliError> {
    args.credential_file
        .clone()
        .or_else(crate::tools::login::default_path)
        .ok_or_else(|| {
            CliError::Usage("no --credential-file and no $HOME to keep the credential in".into())
        })
}

/// `api login`: the sign-in through the browser, then who it is.
async fn login(
    args: &ApiArgs,
    provider: Option<&str>,
    port: u16,
    announce: impl FnOnce(&str),
) -> Result<(String, u8), CliError> {
    let path = credential_path(args)?;
    let client = Client::new(args)?;
    let exchange = |code: String, state: String| async move {
        let body = json!({"code": code, "state": state});
        let v = client
            .call("POST", "/auth/cli", Some(body))
            .await
            .and_then(Answer::ok)
            .map_err(|e| format!("exchanging the sign-in code: {e}"))?;
        serde_json::from_value::<crate::tools::login::Credential>(json!({
            "url": "",
            "credential": v["credential"],
            "csrf_token": v["csrf_token"],
            "expires_at": v["expires_at"],
        }))
        .map_err(|e| format!("the CA's answer to the sign-in code: {e}"))
    };
    let c = crate::tools::login::login(&args.url, provider, port, &path, announce, exchange)
        .await
        .map_err(CliError::Transport)?;
    let who = Client::new(args)?.get("/auth/session").await?;
    let person = who["person"].as_str().unwrap_or("?").to_owned();
    Ok((
        format!(
            "signed in as {person} until {} (credential in {})\n",
            time_cell(&json!(c.expires_at)),
            path.display()
        ),
        EXIT_OK,
    ))
}

/// `api logout`: the session revoked, the credential file removed.
async fn logout(args: &ApiArgs, client: &Client) -> Result<(String, u8), CliError> {
    let path = credential_path(args)?;
    let v = client.call("POST", "/auth/logout", None).await?.ok()?;
    let _ = std::fs::remove_file(&path);
    Ok((render(args.json, &v, fields_line), EXIT_OK))
}

/// [`run`], with `announce` given the URL `login` asks to open.
pub async fn run_with(
    args: &ApiArgs,
    announce: impl FnOnce(&str),
) -> Result<(String, u8), CliError> {
    if let ApiCommand::Login { provider, port } = &args.command {
        return login(args, provider.as_deref(), *port, announce).await;
    }
    let client = Client::new(args)?;
    match &args.command {
        ApiCommand::Login { .. } => Err(CliError::Usage("login is run above".into())),
        ApiCommand::Logout => logout(args, &client).await,
        ApiCommand::Health { status, segment } => {
            let mut path = "/api/v1/health".to_owned();
            if let Some(s) = segment {
                path = format!("{path}?segment={}", encode(s));
            }
            let mut v = client.get(&path).await?;
            if let (Some(want), Some(apps)) = (status, v["applications"].as_array_mut()) {
                apps.retain(|a| a["status"] == want.as_str());
            }
            Ok((render(args.json, &v, health_table), EXIT_OK))
        }
        ApiCommand::Connectors { action: None } => {
            let v = client.get("/api/v1/connectors").await?;
            Ok((render(args.json, &v, connectors_table), EXIT_OK))
        }
        ApiCommand::Whatif { without } => whatif(args, &client, without).await,
        ApiCommand::Connectors {
            action: Some(action),
        } => connector_action(args, &client, action).await,
        ApiCommand::Root => {
            let v = client.get("/api/v1/root").await?;
            Ok((render(args.json, &v, root_text), EXIT_OK))
        }
        ApiCommand::LogReceivers => {
            let v = client.get("/api/v1/log_receivers").await?;
            Ok((render(args.json, &v, receivers_table), EXIT_OK))
        }
        ApiCommand::Keys {
            action: KeyAction::List,
        } => {
            let v = client.get("/api/v1/provisioning_keys").await?;
            Ok((render(args.json, &v, keys_table), EXIT_OK))
        }
        ApiCommand::Keys {
            action: KeyAction::Revoke { group },
        } => {
            let path = format!("/api/v1/provisioning_keys/{}/revoke", encode(group));
            let v = client.call("POST", &path, None).await?.ok()?;
            Ok((render(args.json, &v, fields_line), EXIT_OK))
        }
        ApiCommand::Sessions { action } => sessions(args, &client, action.as_ref()).await,
        command @ ApiCommand::Audit { .. } => {
            let v = client.get(&audit_path(command)).await?;
            Ok((render(args.json, &v, audit_table), EXIT_OK))
        }
        ApiCommand::Access {
            host,
            protocol,
            port,
            latitude,
            longitude,
        } => {
            let mut body = json!({"host": host, "protocol": protocol, "port": port});
            if let (Some(latitude), Some(longitude)) = (latitude, longitude) {
                body["user_location"] = json!({"latitude": latitude, "longitude": longitude});
            }
            let answer = client.call("POST", "/api/v1/access", Some(body)).await?;
            let refused = answer.is_refusal();
            let v = if refused { answer.body } else { answer.ok()? };
            let code = if refused { EXIT_REFUSED } else { EXIT_OK };
            Ok((render(args.json, &v, access_text), code))
        }
    }
}

/// `api sessions`: the list, or `end ID`'s one `key=value` line.
async fn sessions(
    args: &ApiArgs,
    client: &Client,
    action: Option<&SessionAction>,
) -> Result<(String, u8), CliError> {
    match action {
        None => {
            let v = client.get("/api/v1/sessions").await?;
            Ok((render(args.json, &v, sessions_table), EXIT_OK))
        }
        Some(SessionAction::End { id }) => {
            let path = format!("/api/v1/sessions/{}", encode(id));
            let v = client.call("DELETE", &path, None).await?.ok()?;
            Ok((render(args.json, &v, fields_line), EXIT_OK))
        }
    }
}

/// `api whatif`: exit 3 when some application would be left without a
/// healthy, undrained connector.
async fn whatif(
    args: &ApiArgs,
    client: &Client,
    without: &[String],
) -> Result<(String, u8), CliError> {
    let path = format!("/api/v1/whatif?without={}", encode(&without.join(",")));
    let v = client.get(&path).await?;
    let code = if v["stranded"].as_u64().unwrap_or(0) > 0 {
        EXIT_REFUSED
    } else {
        EXIT_OK
    };
    Ok((render(args.json, &v, whatif_text), code))
}

/// `api connectors ACTION NAME`: one `key=value` line; a drain refused for
/// what it would leave is an answer (exit 3, listing them), not an error.
async fn connector_action(
    args: &ApiArgs,
    client: &Client,
    action: &ConnectorAction,
) -> Result<(String, u8), CliError> {
    let (method, path) = match action {
        ConnectorAction::Disable { name } => ("POST", format!("{}/disable", conn(name))),
        ConnectorAction::Enable { name } => ("POST", format!("{}/enable", conn(name))),
        ConnectorAction::Revoke { name } => ("POST", format!("{}/revoke", conn(name))),
        ConnectorAction::AllowReenroll { name } => {
            ("POST", format!("{}/allow-reenroll", conn(name)))
        }
        ConnectorAction::Delete { name } => ("DELETE", conn(name)),
        ConnectorAction::Drain { name, force } => {
            let force = if *force { "?force=true" } else { "" };
            ("POST", format!("{}/drain{force}", conn(name)))
        }
        ConnectorAction::Undrain { name } => ("POST", format!("{}/undrain", conn(name))),
    };
    let answer = client.call(method, &path, None).await?;
    if answer.status == 409 && answer.body["error"]["reason"] == "last_healthy_connector" {
        return Ok((
            render(args.json, &answer.body, drain_refused_text),
            EXIT_REFUSED,
        ));
    }
    Ok((render(args.json, &answer.ok()?, fields_line), EXIT_OK))
}

/// `GET /api/v1/audit` with the filters and page `api audit` was given.
fn audit_path(command: &ApiCommand) -> String {
    let ApiCommand::Audit {
        since,
        action,
        target,
        actor,
        page,
        per_page,
    } = command
    else {
        return "/api/v1/audit".to_owned();
    };
    let page = page.map(|p| p.to_string());
    let per_page = per_page.map(|p| p.to_string());
    let query: Vec<String> = [
        ("since", since.as_ref()),
        ("action", action.as_ref()),
        ("target", target.as_ref()),
        ("actor", actor.as_ref()),
        ("page", page.as_ref()),
        ("per_page", per_page.as_ref()),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| format!("{k}={}", encode(v))))
    .collect();
    if query.is_empty() {
        "/api/v1/audit".to_owned()
    } else {
        format!("/api/v1/audit?{}", query.join("&"))
    }
}

fn conn(name: &str) -> String {
    format!("/api/v1/connectors/{}", encode(name))
}

/// Percent-encodes a path segment or query value (everything but
/// unreserved characters).
fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn render(json: bool, v: &Value, table: fn(&Value) -> String) -> String {
    if json {
        let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
        s.push('\n');
        s
    } else {
        table(v)
    }
}

/// One HTTP answer.
struct Answer {
    status: u16,
    body: Value,
}

impl Answer {
    /// Access refusals: the reasons `policy` gives, with their explanation.
    fn is_refusal(&self) -> bool {
        const REFUSALS: [&str; 7] = [
            "no_segment",
            "port_not_in_segment",
            "no_connector",
            "all_down",
            "no_health_report",
            "discovery_timeout",
            "all_drained",
        ];
        self.status >= 400
            && self.body["error"]["reason"]
                .as_str()
                .is_some_and(|r| REFUSALS.contains(&r))
    }

    /// The body of a 2xx answer, or the error it carries.
    fn ok(self) -> Result<Value, CliError> {
        if (200..300).contains(&self.status) {
            return Ok(self.body);
        }
        let field = |f: &str| {
            self.body["error"][f]
                .as_str()
                .unwrap_or("(no JSON error)")
                .to_owned()
        };
        Err(CliError::Api {
            status: self.status,
            reason: field("reason"),
            message: field("message"),
        })
    }
}

/// A one-connection-per-request HTTP/1 client for the CA.
struct Client {
    authority: String,
    /// The `--url`'s path without its trailing `/` (empty for none): put
    /// before every API path, for a CA behind a proxy under a path.
    prefix: String,
    host: String,
    port: u16,
    tls: Option<tokio_rustls::TlsConnector>,
    /// `--ca-cert`, named in the hint when the CA's certificate does not
    /// chain to it.
    ca_cert: Option<PathBuf>,
    token: Option<String>,
    session: Option<crate::tools::login::Credential>,
}

impl Client {
    fn new(args: &ApiArgs) -> Result<Client, CliError> {
        let uri: hyper::Uri = args
            .url
            .parse()
            .map_err(|e| CliError::Usage(format!("--url {:?}: {e}", args.url)))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(CliError::Usage(format!(
                    "--url {:?}: expected https://HOST:PORT (or http:// for a CA without TLS)",
                    args.url
                )));
            }
        };
        let authority = uri
            .authority()
            .ok_or_else(|| CliError::Usage(format!("--url {:?}: no host", args.url)))?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        if uri.query().is_some() {
            return Err(CliError::Usage(format!(
                "--url {:?}: a query is not allowed (a path is: it prefixes every API path)",
                args.url
            )));
        }
        let prefix = uri.path().trim_end_matches('/').to_owned();
        let tls = if https {
            let path = args.ca_cert.as_ref().ok_or_else(|| {
                CliError::Usage(
                    "--ca-cert PEM is needed for https (the CA's data_dir/ca.pem)".to_owned(),
                )
            })?;
            let pem = std::fs::read(path)
                .map_err(|e| CliError::Usage(format!("--ca-cert {}: {e}", path.display())))?;
            Some(
                connector(&pem)
                    .map_err(|e| CliError::Usage(format!("--ca-cert {}: {e}", path.display())))?,
            )
        } else {
            None
        };
        let token = match &args.token_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| CliError::Usage(format!("--token-file {}: {e}", path.display())))?
                    .trim()
                    .to_owned(),
            ),
            None => std::env::var("REACH_API_TOKEN")
                .ok()
                .map(|t| t.trim().to_owned()),
        }
        .filter(|t| !t.is_empty());
        // A person's credential (`api login`) when no token is given.
        let session = match (&token, credential_path(args)) {
            (None, Ok(path)) => crate::tools::login::Credential::load(&path, &args.url),
            _ => None,
        };
        Ok(Client {
            session,
            authority: authority.as_str().to_owned(),
            prefix,
            host,
            port,
            tls,
            ca_cert: args.ca_cert.clone(),
            token,
        })
    }

    async fn get(&self, path: &str) -> Result<Value, CliError> {
        self.call("GET", path, None).await?.ok()
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Answer, CliError> {
        tokio::time::timeout(TIMEOUT, self.call_inner(method, path, body))
            .await
            .map_err(|_| {
                CliError::Transport(format!(
                    "no answer from {} within {TIMEOUT:?}",
                    self.authority
                ))
            })?
    }

    async fn call_inner(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Answer, CliError> {
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.prefix))
            .header(hyper::header::HOST, &self.authority)
            .header(hyper::header::ACCEPT, "application/json")
            .header(
                hyper::header::USER_AGENT,
                concat!("central-authority-api/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(t) = &self.token {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        } else if let Some(s) = &self.session {
            request = request
                .header(
                    hyper::header::COOKIE,
                    format!(
                        "{}={}",
                        crate::api::auth::session_cookie_name(self.tls.is_some()),
                        s.credential
                    ),
                )
                .header("x-csrf-token", &s.csrf_token);
        }
        let body = match body {
            Some(v) => {
                request = request.header(hyper::header::CONTENT_TYPE, "application/json");
                Full::new(Bytes::from(v.to_string()))
            }
            None => Full::new(Bytes::new()),
        };
        let request = request
            .body(body)
            .map_err(|e| CliError::Usage(format!("request: {e}")))?;
        let transport = |e: &dyn std::fmt::Display| {
            CliError::Transport(format!("{} ({}{path}): {e}", self.authority, self.prefix))
        };
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| transport(&e))?;
        let response = match &self.tls {
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(self.host.clone())
                    .map_err(|e| CliError::Usage(format!("--url host: {e}")))?;
                let stream = tls.connect(name, tcp).await.map_err(|e| {
                    match handshake_hint(&e, &self.host, self.ca_cert.as_deref()) {
                        Some(hint) => CliError::Transport(format!("{}: {hint}", self.authority)),
                        None => transport(&e),
                    }
                })?;
                send(stream, request).await.map_err(|e| transport(&e))?
            }
            None => send(tcp, request).await.map_err(|e| transport(&e))?,
        };
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| transport(&e))?
            .to_bytes();
        let body = if content_type.starts_with("application/json") {
            serde_json::from_slice(&bytes).map_err(|e| transport(&e))?
        } else {
            Value::String(String::from_utf8_lossy(&bytes).into_owned())
        };
        Ok(Answer { status, body })
    }
}

async fn send<S>(
    stream: S,
    request: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    sender.send_request(request).await
}

/// What to do about a refused server certificate `host` presented, in
/// the connector's words (`build_info::hints`: each names its
/// troubleshooting entry).
fn handshake_hint(e: &std::io::Error, host: &str, ca_cert: Option<&Path>) -> Option<String> {
    use rustls::CertificateError as C;
    let rustls::Error::InvalidCertificate(cert) = e.get_ref()?.downcast_ref::<rustls::Error>()?
    else {
        return None;
    };
    match cert {
        C::UnknownIssuer | C::BadSignature => Some(build_info::hints::chain(ca_cert)),
        C::NotValidForName | C::NotValidForNameContext { .. } => Some(format!(
            "{cert}: {}",
            build_info::hints::name(Some(host), "--url")
        )),
        _ => None,
    }
}

/// A TLS connector trusting only the root(s) in `pem`.
fn connector(pem: &[u8]) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        roots
            .add(cert.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    if roots.is_empty() {
        return Err("no certificate in the file".to_owned());
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Left-aligned columns, two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell:<w$}  ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// A JSON value as a table cell (`-` for null).
fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn items<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v[key].as_array().map_or(&[], Vec::as_slice)
}

fn health_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v, "applications")
        .iter()
        .map(|a| {
            let connectors: Vec<String> = items(a, "connectors")
                .iter()
                .map(|c| format!("{}={}", cell(&c["connector"]), cell(&c["status"])))
                .collect();
            vec![
                cell(&a["segment"]),
                cell(&a["host"]),
                cell(&a["protocol"]),
                port_cell(a),
                cell(&a["status"]),
                if connectors.is_empty() {
                    "-".to_owned()
                } else {
                    connectors.join(" ")
                },
            ]
        })
        .collect();
    table(
        &["SEGMENT", "HOST", "PROTO", "PORT", "STATUS", "CONNECTORS"],
        &rows,
    )
}

/// A row's port; a wildcard or subnet entry's row (port 0) shows the
/// ports its segment declares instead (`tcp 80, 443; udp 53`).
fn port_cell(a: &Value) -> String {
    match a["ports"].as_str() {
        Some(ports) if a["port"] == 0 => ports.to_owned(),
        _ => cell(&a["port"]),
    }
}

/// Unix milliseconds as RFC 3339 UTC to the second
/// (`2026-12-03T05:15:42Z`); `-` for null, anything else as it is.
fn time_cell(v: &Value) -> String {
    let Some(t) = v
        .as_i64()
        .and_then(|ms| time::OffsetDateTime::from_unix_timestamp(ms.div_euclid(1000)).ok())
    else {
        return cell(v);
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn connectors_table(v: &Value) -> String {
    let yes = |b: &Value| if b == true { "yes" } else { "no" }.to_owned();
    let rows: Vec<Vec<String>> = items(v, "connectors")
        .iter()
        .map(|c| {
            vec![
                cell(&c["name"]),
                cell(&c["group"]),
                yes(&c["connected"]),
                cell(&c["checks_per_cycle"]),
                c["cycle_seconds"]
                    .as_f64()
                    .map_or("-".to_owned(), |s| format!("{s:.1} s")),
                yes(&c["over_budget"]),
                time_cell(&c["enrolled_at"]),
                connector_state(c).to_owned(),
                drained_cell(&c["drained"]),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "GROUP",
            "CONNECTED",
            "CHECKS/CYCLE",
            "CYCLE",
            "OVER-BUDGET",
            "ENROLLED_AT",
            "STATE",
            "DRAINED",
        ],
        &rows,
    )
}

/// A connector's drain: `-`, or since when and by whom
/// (`2026-12-03T05:15:42Z by token:ops`).
fn drained_cell(d: &Value) -> String {
    if !d.is_object() {
        return "-".to_owned();
    }
    format!(
        "{} by {}:{}",
        time_cell(&d["since"]),
        cell(&d["by"]["kind"]),
        cell(&d["by"]["name"])
    )
}

/// What `GET /api/v1/whatif` answers: the applications that would lose a
/// connector, those left without any first, and how many that is.
fn whatif_text(v: &Value) -> String {
    let names = |a: &Value, key: &str| {
        let list: Vec<String> = items(a, key).iter().map(cell).collect();
        if list.is_empty() {
            "none".to_owned()
        } else {
            list.join(",")
        }
    };
    let rows: Vec<Vec<String>> = items(v, "applications")
        .iter()
        .map(|a| {
            vec![
                cell(&a["segment"]),
                if a["host"].is_null() {
                    "(every application)".to_owned()
                } else {
                    cell(&a["host"])
                },
                cell(&a["protocol"]),
                cell(&a["port"]),
                cell(&a["health_reporting"]),
                names(a, "losing"),
                names(a, "left"),
            ]
        })
        .collect();
    let without: Vec<String> = items(v, "without").iter().map(cell).collect();
    let mut out = format!("without: {}\n", without.join(", "));
    if rows.is_empty() {
        out.push_str("no application would lose a healthy, undrained connector\n");
        return out;
    }
    out.push_str(&table(
        &["SEGMENT", "HOST", "PROTO", "PORT", "MODE", "LOSING", "LEFT"],
        &rows,
    ));
    let stranded = v["stranded"].as_u64().unwrap_or(0);
    let _ = writeln!(
        out,
        "{} application(s) would lose a connector; {stranded} would be left without a healthy, undrained connector",
        rows.len()
    );
    let hidden = v["hidden_stranded"].as_u64().unwrap_or(0);
    if hidden > 0 {
        let _ = writeln!(
            out,
            "({hidden} of those are of segments with client_hostname_validation, listed only for the admin scope)"
        );
    }
    out
}

/// A drain the CA refused: why, then what it would do.
fn drain_refused_text(v: &Value) -> String {
    let mut out = format!("refused: {}\n", cell(&v["error"]["message"]));
    out.push_str(&whatif_text(&v["whatif"]));
    out
}

/// A connector's standing: `disabled`, else its newest certificate's
/// (`revoked`, `expired`; `enrolled` while it is valid), `-` when it never
/// enrolled (a CA without TLS).
fn connector_state(c: &Value) -> &'static str {
    if c["disabled"] == true {
        return "disabled";
    }
    if c["enrolled"] != true {
        return "-";
    }
    match c["certificates"][0]["state"].as_str() {
        Some("revoked") => "revoked",
        Some("expired") => "expired",
        Some(_) => "enrolled",
        None if c["certificate_not_after"].is_null() => "revoked",
        None => "enrolled",
    }
}

/// `api root`: the phase, the roots, the connectors still on the old root
/// and those without the trust bundle, and the next step of the rotation.
fn root_text(v: &Value) -> String {
    let phase = v["phase"].as_str().unwrap_or("?");
    let roots: Vec<Vec<String>> = items(v, "roots")
        .iter()
        .map(|r| {
            vec![
                cell(&r["role"]),
                cell(&r["fingerprint"]),
                time_cell(&r["not_after"]),
                cell(&r["subject"]),
            ]
        })
        .collect();
    let mut out = format!("phase: {phase}\n\n");
    out.push_str(&table(
        &["ROLE", "FINGERPRINT", "NOT_AFTER", "SUBJECT"],
        &roots,
    ));
    let old: Vec<String> = items(v, "on_old_root")
        .iter()
        .map(|c| {
            let disabled = if c["disabled"] == true {
                ", disabled"
            } else {
                ""
            };
            format!("{} ({}{disabled})", cell(&c["name"]), cell(&c["group"]))
        })
        .collect();
    let bundle: Vec<String> = items(v, "without_trust_bundle").iter().map(cell).collect();
    let list = |names: &[String]| match names.is_empty() {
        true => "none".to_owned(),
        false => names.join(", "),
    };
    let _ = writeln!(
        out,
        "\nconnectors still on the old root ({}): {}",
        old.len(),
        list(&old)
    );
    let _ = writeln!(
        out,
        "connected connectors that do not keep the trust bundle ({}): {}",
        bundle.len(),
        list(&bundle)
    );
    let next = match (phase, old.is_empty()) {
        ("introduce", _) if !bundle.is_empty() => {
            "next: put the new root into the --ca-cert file of every connector listed as not keeping the trust bundle, then switch"
        }
        ("introduce", _) => {
            "next: switch (issuer_*_file: the new root; previous_root_file: the old one)"
        }
        ("switch", true) => {
            "next: every connector holds a certificate from the new root: retire the old one (remove previous_root_file)"
        }
        ("switch", false) => {
            "next: wait until no connector is on the old root (they renew on their own), then retire it"
        }
        _ => "no rotation in progress",
    };
    let _ = writeln!(out, "{next}");
    out
}

fn keys_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v, "provisioning_keys")
        .iter()
        .map(|k| {
            vec![
                cell(&k["group"]),
                format!("{}/{}", cell(&k["uses"]), cell(&k["max_uses"])),
                time_cell(&k["expires_at"]),
                time_cell(&k["revoked_at"]),
                time_cell(&k["last_used_at"]),
                if k["usable"] == true { "yes" } else { "no" }.to_owned(),
            ]
        })
        .collect();
    table(
        &[
            "GROUP",
            "USES",
            "EXPIRES_AT",
            "REVOKED_AT",
            "LAST_USED_AT",
            "USABLE",
        ],
        &rows,
    )
}

/// The log receivers: one line each, the last error last.
fn receivers_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v, "log_receivers")
        .iter()
        .map(|r| {
            vec![
                cell(&r["name"]),
                cell(&r["destination"]),
                cell(&r["format"]),
                if r["connected"] == true { "yes" } else { "no" }.to_owned(),
                format!("{}/{}", cell(&r["spool_records"]), cell(&r["spool_bytes"])),
                cell(&r["sent_total"]),
                cell(&r["dropped_total"]),
                time_cell(&r["last_sent_unix_ms"]),
                cell(&r["last_error"]),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "DESTINATION",
            "FORMAT",
            "CONNECTED",
            "SPOOL_RECORDS/BYTES",
            "SENT",
            "DROPPED",
            "LAST_SENT",
            "LAST_ERROR",
        ],
        &rows,
    )
}

/// People's sessions: one line each, the ID to end it with first.
fn sessions_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v, "sessions")
        .iter()
        .map(|s| {
            let scopes: Vec<String> = s["scopes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(cell)
                .collect();
            vec![
                cell(&s["id"]),
                cell(&s["person"]),
                cell(&s["provider"]),
                scopes.join(","),
                time_cell(&s["created_at"]),
                time_cell(&s["expires_at"]),
                time_cell(&s["checked_at"]),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "PERSON",
            "PROVIDER",
            "SCOPES",
            "CREATED_AT",
            "EXPIRES_AT",
            "CHECKED_AT",
        ],
        &rows,
    )
}

/// The audit trail: one line per entry, then which page this is when
/// there are more.
fn audit_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = items(v, "entries")
        .iter()
        .map(|e| {
            vec![
                time_cell(&e["at"]),
                format!(
                    "{}:{}",
                    cell(&e["actor"]["kind"]),
                    cell(&e["actor"]["name"])
                ),
                cell(&e["source"]),
                cell(&e["action"]),
                cell(&e["target"]),
                cell(&e["outcome"]),
                match e["detail"].as_str() {
                    Some("") | None => "-".to_owned(),
                    Some(d) => d.to_owned(),
                },
            ]
        })
        .collect();
    let mut out = table(
        &[
            "TIME", "ACTOR", "SOURCE", "ACTION", "TARGET", "OUTCOME", "DETAIL",
        ],
        &rows,
    );
    if v["pages"].as_u64().is_some_and(|p| p > 1) {
        let _ = writeln!(
            out,
            "page {} of {} ({} entries; --page for others)",
            cell(&v["page"]),
            cell(&v["pages"]),
            cell(&v["total"])
        );
    }
    out
}

/// An admin action's answer: `key=value` pairs on one line.
fn fields_line(v: &Value) -> String {
    let mut out = String::new();
    if let Some(obj) = v.as_object() {
        let parts: Vec<String> = obj
            .iter()
            .map(|(k, v)| format!("{k}={}", cell(v)))
            .collect();
        out.push_str(&parts.join(" "));
    }
    out.push('\n');
    out
}

/// An access answer: the selection or the refusal, then the explanation.
fn access_text(v: &Value) -> String {
    let mut out = String::new();
    if v["error"].is_object() {
        let _ = writeln!(
            out,
            "refused: {}: {}",
            cell(&v["error"]["reason"]),
            cell(&v["error"]["message"])
        );
    } else {
        let _ = writeln!(
            out,
            "selected: connector {} (group {}, segment {})",
            cell(&v["connector"]),
            cell(&v["group"]),
            cell(&v["segment"])
        );
    }
    let e = &v["explanation"];
    let _ = writeln!(
        out,
        "segment: {} (entry {}, mode {}, strategy {})",
        cell(&e["segment"]),
        cell(&e["matched_entry"]),
        cell(&e["mode"]),
        cell(&e["strategy"])
    );
    candidates_text(e, &mut out);
    let user = &e["user_location"];
    if user.is_object() {
        let _ = writeln!(
            out,
            "user location: {}, {}: {}",
            cell(&user["latitude"]),
            cell(&user["longitude"]),
            cell(&user["reason"])
        );
    }
    let forwarded = items(e, "forwarded_to");
    if !forwarded.is_empty() {
        let names: Vec<String> = forwarded.iter().map(cell).collect();
        let _ = writeln!(out, "forwarded to: {}", names.join(", "));
    }
    if e["discovery_waited"] == true {
        let _ = writeln!(out, "waited {} ms for discovery", cell(&e["discovery_ms"]));
    }
    out
}

/// The explanation's candidates as a table, and how many were not listed.
fn candidates_text(e: &Value, out: &mut String) {
    let candidates = items(e, "candidates");
    if candidates.is_empty() {
        out.push_str("candidates: none\n");
    } else {
        let rows: Vec<Vec<String>> = candidates
            .iter()
            .map(|c| {
                vec![
                    cell(&c["connector"]),
                    cell(&c["group"]),
                    if c["connected"] == true { "yes" } else { "no" }.to_owned(),
                    cell(&c["status"]),
                    if c["eligible"] == true { "yes" } else { "no" }.to_owned(),
                    // The smoothed RTT `nearest` compares, when reported,
                    // plus the user's estimated RTT when that counts.
                    rtt_cell(c),
                    cell(&c["reason"]),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "CANDIDATE",
                "GROUP",
                "CONNECTED",
                "STATUS",
                "ELIGIBLE",
                "RTT",
                "WHY",
            ],
            &rows,
        ));
    }
    let total = e["candidates_total"].as_u64().unwrap_or(0);
    if total > candidates.len() as u64 {
        let _ = writeln!(
            out,
            "listed {} of {total} candidates ({} eligible, {} connected in all)",
            candidates.len(),
            cell(&e["candidates_eligible"]),
            cell(&e["candidates_connected"]),
        );
    }
}

/// A candidate's RTT cell: `1.00 ms`, with the user's location counted
/// `1.00 ms + 4.78 ms (478 km) = 5.78 ms`, `-` without an RTT.
fn rtt_cell(c: &Value) -> String {
    let Some(rtt) = c["rtt_ms"].as_f64() else {
        return "-".to_owned();
    };
    match (c["user_rtt_ms"].as_f64(), c["distance_km"].as_f64()) {
        (Some(user), Some(km)) => format!(
            "{rtt:.2} ms + {user:.2} ms ({km:.0} km) = {:.2} ms",
            rtt + user
        ),
        _ => format!("{rtt:.2} ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_text_shows_the_user_location_and_combined_rtt() {
        let v = json!({"connector": "fra-1", "group": "eu", "segment": "jira",
            "explanation": {"segment": "jira", "matched_entry": "jira.example", "mode": "continuous",
            "strategy": "nearest", "forwarded_to": [], "discovery_waited": false,
            "user_location": {"latitude": 48.85, "longitude": 2.35, "used": true, "reason": "used: …"},
            "candidates": [
                {"connector": "fra-1", "group": "eu", "connected": true, "status": "up", "eligible": true,
                 "rtt_ms": 5.0, "distance_km": 477.9, "user_rtt_ms": 4.779, "score_ms": 9.779, "reason": "near"},
                {"connector": "x", "group": "us", "connected": true, "status": "up", "eligible": false,
                 "rtt_ms": null, "reason": "no rtt"}]}});
        let text = access_text(&v);
        assert!(
            text.contains("user location: 48.85, 2.35: used: …"),
            "{text}"
        );
        assert!(
            text.contains("5.00 ms + 4.78 ms (478 km) = 9.78 ms"),
            "{text}"
        );
        assert!(!text.contains("listed"), "{text}");
    }

    #[test]
    fn access_text_says_how_many_candidates_were_not_listed() {
        let v = json!({"connector": "c7", "group": "g", "segment": "web",
            "explanation": {"segment": "web", "mode": "continuous", "strategy": "healthy",
            "candidates_total": 5000, "candidates_eligible": 4000, "candidates_connected": 4500,
            "candidates": [{"connector": "c7", "group": "g", "connected": true, "status": "up",
                "eligible": true, "rtt_ms": null, "reason": "reports the application up"}]}});
        let text = access_text(&v);
        assert!(
            text.contains("listed 1 of 5000 candidates (4000 eligible, 4500 connected in all)"),
            "{text}"
        );
    }

    #[test]
    fn tables_align_and_show_null_as_dash() {
        let v = json!({"applications": [
            {"segment": "jira", "host": "jira.example", "protocol": "tcp", "port": 80,
             "status": "up", "connectors": [{"connector": "c1", "status": "up"}]},
            {"segment": "lab", "host": "x", "protocol": "udp", "port": 53,
             "status": "unknown", "connectors": []},
        ]});
        assert_eq!(
            health_table(&v),
            "SEGMENT  HOST          PROTO  PORT  STATUS   CONNECTORS\n\
             jira     jira.example  tcp    80    up       c1=up\n\
             lab      x             udp    53    unknown  -\n"
        );
    }

    #[test]
    fn connector_state_shows_disabled_revoked_and_expired() {
        let c = |v: Value| connector_state(&v);
        assert_eq!(c(json!({"enrolled": false, "disabled": false})), "-");
        let cert = |state: &str| {
            json!({"enrolled": true, "disabled": false,
            "certificate_not_after": 9, "certificates": [{"state": state}, {"state": "revoked"}]})
        };
        assert_eq!(c(cert("current")), "enrolled");
        assert_eq!(c(cert("grace")), "enrolled");
        assert_eq!(c(cert("revoked")), "revoked");
        assert_eq!(c(cert("expired")), "expired");
        assert_eq!(
            c(json!({"enrolled": true, "disabled": true, "certificates": [{"state": "current"}]})),
            "disabled"
        );
    }

    #[test]
    fn audit_table_shows_utc_times_actors_and_pages() {
        let v = json!({"entries": [
            {"at": 1_764_000_000_123i64, "actor": {"kind": "token", "name": "ops"},
             "source": "192.0.2.7", "action": "connector.revoke", "target": "c1",
             "outcome": "ok", "detail": ""},
            {"at": 0, "actor": {"kind": "system", "name": "SIGHUP"}, "source": null,
             "action": "config.reload", "target": "/etc/ca.toml", "outcome": "refused",
             "detail": "bad"}],
            "total": 3, "page": 1, "per_page": 2, "pages": 2});
        assert_eq!(
            audit_table(&v),
            "TIME                  ACTOR          SOURCE     ACTION            TARGET        OUTCOME  DETAIL\n\
             2025-11-24T16:00:00Z  token:ops      192.0.2.7  connector.revoke  c1            ok       -\n\
             1970-01-01T00:00:00Z  system:SIGHUP  -          config.reload     /etc/ca.toml  refused  bad\n\
             page 1 of 2 (3 entries; --page for others)\n"
        );
    }

    #[test]
    fn whatif_text_lists_the_stranded_first_and_says_how_many() {
        let v = json!({"without": ["c1", "c2"], "stranded": 1, "hidden_stranded": 0,
            "applications": [
                {"segment": "jira", "host": "jira.example", "protocol": "tcp", "port": 80,
                 "health_reporting": "continuous", "losing": ["c1", "c2"], "left": [], "stranded": true},
                {"segment": "legacy", "host": null, "protocol": null, "port": null,
                 "health_reporting": "none", "losing": ["c1"], "left": ["c3"], "stranded": false}]});
        assert_eq!(
            whatif_text(&v),
            "without: c1, c2\n\
             SEGMENT  HOST                 PROTO  PORT  MODE        LOSING  LEFT\n\
             jira     jira.example         tcp    80    continuous  c1,c2   none\n\
             legacy   (every application)  -      -     none        c1      c3\n\
             2 application(s) would lose a connector; 1 would be left without a healthy, undrained connector\n"
        );
        let none =
            json!({"without": ["c9"], "stranded": 0, "hidden_stranded": 0, "applications": []});
        assert_eq!(
            whatif_text(&none),
            "without: c9\nno application would lose a healthy, undrained connector\n"
        );
        let refused = json!({"error": {"reason": "last_healthy_connector", "message": "draining \"c1\" would …"},
            "whatif": v});
        assert!(
            drain_refused_text(&refused)
                .starts_with("refused: draining \"c1\" would …\nwithout: c1, c2\n"),
            "{}",
            drain_refused_text(&refused)
        );
    }

    #[test]
    fn a_drained_connector_shows_since_when_and_by_whom() {
        assert_eq!(drained_cell(&Value::Null), "-");
        assert_eq!(
            drained_cell(
                &json!({"since": 0, "by": {"kind": "token", "name": "ops"}, "until": null})
            ),
            "1970-01-01T00:00:00Z by token:ops"
        );
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(time_cell(&json!(0)), "1970-01-01T00:00:00Z");
        assert_eq!(
            time_cell(&json!(951_782_400_999u64)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            time_cell(&json!(1_796_275_542_000u64)),
            "2026-12-03T05:25:42Z"
        );
        assert_eq!(time_cell(&json!(-1)), "1969-12-31T23:59:59Z");
        assert_eq!(time_cell(&Value::Null), "-");
    }

    #[test]
    fn path_parts_are_percent_encoded() {
        assert_eq!(encode("c1"), "c1");
        assert_eq!(encode("a/b c"), "a%2Fb%20c");
    }
}
