//! Lock helpers for the CA's `std` locks. A poisoned lock is taken over
//! rather than propagated: every critical section leaves its data
//! consistent before anything in it can panic, and one panicked task must
//! not take the whole CA down with it.
//!
//! Only the owners of CA state lock anything, through these helpers or
//! directly (the list is the Architecture Invariant on lock owners in
//! ARCHITECTURE.md: `state::authority`, `state::health`, `state::limits`,
//! `state::on_access`, `state::registry`, `state::rosters`, `state::tickets`,
//! `state::warmup`, `store::sqlite`, `store::postgres`, `api::listen`,
//! `credentials::oidc`, `credentials::tls`); everyone else goes through their APIs.
//! The helpers lock on their callers' behalf: this module owns no lock.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
