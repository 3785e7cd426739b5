//! The status and the address histories (`health_events`,
//! `address_events`), the checkpoint of where each key's history ends
//! (`health_latest`, `address_latest`, `history_ends`) and a writer's turn
//! at appending to them.

use super::{PgStore, page};
use crate::ground::clock::now_ms;
use crate::store::ends::{Ends, LatestRow};
use crate::store::{
    AddressEventRecord, EventFilter, EventRecord, EventValue, HistoryRow, StoreError, fresh_rows,
};
use std::sync::atomic::Ordering;
use tokio_postgres::{Row, Transaction};

/// A history row's first nine columns (the status and the address
/// history select them alike).
fn event_row(r: &tokio_postgres::Row) -> EventRecord {
    EventRecord {
        at_ms: r.get(0),
        segment: r.get(1),
        host: r.get(2),
        protocol: r.get(3),
        port: r.get(4),
        connector: r.get(5),
        from: r.get(6),
        to: r.get(7),
        cause: r.get(8),
    }
}

/// What a history writer runs first in its transaction: its turn. Writers
/// take turns on one transaction lock, so each reads every row the ones
/// before it committed, and the `seq` order of the rows is the order they
/// were committed in (the rows after the last one a replica read are the
/// ones it has not seen).
pub(super) const HISTORY_TURN: &str = "SELECT pg_advisory_xact_lock(7265636802)";

/// Brings `ends` up to the history's last row, at the start of a writer's
/// turn: the checkpoint the first time (the latest table), then the rows
/// appended since it last looked (`seq` above `seen`), the others'
/// checkpoints and prunes. Whether this writer should write the checkpoint
/// (`every_ms` after the last).
async fn catch_up(
    tx: &Transaction<'_>,
    history: &History,
    ends: &mut Ends,
    every_ms: i64,
) -> Result<bool, StoreError> {
    let row = tx
        .query_one(
            "SELECT seq, at_ms, pruned_ms FROM history_ends WHERE name = $1",
            &[&history.name],
        )
        .await?;
    let (seq, at_ms, pruned_ms): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    match ends.seen {
        None => {
            let rows = tx.query(history.load, &[]).await?;
            ends.load(rows.iter().map(|r| latest_row(r, 0)), seq);
        }
        Some(_) => ends.checkpointed(seq),
    }
    ends.forget_before(pruned_ms);
    loop {
        let since = ends.seen.unwrap_or(seq);
        let rows = tx.query(history.since, &[&since]).await?;
        for r in &rows {
            ends.apply(r.get(0), latest_row(r, 1));
        }
        if rows.len() < SINCE_PAGE {
            return Ok(now_ms().saturating_sub(at_ms) >= every_ms);
        }
    }
}

/// Rows a writer reads at a time when it catches up (`History::since`,
/// whose `LIMIT` it is). A page this small also keeps the plan a walk of
/// the primary key from the last row read: on a table without statistics
/// yet PostgreSQL guesses a third of the table after it, and with no limit
/// or one of 10,000 it chose a sequential or bitmap scan and a sort, at
/// every turn (as long as the insert itself).
pub(super) const SINCE_PAGE: usize = 1_000;

/// A latest row from columns `at`.. of `r`: host, port, subject, segment,
/// protocol, status, time.
fn latest_row(r: &Row, at: usize) -> LatestRow {
    LatestRow {
        host: r.get(at),
        port: r.get(at + 1),
        subject: r.get(at + 2),
        segment: r.get(at + 3),
        protocol: r.get(at + 4),
        to: r.get(at + 5),
        at_ms: r.get(at + 6),
    }
}

