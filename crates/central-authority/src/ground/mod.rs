//! The ground floor: what every module of the CA may use and what uses no
//! other module of it. The wall clock (`clock`), the lock helpers (`sync`),
//! `Secret` (`secret`), hashing (`digest`) and the schemas of the policy's
//! enums for the API's documents (`schema`).

pub mod clock;
pub mod digest;
pub mod schema;
pub mod secret;
pub mod sync;
