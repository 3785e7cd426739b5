//! The CA: how the connector reaches it ([`dial`], [`traffic`]), which roots
//! it trusts for it ([`trust`]), and the certificate it holds
//! ([`enroll`], [`renewal`]).

pub mod dial;
pub mod enroll;
pub mod renewal;
pub mod traffic;
pub mod trust;
