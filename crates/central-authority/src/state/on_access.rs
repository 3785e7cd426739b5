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
//! Only a window an access opened is routed on: one this CA
//! forwarded, or one a report proves with an access id any replica issued
//! (`adopt` with the access's time, see `state::access_ids`). A report no verified
//! access asked for is kept as an *unsolicited* entry: it holds a place
//! under the per-connector cap (so reports cannot grow the CA beyond it)
//! and ends like a window, but `is_live` is false for it, so no decision
//! rests on it, and no renewal is ever sent for it.
//!
//! Windows are capped per connector and per segment (`Caps`): a flood of
//! distinct names under one wildcard segment can take at most the
//! segment's allowance, so the connectors keep room for other segments. A
//! forward claims its place when it is decided (`claim_forward`), not when
//! it has been sent, so concurrent accesses cannot overshoot a cap.
//!
//! **Invariant:** the lock is taken only here, for short synchronous
//! sections, never across an `.await` and never together with another lock
//! of CA state.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use policy::{AccessWindows, AppKey, Coalescer};

use crate::ground::sync::lock;

/// An on-access window or coalescing key: (application, connector).
pub(crate) type WindowKey = (AppKey, String);

/// Forced forwards (re-checks of a Down application) per (application,
/// connector) at most this often, however many users wait on it.
pub(crate) const RECHECK_MIN_GAP: Duration = Duration::from_secs(1);

/// How many on-access windows (of either kind) may exist at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Per connector (`[health] max_windows_per_connector`).
    pub(crate) connector: usize,
    /// Per segment, all its connectors together (`[health]
    /// max_windows_per_segment`).
    pub(crate) segment: usize,
}

impl Caps {
    /// The caps `settings` sets.
    pub(crate) fn of(settings: &crate::config::Settings) -> Caps {
        Caps {
            connector: settings.max_windows_per_connector,
            segment: settings.max_windows_per_segment,
        }
    }
}

/// Which cap refused a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Limit {
    /// `max_windows_per_connector`.
    Connector,
    /// `max_windows_per_segment`.
    Segment,
}

impl Limit {
    /// The setting's name, for logs.
    pub(crate) fn setting(self) -> &'static str {
        match self {
            Limit::Connector => "max_windows_per_connector",
            Limit::Segment => "max_windows_per_segment",
        }
    }
}

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
    /// Windows per connector (kept in step with `windows`), for the cap.
    per_connector: HashMap<String, usize>,
    /// Windows per segment (kept in step with `windows`), for the cap.
    per_segment: HashMap<String, usize>,
    /// Entries of `windows` that only an unsolicited report opened.
    unsolicited: HashSet<WindowKey>,
    /// Windows a forward claimed (`claim_forward`) and that are not yet
    /// confirmed sent (`forwarded`): a failed send gives the place back.
    claimed: HashSet<WindowKey>,
}

impl Inner {
    /// The cap a new window for `wk` would exceed, if any.
    fn full(&self, wk: &WindowKey, caps: Caps) -> Option<Limit> {
        let count = |m: &HashMap<String, usize>, k: &str| m.get(k).copied().unwrap_or(0);
        if count(&self.per_connector, &wk.1) >= caps.connector {
            Some(Limit::Connector)
        } else if count(&self.per_segment, &wk.0.segment) >= caps.segment {
            Some(Limit::Segment)
        } else {
            None
        }
    }

    /// Records a window for `wk` at `at` unless that would open one more
    /// than `caps` allow. Returns the cap that refused it, if one did.
    fn record(&mut self, wk: WindowKey, at: Instant, caps: Caps) -> Result<(), Limit> {
        if !self.windows.contains(&wk) {
            if let Some(limit) = self.full(&wk, caps) {
                return Err(limit);
            }
            *self.per_connector.entry(wk.1.clone()).or_default() += 1;
            *self.per_segment.entry(wk.0.segment.clone()).or_default() += 1;
        }
        self.windows.record(wk, at);
        Ok(())
    }

    /// Whether `wk`'s window is live at `now` and an access opened it.
    fn opened_by_access(&self, wk: &WindowKey, now: Instant) -> bool {
        self.windows.is_live(wk, now) && !self.unsolicited.contains(wk)
    }

    /// Removes `wk`'s window (of either kind), keeping the counts.
    fn remove(&mut self, wk: &WindowKey) {
        if self.windows.remove(wk) {
            for (counts, k) in [
                (&mut self.per_connector, &wk.1),
                (&mut self.per_segment, &wk.0.segment),
            ] {
                if let Some(n) = counts.get_mut(k) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        counts.remove(k);
                    }
                }
            }
        }
        self.unsolicited.remove(wk);
        self.claimed.remove(wk);
    }

    /// An access at `accessed` opened `wk`'s window: an unsolicited entry
    /// becomes a window counted from the access. Returns the cap that
    /// refused it, if one did.
    fn open(&mut self, wk: WindowKey, accessed: Instant, caps: Caps) -> Result<(), Limit> {
        if self.unsolicited.remove(&wk) {
            // It holds its place already; the window counts from the access
            // (`record` alone never moves a window's start back).
            self.windows.remove(&wk);
            self.windows.record(wk, accessed);
            return Ok(());
        }
        self.record(wk, accessed, caps)
    }

    /// Recounts after a bulk change of `windows`, dropping what refers to
    /// windows that are gone.
    fn recount(&mut self) {
        self.per_connector.clear();
        self.per_segment.clear();
        for (key, c) in self.windows.keys() {
            *self.per_connector.entry(c.clone()).or_default() += 1;
            *self.per_segment.entry(key.segment.clone()).or_default() += 1;
        }
        let Inner {
            windows,
            unsolicited,
            claimed,
            ..
        } = self;
        unsolicited.retain(|wk| windows.contains(wk));
        claimed.retain(|wk| windows.contains(wk));
    }
}

