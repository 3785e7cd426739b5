-- Version 3: a name with a valid certificate is re-enrolled only when an
-- administrator allowed it (once, until `reenroll_until_ms`); a deleted
-- connector's name is free (its certificates stay recorded, revoked).
ALTER TABLE connectors ADD COLUMN reenroll_until_ms INTEGER;
ALTER TABLE connectors ADD COLUMN deleted_ms INTEGER;
