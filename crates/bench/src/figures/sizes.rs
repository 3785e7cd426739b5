//! Answer sizes at 10,000 applications, as a browser or client that asks
//! for gzip (`Accept-Encoding: gzip`) receives them, against the identity
//! bytes: the whole listing `GET /api/v1/health` (unpaged), and the
//! dashboard's first load (the page, its script and style sheet, the
//! overview and one page of rows). The same CA as the `dashboard` group's
//! byte figures: one simulated connector reported every application.

use anyhow::{Result, bail};

use super::Spec;
use super::ca;
use super::dashboard::{FIRST_LOAD, reported_ca};
use crate::Mode;
use crate::report::{Figure, Goal};

/// The figures.
pub const SPECS: &[Spec] = &[
    Spec {
        name: "health_listing_gzip_kib",
        unit: "KiB",
        goal: Goal::Info,
    },
    Spec {
        name: "dashboard_first_load_gzip_kib",
        unit: "KiB",
        goal: Goal::AtMost { limit: 200.0 },
    },
];

/// The body bytes of `GET {base}{path}` as sent (reqwest here does not
/// decompress), with or without `Accept-Encoding: gzip`; and whether the
/// answer came gzipped.
async fn sent_bytes(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    gzip: bool,
) -> Result<(usize, bool)> {
    let mut request = http.get(format!("{base}{path}")).bearer_auth(ca::TOKEN);
    request = request.header(
        reqwest::header::ACCEPT_ENCODING,
        if gzip { "gzip" } else { "identity" },
    );
    let r = request.send().await?.error_for_status()?;
    let zipped = r
        .headers()
        .get(reqwest::header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() == b"gzip");
    Ok((r.bytes().await?.len(), zipped))
}

/// Measures (quick: 1,000 applications).
pub async fn run(mode: Mode) -> Result<Vec<Figure>> {
    let apps = mode.pick(1_000usize, 10_000);
    let (server, session) = reported_ca(apps).await?;
    let http = reqwest::Client::new();
    let base = format!("http://{}", server.http);

    let (plain, _) = sent_bytes(&http, &base, "/api/v1/health", false).await?;
    let (zipped, was_zipped) = sent_bytes(&http, &base, "/api/v1/health", true).await?;
    if !was_zipped {
        bail!("GET /api/v1/health with Accept-Encoding: gzip was not answered gzipped");
    }
    let (mut first_plain, mut first_zipped, mut zipped_parts) = (0, 0, Vec::new());
    for path in FIRST_LOAD {
        first_plain += sent_bytes(&http, &base, path, false).await?.0;
        let (n, z) = sent_bytes(&http, &base, path, true).await?;
        first_zipped += n;
        if z {
            zipped_parts.push(*path);
        }
    }
    session.abort();
    drop(server);
    let kib = |b: usize| b as f64 / 1024.0;
    Ok(vec![
        SPECS[0].figure(
            kib(zipped),
            Some(kib(plain)),
            format!(
                "`GET /api/v1/health` (every row, unpaged) at {apps} applications with one \
                 connector's result each, body bytes with `Accept-Encoding: gzip` ({zipped} B); \
                 baseline: identity ({plain} B), {:.1}× smaller",
                plain as f64 / zipped.max(1) as f64
            ),
        ),
        SPECS[1].figure(
            kib(first_zipped),
            Some(kib(first_plain)),
            format!(
                "the dashboard's first load at {apps} applications, gzip ({first_zipped} B): {}; \
                 gzipped: {}; baseline: identity ({first_plain} B)",
                FIRST_LOAD.join(", "),
                zipped_parts.join(", ")
            ),
        ),
    ])
}
