-- Version 5: the status history (every transition of one connector's
-- status for one application), kept for `[health] history_retention_s`.
-- Plain SQL types, valid in SQLite and PostgreSQL alike.
CREATE TABLE health_events (
    at_ms       BIGINT NOT NULL,
    segment     TEXT NOT NULL,
    host        TEXT NOT NULL,
    protocol    TEXT NOT NULL,
    port        INTEGER NOT NULL,
    connector   TEXT NOT NULL,
    from_status TEXT NOT NULL,
    to_status   TEXT NOT NULL,
    cause       TEXT NOT NULL
);
CREATE INDEX health_events_by_app ON health_events(host, port, at_ms);
CREATE INDEX health_events_by_time ON health_events(at_ms);
