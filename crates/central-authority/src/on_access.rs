//! On-access windows and access coalescing, per (application, connector):
//! the CA's copy of which connectors are checking which on-access
//! applications, and when it last forwarded an access to each. The two
//! share their key and change together (an expired window must also be
//! forgotten by the coalescer, so the next access reaches the connector
//! again), so they sit behind one lock.
//!
//! Coalescing never shortens a window: accesses held back within the
//! forward interval are sent as one renewal once it has passed
//! (`due_renewals`, carrying when the latest access happened), so the
//! connector's window and the CA's copy both end a window after the last
//! access. An access that finds the application Down forces a forward (a
//! re-check, at most once per `RECHECK_MIN_GAP`) and the CA tracks it until
//! the connector answers (`answered`).
//!
//! **Invariant:** the lock is taken only here, for short synchronous
//! sections, never across an `.await` and never together with another lock
//! of CA state.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use policy::{AccessWindows, AppKey, Coalescer};

use crate::sync::lock;

/// An on-access window or coalescing key: (application, connector).
pub(crate) type WindowKey = (AppKey, String);

/// Forced forwards (re-checks of a Down application) per (application,
/// connector) at most this often, however many users wait on it.
pub(crate) const RECHECK_MIN_GAP: Duration = Duration::from_secs(1);

/// The forward interval in force for `window`: the configured `gap`, but at
/// most half the window, so a renewal sent at the end of the gap (plus the
/// housekeeping tick) still reaches the connector inside its window.
fn effective_gap(window: Duration, gap: Duration) -> Duration {
    gap.min(window / 2)
}

#[derive(Debug)]
struct Inner {
    windows: AccessWindows<WindowKey>,
    coalescer: Coalescer<WindowKey>,
    /// Forced re-checks sent and not yet answered by a report.
    rechecks: HashSet<WindowKey>,
    /// The configured forward interval (the coalescer's may be shorter).
    gap: Duration,
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
                coalescer: Coalescer::new(effective_gap(window, gap)),
                rechecks: HashSet::new(),
                gap,
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
        inner.rechecks.remove(wk);
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

    /// Whether a re-check of `wk` is to be forwarded at `now` although the
    /// coalescer would hold it back (its latest result is Down or old); at
    /// most once per `RECHECK_MIN_GAP`. Counts it as forwarded and awaited
    /// when so.
    pub(crate) fn claim_recheck(&self, wk: &WindowKey, now: Instant) -> bool {
        let mut inner = lock(&self.inner);
        let forced = inner.coalescer.force_forward(wk, now, RECHECK_MIN_GAP);
        if forced {
            inner.rechecks.insert(wk.clone());
        }
        forced
    }

    /// Whether a forced re-check of `wk` still awaits its report.
    pub(crate) fn recheck_pending(&self, wk: &WindowKey) -> bool {
        lock(&self.inner).rechecks.contains(wk)
    }

    /// A report for `wk` arrived: answers its re-check, if one was awaited
    /// (returns whether so, so that waiting accesses look again).
    pub(crate) fn answered(&self, wk: &WindowKey) -> bool {
        lock(&self.inner).rechecks.remove(wk)
    }

    /// The access at `accessed` was forwarded (or renewed): starts or
    /// renews the window to end a window after it.
    pub(crate) fn forwarded(&self, wk: WindowKey, accessed: Instant) {
        lock(&self.inner).windows.record(wk, accessed);
    }

    /// The renewals owed at `now` (accesses held back by coalescing whose
    /// interval has passed), with when the latest access of each happened.
    /// Only keys whose window is live: an ended one starts afresh.
    pub(crate) fn due_renewals(&self, now: Instant) -> Vec<(WindowKey, Instant)> {
        let mut inner = lock(&self.inner);
        let due = inner.coalescer.due_renewals(now);
        due.into_iter()
            .filter(|(wk, _)| inner.windows.is_live(wk, now))
            .collect()
    }

