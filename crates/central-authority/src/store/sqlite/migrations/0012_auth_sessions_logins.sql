-- Version 12: people's sign-in. A session (its id's SHA-256, never the id)
-- and a sign-in on its way through the OpenID provider (its state's
-- SHA-256, the PKCE verifier and the nonce), shared by every replica.
CREATE TABLE auth_sessions (
    id_sha256  TEXT PRIMARY KEY,
    person     TEXT NOT NULL,
    provider   TEXT NOT NULL,
    scopes     TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL,
    revoked_ms BIGINT
);
CREATE TABLE auth_logins (
    state_sha256 TEXT PRIMARY KEY,
    provider     TEXT NOT NULL,
    verifier     TEXT NOT NULL,
    nonce        TEXT NOT NULL,
    next         TEXT NOT NULL,
    expires_ms   BIGINT NOT NULL
);
