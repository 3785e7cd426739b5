-- Version 11: the latest tables become a checkpoint of where each history
-- ends, written every few minutes instead of per transition (each replica
-- keeps the ends in memory and reads the rows appended after it last
-- looked). Per history: the `seq` the latest table holds the rows up to,
-- when it was written, and the latest prune's cutoff (each replica then
-- forgets the ends of rows before it). The tables were up to date until
-- now.
CREATE TABLE history_ends (
    name      TEXT PRIMARY KEY,
    seq       BIGINT NOT NULL,
    at_ms     BIGINT NOT NULL,
    pruned_ms BIGINT NOT NULL
);
INSERT INTO history_ends (name, seq, at_ms, pruned_ms) VALUES
    ('health', (SELECT COALESCE(max(seq), 0) FROM health_events),
     (extract(epoch FROM now()) * 1000)::BIGINT, 0),
    ('address', (SELECT COALESCE(max(seq), 0) FROM address_events),
     (extract(epoch FROM now()) * 1000)::BIGINT, 0);
