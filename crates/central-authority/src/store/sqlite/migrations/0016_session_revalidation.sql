-- Version 16: sessions re-validated with their provider. The provider's
-- session id (back-channel logout names it or the subject), the roles
-- claim's values (mapped to scopes at each request), when the provider last
-- confirmed the session, and its refresh token sealed with a key derived
-- from the session id (which the store never holds). Logout tokens' ids are
-- kept until they expire, so none is accepted twice. Sessions opened before
-- keep NULLs and end at their first re-validation.
ALTER TABLE auth_sessions ADD COLUMN sid TEXT;
ALTER TABLE auth_sessions ADD COLUMN roles TEXT;
ALTER TABLE auth_sessions ADD COLUMN checked_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE auth_sessions ADD COLUMN refresh_sealed TEXT;
CREATE TABLE auth_logout_tokens (
    provider   TEXT NOT NULL,
    jti        TEXT NOT NULL,
    expires_ms BIGINT NOT NULL,
    PRIMARY KEY (provider, jti)
);
