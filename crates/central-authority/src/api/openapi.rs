//! The HTTP API's OpenAPI 3.1 document, served at `GET /api/v1/openapi.json`
//! and kept in the repository as `docs/openapi.json`.
//!
//! This module is the document's frame: its info, tags, security schemes,
//! the reusable error responses, the error reasons, and the component
//! schemas. Schemas come from the handlers' own types (`utoipa::ToSchema`
//! derived on the views and bodies; the policy enums through the
//! `schema_with` functions here, each guarded by an exhaustive `match` so a
//! new variant does not compile until it is documented). Its paths are the
//! operations of the router's own routes ([`document`] is given them by
//! `http::routes`): each route is declared once, next to its handler, with
//! its operation (`api::route`), so a served route and its document cannot
//! disagree. `docs/openapi.json` equals what is generated (`REACH_BLESS=1
//! cargo test -p central-authority openapi` rewrites it), and the
//! integration tests call every documented operation against a real CA.
//!
//! To document a new route: declare it with `route(Op, handler)` in its
//! handler's module, list it in `http::routes`, add its body types (derive
//! `utoipa::ToSchema`) to [`schemas`], then bless.

use std::borrow::Cow;

use policy::{HealthReporting, RefusalReason};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ArrayBuilder, Object, ObjectBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::access::explain::ExplanationView;
use crate::api::route::{Auth, Op, error_ref, json_body};
use crate::ground::schema::*;

/// The document of `ops` as served and kept (pretty JSON, keys sorted,
/// newline at the end).
pub fn render(ops: Vec<Op>) -> String {
    let mut text = serde_json::to_string_pretty(&document(ops)).unwrap_or_default();
    text.push('\n');
    text
}

/// What 503 `audit_unavailable` means.
const AUDIT_UNAVAILABLE: &str = "the audit trail could not record the action (its store refused the row): the action is answered as failed, never done unrecorded in silence; what it came to is in the CA's log";

/// Every reason an error answer (`{"error":{"reason","message"}}`) can
/// carry, with its HTTP status.
pub fn error_reasons() -> Vec<(&'static str, u16, &'static str)> {
    let mut out = vec![
        (
            "invalid_request",
            400,
            "malformed body, field, path or query (also 413: body over 64 KiB)",
        ),
        ("unauthorized", 401, "no, malformed or unknown bearer token"),
        ("forbidden", 403, "the token lacks the route's scope"),
        (
            crate::api::guard::CROSS_ORIGIN,
            403,
            "a state change from another origin (`Origin`, `Sec-Fetch-Site`)",
        ),
        (
            crate::api::guard::UNKNOWN_HOST,
            400,
            "no `Host` (HTTP/1.1), or one that is not among `[server] public_names`",
        ),
        (
            "not_found",
            404,
            "no such connector group or enrolled connector",
        ),
        (
            "csrf",
            403,
            "a state change with a session cookie without the session's `X-CSRF-Token`",
        ),
        (crate::api::guard::NO_ROUTE, 404, "no route serves the path"),
        (
            crate::api::guard::METHOD_NOT_ALLOWED,
            405,
            "the path does not serve the method",
        ),
        (
            "request_timeout",
            408,
            "the body did not arrive within `[limits] body_timeout_ms`",
        ),
        (
            crate::api::guard::UNSUPPORTED_MEDIA_TYPE,
            415,
            "a request body that is not `application/json`",
        ),
        (
            "throttled",
            429,
            "a failed token over its source address's allowance of failures; retry after `Retry-After` seconds (a valid token is never throttled)",
        ),
        ("invalid_code", 403, "a sign-in code refused (`/auth/cli`)"),
        ("internal", 500, "the CA's database failed (see its log)"),
        ("unavailable", 503, "the CA is shutting down"),
        ("audit_unavailable", 503, AUDIT_UNAVAILABLE),
        (
            "store_unavailable",
            503,
            "the CA's store (database) does not answer: an admin change or a read of the store was not made (nothing changed; retry once it is back); access decisions go on without the store",
        ),
        (
            "last_healthy_connector",
            409,
            "(`POST /api/v1/connectors/{name}/drain`) the drain would leave applications without a healthy, undrained connector; nothing changed (`force=true` drains anyway)",
        ),
        (
            "warming_up",
            503,
            "(`/readyz`, `/healthz`) the CA started recently and the connectors its store knows have not all re-attached and reported (at most `[health] warmup_ms`)",
        ),
    ];
    for r in REFUSALS {
        out.push((
            r.as_str(),
            crate::api::body::refusal_status(r).as_u16(),
            refusal_doc(r),
        ));
    }
    out
}

