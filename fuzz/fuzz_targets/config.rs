//! Fuzz target: the CA's configuration parser and validator on arbitrary
//! text. Any input must give a `Config` or a `ConfigError`, never a panic.
//! The body is `central_authority::tools::fuzzing::config`, which the test suite
//! replays the kept inputs through.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| central_authority::tools::fuzzing::config(data));
