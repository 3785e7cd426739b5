//! On-access windows and access coalescing, per (application, connector):
//! the CA's copy of which connectors are checking which on-access
//! applications, and when it last forwarded an access to each. The two
//! share their key and change together (an expired window must also be
//! forgotten by the coalescer, so the next access reaches the connector
//! again), so they sit behind one lock.
//!
//! **Invariant:** the lock is taken only here, for short synchronous
//! sections, never across an `.await` and never together with another lock
//! of CA state.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use policy::{AccessWindows, AppKey, Coalescer};

use crate::sync::lock;

/// An on-access window or coalescing key: (application, connector).
pub(crate) type WindowKey = (AppKey, String);

#[derive(Debug)]
struct Inner {
    windows: AccessWindows<WindowKey>,
    coalescer: Coalescer<WindowKey>,
}

/// The windows and the coalescer. One per `Authority`.
#[derive(Debug)]
pub(crate) struct OnAccess {
    inner: Mutex<Inner>,
}

impl OnAccess {
    /// Windows of length `window`, forwards at most once per `gap`.
    pub(crate) fn new(window: Duration, gap: Duration) -> Self {
        OnAccess {
            inner: Mutex::new(Inner {
                windows: AccessWindows::new(window),
                coalescer: Coalescer::new(gap),
            }),
        }
    }

    /// Whether `key`'s window for `connector` is live at `now`.
    pub(crate) fn is_live(&self, key: &AppKey, connector: &str, now: Instant) -> bool {
        lock(&self.inner)
            .windows
            .is_live(&(key.clone(), connector.to_owned()), now)
    }

    /// The connector reported that it stopped checking `wk`: the window
    /// ends, and the next access must reach it again, not be coalesced away.
    pub(crate) fn end(&self, wk: &WindowKey) {
        let mut inner = lock(&self.inner);
        inner.windows.remove(wk);
        inner.coalescer.forget(wk);
    }

    /// Adopts a window the CA did not start (e.g. after a CA restart the
    /// connector still checks): records it unless it is live. Returns
    /// whether it was not live.
    pub(crate) fn adopt(&self, wk: WindowKey, now: Instant) -> bool {
        let mut inner = lock(&self.inner);
        if inner.windows.is_live(&wk, now) {
            return false;
        }
        inner.windows.record(wk, now);
        true
    }

    /// Whether an access to `wk` at `now` is to be forwarded (at most once
    /// per gap); counts it as forwarded when so.
    pub(crate) fn claim_forward(&self, wk: &WindowKey, now: Instant) -> bool {
        lock(&self.inner).coalescer.should_forward(wk, now)
    }

    /// The access was forwarded: starts or renews the window.
    pub(crate) fn forwarded(&self, wk: WindowKey, now: Instant) {
        lock(&self.inner).windows.record(wk, now);
    }

    /// The access could not be forwarded: the next one is tried again.
    pub(crate) fn forward_failed(&self, wk: &WindowKey) {
        lock(&self.inner).coalescer.forget(wk);
    }

    /// Forgets every window and forward of `connector` (it disconnected and
    /// must be told about accesses again).
    pub(crate) fn forget_connector(&self, connector: &str) {
        let mut inner = lock(&self.inner);
        inner.windows.retain(|(_, c)| c != connector);
        inner.coalescer.retain(|(_, c)| c != connector);
    }

    /// After a reload: the new window length, a fresh coalescer when the gap
    /// changed (`new_gap`), and only the windows whose application `keep`s.
    pub(crate) fn reconfigure(
        &self,
        window: Duration,
        new_gap: Option<Duration>,
        mut keep: impl FnMut(&AppKey) -> bool,
    ) {
        let mut inner = lock(&self.inner);
        inner.windows.set_window(window);
        if let Some(gap) = new_gap {
            inner.coalescer = Coalescer::new(gap);
        }
        inner.windows.retain(|(key, _)| keep(key));
    }

    /// Ends the windows that have run out at `now` (forgetting their
    /// forwards) and prunes the coalescer; returns the ended keys.
    pub(crate) fn expire(&self, now: Instant) -> Vec<WindowKey> {
        let mut inner = lock(&self.inner);
        let expired = inner.windows.expire(now);
        for k in &expired {
            inner.coalescer.forget(k);
        }
        inner.coalescer.prune(now);
        expired
    }

    /// How many windows each connector has.
    pub(crate) fn counts(&self) -> HashMap<String, u64> {
        let mut live: HashMap<String, u64> = HashMap::new();
        for (_, c) in lock(&self.inner).windows.keys() {
            *live.entry(c.clone()).or_default() += 1;
        }
        live
    }

    /// How many windows `connector` has.
    pub(crate) fn count(&self, connector: &str) -> u64 {
        lock(&self.inner)
            .windows
            .keys()
            .filter(|(_, c)| c == connector)
            .count() as u64
    }
}