/// What an access refusal's reason means.
fn refusal_doc(r: RefusalReason) -> &'static str {
    match r {
        RefusalReason::NoSegment => "access refused: no segment matches the host",
        RefusalReason::PortNotInSegment => {
            "access refused: the deciding segment does not include the protocol/port"
        }
        RefusalReason::NoConnector => "access refused: no connector of the segment is connected",
        RefusalReason::AllDown => "access refused: every candidate reports the application down",
        RefusalReason::NoHealthReport => "access refused: no candidate has a current report",
        RefusalReason::DiscoveryTimeout => {
            "access refused: on-access discovery found nothing reachable in time"
        }
        RefusalReason::AllDrained => {
            "access refused: every connected candidate is drained (by an administrator, or shutting down)"
        }
    }
}

const REFUSALS: [RefusalReason; 7] = [
    RefusalReason::NoSegment,
    RefusalReason::PortNotInSegment,
    RefusalReason::NoConnector,
    RefusalReason::AllDown,
    RefusalReason::NoHealthReport,
    RefusalReason::DiscoveryTimeout,
    RefusalReason::AllDrained,
];

/// One candidate of an explanation (`policy::CandidateNote`).
#[derive(Debug)]
pub struct CandidateNoteSchema;

impl PartialSchema for CandidateNoteSchema {
    fn schema() -> RefOr<Schema> {
        let boolean = |d: &str| {
            ObjectBuilder::new()
                .schema_type(Type::Boolean)
                .description(Some(d))
        };
        let string = |d: &str| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some(d))
        };
        ObjectBuilder::new()
            .description(Some(
                "one candidate connector and whether it could carry the request",
            ))
            .property("connector", string("connector name"))
            .property("group", string("its group"))
            .property("connected", boolean("whether it has a live session"))
            .property("status", status())
            .property("eligible", boolean("whether it could have been chosen"))
            .property("reason", string("why (not)"))
            .property(
                "rtt_ms",
                nullable_number(
                    "its smoothed RTT to the application in milliseconds, when it has reported one",
                ),
            )
            .property(
                "distance_km",
                nullable_number(
                    "nearest, with the user's location counted: great-circle distance from the \
                     user to its group's location, kilometres",
                ),
            )
            .property(
                "user_rtt_ms",
                nullable_number(
                    "… and the round trip that distance costs at least (1 ms per 100 km), \
                     milliseconds",
                ),
            )
            .property(
                "score_ms",
                nullable_number(
                    "nearest: what it was compared by, `rtt_ms` plus `user_rtt_ms` when the \
                     location counts (null without an RTT)",
                ),
            )
            .required("connector")
            .required("group")
            .required("connected")
            .required("status")
            .required("eligible")
            .required("reason")
            .into()
    }
}

impl ToSchema for CandidateNoteSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("CandidateNote")
    }
}

impl PartialSchema for ExplanationView {
    fn schema() -> RefOr<Schema> {
        let candidate = utoipa::openapi::Ref::from_schema_name(CandidateNoteSchema::name());
        let mode = string_enum(
            names(&[
                HealthReporting::Continuous,
                HealthReporting::OnAccess,
                HealthReporting::None,
            ]),
            "the matched segment's mode (null before a segment matched)",
            true,
        );
        ObjectBuilder::new()
            .description(Some(
                "how the decision was reached: matching, the candidates with their \
                 eligibility (at most 32 listed, counted in full), forwarding and discovery",
            ))
            .property("segment", nullable_string("matched segment"))
            .property(
                "matched_entry",
                nullable_string("the segment entry that matched (FQDN, IP, wildcard or subnet)"),
            )
            .property("strategy", strategy())
            .property("mode", mode)
            .property(
                "candidates",
                ArrayBuilder::new().items(candidate).description(Some(
                    "the candidates and their eligibility, in candidate order; at most 32: \
                         when there are more, the chosen one, then eligible, then connected ones",
                )),
            )
            .property(
                "candidates_total",
                count("how many candidates there were, listed or not"),
            )
            .property(
                "candidates_eligible",
                count("how many candidates were eligible"),
            )
            .property(
                "candidates_connected",
                count("how many candidates had a live session"),
            )
            .property(
                "eligible_groups",
                strings("group strategy: the eligible groups"),
            )
            .property("user_location", user_location_note())
            .property(
                "chosen_group",
                nullable_string("group strategy: the group chosen first"),
            )
            .property(
                "forwarded_to",
                strings("connectors this access was forwarded to (on-access)"),
            )
            .property(
                "discovery_waited",
                ObjectBuilder::new()
                    .schema_type(Type::Boolean)
                    .description(Some("whether the CA waited for on-access discovery")),
            )
            .property(
                "discovery_ms",
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(0))
                    .description(Some("how long it waited, milliseconds")),
            )
            .required("strategy")
            .required("candidates")
            .required("candidates_total")
            .required("candidates_eligible")
            .required("candidates_connected")
            .required("eligible_groups")
            .required("forwarded_to")
            .required("discovery_waited")
            .required("discovery_ms")
            .into()
    }
}

