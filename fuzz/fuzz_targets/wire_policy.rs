//! Fuzz target: wire bytes → protobuf messages → policy types, the border
//! every connector and CA message crosses. Malformed input must be a
//! `DecodeError` or a `WireError`, never a panic. The body is
//! `protocol::fuzzing::wire_policy`, which the test suite replays the kept
//! inputs through.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| protocol::fuzzing::wire_policy(data));
