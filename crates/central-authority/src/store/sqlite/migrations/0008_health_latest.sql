-- Version 8: the status each (application, connector)'s history ends with,
-- one small row per key, which new rows are compared with. It replaces the
-- index of version 7 (an index entry per history row at a random place of
-- a growing tree: one 4-KiB page written per row under flapping).
CREATE TABLE health_latest (
    host      TEXT NOT NULL,
    port      INTEGER NOT NULL,
    connector TEXT NOT NULL,
    segment   TEXT NOT NULL,
    protocol  TEXT NOT NULL,
    to_status TEXT NOT NULL,
    at_ms     BIGINT NOT NULL,
    PRIMARY KEY (host, port, connector, segment, protocol)
) WITHOUT ROWID;
INSERT OR REPLACE INTO health_latest
    SELECT host, port, connector, segment, protocol, to_status, at_ms
    FROM health_events ORDER BY rowid;
DROP INDEX health_events_latest;
