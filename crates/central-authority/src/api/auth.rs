//! People's sign-in over HTTP (`credentials::oidc` runs the protocol):
//! `GET /auth/login` sends the browser to the OpenID provider,
//! `GET /auth/callback` takes it back and opens a session (for the CLI:
//! a one-time code its loopback listener receives and exchanges with
//! `POST /auth/cli`),
//! `POST /auth/logout` ends it, `GET /auth/session` tells the dashboard
//! who is signed in (and the session's CSRF token).
//!
//! A session is a random id in a cookie (`Secure`, `HttpOnly`,
//! `SameSite=Lax`, `Path=/`, no `Domain`, ending with the session) named
//! `__Host-reach_session` over HTTPS, so no sibling host or plain-HTTP page
//! can set or shadow it; a CA serving plain HTTP (loopback, for trying it
//! out) names it `reach_session`, as a browser refuses a `__Host-` cookie
//! there. The sign-in's binding cookie follows the same rule
//! (`__Host-reach_login`, `reach_login`). The store keeps its
//! SHA-256 with the person, their scopes and its end, so every replica
//! honours it and a sign-out on one is a sign-out on all. A request that
//! changes state with the cookie must also carry the session's CSRF token
//! in `X-CSRF-Token` (besides the guard's Origin check); the token is
//! derived from the session id, so it needs no storage. Cookies authorize
//! the HTTP API only, never gRPC.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::api::route::{Auth, Op, Route, error_ref, route};
use crate::credentials::auth::{AuthError, Scope};
use crate::credentials::oidc::{Pending, ProviderConfig, SignInError};
use crate::state::authority::Authority;
use crate::store::{LoginRecord, SessionRecord};
use crate::trust;
use crate::trust::audit::{Actor, AdminAction, Outcome};

type Shared = Arc<Authority>;

/// The session cookie over HTTPS.
pub const SESSION_COOKIE: &str = "__Host-reach_session";
/// The session cookie of a CA serving plain HTTP (a browser refuses a
/// `__Host-` cookie there).
pub const PLAIN_SESSION_COOKIE: &str = "reach_session";
/// The cookie binding a sign-in to the browser that started it (HTTPS).
const LOGIN_COOKIE: &str = "__Host-reach_login";
/// [`LOGIN_COOKIE`] on plain HTTP.
const PLAIN_LOGIN_COOKIE: &str = "reach_login";

/// The session cookie's name for a CA serving HTTPS (`https`) or not.
pub fn session_cookie_name(https: bool) -> &'static str {
    if https {
        SESSION_COOKIE
    } else {
        PLAIN_SESSION_COOKIE
    }
}

fn login_cookie_name(https: bool) -> &'static str {
    if https {
        LOGIN_COOKIE
    } else {
        PLAIN_LOGIN_COOKIE
    }
}

/// Whether the CA serves HTTPS (its listeners have the CA's TLS).
fn https(a: &Authority) -> bool {
    a.pki().is_some()
}
/// The header carrying a cookie session's CSRF token.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// How long a sign-in may take at the provider.
const LOGIN_TTL_MS: i64 = 10 * 60 * 1000;

/// A signed-in person's session, as a request presents it.
#[derive(Clone, Debug)]
pub struct Session {
    /// Who.
    pub person: String,
    /// Through which provider (`[[oidc]] name`).
    pub provider: String,
    /// Their subject (`sub`) there.
    pub subject: String,
    /// What their roles grant.
    pub scopes: Vec<Scope>,
    /// SHA-256 of the session id (what the store keys it by).
    pub id_sha256: String,
    /// The CSRF token mutating requests must carry.
    pub csrf: String,
    /// When it ends, Unix ms.
    pub expires_ms: i64,
}

impl Session {
    /// Whether the session grants `scope` (`admin` grants everything).
    pub fn allows(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope) || self.scopes.contains(&Scope::Admin)
    }
}

/// The value of cookie `name` in `headers`.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The CSRF token of session id `id`.
fn csrf_of(id: &str) -> String {
    crate::ground::digest::sha256_hex(format!("reach-csrf:{id}").as_bytes())
}

/// The session the request's cookie names: `None` without a session
/// cookie; an error when it is unknown, revoked or over, or the store
/// cannot tell.
pub async fn session_of(a: &Shared, headers: &HeaderMap) -> Option<Result<Session, AuthError>> {
    let id = cookie(headers, session_cookie_name(https(a)))?.to_owned();
    let hash = crate::ground::digest::sha256_hex(id.as_bytes());
    let now = crate::ground::clock::now_ms();
    let found = a.blocking(move |a| a.store().session(&hash)).await;
    Some(match found {
        // Its provider's word and the role mapping decide (`api::sessions`).
        Some(Ok(Some(r))) if r.revoked_ms.is_none() && r.expires_ms > now => {
            match crate::api::sessions::standing(a, &id, r).await {
                Ok(Some((r, scopes))) => Ok(Session {
                    person: r.person,
                    provider: r.provider,
                    subject: r.subject,
                    scopes,
                    id_sha256: r.id_sha256,
                    csrf: csrf_of(&id),
                    expires_ms: r.expires_ms,
                }),
                Ok(None) => Err(AuthError::SessionEnded),
                Err(e) => Err(e),
            }
        }
        Some(Ok(_)) => Err(AuthError::SessionEnded),
        Some(Err(_)) | None => Err(AuthError::Unavailable),
    })
}

