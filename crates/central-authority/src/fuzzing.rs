//! The body of the `config` fuzz target (`fuzz/fuzz_targets`): the CA's
//! configuration parser and validator on arbitrary text. Any input must give
//! a `Config` or a `ConfigError`, never a panic. Kept here so that the fuzz
//! target and the test that replays its stored inputs
//! (`fuzz/regressions/config`) run the same code. (The `certificate` target
//! is `pki::identity_of` alone; `wire_policy` is
//! `protocol::fuzzing::wire_policy`.)

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
