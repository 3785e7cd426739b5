//! People's sign-in against a real OpenID provider: panva's
//! `oidc-provider` (pinned, installed from npm into target/oidc-provider),
//! started on 127.0.0.1 by `support/op.mjs` with a confidential client, a
//! `groups` claim and its development login form, driven in headless
//! Chromium. The CA runs with TLS on a port chosen before its config (the
//! provider must know the callback URL).
//!
//! Held here: the sign-in with PKCE lands on the dashboard, which names the
//! person; an admin action is recorded in the person's name; state changes
//! need the session's CSRF token and the CA's own origin; the cookie is no
//! gRPC credential; a sign-out on one
//! replica is refused on another sharing the store; a reader cannot act as
//! admin; a person without a mapped role gets the refusal page; a provider
//! that rotated its signing key is followed (JWKS fetched again); sign-ins,
//! refused ones too, are audited with provider and subject; a
//! hostile `next` (tab, newline, backslash, encoded forms) leaves the
//! browser on the CA after signing in; the CLI's sign-in brings a
//! one-time code, not the session, to its listener; a person removed at
//! the provider, or whose groups change, loses access within
//! `revalidate_s`, and a changed role mapping applies at the next request;
//! an administrator lists sessions and ends one (API and CLI), and its next
//! request is refused; a sign-out at the provider ends the CA's session by
//! back-channel logout, and its logout token sent again is refused.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use common::*;
use serde_json::{Value, json};
use test_support::browser::Browser;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The `oidc-provider` version the tests run (npm).
const OIDC_PROVIDER_VERSION: &str = "9.6.1";
const CLIENT_SECRET: &str = "client-secret-0123456789";
/// An admin token, to read the audit trail.
const ADMIN_TOKEN: &str = "tok-admin-Vb3Rk9TqLw2ZxN7pHs4MfJ8c";
const GROUPS: &str =
    r#"{"alice":["staff","reach-admins"],"bob":["reach-readers"],"carol":["staff"]}"#;

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
}

