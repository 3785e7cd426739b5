//! End-to-end harness (being written).
