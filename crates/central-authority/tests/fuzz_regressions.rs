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
        let r = central_authority::credentials::pki::identity_of(&data);
        if path.ends_with("seed-connector-cert.der") {
            let id = r.expect("the seed is a real connector certificate");
            assert_eq!((id.name.as_str(), id.group.as_str()), ("c1", "g"));
        }
    }
}

#[test]
fn csr_inputs_never_panic() {
    // `fuzzing::csr` skips every input if its CA root cannot be made: load
    // one the same way here and fail naming why, so the replay cannot pass
    // without issuing anything; the seed must give a certificate.
    let dir = std::env::temp_dir().join(format!("reach-csr-replay-{}", std::process::id()));
    let pki = central_authority::credentials::pki::Pki::load(
        &dir,
        &central_authority::credentials::pki::TlsSources::default(),
        &[],
        std::time::Duration::from_secs(86_400),
    )
    .unwrap_or_else(|e| panic!("the CSR replay needs a CA root in {}: {e}", dir.display()));
    let mut issued = 0;
    for (path, data) in inputs("csr") {
        central_authority::tools::fuzzing::csr(&data);
        let r = pki.issue("c1", "g", &String::from_utf8_lossy(&data));
        if path.ends_with("seed-p256.pem") {
            let cert = r.unwrap_or_else(|e| panic!("the seed is a valid CSR: {e}"));
            assert!(cert.identity_uri.contains("c1"), "{}", cert.identity_uri);
            issued += 1;
        }
    }
    assert_eq!(issued, 1, "the seed CSR was replayed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn http_body_inputs_never_panic() {
    for (_, data) in inputs("http_bodies") {
        central_authority::tools::fuzzing::http_bodies(&data);
    }
}
