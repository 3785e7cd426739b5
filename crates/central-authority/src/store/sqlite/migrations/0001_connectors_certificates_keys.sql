CREATE TABLE connectors (
    name        TEXT PRIMARY KEY,
    grp         TEXT NOT NULL,
    disabled    INTEGER NOT NULL DEFAULT 0,
    enrolled_ms INTEGER NOT NULL,
    changed_ms  INTEGER NOT NULL
);
CREATE TABLE certificates (
    serial      TEXT PRIMARY KEY,
    connector   TEXT NOT NULL REFERENCES connectors(name),
    grp         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    issued_ms   INTEGER NOT NULL,
    not_after_ms INTEGER NOT NULL,
    revoked_ms  INTEGER,
    revoked_reason TEXT
);
CREATE INDEX certificates_by_connector ON certificates(connector);
CREATE TABLE provisioning_keys (
    grp         TEXT NOT NULL,
    key_sha256  TEXT NOT NULL,
    uses        INTEGER NOT NULL DEFAULT 0,
    revoked_ms  INTEGER,
    last_used_ms INTEGER,
    PRIMARY KEY (grp, key_sha256)
);