/// A state change made with a cookie session must carry its CSRF token.
pub fn check_csrf(method: &Method, headers: &HeaderMap, s: &Session) -> Result<(), AuthError> {
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return Ok(());
    }
    let sent = headers.get(CSRF_HEADER).map(HeaderValue::as_bytes);
    let ok = sent.is_some_and(|t| crate::ground::secret::Secret::new(s.csrf.clone()).matches(t));
    if ok { Ok(()) } else { Err(AuthError::Csrf) }
}

/// The session a request authorizes with, for `scope`: `None` when it
/// sends an `Authorization` header or no session cookie (tokens decide).
pub async fn authorize_session(
    a: &Shared,
    method: &Method,
    headers: &HeaderMap,
    scope: Scope,
) -> Option<Result<Session, AuthError>> {
    if headers.contains_key(header::AUTHORIZATION) {
        return None;
    }
    let session = match session_of(a, headers).await? {
        Ok(s) => s,
        // An ended session reads what anybody may read.
        Err(AuthError::SessionEnded)
            if scope == Scope::Read && a.snapshot().settings().anonymous_read =>
        {
            return None;
        }
        Err(e) => return Some(Err(e)),
    };
    Some(check_csrf(method, headers, &session).and_then(|()| {
        if session.allows(scope) {
            Ok(session)
        } else {
            Err(AuthError::PersonMissingScope {
                person: session.person,
                scope: scope.as_str(),
            })
        }
    }))
}

/// `Set-Cookie` of the session `id` for `max_age_s` (0: remove it).
fn session_cookie(https: bool, id: &str, max_age_s: i64) -> String {
    let name = session_cookie_name(https);
    format!("{name}={id}; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age={max_age_s}")
}

/// `Set-Cookie` of the sign-in binding: `Path=/`, as `__Host-` requires.
fn login_cookie(https: bool, state: &str, max_age_s: i64) -> String {
    let name = login_cookie_name(https);
    format!("{name}={state}; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age={max_age_s}")
}

/// A small HTML page (a refusal or a failure) with `status`.
pub fn page(status: StatusCode, title: &str, text: &str) -> Response {
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>reach — {t}</title>\
         <link rel=\"stylesheet\" href=\"/assets/dashboard.css\"></head><body><main id=\"main\">\
         <h1>{t}</h1><p id=\"reason\">{x}</p><p><a href=\"/auth/login\">Sign in again</a> · \
         <a href=\"/\">Dashboard</a></p></main></body></html>",
        t = escape(title),
        x = escape(text)
    );
    let r = (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response();
    crate::api::dashboard::secured(r)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The `[[oidc]]` provider named `name` (`None`: the first).
fn provider(a: &Authority, name: Option<&str>) -> Option<ProviderConfig> {
    let state = a.snapshot();
    let all = &state.config.oidc;
    match name {
        Some(n) => all.iter().find(|p| p.name == n).cloned(),
        None => all.first().cloned(),
    }
}

/// `GET /auth/login` parameters.
#[derive(Debug, Deserialize)]
pub struct LoginQuery {
    provider: Option<String>,
    next: Option<String>,
    /// `central-authority api login`: its loopback port and state; the
    /// credential goes there instead of into a cookie.
    cli_port: Option<u16>,
    cli_state: Option<String>,
}

/// Longest a CLI credential lasts (ms).
const CLI_LIFETIME_MS: i64 = 60 * 60 * 1000;
/// How long the one-time code the browser carries to the CLI may be
/// exchanged (ms): the CLI does it at once.
pub const CLI_CODE_TTL_MS: i64 = 60 * 1000;
/// What marks a stored sign-in record as a CLI code (`next`), followed by
/// the session's end (Unix ms).
const CLI_CODE: &str = "cli-code:";

/// Where a sign-in returns: `cli:PORT:STATE` for the CLI, else a path.
fn destination(q: &LoginQuery) -> Result<String, &'static str> {
    match (q.cli_port, q.cli_state.as_deref()) {
        (None, None) => Ok(safe_next(q.next.as_deref())),
        (Some(port), Some(state))
            if port != 0
                && (16..=128).contains(&state.len())
                && state
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
        {
            Ok(format!("cli:{port}:{state}"))
        }
        _ => Err("cli_port and cli_state go together (a port, and 16-128 letters, digits, - or _)"),
    }
}

/// Where to go after signing in: a path of this CA with its query and
/// fragment, else `/`.
///
/// A browser reading `Location` drops tab, CR and LF anywhere and controls
/// and spaces at the ends, and takes `\\` for `/`, so `"/\t/evil.example"`
/// leaves the origin: a control, whitespace or backslash anywhere refuses
/// `next`. The rest is resolved against a fixed origin as a browser would
/// (WHATWG URL) and must stay on it, with a path that is still one path of
/// it however often it is percent-decoded (a proxy or server may decode it
/// again), and the result is what the `Location` header says.
fn safe_next(next: Option<&str>) -> String {
    next.and_then(own_path).unwrap_or_else(|| "/".to_owned())
}

