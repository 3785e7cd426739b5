//! The fuzz targets' kept inputs (`fuzz/regressions/<target>/`), replayed
//! through the same functions in the plain test suite: a crash a fuzzer once
//! found stays fixed even where cargo-fuzz is not installed.

use std::path::{Path, PathBuf};

use prost::Message;
use protocol::v1;

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions")
        .join(target);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("regressions directory") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            let bytes = std::fs::read(&path).expect("read");
            out.push((path, bytes));
        }
    }
    assert!(!out.is_empty(), "no inputs in {}", dir.display());
    out
}

#[test]
fn config_inputs_never_panic() {
    for (_, data) in inputs("config") {
        let text = String::from_utf8_lossy(&data);
        let base = Path::new("/nonexistent/reach-fuzz");
        if let Err(e) = central_authority::Config::from_toml(&text, base) {
            let _ = e.messages();
        }
        let _ = central_authority::config::parse_utc(&text);
    }
}

#[test]
fn wire_inputs_never_panic() {
    for (_, data) in inputs("wire_policy") {
        if let Ok(segment) = v1::Segment::decode(data.as_slice()) {
            let _ = policy::Segment::try_from(segment);
        }
        if let Ok(msg) = v1::ConnectorMessage::decode(data.as_slice())
            && let Some(v1::connector_message::Kind::Report(report)) = msg.kind
        {
            for app in report.applications {
                if let Some(key) = app.app {
                    let _ = policy::AppKey::try_from(key);
                }
                for address in app.addresses {
                    let _ = policy::AddressResult::try_from(address);
                }
            }
        }
    }
}

#[test]
fn certificate_inputs_never_panic() {
    for (path, data) in inputs("certificate") {
        let r = central_authority::pki::identity_of(&data);
        if path.ends_with("seed-connector-cert.der") {
            let id = r.expect("the seed is a real connector certificate");
            assert_eq!((id.name.as_str(), id.group.as_str()), ("c1", "g"));
        }
    }
}
