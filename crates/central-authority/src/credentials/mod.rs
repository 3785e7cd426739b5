//! What the CA and its callers prove who they are with, and the checks of
//! it: the CA's certificates (`pki`, naming this host's names and
//! addresses from `host`), the TLS material the listeners serve (`tls`),
//! API tokens, provisioning keys and the one authorization rule (`auth`),
//! and people's sign-in with OpenID providers (`oidc`). Nothing here keeps
//! CA state beyond its own material; the features in `trust` use it.

pub mod auth;
pub mod host;
pub mod oidc;
pub mod pki;
pub mod tls;