/// The origin `next` is resolved against: any fixed one does, only whether
/// the result stays on it matters.
const NEXT_BASE: &str = "https://ca.invalid/";

/// `next` as path, query and fragment of this origin, if it is one.
fn own_path(next: &str) -> Option<String> {
    if !one_path(next) {
        return None;
    }
    let base = url::Url::parse(NEXT_BASE).ok()?;
    let to = base.join(next).ok()?;
    if to.origin() != base.origin() || !to.username().is_empty() || to.password().is_some() {
        return None;
    }
    // Dot segments are resolved now (`/.//x` is path `//x`): checked again.
    if !decodes_to_one_path(to.path()) {
        return None;
    }
    let mut out = to.path().to_owned();
    if let Some(q) = to.query() {
        out.push('?');
        out.push_str(q);
    }
    if let Some(f) = to.fragment() {
        out.push('#');
        out.push_str(f);
    }
    Some(out)
}

/// Starts with one `/` (`//` names a host) and holds no control,
/// whitespace or backslash.
fn one_path(s: &str) -> bool {
    s.starts_with('/')
        && !s.starts_with("//")
        && !s
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || c == '\\')
}

/// `one_path` holds for `path` and for each form percent-decoding it
/// yields, up to a few rounds (more is refused).
fn decodes_to_one_path(path: &str) -> bool {
    let mut layer = path.to_owned();
    for _ in 0..4 {
        if !one_path(&layer) {
            return false;
        }
        let decoded = percent_encoding::percent_decode_str(&layer)
            .decode_utf8_lossy()
            .into_owned();
        if decoded == layer {
            return true;
        }
        layer = decoded;
    }
    false
}

/// The document of an HTML page answered with `what`.
fn page_doc(what: &str) -> serde_json::Value {
    json!({"description": what,
    "content": {"text/html": {"schema": {"type": "string"}}}})
}

/// The document of a redirect to `to`.
fn redirect_doc(to: &str) -> serde_json::Value {
    json!({"description": format!("redirect to {to}"),
    "headers": {"Location": {"schema": {"type": "string"}}}})
}

/// `GET /auth/login`, served by `login`, and its document.
pub(crate) fn login_route() -> Route {
    route(
        Op {
            method: crate::api::route::Method::Get,
            path: "/auth/login",
            auth: Auth::None,
            spec: json!({
                "operationId": "signIn",
                "summary": "Sign in: to the OpenID provider (authorization code flow with PKCE)",
                "tags": ["sign-in"],
                "parameters": [
                    {"name": "provider", "in": "query", "required": false, "description": "an `[[oidc]]` name (default: the first)", "schema": {"type": "string"}},
                    {"name": "next", "in": "query", "required": false, "description": "a path of this CA to return to, with its query and fragment (default `/`); one with a control character, whitespace or backslash anywhere, or whose path resolves or percent-decodes to another host, returns to `/`", "schema": {"type": "string"}},
                ],
                "responses": {"303": redirect_doc("the provider's authorization endpoint"),
                    "404": page_doc("no such provider"), "429": page_doc("too many sign-ins started from this source or in all (`Retry-After`)"), "502": page_doc("the provider could not be reached"),
                    "503": page_doc("the store does not answer")},
            }),
        },
        login,
    )
}

/// `GET /auth/login`: to the provider's sign-in page. Each call keeps a
/// store row for ten minutes, so calls are throttled per source and in all
/// (`[limits] login_per_source_per_minute`, `login_per_second`).
pub async fn login(
    State(a): State<Shared>,
    peer: Option<axum::Extension<crate::api::listen::Peer>>,
    Query(q): Query<LoginQuery>,
) -> Response {
    let Some(p) = provider(&a, q.provider.as_deref()) else {
        return page(
            StatusCode::NOT_FOUND,
            "Sign-in is not available",
            "This CA has no such OpenID provider ([[oidc]] in its configuration); use an API token.",
        );
    };
    let source = peer.map(|p| p.0.0.ip());
    if let Err(refused) = trust::throttle::failed(&a, crate::state::limits::Guarded::Login, source)
    {
        let mut r = page(
            StatusCode::TOO_MANY_REQUESTS,
            "Sign-in failed",
            "Too many sign-ins were started; retry in a minute.",
        );
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(refused.retry_after_s),
        );
        return r;
    }
    let next = match destination(&q) {
        Ok(n) => n,
        Err(m) => return page(StatusCode::BAD_REQUEST, "Sign-in failed", m),
    };
    let (url, pending) = match a.oidc().begin(&p).await {
        Ok(x) => x,
        Err(e) => {
            tracing::warn!(provider = %p.name, error = %e, "sign-in could not start");
            return page(StatusCode::BAD_GATEWAY, "Sign-in failed", &e.to_string());
        }
    };
    let now = crate::ground::clock::now_ms();
    let record = LoginRecord {
        state_sha256: crate::ground::digest::sha256_hex(pending.state.as_bytes()),
        provider: p.name.clone(),
        verifier: pending.verifier.clone(),
        nonce: pending.nonce.clone(),
        next,
        expires_ms: now + LOGIN_TTL_MS,
    };
    match a.blocking(move |a| a.store().put_login(&record, now)).await {
        Some(Ok(())) => {}
        _ => return store_down(),
    }
    let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, url)]).into_response();
    if let Ok(v) = HeaderValue::from_str(&login_cookie(
        https(&a),
        &pending.state,
        LOGIN_TTL_MS / 1000,
    )) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

