-- Version 9: the audit trail of admin actions (who, from where, what, on
-- what, with what outcome), kept for `[audit] retention_s`.
CREATE TABLE admin_audit (
    at_ms      BIGINT NOT NULL,
    actor_kind TEXT NOT NULL,
    actor      TEXT NOT NULL,
    source     TEXT NOT NULL,
    action     TEXT NOT NULL,
    target     TEXT NOT NULL,
    outcome    TEXT NOT NULL,
    detail     TEXT NOT NULL
);
CREATE INDEX admin_audit_by_time ON admin_audit(at_ms);
