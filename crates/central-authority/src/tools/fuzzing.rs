//! The body of the `config` fuzz target (`fuzz/fuzz_targets`): the CA's
//! configuration parser and validator on arbitrary text. Any input must give
//! a `Config` or a `ConfigError`, never a panic. Kept here so that the fuzz
//! target and the test that replays its stored inputs
//! (`fuzz/regressions/config`) run the same code. (The `certificate` target
//! is `credentials::pki::identity_of` alone; `wire_policy` is
//! `protocol::fuzzing::wire_policy`.) `csr` and `http_bodies` are the two
//! parsers reachable without authentication besides the TLS handshake:
//! certificate issuance from an enrollment's CSR, and the HTTP API's JSON
//! request bodies.

/// Parses and validates `data` as configuration text and as a UTC time;
/// the results are dropped.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    // A base directory that does not exist: `*_file` paths fail cleanly.
    let base = std::path::Path::new("/nonexistent/reach-fuzz");
    if let Err(e) = crate::Config::from_toml(&text, base) {
        let _ = e.messages();
    }
    let _ = crate::config::parse_utc(&text);
}

/// Issues a connector certificate from `data` as CSR text, with a CA root
/// generated once per process in a temporary directory. Any input must give
/// a certificate or a `PkiError`, never a panic.
pub fn csr(data: &[u8]) {
    static PKI: std::sync::OnceLock<Option<crate::credentials::pki::Pki>> =
        std::sync::OnceLock::new();
    let pki = PKI.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("reach-fuzz-csr-{}", std::process::id()));
        crate::credentials::pki::Pki::load(
            &dir,
            &crate::credentials::pki::TlsSources::default(),
            &[],
            std::time::Duration::from_secs(86_400),
        )
        .ok()
    });
    if let Some(pki) = pki {
        let _ = pki.issue("c1", "g", &String::from_utf8_lossy(data));
    }
}

/// Parses `data` as the HTTP API's JSON request bodies (today the access
/// request; the admin endpoints take none). Any input must give a request
/// or an `invalid_request` error, never a panic.
pub fn http_bodies(data: &[u8]) {
    if let Err(e) = crate::api::http::parse_access_body(data) {
        let _ = e.to_string();
    }
}