/// What became of an access for one connector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Forward it now.
    Forward,
    /// Held back by coalescing (renewed later).
    Coalesced,
    /// A cap refused the window: the connector has
    /// `max_windows_per_connector` windows already, or the segment
    /// `max_windows_per_segment`.
    Full(Limit),
}

/// What a report did to a window the CA did not start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Adoption {
    /// The window (or unsolicited entry) was live already.
    Live,
    /// A verified access opened the window: it was adopted.
    Adopted,
    /// No verified access asked for the report: kept as an unsolicited
    /// entry, never routed on.
    Unsolicited,
    /// A cap refused it (see `Claim::Full`).
    Full(Limit),
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
                per_connector: HashMap::new(),
                per_segment: HashMap::new(),
                unsolicited: HashSet::new(),
                claimed: HashSet::new(),
            }),
        }
    }

    /// Whether `key`'s window for `connector` is live at `now` and an
    /// access opened it (what decisions may rest on).
    pub(crate) fn is_live(&self, key: &AppKey, connector: &str, now: Instant) -> bool {
        lock(&self.inner).opened_by_access(&(key.clone(), connector.to_owned()), now)
    }

    /// Whether `key`'s entry for `connector` is an unsolicited one (live,
    /// opened by no verified access), for the listing's Unknown cause.
    pub(crate) fn is_unsolicited(&self, key: &AppKey, connector: &str, now: Instant) -> bool {
        let inner = lock(&self.inner);
        let wk = (key.clone(), connector.to_owned());
        inner.unsolicited.contains(&wk) && inner.windows.is_live(&wk, now)
    }

    /// The connector reported that it stopped checking `wk`: the window
    /// ends, and the next access must reach it again, not be coalesced away.
    pub(crate) fn end(&self, wk: &WindowKey) {
        let mut inner = lock(&self.inner);
        inner.remove(wk);
        inner.coalescer.forget(wk);
        inner.rechecks.remove(wk);
    }

    /// Follows a report of a window the CA may not have started (another
    /// replica forwarded the access, or this CA restarted). `accessed`:
    /// when the access the report's verified id names happened (`None`
    /// without a valid id). A verified access less than a window back
    /// opens (or lengthens) the window; anything else is at most an
    /// unsolicited entry. Nothing is recorded beyond `caps`.
    pub(crate) fn adopt(
        &self,
        wk: WindowKey,
        accessed: Option<Instant>,
        now: Instant,
        caps: Caps,
    ) -> Adoption {
        let mut inner = lock(&self.inner);
        let window = inner.windows.window();
        let accessed = accessed.filter(|at| at.checked_add(window).is_some_and(|end| end > now));
        match accessed {
            Some(at) if inner.opened_by_access(&wk, now) => {
                // Another replica's renewal: follow it (never shortens).
                inner.windows.record(wk, at);
                Adoption::Live
            }
            Some(at) => match inner.open(wk, at, caps) {
                Ok(()) => Adoption::Adopted,
                Err(limit) => Adoption::Full(limit),
            },
            None if inner.windows.is_live(&wk, now) => Adoption::Live,
            None => match inner.record(wk.clone(), now, caps) {
                Ok(()) => {
                    inner.unsolicited.insert(wk);
                    Adoption::Unsolicited
                }
                Err(limit) => Adoption::Full(limit),
            },
        }
    }

    /// Whether an access to `wk` at `now` is to be forwarded (at most once
    /// per gap; never when it would open a window beyond `caps`); counts it
    /// as forwarded when so. A new window takes its place under the caps
    /// here, under the same lock as the check, so concurrent accesses
    /// cannot overshoot a cap; `forwarded` confirms it, `forward_failed`
    /// gives the place back.
    pub(crate) fn claim_forward(&self, wk: &WindowKey, now: Instant, caps: Caps) -> Claim {
        let mut inner = lock(&self.inner);
        let new = !inner.windows.contains(wk);
        if new && let Some(limit) = inner.full(wk, caps) {
            return Claim::Full(limit);
        }
        if !inner.coalescer.should_forward(wk, now) {
            return Claim::Coalesced;
        }
        if new && inner.record(wk.clone(), now, caps).is_ok() {
            inner.claimed.insert(wk.clone());
        }
        Claim::Forward
    }

    /// Whether a re-check of `wk` is to be forwarded at `now` although the
    /// coalescer would hold it back (its latest result is Down or old); at
    /// most once per `RECHECK_MIN_GAP`. Counts it as forwarded and awaited
    /// when so.
    pub(crate) fn claim_recheck(&self, wk: &WindowKey, now: Instant) -> bool {
        let mut inner = lock(&self.inner);
        if !inner.windows.contains(wk) || inner.unsolicited.contains(wk) {
            // No window (it ended, or no access opened it): an ordinary
            // forward starts one.
            return false;
        }
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
    /// renews the window to end a window after it. A window that holds its
    /// place (`claim_forward` took it, or it is a renewal) always does; one
    /// that ended since its claim (it ran out, the connector stopped, its
    /// send failed) opens again only under `caps`, since its place may be
    /// another's by now. Returns the cap that refused it, if one did.
    pub(crate) fn forwarded(
        &self,
        wk: WindowKey,
        accessed: Instant,
        caps: Caps,
    ) -> Result<(), Limit> {
        let mut inner = lock(&self.inner);
        inner.claimed.remove(&wk);
        inner.open(wk, accessed, caps)
    }

    /// The renewals owed at `now` (accesses held back by coalescing whose
    /// interval has passed), with when the latest access of each happened.
    /// Only keys whose window is live: an ended one starts afresh.
    pub(crate) fn due_renewals(&self, now: Instant) -> Vec<(WindowKey, Instant)> {
        let mut inner = lock(&self.inner);
        let due = inner.coalescer.due_renewals(now);
        due.into_iter()
            .filter(|(wk, _)| inner.opened_by_access(wk, now))
            .collect()
    }

    /// The access could not be forwarded: the next one is tried again.
    pub(crate) fn forward_failed(&self, wk: &WindowKey) {
        let mut inner = lock(&self.inner);
        inner.coalescer.forget(wk);
        inner.rechecks.remove(wk);
        if inner.claimed.contains(wk) {
            // The place `claim_forward` took for a window never sent.
            inner.remove(wk);
        }
    }

    /// Forgets every window and forward of `connector` (it disconnected and
    /// must be told about accesses again).
    pub(crate) fn forget_connector(&self, connector: &str) {
        let mut inner = lock(&self.inner);
        inner.windows.retain(|(_, c)| c != connector);
        inner.coalescer.retain(|(_, c)| c != connector);
        inner.rechecks.retain(|(_, c)| c != connector);
        inner.recount();
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
        inner.recount();
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
        if !expired.is_empty() {
            inner.recount();
        }
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
            .per_connector
            .get(connector)
            .copied()
            .unwrap_or(0) as u64
    }

    /// How many windows there are, and how many coalescing entries.
    #[cfg(test)]
    pub(crate) fn sizes(&self) -> (usize, usize) {
        let inner = lock(&self.inner);
        (inner.windows.len(), inner.coalescer.len())
    }
}