fn store_down() -> Response {
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        "Sign-in failed",
        "The CA's store (database) does not answer; retry later.",
    )
}

/// `GET /auth/callback` parameters.
#[derive(Debug, Deserialize)]
pub struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// `GET /auth/callback`, served by `callback`, and its document.
pub(crate) fn callback_route() -> Route {
    route(
        Op {
            method: crate::api::route::Method::Get,
            path: "/auth/callback",
            auth: Auth::None,
            spec: json!({
                "operationId": "signInCallback",
                "summary": "The provider's redirect back: verifies the ID token, maps roles, opens the session",
                "description": "Sets the session cookie (`__Host-reach_session`: `Secure; HttpOnly; SameSite=Lax; Path=/`, `[[oidc]] session_lifetime_s`). For a sign-in the CLI started, sets no cookie and redirects to its loopback listener with a one-time `code` (and its `state`) that it exchanges with `POST /auth/cli`. A person whose roles claim maps to no scope gets a 403 page.",
                "tags": ["sign-in"],
                "parameters": [
                    {"name": "code", "in": "query", "required": false, "schema": {"type": "string"}},
                    {"name": "state", "in": "query", "required": false, "schema": {"type": "string"}},
                    {"name": "error", "in": "query", "required": false, "schema": {"type": "string"}},
                    {"name": "error_description", "in": "query", "required": false, "schema": {"type": "string"}},
                ],
                "responses": {"303": redirect_doc("the `next` path, signed in"),
                    "403": page_doc("sign-in refused (no mapped role, a token that does not verify, a sign-in not started in this browser)"),
                    "503": page_doc("the store does not answer")},
            }),
        },
        callback,
    )
}

/// `GET /auth/callback`: back from the provider; opens the session.
pub async fn callback(
    State(a): State<Shared>,
    headers: HeaderMap,
    peer: Option<axum::Extension<crate::api::listen::Peer>>,
    Query(q): Query<CallbackQuery>,
) -> Response {
    let fail = |text: String| page(StatusCode::FORBIDDEN, "Sign-in failed", &text);
    if let Some(e) = q.error {
        let more = q.error_description.unwrap_or_default();
        return fail(format!("the OpenID provider refused: {e} {more}"));
    }
    let (Some(code), Some(state)) = (q.code, q.state) else {
        return fail("the provider's answer has no code or state".into());
    };
    let bound = cookie(&headers, login_cookie_name(https(&a)))
        .is_some_and(|c| crate::ground::secret::Secret::new(c).matches(state.as_bytes()));
    if !bound {
        return fail("this sign-in was not started in this browser (or it took over 10 minutes); sign in again".into());
    }
    let hash = crate::ground::digest::sha256_hex(state.as_bytes());
    let now = crate::ground::clock::now_ms();
    let login = match a.blocking(move |a| a.store().take_login(&hash, now)).await {
        // A CLI code is no sign-in state.
        Some(Ok(Some(l))) if l.next.starts_with(CLI_CODE) => {
            return fail("this sign-in expired or was used already; sign in again".into());
        }
        Some(Ok(Some(l))) => l,
        Some(Ok(None)) => {
            return fail("this sign-in expired or was used already; sign in again".into());
        }
        _ => return store_down(),
    };
    let Some(p) = provider(&a, Some(&login.provider)) else {
        return fail(format!(
            "provider {:?} is no longer configured",
            login.provider
        ));
    };
    let pending = Pending {
        state,
        verifier: login.verifier.clone(),
        nonce: login.nonce.clone(),
    };
    let source = peer.map(|p| p.0.0.ip());
    let person = match a.oidc().finish(&p, &pending, &code).await {
        Ok(person) => person,
        Err(e) => {
            tracing::warn!(provider = %p.name, error = %e, "sign-in refused");
            let nobody = Actor::unknown("sign-in");
            if !refused_sign_in(&a, nobody, &p.name, source, e.to_string()).await {
                return store_down();
            }
            return fail(e.to_string());
        }
    };
    match crate::credentials::oidc::admitted(&p, person) {
        Ok(person) => open_session(&a, &p, person, &login.next, source).await,
        Err(e) => {
            tracing::warn!(provider = %p.name, error = %e, "sign-in refused");
            let who = match &e {
                SignInError::NoRole { name, subject, .. } => {
                    Actor::person(name.clone(), p.name.clone(), subject.clone())
                }
                _ => Actor::unknown("sign-in"),
            };
            if !refused_sign_in(&a, who, &p.name, source, e.to_string()).await {
                return store_down();
            }
            page(
                StatusCode::FORBIDDEN,
                "No access",
                &format!("{e}. Ask an administrator for a role."),
            )
        }
    }
}

