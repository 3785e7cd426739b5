CREATE TABLE health_events (
    seq         BIGSERIAL PRIMARY KEY,
    at_ms       BIGINT NOT NULL,
    segment     TEXT NOT NULL,
    host        TEXT NOT NULL,
    protocol    TEXT NOT NULL,
    port        BIGINT NOT NULL,
    connector   TEXT NOT NULL,
    from_status TEXT NOT NULL,
    to_status   TEXT NOT NULL,
    cause       TEXT NOT NULL
);
CREATE INDEX health_events_by_app ON health_events(host, port, at_ms);
CREATE INDEX health_events_by_time ON health_events(at_ms);