    /// The access could not be forwarded: the next one is tried again.
    pub(crate) fn forward_failed(&self, wk: &WindowKey) {
        let mut inner = lock(&self.inner);
        inner.coalescer.forget(wk);
        inner.rechecks.remove(wk);
    }

    /// Forgets every window and forward of `connector` (it disconnected and
    /// must be told about accesses again).
    pub(crate) fn forget_connector(&self, connector: &str) {
        let mut inner = lock(&self.inner);
        inner.windows.retain(|(_, c)| c != connector);
        inner.coalescer.retain(|(_, c)| c != connector);
        inner.rechecks.retain(|(_, c)| c != connector);
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
        let gap = new_gap.unwrap_or(inner.gap);
        inner.gap = gap;
        if new_gap.is_some() || effective_gap(window, gap) != inner.coalescer.min_gap() {
            inner.coalescer = Coalescer::new(effective_gap(window, gap));
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
            inner.rechecks.remove(k);
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

#[cfg(test)]
mod tests {
    use policy::{Host, Protocol};

    use super::*;

    fn wk(host: &str) -> WindowKey {
        let key = AppKey {
            segment: "lab".into(),
            host: Host::parse(host).expect("host"),
            protocol: Protocol::Tcp,
            port: 443,
        };
        (key, "c1".into())
    }

    /// Issue 12.7: with the default 60 s interval, accesses held back by
    /// coalescing still renew the window: it ends a window after the last
    /// access (the CA's copy, and the connector's through the renewal's age).
    #[test]
    fn the_window_ends_a_window_after_the_last_access_whatever_the_interval() {
        let window = Duration::from_secs(1800);
        let o = OnAccess::new(window, Duration::from_secs(60));
        let t0 = Instant::now();
        let k = wk("a.lab.test");
        let secs = Duration::from_secs;
        assert!(o.claim_forward(&k, t0));
        o.forwarded(k.clone(), t0);
        // Accesses at 10 s and 59 s are coalesced.
        for at in [secs(10), secs(59)] {
            assert!(!o.claim_forward(&k, t0 + at));
        }
        assert!(o.due_renewals(t0 + secs(59)).is_empty());
        // Once the interval has passed, one renewal for the access at 59 s.
        let due = o.due_renewals(t0 + secs(60));
        assert_eq!(due, vec![(k.clone(), t0 + secs(59))]);
        for (k, at) in due {
            o.forwarded(k, at);
        }
        let end = t0 + secs(59) + window;
        assert!(o.is_live(&k.0, &k.1, end - Duration::from_millis(1)));
        assert!(!o.is_live(&k.0, &k.1, end));
        assert!(o.expire(end - Duration::from_millis(1)).is_empty());
        assert_eq!(o.expire(end), vec![k]);
    }

    #[test]
    fn a_recheck_is_forced_once_a_second_and_answered_by_a_report() {
        let o = OnAccess::new(Duration::from_secs(1800), Duration::from_secs(60));
        let t0 = Instant::now();
        let k = wk("a.lab.test");
        assert!(o.claim_forward(&k, t0));
        assert!(!o.claim_forward(&k, t0 + Duration::from_millis(1500)));
        assert!(o.claim_recheck(&k, t0 + Duration::from_millis(1500)));
        assert!(o.recheck_pending(&k));
        assert!(!o.claim_recheck(&k, t0 + Duration::from_millis(1600)));
        assert!(o.answered(&k));
        assert!(!o.recheck_pending(&k));
        assert!(!o.answered(&k));
    }

    #[test]
    fn the_interval_is_at_most_half_the_window() {
        let o = OnAccess::new(Duration::from_secs(4), Duration::from_secs(3));
        let t0 = Instant::now();
        let k = wk("a.lab.test");
        assert!(o.claim_forward(&k, t0));
        o.forwarded(k.clone(), t0);
        assert!(!o.claim_forward(&k, t0 + Duration::from_secs(1)));
        assert_eq!(o.due_renewals(t0 + Duration::from_secs(2)).len(), 1);
    }
}
