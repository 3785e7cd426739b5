//! People's sessions and sign-ins (`auth_sessions`, `auth_logins`,
//! `auth_logout_tokens`).

use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use crate::ground::sync::lock;
use crate::store::{LoginRecord, SessionRecord, StoreError};

/// The columns [`session_row`] reads, in its order.
const SESSION_COLUMNS: &str = "id_sha256, person, provider, scopes, created_ms, expires_ms, \
     revoked_ms, subject, sid, roles, checked_ms, refresh_sealed";

fn session_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRecord> {
    Ok(SessionRecord {
        id_sha256: r.get(0)?,
        person: r.get(1)?,
        provider: r.get(2)?,
        scopes: r.get(3)?,
        created_ms: r.get(4)?,
        expires_ms: r.get(5)?,
        revoked_ms: r.get(6)?,
        subject: r.get(7)?,
        sid: r.get(8)?,
        roles: r.get(9)?,
        checked_ms: r.get(10)?,
        refresh_sealed: r.get(11)?,
    })
}

impl SqliteStore {
    /// Records a new session, forgetting those that ended before it.
    pub(crate) fn create_session(&self, r: &SessionRecord) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        conn.execute(
            "DELETE FROM auth_sessions WHERE expires_ms < ?1",
            params![r.created_ms],
        )?;
        conn.execute(
            "INSERT INTO auth_sessions (id_sha256, person, provider, scopes, created_ms, expires_ms,
                                        subject, sid, roles, checked_ms, refresh_sealed)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                r.id_sha256,
                r.person,
                r.provider,
                r.scopes,
                r.created_ms,
                r.expires_ms,
                r.subject,
                r.sid,
                r.roles,
                r.checked_ms,
                r.refresh_sealed
            ],
        )?;
        Ok(())
    }

    /// The session whose id hashes to `id_sha256`.
    pub(crate) fn session(&self, id_sha256: &str) -> Result<Option<SessionRecord>, StoreError> {
        let conn = lock(&self.conn);
        Ok(conn
            .query_row(
                &format!("SELECT {SESSION_COLUMNS} FROM auth_sessions WHERE id_sha256 = ?1"),
                params![id_sha256],
                session_row,
            )
            .optional()?)
    }

    /// The live sessions, newest first.
    pub(crate) fn sessions(&self, now_ms: i64) -> Result<Vec<SessionRecord>, StoreError> {
        let conn = lock(&self.conn);
        let mut stmt = conn.prepare(&format!(
            "SELECT {SESSION_COLUMNS} FROM auth_sessions
             WHERE revoked_ms IS NULL AND expires_ms > ?1 ORDER BY created_ms DESC"
        ))?;
        let rows = stmt.query_map(params![now_ms], session_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Claims a session's re-validation (compare and set of `checked_ms`).
    pub(crate) fn claim_session_check(
        &self,
        id_sha256: &str,
        seen_checked_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        Ok(conn.execute(
            "UPDATE auth_sessions SET checked_ms = ?3 WHERE id_sha256 = ?1 AND checked_ms = ?2",
            params![id_sha256, seen_checked_ms, now_ms],
        )? > 0)
    }

    /// Records what a re-validation learnt.
    pub(crate) fn session_refreshed(
        &self,
        id_sha256: &str,
        roles: &str,
        refresh_sealed: Option<&str>,
    ) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        conn.execute(
            "UPDATE auth_sessions SET roles = ?2, refresh_sealed = COALESCE(?3, refresh_sealed)
             WHERE id_sha256 = ?1",
            params![id_sha256, roles, refresh_sealed],
        )?;
        Ok(())
    }

    /// Revokes a provider session's (or subject's) live sessions.
    pub(crate) fn revoke_provider_sessions(
        &self,
        provider: &str,
        sid: Option<&str>,
        sub: Option<&str>,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        let conn = lock(&self.conn);
        let n = conn.execute(
            "UPDATE auth_sessions SET revoked_ms = ?4
             WHERE provider = ?1 AND revoked_ms IS NULL
               AND ((?2 IS NOT NULL AND sid = ?2) OR (?2 IS NULL AND subject = ?3))",
            params![provider, sid, sub, now_ms],
        )?;
        Ok(n as u64)
    }

    /// Records a logout token's id; false when it was there.
    pub(crate) fn logout_token_once(
        &self,
        provider: &str,
        jti: &str,
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        conn.execute(
            "DELETE FROM auth_logout_tokens WHERE expires_ms < ?1",
            params![now_ms],
        )?;
        Ok(conn.execute(
            "INSERT INTO auth_logout_tokens (provider, jti, expires_ms) VALUES (?1, ?2, ?3)
             ON CONFLICT (provider, jti) DO NOTHING",
            params![provider, jti, expires_ms],
        )? > 0)
    }

    /// Revokes a session; whether one was live.
    pub(crate) fn revoke_session(&self, id_sha256: &str, now_ms: i64) -> Result<bool, StoreError> {
        let conn = lock(&self.conn);
        Ok(conn.execute(
            "UPDATE auth_sessions SET revoked_ms = ?2 WHERE id_sha256 = ?1 AND revoked_ms IS NULL",
            params![id_sha256, now_ms],
        )? > 0)
    }

    /// Records a sign-in on its way, forgetting those that expired.
    pub(crate) fn put_login(&self, r: &LoginRecord, now_ms: i64) -> Result<(), StoreError> {
        let conn = lock(&self.conn);
        conn.execute(
            "DELETE FROM auth_logins WHERE expires_ms < ?1",
            params![now_ms],
        )?;
        conn.execute(
            "INSERT INTO auth_logins (state_sha256, provider, verifier, nonce, next, expires_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                r.state_sha256,
                r.provider,
                r.verifier,
                r.nonce,
                r.next,
                r.expires_ms
            ],
        )?;
        Ok(())
    }

    /// Takes (once) the sign-in whose state hashes to `state_sha256`, if
    /// it has not expired.
    pub(crate) fn take_login(
        &self,
        state_sha256: &str,
        now_ms: i64,
    ) -> Result<Option<LoginRecord>, StoreError> {
        let conn = lock(&self.conn);
        Ok(conn
            .query_row(
                "DELETE FROM auth_logins WHERE state_sha256 = ?1
                 RETURNING state_sha256, provider, verifier, nonce, next, expires_ms",
                params![state_sha256],
                |r| {
                    Ok(LoginRecord {
                        state_sha256: r.get(0)?,
                        provider: r.get(1)?,
                        verifier: r.get(2)?,
                        nonce: r.get(3)?,
                        next: r.get(4)?,
                        expires_ms: r.get(5)?,
                    })
                },
            )
            .optional()?
            .filter(|l| l.expires_ms >= now_ms))
    }
}
