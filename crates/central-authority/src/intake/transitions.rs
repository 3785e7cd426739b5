//! The history pump: a task takes the health table's outbox of status
//! transitions every `PUMP_EVERY`, numbers and streams them
//! (`state::history`), appends them to the database in batches and prunes
//! the history past its retention; and the reader of that stored history
//! (`GET /api/v1/events`). The table itself never waits for a subscriber or
//! the database.
//!
//! **Invariant:** applications of segments with client hostname validation
//! are neither streamed nor listed (they are filtered when read, so a
//! segment that later turns validation on hides its past too).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::ground::clock::unix_ms;
use crate::state::authority::Authority;
use crate::state::history::{EventPage, EventView};
use crate::store::{AddressEventRecord, EventFilter, EventRecord};

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
/// Takes the health table's new transitions: numbers and streams them
/// (visible segments only), and returns them for storing.
fn stream_transitions(authority: &Authority) -> Vec<EventRecord> {
    let taken = authority.health().take_transitions();
    if taken.is_empty() {
        return Vec::new();
    }
    let state = authority.snapshot();
    let history = authority.history();
    // Transitions come in runs of one segment: its visibility is looked
    // up once per run.
    let mut visible: Option<(&str, bool)> = None;
    let mut records = Vec::with_capacity(taken.len());
    // Which records are streamed, with their protocol and statuses.
    let mut shown_at = Vec::new();
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
        let (protocol, from, to) = (key.protocol, t.from, t.to);
        if shown {
            shown_at.push((records.len(), protocol, from, to));
        }
        records.push(EventRecord::new(key, t));
    }
    // One batch per round: a reader that keeps up gets it whole.
    let round: Vec<_> = shown_at
        .into_iter()
        .map(|(i, p, from, to)| (&records[i], p, from, to))
        .collect();
    history.publish(&round);
    drop(round);
    records
}

/// One page of the stored history matching `filter` (hidden segments are
/// left out here).
pub fn events(
    authority: &Authority,
    mut filter: EventFilter,
    page: u64,
    per_page: u32,
) -> Result<EventPage, crate::store::StoreError> {
    filter.hidden_segments = authority
        .snapshot()
        .policy()
        .segments
        .iter()
        .filter(|s| s.client_hostname_validation)
        .map(|s| s.name.clone())
        .collect();
    let offset = page.saturating_sub(1).saturating_mul(u64::from(per_page));
    let (events, total) = if filter.address.is_some() {
        let (records, total) = authority
            .store()
            .address_events(&filter, per_page, offset)?;
        let views = records.into_iter().map(EventView::stored_address);
        (views.collect(), total)
    } else {
        let (records, total) = authority.store().events(&filter, per_page, offset)?;
        (records.into_iter().map(EventView::stored).collect(), total)
    };
    Ok(EventPage {
        events,
        total,
        page,
        per_page,
        pages: total.div_ceil(u64::from(per_page)).max(1),
    })
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
        pending.append(&mut stream_transitions(&authority));
        if (!pending.is_empty() || authority.health().has_address_changes())
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
    pending.append(&mut stream_transitions(&authority));
    if !pending.is_empty() || authority.health().has_address_changes() {
        store(&authority, pending).await;
    }
}

/// The transitions this replica appended to the stored history, to the
/// log receivers that take health records: a transition every replica saw
/// is appended by one of them only (the store skips the copies), so it is
/// streamed once. Hidden segments' transitions are left out, as in the
/// live stream.
fn emit_health(authority: &Authority, appended: &[EventRecord]) {
    use crate::logstream::{Field, Kind, Record};
    let stream = authority.log_stream();
    if appended.is_empty() || !stream.wants(Kind::Health) {
        return;
    }
    let groups: std::collections::HashMap<String, String> = authority
        .registry()
        .list(|name, e| (name.to_owned(), e.group.clone()))
        .into_iter()
        .collect();
    let state = authority.snapshot();
    for e in appended {
        let hidden = state
            .policy()
            .segment(&e.segment)
            .is_none_or(|s| s.client_hostname_validation);
        if hidden {
            continue;
        }
        stream.emit(
            Record::new(Kind::Health, u64::try_from(e.at_ms).unwrap_or(0))
                .text(Field::Application, e.host.as_str())
                .text(Field::Protocol, e.protocol.as_str())
                .int(Field::Port, u64::try_from(e.port).unwrap_or(0))
                .text(Field::Segment, e.segment.as_str())
                .text(
                    Field::Group,
                    groups.get(&e.connector).cloned().unwrap_or_default(),
                )
                .text(Field::Connector, e.connector.as_str())
                .text(Field::From, e.from.as_str())
                .text(Field::To, e.to.as_str())
                .text(Field::Reason, e.cause.as_str()),
        );
    }
}

/// Appends `records` to the stored history, and the address changes the
/// table noted meanwhile to the address history (off the async workers).
async fn store(authority: &Arc<Authority>, records: Vec<EventRecord>) {
    let addresses: Vec<AddressEventRecord> = authority
        .health()
        .take_address_changes()
        .into_iter()
        .map(|(key, at, c)| AddressEventRecord::new(&key, at, c))
        .collect();
    let stored = authority
        .blocking(move |a| {
            let events = if records.is_empty() {
                Ok(Vec::new())
            } else {
                a.store().record_events(&records)
            };
            let changes = if addresses.is_empty() {
                Ok(())
            } else {
                a.store().record_address_events(&addresses)
            };
            (events, changes)
        })
        .await;
    if let Some((events, addresses)) = stored {
        match events {
            Ok(appended) => emit_health(authority, &appended),
            Err(e) => tracing::error!(error = %e, "status history: transitions not stored"),
        }
        if let Err(e) = addresses {
            tracing::error!(error = %e, "address history: changes not stored");
        }
    }
}
