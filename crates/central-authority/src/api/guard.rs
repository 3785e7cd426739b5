//! The layer every HTTP request passes around its route: request bodies
//! must be JSON, state changes (POST, PUT, PATCH, DELETE) must not come
//! from another origin, and every error answer is the API's JSON error
//! (`{"error":{"reason","message"}}`), also those axum makes itself (no
//! route, wrong method, a path it cannot decode).
//!
//! Why: an API token can reach the CA without the page's script knowing it
//! (a proxy that adds `Authorization` for the dashboard, as the docs
//! suggest). A cross-site HTML form can POST `text/plain` or form data to
//! any URL without a CORS preflight; requiring `application/json` makes such
//! a request a "non-simple" one the browser will not send cross-origin
//! without the CA's consent (which it never gives), and the `Origin` /
//! `Sec-Fetch-Site` check refuses what a browser marks as cross-origin even
//! when no body is sent. Clients that send no `Origin` (curl, scripts, the
//! `api` CLI) are not browsers acting for another site and pass.
//!
//! One exception: the OpenID provider's back-channel logout (`POST
//! /auth/backchannel-logout`) is a form, as its spec says; it changes
//! nothing a cookie authorizes (its own signed token decides), so a form
//! body is taken there.

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

/// The reason of a body that is not JSON (415).
pub const UNSUPPORTED_MEDIA_TYPE: &str = "unsupported_media_type";
/// The reason of a refused cross-origin state change (403).
pub const CROSS_ORIGIN: &str = "cross_origin";
/// The reason of a request without `Host`, or with one that is not among
/// `[server] public_names` (400).
pub const UNKNOWN_HOST: &str = "unknown_host";

/// The reason of a path no route serves (404).
pub const NO_ROUTE: &str = "no_route";
/// The reason of a method the path does not serve (405).
pub const METHOD_NOT_ALLOWED: &str = "method_not_allowed";

/// Runs the checks, then the route; a non-JSON error answer becomes JSON,
/// and every answer gets the headers of [`with_api_headers`] (and, over
/// HTTPS, `Strict-Transport-Security`).
pub async fn check(
    axum::extract::State(authority): axum::extract::State<
        std::sync::Arc<crate::state::authority::Authority>,
    >,
    request: Request<Body>,
    next: Next,
) -> Response {
    let snapshot = authority.snapshot();
    let site = Site {
        https: authority.pki().is_some(),
        public_names: &snapshot.settings().public_names,
    };
    let judged = verdict(
        request.method(),
        request.headers(),
        request.uri(),
        request.version(),
        has_body(&request),
        &site,
    );
    let response = match judged {
        Ok(()) => as_json_error(next.run(request).await).await,
        Err((status, reason, message)) => {
            crate::api::body::error_body(status, reason, &message, None)
        }
    };
    let mut response = with_api_headers(response);
    if site.https {
        // A browser that once reached the CA over HTTPS never tries plain
        // HTTP for it again (a year; the CA's name only, its siblings are
        // not the CA's to decide).
        response.headers_mut().insert(
            header::STRICT_TRANSPORT_SECURITY,
            header::HeaderValue::from_static("max-age=31536000"),
        );
    }
    response
}

/// `X-Content-Type-Options: nosniff` on every answer, and
/// `Cache-Control: no-store` on JSON ones (tokens' answers must not sit in
/// a shared or browser cache) that did not set their own.
pub fn with_api_headers(mut response: Response) -> Response {
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json);
    let headers = response.headers_mut();
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    if json && !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
    }
    response
}

/// How the CA is reached: over HTTPS or plain HTTP, and by which names
/// (`[server] public_names`; empty: any).
#[derive(Debug)]
pub struct Site<'a> {
    /// The listener speaks TLS (the origin's scheme is `https`).
    pub https: bool,
    /// Normalised `(host, port)` pairs; a name without a port is accepted
    /// on any port (a `Host` without one means the scheme's).
    pub public_names: &'a [(String, Option<u16>)],
}

