CREATE INDEX health_events_latest ON health_events(host, port, connector, segment, protocol, seq);
