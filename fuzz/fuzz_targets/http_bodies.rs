//! Fuzz target: the HTTP API's JSON request bodies (`POST /api/v1/access`).
//! Anything malformed must be an `invalid_request` error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    central_authority::tools::fuzzing::http_bodies(data);
});