#[cfg(test)]
mod tests {
    use policy::{Host, Protocol};

    use super::*;

    const N: usize = 10;
    /// `N` windows per connector, no segment cap.
    const CAP: Caps = Caps {
        connector: N,
        segment: usize::MAX,
    };

    fn wk(host: &str) -> WindowKey {
        wk_in("lab", host, "c1")
    }

    fn wk_in(segment: &str, host: &str, connector: &str) -> WindowKey {
        let key = AppKey {
            segment: segment.into(),
            host: Host::parse(host).expect("host"),
            protocol: Protocol::Tcp,
            port: 443,
        };
        (key, connector.into())
    }

    /// With the default 60 s interval, accesses held back by
    /// coalescing still renew the window: it ends a window after the last
    /// access (the CA's copy, and the connector's through the renewal's age).
    #[test]
    fn the_window_ends_a_window_after_the_last_access_whatever_the_interval() {
        let window = Duration::from_secs(1800);
        let o = OnAccess::new(window, Duration::from_secs(60));
        let t0 = Instant::now();
        let k = wk("a.lab.test");
        let secs = Duration::from_secs;
        assert_eq!(o.claim_forward(&k, t0, CAP), Claim::Forward);
        o.forwarded(k.clone(), t0, CAP).expect("forwarded");
        // Accesses at 10 s and 59 s are coalesced.
        for at in [secs(10), secs(59)] {
            assert_eq!(o.claim_forward(&k, t0 + at, CAP), Claim::Coalesced);
        }
        assert!(o.due_renewals(t0 + secs(59)).is_empty());
        // Once the interval has passed, one renewal for the access at 59 s.
        let due = o.due_renewals(t0 + secs(60));
        assert_eq!(due, vec![(k.clone(), t0 + secs(59))]);
        for (k, at) in due {
            o.forwarded(k, at, CAP).expect("forwarded");
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
        assert_eq!(o.claim_forward(&k, t0, CAP), Claim::Forward);
        o.forwarded(k.clone(), t0, CAP).expect("forwarded");
        assert_eq!(
            o.claim_forward(&k, t0 + Duration::from_millis(1500), CAP),
            Claim::Coalesced
        );
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
        assert_eq!(o.claim_forward(&k, t0, CAP), Claim::Forward);
        o.forwarded(k.clone(), t0, CAP).expect("forwarded");
        assert_eq!(
            o.claim_forward(&k, t0 + Duration::from_secs(1), CAP),
            Claim::Coalesced
        );
        assert_eq!(o.due_renewals(t0 + Duration::from_secs(2)).len(), 1);
    }

    /// Windows per connector are capped, for accesses and for
    /// adoption alike; ended windows free their place.
    #[test]
    fn windows_per_connector_are_capped() {
        let window = Duration::from_secs(60);
        let o = OnAccess::new(window, Duration::from_secs(10));
        let t0 = Instant::now();
        for i in 0..N {
            let k = wk(&format!("h{i}.lab.test"));
            assert_eq!(o.claim_forward(&k, t0, CAP), Claim::Forward);
            o.forwarded(k, t0, CAP).expect("forwarded");
        }
        let extra = wk("extra.lab.test");
        let full = Limit::Connector;
        assert_eq!(o.claim_forward(&extra, t0, CAP), Claim::Full(full));
        assert_eq!(
            o.adopt(extra.clone(), Some(t0), t0, CAP),
            Adoption::Full(full)
        );
        assert_eq!(o.adopt(extra.clone(), None, t0, CAP), Adoption::Full(full));
        // Another connector has its own allowance.
        let other = (extra.0.clone(), "c2".to_owned());
        assert_eq!(o.adopt(other.clone(), Some(t0), t0, CAP), Adoption::Adopted);
        assert_eq!(o.adopt(other, None, t0, CAP), Adoption::Live);
        assert_eq!(o.count("c1"), N as u64);
        o.end(&wk("h0.lab.test"));
        assert_eq!(o.adopt(extra, Some(t0), t0, CAP), Adoption::Adopted);
        assert_eq!(o.expire(t0 + window).len(), N + 1);
        assert_eq!(o.count("c1"), 0);
        assert_eq!(o.sizes().0, 0);
    }

    /// A forward takes its window's place when it is claimed: accesses
    /// racing on other threads between the claim and the send cannot
    /// overshoot the cap (the bench once held cap + 1). A failed send gives
    /// the place back.
    #[test]
    fn a_claimed_forward_holds_its_place_under_the_cap() {
        let o = OnAccess::new(Duration::from_secs(60), Duration::from_secs(10));
        let t0 = Instant::now();
        let keys: Vec<_> = (0..N).map(|i| wk(&format!("h{i}.lab.test"))).collect();
        for k in &keys {
            assert_eq!(o.claim_forward(k, t0, CAP), Claim::Forward);
        }
        // None of them is sent yet: the next one is refused all the same.
        let extra = wk("extra.lab.test");
        assert_eq!(
            o.claim_forward(&extra, t0, CAP),
            Claim::Full(Limit::Connector)
        );
        assert_eq!(
            o.adopt(extra.clone(), None, t0, CAP),
            Adoption::Full(Limit::Connector)
        );
        assert_eq!(o.count("c1"), N as u64);
        // One send fails: its place is free again, and its window is gone.
        o.forward_failed(&keys[0]);
        assert!(!o.is_live(&keys[0].0, "c1", t0));
        assert_eq!(o.count("c1"), (N - 1) as u64);
        assert_eq!(o.claim_forward(&extra, t0, CAP), Claim::Forward);
        // A sent one that later fails to renew keeps its window.
        o.forwarded(keys[1].clone(), t0, CAP).expect("forwarded");
        o.forward_failed(&keys[1]);
        assert!(o.is_live(&keys[1].0, "c1", t0));
        assert_eq!(o.count("c1"), N as u64);
    }

    /// A window that ends between the claim and the send (it ran out, the
    /// connector said it stopped) gave its place to another: confirming
    /// the send opens it again only under the caps.
    #[test]
    fn a_window_that_ended_before_its_send_reopens_only_under_the_cap() {
        let window = Duration::from_secs(10);
        let o = OnAccess::new(window, Duration::from_secs(1));
        let caps = Caps {
            connector: 1,
            segment: usize::MAX,
        };
        let t0 = Instant::now();
        let (a, b) = (wk("a.lab.test"), wk("b.lab.test"));
        assert_eq!(o.claim_forward(&a, t0, caps), Claim::Forward);
        o.forwarded(a.clone(), t0, caps)
            .expect("a's window holds its place");
        // A renewal of a is claimed (its window holds its place) ...
        let later = t0 + Duration::from_secs(9);
        assert_eq!(o.claim_forward(&a, later, caps), Claim::Forward);
        // ... its window runs out, and b takes the place ...
        assert_eq!(o.expire(t0 + window), vec![a.clone()]);
        assert_eq!(o.claim_forward(&b, t0 + window, caps), Claim::Forward);
        o.forwarded(b.clone(), t0 + window, caps)
            .expect("b claimed");
        // ... so a's late confirmation finds the cap reached.
        assert_eq!(o.forwarded(a.clone(), later, caps), Err(Limit::Connector));
        assert_eq!(o.count("c1"), 1);
        assert!(!o.is_live(&a.0, "c1", t0 + window));
        // The same after the connector said it stopped checking.
        o.end(&b);
        assert_eq!(o.claim_forward(&a, t0 + window, caps), Claim::Forward);
        assert_eq!(
            o.claim_forward(&b, t0 + window, caps),
            Claim::Full(Limit::Connector)
        );
        o.end(&a);
        assert_eq!(o.claim_forward(&b, t0 + window, caps), Claim::Forward);
        assert_eq!(o.forwarded(a, t0 + window, caps), Err(Limit::Connector));
        o.forwarded(b, t0 + window, caps).expect("b claimed");
        assert_eq!(o.count("c1"), 1);
    }

    /// Many threads claiming, confirming, failing, adopting, ending and
    /// expiring windows at once never hold more than the caps, and the
    /// counts the caps are checked against stay a true count.
    #[test]
    fn the_caps_are_exact_under_concurrency() {
        use std::sync::atomic::{AtomicBool, Ordering};

        use std::sync::Arc;

        use rand::RngExt;
        let caps = Caps {
            connector: 16,
            segment: 24,
        };
        let window = Duration::from_millis(40);
        let o = Arc::new(OnAccess::new(window, Duration::from_millis(1)));
        let t0 = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..8u64)
            .map(|_| {
                let o = Arc::clone(&o);
                std::thread::spawn(move || {
                    let mut rng = rand::rng();
                    for i in 0..20_000u64 {
                        let now = t0 + Duration::from_millis(i / 10);
                        let k = wk_in(
                            ["s1", "s2"][rng.random_range(0..2)],
                            &format!("h{}.lab.test", rng.random_range(0..40)),
                            ["c1", "c2"][rng.random_range(0..2)],
                        );
                        match rng.random_range(0..10) {
                            0 | 1 => o.end(&k),
                            2 => drop(o.adopt(k, Some(now), now, caps)),
                            3 => drop(o.adopt(k, None, now, caps)),
                            4 => drop(o.expire(now)),
                            _ => {
                                if o.claim_forward(&k, now, caps) == Claim::Forward {
                                    if rng.random_range(0..8) == 0 {
                                        o.forward_failed(&k);
                                    } else {
                                        let _ = o.forwarded(k, now, caps);
                                    }
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        let watcher = {
            let (o, stop) = (Arc::clone(&o), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut worst = 0;
                while !stop.load(Ordering::Relaxed) {
                    let inner = lock(&o.inner);
                    for n in inner.per_connector.values() {
                        worst = worst.max(*n);
                    }
                    drop(inner);
                    std::thread::sleep(Duration::from_micros(50));
                }
                worst
            })
        };
        for w in workers {
            w.join().expect("worker");
        }
        stop.store(true, Ordering::Relaxed);
        let worst = watcher.join().expect("watcher");
        assert!(worst <= caps.connector, "{worst} windows on one connector");
        let inner = lock(&o.inner);
        let mut per_connector: HashMap<String, usize> = HashMap::new();
        let mut per_segment: HashMap<String, usize> = HashMap::new();
        for (key, c) in inner.windows.keys() {
            *per_connector.entry(c.clone()).or_default() += 1;
            *per_segment.entry(key.segment.clone()).or_default() += 1;
        }
        assert_eq!(per_connector, inner.per_connector);
        assert_eq!(per_segment, inner.per_segment);
        assert!(per_connector.values().all(|n| *n <= caps.connector));
        assert!(per_segment.values().all(|n| *n <= caps.segment));
    }

    /// Windows are capped per segment too, all its connectors
    /// together, so names sprayed under one segment leave the connectors
    /// room for the others; ended windows free their place.
    #[test]
    fn windows_per_segment_are_capped() {
        let window = Duration::from_secs(60);
        let o = OnAccess::new(window, Duration::from_secs(10));
        let caps = Caps {
            connector: 10,
            segment: 3,
        };
        let t0 = Instant::now();
        let flood = ["a", "b", "c"].map(|h| wk_in("wild", &format!("{h}.wild.test"), "c1"));
        for k in &flood[..2] {
            assert_eq!(o.claim_forward(k, t0, caps), Claim::Forward);
            o.forwarded(k.clone(), t0, caps).expect("forwarded");
        }
        // The segment's third window, on another connector, by a report.
        let on_c2 = wk_in("wild", "c.wild.test", "c2");
        assert_eq!(
            o.adopt(on_c2.clone(), Some(t0), t0, caps),
            Adoption::Adopted
        );
        let full = Limit::Segment;
        assert_eq!(o.claim_forward(&flood[2], t0, caps), Claim::Full(full));
        assert_eq!(
            o.adopt(flood[2].clone(), None, t0, caps),
            Adoption::Full(full)
        );
        assert_eq!(
            o.adopt(flood[2].clone(), Some(t0), t0, caps),
            Adoption::Full(full)
        );
        // Renewing a window the segment holds is no new window.
        assert_eq!(
            o.claim_forward(&flood[0], t0 + Duration::from_secs(20), caps),
            Claim::Forward
        );
        o.forwarded(flood[0].clone(), t0 + Duration::from_secs(20), caps)
            .expect("forwarded");
        // Another segment on the same connectors still gets its windows.
        let other = wk_in("lab", "x.lab.test", "c1");
        assert_eq!(o.claim_forward(&other, t0, caps), Claim::Forward);
        o.forwarded(other, t0, caps).expect("forwarded");
        // An ended window frees the segment's place.
        o.end(&on_c2);
        assert_eq!(o.claim_forward(&flood[2], t0, caps), Claim::Forward);
        o.forwarded(flood[2].clone(), t0, caps).expect("forwarded");
        assert_eq!(o.count("c1"), 4);
        assert_eq!(o.expire(t0 + window).len(), 3);
        assert_eq!(o.expire(t0 + Duration::from_secs(20) + window).len(), 1);
        assert_eq!(
            o.claim_forward(&on_c2, t0 + window * 2, caps),
            Claim::Forward
        );
    }
}

/// The CA's on-access state stays bounded under a flood of
/// distinct accesses and one huge report, and returns to its baseline
/// after the window and the retention (an injected clock drives
/// `housekeeping`; tokio's paused clock makes discovery waits instant).
#[cfg(test)]
mod bounded {
    use std::sync::Arc;
    use std::time::{Duration, Instant, SystemTime};

    use protocol::v1;
    use tokio::sync::Notify;

    use crate::access::decide::AccessRequest;
    use crate::state::authority::Authority;
    use crate::state::counters::OutcomeLabel;
    use crate::state::registry::{Arrival, LiveSession};
    use crate::store::Store;
    use crate::trust::identity::Identity;

    const N: usize = 100_000;
    const CAP: usize = 1000;

    const CONFIG: &str = r#"
        [selection]
        discovery_timeout_ms = 1
        [health]
        on_access_window_s = 30
        on_access_retention_s = 60
        max_windows_per_connector = 1000
        [[connector_groups]]
        name = "g"
        provisioning_key = "k-DmYStD7TW9CYc4cdPkm9zUgy"
        [[segments]]
        name = "wild"
        applications = ["*.wild.test"]
        tcp_ports = ["443"]
        health_reporting = "on_access"
        connector_groups = ["g"]
    "#;

    fn entry(host: &str) -> v1::ApplicationHealth {
        v1::ApplicationHealth {
            app: Some(v1::ApplicationKey {
                segment: "wild".into(),
                host: host.into(),
                protocol: v1::Protocol::Tcp as i32,
                port: 443,
            }),
            status: v1::HealthStatus::Up as i32,
            addresses: vec![v1::AddressResult {
                reason: None,
                certificate_not_after_unix_s: None,
                address: "10.0.0.1".into(),
                status: v1::HealthStatus::Up as i32,
                method: v1::CheckMethod::Tcp as i32,
                ..Default::default()
            }],
            checked_at_unix_ms: 1,
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn state_is_bounded_and_returns_to_baseline_after_the_retention() {
        let config = crate::Config::from_toml(CONFIG, std::path::Path::new(".")).expect("valid");
        let a = Authority::with_trust(config, None, Store::in_memory().expect("db"));
        let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
        // The connector takes every access event.
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let hello = v1::Hello::default();
        let session = LiveSession {
            id: 1,
            label: "test".into(),
            cert_serial: None,
            key_sha256: None,
            cert_root: None,
            tx,
            kill: Arc::new(Notify::new()),
            draining: None,
        };
        let arrival = Arrival {
            name: "c1",
            group: "g",
            hello: &hello,
        };
        a.registry().open_pending("c1", session);
        a.registry()
            .register(arrival, 1, |_| 0)
            .expect("the pending stream registers");
        let baseline = (a.health().len(), a.on_access().sizes());
        assert_eq!(baseline, (0, (0, 0)));

        for i in 0..N {
            let request = AccessRequest {
                host: format!("h{i}.wild.test"),
                protocol: policy::Protocol::Tcp,
                port: 443,
            };
            crate::access::decide::resolve(&a, request)
                .await
                .expect("a valid request");
            if i % 1000 == 0 {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(a.on_access().count("c1"), CAP as u64);
        let (windows, coalescing) = a.on_access().sizes();
        assert!(
            windows <= CAP && coalescing <= CAP,
            "{windows} {coalescing}"
        );
        let refused = |origin: &str| {
            a.metrics()
                .windows_refused
                .get_or_create(&OutcomeLabel {
                    outcome: origin.into(),
                })
                .get()
        };
        assert_eq!(refused("access"), (N - CAP) as u64);

        // One report of N entries for hosts nobody accessed (plus the
        // accessed ones): only what fits in the cap is stored.
        let identity = Identity {
            name: "c1".into(),
            group: Arc::from("g"),
        };
        let mut applications: Vec<_> = (0..CAP)
            .map(|i| entry(&format!("h{i}.wild.test")))
            .collect();
        applications.extend((0..N).map(|i| entry(&format!("r{i}.wild.test"))));
        // Fields added to the message later keep their defaults.
        #[allow(clippy::needless_update)]
        let report = v1::HealthReport {
            applications,
            full_state: false,
            ..Default::default()
        };
        let now = Instant::now();
        crate::intake::reports::intake(
            &a,
            &identity,
            &a.snapshot(),
            report,
            now,
            SystemTime::now(),
        );
        assert!(a.health().len() <= CAP, "{}", a.health().len());
        assert_eq!(a.on_access().count("c1"), CAP as u64);
        assert_eq!(refused("report"), N as u64);

        // Listed (Unknown) after the window ends, gone once the retention
        // has passed since their last report.
        crate::housekeeping::run_once(&a, now + Duration::from_secs(31));
        assert_eq!(a.on_access().sizes(), (0, 0));
        assert_eq!(a.health().len(), CAP);
        crate::housekeeping::run_once(&a, now + Duration::from_secs(60));
        assert_eq!((a.health().len(), a.on_access().sizes()), baseline);
        drain.abort();
    }
}

/// Decisions rest only on windows an access opened. A report no
/// access asked for is listed but not routed on; an access id issued by
/// another replica sharing the store opens the window; a forged, moved,
/// lapsed or foreign id does not. Each replica's connector queue is closed
/// so that no access can open a window on it: only the report can.
#[cfg(test)]
mod opened_by_access {
    use std::sync::Arc;
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use policy::{AppKey, Host, Protocol};
    use protocol::v1;
    use tokio::sync::{Notify, mpsc};

    use crate::access::decide::{AccessOutcome, AccessRequest};
    use crate::state::authority::Authority;
    use crate::state::registry::{Arrival, LiveSession};
    use crate::store::{Store, StoreLocation};
    use crate::trust::identity::Identity;

    const CONFIG: &str = r#"
        [selection]
        discovery_timeout_ms = 1
        [health]
        on_access_window_s = 30
        [[connector_groups]]
        name = "g"
        provisioning_key = "k-DmYStD7TW9CYc4cdPkm9zUgy"
        [[segments]]
        name = "wild"
        applications = ["*.wild.test"]
        tcp_ports = ["443"]
        health_reporting = "on_access"
        connector_groups = ["g"]
    "#;

    type Queue = mpsc::Receiver<Result<v1::AuthorityMessage, tonic::Status>>;

    /// A replica on `store` with connector `c1` connected; the receiving end
    /// of c1's queue.
    fn replica(store: Store) -> (Authority, Queue) {
        let config = crate::Config::from_toml(CONFIG, std::path::Path::new(".")).expect("valid");
        let a = Authority::with_trust(config, None, store);
        let (tx, rx) = mpsc::channel(16);
        let hello = v1::Hello::default();
        let session = LiveSession {
            id: 1,
            label: "test".into(),
            cert_serial: None,
            key_sha256: None,
            cert_root: None,
            tx,
            kill: Arc::new(Notify::new()),
            draining: None,
        };
        a.registry().open_pending("c1", session);
        a.registry()
            .register(
                Arrival {
                    name: "c1",
                    group: "g",
                    hello: &hello,
                },
                1,
                |_| 0,
            )
            .expect("the pending stream registers");
        (a, rx)
    }

    fn key(host: &str) -> AppKey {
        AppKey {
            segment: "wild".into(),
            host: Host::parse(host).expect("host"),
            protocol: Protocol::Tcp,
            port: 443,
        }
    }

    /// c1 reports `host` Up, echoing `access_id`.
    fn report(a: &Authority, host: &str, access_id: &str) {
        let entry = v1::ApplicationHealth {
            app: Some(v1::ApplicationKey::from(&key(host))),
            status: v1::HealthStatus::Up as i32,
            addresses: vec![v1::AddressResult {
                reason: None,
                certificate_not_after_unix_s: None,
                address: "10.0.0.1".into(),
                status: v1::HealthStatus::Up as i32,
                method: v1::CheckMethod::Tcp as i32,
                ..Default::default()
            }],
            checked_at_unix_ms: 1,
            access_id: access_id.into(),
            ..Default::default()
        };
        let identity = Identity {
            name: "c1".into(),
            group: Arc::from("g"),
        };
        let report = v1::HealthReport {
            applications: vec![entry],
            ..Default::default()
        };
        crate::intake::reports::intake(
            a,
            &identity,
            &a.snapshot(),
            report,
            Instant::now(),
            SystemTime::now(),
        );
    }

    async fn access(a: &Authority, host: &str) -> AccessOutcome {
        crate::access::decide::resolve(
            a,
            AccessRequest {
                host: host.into(),
                protocol: Protocol::Tcp,
                port: 443,
            },
        )
        .await
        .expect("a valid request")
    }

    /// Whether an access to `host` is routed to c1.
    async fn routed(a: &Authority, host: &str) -> bool {
        match access(a, host).await.decision {
            Ok(s) => s.connector == "c1",
            Err(_) => false,
        }
    }

    fn unix_ms_now() -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    }

    #[tokio::test(start_paused = true)]
    async fn an_unsolicited_report_is_listed_but_not_routed_on() {
        let (a, rx) = replica(Store::in_memory().expect("db"));
        drop(rx);
        report(&a, "nobody.wild.test", "");
        assert!(
            !routed(&a, "nobody.wild.test").await,
            "routed on a result no access asked for"
        );
        let apps = crate::api::views::applications(&a, None);
        let app = apps
            .iter()
            .find(|v| v.host == "nobody.wild.test")
            .expect("the report is listed");
        assert_eq!(app.connectors[0].status, policy::Status::Unknown);
        assert_eq!(app.connectors[0].unknown_cause, Some("unsolicited"));
        assert_eq!(a.metrics().unsolicited_entries.get(), 1);
        // The entry opened no window: nothing is counted live for c1's
        // load, beyond the place it holds under the cap.
        assert!(
            !a.on_access()
                .is_live(&key("nobody.wild.test"), "c1", Instant::now())
        );
    }

    /// Replicas A and B share `pair`'s store; A forwards the access, B
    /// sees only c1's report.
    async fn ids_cross_replicas(pair: (Store, Store)) {
        let (a, mut to_c1) = replica(pair.0);
        let (b, rx) = replica(pair.1);
        drop(rx);
        let _ = access(&a, "seen.wild.test").await;
        let id = match to_c1.try_recv() {
            Ok(Ok(v1::AuthorityMessage {
                kind: Some(v1::authority_message::Kind::Access(e)),
            })) => e.access_id,
            other => panic!("A forwards the access to c1: {other:?}"),
        };
        assert!(!id.is_empty(), "the forward carries an access id");

        // Forged ids: another application's, another deployment's, one
        // whose tag is wrong, one a window old, one from the future.
        let foreign = replica(Store::in_memory().expect("db")).0;
        let now_ms = unix_ms_now();
        let forged = [
            ("moved.wild.test", id.clone()),
            (
                "foreign.wild.test",
                foreign
                    .access_ids()
                    .issue("c1", &key("foreign.wild.test"), now_ms),
            ),
            ("tag.wild.test", format!("a1.{now_ms}.{}", "0".repeat(32))),
            (
                "lapsed.wild.test",
                a.access_ids()
                    .issue("c1", &key("lapsed.wild.test"), now_ms - 31_000),
            ),
            (
                "future.wild.test",
                a.access_ids()
                    .issue("c1", &key("future.wild.test"), now_ms + 600_000),
            ),
        ];
        for (host, forged_id) in &forged {
            report(&b, host, forged_id);
            assert!(
                !routed(&b, host).await,
                "B routed {host} on a forged id {forged_id:?}"
            );
        }
        assert_eq!(b.metrics().unsolicited_entries.get(), forged.len() as u64);

        // The genuine id, issued by A, opens the window on B.
        report(&b, "seen.wild.test", &id);
        assert!(
            routed(&b, "seen.wild.test").await,
            "B honours the access id A issued"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_id_from_another_replica_is_honoured_and_a_forged_one_is_not() {
        let dir = std::env::temp_dir().join(format!(
            "reach-access-id-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = StoreLocation::Sqlite(dir.join("reach.db"));
        ids_cross_replicas((
            Store::open(&path).expect("db"),
            Store::open(&path).expect("db"),
        ))
        .await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(start_paused = true)]
    async fn an_id_from_another_replica_is_honoured_on_postgres() {
        let url = test_support::Postgres::shared()
            .fresh_database()
            .expect("database");
        let open = || {
            Store::open(&StoreLocation::Postgres {
                url: url.clone(),
                password: None,
            })
            .expect("PostgreSQL store")
        };
        ids_cross_replicas((open(), open())).await;
    }

    const CAPS: super::Caps = super::Caps {
        connector: 10,
        segment: 10,
    };

    /// A window opened by a verified id ends a window after the access it
    /// names, not after the report.
    #[test]
    fn an_adopted_window_counts_from_the_access() {
        let o = super::OnAccess::new(Duration::from_secs(30), Duration::from_secs(10));
        let t0 = Instant::now();
        let wk = (key("a.wild.test"), "c1".to_owned());
        let accessed = t0;
        let reported = t0 + Duration::from_secs(20);
        assert_eq!(
            o.adopt(wk.clone(), Some(accessed), reported, CAPS),
            super::Adoption::Adopted
        );
        assert!(o.is_live(&wk.0, "c1", t0 + Duration::from_secs(29)));
        assert!(!o.is_live(&wk.0, "c1", t0 + Duration::from_secs(30)));
        // An unsolicited entry is never live, and an access turns it into
        // a window.
        let other = (key("b.wild.test"), "c1".to_owned());
        assert_eq!(
            o.adopt(other.clone(), None, t0, CAPS),
            super::Adoption::Unsolicited
        );
        assert!(!o.is_live(&other.0, "c1", t0));
        assert!(o.is_unsolicited(&other.0, "c1", t0));
        assert_eq!(o.count("c1"), 2, "it holds a place under the cap");
        o.forwarded(other.clone(), t0, CAPS).expect("forwarded");
        assert!(o.is_live(&other.0, "c1", t0));
        assert!(!o.is_unsolicited(&other.0, "c1", t0));
        assert_eq!(o.count("c1"), 2);
    }
}