/// Records a refused sign-in at `provider` (`session.sign_in`, `refused`,
/// why as the detail); false when the trail cannot be written.
async fn refused_sign_in(
    a: &Shared,
    who: Actor,
    provider: &str,
    source: Option<std::net::IpAddr>,
    why: String,
) -> bool {
    let provider = provider.to_owned();
    let recorded = a
        .blocking(move |a| {
            trust::audit::record(
                a,
                &AdminAction {
                    actor: &who,
                    source,
                    action: "session.sign_in",
                    target: &provider,
                    outcome: Outcome::Refused,
                    detail: why,
                },
            )
        })
        .await;
    matches!(recorded, Some(Ok(())))
}

/// Stores a new session for `person` and answers with its cookie and a
/// redirect to `next`.
async fn open_session(
    a: &Shared,
    p: &ProviderConfig,
    person: crate::credentials::oidc::Person,
    next: &str,
    source: Option<std::net::IpAddr>,
) -> Response {
    let id = crate::ground::digest::hex(&rand::random::<[u8; 32]>());
    let now = crate::ground::clock::now_ms();
    let cli = next.strip_prefix("cli:").and_then(|r| r.split_once(':'));
    let mut lifetime_ms = i64::try_from(p.session_lifetime_ms).unwrap_or(i64::MAX);
    if cli.is_some() {
        lifetime_ms = lifetime_ms.min(CLI_LIFETIME_MS);
    }
    let record = SessionRecord {
        id_sha256: crate::ground::digest::sha256_hex(id.as_bytes()),
        person: person.name.clone(),
        provider: p.name.clone(),
        subject: person.subject.clone(),
        scopes: person
            .scopes
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        created_ms: now,
        expires_ms: now.saturating_add(lifetime_ms),
        revoked_ms: None,
        sid: person.sid.clone(),
        roles: Some(serde_json::Value::from(person.roles.clone()).to_string()),
        checked_ms: now,
        refresh_sealed: person
            .credential
            .as_ref()
            .and_then(|c| crate::api::sessions::seal(&id, &c.to_text())),
    };
    let detail = format!("scopes: {}", record.scopes);
    let provider = p.name.clone();
    let who = Actor::person(person.name.clone(), p.name.clone(), person.subject.clone());
    let stored = a
        .blocking(move |a| {
            let r = a.store().create_session(&record);
            let recorded = trust::audit::record(
                a,
                &AdminAction {
                    actor: &who,
                    source,
                    action: "session.sign_in",
                    target: &provider,
                    outcome: if r.is_ok() {
                        Outcome::Ok
                    } else {
                        Outcome::Failed
                    },
                    detail,
                },
            );
            // Unrecorded, the session is never handed out.
            r.and(recorded)
        })
        .await;
    if !matches!(stored, Some(Ok(()))) {
        return store_down();
    }
    if let Some((port, state)) = cli {
        return to_cli(a, id, port, state, now.saturating_add(lifetime_ms), now).await;
    }
    let mut r = (StatusCode::SEE_OTHER, [(header::LOCATION, next.to_owned())]).into_response();
    let h = r.headers_mut();
    let tls = https(a);
    for c in [
        session_cookie(tls, &id, lifetime_ms / 1000),
        login_cookie(tls, "", 0),
    ] {
        if let Ok(v) = HeaderValue::from_str(&c) {
            h.append(header::SET_COOKIE, v);
        }
    }
    r
}

/// The redirect to the CLI's loopback listener on `port` with a one-time
/// code for session `id`, never the session (a URL stays in the browser's
/// history); no cookie in this browser.
async fn to_cli(
    a: &Shared,
    id: String,
    port: &str,
    state: &str,
    expires_ms: i64,
    now: i64,
) -> Response {
    let code = crate::ground::digest::hex(&rand::random::<[u8; 32]>());
    let (c, st) = (code.clone(), state.to_owned());
    let put = a
        .blocking(move |a| issue_cli_code(a, &c, &st, &id, expires_ms, now))
        .await;
    if !matches!(put, Some(Ok(()))) {
        return store_down();
    }
    let to = format!("http://127.0.0.1:{port}/?code={code}&state={state}");
    (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
}

/// Stores `code`, exchangeable once within [`CLI_CODE_TTL_MS`] of `now_ms`
/// by the CLI that sent `state`, for the session `id` ending at
/// `expires_ms`. The store keeps the code's SHA-256 only; the session id
/// waits in the row until the exchange deletes it (or it expires).
pub fn issue_cli_code(
    a: &Authority,
    code: &str,
    state: &str,
    id: &str,
    expires_ms: i64,
    now_ms: i64,
) -> Result<(), crate::store::StoreError> {
    a.store().put_login(
        &LoginRecord {
            state_sha256: crate::ground::digest::sha256_hex(code.as_bytes()),
            provider: String::new(),
            verifier: id.to_owned(),
            nonce: crate::ground::digest::sha256_hex(state.as_bytes()),
            next: format!("{CLI_CODE}{expires_ms}"),
            expires_ms: now_ms.saturating_add(CLI_CODE_TTL_MS),
        },
        now_ms,
    )
}

/// What a CLI code is exchanged for.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CliCredential {
    /// The session id (the session cookie's value).
    pub credential: String,
    /// Its CSRF token.
    pub csrf_token: String,
    /// When the session ends, Unix ms.
    pub expires_at: i64,
}

