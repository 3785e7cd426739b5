//! Fuzz target: certificate issuance from the CSR an enrollment sends
//! (reachable with a provisioning key, before any client certificate).
//! Anything that is not a usable CSR must be a `PkiError`, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    central_authority::tools::fuzzing::csr(data);
});
