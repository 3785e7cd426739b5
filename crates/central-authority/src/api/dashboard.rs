//! The Health dashboard: three small HTML pages (applications with the
//! overview at `/`, one application at `/app`, connectors at
//! `/connectors`), one script, the worker that shares one change stream
//! between a browser's tabs over HTTP/1.1, and one style sheet
//! (`/assets/…`), all compiled into the binary. The pages hold no data: the script fetches one
//! page of rows at a time from the JSON API (`GET /api/v1/health` with the
//! filters of the page's URL) and updates them in place from the change
//! stream (`GET /api/v1/health/stream`), so the browser never holds the
//! whole table and never reloads.
//!
//! **Invariant:** nothing the page runs or loads comes from elsewhere or is
//! inline: every response here carries a Content-Security-Policy that
//! allows scripts, styles and connections from the CA's own origin only.
//! Elements carry stable classes and `data-*` attributes
//! (`data-status="unknown"`, `.icon-unknown`) so browser tests can assert
//! on them without parsing text.

use std::sync::LazyLock;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The page's script (plain ES2020, no build step).
const SCRIPT: &str = include_str!("../../assets/dashboard.js");
/// The change stream the tabs of one browser share over HTTP/1.1 (a
/// SharedWorker: one stream, not one connection per tab).
const STREAM_WORKER: &str = include_str!("../../assets/dashboard-stream.js");
/// The page's styles (light and dark through `prefers-color-scheme`).
const STYLE: &str = include_str!("../../assets/dashboard.css");
/// The icon browsers ask for at `/favicon.ico` (SVG, which they accept
/// there by its content type).
const FAVICON: &str = include_str!("../../assets/favicon.svg");

/// What every dashboard response allows: its own origin, nothing inline,
/// no frames, no plugins.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; \
frame-ancestors 'none'";

/// One of the dashboard's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Page {
    /// The overview and the applications list (`/`).
    List,
    /// One application: latest results and history (`/app`).
    Application,
    /// The connectors (`/connectors`).
    Connectors,
}

impl Page {
    fn name(self) -> &'static str {
        match self {
            Page::List => "list",
            Page::Application => "app",
            Page::Connectors => "connectors",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Page::List => "Applications",
            Page::Application => "Application",
            Page::Connectors => "Connectors",
        }
    }

    /// The page's own markup inside `<main>`: the script fills it.
    fn body(self) -> &'static str {
        match self {
            Page::List => LIST_BODY,
            Page::Application => APP_BODY,
            Page::Connectors => CONNECTORS_BODY,
        }
    }
}

const LIST_BODY: &str = r#"<section id="overview" class="overview" aria-label="Overview"><p class="muted">Loading…</p></section>
<form id="filters" class="filters" role="search" action="/" method="get">
<label>Search host <input type="search" name="q" id="q" autocomplete="off" placeholder="press / to search"></label>
<label>Status <select name="status" id="f-status"><option value="">any</option><option value="down">Down</option><option value="unhealthy">Unhealthy</option><option value="unknown">Unknown</option><option value="up">Up</option><option value="down,unhealthy">Down or Unhealthy</option></select></label>
<label>Mode <select name="mode" id="f-mode"><option value="">any</option><option value="continuous">continuous</option><option value="on_access">on access</option><option value="none">none</option></select></label>
<label>Segment <input name="segment" id="f-segment" autocomplete="off"></label>
<label>Group <input name="group" id="f-group" autocomplete="off"></label>
<label>Connector <input name="connector" id="f-connector" autocomplete="off"></label>
<label>Rows <select name="per_page" id="f-per_page"><option>25</option><option selected>50</option><option>100</option><option>200</option></select></label>
<button type="submit">Apply</button> <a href="/" class="clear">Clear filters</a>
</form>
<p id="summary" class="summary" aria-live="polite"></p>
<table id="applications" class="list"><thead><tr>
<th scope="col"><button type="button" data-sort="segment">Segment</button></th>
<th scope="col"><button type="button" data-sort="host">Application</button></th>
<th scope="col"><button type="button" data-sort="status">Status</button></th>
<th scope="col">Per connector</th>
<th scope="col"><button type="button" data-sort="changed">Last change</button></th>
</tr></thead><tbody></tbody></table>
<nav id="pager" class="pager" aria-label="Pages"></nav>"#;

