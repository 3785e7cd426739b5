//! The SQLite backend's own workings: its page cache, indexes, latest
//! statuses and migrations from earlier schema versions.

use super::history::{
    LATEST_STATUS, address_events_count_sql, address_events_page_sql, events_count_sql,
    events_page_sql,
};
use super::*;
use crate::store::suite::cert;
use crate::store::{EnrollRefusal, EventFilter, EventRecord};

#[test]
fn the_page_cache_holds_a_history_batch() {
    let store = SqliteStore::in_memory().expect("store");
    let size: i64 = lock(&store.conn)
        .pragma_query_value(None, "cache_size", |r| r.get(0))
        .expect("cache_size");
    assert_eq!(size, -32_768);
}

/// The history filtered by segment (the dashboard's and
/// `/api/v1/events?segment=`) is read through an index, counted and
/// paged alike, not by scanning every row.
#[test]
fn events_by_segment_use_an_index() {
    let f = EventFilter {
        segment: Some("jira".into()),
        hidden_segments: vec!["secret".into()],
        ..EventFilter::default()
    };
    let (filter, _) = f.to_sql(|n| format!("?{n}"));
    assert_uses_index(
        [events_count_sql(&filter), events_page_sql(&filter, 50, 0)],
        "INDEX health_events_by_segment (segment=?",
    );
}

/// The address history is read through an index in every listing:
/// of one application's address (the dashboard's `/api/v1/events?app=…
/// &address=`), in the order of the index by application and address;
/// of every address of one application, through its first columns and
/// sorting that application's rows only; across applications, the page
/// walks the index by time and the count the index by application.
#[test]
fn address_events_use_an_index() {
    let app = |address: &str| EventFilter {
        segment: Some("jira".into()),
        host: Some("jira.test".into()),
        protocol: Some("tcp".into()),
        port: Some(80),
        address: Some(address.into()),
        hidden_segments: vec!["secret".into()],
        ..EventFilter::default()
    };
    let everywhere = EventFilter {
        address: Some("10.0.0.1".into()),
        ..EventFilter::default()
    };
    let by_app = "INDEX address_events_by_app (host=? AND port=?";
    for (f, count, page, sorts) in [
        (app("10.0.0.1"), by_app, by_app, false),
        (app("*"), by_app, by_app, true),
        (
            everywhere,
            "INDEX address_events_by_app",
            "INDEX address_events_by_time",
            false,
        ),
    ] {
        let (filter, _) = f.to_sql(|n| format!("?{n}"));
        let count_plan = plan_of(&address_events_count_sql(&filter));
        assert!(
            count_plan.iter().any(|s| s.contains(count)),
            "{count_plan:?}"
        );
        let page_plan = plan_of(&address_events_page_sql(&filter, 50, 0));
        assert!(page_plan.iter().any(|s| s.contains(page)), "{page_plan:?}");
        assert_eq!(
            page_plan.iter().any(|s| s.contains("TEMP B-TREE")),
            sorts,
            "{page_plan:?}"
        );
    }
    let (filter, _) = app("10.0.0.1").to_sql(|n| format!("?{n}"));
    assert_uses_index(
        [
            address_events_count_sql(&filter),
            address_events_page_sql(&filter, 50, 0),
        ],
        "INDEX address_events_by_app (host=? AND port=? AND address=?",
    );
}

/// The steps of `sql`'s `EXPLAIN QUERY PLAN` on an empty store.
fn plan_of(sql: &str) -> Vec<String> {
    let store = SqliteStore::in_memory().expect("store");
    let conn = lock(&store.conn);
    let mut stmt = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .expect("plan");
    let n = stmt.parameter_count();
    stmt.query_map(
        rusqlite::params_from_iter(std::iter::repeat_n("jira", n)),
        |r| r.get::<_, String>(3),
    )
    .expect("plan rows")
    .collect::<Result<_, _>>()
    .expect("plan rows")
}

/// Each of `queries` is planned through `index` (a step of its `EXPLAIN
/// QUERY PLAN` names it) and sorts nothing in a temporary tree.
fn assert_uses_index(queries: [String; 2], index: &str) {
    for sql in queries {
        let plan = plan_of(&sql);
        assert!(
            plan.iter().any(|step| step.contains(index)),
            "{sql}: {plan:?}"
        );
        assert!(
            !plan.iter().any(|step| step.contains("TEMP B-TREE")),
            "{sql}: {plan:?}"
        );
    }
}

fn flap(at_ms: i64, connector: &str, to: &str) -> EventRecord {
    crate::store::suite::event(at_ms, "a.test", connector, to)
}

