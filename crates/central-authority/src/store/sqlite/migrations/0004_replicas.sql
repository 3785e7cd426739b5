-- Version 4: the CA replicas sharing this database, with their heartbeats.
CREATE TABLE replicas (
    id           TEXT PRIMARY KEY,
    addresses    TEXT NOT NULL,
    version      TEXT NOT NULL,
    started_ms   INTEGER NOT NULL,
    heartbeat_ms INTEGER NOT NULL,
    policy_hash  TEXT NOT NULL
);