static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `oidc-provider`'s package directory, installed (pinned) when missing.
fn oidc_provider() -> PathBuf {
    let _once = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = target_dir().join("oidc-provider");
    let package = dir.join("node_modules/oidc-provider");
    let installed = std::fs::read_to_string(package.join("package.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .is_some_and(|v| v["version"] == OIDC_PROVIDER_VERSION);
    if !installed {
        std::fs::create_dir_all(&dir).expect("target/oidc-provider");
        let status = std::process::Command::new("npm")
            .arg("install")
            .arg("--prefix")
            .arg(&dir)
            .args(["--save-exact", "--no-audit", "--no-fund"])
            .arg(format!("oidc-provider@{OIDC_PROVIDER_VERSION}"))
            .status()
            .unwrap_or_else(|e| {
                panic!("npm is needed to install oidc-provider (apt-get install nodejs npm; .ci/run does): {e}")
            });
        assert!(
            status.success(),
            "npm install oidc-provider@{OIDC_PROVIDER_VERSION} failed"
        );
    }
    package
}

/// The OpenID provider process.
struct Op {
    port: u16,
    child: tokio::process::Child,
    /// Where the CA's root goes (the provider trusts it for back-channel
    /// logouts).
    ca_file: PathBuf,
}

impl Op {
    /// Starts the provider on `port` (0: any) signing with key `kid`, for
    /// a CA whose callback is `redirect`.
    async fn start(port: u16, redirect: &str, kid: &str) -> Op {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/op.mjs");
        let ca_file = scratch_dir("op").join("ca.pem");
        let mut child = tokio::process::Command::new("node")
            .arg(&script)
            .env("OP_MODULE", oidc_provider())
            .env("OP_PORT", port.to_string())
            .env("OP_REDIRECT", redirect)
            .env(
                "OP_BACKCHANNEL",
                redirect.replace("/auth/callback", "/auth/backchannel-logout"),
            )
            .env("OP_CA_FILE", &ca_file)
            .env("OP_SECRET", CLIENT_SECRET)
            .env("OP_KID", kid)
            .env("OP_GROUPS", GROUPS)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("node is needed to run oidc-provider (apt-get install nodejs): {e}")
            });
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let port = loop {
            let line = lines
                .next_line()
                .await
                .expect("provider output")
                .expect("the provider printed READY before exiting");
            if let Some(p) = line.strip_prefix("READY ") {
                break p.trim().parse().expect("port");
            }
        };
        // Drained, so the provider never writes to a closed pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Op {
            port,
            child,
            ca_file,
        }
    }

    /// Changes `user`'s groups at the provider (`None`: removes them).
    async fn set_groups(&self, user: &str, groups: Option<&[&str]>) {
        let r = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{}/_test/groups", self.port))
            .json(&json!({ "user": user, "groups": groups }))
            .send()
            .await
            .expect("the provider's test endpoint");
        assert!(r.status().is_success(), "{}", r.status());
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// A CA (TLS, on a port chosen first) with `[[oidc]]` for `op`.
fn config(ca_port: u16, op_port: u16) -> central_authority::Config {
    let oidc = format!(
        r#"
[[api_tokens]]
name = "root"
token = "{ADMIN_TOKEN}"
scopes = ["admin"]

[[oidc]]
name = "corp"
issuer = "http://127.0.0.1:{op_port}"
client_id = "reach"
client_secret = "{CLIENT_SECRET}"
redirect_url = "https://127.0.0.1:{ca_port}/auth/callback"
scopes = ["profile", "groups"]
revalidate_s = 1

[oidc.roles]
"reach-admins" = ["admin"]
"reach-readers" = ["read"]
"#
    );
    let mut c = central_authority::Config::from_toml(&config_text("", "", &oidc), Path::new("."))
        .unwrap_or_else(|e| panic!("{}", e.messages().join("\n")));
    c.settings.data_dir = scratch_dir("data");
    // The tests sign in many times a minute from one address (the hostile
    // `next` cases alone a dozen); the throttle's own test sets it low.
    c.settings.limits.login_per_source_per_minute = 1000;
    c
}

/// A loopback port for the CA, held bound while the provider (which must
/// name it) starts, so no other test's listener takes it meanwhile; the
/// caller drops the listener just before the CA binds the port.
fn reserve_port() -> (std::net::TcpListener, u16) {
    let hold = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("a loopback port");
    let port = hold.local_addr().expect("its address").port();
    (hold, port)
}

/// A CA and its provider, started together.
async fn ca_and_op() -> (Ca, Op) {
    let (hold, ca_port) = reserve_port();
    let op = Op::start(
        0,
        &format!("https://127.0.0.1:{ca_port}/auth/callback"),
        "k1",
    )
    .await;
    drop(hold);
    let ca = Ca::start_tls_at(config(ca_port, op.port), ([127, 0, 0, 1], ca_port).into()).await;
    std::fs::write(&op.ca_file, ca.root()).expect("the CA's root for the provider");
    (ca, op)
}

/// An HTTPS client trusting the CA's root, following no redirects.
fn https(root_pem: &str) -> reqwest::Client {
    https_from(root_pem, None)
}

/// Signs `user` in through the provider's login form, starting at the
/// CA's `/auth/login`.
async fn sign_in(b: &Browser, ca: &Ca, user: &str) {
    b.goto(&format!("https://{}/auth/login?next=/connectors", ca.http))
        .await
        .expect("to the provider");
    eventually("the provider's login form", || async {
        b.eval(
            "return !!document.querySelector('input[name=login]')",
            json!([]),
        )
        .await
        .ok()
            == Some(json!(true))
    })
    .await;
    b.eval(
        "document.querySelector('input[name=login]').value = arguments[0];
         document.querySelector('input[name=password]').value = 'any';
         document.querySelector('form').submit(); return true;",
        json!([user]),
    )
    .await
    .expect("login form submitted");
}

/// The text of element `id` in the page, or "".
async fn text_of(b: &Browser, id: &str) -> String {
    b.eval(
        "const e = document.getElementById(arguments[0]); return e ? e.textContent : '';",
        json!([id]),
    )
    .await
    .ok()
    .and_then(|v| v.as_str().map(str::to_owned))
    .unwrap_or_default()
}

/// The page's fetch of `POST path` with (or without) the session's CSRF
/// token: [status, error reason].
async fn post_in_page(b: &Browser, path: &str, with_csrf: bool) -> Value {
    b.eval(
        "return (async () => {
           const s = await (await fetch('/auth/session')).json();
           const headers = arguments[1] ? { 'X-CSRF-Token': s.csrf_token } : {};
           const r = await fetch(arguments[0], { method: 'POST', headers });
           const body = await r.json().catch(() => ({}));
           return [r.status, body.error ? body.error.reason : null];
         })()",
        json!([path, with_csrf]),
    )
    .await
    .expect("fetch in the page")
}

