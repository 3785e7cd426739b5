//! The owners of the CA's shared state and `Authority`, which composes
//! them. Every feature (intake, access, trust, api) depends on this folder;
//! nothing here depends on a feature.

pub mod access_ids;
pub mod addresses;
pub mod authority;
pub mod counters;
pub mod health;
pub mod history;
pub mod limits;
pub mod on_access;
pub mod policy_state;
pub mod registry;
pub mod rosters;
pub mod series;
pub mod tickets;
pub mod warmup;
