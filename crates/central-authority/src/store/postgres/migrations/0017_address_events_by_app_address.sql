-- Version 17: the address history listed through one index, by
-- application and address: a listing of one application, or of one of
-- its addresses (the dashboard's), walks it; `address_events_by_time`
-- serves the prune and a listing across applications. A row goes into
-- two indexes instead of three.
DROP INDEX address_events_by_address;
DROP INDEX address_events_by_app;
CREATE INDEX address_events_by_app ON address_events(host_hash, port, address_hash, at_ms);
