//! Fuzz target: reading a connector identity from certificate bytes a peer
//! presents. Anything that is not a reach certificate must be an
//! `IdentityError`, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = central_authority::credentials::pki::identity_of(data);
});
