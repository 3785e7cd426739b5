//! Admin actions recorded in the audit trail (`trust::audit`): run for a
//! [`Caller`](super::Caller), recorded with their outcome, answered only
//! once recorded.

use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::state::authority::Authority;
use crate::trust;

use super::Shared;
use super::extract::Caller;
use super::respond::{shutting_down, storage, trail_unavailable};

/// Runs admin `action` on `target` for `caller` off the async workers and
/// records it in the audit trail: `refused` (the caller lacks the `admin`
/// scope; `f` does not run), else `ok` (`f` found the target; the answer's
/// fields are the detail), `not_found` or `failed`.
pub(super) async fn audited(
    a: &Shared,
    caller: Caller,
    action: &'static str,
    target: String,
    f: impl FnOnce(&Authority) -> Result<Option<serde_json::Value>, crate::store::StoreError>
    + Send
    + 'static,
) -> Result<Option<serde_json::Value>, Response> {
    audited_as(a, caller, action, target, move |a| {
        Ok(f(a)?.map_or(Acted::NotFound, Acted::Done))
    })
    .await
}

/// What an admin action's work came to.
pub(super) enum Acted {
    /// Done: the answer's fields (also the audit entry's detail).
    Done(serde_json::Value),
    /// No such target; nothing changed.
    NotFound,
    /// Declined by the action's own rule (a drain that would leave an
    /// application without a connector): nothing changed; the answer, and
    /// why for the audit entry (`refused`).
    Declined(Response, String),
    /// A read (of the audit trail): the answer, and the entry's detail
    /// (the query, not the answer).
    Read(serde_json::Value, String),
}

/// Why an audited action was not done.
enum NotDone {
    /// The caller lacks the `admin` scope.
    Refused(ApiError),
    /// The action's own rule declined it (its answer).
    Declined(Box<Response>),
    /// The store failed.
    Store(crate::store::StoreError),
    /// The audit trail could not record it.
    Trail,
}

/// [`audited`] for an action that may also be declined (`Acted::Declined`,
/// recorded as `refused` with its reason).
pub(super) async fn audited_as(
    a: &Shared,
    caller: Caller,
    action: &'static str,
    target: String,
    f: impl FnOnce(&Authority) -> Result<Acted, crate::store::StoreError> + Send + 'static,
) -> Result<Option<serde_json::Value>, Response> {
    use crate::trust::audit::{AdminAction, Outcome};
    let Caller {
        actor,
        source,
        refused,
    } = caller;
    let done = a
        .blocking(move |a| {
            let (result, outcome, detail) = match refused {
                Some(refusal) => {
                    let detail = refusal.message();
                    (Err(NotDone::Refused(refusal)), Outcome::Refused, detail)
                }
                None => match f(a) {
                    Ok(Acted::Done(v)) => {
                        let detail = v.to_string();
                        (Ok(Some(v)), Outcome::Ok, detail)
                    }
                    Ok(Acted::Read(v, query)) => (Ok(Some(v)), Outcome::Ok, query),
                    Ok(Acted::NotFound) => (Ok(None), Outcome::NotFound, String::new()),
                    Ok(Acted::Declined(answer, why)) => (
                        Err(NotDone::Declined(Box::new(answer))),
                        Outcome::Refused,
                        why,
                    ),
                    Err(e) => {
                        let detail = e.to_string();
                        (Err(NotDone::Store(e)), Outcome::Failed, detail)
                    }
                },
            };
            let recorded = trust::audit::record(
                a,
                &AdminAction {
                    actor: &actor,
                    source,
                    action,
                    target: &target,
                    outcome,
                    detail,
                },
            );
            // No action stands unrecorded: without its entry a done action
            // is answered as failed. One that was not done keeps its own
            // answer (a store that does not answer fails the entry too).
            match result {
                Ok(v) => recorded.map(|()| v).map_err(|_| NotDone::Trail),
                Err(not_done) => Err(not_done),
            }
        })
        .await;
    match done {
        Some(Ok(v)) => Ok(v),
        Some(Err(NotDone::Refused(refusal))) => Err(refusal.into_response()),
        Some(Err(NotDone::Declined(answer))) => Err(*answer),
        // A store that does not answer is 503 `store_unavailable`, any
        // other database failure 500 (`storage` logs either).
        Some(Err(NotDone::Store(e))) => Err(storage(e)),
        Some(Err(NotDone::Trail)) => Err(trail_unavailable()),
        None => Err(shutting_down()),
    }
}
