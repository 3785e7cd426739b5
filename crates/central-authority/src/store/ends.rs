//! Where a shared history ends, as one replica knows it: per key, the
//! status its last row ended with, which the next row is compared with
//! (a row with the same status is another replica's copy of a transition
//! already recorded).
//!
//! PostgreSQL keeps the status history and the address history for every
//! replica; each replica keeps this in memory and brings it up to date at
//! the start of its turn as a writer by reading the rows appended since it
//! last looked (`seq` above `seen`: the other replicas' rows, none when it
//! writes alone). The latest tables are a checkpoint of it that a starting
//! replica reads once, written every few minutes, not per transition (a
//! probe of the table and an update of its row were two thirds of the
//! database's work per transition).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use super::{EventKey, HistoryRow, KeyMap};

/// One key's end as the latest table stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LatestRow {
    pub(crate) host: String,
    pub(crate) port: i64,
    /// The connector, or the address for the address history.
    pub(crate) subject: String,
    pub(crate) segment: String,
    pub(crate) protocol: String,
    pub(crate) to: String,
    pub(crate) at_ms: i64,
}

impl LatestRow {
    /// The end `r` leaves its key with.
    pub(crate) fn of<R: HistoryRow>(r: &R) -> LatestRow {
        let (segment, host, protocol, port, subject) = r.history_key();
        LatestRow {
            host: host.to_owned(),
            port,
            subject: subject.to_owned(),
            segment: segment.to_owned(),
            protocol: protocol.to_owned(),
            to: r.to_status().to_owned(),
            at_ms: r.at_ms(),
        }
    }

    fn key(&self) -> EventKey<'_> {
        (
            &self.segment,
            &self.host,
            &self.protocol,
            self.port,
            &self.subject,
        )
    }
}

/// One key's end: its status (an index into `Ends::statuses`) and its
/// row's time. 32 bytes with the key's hash.
#[derive(Debug)]
struct End {
    status: u32,
    at_ms: i64,
}

/// What one replica knows of where one history ends.
#[derive(Debug)]
pub(crate) struct Ends {
    /// The history's rows up to this `seq` are in `ends`; `None` until the
    /// checkpoint was read.
    pub(crate) seen: Option<i64>,
    /// Two independently keyed SipHashes of a key: 128 bits, so that two
    /// keys share an entry with a chance of about n² / 2¹²⁹ (10⁻²⁸ at a
    /// million keys), and keys cannot be chosen to collide without the
    /// replica's random keys. Far less memory than the key's text.
    hashers: (RandomState, RandomState),
    ends: HashMap<u128, End>,
    /// Each status text once (a handful: up, down, unknown, ...).
    statuses: Vec<Box<str>>,
    /// Keys whose end changed since the checkpoint, with the `seq` of the
    /// row that changed it (at most: a batch of one's own is marked with
    /// its last `seq`).
    dirty: HashMap<u128, (i64, LatestRow)>,
    /// The prune cutoff already applied (rows before it are gone).
    pruned_ms: i64,
}

impl Default for Ends {
    fn default() -> Ends {
        Ends {
            seen: None,
            hashers: (RandomState::new(), RandomState::new()),
            ends: HashMap::new(),
            statuses: Vec::new(),
            dirty: HashMap::new(),
            pruned_ms: i64::MIN,
        }
    }
}

impl Ends {
    /// The index of status `to`, added when new.
    fn status(&mut self, to: &str) -> u32 {
        match self.statuses.iter().position(|s| &**s == to) {
            Some(i) => i as u32,
            None => {
                self.statuses.push(to.into());
                (self.statuses.len() - 1) as u32
            }
        }
    }

    fn hash(&self, key: EventKey<'_>) -> u128 {
        (u128::from(self.hashers.0.hash_one(key)) << 64) | u128::from(self.hashers.1.hash_one(key))
    }

    /// Starts from the checkpoint: the latest table's `rows`, which hold
    /// the history up to `seq`.
    pub(crate) fn load(&mut self, rows: impl IntoIterator<Item = LatestRow>, seq: i64) {
        self.ends.clear();
        self.dirty.clear();
        for row in rows {
            self.set(&row);
        }
        self.seen = Some(seq);
    }