/// Writes the ends changed since the checkpoint to the latest table, in
/// chunks, and moves the checkpoint to the rows `ends` has seen. Returns
/// that `seq`.
async fn checkpoint(
    tx: &Transaction<'_>,
    history: &History,
    ends: &Ends,
) -> Result<i64, StoreError> {
    let dirty: Vec<&LatestRow> = ends.dirty().collect();
    for chunk in dirty.chunks(10_000) {
        let column = |f: fn(&LatestRow) -> &str| chunk.iter().map(|r| f(r)).collect::<Vec<&str>>();
        let ports: Vec<i64> = chunk.iter().map(|r| r.port).collect();
        let at: Vec<i64> = chunk.iter().map(|r| r.at_ms).collect();
        tx.execute(
            history.upsert,
            &[
                &column(|r| &r.host),
                &ports,
                &column(|r| &r.subject),
                &column(|r| &r.segment),
                &column(|r| &r.protocol),
                &column(|r| &r.to),
                &at,
            ],
        )
        .await?;
    }
    let seq = ends.seen.unwrap_or(0);
    tx.execute(
        "UPDATE history_ends SET seq = $2, at_ms = $3 WHERE name = $1",
        &[&history.name, &seq, &now_ms()],
    )
    .await?;
    Ok(seq)
}

/// After a writer's turn committed: its own rows (`last`, the last per
/// key, the batch's highest `seq` `written`) and its checkpoint are part of
/// what it knows.
fn settle<R: HistoryRow>(
    ends: &mut Ends,
    written: Option<i64>,
    last: &[&R],
    checkpoint: Option<i64>,
) {
    if let Some(seq) = written {
        for r in last {
            ends.apply(seq, LatestRow::of(*r));
        }
    }
    if let Some(seq) = checkpoint {
        ends.checkpointed(seq);
    }
}

/// Appends `new` to `history` (one statement; `address` the address
/// history's tenth column); the highest `seq` given.
async fn append(
    tx: &Transaction<'_>,
    history: &History,
    new: &Columns<'_>,
    address: Option<&[&str]>,
) -> Result<i64, StoreError> {
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![
        &new.at_ms,
        &new.segment,
        &new.host,
        &new.protocol,
        &new.port,
        &new.connector,
        &new.from,
        &new.to,
        &new.cause,
    ];
    if let Some(address) = &address {
        params.push(address);
    }
    Ok(tx.query_one(history.append, &params).await?.get(0))
}

/// A history (`health_events`, `address_events`) and its latest table
/// (`health_latest`, `address_latest`): the statements a writer's turn
/// reads and writes them with.
pub(super) struct History {
    /// Its row in `history_ends`.
    pub(super) name: &'static str,
    /// The history's table.
    table: &'static str,
    /// The columns a listing reads: the nine of an `EventRecord`, then the
    /// address (the address history).
    columns: &'static str,
    /// Its text columns indexed by their hash (`{column}_hash`).
    hashed: &'static [&'static str],
    /// The latest table: host, port, subject, segment, protocol, status,
    /// time.
    load: &'static str,
    /// The history's next rows after `seq` `$1` (`SINCE_PAGE` of them at
    /// most, which bounds a starting replica's reads), in order: `seq`,
    /// then the latest table's columns.
    pub(super) since: &'static str,
    /// Inserts or updates latest rows by key: `$1`..`$5` the key, `$6` the
    /// statuses, `$7` the times.
    upsert: &'static str,
    /// Appends rows in the order given: `$1`..`$9` the columns of
    /// `Columns`, `$10` the addresses (the address history); the highest
    /// `seq` comes back.
    append: &'static str,
}

/// A history's columns: the nine of an `EventRecord` in `event_row`'s
/// order, then `$column` (the address history's address).
macro_rules! history_columns {
    ($column:literal) => {
        concat!(
            "at_ms, segment, host, protocol, port, connector, from_status, to_status, cause",
            $column
        )
    };
}

/// The statements of history `$events` and latest table `$latest`, whose
/// key's third column is `$subject`; the history has `$column` (its
/// `$param`) beside the nine columns both have (the two differ in nothing
/// else).
macro_rules! history {
    ($name:literal, $events:literal, $latest:literal, $subject:literal, $column:literal, $param:literal, $hashed:expr) => {
        History {
            name: $name,
            table: $events,
            columns: history_columns!($column),
            hashed: $hashed,
            load: concat!(
                "SELECT host, port, ", $subject, ", segment, protocol, to_status, at_ms FROM ", $latest
            ),
            since: concat!(
                "SELECT seq, host, port, ", $subject, ", segment, protocol, to_status, at_ms
                 FROM ", $events, " WHERE seq > $1 ORDER BY seq LIMIT 1000"
            ),
            upsert: concat!(
                "INSERT INTO ", $latest, " (host, port, ", $subject, ", segment, protocol, to_status, at_ms)
                 SELECT * FROM unnest($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::TEXT[], $5::TEXT[],
                                      $6::TEXT[], $7::BIGINT[])
                 ON CONFLICT (host, port, ", $subject, ", segment, protocol)
                 DO UPDATE SET to_status = EXCLUDED.to_status, at_ms = EXCLUDED.at_ms"
            ),
            append: concat!(
                "WITH i AS (INSERT INTO ", $events, " (", history_columns!($column), ")
                 SELECT ", history_columns!($column), "
                 FROM unnest($1::BIGINT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::BIGINT[],
                             $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::TEXT[]", $param, ")
                      WITH ORDINALITY AS r(", history_columns!($column), ", n)
                 ORDER BY n
                 RETURNING seq)
                 SELECT max(seq) FROM i"
            ),
        }
    };
}

