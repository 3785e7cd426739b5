//! The audit trail: `GET /api/v1/audit`, itself an audited read.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::error::ApiError;

use super::Shared;
use super::audited::{Acted, audited_as};
use super::events::{history_paging, parse_time};
use super::extract::Caller;

#[derive(Debug, Deserialize)]
pub(super) struct AuditQuery {
    since: Option<String>,
    action: Option<String>,
    target: Option<String>,
    actor: Option<String>,
    page: Option<String>,
    per_page: Option<String>,
}

/// Parses `GET /api/v1/audit`'s query into a filter and paging (as
/// `GET /api/v1/events` pages).
fn audit_query(q: AuditQuery) -> Result<(crate::store::AuditFilter, u64, u32), ApiError> {
    let given = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let (page, per_page) = history_paging(q.page, q.per_page)?;
    let filter = crate::store::AuditFilter {
        since_ms: given(q.since)
            .map(|v| parse_time("since", &v))
            .transpose()?,
        action: given(q.action),
        target: given(q.target),
        actor: given(q.actor),
    };
    Ok((filter, page, per_page))
}

/// `GET /api/v1/audit`: the audit trail of admin actions, newest first.
/// The read is itself an entry (`audit.read`, its query as the detail),
/// recorded once the page is read; a refused one too.
pub(super) async fn audit(
    State(a): State<Shared>,
    caller: Caller,
    axum::extract::RawQuery(raw): axum::extract::RawQuery,
    Query(q): Query<AuditQuery>,
) -> Response {
    let (filter, page, per_page) = match audit_query(q) {
        Ok(x) => x,
        Err(e) => return e.into_response(),
    };
    let query = raw.unwrap_or_default();
    let read = audited_as(&a, caller, "audit.read", String::new(), move |a| {
        let page = a.audit_page(&filter, page, per_page)?;
        let answer = serde_json::to_value(page).unwrap_or_default();
        Ok(Acted::Read(answer, query))
    })
    .await;
    match read {
        Ok(page) => axum::Json(page.unwrap_or_default()).into_response(),
        Err(response) => response,
    }
}
