//! The status history and its live stream: every transition the health
//! table records (one connector's status for one application changing,
//! with its cause) is numbered, sent to live subscribers (the dashboard's
//! server-sent events, gRPC `WatchHealth`) and appended to the database,
//! where it is kept for `[health] history_retention_s` and read back by
//! `GET /api/v1/events`.
//!
//! This is the live side (the stream's sender and numbering) and the
//! views; `intake::transitions` pumps the table's outbox into it and into
//! the database.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::Stream;
use policy::{AppKey, Protocol, Status};
use serde::Serialize;
use tokio::sync::watch;

use crate::ground::clock::unix_ms;
use crate::state::addresses::AddressChange;
use crate::state::health::Transition;
use crate::store::{AddressEventRecord, EventRecord};

/// Transitions older than the newest batch a live subscriber may still
/// have to read before it is told it lagged (and re-reads the state):
/// the stream keeps the newest batch whole, however large, and at least
/// this many transitions before it.
const STREAM_BUFFER: usize = 4096;

/// One status transition, as the API and the streams show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EventView {
    /// Its number in this CA process's stream (increasing by one per
    /// transition; absent in the stored history).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// When the CA saw it, Unix ms.
    pub at: i64,
    /// Segment.
    pub segment: String,
    /// Host.
    pub host: String,
    /// `tcp` or `udp`.
    pub protocol: Protocol,
    /// Port.
    pub port: i64,
    /// Connector whose status changed.
    pub connector: String,
    /// Status before.
    pub from: Status,
    /// Status after.
    pub to: Status,
    /// Why: `report` (the connector reported it) or the Unknown cause
    /// (`disconnected`, `stale`, `window_expired`, `not_in_full_state`,
    /// `reported`); in the address history `appeared`, `report` or `left`.
    pub cause: String,
    /// In the address history (`GET /api/v1/events?address=`): the
    /// address whose result changed (`from` is the result the address
    /// history last showed, Unknown before it appeared; `to` its result,
    /// Unknown once it left). Absent in the status history.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

impl EventView {
    /// The view of a stored transition: its names are read back into
    /// their types here, at the database's edge (a name the CA never writes
    /// reads as Unknown, or TCP).
    pub fn stored(r: EventRecord) -> EventView {
        let status = |s: &str| s.parse().unwrap_or(Status::Unknown);
        EventView {
            seq: None,
            at: r.at_ms,
            protocol: r.protocol.parse().unwrap_or(Protocol::Tcp),
            from: status(&r.from),
            to: status(&r.to),
            segment: r.segment,
            host: r.host,
            port: r.port,
            connector: r.connector,
            cause: r.cause,
            address: None,
        }
    }

    /// The view of a stored address change.
    pub fn stored_address(r: AddressEventRecord) -> EventView {
        EventView {
            address: Some(r.address),
            ..EventView::stored(r.event)
        }
    }

    /// The view of a transition streamed now, numbered `seq`.
    fn live(r: &EventRecord, protocol: Protocol, from: Status, to: Status, seq: u64) -> EventView {
        EventView {
            seq: Some(seq),
            at: r.at_ms,
            segment: r.segment.clone(),
            host: r.host.clone(),
            protocol,
            port: r.port,
            connector: r.connector.clone(),
            from,
            to,
            cause: r.cause.clone(),
            address: None,
        }
    }
}

impl EventRecord {
    /// The stored form of transition `t` of `key`.
    pub fn new(key: AppKey, t: Transition) -> EventRecord {
        EventRecord {
            at_ms: i64::try_from(unix_ms(t.at)).unwrap_or(i64::MAX),
            segment: key.segment,
            host: key.host.to_string(),
            protocol: key.protocol.as_str().to_owned(),
            port: i64::from(key.port),
            connector: t.connector,
            from: t.from.as_str().to_owned(),
            to: t.to.as_str().to_owned(),
            cause: t.cause.to_owned(),
        }
    }
}

impl AddressEventRecord {
    /// The stored form of address change `c` of `key`, seen at `at`.
    pub fn new(key: &AppKey, at: std::time::SystemTime, c: AddressChange) -> AddressEventRecord {
        AddressEventRecord {
            event: EventRecord {
                at_ms: i64::try_from(unix_ms(at)).unwrap_or(i64::MAX),
                segment: key.segment.clone(),
                host: key.host.to_string(),
                protocol: key.protocol.as_str().to_owned(),
                port: i64::from(key.port),
                connector: c.connector.to_string(),
                from: c.from.as_str().to_owned(),
                to: c.to.as_str().to_owned(),
                cause: c.cause.to_owned(),
            },
            address: c.address.to_string(),
        }
    }
}

/// The transitions one pump round streamed, numbered from `first` on.
#[derive(Debug)]
struct Batch {
    first: u64,
    events: Vec<Arc<EventView>>,
}

