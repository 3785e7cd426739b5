-- Version 15: the audit trail names a person by their OpenID provider and
-- subject (`sub`) besides the user name the provider gave, as two
-- providers may each have an "alice"; empty for tokens and the CA itself.
-- A session keeps its person's subject for the actions they take.
ALTER TABLE admin_audit ADD COLUMN provider TEXT NOT NULL DEFAULT '';
ALTER TABLE admin_audit ADD COLUMN subject TEXT NOT NULL DEFAULT '';
ALTER TABLE auth_sessions ADD COLUMN subject TEXT NOT NULL DEFAULT '';
