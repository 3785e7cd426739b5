//! The fuzz targets' kept inputs (`fuzz/regressions/<target>/`), replayed
//! through the same functions in the plain test suite: a crash a fuzzer once
//! found stays fixed even where cargo-fuzz is not installed.

use std::path::{Path, PathBuf};

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
        central_authority::tools::fuzzing::config(&data);
    }
}

#[test]
fn wire_inputs_never_panic() {
    for (_, data) in inputs("wire_policy") {
        protocol::fuzzing::wire_policy(&data);
    }
}

#[test]
fn certificate_inputs_never_panic() {
    for (path, data) in inputs("certificate") {
        let r = central_authority::trust::pki::identity_of(&data);
        if path.ends_with("seed-connector-cert.der") {
            let id = r.expect("the seed is a real connector certificate");
            assert_eq!((id.name.as_str(), id.group.as_str()), ("c1", "g"));
        }
    }
}

#[test]
fn csr_inputs_never_panic() {
    for (_, data) in inputs("csr") {
        central_authority::tools::fuzzing::csr(&data);
    }
}

#[test]
fn http_body_inputs_never_panic() {
    for (_, data) in inputs("http_bodies") {
        central_authority::tools::fuzzing::http_bodies(&data);
    }
}