    /// `row`'s key ends with it; the key's hash.
    fn set(&mut self, row: &LatestRow) -> u128 {
        let h = self.hash(row.key());
        let status = self.status(&row.to);
        self.ends.insert(
            h,
            End {
                status,
                at_ms: row.at_ms,
            },
        );
        h
    }

    /// Row `seq` of the history, read or written, ends its key with `row`.
    pub(crate) fn apply(&mut self, seq: i64, row: LatestRow) {
        let h = self.set(&row);
        self.dirty.insert(h, (seq, row));
        self.seen = Some(self.seen.map_or(seq, |s| s.max(seq)));
    }

    /// The status each key of `events` ends with, for those that have one
    /// (what `fresh_rows` compares the batch with).
    pub(crate) fn latest_for<'a, R: HistoryRow>(&self, events: &'a [R]) -> KeyMap<'a, String> {
        let mut latest = KeyMap::default();
        for e in events {
            let key = e.history_key();
            if latest.contains_key(&key) {
                continue;
            }
            if let Some(end) = self.ends.get(&self.hash(key)) {
                latest.insert(key, self.statuses[end.status as usize].to_string());
            }
        }
        latest
    }

    /// Forgets the ends of rows older than `before_ms`, which the history
    /// and the latest table no longer hold (a status after them is
    /// recorded afresh). Once per cutoff.
    pub(crate) fn forget_before(&mut self, before_ms: i64) {
        if before_ms <= self.pruned_ms {
            return;
        }
        self.pruned_ms = before_ms;
        self.ends.retain(|_, e| e.at_ms >= before_ms);
        self.dirty.retain(|_, (_, r)| r.at_ms >= before_ms);
    }

    /// The ends changed since the checkpoint, to write to the latest table.
    pub(crate) fn dirty(&self) -> impl Iterator<Item = &LatestRow> {
        self.dirty.values().map(|(_, r)| r)
    }

    /// The latest table holds the history up to `seq` (this replica's
    /// checkpoint or another's).
    pub(crate) fn checkpointed(&mut self, seq: i64) {
        self.dirty.retain(|_, (s, _)| *s > seq);
    }

    /// Keys known.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }
}

#[cfg(test)]
mod tests {
    use super::{Ends, LatestRow};
    use crate::store::suite::event;

    fn row(host: &str, connector: &str, to: &str, at_ms: i64) -> LatestRow {
        LatestRow::of(&event(at_ms, host, connector, to))
    }

    #[test]
    fn a_batch_is_compared_with_what_was_loaded_and_applied_since() {
        let mut ends = Ends::default();
        ends.load(
            [
                row("a.test", "c1", "up", 10),
                row("a.test", "c2", "down", 10),
            ],
            7,
        );
        assert_eq!(ends.seen, Some(7));
        ends.apply(9, row("a.test", "c1", "down", 20));
        assert_eq!(ends.seen, Some(9));
        let batch = [
            event(30, "a.test", "c1", "up"),
            event(30, "a.test", "c2", "up"),
            event(30, "a.test", "c3", "up"),
            event(31, "b.test", "c1", "up"),
        ];
        let latest = ends.latest_for(&batch);
        let got = |k: usize| latest.get(&batch[k].key()).map(String::as_str);
        assert_eq!(
            (got(0), got(1), got(2), got(3)),
            (Some("down"), Some("down"), None, None)
        );
        // Only what changed after the checkpoint is written again.
        let dirty: Vec<_> = ends.dirty().cloned().collect();
        assert_eq!(dirty, [row("a.test", "c1", "down", 20)]);
        ends.checkpointed(8);
        assert_eq!(ends.dirty().count(), 1, "row 9 is after checkpoint 8");
        ends.checkpointed(9);
        assert_eq!(ends.dirty().count(), 0);
    }

    #[test]
    fn pruned_ends_are_forgotten_once() {
        let mut ends = Ends::default();
        ends.load([row("a.test", "c1", "up", 10)], 1);
        ends.apply(2, row("a.test", "c2", "up", 20));
        ends.apply(3, row("a.test", "c3", "up", 30));
        ends.forget_before(25);
        assert_eq!(ends.len(), 1);
        assert_eq!(ends.dirty().count(), 1);
        // An older cutoff changes nothing.
        ends.apply(4, row("a.test", "c4", "up", 5));
        ends.forget_before(20);
        assert_eq!(ends.len(), 2);
    }
}
