//! Polling for events whose timing a test does not control (a peer closing
//! its stream, a process becoming ready): one loop, two ways to call it.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// Calls `f` every `every` until it succeeds or `limit` has passed; the
/// error is the last one `f` returned. `f` runs at least once. (tokio's
/// clock, so a test with paused time still times out.)
async fn poll<T, E, F, Fut>(limit: Duration, every: Duration, mut f: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let start = Instant::now();
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) if start.elapsed() >= limit => return Err(e),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// Retries `f` every 100 ms until it succeeds or `limit` passes; the error
/// is the last one `f` returned.
pub async fn retry<T, F, Fut>(limit: Duration, f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<T>>,
{
    poll(limit, Duration::from_millis(100), f)
        .await
        .map_err(|e| e.context(format!("still failing after {limit:?}")))
}

/// Waits (up to 15 s) until `f` returns true, checking every 20 ms; panics
/// naming `what` if it never does. The limit is generous on purpose: it
/// only bounds a hang, and on a 2-core machine busy with parallel builds
/// a TLS session plus a report can take seconds (a trust test failed once
/// that way at 5 s, by all signs; its output was not kept).
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let checked = poll(Duration::from_secs(15), Duration::from_millis(20), || {
        let done = f();
        async move { if done.await { Ok(()) } else { Err(()) } }
    })
    .await;
    if checked.is_err() {
        panic!("timed out waiting for: {what}");
    }
}