/// The session cookie Chromium holds for the CA.
async fn session_cookie(b: &Browser) -> String {
    let cookies = b.cookies().await.expect("cookies");
    let c = cookies
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "__Host-reach_session")
        .unwrap_or_else(|| panic!("no __Host- session cookie in {cookies}"));
    assert_eq!(c["path"], "/", "{c}");
    assert_eq!(c["httpOnly"], true, "{c}");
    assert_eq!(c["secure"], true, "{c}");
    assert_eq!(c["sameSite"], "Lax", "{c}");
    format!(
        "__Host-reach_session={}",
        c["value"].as_str().expect("value")
    )
}

async fn get_status(http: &reqwest::Client, url: &str, cookie: &str) -> (u16, Value) {
    let r = http
        .get(url)
        .header("cookie", cookie)
        .send()
        .await
        .expect("request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_person_signs_in_acts_in_their_name_and_signs_out_on_every_replica() {
    let (ca, op) = ca_and_op().await;
    // A second replica on the same store.
    let mut other = config(1, op.port);
    other.settings.data_dir = ca.data_dir.clone();
    let replica = Ca::start_in(other).await;
    let http = https(&ca.root());
    let b = Browser::start(&scratch_dir("chromium"))
        .await
        .expect("chromium");

    sign_in(&b, &ca, "alice").await;
    eventually("the dashboard names alice", || async {
        text_of(&b, "signed-in-as").await == "alice"
    })
    .await;

    // An admin action from the page: allowed (no such connector), audited
    // in alice's name; without the CSRF token refused.
    let with = post_in_page(&b, "/api/v1/connectors/nobody/disable", true).await;
    assert_eq!(with, json!([404, "not_found"]));
    let without = post_in_page(&b, "/api/v1/connectors/nobody/disable", false).await;
    assert_eq!(without, json!([403, "csrf"]));

    let cookie = session_cookie(&b).await;
    let base = format!("https://{}", ca.http);
    let (s, audit) = get_status(
        &http,
        &format!("{base}/api/v1/audit?action=connector.disable"),
        &cookie,
    )
    .await;
    assert_eq!(s, 200, "{audit}");
    let entry = &audit["entries"][0];
    assert_eq!(
        entry["actor"],
        json!({"kind": "person", "name": "alice", "provider": "corp", "subject": "alice"}),
        "{audit}"
    );
    assert_eq!(entry["outcome"], "not_found", "{audit}");

    // With the cookie and the token, but from another origin: refused.
    let (_, session) = get_status(&http, &format!("{base}/auth/session"), &cookie).await;
    let csrf = session["csrf_token"]
        .as_str()
        .expect("csrf token")
        .to_owned();
    let r = http
        .post(format!("{base}/api/v1/connectors/nobody/disable"))
        .header("cookie", &cookie)
        .header("x-csrf-token", &csrf)
        .header("origin", "https://evil.example")
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 403);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["reason"], "cross_origin", "{body}");

    // A live session cookie authorizes nothing over gRPC.
    let mut grpc = protocol::v1::health_query_client::HealthQueryClient::new(ca.channel().await);
    let mut req = tonic::Request::new(protocol::v1::ListApplicationsRequest::default());
    req.metadata_mut()
        .insert("cookie", cookie.parse().expect("ascii"));
    let err = grpc
        .list_applications(req)
        .await
        .expect_err("cookies are not gRPC credentials");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);

    // The other replica honours the session, until alice signs out here.
    let elsewhere = format!("https://{}/api/v1/connectors", replica.http);
    assert_eq!(get_status(&http, &elsewhere, &cookie).await.0, 200);
    b.eval(
        "document.getElementById('sign-out').click(); return true;",
        json!([]),
    )
    .await
    .expect("sign out");
    eventually("signed out", || async {
        !text_of(&b, "sign-in").await.is_empty()
    })
    .await;
    let (s, v) = get_status(&http, &elsewhere, &cookie).await;
    assert_eq!(s, 401, "{v}");
    assert_eq!(
        get_status(&http, &format!("{base}/api/v1/connectors"), &cookie)
            .await
            .0,
        401
    );

    b.close().await;
    replica.stop().await;
    ca.stop().await;
    op.stop().await;
}