/// How many times this store's lookup of a key's latest status ran.
fn latest_lookups(s: &SqliteStore) -> i32 {
    let conn = lock(&s.conn);
    let stmt = conn.prepare_cached(LATEST_STATUS).expect("statement");
    stmt.get_status(rusqlite::StatementStatus::Run)
}

fn two_stores(name: &str) -> (std::path::PathBuf, SqliteStore, SqliteStore) {
    let dir = std::env::temp_dir().join(format!("reach-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("reach.db");
    let a = SqliteStore::open(&path).expect("db");
    let b = SqliteStore::open(&path).expect("db");
    (dir, a, b)
}

/// While no other connection committed to the file (`PRAGMA
/// data_version` unchanged), a batch takes its keys' latest statuses
/// from what this store last wrote: no lookup. Once another store
/// wrote, they are read again, so its transitions still dedupe.
#[test]
fn latest_statuses_are_read_again_only_after_another_store_wrote() {
    let (dir, a, b) = two_stores("latest-cache");
    a.record_events(&[flap(1_000, "c1", "up"), flap(1_001, "c2", "up")])
        .expect("recorded");
    let first = latest_lookups(&a);
    assert_eq!(first, 2, "a key with no history yet is looked up");
    a.record_events(&[flap(2_000, "c1", "down"), flap(2_001, "c1", "down")])
        .expect("recorded");
    assert_eq!(latest_lookups(&a), first, "nobody else wrote: no lookup");
    // Pruning through this store forgets what it knew: c2's latest
    // status went with its rows.
    assert_eq!(a.prune_events(1_500).expect("pruned"), 2);
    a.record_events(&[flap(2_500, "c2", "up")])
        .expect("recorded");
    assert_eq!(latest_lookups(&a), first + 1, "read again after a prune");
    // The other replica records c1 going up; this one's copy of it,
    // a moment later, is the same transition.
    let appended = b
        .record_events(&[flap(3_000, "c1", "up")])
        .expect("recorded");
    assert_eq!(appended, [flap(3_000, "c1", "up")], "b appended it");
    let copy = a
        .record_events(&[flap(3_007, "c1", "up")])
        .expect("recorded");
    assert!(copy.is_empty(), "a copy is not appended: {copy:?}");
    assert_eq!(latest_lookups(&a), first + 2, "read again after b wrote");
    let (rows, total) = a.events(&EventFilter::default(), 10, 0).expect("read");
    assert_eq!(
        rows.iter()
            .map(|e| (e.at_ms, e.connector.as_str(), e.to.as_str()))
            .collect::<Vec<_>>(),
        [
            (3_000, "c1", "up"),
            (2_500, "c2", "up"),
            (2_000, "c1", "down")
        ],
        "{total}"
    );
    drop((a, b));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A batch larger than one multi-row `INSERT` keeps its rows, in order,
/// copies skipped wherever they fall.
#[test]
fn a_large_batch_keeps_every_transition_in_order() {
    let s = SqliteStore::in_memory().expect("db");
    let mut events = Vec::new();
    for i in 0..(3 * INSERT_CHUNK as i64 + 5) {
        let to = if i % 2 == 0 { "up" } else { "down" };
        events.push(flap(i * 10, "c1", to));
        // A copy of it, one ms later (another replica's).
        events.push(flap(i * 10 + 1, "c1", to));
    }
    s.record_events(&events).expect("recorded");
    let (rows, total) = s.events(&EventFilter::default(), 1_000, 0).expect("read");
    assert_eq!(total, 3 * INSERT_CHUNK as u64 + 5);
    let expected: Vec<(i64, &str)> = (0..(3 * INSERT_CHUNK as i64 + 5))
        .rev()
        .map(|i| (i * 10, if i % 2 == 0 { "up" } else { "down" }))
        .collect();
    assert_eq!(
        rows.iter()
            .map(|e| (e.at_ms, e.to.as_str()))
            .collect::<Vec<_>>(),
        expected
    );
    assert!(
        rows.iter()
            .all(|e| e.host == "a.test" && e.port == 80 && e.cause == "report")
    );
}

#[test]
fn a_version_1_database_is_migrated_in_place() {
    let dir = std::env::temp_dir().join(format!("reach-store-v1-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("reach.db");
    {
        let conn = Connection::open(&path).expect("db");
        conn.execute_batch(MIGRATIONS[0].sql).expect("v1 schema");
        conn.pragma_update(None, "user_version", 1)
            .expect("version");
        conn.execute_batch(
            "INSERT INTO connectors (name, grp, disabled, enrolled_ms, changed_ms) VALUES ('c1', 'g', 0, 1, 1);
             INSERT INTO certificates (serial, connector, grp, fingerprint, issued_ms, not_after_ms)
             VALUES ('01', 'c1', 'g', 'f', 1, 10);",
        )
        .expect("v1 rows");
    }
    let s = SqliteStore::open(&path).expect("migrated");
    assert_eq!(s.connectors().expect("db")[0].serial.as_deref(), Some("01"));
    // A certificate recorded before roots were is of no known root.
    assert_eq!(s.connectors().expect("db")[0].root_sha256, None);
    assert_eq!(
        s.enroll(&cert("c1", "g", "02")).expect("db"),
        Err(EnrollRefusal::NameTaken("c1".into()))
    );
    drop(s);
    let conn = Connection::open(&path).expect("db");
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("version");
    assert_eq!(version, SCHEMA_VERSION as i64);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Version 17 leaves a version-16 file's address history listed as it
/// was, by application, by address and across applications, through
/// two indexes.
#[test]
fn a_version_16_address_history_stays_listed() {
    let dir = std::env::temp_dir().join(format!("reach-store-v16-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("reach.db");
    {
        let conn = Connection::open(&path).expect("db");
        for m in &MIGRATIONS[..16] {
            conn.execute_batch(m.sql).expect("schema");
        }
        conn.pragma_update(None, "user_version", 16)
            .expect("version");
        conn.execute_batch(
            "INSERT INTO address_events VALUES
                 (1, 's', 'a.test', 'tcp', 80, '10.0.0.1', 'c1', 'unknown', 'up', 'appeared'),
                 (2, 's', 'a.test', 'tcp', 80, '10.0.0.1', 'c1', 'up', 'down', 'report'),
                 (3, 's', 'b.test', 'tcp', 80, '10.0.0.1', 'c1', 'unknown', 'up', 'appeared');",
        )
        .expect("v16 rows");
    }
    let s = SqliteStore::open(&path).expect("migrated");
    super::super::suite::version_16_address_rows_are_listed(|f| s.address_events(f, 10, 0));
    let indexes: Vec<String> = lock(&s.conn)
        .prepare(
            "SELECT name FROM sqlite_master
             WHERE type = 'index' AND tbl_name = 'address_events' ORDER BY name",
        )
        .expect("indexes")
        .query_map([], |r| r.get(0))
        .expect("indexes")
        .collect::<Result<_, _>>()
        .expect("indexes");
    assert_eq!(indexes, ["address_events_by_app", "address_events_by_time"]);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Version 8 fills `health_latest` from the history a version-7 file
/// holds, so a copy of the last transition is still recognised.
#[test]
fn a_version_7_history_keeps_its_latest_statuses() {
    let dir = std::env::temp_dir().join(format!("reach-store-v7-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("reach.db");
    {
        let conn = Connection::open(&path).expect("db");
        for m in &MIGRATIONS[..7] {
            conn.execute_batch(m.sql).expect("schema");
        }
        conn.pragma_update(None, "user_version", 7)
            .expect("version");
        conn.execute_batch(
            "INSERT INTO health_events VALUES (1, 's', 'a.test', 'tcp', 80, 'c1', 'unknown', 'up', 'report');
             INSERT INTO health_events VALUES (2, 's', 'a.test', 'tcp', 80, 'c1', 'up', 'down', 'report');",
        )
        .expect("v7 rows");
    }
    let s = SqliteStore::open(&path).expect("migrated");
    let event = |at_ms, to: &str| EventRecord {
        at_ms,
        segment: "s".into(),
        host: "a.test".into(),
        protocol: "tcp".into(),
        port: 80,
        connector: "c1".into(),
        from: "up".into(),
        to: to.into(),
        cause: "report".into(),
    };
    // Another replica's copy of the down, then a real change.
    s.record_events(&[event(3, "down"), event(4, "up")])
        .expect("recorded");
    let (rows, total) = s.events(&EventFilter::default(), 10, 0).expect("read");
    assert_eq!(total, 3, "{rows:?}");
    assert_eq!(rows.iter().map(|e| e.at_ms).collect::<Vec<_>>(), [4, 2, 1]);
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn state_survives_reopening_and_migrations_are_idempotent() {
    let dir = std::env::temp_dir().join(format!("reach-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("reach.db");
    {
        let s = SqliteStore::open(&path).expect("db");
        assert_eq!(s.enroll(&cert("c1", "g", "01")).expect("db"), Ok(()));
    }
    let s = SqliteStore::open(&path).expect("reopened");
    assert_eq!(s.connectors().expect("db")[0].serial.as_deref(), Some("01"));
    assert_eq!(s.key_usage("g", "k1").expect("db").uses, 1);
    let _ = std::fs::remove_dir_all(&dir);
}
