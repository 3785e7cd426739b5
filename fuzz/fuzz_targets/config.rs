//! Fuzz target: the CA's configuration parser and validator on arbitrary
//! text. Any input must give a `Config` or a `ConfigError`, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // A base directory that does not exist: `*_file` paths fail cleanly.
    let base = std::path::Path::new("/nonexistent/reach-fuzz");
    if let Err(e) = central_authority::Config::from_toml(&text, base) {
        let _ = e.messages();
    }
    let _ = central_authority::config::parse_utc(&text);
});