impl ToSchema for ExplanationView {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Explanation")
    }
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((
            CandidateNoteSchema::name().into_owned(),
            CandidateNoteSchema::schema(),
        ));
    }
}

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Error)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
    /// `POST /api/v1/access` refusals only: how the decision was reached.
    pub explanation: Option<ExplanationView>,
}

/// `error` of an error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable reason (one of a fixed list; see each response).
    #[schema(schema_with = reason)]
    pub reason: String,
    /// For people; names what was wrong.
    pub message: String,
}

fn reason() -> Object {
    let reasons = error_reasons();
    let text: Vec<String> = reasons
        .iter()
        .map(|(r, s, d)| format!("`{r}` ({s}): {d}"))
        .collect();
    string_enum(
        reasons.iter().map(|(r, _, _)| (*r).to_owned()).collect(),
        &format!("machine-readable reason: {}", text.join("; ")),
        false,
    )
}

/// `GET /api/v1/replicas`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReplicasBody {
    /// The id of the replica that answered (null without a shared store).
    pub this: Option<String>,
    /// Whether this replica's store answers, as its last call found it.
    pub store: crate::store::StoreStatus,
    /// Every replica the store knows (empty while the store does not
    /// answer).
    pub replicas: Vec<crate::replicas::ReplicaView>,
}

/// `GET /api/v1/provisioning_keys`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProvisioningKeysBody {
    /// One entry per connector group (never the key itself).
    pub provisioning_keys: Vec<crate::trust::enroll::KeyView>,
}

/// `GET /api/v1/log_receivers`.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogReceiversBody {
    /// This replica's id (each replica streams its own records).
    pub replica: Option<String>,
    /// Every `[[log_receivers]]` entry in force, in configuration order.
    pub log_receivers: Vec<LogReceiverView>,
}

/// One log receiver's state on the replica that answered.
#[derive(Debug, Serialize, ToSchema)]
pub struct LogReceiverView {
    /// Its `name`.
    pub name: String,
    /// Its `destination` as configured.
    pub destination: String,
    /// `json`, `syslog`, `csv` or `tsv`.
    pub format: String,
    /// The record types it takes.
    pub types: Vec<String>,
    /// Whether its connection (a file: the file) is open.
    pub connected: bool,
    /// Bytes of its spool on disk.
    pub spool_bytes: u64,
    /// Records in its spool not yet counted as taken.
    pub spool_records: u64,
    /// Records written to it since this replica started (a record sent
    /// again after a broken connection counts again).
    pub sent_total: u64,
    /// Records dropped since this replica started: its queue or its spool
    /// was full.
    pub dropped_total: u64,
    /// The last error (connection, TLS, spool), if any.
    pub last_error: Option<String>,
    /// When that was, Unix ms.
    pub last_error_unix_ms: Option<u64>,
    /// When a record was last written to it, Unix ms (null: never).
    pub last_sent_unix_ms: Option<u64>,
}

impl From<crate::logstream::ReceiverState> for LogReceiverView {
    fn from(s: crate::logstream::ReceiverState) -> Self {
        let (last_error, last_error_unix_ms) = s.last_error.unzip();
        LogReceiverView {
            name: s.name,
            destination: s.destination,
            format: s.format.as_str().to_owned(),
            types: s.types.iter().map(|k| k.as_str().to_owned()).collect(),
            connected: s.connected,
            spool_bytes: s.spool_bytes,
            spool_records: s.spool_records,
            sent_total: s.sent_total,
            dropped_total: s.dropped_queue + s.dropped_spool,
            last_error,
            last_error_unix_ms,
            last_sent_unix_ms: (s.last_sent_unix_ms > 0).then_some(s.last_sent_unix_ms),
        }
    }
}

