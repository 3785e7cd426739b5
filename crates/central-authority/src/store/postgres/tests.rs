//! The PostgreSQL backend's own workings: checkpoints of the latest
//! tables, byte-wise keys, catching up, the hashed indexes and migrations
//! from earlier schema versions.

use crate::store::{AddressEventRecord, EventFilter, Store, pg_backend, suite::event};

/// A runtime for a test's own clients.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// A fresh database with the store's tables.
fn migrated() -> String {
    let url = test_support::Postgres::shared()
        .fresh_database()
        .expect("database");
    drop(super::super::postgres_store(&url));
    url
}

/// A client of `url` on the current runtime.
async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    client
}

/// The sizes of the latest tables' primary keys, in bytes.
async fn key_sizes(client: &tokio_postgres::Client) -> (i64, i64) {
    let row = client
        .query_one(
            "SELECT pg_relation_size('health_latest_pkey'), pg_relation_size('address_latest_pkey')",
            &[],
        )
        .await
        .expect("sizes");
    (row.get(0), row.get(1))
}

/// Checkpoints move each key's latest row within its page (HOT
/// updates): the latest tables' primary keys gain no entry however
/// often the same keys flip, and each key ends with its last status.
/// A checkpoint may update keys and insert new ones at once.
#[test]
fn checkpoints_move_the_latest_rows_in_place() {
    // A server of its own: a transaction open in another database of a
    // shared server can keep PostgreSQL from pruning old row versions
    // as it goes (vacuum removes them later), and an update that finds
    // its page full then moves its row.
    let pg = test_support::Postgres::start().expect("PostgreSQL");
    let url = pg.fresh_database().expect("database");
    let store = super::super::postgres_store(&url);
    pg_backend(&store).checkpoint_always();
    let keys = 2_000;
    let batch = |round: i64, n: usize| -> (Vec<_>, Vec<_>) {
        let to = if round % 2 == 0 { "up" } else { "down" };
        let statuses: Vec<_> = (0..n)
            .map(|k| {
                event(
                    round * 10_000 + k as i64,
                    &format!("a{}.test", k % 100),
                    &format!("c{k}"),
                    to,
                )
            })
            .collect();
        let addresses = statuses
            .iter()
            .enumerate()
            .map(|(k, e)| AddressEventRecord {
                event: e.clone(),
                address: format!("10.0.{}.{}", k / 200, k % 200),
            })
            .collect();
        (statuses, addresses)
    };
    let rt = runtime();
    rt.block_on(async {
        let client = connect(&url).await;
        // No autovacuum ANALYZE of these tables meanwhile: its snapshot
        // keeps the old row versions from being pruned, and an update
        // that finds its page full moves its row, as under any long
        // transaction.
        client
            .batch_execute(
                "ALTER TABLE health_events SET (autovacuum_enabled = false);
                 ALTER TABLE health_latest SET (autovacuum_enabled = false);
                 ALTER TABLE address_events SET (autovacuum_enabled = false);
                 ALTER TABLE address_latest SET (autovacuum_enabled = false);",
            )
            .await
            .expect("autovacuum off");
        // Each turn's checkpoint writes the turns before it: half the
        // keys first, then the other half beside updates of the first.
        for round in 0..3 {
            let (statuses, addresses) = batch(round, if round == 0 { keys / 2 } else { keys });
            store.record_events(&statuses).expect("recorded");
            store.record_address_events(&addresses).expect("recorded");
        }
        let before = key_sizes(&client).await;
        for round in 3..13 {
            let (statuses, addresses) = batch(round, keys);
            store.record_events(&statuses).expect("recorded");
            store.record_address_events(&addresses).expect("recorded");
        }
        assert_eq!(key_sizes(&client).await, before, "the primary keys grew: updates that were not HOT");
        for table in ["health_latest", "address_latest"] {
            let row = client
                .query_one(
                    &format!(
                        "SELECT count(*), count(*) FILTER (WHERE to_status = 'down'), min(at_ms) FROM {table}"
                    ),
                    &[],
                )
                .await
                .expect("latest");
            let (n, down, oldest): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
            assert_eq!((n, down, oldest), (keys as i64, keys as i64, 110_000), "{table}");
        }
    });
    // Every transition is in the history once: the first half's Up,
    // then twelve flips of every key (the other half's first one Down).
    let (_, total) = store.events(&EventFilter::default(), 1, 0).expect("read");
    assert_eq!(total, (keys / 2 + 12 * keys) as u64);
}

