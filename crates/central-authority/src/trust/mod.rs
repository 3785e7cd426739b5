//! Who may talk to the CA: certificates (`pki`, naming this host's names
//! and addresses from `host`), provisioning keys and
//! API tokens (`auth`), enrollment and connector administration
//! (`enroll`), certificate renewal (`renew`), the throttle of failed
//! attempts (`throttle`), the TLS material the listeners serve (`tls`),
//! its reload and the rotation of the issuing root (`rotation`) and the
//! audit trail of admin actions (`audit`).

pub mod audit;
pub mod auth;
pub mod enroll;
pub mod host;
pub mod identity;
pub mod oidc;
pub mod pki;
pub mod renew;
pub mod rotation;
pub mod throttle;
pub mod tls;