/// `POST /api/v1/provisioning_keys/{group}/revoke`.
#[derive(Debug, Serialize, ToSchema)]
pub struct KeyRevokedBody {
    /// The group whose key was revoked.
    pub group: String,
    /// Always true.
    pub revoked: bool,
}

/// `POST /api/v1/connectors/{name}/{action}`: one shape per action.
#[derive(Debug, Serialize, ToSchema)]
pub struct ConnectorActionBody {
    /// The connector.
    pub name: String,
    /// `disable` / `enable`: whether it is now disabled.
    pub disabled: Option<bool>,
    /// `revoke`: how many certificates were revoked.
    pub certificates_revoked: Option<u64>,
    /// `allow-reenroll`: how long (seconds) the next enrollment of the
    /// name is allowed.
    pub reenroll_allowed_for_s: Option<u64>,
}

/// `DELETE /api/v1/connectors/{name}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ConnectorDeletedBody {
    /// The connector.
    pub name: String,
    /// Always true.
    pub deleted: bool,
    /// How many certificates were revoked.
    pub certificates_revoked: u64,
}

/// `POST /api/v1/connectors/{name}/drain`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DrainedBody {
    /// The connector.
    pub name: String,
    /// Always true.
    pub drained: bool,
    /// Whether it was drained before (the earlier drain stands: its
    /// `since` and `by`).
    pub already: bool,
    /// When the drain in force began, Unix ms.
    pub since: i64,
    /// Who drained it.
    pub by: crate::access::drain::DrainedBy,
    /// True when `force=true` drained it although applications are left
    /// without a healthy, undrained connector.
    pub forced: bool,
    /// How many applications the drain left without a healthy, undrained
    /// connector (0 unless forced).
    pub stranded: u64,
}

/// `POST /api/v1/connectors/{name}/undrain`.
#[derive(Debug, Serialize, ToSchema)]
pub struct UndrainedBody {
    /// The connector.
    pub name: String,
    /// Always false.
    pub drained: bool,
    /// Whether it was drained (false: nothing changed).
    pub was_drained: bool,
}

/// A drain refused because applications would be left without a healthy,
/// undrained connector (409 `last_healthy_connector`).
#[derive(Debug, Serialize, ToSchema)]
pub struct DrainRefusedBody {
    /// `last_healthy_connector`, with a message naming the applications.
    pub error: ErrorDetail,
    /// What the drain would do (as `GET /api/v1/whatif?without=NAME`
    /// answers it for an administrator).
    pub whatif: crate::access::drain::WhatIfView,
}

/// Every schema in `components.schemas` (with the ones they refer to).
fn schemas() -> Vec<(String, RefOr<Schema>)> {
    fn add<T: ToSchema>(out: &mut Vec<(String, RefOr<Schema>)>) {
        out.push((T::name().into_owned(), T::schema()));
        T::schemas(out);
    }
    let mut out = Vec::new();
    add::<crate::api::body::HealthBody>(&mut out);
    add::<crate::api::body::ConnectorsBody>(&mut out);
    add::<crate::api::body::ApplicationBody>(&mut out);
    add::<crate::api::body::LoadBody>(&mut out);
    add::<crate::api::body::AccessBody>(&mut out);
    add::<crate::api::body::SelectedBody>(&mut out);
    add::<ErrorBody>(&mut out);
    add::<ReplicasBody>(&mut out);
    add::<LogReceiversBody>(&mut out);
    add::<ProvisioningKeysBody>(&mut out);
    add::<KeyRevokedBody>(&mut out);
    add::<ConnectorActionBody>(&mut out);
    add::<ConnectorDeletedBody>(&mut out);
    add::<DrainedBody>(&mut out);
    add::<UndrainedBody>(&mut out);
    add::<DrainRefusedBody>(&mut out);
    add::<crate::access::drain::WhatIfView>(&mut out);
    add::<crate::trust::audit::AuditPage>(&mut out);
    add::<crate::trust::rotation::RootStatus>(&mut out);
    out
}

/// The standard error responses of a route with this auth and method.
fn standard_errors(
    auth: Auth,
    changes_state: bool,
    responses: &mut serde_json::Map<String, Value>,
) {
    if let Auth::Scope(_) = auth {
        responses.insert("401".into(), error_ref("Unauthorized"));
        responses.insert("403".into(), error_ref("Forbidden"));
        responses.insert("429".into(), error_ref("Throttled"));
    }
    if changes_state {
        responses.insert("403".into(), error_ref("Forbidden"));
        responses.insert("408".into(), error_ref("RequestTimeout"));
        responses.insert("413".into(), error_ref("PayloadTooLarge"));
        responses.insert("415".into(), error_ref("UnsupportedMediaType"));
    }
}

