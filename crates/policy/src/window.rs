//! On-access window bookkeeping and access-event coalescing.
//!
//! Time is passed in as `Instant`s; nothing here reads a clock.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

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
            .is_some_and(|&last| now < last + self.window)
    }

    /// When `key`'s window ends, if it has one.
    pub fn expires_at(&self, key: &K) -> Option<Instant> {
        self.last_access.get(key).map(|&last| last + self.window)
    }

    /// Removes and returns every key whose window has ended at `now`.
    pub fn expire(&mut self, now: Instant) -> Vec<K> {
        let window = self.window;
        let expired: Vec<K> = self
            .last_access
            .iter()
            .filter(|(_, last)| now >= **last + window)
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

    /// The earliest end of any window.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.last_access
            .values()
            .min()
            .map(|&last| last + self.window)
    }

    /// Keys with a window (live or not yet expired by `expire`).
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.last_access.keys()
    }

    /// Number of keys with a window.
    pub fn len(&self) -> usize {
        self.last_access.len()
    }

    /// Whether no key has a window.
    pub fn is_empty(&self) -> bool {
        self.last_access.is_empty()
    }
}

/// Forwards an event for a key at most once per `min_gap`, so repeated
/// accesses renew connectors' windows without flooding them.
#[derive(Clone, Debug)]
pub struct Coalescer<K> {
    min_gap: Duration,
    last_forwarded: HashMap<K, Instant>,
}

impl<K: Eq + Hash + Clone> Coalescer<K> {
    /// A coalescer that lets one event per key through every `min_gap`.
    pub fn new(min_gap: Duration) -> Self {
        Coalescer {
            min_gap,
            last_forwarded: HashMap::new(),
        }
    }

    /// Whether an event for `key` at `now` should be forwarded; records it
    /// when so.
    pub fn should_forward(&mut self, key: &K, now: Instant) -> bool {
        match self.last_forwarded.get_mut(key) {
            Some(last) if now < *last + self.min_gap => false,
            Some(last) => {
                *last = now;
                true
            }
            None => {
                self.last_forwarded.insert(key.clone(), now);
                true
            }
        }
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

    /// Drops entries older than `min_gap`, bounding memory.
    pub fn prune(&mut self, now: Instant) {
        let gap = self.min_gap;
        self.last_forwarded.retain(|_, &mut last| now < last + gap);
    }
}
