//! The status history and its live stream: every transition the health
//! table records (one connector's status for one application changing,
//! with its cause) is numbered, sent to live subscribers (the dashboard's
//! server-sent events, gRPC `WatchHealth`) and appended to the database,
//! where it is kept for `[health] history_retention_s` and read back by
//! `GET /api/v1/events`.
//!
//! A task (`run`) takes the table's outbox every `PUMP_EVERY`: the table
//! itself never waits for a subscriber or the database.
//!
//! **Invariant:** applications of segments with client hostname validation
//! are neither streamed nor listed (they are filtered when read, so a
//! segment that later turns validation on hides its past too).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use policy::{AppKey, Status};
use serde::Serialize;
use tokio::sync::broadcast;

use crate::authority::Authority;
use crate::health::Transition;
use crate::store::{EventFilter, EventRecord};
use crate::views::unix_ms;

/// How often new transitions are taken, streamed and stored: well inside
/// the one second an update may take to reach an open page.
pub const PUMP_EVERY: Duration = Duration::from_millis(200);
/// How often the transitions streamed meanwhile are appended to the
/// database, in one transaction: each commit writes the pages of the
/// per-application index it touched, so under flapping fewer, larger
/// batches write far less (docs/decisions.md). `GET /api/v1/events` lags
/// the live stream by at most this much.
pub const STORE_EVERY: Duration = Duration::from_secs(1);
/// Transitions held for the database before they are written early.
const STORE_BATCH: usize = 50_000;
/// How often history past its retention is deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
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
    pub protocol: String,
    /// Port.
    pub port: i64,
    /// Connector whose status changed.
    pub connector: String,
    /// Status before.
    pub from: String,
    /// Status after.
    pub to: String,
    /// Why: `report` (the connector reported it) or the Unknown cause
    /// (`disconnected`, `stale`, `window_expired`, `not_in_full_state`,
    /// `reported`).
    pub cause: String,
}

impl EventView {
    fn stored(r: EventRecord) -> EventView {
        EventView {
            seq: None,
            at: r.at_ms,
            segment: r.segment,
            host: r.host,
            protocol: r.protocol,
            port: r.port,
            connector: r.connector,
            from: r.from,
            to: r.to,
            cause: r.cause,
        }
    }

    /// The status after, parsed.
    pub fn to_status(&self) -> Status {
        crate::listing::parse_status(&self.to).unwrap_or(Status::Unknown)
    }
}

impl EventRecord {
    /// The stored form of transition `t` of `key`.
    fn new(key: AppKey, t: Transition) -> EventRecord {
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
    /// Set when the CA stops: open streams end (a graceful shutdown would
    /// otherwise wait for them forever).
    closing: tokio::sync::watch::Sender<bool>,
}

impl Default for History {
    fn default() -> Self {
        History {
            tx: broadcast::channel(STREAM_BUFFER).0,
            seq: AtomicU64::new(0),
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

    /// The number of the latest transition streamed (0: none yet).
    pub fn version(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
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

impl Authority {
    /// Takes the health table's new transitions: numbers and streams them
    /// (visible segments only), and returns them for storing.
    pub(crate) fn stream_transitions(&self) -> Vec<EventRecord> {
        let taken = self.health().take_transitions();
        if taken.is_empty() {
            return Vec::new();
        }
        let state = self.snapshot();
        let history = self.history();
        // Transitions come in runs of one segment: its visibility is looked
        // up once per run.
        let mut visible: Option<(&str, bool)> = None;
        let mut records = Vec::with_capacity(taken.len());
        for (key, t) in taken {
            let shown = match visible {
                Some((segment, shown)) if segment == key.segment => shown,
                _ => {
                    let segment = state.policy().segment(&key.segment);
                    let shown = segment.is_some_and(|s| !s.client_hostname_validation);
                    visible = segment.map(|s| (s.name.as_str(), shown));
                    shown
                }
            };
            let record = EventRecord::new(key, t);
            if shown {
                let seq = history.seq.fetch_add(1, Ordering::AcqRel) + 1;
                // The view (and its copies of the strings) only for a
                // listener: most of the time nobody has the stream open.
                if history.tx.receiver_count() > 0 {
                    let mut view = EventView::stored(record.clone());
                    view.seq = Some(seq);
                    // A listener that left meanwhile is no error.
                    let _ = history.tx.send(Arc::new(view));
                }
            }
            records.push(record);
        }
        records
    }

    /// One page of the stored history matching `filter` (hidden segments
    /// are left out here).
    pub fn events(
        &self,
        mut filter: EventFilter,
        page: u64,
        per_page: u32,
    ) -> Result<EventPage, crate::store::StoreError> {
        filter.hidden_segments = self
            .snapshot()
            .policy()
            .segments
            .iter()
            .filter(|s| s.client_hostname_validation)
            .map(|s| s.name.clone())
            .collect();
        let offset = page.saturating_sub(1).saturating_mul(u64::from(per_page));
        let (records, total) = self.store().events(&filter, per_page, offset)?;
        Ok(EventPage {
            events: records.into_iter().map(EventView::stored).collect(),
            total,
            page,
            per_page,
            pages: total.div_ceil(u64::from(per_page)).max(1),
        })
    }
}

/// Streams and stores transitions every `PUMP_EVERY` and prunes the
/// history past its retention every `PRUNE_EVERY`, until `stop` resolves.
pub async fn run(authority: Arc<Authority>, stop: impl Future<Output = ()>) {
    let mut stop = std::pin::pin!(stop);
    let mut tick = tokio::time::interval(PUMP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // `None`: not pruned yet in this process (prune at once).
    let mut pruned: Option<Instant> = None;
    // Streamed, not stored yet.
    let mut pending: Vec<EventRecord> = Vec::new();
    let mut stored_at = Instant::now();
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {}
        }
        pending.append(&mut authority.stream_transitions());
        if !pending.is_empty()
            && (stored_at.elapsed() >= STORE_EVERY || pending.len() >= STORE_BATCH)
        {
            stored_at = Instant::now();
            store(&authority, std::mem::take(&mut pending)).await;
        }
        if pruned.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
            pruned = Some(Instant::now());
            let retention = authority.snapshot().settings().history_retention;
            let before = SystemTime::now()
                .checked_sub(retention)
                .map_or(0, |t| i64::try_from(unix_ms(t)).unwrap_or(i64::MAX));
            match authority
                .blocking(move |a| a.store().prune_events(before))
                .await
            {
                Some(Ok(n)) if n > 0 => {
                    tracing::debug!(deleted = n, "status history past its retention deleted");
                }
                Some(Err(e)) => tracing::error!(error = %e, "status history: pruning failed"),
                _ => {}
            }
        }
    }
    // What happened just before the stop is kept too.
    pending.append(&mut authority.stream_transitions());
    if !pending.is_empty() {
        store(&authority, pending).await;
    }
}

/// Appends `records` to the stored history (off the async workers).
async fn store(authority: &Arc<Authority>, records: Vec<EventRecord>) {
    let stored = authority
        .blocking(move |a| a.store().record_events(&records))
        .await;
    if let Some(Err(e)) = stored {
        tracing::error!(error = %e, "status history: transitions not stored");
    }
}