/// The reusable error responses.
fn error_responses() -> Value {
    let reasons = error_reasons();
    let response = |reasons_here: &[&str], description: &str| {
        let (first, _, doc) = reasons
            .iter()
            .find(|(r, _, _)| *r == reasons_here[0])
            .copied()
            .unwrap_or((reasons_here[0], 0, ""));
        json!({
            "description": format!("{description} (reason {})",
                reasons_here.iter().map(|r| format!("`{r}`")).collect::<Vec<_>>().join(", ")),
            "content": json_body("Error", json!({"error": {"reason": first, "message": doc}})),
        })
    };
    let mut unauthorized = response(&["unauthorized"], "missing, malformed or unknown token");
    unauthorized["headers"] =
        json!({"WWW-Authenticate": {"schema": {"type": "string", "const": "Bearer"}}});
    let mut throttled = response(
        &["throttled"],
        "a failed token over its source address's allowance of failures (10, then one per \
         6 s); a valid token is never answered this",
    );
    throttled["headers"] = json!({"Retry-After": {
        "description": "whole seconds until the source's allowance of failures refills",
        "schema": {"type": "integer", "minimum": 1}
    }});
    json!({
        "InvalidRequest": response(&["invalid_request"], "malformed request"),
        "Unauthorized": unauthorized,
        "Forbidden": response(&["forbidden", crate::api::guard::CROSS_ORIGIN, "csrf"],
            "the token or person lacks the scope, a state change came from another origin, or a session's state change lacks its CSRF token"),
        "RequestTimeout": response(&["request_timeout"], "the body did not arrive in time"),
        "PayloadTooLarge": response(&["invalid_request"], "body over 64 KiB"),
        "UnsupportedMediaType": response(&[crate::api::guard::UNSUPPORTED_MEDIA_TYPE],
            "a request body that is not `application/json`"),
        "Throttled": throttled,
        "Internal": response(&["internal"], "the CA's database failed"),
        "Unavailable": response(&["unavailable", "store_unavailable", "audit_unavailable"],
            "the CA is shutting down, or its store does not answer (nothing was changed), or the audit trail could not record the action"),
        "NotReady": response(&["unavailable", "warming_up"],
            "the health table is still warming up after a start, or the CA is shutting down"),
    })
}

