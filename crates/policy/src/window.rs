//! On-access window bookkeeping and access-event coalescing.
//!
//! Time is passed in as `Instant`s; nothing here reads a clock.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// `last + span`, or `None` when that lies beyond what `Instant` can hold:
/// a window or gap that long never ends. (`Instant + Duration` would panic,
/// and the lengths come from operator configuration.)
fn end_of(last: Instant, span: Duration) -> Option<Instant> {
    last.checked_add(span)
}

/// Whether the span that started at `last` has ended at `now` (half-open:
/// at exactly `last + span` it has ended).
fn has_ended(last: Instant, span: Duration, now: Instant) -> bool {
    end_of(last, span).is_some_and(|end| now >= end)
}

/// What an access did to a key's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The key had no live window: checks must start now.
    Started,
    /// The key's window was live and now lasts longer.
    Renewed,
}

/// On-access windows: a key is live from an access until `window` after the
/// last access.
#[derive(Clone, Debug)]
pub struct AccessWindows<K> {
    window: Duration,
    last_access: HashMap<K, Instant>,
}

impl<K: Eq + Hash + Clone> AccessWindows<K> {
    /// Windows of length `window` (30 minutes by default in reach).
    pub fn new(window: Duration) -> Self {
        AccessWindows {
            window,
            last_access: HashMap::new(),
        }
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Changes the window length; applies to live windows too.
    pub fn set_window(&mut self, window: Duration) {
        self.window = window;
    }

    /// Records an access at `now`.
    pub fn record(&mut self, key: K, now: Instant) -> Renewal {
        let live = self.is_live(&key, now);
        let entry = self.last_access.entry(key).or_insert(now);
        if now > *entry {
            *entry = now;
        }
        if live {
            Renewal::Renewed
        } else {
            *entry = now;
            Renewal::Started
        }
    }

    /// Whether `key`'s window is live at `now` (the window is half-open:
    /// at exactly `last + window` it has ended).
    pub fn is_live(&self, key: &K, now: Instant) -> bool {
        self.last_access
            .get(key)
            .is_some_and(|&last| !has_ended(last, self.window, now))
    }

    /// When `key`'s window ends, if it has one (`None` also when the window
    /// is too long to ever end).
    pub fn expires_at(&self, key: &K) -> Option<Instant> {
        self.last_access
            .get(key)
            .and_then(|&last| end_of(last, self.window))
    }

    /// Removes and returns every key whose window has ended at `now`.
    pub fn expire(&mut self, now: Instant) -> Vec<K> {
        let window = self.window;
        let expired: Vec<K> = self
            .last_access
            .iter()
            .filter(|&(_, &last)| has_ended(last, window, now))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &expired {
            self.last_access.remove(k);
        }
        expired
    }

    /// Forgets `key` (e.g. its segment was removed).
    pub fn remove(&mut self, key: &K) -> bool {
        self.last_access.remove(key).is_some()
    }

    /// Keeps only keys for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.last_access.retain(|k, _| keep(k));
    }

    /// The earliest end of any window (`None` when there is none, or the
    /// windows are too long to ever end).
    pub fn next_expiry(&self) -> Option<Instant> {
        self.last_access
            .values()
            .min()
            .and_then(|&last| end_of(last, self.window))
    }

    /// Keys with a window (live or not yet expired by `expire`).
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.last_access.keys()
    }

    /// Number of keys with a window.
    pub fn len(&self) -> usize {
        self.last_access.len()
    }

    /// Whether `key` has a window (live or not yet expired by `expire`).
    pub fn contains(&self, key: &K) -> bool {
        self.last_access.contains_key(key)
    }

    /// Whether no key has a window.
    pub fn is_empty(&self) -> bool {
        self.last_access.is_empty()
    }
}

/// Forwards an event for a key at most once per `min_gap`, so repeated
/// accesses renew connectors' windows without flooding them, and never
/// loses the latest one: an event held back within the gap is owed as a
/// *renewal* (`due_renewals`) once the gap has passed, carrying when it
/// happened, so the receiver's window still ends a window after the last
/// event, not after the last forwarded one (leading and trailing edge).
#[derive(Clone, Debug)]
pub struct Coalescer<K> {
    min_gap: Duration,
    last_forwarded: HashMap<K, Forwarded>,
}

