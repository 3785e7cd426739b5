-- Version 7: the history of one segment (`/api/v1/events?segment=`),
-- newest first, read through an index instead of a scan of every row.
CREATE INDEX health_events_by_segment ON health_events(segment, at_ms);
