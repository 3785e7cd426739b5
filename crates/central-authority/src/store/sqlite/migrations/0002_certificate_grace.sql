-- Version 2: renewed certificates' predecessors wait out their grace here.
CREATE TABLE certificate_grace (
    serial       TEXT PRIMARY KEY REFERENCES certificates(serial),
    connector    TEXT NOT NULL,
    superseded_ms INTEGER NOT NULL,
    revoke_at_ms INTEGER NOT NULL
);
CREATE INDEX certificate_grace_by_time ON certificate_grace(revoke_at_ms);