#[tokio::test]
async fn roles_decide_what_a_person_may_do_and_rotated_keys_are_fetched() {
    let (ca, op) = ca_and_op().await;

    // A reader may read, not act as admin.
    let b = Browser::start(&scratch_dir("chromium"))
        .await
        .expect("chromium");
    sign_in(&b, &ca, "bob").await;
    eventually("the dashboard names bob", || async {
        text_of(&b, "signed-in-as").await == "bob"
    })
    .await;
    let refused = post_in_page(&b, "/api/v1/connectors/nobody/disable", true).await;
    assert_eq!(refused, json!([403, "forbidden"]));
    b.close().await;

    // No mapped role: the refusal page.
    let b = Browser::start(&scratch_dir("chromium"))
        .await
        .expect("chromium");
    sign_in(&b, &ca, "carol").await;
    eventually("the refusal page", || async {
        text_of(&b, "reason").await.contains("has no role")
    })
    .await;
    assert!(text_of(&b, "reason").await.contains("carol"));
    b.close().await;

    // Both sign-ins are in the audit trail: bob's, and carol's refused,
    // each with the provider and subject besides the user name.
    let (s, v) = ca
        .web()
        .get_json("/api/v1/audit?action=session.sign_in", Some(ADMIN_TOKEN))
        .await;
    assert_eq!(s, 200, "{v}");
    let seen: Vec<(Value, Value, Value)> = v["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            (
                e["actor"].clone(),
                e["target"].clone(),
                e["outcome"].clone(),
            )
        })
        .collect();
    let person = |n: &str| json!({"kind": "person", "name": n, "provider": "corp", "subject": n});
    assert_eq!(
        seen,
        [
            (person("carol"), json!("corp"), json!("refused")),
            (person("bob"), json!("corp"), json!("ok")),
        ],
        "{v}"
    );

    // The provider restarts with a new signing key: the CA, holding the
    // old key set, fetches it again and bob signs in.
    let port = op.port;
    op.stop().await;
    let op = Op::start(port, &format!("https://{}/auth/callback", ca.http), "k2").await;
    let b = Browser::start(&scratch_dir("chromium"))
        .await
        .expect("chromium");
    sign_in(&b, &ca, "bob").await;
    eventually("bob signed in after the key rotation", || async {
        text_of(&b, "signed-in-as").await == "bob"
    })
    .await;
    b.close().await;
    ca.stop().await;
    op.stop().await;
}