impl Batch {
    /// The number after its last transition's.
    fn end(&self) -> u64 {
        self.first + self.events.len() as u64
    }
}

/// What the live stream still holds: the newest batch whole and at least
/// `STREAM_BUFFER` transitions before it (fewer only at the start), oldest
/// first, numbers contiguous. Replaced, never changed, by the one writer
/// (the pump); every subscriber reads it at its own pace.
#[derive(Debug, Default)]
struct Log {
    batches: VecDeque<Arc<Batch>>,
}

/// Where a subscriber waiting for transition `next` stands in a `Log`.
enum Cursor {
    /// Its transition is `.1` in this batch.
    At(Arc<Batch>, usize),
    /// Dropped already: this many were missed, the stream goes on here.
    Lagged(u64, Arc<Batch>),
    /// Not streamed yet.
    Waiting,
}

impl Log {
    fn find(&self, next: u64) -> Cursor {
        match self.batches.iter().find(|b| b.end() > next) {
            Some(b) if b.first <= next => Cursor::At(
                b.clone(),
                usize::try_from(next - b.first).unwrap_or(usize::MAX),
            ),
            Some(b) => Cursor::Lagged(b.first - next, b.clone()),
            None => Cursor::Waiting,
        }
    }

    /// This log with `batch` added and what no reader needs dropped.
    fn with(&self, batch: Batch) -> Log {
        let newest = batch.events.len();
        let mut batches = self.batches.clone();
        batches.push_back(Arc::new(batch));
        let mut older: usize = batches.iter().map(|b| b.events.len()).sum::<usize>() - newest;
        while batches.len() > 1 {
            let first = batches.front().map_or(0, |b| b.events.len());
            if older - first < STREAM_BUFFER {
                break;
            }
            older -= first;
            batches.pop_front();
        }
        Log { batches }
    }
}

/// What a live subscriber receives.
#[derive(Clone, Debug)]
pub enum Live {
    /// The next transition.
    Transition(Arc<EventView>),
    /// It fell behind: this many transitions were not sent to it.
    Lagged(u64),
}

/// The live side of the history: the stream's log and counter.
#[derive(Debug)]
pub struct History {
    log: watch::Sender<Arc<Log>>,
    seq: AtomicU64,
    /// This stream's identity: random per CA process, so two processes
    /// (a restart, another replica) never share one, whatever their `seq`.
    epoch: u64,
    /// Set when the CA stops: open streams end (a graceful shutdown would
    /// otherwise wait for them forever).
    closing: tokio::sync::watch::Sender<bool>,
}

impl Default for History {
    fn default() -> Self {
        History {
            log: watch::channel(Arc::default()).0,
            seq: AtomicU64::new(0),
            // Never 0, so 0 can stand for "no epoch" on the wire.
            epoch: rand::random::<u64>().max(1),
            closing: tokio::sync::watch::channel(false).0,
        }
    }
}

impl History {
    /// Every transition numbered after `version()` as read now, as fast as
    /// the caller takes them: a batch reaches a caller that keeps up
    /// whole, however large; one that falls more than `STREAM_BUFFER`
    /// transitions behind the newest batch gets `Live::Lagged` and goes on
    /// from the oldest transition still held.
    pub fn subscribe(&self) -> impl Stream<Item = Live> + Send + 'static {
        let rx = self.log.subscribe();
        let next = self.version() + 1;
        let start: (_, u64, Option<(Arc<Batch>, usize)>) = (rx, next, None);
        futures::stream::unfold(start, |(mut rx, mut next, mut at)| async move {
            loop {
                if let Some((batch, i)) = &mut at {
                    if let Some(e) = batch.events.get(*i) {
                        *i += 1;
                        let e = e.clone();
                        next = batch.first + *i as u64;
                        return Some((Live::Transition(e), (rx, next, at)));
                    }
                    at = None;
                }
                let log = rx.borrow_and_update().clone();
                match log.find(next) {
                    Cursor::At(batch, i) => at = Some((batch, i)),
                    Cursor::Lagged(missed, batch) => {
                        next = batch.first;
                        return Some((Live::Lagged(missed), (rx, next, Some((batch, 0)))));
                    }
                    // Ends when the CA drops the history.
                    Cursor::Waiting => rx.changed().await.ok()?,
                }
            }
        })
    }

    /// Resolves when the CA stops; live streams end with it.
    pub fn closed(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.closing.subscribe();
        async move {
            let _ = rx.wait_for(|c| *c).await;
        }
    }

    /// Ends every live stream (the CA is stopping).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Numbers one round's transitions of visible segments (each a
    /// record, with its protocol and statuses typed) and streams them to
    /// the live subscribers as one batch. The views (and their copies of
    /// the strings) are built only for a listener: most of the time nobody
    /// has the stream open. Called by one task (the pump) only.
    pub fn publish(&self, round: &[(&EventRecord, Protocol, Status, Status)]) {
        if round.is_empty() {
            return;
        }
        let first = self.seq.fetch_add(round.len() as u64, Ordering::AcqRel) + 1;
        if self.log.receiver_count() == 0 {
            // Nobody reads: nothing to keep (a new subscriber starts after
            // this round anyway).
            if !self.log.borrow().batches.is_empty() {
                self.log.send_replace(Arc::default());
            }
            return;
        }
        let events = round
            .iter()
            .zip(first..)
            .map(|(&(r, p, from, to), seq)| Arc::new(EventView::live(r, p, from, to, seq)))
            .collect();
        let log = self.log.borrow().with(Batch { first, events });
        self.log.send_replace(Arc::new(log));
    }

    /// The number of the latest transition streamed (0: none yet). It
    /// counts in this process only: compare it only under the same
    /// `epoch`.
    pub fn version(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }

    /// The stream's epoch: drawn at random when the CA process starts, so
    /// a page or watcher whose data came from another process (the CA
    /// restarted, or the caller moved to another replica) sees a
    /// different one and re-reads, whatever the versions say. Non-zero.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// `epoch` as the JSON API gives it: 16 hex digits (a JSON number
    /// would lose bits in a browser).
    pub fn epoch_text(&self) -> String {
        format!("{:016x}", self.epoch)
    }
}