impl Site<'_> {
    fn scheme(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }

    fn default_port(&self) -> u16 {
        if self.https { 443 } else { 80 }
    }

    /// `authority` as (host, port), the port defaulted to the scheme's.
    fn endpoint(&self, authority: &str) -> Option<(String, u16)> {
        let (host, port) = policy::host::parse_authority(authority).ok()?;
        Some((host.into_string(), port.unwrap_or(self.default_port())))
    }

    /// Whether `authority` (a Host header) is one of the public names.
    fn is_public(&self, authority: &str) -> bool {
        if self.public_names.is_empty() {
            return true;
        }
        let Some(asked) = self.endpoint(authority) else {
            return false;
        };
        self.public_names
            .iter()
            .any(|(h, p)| *h == asked.0 && p.is_none_or(|p| p == asked.1))
    }
}

/// An error answer that is not JSON (axum's own rejections: plain text or
/// empty) rewritten as the API's JSON error with the same status.
async fn as_json_error(response: Response) -> Response {
    let status = response.status();
    let content_type = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    // JSON errors, and the sign-in's HTML pages for a browser (`api::auth`).
    let is_json = content_type.is_some_and(is_json);
    let is_page = content_type.is_some_and(|t| t.starts_with("text/html"));
    if !(status.is_client_error() || status.is_server_error()) || is_json || is_page {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let text = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let (reason, fallback) = match status {
        StatusCode::NOT_FOUND => (NO_ROUTE, "no such route".to_owned()),
        StatusCode::METHOD_NOT_ALLOWED => (
            METHOD_NOT_ALLOWED,
            "this path does not serve that method".to_owned(),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (UNSUPPORTED_MEDIA_TYPE, String::new()),
        s if s.is_server_error() => ("internal", "internal error".to_owned()),
        _ => ("invalid_request", "invalid request".to_owned()),
    };
    let message = if text.is_empty() {
        fallback
    } else {
        clip(&text)
    };
    let mut out = crate::api::body::error_body(status, reason, &message, None);
    if let Some(allow) = allow {
        out.headers_mut().insert(header::ALLOW, allow);
    }
    out
}

/// Whether the request carries a body: a positive `Content-Length`, or a
/// body whose size is not known to be zero.
fn has_body(request: &Request<Body>) -> bool {
    use axum::body::HttpBody as _;
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(n) => n > 0,
        None => request.body().size_hint().exact() != Some(0),
    }
}

type Refusal = (StatusCode, &'static str, String);

/// The guard's decision on a request's method, headers, URI and whether it
/// has a body.
pub fn verdict(
    method: &Method,
    headers: &HeaderMap,
    uri: &axum::http::Uri,
    version: axum::http::Version,
    has_body: bool,
    site: &Site<'_>,
) -> Result<(), Refusal> {
    let host = host(headers, uri, version, site)?;
    let changes_state = matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    let content_type = headers.get(header::CONTENT_TYPE);
    // Any method: the router answers the others 405.
    if uri.path() == crate::api::sessions::BACKCHANNEL_PATH
        && content_type.is_some_and(|v| {
            v.as_bytes()
                .starts_with(b"application/x-www-form-urlencoded")
        })
    {
        return Ok(());
    }
    if has_body || (changes_state && content_type.is_some()) {
        let shown = content_type.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        if !shown.as_deref().is_some_and(is_json) {
            let got = match shown {
                Some(v) => format!("got {:?}", clip(&v)),
                None => "no Content-Type was sent".to_owned(),
            };
            return Err((
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "request bodies must be JSON: send `Content-Type: application/json` ({got})"
                ),
            ));
        }
    }
    if !changes_state {
        return Ok(());
    }
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = String::from_utf8_lossy(site.as_bytes()).to_ascii_lowercase();
        if site == "cross-site" || site == "same-site" {
            return Err((
                StatusCode::FORBIDDEN,
                CROSS_ORIGIN,
                format!(
                    "cross-origin state change refused: the browser marked this request \
                     `Sec-Fetch-Site: {site}`; {method} requests are accepted only from the \
                     CA's own origin or from clients that send no Origin (curl, scripts)"
                ),
            ));
        }
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
    if same_origin(&origin, host.as_deref(), site) {
        return Ok(());
    }
    Err((
        StatusCode::FORBIDDEN,
        CROSS_ORIGIN,
        format!(
            "cross-origin state change refused: Origin {:?} is not this server ({}://{}); \
             {method} requests are accepted only from the CA's own origin or from clients that send no \
             Origin (curl, scripts)",
            clip(&origin),
            site.scheme(),
            match &host {
                Some(h) => format!("Host {:?}", clip(h)),
                None => "no Host header".to_owned(),
            }
        ),
    ))
}

/// The request's `Host` (HTTP/2: `:authority`), refused when HTTP/1.1
/// leaves it out or when it is not one of the site's public names.
fn host(
    headers: &HeaderMap,
    uri: &axum::http::Uri,
    version: axum::http::Version,
    site: &Site<'_>,
) -> Result<Option<String>, Refusal> {
    let host = headers
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .or_else(|| uri.authority().map(|a| a.as_str().to_owned()));
    match &host {
        None if version == axum::http::Version::HTTP_11 => {
            return Err((
                StatusCode::BAD_REQUEST,
                UNKNOWN_HOST,
                "no Host header: HTTP/1.1 requests must name the host they are for".to_owned(),
            ));
        }
        Some(h) if !site.is_public(h) => {
            return Err((
                StatusCode::BAD_REQUEST,
                UNKNOWN_HOST,
                format!(
                    "Host {:?} is not a name this CA is reached by (`[server] public_names`)",
                    clip(h)
                ),
            ));
        }
        _ => {}
    }
    Ok(host)
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// Whether `origin` (`scheme://host[:port]`) is this server's origin:
/// the scheme the listener serves, and the host and port of the request's
/// `Host`. A port left out means the scheme's default port on both sides
/// (a browser leaves it out of both when it is the default).
fn same_origin(origin: &str, host: Option<&str>, site: &Site<'_>) -> bool {
    let Some(host) = host else {
        return false;
    };
    let Some((scheme, authority)) = origin.split_once("://") else {
        // `null` (sandboxed frames, file: pages) and anything malformed.
        return false;
    };
    if !scheme.to_ascii_lowercase().eq(site.scheme()) {
        return false;
    }
    match (site.endpoint(authority), site.endpoint(host)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// At most 128 characters of a header value for a message.
fn clip(value: &str) -> String {
    value.chars().take(128).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HTTPS: Site<'static> = Site {
        https: true,
        public_names: &[],
    };

    /// The verdict on an HTTP/1.1 request over HTTPS (`Host:
    /// 127.0.0.1:7480` unless `headers` name one).
    fn run(method: Method, headers: &[(&str, &str)], body: bool) -> Result<(), Refusal> {
        run_at(&HTTPS, method, headers, body)
    }

    fn run_at(
        site: &Site<'_>,
        method: Method,
        headers: &[(&str, &str)],
        body: bool,
    ) -> Result<(), Refusal> {
        let mut map = HeaderMap::new();
        map.insert(header::HOST, "127.0.0.1:7480".parse().expect("value"));
        for (k, v) in headers {
            map.insert(
                header::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        verdict(
            &method,
            &map,
            &"/api/v1/access".parse().expect("uri"),
            axum::http::Version::HTTP_11,
            body,
            site,
        )
    }

    #[test]
    fn origins_are_compared_by_scheme_host_and_port() {
        let plain = Site {
            https: false,
            public_names: &[],
        };
        let at = |site: &Site<'_>, origin: &str, host: &str| {
            run_at(
                site,
                Method::POST,
                &[("origin", origin), ("host", host)],
                false,
            )
            .is_ok()
        };
        assert!(!at(&HTTPS, "http://127.0.0.1:7480", "127.0.0.1:7480"));
        assert!(at(&plain, "http://127.0.0.1:7480", "127.0.0.1:7480"));
        assert!(!at(&plain, "https://127.0.0.1:7480", "127.0.0.1:7480"));
        assert!(at(&plain, "http://ca.example", "ca.example:80"));
        assert!(!at(&plain, "http://ca.example", "ca.example:443"));
    }

    #[test]
    fn hosts_must_be_public_names_when_they_are_set() {
        let names = [
            ("ca.example".to_owned(), None),
            ("10.0.0.1".to_owned(), Some(7480)),
        ];
        let site = Site {
            https: true,
            public_names: &names,
        };
        for ok in [
            "ca.example",
            "CA.example.:443",
            "ca.example:7480",
            "10.0.0.1:7480",
        ] {
            assert!(
                run_at(&site, Method::GET, &[("host", ok)], false).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "evil.example",
            "10.0.0.1:7481",
            "10.0.0.1",
            "",
            "a@ca.example",
        ] {
            let e = run_at(&site, Method::GET, &[("host", bad)], false).unwrap_err();
            assert_eq!((e.0, e.1), (StatusCode::BAD_REQUEST, UNKNOWN_HOST), "{bad}");
            assert!(e.2.contains(&format!("{bad:?}")), "{}", e.2);
        }
        // Without public names any Host goes; without Host, HTTP/1.1 is refused.
        assert!(run(Method::GET, &[("host", "evil.example")], false).is_ok());
        let e = verdict(
            &Method::GET,
            &HeaderMap::new(),
            &"/healthz".parse().expect("uri"),
            axum::http::Version::HTTP_11,
            false,
            &HTTPS,
        )
        .unwrap_err();
        assert_eq!((e.0, e.1), (StatusCode::BAD_REQUEST, UNKNOWN_HOST));
    }

    #[test]
    fn json_bodies_pass_and_others_are_refused_naming_the_type() {
        let json = [("content-type", "application/json; charset=utf-8")];
        assert!(run(Method::POST, &json, true).is_ok());
        let e = run(Method::POST, &[("content-type", "text/plain")], true).unwrap_err();
        assert_eq!(e.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(
            e.2.contains("application/json") && e.2.contains("text/plain"),
            "{}",
            e.2
        );
        let e = run(Method::POST, &[], true).unwrap_err();
        assert!(e.2.contains("no Content-Type"), "{}", e.2);
        // An empty form post is refused by its type alone.
        let form = [("content-type", "application/x-www-form-urlencoded")];
        assert_eq!(
            run(Method::POST, &form, false).unwrap_err().1,
            UNSUPPORTED_MEDIA_TYPE
        );
        // No body, no type: fine (admin POSTs, GETs).
        assert!(run(Method::POST, &[], false).is_ok());
        assert!(run(Method::GET, &form, false).is_ok());
    }

    #[test]
    fn origins_are_compared_by_host_and_port() {
        let same = |origin: &str, host: &str| {
            run(Method::POST, &[("origin", origin), ("host", host)], false).is_ok()
        };
        assert!(same("https://127.0.0.1:7480", "127.0.0.1:7480"));
        assert!(same("https://CA.example", "ca.example:443"));
        assert!(same("https://[::1]:7480", "[::1]:7480"));
        assert!(!same("https://evil.example", "127.0.0.1:7480"));
        assert!(!same("https://127.0.0.1:7481", "127.0.0.1:7480"));
        assert!(!same("http://ca.example", "ca.example:443"));
        assert!(!same("null", "127.0.0.1:7480"));
        assert!(!same("https://u@127.0.0.1:7480", "127.0.0.1:7480"));
        // Without Origin (curl, scripts): allowed.
        assert!(run(Method::DELETE, &[("host", "x")], false).is_ok());
        assert!(!same("https://ca.example.", "ca.example:7480"));
        assert!(same("https://ca.example.", "ca.example"));
        // Reads are not state changes.
        assert!(run(Method::GET, &[("origin", "https://evil.example")], false).is_ok());
    }

    #[test]
    fn fetch_metadata_cross_site_is_refused() {
        for site in ["cross-site", "same-site"] {
            let e = run(Method::POST, &[("sec-fetch-site", site)], false).unwrap_err();
            assert_eq!((e.0, e.1), (StatusCode::FORBIDDEN, CROSS_ORIGIN));
            assert!(e.2.contains(site), "{}", e.2);
        }
        for site in ["same-origin", "none"] {
            assert!(run(Method::POST, &[("sec-fetch-site", site)], false).is_ok());
        }
    }
}