#[derive(Clone, Copy, Debug)]
struct Forwarded {
    /// When the last event (or renewal) was sent.
    sent: Instant,
    /// The latest event held back since then, if any.
    held: Option<Instant>,
}

impl<K: Eq + Hash + Clone> Coalescer<K> {
    /// A coalescer that lets one event per key through every `min_gap`.
    pub fn new(min_gap: Duration) -> Self {
        Coalescer {
            min_gap,
            last_forwarded: HashMap::new(),
        }
    }

    /// The gap.
    pub fn min_gap(&self) -> Duration {
        self.min_gap
    }

    /// Whether an event for `key` at `now` should be forwarded; records it
    /// when so, else holds it back for `due_renewals`.
    pub fn should_forward(&mut self, key: &K, now: Instant) -> bool {
        match self.last_forwarded.get_mut(key) {
            Some(last) if !has_ended(last.sent, self.min_gap, now) => {
                last.held = Some(last.held.map_or(now, |h| h.max(now)));
                false
            }
            Some(last) => {
                *last = Forwarded {
                    sent: now,
                    held: None,
                };
                true
            }
            None => {
                self.last_forwarded.insert(
                    key.clone(),
                    Forwarded {
                        sent: now,
                        held: None,
                    },
                );
                true
            }
        }
    }

    /// Forwards an event for `key` at `now` regardless of the gap, unless
    /// one was sent less than `min` ago (a caller that needs the receiver to
    /// act now, e.g. re-check, still must not flood it). Records it when so.
    pub fn force_forward(&mut self, key: &K, now: Instant, min: Duration) -> bool {
        if let Some(last) = self.last_forwarded.get(key)
            && !has_ended(last.sent, min, now)
        {
            return self.should_forward(key, now);
        }
        self.last_forwarded.insert(
            key.clone(),
            Forwarded {
                sent: now,
                held: None,
            },
        );
        true
    }

    /// The renewals owed at `now`: every key with an event held back whose
    /// gap has passed, with when its latest held event happened. They count
    /// as forwarded at `now`.
    pub fn due_renewals(&mut self, now: Instant) -> Vec<(K, Instant)> {
        let gap = self.min_gap;
        let mut due = Vec::new();
        for (k, f) in &mut self.last_forwarded {
            if let Some(held) = f.held
                && has_ended(f.sent, gap, now)
            {
                due.push((k.clone(), held));
                *f = Forwarded {
                    sent: now,
                    held: None,
                };
            }
        }
        due
    }

    /// When the next renewal falls due, if any is owed.
    pub fn next_renewal(&self) -> Option<Instant> {
        self.last_forwarded
            .values()
            .filter(|f| f.held.is_some())
            .filter_map(|f| end_of(f.sent, self.min_gap))
            .min()
    }

    /// Forgets `key`, so its next event is forwarded (e.g. after the
    /// connector reconnected and lost its windows).
    pub fn forget(&mut self, key: &K) {
        self.last_forwarded.remove(key);
    }

