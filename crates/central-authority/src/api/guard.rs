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

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

/// The reason of a body that is not JSON (415).
pub const UNSUPPORTED_MEDIA_TYPE: &str = "unsupported_media_type";
/// The reason of a refused cross-origin state change (403).
pub const CROSS_ORIGIN: &str = "cross_origin";

/// The reason of a path no route serves (404).
pub const NO_ROUTE: &str = "no_route";
/// The reason of a method the path does not serve (405).
pub const METHOD_NOT_ALLOWED: &str = "method_not_allowed";

/// Runs the checks, then the route; a non-JSON error answer becomes JSON.
pub async fn check(request: Request<Body>, next: Next) -> Response {
    match verdict(
        request.method(),
        request.headers(),
        request.uri(),
        has_body(&request),
    ) {
        Ok(()) => as_json_error(next.run(request).await).await,
        Err((status, reason, message)) => {
            crate::api::body::error_body(status, reason, &message, None)
        }
    }
}

/// An error answer that is not JSON (axum's own rejections: plain text or
/// empty) rewritten as the API's JSON error with the same status.
async fn as_json_error(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json);
    if !(status.is_client_error() || status.is_server_error()) || is_json {
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
    has_body: bool,
) -> Result<(), Refusal> {
    let changes_state = matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    );
    let content_type = headers.get(header::CONTENT_TYPE);
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
    let host = headers
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .or_else(|| uri.authority().map(|a| a.as_str().to_owned()));
    if same_origin(&origin, host.as_deref()) {
        return Ok(());
    }
    Err((
        StatusCode::FORBIDDEN,
        CROSS_ORIGIN,
        format!(
            "cross-origin state change refused: Origin {:?} is not this server ({}); {method} \
             requests are accepted only from the CA's own origin or from clients that send no \
             Origin (curl, scripts)",
            clip(&origin),
            match &host {
                Some(h) => format!("Host {:?}", clip(h)),
                None => "no Host header".to_owned(),
            }
        ),
    ))
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// Whether `origin` (`scheme://host[:port]`) names the same host and port
/// as the request's `Host`. A port left out means the default port of the
/// origin's scheme on both sides (a browser leaves it out of both when it
/// is the default).
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else {
        return false;
    };
    let Some((scheme, authority)) = origin.split_once("://") else {
        // `null` (sandboxed frames, file: pages) and anything malformed.
        return false;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "https" => 443,
        "http" => 80,
        _ => return false,
    };
    match (
        split_authority(authority, default_port),
        split_authority(host, default_port),
    ) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// `host[:port]` (IPv6 in brackets) → (lower-case host, port).
fn split_authority(authority: &str, default_port: u16) -> Option<(String, u16)> {
    let authority = authority.trim();
    if authority.is_empty() || authority.contains(['/', '@', '?', '#']) {
        return None;
    }
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (format!("[{host}]"), after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (authority.to_owned(), None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None => default_port,
    };
    Some((host.to_ascii_lowercase(), port))
}

/// At most 128 characters of a header value for a message.
fn clip(value: &str) -> String {
    value.chars().take(128).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(method: Method, headers: &[(&str, &str)], body: bool) -> Result<(), Refusal> {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(
                header::HeaderName::from_bytes(k.as_bytes()).expect("name"),
                v.parse().expect("value"),
            );
        }
        verdict(&method, &map, &"/api/v1/access".parse().expect("uri"), body)
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
