//! Access resolution: the decision for one request (segment match,
//! candidate selection, on-access discovery) and its explanation.

pub mod decide;
pub mod explain;