/// The latest tables' key columns compare bytes, whatever the
/// database's locale (strcoll made a transition cost about 35 % more
/// in a C.UTF-8 database), and the histories' indexes hold no text
/// (each text's hash).
#[test]
fn the_histories_keys_compare_bytes_in_any_locale() {
    let pg = test_support::Postgres::shared();
    let url = pg.fresh_database_in("C.UTF-8").expect("database");
    drop(super::super::postgres_store(&url));
    let rt = runtime();
    rt.block_on(async {
        let client = connect(&url).await;
        let locale: String = client
            .query_one("SELECT datcollate FROM pg_database WHERE datname = current_database()", &[])
            .await
            .expect("locale")
            .get(0);
        assert_eq!(locale, "C.UTF-8");
        // Every text column of every index of the four tables.
        let rows = client
            .query(
                "SELECT c.relname || '.' || a.attname, coalesce(l.collname, 'default')
                 FROM pg_index i
                 JOIN pg_class c ON c.oid = i.indrelid
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
                 LEFT JOIN pg_collation l ON l.oid = a.attcollation
                 WHERE c.relname IN ('health_events', 'health_latest', 'address_events', 'address_latest')
                   AND a.atttypid = 'text'::regtype
                 ORDER BY 1",
                &[],
            )
            .await
            .expect("columns");
        let columns: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(columns.len(), 8, "{columns:?}");
        assert!(
            columns.iter().all(|(c, _)| c.contains("_latest.")),
            "{columns:?}"
        );
        for (column, collation) in &columns {
            assert_eq!(collation, "C", "{column}");
        }
    });
}

/// The latest tables and their checkpoint row, read with `client`:
/// each key's status (host/connector), and the `seq` they hold the
/// status history up to.
async fn checkpoint_of(client: &tokio_postgres::Client) -> (Vec<(String, String)>, i64) {
    let rows = client
        .query(
            "SELECT host || '/' || connector, to_status FROM health_latest ORDER BY 1",
            &[],
        )
        .await
        .expect("latest");
    let seq = client
        .query_one("SELECT seq FROM history_ends WHERE name = 'health'", &[])
        .await
        .expect("checkpoint")
        .get(0);
    (rows.iter().map(|r| (r.get(0), r.get(1))).collect(), seq)
}

