//! Log streaming to SIEM receivers (`[[log_receivers]]`): connector
//! status, health transitions, access decisions and the audit trail, each
//! receiver fed at least once from a bounded spool on disk.
//!
//! - `record`: a record, its kinds and fields;
//! - `format`: json, RFC 5424 syslog, csv and tsv bytes (pure functions);
//! - `spool`: a receiver's segment files and read position;
//! - `sender`: a receiver's connection (tcp, tls or a rotated file) fed
//!   from its spool.
//!
//! `emit` never waits: a record goes to each receiver that takes it by
//! `try_send` on a bounded channel (full: dropped, counted). A spooler on
//! a thread of its own writes it to the spool, numbered; the sender streams
//! the spool. A module of its own at the bottom of the CA: it imports
//! nothing else of the crate; `Authority` holds a `LogStream`, the
//! features emit through it and the API reads `states`.

pub mod format;
pub mod record;
pub mod sender;
pub mod spool;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

pub use format::Format;
pub use record::{Field, Kind, Record};

/// Records waiting for a receiver's spooler at most; more are dropped.
const QUEUE: usize = 16_384;
/// A spooler writes at most this many records at once.
const BATCH: usize = 1024;
/// After a batch that emptied its queue, a spooler lets records gather
/// this long before it takes the next: at a decision rate of thousands a
/// second it then wakes about a hundred times a second, not once per
/// record (a wake-up is a futex call on the deciding thread and a thread
/// switch, most of a record's cost), and writes the spool in larger
/// appends. A record reaches its receiver at most this much later.
const LINGER: Duration = Duration::from_millis(10);
/// Drops are logged at most this often per receiver.
const DROP_LOG_EVERY: Duration = Duration::from_secs(60);

/// Where a receiver's records go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Destination {
    /// `tcp://host:port`.
    Tcp {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
    },
    /// `tls://host:port`.
    Tls {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
        /// The PEM roots the receiver's certificate is verified against.
        root_file: PathBuf,
        /// The name its certificate must carry.
        server_name: String,
        /// The client certificate and key files, if the receiver asks.
        client: Option<(PathBuf, PathBuf)>,
    },
    /// `file:///path`.
    File {
        /// The file; rotated to `path.1` … `path.N`.
        path: PathBuf,
    },
}

/// A receiver's filters; an empty list filters nothing, and a filter
/// passes a record that has no such field (an audit record has no group).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Connector groups (`group`).
    pub groups: Vec<String>,
    /// Segments (`segment`).
    pub segments: Vec<String>,
    /// Statuses: connector_status `status`, health `to`, access
    /// `decision`, audit `outcome`.
    pub statuses: Vec<String>,
}

impl Filter {
    fn passes(&self, record: &Record) -> bool {
        let one = |list: &[String], field: Field| {
            list.is_empty()
                || record
                    .get_text(field)
                    .is_none_or(|v| list.iter().any(|x| x == v))
        };
        one(&self.groups, Field::Group)
            && one(&self.segments, Field::Segment)
            && one(&self.statuses, record.kind.status_field())
    }
}

/// One `[[log_receivers]]` entry, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiverSpec {
    /// Unique; names the spool directory.
    pub name: String,
    /// `destination` as written.
    pub url: String,
    /// Where records go.
    pub destination: Destination,
    /// How they are written.
    pub format: Format,
    /// The kinds it takes.
    pub types: Vec<Kind>,
    /// Its filters.
    pub filter: Filter,
    /// The spool's bound in bytes.
    pub spool_bytes: u64,
    /// A file destination is rotated at this size.
    pub file_max_bytes: u64,
    /// Rotated files kept.
    pub file_keep: u32,
}

impl ReceiverSpec {
    fn kinds(&self) -> u8 {
        self.types.iter().fold(0, |m, k| m | k.bit())
    }
}