/// `central-authority api` with `args`, no token: (exit code, stdout, stderr).
async fn cli(args: Vec<String>) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_central-authority"))
        .args(args)
        .env_remove("REACH_API_TOKEN")
        .env_remove("REACH_API_TOKEN_FILE")
        .output()
        .await
        .expect("run central-authority");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_cli_signs_a_person_in_through_the_browser_and_out() {
    use std::os::unix::fs::PermissionsExt as _;
    let (ca, op) = ca_and_op().await;
    let dir = scratch_dir("cli-login");
    let cert = dir.join("ca.pem");
    std::fs::write(&cert, ca.root()).expect("root");
    let credential = dir.join("reach/credential.json");
    let flags = |more: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = vec![
            "api".into(),
            "--url".into(),
            format!("https://{}", ca.http),
            "--ca-cert".into(),
            cert.display().to_string(),
            "--credential-file".into(),
            credential.display().to_string(),
        ];
        v.extend(more.iter().map(|s| (*s).to_owned()));
        v
    };

    // `api login` prints the URL to open and waits for the browser.
    let mut login = tokio::process::Command::new(env!("CARGO_BIN_EXE_central-authority"))
        .args(flags(&["login"]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("api login");
    let mut stderr = BufReader::new(login.stderr.take().expect("stderr")).lines();
    let url = loop {
        let line = stderr
            .next_line()
            .await
            .expect("stderr")
            .expect("api login printed the URL");
        if let Some(u) = line.trim().strip_prefix("https://") {
            break format!("https://{u}");
        }
    };
    let b = Browser::start(&scratch_dir("chromium"))
        .await
        .expect("chromium");
    b.goto(&url).await.expect("to the CA");
    eventually("the provider's login form", || async {
        b.eval(
            "return !!document.querySelector('input[name=login]')",
            json!([]),
        )
        .await
        .ok()
            == Some(json!(true))
    })
    .await;
    b.eval(
        "document.querySelector('input[name=login]').value = 'alice';
         document.querySelector('input[name=password]').value = 'any';
         document.querySelector('form').submit(); return true;",
        json!([]),
    )
    .await
    .expect("login form submitted");
    let out = login.wait_with_output().await.expect("api login ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("signed in as alice"), "{stdout}");
    let mode = std::fs::metadata(&credential)
        .expect("credential file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // The browser ended on the CLI's listener with a one-time code, never
    // the credential; the code, used by the CLI, is good no more.
    let held: Value =
        serde_json::from_str(&std::fs::read_to_string(&credential).expect("read")).expect("json");
    let secret = held["credential"].as_str().expect("credential").to_owned();
    let last = b
        .eval("return location.href", json!([]))
        .await
        .expect("the browser's URL");
    let last = last.as_str().expect("a URL").to_owned();
    assert!(last.starts_with("http://127.0.0.1:"), "{last}");
    assert!(!last.contains(&secret), "the session is in the URL: {last}");
    assert!(!last.contains("credential"), "{last}");
    let parsed = url::Url::parse(&last).expect("URL");
    let query: std::collections::HashMap<_, _> = parsed.query_pairs().into_owned().collect();
    let http = https(&ca.root());
    let again = http
        .post(format!("https://{}/auth/cli", ca.http))
        .json(&json!({"code": query["code"], "state": query["state"]}))
        .send()
        .await
        .expect("exchange again");
    let status = again.status().as_u16();
    let body: Value = again.json().await.unwrap_or(Value::Null);
    assert_eq!(
        (status, body["error"]["reason"].clone()),
        (403, json!("invalid_code")),
        "{body}"
    );
    b.close().await;

    // The credential acts in alice's name.
    let (code, _, err) = cli(flags(&["connectors", "disable", "nobody"])).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not_found"), "{err}");
    let (code, out, err) = cli(flags(&["audit", "--action", "connector.disable"])).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("person:alice"), "{out}");

    // `api sessions` lists bob's browser session; `api sessions end ID`
    // ends it, and bob's next request is refused.
    let (bob_browser, bob) = signed_in(&ca, "bob").await;
    let (code, out, err) = cli(flags(&["sessions", "--json"])).await;
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("json");
    let id = v["sessions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["person"] == "bob")
        .and_then(|s| s["id"].as_str())
        .unwrap_or_else(|| panic!("no session of bob in {v}"))
        .to_owned();
    let (code, out, err) = cli(flags(&["sessions"])).await;
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with(&id))
        .unwrap_or_else(|| panic!("{id} not listed: {out}"));
    assert!(line.contains("bob") && line.contains("read"), "{out}");
    assert!(out.contains("alice"), "{out}");
    let (code, out, err) = cli(flags(&["sessions", "end", &id])).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ended"), "{out}");
    let read = format!("https://{}/api/v1/connectors", ca.http);
    assert_eq!(get_status(&https(&ca.root()), &read, &bob).await.0, 401);
    bob_browser.close().await;

    // `api logout` revokes it and removes the file.
    let (code, _, err) = cli(flags(&["logout"])).await;
    assert_eq!(code, 0, "{err}");
    assert!(!credential.exists());
    let (code, _, err) = cli(flags(&["audit"])).await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("401") || err.contains("unauthorized"), "{err}");

    ca.stop().await;
    op.stop().await;
}

/// Signs in (any provider form answered as alice) starting at
/// `/auth/login?next=…` with `next` as the query value, and returns the
/// URL the browser ends on once it is back from the provider.
async fn sign_in_with_next(b: &Browser, ca: &Ca, op: &Op, next: &str) -> String {
    let login =
        url::Url::parse_with_params(&format!("https://{}/auth/login", ca.http), [("next", next)])
            .expect("login URL");
    b.goto(login.as_str()).await.expect("to the provider");
    let provider = format!("http://127.0.0.1:{}/", op.port);
    let here = "return [location.href, document.readyState, \
                !!document.querySelector('input[name=login]')]";
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(15);
    let mut submitted = false;
    loop {
        let v = b.eval(here, json!([])).await.unwrap_or(Value::Null);
        let href = v[0].as_str().unwrap_or_default().to_owned();
        let on_provider = href.starts_with(&provider);
        if on_provider && v[2] == true && !submitted {
            b.eval(
                "document.querySelector('input[name=login]').value = 'alice';
                 document.querySelector('input[name=password]').value = 'any';
                 document.querySelector('form').submit(); return true;",
                json!([]),
            )
            .await
            .expect("login form submitted");
            submitted = true;
        } else if !href.is_empty() && !on_provider && !href.contains("/auth/") && v[1] == "complete"
        {
            return href;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "signing in with next {next:?}: not back from the provider (at {v})"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `next` values that a browser's URL parser (tab, CR and LF dropped,
/// `\` read as `/`) or a second percent-decoding would turn into another
/// host: after a real sign-in Chromium is on the CA's origin, at `/`.
/// `evil.example` resolves to loopback in this browser and the CA answers
/// there on its own port, so a redirect that got out shows as a page of
/// another origin, and no request leaves the host.
#[tokio::test]
async fn after_sign_in_a_hostile_next_leaves_the_browser_on_the_ca() {
    let (ca, op) = ca_and_op().await;
    let origin = format!("https://{}", ca.http);
    let evil = format!("evil.example:{}", ca.http.port());
    let b = Browser::start_with(
        &scratch_dir("chromium"),
        &["--host-resolver-rules=MAP evil.example 127.0.0.1".to_owned()],
    )
    .await
    .expect("chromium");

    // A path of the CA is followed, query and all (so the test sees where
    // `next` leads).
    let at = sign_in_with_next(&b, &ca, &op, "/connectors?q=a%20b").await;
    assert_eq!(at, format!("{origin}/connectors?q=a%20b"));

    for next in [
        format!("/\t/{evil}/"),
        format!("/\n/{evil}/"),
        format!("/\r\n/{evil}/"),
        format!("\t//{evil}/"),
        format!(" //{evil}/"),
        format!("/\\{evil}/"),
        format!("/\t\\{evil}/"),
        format!("/%5C{evil}/"),
        format!("/%09/{evil}/"),
        format!("/%2F%2F{evil}/"),
        format!("/.//{evil}/"),
        format!("//{evil}/"),
    ] {
        let at = sign_in_with_next(&b, &ca, &op, &next).await;
        assert_eq!(
            at,
            format!("{origin}/"),
            "after signing in with next {next:?}"
        );
    }
    b.close().await;
    ca.stop().await;
    op.stop().await;
}

/// `GET /auth/login` needs no credential and keeps a store row for ten
/// minutes per call: a source gets `login_per_source_per_minute` of them,
/// the whole CA `login_per_second` (burst ten times that), whatever the
/// number of sources; beyond, 429 with `Retry-After` and no row.
#[tokio::test]
async fn sign_ins_started_are_throttled_per_source_and_bounded_in_all() {
    let (hold, ca_port) = reserve_port();
    let op = Op::start(
        0,
        &format!("https://127.0.0.1:{ca_port}/auth/callback"),
        "k1",
    )
    .await;
    drop(hold);
    let mut c = config(ca_port, op.port);
    c.settings.limits.login_per_source_per_minute = 3;
    c.settings.limits.login_per_second = 1;
    let ca = Ca::start_tls_at(c, ([127, 0, 0, 1], ca_port).into()).await;
    let login = format!("https://127.0.0.1:{ca_port}/auth/login");
    let status = |last: u8| {
        let login = login.clone();
        let root = ca.root();
        async move {
            let client = https_from(&root, Some([127, 0, 0, last].into()));
            let r = client.get(&login).send().await.expect("GET /auth/login");
            let retry = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            (r.status().as_u16(), retry)
        }
    };
    // One source: three sign-ins, then refused until one refills (20 s).
    for _ in 0..3 {
        assert_eq!(status(1).await.0, 303);
    }
    let (code, retry) = status(1).await;
    assert_eq!((code, retry.as_deref()), (429, Some("20")));
    // Many sources, each within its own allowance: the whole CA's burst of
    // ten (three taken) and one a second after it are the bound.
    let began = std::time::Instant::now();
    let mut started = 0u64;
    for last in 2..=9 {
        for _ in 0..3 {
            match status(last).await {
                (303, _) => started += 1,
                (429, Some(_)) => {}
                other => panic!("from 127.0.0.{last}: {other:?}"),
            }
        }
    }
    let bound = 7 + began.elapsed().as_secs() + 1;
    assert!(
        started <= bound && started < 24,
        "{started} sign-ins started from 8 sources (bound {bound})"
    );
    ca.stop().await;
    op.stop().await;
}

/// A signed-in person's cookie, in a browser of its own (kept open).
async fn signed_in(ca: &Ca, user: &str) -> (Browser, String) {
    let b = Browser::start(&scratch_dir("chromium"))
        .await
        .expect("chromium");
    sign_in(&b, ca, user).await;
    eventually(&format!("the dashboard names {user}"), || async {
        text_of(&b, "signed-in-as").await == user
    })
    .await;
    let cookie = session_cookie(&b).await;
    (b, cookie)
}

#[tokio::test]
async fn a_person_removed_or_regrouped_at_the_provider_loses_access_within_the_interval() {
    let (ca, op) = ca_and_op().await;
    let http = https(&ca.root());
    let base = format!("https://{}", ca.http);
    let (b, cookie) = signed_in(&ca, "alice").await;
    let audit = format!("{base}/api/v1/audit");
    let read = format!("{base}/api/v1/connectors");
    assert_eq!(get_status(&http, &audit, &cookie).await.0, 200);

    // Moved out of the admin group: a reader at a request after the
    // interval (the provider's refreshed ID token says so).
    op.set_groups("alice", Some(&["reach-readers"])).await;
    eventually("alice is no admin any more", || async {
        get_status(&http, &audit, &cookie).await.0 == 403
    })
    .await;
    assert_eq!(get_status(&http, &read, &cookie).await.0, 200);

    // The CA's role mapping changes: it applies at the next request.
    let mapped = |roles: Vec<(String, Vec<central_authority::credentials::auth::Scope>)>| {
        let mut c = config(ca.http.port(), op.port);
        c.settings.data_dir = ca.data_dir.clone();
        c.oidc[0].roles = roles;
        c
    };
    let original = config(ca.http.port(), op.port).oidc[0].roles.clone();
    use central_authority::credentials::auth::Scope;
    ca.authority
        .apply(mapped(vec![("reach-readers".into(), vec![Scope::Admin])]));
    assert_eq!(get_status(&http, &audit, &cookie).await.0, 200);
    ca.authority.apply(mapped(original));
    assert_eq!(get_status(&http, &audit, &cookie).await.0, 403);

    // Removed at the provider: the refresh is refused and the session ends.
    op.set_groups("alice", None).await;
    eventually("alice's session ended", || async {
        get_status(&http, &read, &cookie).await.0 == 401
    })
    .await;
    b.close().await;

    // Back as an admin, alice finds the CA's record of it.
    op.set_groups("alice", Some(&["reach-admins"])).await;
    let (b, cookie) = signed_in(&ca, "alice").await;
    let (s, v) = get_status(&http, &format!("{audit}?action=session.end"), &cookie).await;
    assert_eq!(s, 200, "{v}");
    let entry = &v["entries"][0];
    assert_eq!(
        entry["actor"],
        json!({"kind": "system", "name": "oidc:corp"}),
        "{v}"
    );
    assert_eq!(entry["target"], "alice", "{v}");
    b.close().await;
    ca.stop().await;
    op.stop().await;
}

/// [`https`] from the local address `local`, if given.
fn https_from(root_pem: &str, local: Option<std::net::IpAddr>) -> reqwest::Client {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(root_pem.as_bytes()) {
        roots.add(c.expect("root")).expect("root");
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("tls")
    .with_root_certificates(roots)
    .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest::redirect::Policy::none())
        .local_address(local)
        .build()
        .expect("client")
}

#[tokio::test]
async fn an_admin_ends_a_session_and_its_next_request_is_refused() {
    let (ca, op) = ca_and_op().await;
    let http = https(&ca.root());
    let base = format!("https://{}", ca.http);
    let (admin_browser, alice) = signed_in(&ca, "alice").await;
    let (bob_browser, bob) = signed_in(&ca, "bob").await;
    let read = format!("{base}/api/v1/connectors");
    assert_eq!(get_status(&http, &read, &bob).await.0, 200);

    // A reader may not list sessions; an admin sees both.
    let sessions = format!("{base}/api/v1/sessions");
    assert_eq!(get_status(&http, &sessions, &bob).await.0, 403);
    let (s, v) = get_status(&http, &sessions, &alice).await;
    assert_eq!(s, 200, "{v}");
    let list = v["sessions"].as_array().expect("sessions");
    let of = |who: &str| {
        list.iter()
            .find(|s| s["person"] == who)
            .unwrap_or_else(|| panic!("no session of {who} in {v}"))
            .clone()
    };
    assert_eq!(of("alice")["scopes"], json!(["admin"]), "{v}");
    assert_eq!(of("bob")["scopes"], json!(["read"]), "{v}");
    let id = of("bob")["id"].as_str().expect("id").to_owned();

    // Ending it takes the session's CSRF token, like every change.
    let (_, session) = get_status(&http, &format!("{base}/auth/session"), &alice).await;
    let csrf = session["csrf_token"].as_str().expect("csrf").to_owned();
    let end = |id: String| {
        http.delete(format!("{sessions}/{id}"))
            .header("cookie", &alice)
            .header("x-csrf-token", &csrf)
            .send()
    };
    let r = end(id.clone()).await.expect("delete");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(get_status(&http, &read, &bob).await.0, 401);
    let r = end(id.clone()).await.expect("delete again");
    assert_eq!(r.status().as_u16(), 404);

    let (_, v) = get_status(
        &http,
        &format!("{base}/api/v1/audit?action=session.end"),
        &alice,
    )
    .await;
    let entry = &v["entries"][0];
    assert_eq!(
        (&entry["actor"]["kind"], &entry["actor"]["name"]),
        (&json!("person"), &json!("alice")),
        "{v}"
    );
    assert_eq!(entry["actor"]["provider"], "corp", "{v}");
    assert_eq!(entry["target"], id, "{v}");
    assert_eq!(entry["outcome"], "not_found", "{v}");
    assert_eq!(v["entries"][1]["outcome"], "ok", "{v}");
    admin_browser.close().await;
    bob_browser.close().await;
    ca.stop().await;
    op.stop().await;
}

#[tokio::test]
async fn a_sign_out_at_the_provider_ends_the_session_by_back_channel_logout() {
    let (ca, op) = ca_and_op().await;
    let http = https(&ca.root());
    let read = format!("https://{}/api/v1/connectors", ca.http);
    let (b, cookie) = signed_in(&ca, "alice").await;
    let (bob_browser, bob) = signed_in(&ca, "bob").await;
    assert_eq!(get_status(&http, &read, &cookie).await.0, 200);

    // Alice signs out at the provider, in her browser.
    b.goto(&format!("http://127.0.0.1:{}/session/end", op.port))
        .await
        .expect("to the provider's sign-out");
    eventually("the provider's sign-out page", || async {
        b.eval(
            "const y = document.querySelector('button[name=logout]');
             if (!y) return false; y.click(); return true;",
            json!([]),
        )
        .await
        .ok()
            == Some(json!(true))
    })
    .await;
    eventually("alice's session ended by the provider", || async {
        get_status(&http, &read, &cookie).await.0 == 401
    })
    .await;
    // Bob's session is another provider session: it stands.
    assert_eq!(get_status(&http, &read, &bob).await.0, 200);

    // The same logout token sent again is refused (its jti was seen).
    let sent = reqwest::get(format!("http://127.0.0.1:{}/_test/last-logout", op.port))
        .await
        .expect("the provider's test endpoint")
        .text()
        .await
        .expect("body");
    assert!(sent.starts_with("logout_token="), "{sent}");
    let replay = http
        .post(format!("https://{}/auth/backchannel-logout", ca.http))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(sent)
        .send()
        .await
        .expect("replay");
    assert_eq!(replay.status().as_u16(), 400);
    let body: Value = replay.json().await.expect("json");
    assert_eq!(body["error"], "invalid_request", "{body}");
    assert!(
        body["error_description"]
            .as_str()
            .is_some_and(|d| d.contains("used already")),
        "{body}"
    );
    b.close().await;
    bob_browser.close().await;
    ca.stop().await;
    op.stop().await;
}
