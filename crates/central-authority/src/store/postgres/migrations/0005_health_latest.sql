CREATE TABLE health_latest (
    host      TEXT NOT NULL,
    port      BIGINT NOT NULL,
    connector TEXT NOT NULL,
    segment   TEXT NOT NULL,
    protocol  TEXT NOT NULL,
    to_status TEXT NOT NULL,
    at_ms     BIGINT NOT NULL,
    PRIMARY KEY (host, port, connector, segment, protocol)
);
INSERT INTO health_latest
    SELECT DISTINCT ON (host, port, connector, segment, protocol)
           host, port, connector, segment, protocol, to_status, at_ms
    FROM health_events ORDER BY host, port, connector, segment, protocol, seq DESC;
DROP INDEX health_events_latest;
