-- Version 11: the address history (each address of an application: when
-- it appeared in a connector's answer, its result changes, when it left
-- every answer), kept as long as the status history, and the result each
-- address's history ends with, which new rows are compared with.
CREATE TABLE address_events (
    at_ms       BIGINT NOT NULL,
    segment     TEXT NOT NULL,
    host        TEXT NOT NULL,
    protocol    TEXT NOT NULL,
    port        INTEGER NOT NULL,
    address     TEXT NOT NULL,
    connector   TEXT NOT NULL,
    from_status TEXT NOT NULL,
    to_status   TEXT NOT NULL,
    cause       TEXT NOT NULL
);
CREATE INDEX address_events_by_address ON address_events(address, at_ms);
CREATE INDEX address_events_by_app ON address_events(host, port, at_ms);
CREATE INDEX address_events_by_time ON address_events(at_ms);
CREATE TABLE address_latest (
    host      TEXT NOT NULL,
    port      INTEGER NOT NULL,
    address   TEXT NOT NULL,
    segment   TEXT NOT NULL,
    protocol  TEXT NOT NULL,
    to_status TEXT NOT NULL,
    at_ms     BIGINT NOT NULL,
    PRIMARY KEY (host, port, address, segment, protocol)
) WITHOUT ROWID;
