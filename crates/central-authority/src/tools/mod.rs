//! Operator tools run by the binary besides the server: the backup, the admin
//! CLI, the policy planner, the importer, a new root for a rotation and the
//! fuzzing entry points.

pub mod backup;
pub mod cli;
pub mod fuzzing;
pub mod import;
pub mod login;
pub mod plan;
pub mod root;