const APP_BODY: &str = r#"<p><a href="/" id="back">← Applications</a></p>
<section id="app" aria-live="polite"><p class="muted">Loading…</p></section>
<h2>Per connector</h2>
<table id="app-connectors" class="list"><thead><tr><th scope="col">Connector</th><th scope="col">Status (smoothed RTT)</th><th scope="col">Addresses (method, RTT, error)</th><th scope="col">Checked</th><th scope="col">Last report</th></tr></thead><tbody></tbody></table>
<h2>Addresses</h2>
<p class="muted">Every address the connectors' answers have had (a DNS change keeps the address that left, with its last result).</p>
<table id="app-addresses" class="list"><thead><tr><th scope="col">Address</th><th scope="col">Last result</th><th scope="col">Appeared</th><th scope="col">Left</th><th scope="col">Last result from</th></tr></thead><tbody></tbody></table>
<h2>Smoothed RTT</h2>
<section id="rtt" class="charts" aria-label="Smoothed round-trip time per connector over the last hour, one value a minute"><p class="muted">Loading…</p></section>
<h2>Timeline</h2>
<p><label>Window <select id="timeline-window"><option value="hour">last hour</option><option value="day">last day</option><option value="week">last week</option></select></label></p>
<section id="timeline" class="timeline" aria-label="Status per connector over time"><p class="muted">Loading…</p></section>
<h2>History</h2>
<p class="muted" id="history-note">Every status change of a connector for this application, newest first.</p>
<table id="history" class="list"><thead><tr><th scope="col">Time</th><th scope="col">Connector</th><th scope="col">Change</th><th scope="col">Cause</th></tr></thead><tbody></tbody></table>
<nav id="history-pager" class="pager" aria-label="History pages"></nav>"#;

const CONNECTORS_BODY: &str = r#"<section id="connector-overview" class="overview" aria-label="Connectors overview"></section>
<table id="connectors" class="list"><thead><tr><th scope="col">Connector</th><th scope="col">Group</th><th scope="col">Session</th><th scope="col">Version</th><th scope="col">Check load (budget)</th><th scope="col">Load, last day</th><th scope="col">Rate</th><th scope="col">Certificate expires</th><th scope="col">Host</th></tr></thead><tbody></tbody></table>
<section id="log-receivers-section" aria-label="Log receivers" hidden><h2>Log receivers</h2>
<table id="log-receivers" class="list"><thead><tr><th scope="col">Receiver</th><th scope="col">Destination</th><th scope="col">Format</th><th scope="col">Connected</th><th scope="col">Spool (records, bytes)</th><th scope="col">Sent</th><th scope="col">Dropped</th><th scope="col">Last error</th></tr></thead><tbody></tbody></table></section>"#;

/// The HTML of `page`.
pub fn html(page: Page) -> String {
    format!(
        r##"<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><meta name="color-scheme" content="light dark"><title>reach — {title}</title><link rel="stylesheet" href="/assets/dashboard.css"><script src="/assets/dashboard.js" defer></script></head><body data-page="{name}"><a class="skip" href="#main">Skip to content</a><header class="top"><strong class="brand">reach</strong><nav aria-label="Views"><a href="/"{list}>Applications</a> <a href="/connectors"{conns}>Connectors</a></nav><span id="live" class="live" data-live="connecting" aria-live="polite">connecting…</span><span id="who" class="who"></span></header><main id="main" tabindex="-1"><h1>{title}</h1>{body}</main><noscript><p>This dashboard needs JavaScript. The same data is at <a href="/api/v1/health">/api/v1/health</a>.</p></noscript></body></html>"##,
        title = page.title(),
        name = page.name(),
        body = page.body(),
        list = if page == Page::List {
            r#" aria-current="page""#
        } else {
            ""
        },
        conns = if page == Page::Connectors {
            r#" aria-current="page""#
        } else {
            ""
        },
    )
}

