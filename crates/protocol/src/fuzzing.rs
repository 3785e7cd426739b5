//! The body of the `wire_policy` fuzz target (`fuzz/fuzz_targets`): wire
//! bytes → protobuf messages → policy types, the border every connector and
//! CA message crosses. Malformed input must give a `DecodeError` or a
//! `WireError`, never a panic. Kept here so that the fuzz target and the
//! test that replays its stored inputs (`fuzz/regressions/wire_policy`) run
//! the same code.

use prost::Message;

use crate::v1;

/// Decodes `data` as each message that carries policy types and converts
/// what decodes; the results are dropped. Also reads it as the CA's report
/// scan does, which must agree with prost and the conversion
/// ([`scan_agrees`]), and as an IP literal, where the scan's and the host
/// rules' own parse must agree with std's ([`ip_parse_agrees`]).
pub fn wire_policy(data: &[u8]) {
    scan_agrees(data);
    ip_parse_agrees(data);
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

/// `policy::host::parse_ip` and `parse_ipv4` (the scan's and `Host`'s IP
/// parse) against std's: a disagreement panics.
pub fn ip_parse_agrees(data: &[u8]) {
    let v4 = std::str::from_utf8(data)
        .ok()
        .and_then(|s| s.parse::<std::net::Ipv4Addr>().ok());
    assert_eq!(policy::host::parse_ipv4(data), v4, "parse_ipv4 {data:?}");
    if let Ok(s) = std::str::from_utf8(data) {
        assert_eq!(
            policy::host::parse_ip(s),
            s.parse::<std::net::IpAddr>().ok(),
            "parse_ip {s:?}"
        );
    }
}

/// The CA's report scan (`scan::scan_report`) against the prost path: when
/// the scan reads `data`, prost must decode it as a report whose every
/// entry converts to what the scan gives. A disagreement panics: it is what
/// the fuzzer looks for, since the scan exists only as a faster form of the
/// prost path.
pub fn scan_agrees(data: &[u8]) {
    let Some(scanned) = crate::scan::scan_report(data) else {
        return;
    };
    let report = match v1::ConnectorMessage::decode(data) {
        Ok(v1::ConnectorMessage {
            kind: Some(v1::connector_message::Kind::Report(report)),
        }) => report,
        other => panic!("the scan read a report that prost reads as {other:?}"),
    };
    assert_eq!(scanned.full_state, report.full_state, "full_state");
    assert_eq!(scanned.sequence, report.sequence, "sequence");
    assert_eq!(scanned.entries.len(), report.applications.len(), "entries");
    for (view, app) in scanned.entries.into_iter().zip(report.applications) {
        match policy::ApplicationReport::try_from(app) {
            Ok(expected) => assert_eq!(view.into_report(), expected),
            Err(e) => panic!("the scan took an entry that the conversion refuses: {e}"),
        }
    }
}
