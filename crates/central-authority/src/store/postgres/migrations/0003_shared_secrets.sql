CREATE TABLE shared_secrets (
    name  TEXT PRIMARY KEY,
    value BYTEA NOT NULL
);
