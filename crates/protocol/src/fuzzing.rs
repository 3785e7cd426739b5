//! The body of the `wire_policy` fuzz target (`fuzz/fuzz_targets`): wire
//! bytes → protobuf messages → policy types, the border every connector and
//! CA message crosses. Malformed input must give a `DecodeError` or a
//! `WireError`, never a panic. Kept here so that the fuzz target and the
//! test that replays its stored inputs (`fuzz/regressions/wire_policy`) run
//! the same code.

use prost::Message;

use crate::v1;

/// Decodes `data` as each message that carries policy types and converts
/// what decodes; the results are dropped.
pub fn wire_policy(data: &[u8]) {
    if let Ok(segment) = v1::Segment::decode(data) {
        let _ = policy::Segment::try_from(segment);
    }
    if let Ok(msg) = v1::ConnectorMessage::decode(data)
        && let Some(v1::connector_message::Kind::Report(report)) = msg.kind
    {
        for app in report.applications {
            // The parts on their own too, so a broken key does not hide
            // the addresses behind it.
            if let Some(key) = app.app.clone() {
                let _ = policy::AppKey::try_from(key);
            }
            for address in app.addresses.clone() {
                let _ = policy::AddressResult::try_from(address);
            }
            let _ = policy::ApplicationReport::try_from(app);
        }
    }
    if let Ok(msg) = v1::AuthorityMessage::decode(data) {
        match msg.kind {
            Some(v1::authority_message::Kind::Welcome(w)) => {
                for s in w.segments {
                    let _ = policy::Segment::try_from(s);
                }
            }
            Some(v1::authority_message::Kind::Access(a)) => {
                if let Some(key) = a.app {
                    let _ = policy::AppKey::try_from(key);
                }
            }
            _ => {}
        }
    }
}