/// The whole document, with `ops` (every route's operation) as its paths.
pub fn document(ops: Vec<Op>) -> Value {
    let mut paths = serde_json::Map::new();
    for op in ops {
        let mut spec = op.spec;
        let changes_state = op.method.changes_state();
        if let Some(responses) = spec.get_mut("responses").and_then(Value::as_object_mut) {
            standard_errors(op.auth, changes_state, responses);
        }
        if let Some(obj) = spec.as_object_mut() {
            match op.auth {
                Auth::None => {
                    obj.insert("security".into(), json!([]));
                }
                Auth::Scope(scope) => {
                    obj.insert(
                        "security".into(),
                        json!([{"bearer": [scope.as_str()]}, {"session": [scope.as_str()]}]),
                    );
                    obj.insert("x-reach-scope".into(), json!(scope.as_str()));
                }
            }
        }
        let item = paths.entry(op.path.to_owned()).or_insert_with(|| json!({}));
        item[op.method.as_str()] = spec;
    }
    let schemas: serde_json::Map<String, Value> = schemas()
        .into_iter()
        .filter_map(|(name, schema)| Some((name, serde_json::to_value(schema).ok()?)))
        .collect();
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "reach central authority HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The CA's JSON API, dashboard, metrics and liveness. Clients send `Authorization: Bearer TOKEN`; a token has scopes `access`, `read` and/or `admin` (admin implies both others), named per operation in `security` and `x-reach-scope`. With `[server] anonymous_read = true` the `read` routes need no token. Errors are `{\"error\":{\"reason\",\"message\"}}` with the reasons listed in the `Error` schema. Request bodies must be `application/json`; POST and DELETE from another origin (`Origin` not the CA's own, or `Sec-Fetch-Site: cross-site|same-site`) are refused with `cross_origin`. JSON fields are snake_case; fields may be added, never renamed.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": [
            {"name": "access", "description": "connector selection for user requests"},
            {"name": "health", "description": "the health table"},
            {"name": "connectors", "description": "connectors and their load"},
            {"name": "admin", "description": "provisioning keys and connector controls (scope `admin`)"},
            {"name": "dashboard", "description": "the Health dashboard"},
            {"name": "operations", "description": "metrics, liveness, this document"},
            {"name": "sign-in", "description": "people's sign-in with the organisation's OpenID provider"},
        ],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": error_responses(),
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "an API token from `[[api_tokens]]`; the scopes an operation needs are listed in its security requirement",
            }, "session": {
                "type": "apiKey", "in": "cookie", "name": "__Host-reach_session",
                "description": "a person's session (named `reach_session` when the CA serves plain HTTP, where browsers refuse `__Host-` cookies) after signing in (`GET /auth/login`), with the scopes their roles map to (`[[oidc]] roles`); POST and DELETE also need the session's CSRF token in `X-CSRF-Token` (`GET /auth/session`). HTTP only, never gRPC.",
            }},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed_path() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
    }

    /// `docs/openapi.json` is what this module generates (`REACH_BLESS=1`
    /// rewrites it).
    #[test]
    fn committed_document_is_fresh() {
        let generated = crate::api::http::openapi_text();
        let path = committed_path();
        if std::env::var_os("REACH_BLESS").is_some() {
            std::fs::write(&path, generated).expect("write docs/openapi.json");
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/openapi.json is stale: run `REACH_BLESS=1 cargo test -p central-authority --lib openapi` and commit it"
        );
    }

    /// The `.rs` files under `dir`, read.
    fn sources(dir: std::path::PathBuf) -> Vec<String> {
        let mut out = Vec::new();
        let mut dirs = vec![dir];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("src dir") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(std::fs::read_to_string(&path).expect("read"));
                }
            }
        }
        out
    }

    /// Every heading of the Troubleshooting page is reached from what a
    /// binary says: an HTTP error reason it answers (the heading names the
    /// status and the reason), or a hint of `build_info::hints` that the
    /// connector's or the CA's source prints.
    #[test]
    fn every_troubleshooting_heading_is_reached_from_a_hint_or_an_error_reason() {
        use build_info::hints;
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let page = std::fs::read_to_string(root.join("book/src/troubleshooting.md"))
            .expect("book/src/troubleshooting.md");
        let reasons = error_reasons();
        let code: Vec<String> = ["crates/central-authority/src", "crates/connector-agent/src"]
            .into_iter()
            .flat_map(|d| sources(root.join(d)))
            .collect();
        // How the source names each hint's heading.
        let uses = [
            (hints::CHAIN, "hints::chain("),
            (hints::NAME, "hints::name("),
            (hints::REENROLL, "hints::REENROLL"),
            (hints::RELEASE, "hints::RELEASE"),
            (hints::ICMP, "hints::ICMP"),
            (hints::CONFIG, "hints::CONFIG"),
        ];
        assert_eq!(uses.len(), hints::HEADINGS.len(), "a hint without its use");
        let headings: Vec<&str> = page.lines().filter_map(|l| l.strip_prefix("## ")).collect();
        assert!(headings.len() >= 8, "too few headings: {headings:?}");
        for heading in headings {
            let by_reason = reasons.iter().any(|(reason, status, _)| {
                let mut words = heading.split([' ', ',']);
                words.next() == Some(&status.to_string()) && words.any(|w| w == *reason)
            });
            let by_hint = uses
                .iter()
                .any(|(h, call)| *h == heading && code.iter().any(|text| text.contains(call)));
            assert!(
                by_reason || by_hint,
                "troubleshooting.md's \"{heading}\" is reached from no hint a binary prints (build_info::hints) and names no error reason with its status"
            );
        }
    }

    #[test]
    fn every_operation_names_its_auth_and_every_reason_is_listed() {
        let doc: Value = serde_json::from_str(crate::api::http::openapi_text()).expect("document");
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("item") {
                assert!(op["security"].is_array(), "{method} {path}: no security");
                assert!(op["operationId"].is_string(), "{method} {path}");
            }
        }
        let listed = doc["components"]["schemas"]["ErrorDetail"]["properties"]["reason"]["enum"]
            .as_array()
            .expect("reason enum")
            .clone();
        for reason in [
            "cross_origin",
            "unsupported_media_type",
            "no_segment",
            "throttled",
        ] {
            assert!(
                listed.contains(&json!(reason)),
                "{reason} not in {listed:?}"
            );
        }
    }
}
