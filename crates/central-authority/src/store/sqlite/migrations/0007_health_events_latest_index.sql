-- Version 7: the latest history row of one (application, connector), which
-- a new row is compared with (CA processes sharing the file each see every
-- transition; it is recorded once).
CREATE INDEX health_events_latest ON health_events(host, port, connector, segment, protocol);
