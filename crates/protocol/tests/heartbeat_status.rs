//! `Heartbeat.status` (`ConnectorStatus`) on the wire, in both directions
//! of the compatibility rule: every field survives a round trip; a
//! heartbeat of a connector written before the field decodes with no
//! status and everything else intact; a CA written before it decodes a new
//! heartbeat, skipping the status, with everything else intact.

use prost::Message;
use protocol::v1;

/// `Heartbeat` as it was before `status` (fields 1 and 2 only).
#[derive(Clone, PartialEq, prost::Message)]
struct HeartbeatBeforeStatus {
    #[prost(message, optional, tag = "1")]
    load: Option<v1::CheckLoad>,
    #[prost(message, optional, tag = "2")]
    replicas: Option<v1::ReplicaAttachment>,
}

fn load() -> v1::CheckLoad {
    v1::CheckLoad {
        targets: 12,
        checks_per_cycle: 30,
        cycle_seconds: 1.5,
        queue_depth: 2,
        checks_per_second: 19.5,
        in_flight: 3,
        rate_limit: 20,
    }
}

fn replicas() -> v1::ReplicaAttachment {
    v1::ReplicaAttachment {
        sessions: 2,
        assignments: 1,
        follows_this_session: true,
        agrees_with_followed: true,
        assignment_hash: "0123456789abcdef".into(),
        followed_assignment_hash: "0123456789abcdef".into(),
    }
}

fn status() -> v1::ConnectorStatus {
    v1::ConnectorStatus {
        version: "0.2.0".into(),
        os: "linux".into(),
        arch: "x86_64".into(),
        process_start_unix_ms: 1_767_225_700_120,
        host_boot_unix_ms: 1_767_225_600_000,
        process_cpu_percent: 3.25,
        host_cpu_percent: 41.5,
        process_memory_bytes: 20 << 20,
        host_memory_total_bytes: 8 << 30,
        host_memory_available_bytes: 3 << 30,
        applications: 17,
        default_route_interface: "eth0".into(),
        dns_resolvers: vec!["10.0.0.2".into(), "[fd00::53]:5353".into()],
        bytes_sent: 123_456,
        bytes_received: 654_321,
    }
}

#[test]
fn every_status_field_survives_a_round_trip() {
    let beat = v1::Heartbeat {
        load: Some(load()),
        replicas: Some(replicas()),
        status: Some(Box::new(status())),
    };
    let message = v1::ConnectorMessage {
        kind: Some(v1::connector_message::Kind::Heartbeat(beat)),
    };
    let decoded =
        v1::ConnectorMessage::decode(message.encode_to_vec().as_slice()).expect("decodes");
    assert_eq!(decoded, message);
    // Each field is on the wire: a status with one field changed encodes
    // differently.
    let mut other = status();
    other.bytes_received += 1;
    assert_ne!(other.encode_to_vec(), status().encode_to_vec());
}

#[test]
fn a_heartbeat_without_status_still_decodes() {
    let old = HeartbeatBeforeStatus {
        load: Some(load()),
        replicas: Some(replicas()),
    };
    let new = v1::Heartbeat::decode(old.encode_to_vec().as_slice()).expect("decodes");
    assert_eq!(
        new,
        v1::Heartbeat {
            load: Some(load()),
            replicas: Some(replicas()),
            status: None,
        }
    );
}

#[test]
fn a_reader_without_status_skips_it() {
    let new = v1::Heartbeat {
        load: Some(load()),
        replicas: Some(replicas()),
        status: Some(Box::new(status())),
    };
    let bytes = new.encode_to_vec();
    let old = HeartbeatBeforeStatus::decode(bytes.as_slice()).expect("decodes");
    assert_eq!(
        old,
        HeartbeatBeforeStatus {
            load: Some(load()),
            replicas: Some(replicas()),
        }
    );
    // The status made the message longer: it was there to skip.
    assert!(bytes.len() > old.encode_to_vec().len());
}