/// A receiver's counters and connection state.
#[derive(Debug, Default)]
pub struct Stats {
    connected: AtomicBool,
    sent: AtomicU64,
    dropped_queue: AtomicU64,
    dropped_spool: AtomicU64,
    spool_bytes: AtomicU64,
    spool_records: AtomicU64,
    last_sent_ms: AtomicU64,
    last_error: Mutex<Option<(String, u64)>>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Stats {
    fn last_error(&self) -> MutexGuard<'_, Option<(String, u64)>> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Relaxed);
    }

    pub(crate) fn sent(&self, n: u64) {
        self.sent.fetch_add(n, Ordering::Relaxed);
        self.last_sent_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub(crate) fn error(&self, message: String) {
        *self.last_error() = Some((message, now_ms()));
    }

    pub(crate) fn spool_usage(&self, (bytes, records): (u64, u64)) {
        self.spool_bytes.store(bytes, Ordering::Relaxed);
        self.spool_records.store(records, Ordering::Relaxed);
    }
}

/// What `GET /api/v1/log_receivers` and the metrics show of a receiver.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceiverState {
    /// Its name.
    pub name: String,
    /// `destination` as written.
    pub destination: String,
    /// Its format.
    pub format: Format,
    /// The kinds it takes.
    pub types: Vec<Kind>,
    /// Whether its connection (or file) is open.
    pub connected: bool,
    /// Bytes of its spool on disk.
    pub spool_bytes: u64,
    /// Records in its spool not yet confirmed.
    pub spool_records: u64,
    /// Records written to it since the CA started.
    pub sent_total: u64,
    /// Records dropped because its queue was full.
    pub dropped_queue: u64,
    /// Records dropped because its spool was full (or could not be written).
    pub dropped_spool: u64,
    /// The last error, and when (Unix ms).
    pub last_error: Option<(String, u64)>,
    /// When a record was last written to it (Unix ms, 0: never).
    pub last_sent_unix_ms: u64,
}

#[derive(Debug)]
struct Receiver {
    spec: ReceiverSpec,
    kinds: u8,
    tx: mpsc::Sender<Arc<Record>>,
    stats: Arc<Stats>,
    /// Set to stop its sender.
    stop: watch::Sender<bool>,
    /// True once its spooler and sender ended.
    done: watch::Receiver<bool>,
}

impl Receiver {
    fn state(&self) -> ReceiverState {
        let s = &self.stats;
        ReceiverState {
            name: self.spec.name.clone(),
            destination: self.spec.url.clone(),
            format: self.spec.format,
            types: self.spec.types.clone(),
            connected: s.connected.load(Ordering::Relaxed),
            spool_bytes: s.spool_bytes.load(Ordering::Relaxed),
            spool_records: s.spool_records.load(Ordering::Relaxed),
            sent_total: s.sent.load(Ordering::Relaxed),
            dropped_queue: s.dropped_queue.load(Ordering::Relaxed),
            dropped_spool: s.dropped_spool.load(Ordering::Relaxed),
            last_error: s.last_error().clone(),
            last_sent_unix_ms: s.last_sent_ms.load(Ordering::Relaxed),
        }
    }
}

#[derive(Debug, Default)]
struct Setup {
    /// This replica's id and the runtime, once started.
    started: Option<(String, tokio::runtime::Handle)>,
    /// The receivers asked for before the start.
    waiting: Vec<ReceiverSpec>,
}

/// The CA's log receivers.
#[derive(Debug)]
pub struct LogStream {
    spool_root: PathBuf,
    receivers: RwLock<Arc<Vec<Arc<Receiver>>>>,
    /// The kinds some receiver takes, one bit each.
    kinds: AtomicU8,
    setup: Mutex<Setup>,
}

impl LogStream {
    /// Receivers spooling under `<data_dir>/log-spool/`; none until
    /// `start`.
    pub fn new(data_dir: &Path) -> LogStream {
        LogStream {
            spool_root: data_dir.join("log-spool"),
            receivers: RwLock::new(Arc::new(Vec::new())),
            kinds: AtomicU8::new(0),
            setup: Mutex::new(Setup::default()),
        }
    }