/// The credential `code` stands for, taken (a second exchange finds
/// nothing): `None` when it is unknown, used, past its lifetime at
/// `now_ms`, or not issued to the CLI that sent `state`.
pub fn exchange_cli_code(
    a: &Authority,
    code: &str,
    state: &str,
    now_ms: i64,
) -> Result<Option<CliCredential>, crate::store::StoreError> {
    let hash = crate::ground::digest::sha256_hex(code.as_bytes());
    let Some(r) = a.store().take_login(&hash, now_ms)? else {
        return Ok(None);
    };
    let state_hash = crate::ground::digest::sha256_hex(state.as_bytes());
    let ends = r.next.strip_prefix(CLI_CODE).and_then(|e| e.parse().ok());
    Ok(match ends {
        Some(expires_at)
            if crate::ground::secret::Secret::new(r.nonce).matches(state_hash.as_bytes()) =>
        {
            Some(CliCredential {
                csrf_token: csrf_of(&r.verifier),
                credential: r.verifier,
                expires_at,
            })
        }
        _ => None,
    })
}

/// `POST /auth/cli` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CliExchange {
    code: String,
    state: String,
}

/// `POST /auth/cli`, served by `cli_exchange`, and its document.
pub(crate) fn cli_exchange_route() -> Route {
    route(
        Op {
            method: crate::api::route::Method::Post,
            path: "/auth/cli",
            auth: Auth::None,
            spec: json!({
                "operationId": "signInCliExchange",
                "summary": "The CLI exchanges the one-time code its loopback listener received for its credential",
                "description": "The code is good once, for a minute, and only with the `state` of the CLI that started the sign-in (`cli_state`); the credential (a session of at most an hour) is never in a URL.",
                "tags": ["sign-in"],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": false, "required": ["code", "state"],
                    "properties": {"code": {"type": "string"}, "state": {"type": "string"}}}}}},
                "responses": {"200": {"description": "the credential",
                    "content": {"application/json": {"schema": {"type": "object",
                        "properties": {"credential": {"type": "string"}, "csrf_token": {"type": "string"},
                            "expires_at": {"type": "integer", "description": "Unix ms"}}},
                        "example": {"credential": "9f1c…", "csrf_token": "2b63…", "expires_at": 1_764_003_600_000u64}}}},
                    "400": error_ref("InvalidRequest"),
                    "403": {"description": "the code is unknown, used, over a minute old or not this CLI's (reason `invalid_code`)",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
                    "503": error_ref("Unavailable")},
            }),
        },
        cli_exchange,
    )
}

/// `POST /auth/cli`: the CLI exchanges the one-time code its loopback
/// listener received (with its `state`) for its credential.
pub async fn cli_exchange(State(a): State<Shared>, body: axum::body::Bytes) -> Response {
    let q: CliExchange = match serde_json::from_slice(&body) {
        Ok(q) => q,
        Err(e) => {
            return crate::api::body::error_body(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                &format!("expected {{\"code\", \"state\"}}: {e}"),
                None,
            );
        }
    };
    let now = crate::ground::clock::now_ms();
    match a
        .blocking(move |a| exchange_cli_code(a, &q.code, &q.state, now))
        .await
    {
        Some(Ok(Some(c))) => axum::Json(c).into_response(),
        Some(Ok(None)) => crate::api::body::error_body(
            StatusCode::FORBIDDEN,
            "invalid_code",
            "this sign-in code is unknown, used already, over a minute old, or not this terminal's; run `api login` again",
            None,
        ),
        _ => crate::error::ApiError::StoreUnavailable.into_response(),
    }
}

/// `POST /auth/logout`, served by `logout`, and its document.
pub(crate) fn logout_route() -> Route {
    route(
        Op {
            method: crate::api::route::Method::Post,
            path: "/auth/logout",
            auth: Auth::None,
            spec: json!({
                "operationId": "signOut",
                "summary": "Sign out: the session is revoked on every replica and its cookie removed",
                "description": "Needs the session's `X-CSRF-Token`.",
                "tags": ["sign-in"],
                "responses": {"200": {"description": "signed out (`signed_out`: whether a session was open)",
                    "content": {"application/json": {"schema": {"type": "object",
                        "properties": {"signed_out": {"type": "boolean"}}}, "example": {"signed_out": true}}}},
                    "401": error_ref("Unauthorized")},
            }),
        },
        logout,
    )
}

