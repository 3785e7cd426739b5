CREATE TABLE connectors (
    name        TEXT PRIMARY KEY,
    grp         TEXT NOT NULL,
    disabled    BOOLEAN NOT NULL DEFAULT FALSE,
    enrolled_ms BIGINT NOT NULL,
    changed_ms  BIGINT NOT NULL,
    reenroll_until_ms BIGINT,
    deleted_ms  BIGINT
);
CREATE TABLE certificates (
    serial      TEXT PRIMARY KEY,
    seq         BIGSERIAL NOT NULL,
    connector   TEXT NOT NULL REFERENCES connectors(name),
    grp         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    issued_ms   BIGINT NOT NULL,
    not_after_ms BIGINT NOT NULL,
    revoked_ms  BIGINT,
    revoked_reason TEXT
);
CREATE INDEX certificates_by_connector ON certificates(connector);
CREATE TABLE provisioning_keys (
    grp         TEXT NOT NULL,
    key_sha256  TEXT NOT NULL,
    uses        BIGINT NOT NULL DEFAULT 0,
    revoked_ms  BIGINT,
    last_used_ms BIGINT,
    PRIMARY KEY (grp, key_sha256)
);
CREATE TABLE certificate_grace (
    serial       TEXT PRIMARY KEY REFERENCES certificates(serial),
    connector    TEXT NOT NULL,
    superseded_ms BIGINT NOT NULL,
    revoke_at_ms BIGINT NOT NULL
);
CREATE INDEX certificate_grace_by_time ON certificate_grace(revoke_at_ms);
CREATE TABLE replicas (
    id           TEXT PRIMARY KEY,
    addresses    TEXT NOT NULL,
    version      TEXT NOT NULL,
    started_ms   BIGINT NOT NULL,
    heartbeat_ms BIGINT NOT NULL,
    policy_hash  TEXT NOT NULL
);
