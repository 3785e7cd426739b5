-- Version 14: the root that signed each certificate (its SHA-256), so that
-- a root rotation can tell which connectors still hold a certificate of
-- the old root. Certificates recorded before stay NULL: not the new root's.
ALTER TABLE certificates ADD COLUMN root_sha256 TEXT;