impl History {
    pub(super) const STATUSES: History = history!(
        "health",
        "health_events",
        "health_latest",
        "connector",
        "",
        "",
        &["host", "segment"]
    );
    pub(super) const ADDRESSES: History = history!(
        "address",
        "address_events",
        "address_latest",
        "address",
        ", address",
        ", $10::TEXT[]",
        &["host", "address"]
    );

    /// One page of the history matching `f`, newest first: how many match,
    /// the page, and the values both take.
    pub(super) fn listing(
        &self,
        f: &EventFilter,
        limit: u32,
        offset: u64,
    ) -> (String, String, Vec<EventValue>) {
        let (filter, values) = f.to_sql_hashed(|n| format!("${n}"), self.hashed);
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        let (table, columns) = (self.table, self.columns);
        (
            format!("SELECT COUNT(*) FROM {table}{filter}"),
            format!(
                "SELECT {columns} FROM {table}{filter}
                 ORDER BY at_ms DESC, seq DESC LIMIT {limit} OFFSET {offset}"
            ),
            values,
        )
    }
}

/// A row of one of the two histories as a writer's turn appends it: the
/// history's statements, where a store knows it ends, and its insert.
trait Appended: HistoryRow + Sized {
    const HISTORY: History;
    fn ends(store: &PgStore) -> &tokio::sync::Mutex<Ends>;
    /// Appends `rows` (one statement); the highest `seq` given.
    async fn insert(tx: &Transaction<'_>, rows: &[&Self]) -> Result<i64, StoreError>;
}

impl Appended for EventRecord {
    const HISTORY: History = History::STATUSES;
    fn ends(store: &PgStore) -> &tokio::sync::Mutex<Ends> {
        &store.health_ends
    }
    async fn insert(tx: &Transaction<'_>, rows: &[&Self]) -> Result<i64, StoreError> {
        append(tx, &Self::HISTORY, &Columns::of(rows.iter().copied()), None).await
    }
}

impl Appended for AddressEventRecord {
    const HISTORY: History = History::ADDRESSES;
    fn ends(store: &PgStore) -> &tokio::sync::Mutex<Ends> {
        &store.address_ends
    }
    async fn insert(tx: &Transaction<'_>, rows: &[&Self]) -> Result<i64, StoreError> {
        let new = Columns::of(rows.iter().map(|r| &r.event));
        let addresses: Vec<&str> = rows.iter().map(|r| r.address.as_str()).collect();
        append(tx, &Self::HISTORY, &new, Some(&addresses)).await
    }
}

/// History rows as one array per column, for `unnest` (one statement per
/// batch instead of one per row).
#[derive(Default)]
struct Columns<'a> {
    at_ms: Vec<i64>,
    segment: Vec<&'a str>,
    host: Vec<&'a str>,
    protocol: Vec<&'a str>,
    port: Vec<i64>,
    connector: Vec<&'a str>,
    from: Vec<&'a str>,
    to: Vec<&'a str>,
    cause: Vec<&'a str>,
}

impl<'a> Columns<'a> {
    fn of(rows: impl Iterator<Item = &'a EventRecord>) -> Columns<'a> {
        let mut c = Columns::default();
        for e in rows {
            c.at_ms.push(e.at_ms);
            c.segment.push(&e.segment);
            c.host.push(&e.host);
            c.protocol.push(&e.protocol);
            c.port.push(e.port);
            c.connector.push(&e.connector);
            c.from.push(&e.from);
            c.to.push(&e.to);
            c.cause.push(&e.cause);
        }
        c
    }
}

impl PgStore {
    pub(crate) fn record_events(
        &self,
        events: &[EventRecord],
    ) -> Result<Vec<EventRecord>, StoreError> {
        self.record(events)
    }