/// `POST /auth/logout`: revokes the session (on every replica) and
/// removes its cookie.
pub async fn logout(
    State(a): State<Shared>,
    method: Method,
    headers: HeaderMap,
    peer: Option<axum::Extension<crate::api::listen::Peer>>,
) -> Response {
    let session = match session_of(&a, &headers).await {
        None | Some(Err(AuthError::SessionEnded)) => None,
        Some(Err(e)) => return crate::error::ApiError::Auth(e).into_response(),
        Some(Ok(s)) => Some(s),
    };
    if let Some(s) = &session {
        if let Err(e) = check_csrf(&method, &headers, s) {
            return crate::error::ApiError::Auth(e).into_response();
        }
        let s = s.clone();
        let source = peer.map(|p| p.0.0.ip());
        let now = crate::ground::clock::now_ms();
        let done = a
            .blocking(move |a| {
                let r = a.store().revoke_session(&s.id_sha256, now);
                let recorded = trust::audit::record(
                    a,
                    &AdminAction {
                        actor: &Actor::person(
                            s.person.clone(),
                            s.provider.clone(),
                            s.subject.clone(),
                        ),
                        source,
                        action: "session.sign_out",
                        target: "",
                        outcome: if r.is_ok() {
                            Outcome::Ok
                        } else {
                            Outcome::Failed
                        },
                        detail: String::new(),
                    },
                );
                // The session ends either way; an unrecorded sign-out is
                // not answered as done.
                r.and_then(|ended| recorded.map(|()| ended))
            })
            .await;
        if !matches!(done, Some(Ok(_))) {
            return crate::error::ApiError::Auth(AuthError::Unavailable).into_response();
        }
    }
    let mut r = axum::Json(json!({ "signed_out": session.is_some() })).into_response();
    if let Ok(v) = HeaderValue::from_str(&session_cookie(https(&a), "", 0)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

/// `GET /auth/session`, served by `session`, and its document.
pub(crate) fn session_route() -> Route {
    route(
        Op {
            method: crate::api::route::Method::Get,
            path: "/auth/session",
            auth: Auth::None,
            spec: json!({
                "operationId": "whoAmI",
                "summary": "Who is signed in with this browser's session cookie, and the session's CSRF token",
                "tags": ["sign-in"],
                "responses": {"200": {"description": "`person` null when nobody is signed in",
                    "content": {"application/json": {"schema": {"type": "object", "properties": {
                        "person": {"type": ["string", "null"]},
                        "scopes": {"type": "array", "items": {"type": "string"}},
                        "csrf_token": {"type": ["string", "null"]},
                        "expires_at": {"type": ["integer", "null"], "description": "Unix ms"},
                        "providers": {"type": "array", "items": {"type": "string"}}}},
                        "example": {"person": "alice", "scopes": ["admin"], "csrf_token": "2b63…",
                            "expires_at": 1_764_028_800_000u64, "providers": ["corp"]}}}}},
            }),
        },
        session,
    )
}

/// `GET /auth/session`: who is signed in with this browser's cookie
/// (`person` null when nobody), their scopes, the CSRF token to send in
/// `X-CSRF-Token`, and the providers one can sign in with.
pub async fn session(State(a): State<Shared>, headers: HeaderMap) -> Response {
    let providers: Vec<String> = a
        .snapshot()
        .config
        .oidc
        .iter()
        .map(|p| p.name.clone())
        .collect();
    let body = match session_of(&a, &headers).await {
        Some(Ok(s)) => json!({
            "person": s.person,
            "scopes": s.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            "csrf_token": s.csrf,
            "expires_at": s.expires_ms,
            "providers": providers,
        }),
        _ => {
            json!({ "person": null, "scopes": [], "csrf_token": null, "expires_at": null, "providers": providers })
        }
    };
    axum::Json(body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_read_by_name() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; __Host-reach_session=abc; b=2"),
        );
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "c"), None);
    }

    /// `next` values a browser would follow off this CA's origin: WHATWG
    /// URL parsing drops tab, CR and LF anywhere and C0 controls and spaces
    /// at the ends, reads `\\` as `/`, and treats `.` and `%2e` segments as
    /// dots; encoded forms are what a server or proxy that decodes once
    /// more would see.
    const HOSTILE_NEXT: &[&str] = &[
        "",
        "x",
        "evil.example",
        "//evil.example",
        "///evil.example",
        "https://evil.example",
        "javascript:alert(1)",
        "cli:4000:abcdefghijklmnop",
        "/\\evil.example",
        "/\\/evil.example",
        "\\/evil.example",
        "/\t/evil.example",
        "/\n/evil.example",
        "/\r/evil.example",
        "/\r\n/evil.example",
        "\t//evil.example",
        " //evil.example",
        "/ /evil.example",
        "/\t\\evil.example",
        "/\u{0}/evil.example",
        "/\u{b}/evil.example",
        "/\u{c}/evil.example",
        "/\u{7f}/evil.example",
        "/\u{85}/evil.example",
        "/\u{a0}/evil.example",
        "/\u{2028}/evil.example",
        "/\u{3000}/evil.example",
        "/app\n",
        "/app?x=\t1",
        "/app#\r",
        "/%09/evil.example",
        "/%0a/evil.example",
        "/%0D/evil.example",
        "/%20/evil.example",
        "/%5Cevil.example",
        "/%5c/evil.example",
        "/%2F/evil.example",
        "/%2f%2fevil.example",
        "%2F%2Fevil.example",
        "/%252F/evil.example",
        "/%2509/evil.example",
        "/%255Cevil.example",
        "/%C2%A0/evil.example",
        "/.//evil.example",
        "/..//evil.example",
        "/%2e//evil.example",
        "/app/..//evil.example",
    ];

    #[test]
    fn only_own_paths_are_followed_after_sign_in() {
        let followed: Vec<(&str, String)> = HOSTILE_NEXT
            .iter()
            .map(|bad| (*bad, safe_next(Some(bad))))
            .filter(|(_, to)| to != "/")
            .collect();
        assert!(followed.is_empty(), "followed: {followed:?}");
        for (good, kept) in [
            ("/", "/"),
            ("/app?x=1", "/app?x=1"),
            ("/connectors", "/connectors"),
            ("/?q=a%20b&sort=name", "/?q=a%20b&sort=name"),
            ("/app?name=web%2Fapi#top", "/app?name=web%2Fapi#top"),
            ("/app?next=//evil.example", "/app?next=//evil.example"),
            ("/a/../connectors", "/connectors"),
        ] {
            assert_eq!(safe_next(Some(good)), kept, "{good:?}");
        }
        assert_eq!(safe_next(None), "/");
    }

    #[test]
    fn cli_sign_ins_name_a_port_and_a_state() {
        let q = |port: Option<u16>, state: Option<&str>| LoginQuery {
            provider: None,
            next: Some("/app".into()),
            cli_port: port,
            cli_state: state.map(str::to_owned),
        };
        assert_eq!(destination(&q(None, None)).as_deref(), Ok("/app"));
        let state = "abcdefghijklmnop";
        assert_eq!(
            destination(&q(Some(4000), Some(state))),
            Ok(format!("cli:4000:{state}"))
        );
        assert!(destination(&q(Some(4000), None)).is_err());
        assert!(destination(&q(Some(4000), Some("short"))).is_err());
        assert!(destination(&q(Some(4000), Some("abcdefghijklmnop&x=1"))).is_err());
        assert!(destination(&q(Some(0), Some(state))).is_err());
    }

    /// A CLI code is exchanged once, only within its lifetime, and only by
    /// the CLI whose state it was issued for.
    #[test]
    fn cli_codes_are_single_use_short_lived_and_bound_to_the_cli() {
        let config = crate::Config::from_toml(
            "[server]\nallow_short_secrets = true\n",
            std::path::Path::new("."),
        )
        .expect("valid");
        let a = Authority::with_trust(config, None, crate::store::Store::in_memory().expect("db"));
        let t0 = 1_000_000;
        issue_cli_code(&a, "code-1", "state-1", "session-1", t0 + 3_600_000, t0).expect("put");
        assert_eq!(
            exchange_cli_code(&a, "code-1", "state-2", t0 + 1).expect("read"),
            None,
            "another terminal's state"
        );
        issue_cli_code(&a, "code-1", "state-1", "session-1", t0 + 3_600_000, t0).expect("put");
        let got = exchange_cli_code(&a, "code-1", "state-1", t0 + 1).expect("read");
        assert_eq!(
            got,
            Some(CliCredential {
                credential: "session-1".into(),
                csrf_token: csrf_of("session-1"),
                expires_at: t0 + 3_600_000,
            })
        );
        assert_eq!(
            exchange_cli_code(&a, "code-1", "state-1", t0 + 2).expect("read"),
            None,
            "used once already"
        );
        issue_cli_code(&a, "code-2", "state-1", "session-2", t0 + 3_600_000, t0).expect("put");
        assert_eq!(
            exchange_cli_code(&a, "code-2", "state-1", t0 + CLI_CODE_TTL_MS + 1).expect("read"),
            None,
            "past its lifetime"
        );
    }

    #[test]
    fn mutations_need_the_sessions_csrf_token() {
        let s = Session {
            person: "alice".into(),
            provider: "corp".into(),
            subject: "1".into(),
            scopes: vec![Scope::Admin],
            id_sha256: String::new(),
            csrf: csrf_of("id"),
            expires_ms: 0,
        };
        let mut h = HeaderMap::new();
        assert!(check_csrf(&Method::GET, &h, &s).is_ok());
        assert_eq!(check_csrf(&Method::POST, &h, &s), Err(AuthError::Csrf));
        h.insert(CSRF_HEADER, HeaderValue::from_static("wrong"));
        assert_eq!(check_csrf(&Method::DELETE, &h, &s), Err(AuthError::Csrf));
        h.insert(
            CSRF_HEADER,
            HeaderValue::from_str(&csrf_of("id")).expect("hex"),
        );
        assert!(check_csrf(&Method::POST, &h, &s).is_ok());
    }
}
