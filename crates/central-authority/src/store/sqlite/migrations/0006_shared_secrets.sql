-- Version 6: secrets every replica sharing the store uses (the key of
-- on-access ids), created once by whichever replica needs one first.
CREATE TABLE shared_secrets (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