/// One page of the stored history.
#[derive(Debug, Serialize)]
pub struct EventPage {
    /// The transitions, newest first.
    pub events: Vec<EventView>,
    /// How many match in all.
    pub total: u64,
    /// The page shown, from 1.
    pub page: u64,
    /// Transitions per page.
    pub per_page: u32,
    /// Number of pages (at least 1).
    pub pages: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two processes (a restart, another replica) never share an epoch,
    /// though both number their transitions from 0.
    #[test]
    fn every_process_streams_under_its_own_epoch() {
        let (a, b) = (History::default(), History::default());
        assert_eq!((a.version(), b.version()), (0, 0));
        assert_ne!(a.epoch(), b.epoch());
        assert_ne!(a.epoch(), 0);
        assert_eq!(a.epoch_text().len(), 16);
        assert_eq!(
            u64::from_str_radix(&a.epoch_text(), 16).ok(),
            Some(a.epoch())
        );
    }

    fn round(h: &History, n: usize) {
        let r = EventRecord {
            at_ms: 1,
            segment: "s".into(),
            host: "h".into(),
            protocol: "tcp".into(),
            port: 80,
            connector: "c".into(),
            from: "unknown".into(),
            to: "up".into(),
            cause: "report".into(),
        };
        let items = vec![(&r, Protocol::Tcp, Status::Unknown, Status::Up); n];
        h.publish(&items);
    }

    /// What a subscriber reads now, without waiting: transition numbers,
    /// and a lag as its negated count.
    fn drain(s: &mut (impl Stream<Item = Live> + Unpin)) -> Vec<i64> {
        use futures::{FutureExt as _, StreamExt as _};
        let mut out = Vec::new();
        while let Some(Some(item)) = s.next().now_or_never() {
            out.push(match item {
                Live::Transition(e) => i64::try_from(e.seq.unwrap_or(0)).unwrap_or(-1),
                Live::Lagged(n) => -i64::try_from(n).unwrap_or(0),
            });
        }
        out
    }

    /// A round far larger than the buffer reaches a reader that keeps up
    /// whole; a reader that falls more than `STREAM_BUFFER` behind the
    /// newest round lags, is told by how much, and goes on from the oldest
    /// transition still held.
    #[test]
    fn a_reader_that_keeps_up_gets_every_round_whole_and_only_a_slow_one_lags() {
        let h = History::default();
        let mut fast = Box::pin(h.subscribe());
        let mut slow = Box::pin(h.subscribe());
        round(&h, 10_000);
        assert_eq!(drain(&mut fast), (1..=10_000).collect::<Vec<_>>());
        for _ in 0..3 {
            round(&h, 3_000);
            let got = drain(&mut fast);
            assert_eq!(got.len(), 3_000, "{:?}", got.first());
            assert!(got.iter().all(|&s| s > 0));
        }
        // 19,000 streamed; the slow reader read none. Held: the newest
        // round and 6,000 before it (dropping the oldest of those would
        // leave fewer than 4,096).
        let got = drain(&mut slow);
        assert_eq!(got.first(), Some(&-10_000));
        assert_eq!(got[1..], (10_001..=19_000).collect::<Vec<_>>()[..]);
        assert!(drain(&mut fast).is_empty());
    }
}