    /// Appends the rows of `events` not yet recorded, in one writer's turn
    /// (the status and the address history alike); the rows this turn
    /// appended (not those another replica appended first).
    fn record<R: Appended + Clone>(&self, events: &[R]) -> Result<Vec<R>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        self.block(async {
            let mut ends = R::ends(self).lock().await;
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            // Every replica sees every transition (each connector reports to
            // each replica) and records it: a transition to the status the
            // history already ends with for this (application, connector)
            // is a copy and is skipped. Writers take turns (a transaction
            // lock), and each first reads the rows the others appended
            // since its last turn. Four statements per batch, whatever its
            // size, and the checkpoint's when it is due.
            tx.batch_execute(HISTORY_TURN).await?;
            let due = catch_up(&tx, &R::HISTORY, &mut ends, self.checkpoint_every()).await?;
            let mut latest = ends.latest_for(events);
            let (rows, last) = fresh_rows(events, &mut latest);
            let written = match rows.is_empty() {
                true => None,
                false => Some(R::insert(&tx, &rows).await?),
            };
            let checkpoint = match due {
                true => Some(checkpoint(&tx, &R::HISTORY, &ends).await?),
                false => None,
            };
            tx.commit().await?;
            settle(&mut ends, written, &last, checkpoint);
            Ok(rows.into_iter().cloned().collect())
        })
    }

    /// How far the latest tables may lag behind the histories.
    fn checkpoint_every(&self) -> i64 {
        self.checkpoint_every_ms.load(Ordering::Relaxed)
    }

    /// Writes the latest tables at every turn (tests).
    #[cfg(test)]
    pub(crate) fn checkpoint_always(&self) {
        self.checkpoint_every_ms.store(0, Ordering::Relaxed);
    }

    pub(crate) fn events(
        &self,
        f: &EventFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<EventRecord>, u64), StoreError> {
        let (count, rows, values) = History::STATUSES.listing(f, limit, offset);
        self.block(async {
            let client = self.client().await?;
            page(&client, &count, &rows, values, event_row).await
        })
    }

    /// Appends the address changes not yet recorded (see
    /// `Store::record_address_events`), as the status history's rows are.
    pub(crate) fn record_address_events(
        &self,
        events: &[AddressEventRecord],
    ) -> Result<(), StoreError> {
        self.record(events).map(drop)
    }

    /// One page of the address history matching `f`, newest first.
    pub(crate) fn address_events(
        &self,
        f: &EventFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<AddressEventRecord>, u64), StoreError> {
        let (count, rows, values) = History::ADDRESSES.listing(f, limit, offset);
        self.block(async {
            let client = self.client().await?;
            page(&client, &count, &rows, values, |r| AddressEventRecord {
                event: event_row(r),
                address: r.get(9),
            })
            .await
        })
    }

    pub(crate) fn prune_events(&self, before_ms: i64) -> Result<usize, StoreError> {
        self.block(async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            // In the writers' turn, so that no checkpoint writes back an
            // end this removes.
            tx.batch_execute(HISTORY_TURN).await?;
            let n = tx
                .execute("DELETE FROM health_events WHERE at_ms < $1", &[&before_ms])
                .await?;
            // A key whose last row is older than the retention: no copy of
            // that row can still be on its way from another replica.
            tx.execute("DELETE FROM health_latest WHERE at_ms < $1", &[&before_ms])
                .await?;
            // The address history is kept as long.
            tx.execute("DELETE FROM address_events WHERE at_ms < $1", &[&before_ms])
                .await?;
            tx.execute("DELETE FROM address_latest WHERE at_ms < $1", &[&before_ms])
                .await?;
            // Every replica, this one too, forgets those ends at its next
            // turn (`catch_up`).
            tx.execute(
                "UPDATE history_ends SET pruned_ms = GREATEST(pruned_ms, $1)",
                &[&before_ms],
            )
            .await?;
            tx.commit().await?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
    }
}
