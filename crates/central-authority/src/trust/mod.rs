//! Who may talk to the CA: enrollment and connector administration
//! (`enroll`), certificate renewal (`renew`), who a session belongs to
//! (`identity`), the throttle of failed attempts (`throttle`), the reload of
//! the TLS material and the rotation of the issuing root (`rotation`) and
//! the audit trail of admin actions (`audit`), on the material of
//! `credentials`.

pub mod audit;
pub mod enroll;
pub mod identity;
pub mod renew;
pub mod rotation;
pub mod throttle;
