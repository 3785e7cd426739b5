//! Access resolution: the decision for one request (segment match,
//! candidate selection, on-access discovery) and its explanation, and the
//! drains that take connectors out of it.

pub mod decide;
pub mod drain;
pub mod explain;
pub mod roster;