    fn setup(&self) -> MutexGuard<'_, Setup> {
        self.setup.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current(&self) -> Arc<Vec<Arc<Receiver>>> {
        self.receivers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Starts the receivers on the current runtime, writing `replica` into
    /// every record.
    pub fn start(&self, replica: String, specs: &[ReceiverSpec]) {
        let handle = tokio::runtime::Handle::current();
        self.setup().started = Some((replica, handle));
        self.reconfigure(specs);
    }

    /// Applies the receivers of a (re)loaded configuration: a receiver
    /// whose entry did not change keeps its connection and spool; a
    /// changed one is restarted on its spool once the old one stopped; a
    /// removed one stops (its spool stays on disk).
    pub fn reconfigure(&self, specs: &[ReceiverSpec]) {
        let mut setup = self.setup();
        let Some((replica, handle)) = setup.started.clone() else {
            setup.waiting = specs.to_vec();
            return;
        };
        let old = self.current();
        let mut next = Vec::with_capacity(specs.len());
        for spec in specs {
            if let Some(kept) = old.iter().find(|r| r.spec == *spec) {
                next.push(kept.clone());
                continue;
            }
            let before = old
                .iter()
                .find(|r| r.spec.name == spec.name)
                .map(|r| r.done.clone());
            let dir = self.spool_root.join(&spec.name);
            next.push(Arc::new(launch(
                spec.clone(),
                dir,
                &replica,
                &handle,
                before,
            )));
        }
        for gone in old
            .iter()
            .filter(|r| !next.iter().any(|n| Arc::ptr_eq(n, r)))
        {
            let _ = gone.stop.send(true);
        }
        let kinds = next.iter().fold(0, |m, r| m | r.kinds);
        *self
            .receivers
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(next);
        self.kinds.store(kinds, Ordering::Relaxed);
        drop(setup);
    }

    /// Whether some receiver takes records of `kind` (callers skip making
    /// a record no one takes).
    pub fn wants(&self, kind: Kind) -> bool {
        self.kinds.load(Ordering::Relaxed) & kind.bit() != 0
    }

    /// Hands `record` to every receiver that takes it, without waiting: a
    /// receiver whose queue is full drops it (counted).
    pub fn emit(&self, record: Record) {
        if !self.wants(record.kind) {
            return;
        }
        let record = Arc::new(record);
        for r in self.current().iter() {
            if r.kinds & record.kind.bit() == 0 || !r.spec.filter.passes(&record) {
                continue;
            }
            if let Err(mpsc::error::TrySendError::Full(_)) = r.tx.try_send(record.clone()) {
                r.stats.dropped_queue.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Every receiver's state, in configuration order.
    pub fn states(&self) -> Vec<ReceiverState> {
        self.current().iter().map(|r| r.state()).collect()
    }

    /// Stops every receiver (the CA is stopping): each sender ends, each
    /// spooler once it wrote what its queue held.
    pub fn stop(&self) {
        let _setup = self.setup();
        let old = std::mem::take(
            &mut *self
                .receivers
                .write()
                .unwrap_or_else(PoisonError::into_inner),
        );
        self.kinds.store(0, Ordering::Relaxed);
        for r in old.iter() {
            let _ = r.stop.send(true);
        }
    }
}

/// Starts one receiver's spooler and sender, after `before` (the
/// receiver of the same name it replaces) ended.
fn launch(
    spec: ReceiverSpec,
    dir: PathBuf,
    replica: &str,
    handle: &tokio::runtime::Handle,
    before: Option<watch::Receiver<bool>>,
) -> Receiver {
    let (tx, rx) = mpsc::channel(QUEUE);
    let (stop, stop_rx) = watch::channel(false);
    let (done_tx, done) = watch::channel(false);
    let stats = Arc::new(Stats::default());
    let receiver = Receiver {
        kinds: spec.kinds(),
        spec: spec.clone(),
        tx,
        stats: stats.clone(),
        stop,
        done,
    };
    let replica = replica.to_owned();
    handle.spawn(async move {
        if let Some(mut before) = before {
            let _ = before.wait_for(|d| *d).await;
        }
        let bound = spec.spool_bytes;
        let opened = tokio::task::spawn_blocking(move || spool::Spool::open(&dir, bound)).await;
        let (spool, writer, reader) = match opened {
            Ok(Ok(parts)) => parts,
            Ok(Err(e)) => {
                let message = format!("cannot open the spool: {e}");
                tracing::error!(receiver = %spec.name, error = %e, "cannot open the log receiver's spool");
                stats.error(message);
                let _ = done_tx.send(true);
                return;
            }
            Err(_) => return,
        };
        stats.spool_usage(spool.usage());
        let (spooled_tx, spooled) = tokio::sync::oneshot::channel::<()>();
        let spooler = {
            let (spec, stats) = (spec.clone(), stats.clone());
            std::thread::Builder::new()
                .name(format!("log-spool-{}", spec.name))
                .spawn(move || {
                    yield_to_decisions(&spec.name);
                    spool_records(&spec, &replica, rx, writer, &stats);
                    let _ = spooled_tx.send(());
                })
        };
        if let Err(e) = spooler {
            stats.error(format!("cannot start the spooler: {e}"));
            let _ = done_tx.send(true);
            return;
        }
        sender::run(&spec, reader, &stats, stop_rx).await;
        let _ = spooled.await;
        let _ = done_tx.send(true);
    });
    receiver
}

/// The niceness of a spooler thread: what it writes waits in its queue,
/// so it runs when a core is free rather than preempting a decision.
const SPOOLER_NICE: i32 = 10;

/// Lowers the calling (spooler) thread's priority to [`SPOOLER_NICE`]
/// (Linux: `setpriority` on a thread id applies to that thread alone).
fn yield_to_decisions(receiver: &str) {
    let me = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(me), SPOOLER_NICE) {
        tracing::debug!(receiver, error = %e, "cannot lower the log spooler's priority");
    }
}

/// The spooler: numbers, formats and appends each record to the spool,
/// until the queue is closed (the receiver was dropped) and drained.
fn spool_records(
    spec: &ReceiverSpec,
    replica: &str,
    mut rx: mpsc::Receiver<Arc<Record>>,
    mut writer: spool::Writer,
    stats: &Stats,
) {
    let mut logged: Option<std::time::Instant> = None;
    let mut unlogged = 0u64;
    while let Some(first) = rx.blocking_recv() {
        let mut batch = Vec::with_capacity(BATCH);
        batch.push(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let mut dropped = 0;
        for record in &batch {
            let message = format::message(spec.format, record, replica, writer.next_seq());
            match writer.push(&message) {
                Ok(true) => {}
                Ok(false) => dropped += 1,
                Err(e) => {
                    dropped += 1;
                    stats.error(format!("cannot write the spool: {e}"));
                }
            }
        }
        if let Err((e, lost)) = writer.commit() {
            dropped += lost;
            stats.error(format!("cannot write the spool: {e}"));
        }
        stats.spool_usage(writer.spool().usage());
        stats.dropped_spool.fetch_add(dropped, Ordering::Relaxed);
        unlogged += dropped;
        if unlogged > 0 && logged.is_none_or(|t| t.elapsed() >= DROP_LOG_EVERY) {
            tracing::warn!(
                receiver = %spec.name,
                dropped = unlogged,
                "log records dropped: the receiver's spool is full"
            );
            logged = Some(std::time::Instant::now());
            unlogged = 0;
        }
        if batch.len() < BATCH {
            std::thread::sleep(LINGER);
        }
    }
}