/// Adds the dashboard's security headers.
pub(crate) fn secured(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

/// Serves `page`.
pub fn page(page: Page) -> Response {
    secured(
        (
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            html(page),
        )
            .into_response(),
    )
}

/// An embedded asset: its bytes, type and entity tag.
struct Asset {
    body: &'static str,
    content_type: &'static str,
    etag: &'static LazyLock<HeaderValue>,
}

/// A weak entity tag of `body`: its 64-bit FNV-1a hash, so it changes
/// when the embedded asset does (a new build), not when the CA restarts.
/// Weak, since the same tag covers the gzipped and the plain bytes.
fn etag(body: &str) -> HeaderValue {
    let hash = body.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    HeaderValue::from_str(&format!("W/\"{hash:016x}\""))
        .unwrap_or(HeaderValue::from_static("W/\"0\""))
}

/// Whether `If-None-Match` in `headers` names `tag` (or is `*`).
fn not_modified<'a>(headers: &'a HeaderMap, tag: &'a HeaderValue) -> bool {
    let opaque = |t: &'a [u8]| t.strip_prefix(b"W/").unwrap_or(t);
    let tag = opaque(tag.as_bytes());
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .any(|t| t == b"*" || opaque(t) == tag)
}

/// Serves `asset`: revalidated on every load (`no-cache`), answered with
/// `304 Not Modified` and no body when the browser's copy is current.
fn serve(asset: &Asset, headers: &HeaderMap) -> Response {
    let etag = (**asset.etag).clone();
    if not_modified(headers, &etag) {
        return secured(
            (
                StatusCode::NOT_MODIFIED,
                [
                    (header::ETAG, etag),
                    (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
                ],
            )
                .into_response(),
        );
    }
    secured(
        (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(asset.content_type),
                ),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
                (header::ETAG, etag),
            ],
            asset.body,
        )
            .into_response(),
    )
}

static SCRIPT_TAG: LazyLock<HeaderValue> = LazyLock::new(|| etag(SCRIPT));
static WORKER_TAG: LazyLock<HeaderValue> = LazyLock::new(|| etag(STREAM_WORKER));
static STYLE_TAG: LazyLock<HeaderValue> = LazyLock::new(|| etag(STYLE));
static FAVICON_TAG: LazyLock<HeaderValue> = LazyLock::new(|| etag(FAVICON));
static FAVICON_ASSET: Asset = Asset {
    body: FAVICON,
    content_type: "image/svg+xml",
    etag: &FAVICON_TAG,
};
static SCRIPT_ASSET: Asset = Asset {
    body: SCRIPT,
    content_type: "text/javascript; charset=utf-8",
    etag: &SCRIPT_TAG,
};
static WORKER_ASSET: Asset = Asset {
    body: STREAM_WORKER,
    content_type: "text/javascript; charset=utf-8",
    etag: &WORKER_TAG,
};
static STYLE_ASSET: Asset = Asset {
    body: STYLE,
    content_type: "text/css; charset=utf-8",
    etag: &STYLE_TAG,
};

/// `GET /assets/dashboard.js`.
pub async fn script(headers: HeaderMap) -> Response {
    serve(&SCRIPT_ASSET, &headers)
}

/// `GET /assets/dashboard-stream.js` (the shared stream's worker).
pub async fn worker(headers: HeaderMap) -> Response {
    serve(&WORKER_ASSET, &headers)
}

/// `GET /favicon.ico`.
pub async fn favicon(headers: HeaderMap) -> Response {
    serve(&FAVICON_ASSET, &headers)
}

/// `GET /assets/dashboard.css`.
pub async fn style(headers: HeaderMap) -> Response {
    serve(&STYLE_ASSET, &headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_have_no_inline_script_or_style() {
        for p in [Page::List, Page::Application, Page::Connectors] {
            let h = html(p);
            assert!(!h.contains("<script>"), "{p:?}: inline script");
            assert!(!h.contains("<style"), "{p:?}: inline style");
            assert!(!h.contains(" style="), "{p:?}: style attribute");
            for handler in [
                " onclick=",
                " onload=",
                " onerror=",
                " onsubmit=",
                " onchange=",
            ] {
                assert!(!h.contains(handler), "{p:?}: event handler attribute");
            }
            assert!(!h.contains("http://") && !h.contains("https://"));
        }
        for script in [SCRIPT, STREAM_WORKER] {
            // The SVG namespace is a name the charts' elements are made
            // in, not an address anything is loaded from.
            let script = script.replace("'http://www.w3.org/2000/svg'", "");
            assert!(!script.contains("http://") && !script.contains("https://"));
            assert!(!script.contains("innerHTML"), "the script builds the DOM");
        }
    }
}
