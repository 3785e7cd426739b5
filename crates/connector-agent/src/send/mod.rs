//! Sending: one application's [`report`] on its way to every replica,
//! encoded once; the [`outbox`] that batches, paces and coalesces a
//! session's reports and re-sends them on the CA's flow control; the
//! [`wire`] form they leave in.

pub mod outbox;
pub mod report;
pub mod wire;
