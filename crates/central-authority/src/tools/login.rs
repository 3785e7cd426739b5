//! `central-authority api login`: a person signs in for the CLI. The CLI
//! listens on 127.0.0.1 (a free port unless `--port`), the person opens
//! the CA's `/auth/login?cli_port=…&cli_state=…` in a browser and signs in
//! with the OpenID provider; the CA sends the browser back to the loopback
//! listener with a one-time code (usable once, for a minute, with this
//! CLI's state), which the CLI exchanges with `POST /auth/cli` for a
//! short-lived credential (a session of at most an hour): the credential
//! is never in a URL, so never in the browser's history. It is kept in a
//! file only its owner can read (0600) and sent as the session cookie
//! (with its CSRF token) by later commands.

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use serde::{Deserialize, Serialize};

/// How long the CLI waits for the browser.
const WAIT: Duration = Duration::from_secs(300);

/// A stored CLI credential.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Credential {
    /// The `--url` it was issued for.
    pub url: String,
    /// The session id (sent as the session cookie).
    pub credential: String,
    /// The session's CSRF token (sent as `X-CSRF-Token` on state changes).
    pub csrf_token: String,
    /// When it ends, Unix ms.
    pub expires_at: i64,
}

impl Credential {
    /// The credential in `path` for `url`, if there is one that has not
    /// ended.
    pub fn load(path: &Path, url: &str) -> Option<Credential> {
        let text = std::fs::read_to_string(path).ok()?;
        let c: Credential = serde_json::from_str(&text).ok()?;
        (c.url == url && c.expires_at > crate::ground::clock::now_ms()).then_some(c)
    }
}

/// The default credential file: `$XDG_CONFIG_HOME/reach/credential.json`,
/// else `~/.config/reach/credential.json`.
pub fn default_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("reach").join("credential.json"))
}

/// Runs the sign-in: `announce` gets the URL to open; returns the
/// credential once the browser brings it back, after storing it in `path`.
pub async fn login<Exchanged>(
    url: &str,
    provider: Option<&str>,
    port: u16,
    path: &Path,
    announce: impl FnOnce(&str),
    exchange: impl FnOnce(String, String) -> Exchanged,
) -> Result<Credential, String>
where
    Exchanged: Future<Output = Result<Credential, String>>,
{
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("cannot listen on 127.0.0.1:{port}: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let state = crate::ground::digest::hex(&rand::random::<[u8; 16]>());
    let mut open = format!(
        "{}/auth/login?cli_port={port}&cli_state={state}",
        url.trim_end_matches('/')
    );
    if let Some(p) = provider {
        let encoded: String =
            openidconnect::url::form_urlencoded::byte_serialize(p.as_bytes()).collect();
        open.push_str(&format!("&provider={encoded}"));
    }
    announce(&open);
    let code = tokio::time::timeout(WAIT, receive(&listener, &state))
        .await
        .map_err(|_| format!("no sign-in came back within {WAIT:?}"))??;
    let got = exchange(code, state).await?;
    let credential = Credential {
        url: url.to_owned(),
        ..got
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        private_files::create_private_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&credential).map_err(|e| e.to_string())?;
    private_files::write_atomic(path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(credential)
}

/// Serves the loopback listener until a request brings `state` back with
/// a code.
async fn receive(listener: &tokio::net::TcpListener, state: &str) -> Result<String, String> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(1);
    loop {
        let (tcp, _) = tokio::select! {
            got = rx.recv() => return got.ok_or_else(|| "the listener stopped".to_owned()),
            accepted = listener.accept() => accepted.map_err(|e| e.to_string())?,
        };
        let tx = tx.clone();
        let state = state.to_owned();
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let found = code_of(req.uri().query().unwrap_or(""), &state);
                let tx = tx.clone();
                async move {
                    let text = match found {
                        Some(c) => {
                            let _ = tx.send(c).await;
                            "Signed in to reach: return to the terminal (this tab can be closed).\n"
                        }
                        None => "Not a reach sign-in for this terminal.\n",
                    };
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from(
                        text,
                    ))))
                }
            });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                .await;
        });
    }
}

/// The code in a loopback request's `query`, if it carries `state`.
fn code_of(query: &str, state: &str) -> Option<String> {
    let mut code = String::new();
    let mut state_ok = false;
    for (k, v) in openidconnect::url::form_urlencoded::parse(query.as_bytes()) {
        match &*k {
            "code" => code = v.into_owned(),
            "state" => {
                state_ok =
                    crate::ground::secret::Secret::new(v.into_owned()).matches(state.as_bytes())
            }
            _ => {}
        }
    }
    (state_ok && !code.is_empty()).then_some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_terminals_state_is_taken() {
        let q = "code=abc&state=s1";
        assert_eq!(code_of(q, "s1").as_deref(), Some("abc"));
        assert!(code_of(q, "s2").is_none());
        assert!(code_of("state=s1", "s1").is_none());
    }
}
