//! The status and the address histories (`health_events`,
//! `address_events`) and the status and result each key's history ends
//! with (`health_latest`, `address_latest`).

use rusqlite::{OptionalExtension, TransactionBehavior, params};

use super::{SqliteStore, page};
use crate::ground::sync::lock;
use crate::store::{
    AddressEventRecord, EventFilter, EventRecord, HistoryRow, KeyMap, StoreError, fresh_rows,
};

/// A history row's first nine columns (the status and the address
/// history select them alike).
fn event_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<EventRecord> {
    Ok(EventRecord {
        at_ms: r.get(0)?,
        segment: r.get(1)?,
        host: r.get(2)?,
        protocol: r.get(3)?,
        port: r.get(4)?,
        connector: r.get(5)?,
        from: r.get(6)?,
        to: r.get(7)?,
        cause: r.get(8)?,
    })
}

/// How many history rows match `filter` (a `WHERE …` from `EventFilter`).
pub(super) fn events_count_sql(filter: &str) -> String {
    format!("SELECT COUNT(*) FROM health_events{filter}")
}

/// One page of the history rows matching `filter`, newest first.
pub(super) fn events_page_sql(filter: &str, limit: u32, offset: u64) -> String {
    format!(
        "SELECT at_ms, segment, host, protocol, port, connector, from_status, to_status, cause
         FROM health_events{filter} ORDER BY at_ms DESC LIMIT {limit} OFFSET {offset}"
    )
}

/// How many address history rows match `filter`.
pub(super) fn address_events_count_sql(filter: &str) -> String {
    format!("SELECT COUNT(*) FROM address_events{filter}")
}

/// One page of the address history rows matching `filter`, newest first.
pub(super) fn address_events_page_sql(filter: &str, limit: u32, offset: u64) -> String {
    format!(
        "SELECT at_ms, segment, host, protocol, port, connector, from_status, to_status,
             cause, address
         FROM address_events{filter} ORDER BY at_ms DESC, rowid DESC
         LIMIT {limit} OFFSET {offset}"
    )
}

/// A key's latest status, looked up once per key and batch while what this
/// connection knows may be stale.
pub(super) const LATEST_STATUS: &str = "SELECT to_status FROM health_latest
     WHERE host = ?1 AND port = ?2 AND connector = ?3 AND segment = ?4 AND protocol = ?5";

/// History rows per `INSERT` statement (the rest of a batch one row per
/// statement): a statement's fixed cost (opening and closing a cursor per
/// tree, finding the table's last rowid, descending each index from its
/// root) is paid once per chunk, and the cursors stay where the last row
/// went. Eight: their 56 texts still fit SQLite's lookaside memory (93
/// small slots by default), so binding them does not go to `malloc`; 64
/// rows cost more per row in binding than they saved (docs/decisions.md
/// "Status history").
pub(super) const INSERT_CHUNK: usize = 8;

/// Columns of one history row, in the order `bind_event` binds them.
pub(super) const EVENT_COLUMNS: usize = 9;

/// At most this many keys' latest statuses are kept in memory (~150 B
/// each); past it the map starts afresh (its keys are looked up again).
const LATEST_KEYS: usize = 200_000;

/// The status each key's history ends with as this connection last read or
/// wrote it, trusted while no other connection committed to the file: the
/// `PRAGMA data_version` it was valid at (changed only by another
/// connection's commit). Saves a batch the lookup of each key when this
/// process is the only writer.
#[derive(Debug, Default)]
pub(super) struct LatestStatuses {
    /// The `data_version` the statuses are valid at; `None`: not valid.
    version: Option<i64>,
    /// By encoded key ([`encode_key`]): the status, or `None` when the key
    /// has no history.
    statuses: std::collections::HashMap<Box<[u8]>, Option<Box<str>>, foldhash::fast::RandomState>,
}