    /// Keeps only keys for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.last_forwarded.retain(|k, _| keep(k));
    }

    /// Drops entries older than `min_gap` with nothing owed, bounding
    /// memory.
    pub fn prune(&mut self, now: Instant) {
        let gap = self.min_gap;
        self.last_forwarded
            .retain(|_, f| f.held.is_some() || !has_ended(f.sent, gap, now));
    }

    /// Number of keys tracked.
    pub fn len(&self) -> usize {
        self.last_forwarded.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.last_forwarded.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(30 * 60);

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn an_access_starts_a_window_and_later_accesses_renew_it() {
        let t0 = Instant::now();
        let mut w = AccessWindows::new(WINDOW);
        assert!(w.is_empty());
        assert!(!w.is_live(&"jira", t0));
        assert_eq!(w.record("jira", t0), Renewal::Started);
        assert!(w.is_live(&"jira", t0));
        assert_eq!(w.expires_at(&"jira"), Some(t0 + WINDOW));
        assert_eq!(w.record("jira", t0 + secs(600)), Renewal::Renewed);
        assert_eq!(w.expires_at(&"jira"), Some(t0 + secs(600) + WINDOW));
        // The old end has passed, the renewed one has not.
        assert!(w.is_live(&"jira", t0 + WINDOW));
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn a_window_ends_at_exactly_last_access_plus_window() {
        let t0 = Instant::now();
        let mut w = AccessWindows::new(WINDOW);
        w.record("jira", t0);
        let end = t0 + WINDOW;
        let just_before = end - Duration::from_nanos(1);
        assert!(w.is_live(&"jira", just_before));
        assert!(w.expire(just_before).is_empty());
        assert!(!w.is_live(&"jira", end));
        assert_eq!(w.expire(end), vec!["jira"]);
        assert!(w.is_empty());
        assert_eq!(w.expires_at(&"jira"), None);
        // Expiry is reported once.
        assert!(w.expire(end + secs(1)).is_empty());
    }

    #[test]
    fn an_access_after_the_window_ended_starts_a_new_one() {
        let t0 = Instant::now();
        let mut w = AccessWindows::new(WINDOW);
        w.record("jira", t0);
        // Not yet swept by `expire`, but over: this is a new start.
        assert_eq!(w.record("jira", t0 + WINDOW), Renewal::Started);
        assert_eq!(w.expires_at(&"jira"), Some(t0 + WINDOW + WINDOW));
    }

    #[test]
    fn an_out_of_order_access_does_not_shorten_a_window() {
        let t0 = Instant::now();
        let mut w = AccessWindows::new(WINDOW);
        w.record("jira", t0 + secs(100));
        assert_eq!(w.record("jira", t0 + secs(50)), Renewal::Renewed);
        assert_eq!(w.expires_at(&"jira"), Some(t0 + secs(100) + WINDOW));
    }

    #[test]
    fn expire_removes_only_ended_windows() {
        let t0 = Instant::now();
        let mut w = AccessWindows::new(WINDOW);
        w.record("a", t0);
        w.record("b", t0 + secs(10));
        w.record("c", t0 + secs(20));
        assert_eq!(w.next_expiry(), Some(t0 + WINDOW));
        let mut gone = w.expire(t0 + secs(10) + WINDOW);
        gone.sort_unstable();
        assert_eq!(gone, vec!["a", "b"]);
        assert_eq!(w.keys().copied().collect::<Vec<_>>(), vec!["c"]);
        assert_eq!(w.next_expiry(), Some(t0 + secs(20) + WINDOW));
        assert_eq!(w.expire(t0 + secs(20) + WINDOW), vec!["c"]);
        assert_eq!(w.next_expiry(), None);
    }

    #[test]
    fn set_window_applies_to_live_windows() {
        let t0 = Instant::now();
        let mut w = AccessWindows::new(WINDOW);
        w.record("jira", t0);
        w.set_window(secs(60));
        assert_eq!(w.window(), secs(60));
        assert_eq!(w.expires_at(&"jira"), Some(t0 + secs(60)));
        assert_eq!(w.next_expiry(), Some(t0 + secs(60)));
        assert!(!w.is_live(&"jira", t0 + secs(60)));
        assert_eq!(w.expire(t0 + secs(60)), vec!["jira"]);
        // Lengthening works the same way.
        w.record("wiki", t0);
        w.set_window(secs(7200));
        assert!(w.is_live(&"wiki", t0 + secs(3600)));
    }

    #[test]
    fn remove_and_retain_forget_keys() {
        let t0 = Instant::now();
        let mut w = AccessWindows::new(WINDOW);
        w.record("a", t0);
        w.record("b", t0);
        w.record("c", t0);
        assert!(w.remove(&"a"));
        assert!(!w.remove(&"a"));
        w.retain(|k| *k != "b");
        assert_eq!(w.keys().copied().collect::<Vec<_>>(), vec!["c"]);
    }

    #[test]
    fn a_zero_window_is_never_live() {
        let t0 = Instant::now();
        let mut w = AccessWindows::new(Duration::ZERO);
        assert_eq!(w.record("jira", t0), Renewal::Started);
        assert!(!w.is_live(&"jira", t0));
        assert_eq!(w.record("jira", t0), Renewal::Started);
        assert_eq!(w.expire(t0), vec!["jira"]);
    }

    #[test]
    fn an_endless_window_neither_panics_nor_expires() {
        let t0 = Instant::now();
        let mut w = AccessWindows::new(Duration::MAX);
        assert_eq!(w.record("jira", t0), Renewal::Started);
        assert!(w.is_live(&"jira", t0 + secs(1_000_000_000)));
        assert_eq!(w.record("jira", t0 + secs(1)), Renewal::Renewed);
        assert_eq!(w.expires_at(&"jira"), None);
        assert_eq!(w.next_expiry(), None);
        assert!(w.expire(t0 + secs(1_000_000_000)).is_empty());
        assert_eq!(w.len(), 1);
    }

    #[test]
    fn the_coalescer_forwards_once_per_gap() {
        let t0 = Instant::now();
        let gap = secs(60);
        let mut c = Coalescer::new(gap);
        assert!(c.should_forward(&"jira", t0));
        assert!(!c.should_forward(&"jira", t0));
        assert!(!c.should_forward(&"jira", t0 + gap - Duration::from_nanos(1)));
        // Other keys are independent.
        assert!(c.should_forward(&"wiki", t0 + secs(1)));
        // At exactly the gap the next event goes through, and restarts it.
        assert!(c.should_forward(&"jira", t0 + gap));
        assert!(!c.should_forward(&"jira", t0 + gap + secs(59)));
        assert!(c.should_forward(&"jira", t0 + gap + secs(60)));
    }

    #[test]
    fn a_forgotten_key_is_forwarded_at_once() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(secs(60));
        assert!(c.should_forward(&"jira", t0));
        c.forget(&"jira");
        assert!(c.should_forward(&"jira", t0 + secs(1)));
        c.retain(|k| *k != "jira");
        assert!(c.should_forward(&"jira", t0 + secs(2)));
    }

    #[test]
    fn prune_drops_only_entries_older_than_the_gap() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(secs(60));
        c.should_forward(&"old", t0);
        c.should_forward(&"new", t0 + secs(30));
        c.prune(t0 + secs(60));
        // "old" was pruned, so it forwards; "new" is still suppressed.
        assert!(!c.should_forward(&"new", t0 + secs(61)));
        assert_eq!(c.len(), 1);
        assert!(c.should_forward(&"old", t0 + secs(61)));
    }

    #[test]
    fn an_endless_gap_forwards_once_without_panicking() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::MAX);
        assert!(c.should_forward(&"jira", t0));
        assert!(!c.should_forward(&"jira", t0 + secs(1_000_000_000)));
        c.prune(t0 + secs(1_000_000_000));
        assert!(!c.should_forward(&"jira", t0 + secs(1_000_000_001)));
    }

    /// Accesses held back by the gap are not lost; the window
    /// they renew ends a window after the last access, not after the last
    /// forwarded one.
    #[test]
    fn held_back_events_are_owed_as_one_renewal_after_the_gap() {
        let t0 = Instant::now();
        let gap = secs(60);
        let window = secs(1800);
        let mut c = Coalescer::new(gap);
        // The receiver's window, renewed only by what gets through.
        let mut receiver = AccessWindows::new(window);
        assert!(c.should_forward(&"jira", t0));
        receiver.record("jira", t0);
        assert!(!c.should_forward(&"jira", t0 + secs(10)));
        assert!(!c.should_forward(&"jira", t0 + secs(50)));
        assert_eq!(c.next_renewal(), Some(t0 + gap));
        assert!(
            c.due_renewals(t0 + gap - Duration::from_nanos(1))
                .is_empty()
        );
        let due = c.due_renewals(t0 + gap);
        assert_eq!(due, vec![("jira", t0 + secs(50))]);
        for (k, at) in due {
            receiver.record(k, at);
        }
        // Owed once; nothing more until another event is held back.
        assert!(c.due_renewals(t0 + gap * 3).is_empty());
        assert_eq!(c.next_renewal(), None);
        // The window ends exactly a window after the last access.
        assert_eq!(receiver.expires_at(&"jira"), Some(t0 + secs(50) + window));
        // The renewal counts as a forward: the gap restarts from it.
        assert!(!c.should_forward(&"jira", t0 + gap + secs(1)));
        // Pruning keeps what is owed.
        c.prune(t0 + gap * 10);
        assert_eq!(
            c.due_renewals(t0 + gap * 10),
            vec![("jira", t0 + gap + secs(1))]
        );
    }

    #[test]
    fn a_forced_forward_skips_the_gap_but_not_its_minimum() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(secs(60));
        assert!(c.should_forward(&"jira", t0));
        assert!(!c.force_forward(&"jira", t0 + Duration::from_millis(500), secs(1)));
        assert!(c.force_forward(&"jira", t0 + secs(1), secs(1)));
        assert!(!c.should_forward(&"jira", t0 + secs(2)));
        assert!(c.force_forward(&"new", t0, secs(1)));
        assert_eq!(c.len(), 2);
    }
}