/// A turn writes only the history until the checkpoint is due; the
/// checkpoint holds the rows before that turn. A replica started later
/// compares its copies with the checkpoint and the rows after it, and
/// forgets what another replica pruned.
#[test]
fn ends_are_checkpointed_read_back_by_a_later_replica_and_pruned() {
    let url = test_support::Postgres::shared()
        .fresh_database()
        .expect("database");
    let a = super::super::postgres_store(&url);
    let rt = runtime();
    let client = rt.block_on(connect(&url));
    let total = |s: &Store| s.events(&EventFilter::default(), 1, 0).expect("read").1;
    let up = |k: &str| event(1_000, "a.test", k, "up");
    a.record_events(&[up("c1"), up("c2"), up("c3")])
        .expect("recorded");
    assert_eq!(rt.block_on(checkpoint_of(&client)), (vec![], 0), "not due");
    pg_backend(&a).checkpoint_always();
    a.record_events(&[event(2_000, "a.test", "c1", "down")])
        .expect("recorded");
    let ends = |v: [(&str, &str); 3]| {
        v.iter()
            .map(|(k, to)| (format!("a.test/{k}"), to.to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        rt.block_on(checkpoint_of(&client)),
        (ends([("c1", "up"), ("c2", "up"), ("c3", "up")]), 3),
        "the rows before the turn"
    );
    a.record_events(&[event(3_000, "a.test", "c2", "down")])
        .expect("recorded");
    assert_eq!(total(&a), 5);

    // Another replica, started now: the checkpoint (c1 down at seq 4)
    // and the row after it (c2 down).
    let b = super::super::postgres_store(&url);
    let appended = b
        .record_events(&[
            event(3_001, "a.test", "c1", "down"),
            event(3_001, "a.test", "c2", "down"),
            event(3_001, "a.test", "c3", "up"),
            event(3_002, "a.test", "c3", "down"),
        ])
        .expect("recorded");
    assert_eq!(total(&b), 6, "three copies skipped, c3's change kept");
    assert_eq!(
        appended,
        [event(3_002, "a.test", "c3", "down")],
        "the rows it appended, the ones a log receiver is sent"
    );
    // And the first replica reads the second's row before its own.
    let copy = a
        .record_events(&[event(3_003, "a.test", "c3", "down")])
        .expect("recorded");
    assert!(copy.is_empty(), "{copy:?}");
    assert_eq!(total(&a), 6, "a copy of the second replica's row");

    // Pruned by the first; the second then records c1 afresh.
    assert_eq!(a.prune_events(10_000).expect("pruned"), 6);
    b.record_events(&[event(11_000, "a.test", "c1", "down")])
        .expect("recorded");
    assert_eq!(
        total(&b),
        1,
        "past the retention, the status is recorded afresh"
    );
}

/// A writer catches up by walking each history's primary key from the
/// last row it read, in pages, also on a table PostgreSQL has no
/// statistics of yet (where it guessed a third of the table and chose a
/// sequential scan).
#[test]
fn catching_up_walks_the_primary_key() {
    let url = migrated();
    let rt = runtime();
    rt.block_on(async {
        let mut client = connect(&url).await;
        for history in [
            super::history::History::STATUSES,
            super::history::History::ADDRESSES,
        ] {
            assert!(
                history
                    .since
                    .ends_with(&format!("LIMIT {}", super::history::SINCE_PAGE)),
                "{}",
                history.since
            );
            let table = if history.name == "health" {
                "health_events"
            } else {
                "address_events"
            };
            client
                .batch_execute(&format!(
                    "ALTER TABLE {table} SET (autovacuum_enabled = false);
                     INSERT INTO {table} (at_ms, segment, host, protocol, port, connector,
                                          from_status, to_status, cause{address})
                     SELECT i, 's', 'app-' || (i % 1000) || '.test', 'tcp', 80, 'c', 'up',
                            'down', 'report'{value}
                     FROM generate_series(1, 100000) i;",
                    address = if table == "address_events" {
                        ", address"
                    } else {
                        ""
                    },
                    value = if table == "address_events" {
                        ", '10.0.0.1'"
                    } else {
                        ""
                    },
                ))
                .await
                .expect("filled");
            let tx = client.transaction().await.expect("transaction");
            tx.batch_execute(super::history::HISTORY_TURN)
                .await
                .expect("turn");
            let plan: Vec<String> = tx
                .query(&format!("EXPLAIN {}", history.since), &[&99_000_i64])
                .await
                .expect("explained")
                .iter()
                .map(|r| r.get(0))
                .collect();
            tx.commit().await.expect("committed");
            let plan = plan.join("\n");
            assert!(
                plan.contains(&format!("Index Scan using {table}_pkey")),
                "{plan}"
            );
            assert!(
                !plan.contains("Seq Scan") && !plan.contains("Sort"),
                "{plan}"
            );
        }
    });
}

/// A listing by host, segment or address searches the index of the
/// text's hash (an insert compares integers on its way down those
/// indexes, not texts), and still compares the text itself.
#[test]
fn listings_search_the_indexes_of_the_texts_hashes() {
    let url = migrated();
    let rt = runtime();
    rt.block_on(async {
        let client = connect(&url).await;
        client
            .batch_execute(
                "INSERT INTO health_events (at_ms, segment, host, protocol, port, connector,
                                            from_status, to_status, cause)
                 SELECT i, 's' || (i % 50), 'app-' || (i % 1000) || '.test', 'tcp', 80, 'c',
                        'up', 'down', 'report'
                 FROM generate_series(1, 50000) i;
                 INSERT INTO address_events (at_ms, segment, host, protocol, port, connector,
                                             from_status, to_status, cause, address)
                 SELECT i, 's', 'app-' || (i % 1000) || '.test', 'tcp', 80, 'c', 'up',
                        'down', 'report', '10.0.' || (i % 200) || '.1'
                 FROM generate_series(1, 50000) i;
                 ANALYZE health_events; ANALYZE address_events;",
            )
            .await
            .expect("filled");
        let by = |host: Option<&str>, segment: Option<&str>, address: Option<&str>| EventFilter {
            host: host.map(str::to_owned),
            segment: segment.map(str::to_owned),
            address: address.map(str::to_owned),
            ..EventFilter::default()
        };
        for (history, filter, index, columns) in [
            (
                super::history::History::STATUSES,
                by(Some("app-7.test"), None, None),
                "health_events_by_app",
                &["host"][..],
            ),
            (
                super::history::History::STATUSES,
                by(None, Some("s7"), None),
                "health_events_by_segment",
                &["segment"],
            ),
            (
                super::history::History::ADDRESSES,
                by(Some("app-7.test"), None, None),
                "address_events_by_app",
                &["host"],
            ),
            (
                super::history::History::ADDRESSES,
                by(Some("app-7.test"), None, Some("10.0.7.1")),
                "address_events_by_app",
                &["host", "address"],
            ),
        ] {
            let (_, rows, values) = history.listing(&filter, 100, 0);
            let texts: Vec<&String> = values
                .iter()
                .map(|v| match v {
                    crate::store::EventValue::Text(t) => t,
                    crate::store::EventValue::Int(_) => panic!("text values only: {rows}"),
                })
                .collect();
            let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = texts
                .iter()
                .map(|t| *t as &(dyn tokio_postgres::types::ToSql + Sync))
                .collect();
            let found = client.query(&rows, &params).await.expect("listed");
            assert!(!found.is_empty(), "{rows}");
            let plan: Vec<String> = client
                .query(&format!("EXPLAIN {rows}"), &params)
                .await
                .expect("explained")
                .iter()
                .map(|r| r.get(0))
                .collect();
            let plan = plan.join("\n");
            assert!(plan.contains(&format!(" {index}")), "{plan}");
            for column in columns {
                assert!(plan.contains(&format!("{column}_hash = ")), "{plan}");
                assert!(plan.contains(&format!("({column} = ")), "{plan}");
            }
            assert!(!plan.contains("Seq Scan"), "{plan}");
        }
    });
}

/// Version 17 leaves a version-16 database's address history listed
/// as it was, by application and address and across applications,
/// through two indexes.
#[test]
fn a_version_16_address_history_stays_listed() {
    let url = test_support::Postgres::shared()
        .fresh_database()
        .expect("database");
    let rt = runtime();
    rt.block_on(async {
        let client = connect(&url).await;
        let mut schema = String::new();
        for m in &super::MIGRATIONS[..16] {
            schema.push_str(m.sql);
        }
        client.batch_execute(&schema).await.expect("schema");
        client
            .batch_execute(
                "CREATE TABLE reach_schema (version BIGINT NOT NULL);
                 INSERT INTO reach_schema (version) VALUES (16);
                 INSERT INTO address_events (at_ms, segment, host, protocol, port, address,
                                             connector, from_status, to_status, cause)
                 VALUES (1, 's', 'a.test', 'tcp', 80, '10.0.0.1', 'c1', 'unknown', 'up',
                         'appeared'),
                        (2, 's', 'a.test', 'tcp', 80, '10.0.0.1', 'c1', 'up', 'down',
                         'report'),
                        (3, 's', 'b.test', 'tcp', 80, '10.0.0.1', 'c1', 'unknown', 'up',
                         'appeared');",
            )
            .await
            .expect("v16 rows");
    });
    let store = super::super::postgres_store(&url);
    super::super::suite::version_16_address_rows_are_listed(|f| store.address_events(f, 10, 0));
    drop(store);
    rt.block_on(async {
        let client = connect(&url).await;
        let indexes: Vec<String> = client
            .query(
                "SELECT indexname::TEXT FROM pg_indexes
                 WHERE tablename = 'address_events' ORDER BY indexname",
                &[],
            )
            .await
            .expect("indexes")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(
            indexes,
            [
                "address_events_by_app",
                "address_events_by_time",
                "address_events_pkey"
            ]
        );
    });
}