/// `e`'s key as bytes, each text field prefixed by its length (so no two
/// keys encode alike), into `out`.
fn encode_key(e: &EventRecord, out: &mut Vec<u8>) {
    out.clear();
    for text in [&e.segment, &e.host, &e.protocol, &e.connector] {
        out.extend_from_slice(&(text.len() as u64).to_le_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    out.extend_from_slice(&e.port.to_le_bytes());
}

/// Binds `e` as the history row whose first placeholder is `first`.
fn bind_event(
    stmt: &mut rusqlite::CachedStatement<'_>,
    first: usize,
    e: &EventRecord,
) -> rusqlite::Result<()> {
    stmt.raw_bind_parameter(first, e.at_ms)?;
    stmt.raw_bind_parameter(first + 1, &e.segment)?;
    stmt.raw_bind_parameter(first + 2, &e.host)?;
    stmt.raw_bind_parameter(first + 3, &e.protocol)?;
    stmt.raw_bind_parameter(first + 4, e.port)?;
    stmt.raw_bind_parameter(first + 5, &e.connector)?;
    stmt.raw_bind_parameter(first + 6, &e.from)?;
    stmt.raw_bind_parameter(first + 7, &e.to)?;
    stmt.raw_bind_parameter(first + 8, &e.cause)
}

/// The status history's `INSERT`, before its rows' values (`bind_event`
/// binds each row's columns).
// `OR FAIL`: a row breaking a constraint ends the statement without undoing
// its earlier rows, so SQLite keeps no statement journal for a multi-row
// insert (an error rolls the whole batch back anyway).
pub(super) const EVENTS_INSERT: &str = "INSERT OR FAIL INTO health_events
     (at_ms, segment, host, protocol, port, connector, from_status, to_status, cause) VALUES ";

/// The address history's (`bind_address_event`).
pub(super) const ADDRESS_EVENTS_INSERT: &str = "INSERT OR FAIL INTO address_events
     (at_ms, segment, host, protocol, port, connector, from_status, to_status, cause, address)
     VALUES ";

/// Columns of one address history row.
pub(super) const ADDRESS_COLUMNS: usize = EVENT_COLUMNS + 1;

/// `head` followed by `rows` rows of `columns` parameters each, and the
/// same for one row: a history's chunked and single-row inserts.
pub(super) fn insert_sql(head: &str, columns: usize, rows: usize) -> (String, String) {
    let values = |rows: usize| {
        let mut sql = String::from(head);
        for r in 0..rows {
            sql.push_str(if r == 0 { "(" } else { ",(" });
            for c in 0..columns {
                if c > 0 {
                    sql.push(',');
                }
                sql.push_str(&format!("?{}", r * columns + c + 1));
            }
            sql.push(')');
        }
        sql
    };
    (values(rows), values(1))
}

/// Binds an address history row's columns from parameter `first` on.
fn bind_address_event(
    stmt: &mut rusqlite::CachedStatement<'_>,
    first: usize,
    r: &AddressEventRecord,
) -> rusqlite::Result<()> {
    bind_event(stmt, first, &r.event)?;
    stmt.raw_bind_parameter(first + EVENT_COLUMNS, &r.address)
}

/// Appends `rows` with `sql` (its chunked and single-row inserts), `bind`
/// binding each row's `columns` parameters.
fn append_rows<R>(
    tx: &rusqlite::Transaction<'_>,
    (many, one): &(String, String),
    rows: &[&R],
    columns: usize,
    bind: impl Fn(&mut rusqlite::CachedStatement<'_>, usize, &R) -> rusqlite::Result<()>,
) -> Result<(), StoreError> {
    let mut chunks = rows.chunks_exact(INSERT_CHUNK);
    let mut append = tx.prepare_cached(many)?;
    for chunk in &mut chunks {
        for (i, r) in chunk.iter().enumerate() {
            bind(&mut append, i * columns + 1, r)?;
        }
        append.raw_execute()?;
    }
    let mut append = tx.prepare_cached(one)?;
    for r in chunks.remainder() {
        bind(&mut append, 1, r)?;
        append.raw_execute()?;
    }
    Ok(())
}

impl SqliteStore {
    /// Appends status transitions to the history, in one transaction.
    pub(crate) fn record_events(
        &self,
        events: &[EventRecord],
    ) -> Result<Vec<EventRecord>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = lock(&self.conn);
        let mut known = lock(&self.latest);
        // Immediate: the latest statuses read below stay the latest until
        // this commits (another CA process on the file waits).
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let version: i64 = tx.pragma_query_value(None, "data_version", |r| r.get(0))?;
        if known.version != Some(version) || known.statuses.len() > LATEST_KEYS {
            known.statuses.clear();
        }
        // Not valid until this commits.
        known.version = None;
        let mut buf = Vec::new();
        // Each key once, including keys with no history yet (a `latest`
        // miss would otherwise look them up again per row).
        let mut keys = KeyMap::default();
        for e in events {
            keys.entry(e.key()).or_insert(e);
        }
        let mut latest = KeyMap::default();
        {
            let mut get = tx.prepare_cached(LATEST_STATUS)?;
            for (key, e) in &keys {
                encode_key(e, &mut buf);
                let status = match known.statuses.get(buf.as_slice()) {
                    Some(status) => status.as_deref().map(str::to_owned),
                    None => get
                        .query_row(
                            params![e.host, e.port, e.connector, e.segment, e.protocol],
                            |r| r.get::<_, String>(0),
                        )
                        .optional()?,
                };
                if let Some(status) = status {
                    latest.insert(*key, status);
                }
            }
        }
        // From here on `latest` holds the statuses the batch's keys end
        // with once it is written.
        let (rows, last) = fresh_rows(events, &mut latest);
        self.write_events(&tx, &rows, &last)?;
        tx.commit()?;
        // Committed: what the file holds for these keys is known until
        // another connection commits (this one's commits leave
        // `data_version` as it was).
        for (key, e) in &keys {
            encode_key(e, &mut buf);
            let status = latest.get(key).map(|s| Box::<str>::from(s.as_str()));
            match known.statuses.get_mut(buf.as_slice()) {
                Some(held) => *held = status,
                None => {
                    known.statuses.insert(buf.as_slice().into(), status);
                }
            }
        }
        known.version = Some(version);
        Ok(rows.into_iter().cloned().collect())
    }

    /// Appends the `rows` not yet in the history (in chunks of
    /// `INSERT_CHUNK`) and moves each key's latest status to its `last` row.
    fn write_events(
        &self,
        tx: &rusqlite::Transaction<'_>,
        rows: &[&EventRecord],
        last: &[&EventRecord],
    ) -> Result<(), StoreError> {
        append_rows(tx, &self.insert_sql, rows, EVENT_COLUMNS, bind_event)?;
        let mut set = tx.prepare_cached(
            "INSERT INTO health_latest (host, port, connector, segment, protocol, to_status, at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (host, port, connector, segment, protocol)
             DO UPDATE SET to_status = excluded.to_status, at_ms = excluded.at_ms",
        )?;
        for e in last {
            set.execute(params![
                e.host,
                e.port,
                e.connector,
                e.segment,
                e.protocol,
                e.to,
                e.at_ms
            ])?;
        }
        Ok(())
    }

    /// One page of the history matching `f`, newest first, and how many
    /// match in all.
    pub(crate) fn events(
        &self,
        f: &EventFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<EventRecord>, u64), StoreError> {
        let (filter, values) = f.to_sql(|n| format!("?{n}"));
        page(
            &lock(&self.conn),
            &events_count_sql(&filter),
            &events_page_sql(&filter, limit, offset),
            values,
            event_row,
        )
    }

    /// Appends the address changes not yet recorded (see
    /// `Store::record_address_events`): one lookup per address in the
    /// batch, its rows in chunks, one `address_latest` write per address.
    pub(crate) fn record_address_events(
        &self,
        events: &[AddressEventRecord],
    ) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut conn = lock(&self.conn);
        // Immediate: the latest results read below stay the latest until
        // this commits.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let mut latest = KeyMap::default();
        {
            let mut get = tx.prepare_cached(
                "SELECT to_status FROM address_latest
                 WHERE host = ?1 AND port = ?2 AND address = ?3 AND segment = ?4 AND protocol = ?5",
            )?;
            // Each address once, including those with no history yet.
            let mut asked: KeyMap<'_, ()> = KeyMap::default();
            for r in events {
                let key = r.history_key();
                if asked.insert(key, ()).is_some() {
                    continue;
                }
                let (segment, host, protocol, port, address) = key;
                let status: Option<String> = get
                    .query_row(params![host, port, address, segment, protocol], |row| {
                        row.get(0)
                    })
                    .optional()?;
                if let Some(status) = status {
                    latest.insert(key, status);
                }
            }
        }
        let (rows, last) = fresh_rows(events, &mut latest);
        append_rows(
            &tx,
            &self.insert_address_sql,
            &rows,
            ADDRESS_COLUMNS,
            bind_address_event,
        )?;
        {
            let mut set = tx.prepare_cached(
                "INSERT INTO address_latest (host, port, address, segment, protocol, to_status, at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (host, port, address, segment, protocol)
                 DO UPDATE SET to_status = excluded.to_status, at_ms = excluded.at_ms",
            )?;
            for AddressEventRecord { event: e, address } in last {
                set.execute(params![
                    e.host, e.port, address, e.segment, e.protocol, e.to, e.at_ms
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// One page of the address history matching `f`, newest first.
    pub(crate) fn address_events(
        &self,
        f: &EventFilter,
        limit: u32,
        offset: u64,
    ) -> Result<(Vec<AddressEventRecord>, u64), StoreError> {
        let (filter, values) = f.to_sql(|n| format!("?{n}"));
        page(
            &lock(&self.conn),
            &address_events_count_sql(&filter),
            &address_events_page_sql(&filter, limit, offset),
            values,
            |r| {
                Ok(AddressEventRecord {
                    event: event_row(r)?,
                    address: r.get(9)?,
                })
            },
        )
    }

    /// Deletes the history from before `before_ms`; returns how many went.
    pub(crate) fn prune_events(&self, before_ms: i64) -> Result<usize, StoreError> {
        let mut conn = lock(&self.conn);
        // Keys' latest statuses go below: what this store knew is stale.
        *lock(&self.latest) = LatestStatuses::default();
        let tx = conn.transaction()?;
        let n = tx.execute(
            "DELETE FROM health_events WHERE at_ms < ?1",
            params![before_ms],
        )?;
        // A key whose last row is older than the retention: no copy of that
        // row can still be on its way from another replica.
        tx.execute(
            "DELETE FROM health_latest WHERE at_ms < ?1",
            params![before_ms],
        )?;
        // The address history is kept as long.
        tx.execute(
            "DELETE FROM address_events WHERE at_ms < ?1",
            params![before_ms],
        )?;
        tx.execute(
            "DELETE FROM address_latest WHERE at_ms < ?1",
            params![before_ms],
        )?;
        tx.commit()?;
        Ok(n)
    }
}
