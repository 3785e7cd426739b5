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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use policy::{AppKey, Protocol, Status};
use serde::Serialize;
use tokio::sync::broadcast;

use crate::state::clock::unix_ms;
use crate::state::health::Transition;
use crate::store::EventRecord;

/// Transitions a live subscriber may fall behind by before it is told it
/// lagged (and re-reads the state).
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
    /// `reported`).
    pub cause: String,
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

/// The live side of the history: the stream's sender and counter.
#[derive(Debug)]
pub struct History {
    tx: broadcast::Sender<Arc<EventView>>,
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
            tx: broadcast::channel(STREAM_BUFFER).0,
            seq: AtomicU64::new(0),
            // Never 0, so 0 can stand for "no epoch" on the wire.
            epoch: rand::random::<u64>().max(1),
            closing: tokio::sync::watch::channel(false).0,
        }
    }
}

impl History {
    /// A receiver of every transition from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<EventView>> {
        self.tx.subscribe()
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

    /// Numbers one transition of a visible segment (`record`, whose
    /// protocol and statuses are passed typed) and sends it to the live
    /// subscribers. The view (and its copies of the strings) is built only
    /// for a listener: most of the time nobody has the stream open.
    pub fn publish(&self, record: &EventRecord, protocol: Protocol, from: Status, to: Status) {
        let seq = self.seq.fetch_add(1, Ordering::AcqRel) + 1;
        if self.tx.receiver_count() > 0 {
            // A listener that left meanwhile is no error.
            let _ = self
                .tx
                .send(Arc::new(EventView::live(record, protocol, from, to, seq)));
        }
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
}
