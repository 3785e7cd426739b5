//! The audit trail: `GET /api/v1/audit`, itself an audited read.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::api::route::{
    Auth, Method, Op, Route, error_ref, json_body, or_empty, query_param, route,
};
use crate::credentials::auth::Scope;
use crate::error::ApiError;
use crate::trust;

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
        // Empty is no bound, as the document says; anything else,
        // whitespace too, is a time or refused.
        since_ms: (q.since.filter(|s| !s.is_empty()))
            .map(|v| parse_time("since", &v))
            .transpose()?,
        action: given(q.action),
        target: given(q.target),
        actor: given(q.actor),
    };
    Ok((filter, page, per_page))
}

/// `GET /api/v1/audit`, served by `audit`, and its document.
pub(super) fn audit_route() -> Route {
    route(
        Op {
            method: Method::Get,
            path: "/api/v1/audit",
            auth: Auth::Scope(Scope::Admin),
            spec: json!({
                "operationId": "listAudit",
                "summary": "The audit trail of admin actions, newest first, paged",
                "description": "Every admin action (connector disable, enable, revoke, allow-reenroll, drain, undrain, delete; provisioning key revoke; configuration reload, with the API tokens, connector groups and segments it added or removed by name; sign-ins, refused ones included, and sign-outs; reads of this trail, `audit.read`, this one recorded after it is read) with its time, actor (`token` by its configured name; `person` by the provider's user name; `system` for a reload, named by its trigger), source address, target and outcome (`ok`, `not_found`, `refused`, `failed`). A token without the `admin` scope that tries an action is recorded as `refused`; admin requests with an unknown, malformed or throttled token are one `token.refused` entry per source and minute (actor `unknown`, detail `refusals: N`). An action whose entry cannot be written answers 503 `audit_unavailable`. Kept `[audit] retention_s` (default one year), shared by every replica.",
                "tags": ["admin"],
                "parameters": [
                    query_param("since", false, "Unix ms or RFC 3339"),
                    {"name": "action", "in": "query", "required": false, "description": "e.g. connector.revoke, provisioning_key.revoke, config.reload", "schema": {"type": "string"}},
                    {"name": "target", "in": "query", "required": false, "description": "connector name, connector group or config file", "schema": {"type": "string"}},
                    {"name": "actor", "in": "query", "required": false, "description": "the actor's name (a token's configured name)", "schema": {"type": "string"}},
                    query_param("page", false, "page from 1"),
                    {"name": "per_page", "in": "query", "required": false, "description": "1-1000",
                        "schema": or_empty(json!({"type": "integer", "minimum": 1, "maximum": crate::api::listing::MAX_EVENTS_PER_PAGE}))}
                ],
                "responses": {
                    "200": {"description": "one page of the audit trail",
                        "content": json_body("AuditPage", json!({"entries": [{
                            "at": 1_764_000_000_000u64, "actor": {"kind": "token", "name": "ops"},
                            "source": "192.0.2.7", "action": "connector.revoke", "target": "c1",
                            "outcome": "ok", "detail": "{\"certificates_revoked\":1,\"name\":\"c1\"}"}],
                            "total": 1, "page": 1, "per_page": 100, "pages": 1}))},
                    "400": error_ref("InvalidRequest"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        audit,
    )
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
        let page = trust::audit::page(a, &filter, page, per_page)?;
        let answer = serde_json::to_value(page).unwrap_or_default();
        Ok(Acted::Read(answer, query))
    })
    .await;
    match read {
        Ok(page) => axum::Json(page.unwrap_or_default()).into_response(),
        Err(response) => response,
    }
}

#[cfg(test)]
mod tests {
    use super::{AuditQuery, audit_query};
    use crate::error::ApiError;

    fn since(v: &str) -> AuditQuery {
        AuditQuery {
            since: Some(v.to_owned()),
            action: None,
            target: None,
            actor: None,
            page: None,
            per_page: None,
        }
    }

    #[test]
    fn since_is_empty_a_time_or_refused_whitespace_too() {
        let ms = |v: &str| audit_query(since(v)).map(|(f, _, _)| f.since_ms);
        assert_eq!(ms("").ok(), Some(None));
        assert_eq!(ms("1796697691036").ok(), Some(Some(1_796_697_691_036)));
        assert_eq!(
            ms("2026-12-08T00:00:00Z").ok(),
            Some(Some(1_796_688_000_000))
        );
        for bad in ["\n", " ", "yesterday"] {
            match ms(bad) {
                Err(ApiError::InvalidRequest(m)) => assert!(m.starts_with("since:"), "{m}"),
                other => panic!("since={bad:?} gave {other:?}"),
            }
        }
    }
}
