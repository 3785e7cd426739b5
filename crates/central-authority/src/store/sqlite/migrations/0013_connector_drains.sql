-- Version 13: the connectors an administrator drained (selected for no
-- new access while they keep their sessions and reports), since when and
-- by whom. Any connector name: a CA without TLS drains connectors it knows
-- only by their sessions.
CREATE TABLE connector_drains (
    connector  TEXT PRIMARY KEY,
    since_ms   BIGINT NOT NULL,
    actor_kind TEXT NOT NULL,
    actor      TEXT NOT NULL
);
