//! People's sessions and sign-ins (`auth_sessions`, `auth_logins`,
//! `auth_logout_tokens`).

use super::PgStore;
use crate::store::{LoginRecord, SessionRecord, StoreError};

/// The columns [`session_row`] reads, in its order.
const SESSION_COLUMNS: &str = "id_sha256, person, provider, scopes, created_ms, expires_ms, \
     revoked_ms, subject, sid, roles, checked_ms, refresh_sealed";

fn session_row(r: &tokio_postgres::Row) -> SessionRecord {
    SessionRecord {
        id_sha256: r.get(0),
        person: r.get(1),
        provider: r.get(2),
        scopes: r.get(3),
        created_ms: r.get(4),
        expires_ms: r.get(5),
        revoked_ms: r.get(6),
        subject: r.get(7),
        sid: r.get(8),
        roles: r.get(9),
        checked_ms: r.get(10),
        refresh_sealed: r.get(11),
    }
}

impl PgStore {
    pub(crate) fn create_session(&self, r: &SessionRecord) -> Result<(), StoreError> {
        self.block(async {
            let client = self.client().await?;
            client
                .execute(
                    "DELETE FROM auth_sessions WHERE expires_ms < $1",
                    &[&r.created_ms],
                )
                .await?;
            client
                .execute(
                    "INSERT INTO auth_sessions
                         (id_sha256, person, provider, scopes, created_ms, expires_ms,
                          subject, sid, roles, checked_ms, refresh_sealed)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                    &[
                        &r.id_sha256,
                        &r.person,
                        &r.provider,
                        &r.scopes,
                        &r.created_ms,
                        &r.expires_ms,
                        &r.subject,
                        &r.sid,
                        &r.roles,
                        &r.checked_ms,
                        &r.refresh_sealed,
                    ],
                )
                .await?;
            Ok(())
        })
    }

    pub(crate) fn session(&self, id_sha256: &str) -> Result<Option<SessionRecord>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    &format!("SELECT {SESSION_COLUMNS} FROM auth_sessions WHERE id_sha256 = $1"),
                    &[&id_sha256],
                )
                .await?;
            Ok(row.as_ref().map(session_row))
        })
    }

    pub(crate) fn sessions(&self, now_ms: i64) -> Result<Vec<SessionRecord>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let rows = client
                .query(
                    &format!(
                        "SELECT {SESSION_COLUMNS} FROM auth_sessions
                         WHERE revoked_ms IS NULL AND expires_ms > $1 ORDER BY created_ms DESC"
                    ),
                    &[&now_ms],
                )
                .await?;
            Ok(rows.iter().map(session_row).collect())
        })
    }

    pub(crate) fn claim_session_check(
        &self,
        id_sha256: &str,
        seen_checked_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let n = client
                .execute(
                    "UPDATE auth_sessions SET checked_ms = $3
                     WHERE id_sha256 = $1 AND checked_ms = $2",
                    &[&id_sha256, &seen_checked_ms, &now_ms],
                )
                .await?;
            Ok(n > 0)
        })
    }

    pub(crate) fn session_refreshed(
        &self,
        id_sha256: &str,
        roles: &str,
        refresh_sealed: Option<&str>,
    ) -> Result<(), StoreError> {
        self.block(async {
            let client = self.client().await?;
            client
                .execute(
                    "UPDATE auth_sessions
                     SET roles = $2, refresh_sealed = COALESCE($3, refresh_sealed)
                     WHERE id_sha256 = $1",
                    &[&id_sha256, &roles, &refresh_sealed],
                )
                .await?;
            Ok(())
        })
    }

    pub(crate) fn revoke_provider_sessions(
        &self,
        provider: &str,
        sid: Option<&str>,
        sub: Option<&str>,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        self.block(async {
            let client = self.client().await?;
            Ok(client
                .execute(
                    "UPDATE auth_sessions SET revoked_ms = $4
                     WHERE provider = $1 AND revoked_ms IS NULL
                       AND (($2::TEXT IS NOT NULL AND sid = $2)
                            OR ($2::TEXT IS NULL AND subject = $3))",
                    &[&provider, &sid, &sub, &now_ms],
                )
                .await?)
        })
    }

    pub(crate) fn logout_token_once(
        &self,
        provider: &str,
        jti: &str,
        expires_ms: i64,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        self.block(async {
            let client = self.client().await?;
            client
                .execute(
                    "DELETE FROM auth_logout_tokens WHERE expires_ms < $1",
                    &[&now_ms],
                )
                .await?;
            let n = client
                .execute(
                    "INSERT INTO auth_logout_tokens (provider, jti, expires_ms) VALUES ($1, $2, $3)
                     ON CONFLICT (provider, jti) DO NOTHING",
                    &[&provider, &jti, &expires_ms],
                )
                .await?;
            Ok(n > 0)
        })
    }

    pub(crate) fn revoke_session(&self, id_sha256: &str, now_ms: i64) -> Result<bool, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let n = client
                .execute(
                    "UPDATE auth_sessions SET revoked_ms = $2
                     WHERE id_sha256 = $1 AND revoked_ms IS NULL",
                    &[&id_sha256, &now_ms],
                )
                .await?;
            Ok(n > 0)
        })
    }

    pub(crate) fn put_login(&self, r: &LoginRecord, now_ms: i64) -> Result<(), StoreError> {
        self.block(async {
            let client = self.client().await?;
            client
                .execute("DELETE FROM auth_logins WHERE expires_ms < $1", &[&now_ms])
                .await?;
            client
                .execute(
                    "INSERT INTO auth_logins
                         (state_sha256, provider, verifier, nonce, next, expires_ms)
                     VALUES ($1, $2, $3, $4, $5, $6)",
                    &[
                        &r.state_sha256,
                        &r.provider,
                        &r.verifier,
                        &r.nonce,
                        &r.next,
                        &r.expires_ms,
                    ],
                )
                .await?;
            Ok(())
        })
    }

    pub(crate) fn take_login(
        &self,
        state_sha256: &str,
        now_ms: i64,
    ) -> Result<Option<LoginRecord>, StoreError> {
        self.block(async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "DELETE FROM auth_logins WHERE state_sha256 = $1
                     RETURNING state_sha256, provider, verifier, nonce, next, expires_ms",
                    &[&state_sha256],
                )
                .await?;
            Ok(row
                .map(|r| LoginRecord {
                    state_sha256: r.get(0),
                    provider: r.get(1),
                    verifier: r.get(2),
                    nonce: r.get(3),
                    next: r.get(4),
                    expires_ms: r.get(5),
                })
                .filter(|l| l.expires_ms >= now_ms))
        })
    }
}
