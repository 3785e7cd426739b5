//! The HTTP API's OpenAPI 3.1 document, served at `GET /api/v1/openapi.json`
//! and kept in the repository as `docs/openapi.json`.
//!
//! Schemas come from the handlers' own types (`utoipa::ToSchema` derived on
//! the views and bodies; the policy enums through the `schema_with`
//! functions here, each guarded by an exhaustive `match` so a new variant
//! does not compile until it is documented). Operations are listed in
//! [`operations`], one entry per route. Tests keep the three in step: every
//! route in the router's source is documented, `docs/openapi.json` equals
//! what this module generates (`REACH_BLESS=1 cargo test -p
//! central-authority openapi` rewrites it), and the integration tests call
//! every documented operation against a real CA.
//!
//! To document a new route: add its body types (derive `utoipa::ToSchema`)
//! to [`schemas`], an [`Op`] to [`operations`], then bless.

use std::borrow::Cow;
use std::sync::LazyLock;

use policy::{HealthReporting, RefusalReason};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::openapi::schema::{ArrayBuilder, Object, ObjectBuilder, Schema, Type};
use utoipa::openapi::{RefOr, path::ParameterIn};
use utoipa::{IntoParams, PartialSchema, ToSchema};

use crate::access::explain::ExplanationView;
use crate::ground::schema::*;

/// The document, rendered once (pretty JSON, keys sorted, newline at the end).
pub fn document_text() -> &'static str {
    static TEXT: LazyLock<String> = LazyLock::new(|| {
        let mut text = serde_json::to_string_pretty(&document()).unwrap_or_default();
        text.push('\n');
        text
    });
    &TEXT
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

/// What `/readyz` (and `/healthz`) say.
const READYZ_DESCRIPTION: &str = "After a start, not ready (`warming_up`) until every connector the store knows (enrolled before the start, not disabled, with a valid certificate) has re-attached and sent its full state, or `[health] warmup_ms` (default 30 s) has passed; then ready for good as far as the warm-up goes. The message says how many connectors reported and names the first ones awaited. A store outage after the warm-up does not make a replica unready: access decisions need no store (see `store` in `/api/v1/replicas` and `reach_ca_store_up`). `unavailable` while the CA shuts down.";

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

/// Who may call a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Auth {
    /// No token (load balancers, the document itself).
    None,
    /// A token with this scope (`admin` grants every scope).
    Scope(crate::credentials::auth::Scope),
}

/// One documented operation.
#[derive(Debug)]
pub struct Op {
    /// `get`, `post`, `delete`, …
    pub method: &'static str,
    /// The router's path, `{param}` for parameters.
    pub path: &'static str,
    /// The operation's JSON (summary, parameters, bodies, responses).
    pub spec: Value,
    /// Who may call it.
    pub auth: Auth,
}

/// A dashboard asset served from the binary: `200` with `content_type`
/// (described by `body`), or `304` when `If-None-Match` names its `ETag`.
fn asset_op(path: &'static str, id: &str, summary: &str, content_type: &str, body: &str) -> Op {
    Op {
        method: "get",
        path,
        auth: Auth::None,
        spec: json!({
            "operationId": id,
            "summary": summary,
            "tags": ["dashboard"],
            "responses": {"200": {"description": body,
                "content": {content_type: {"schema": {"type": "string"}}}},
                "304": {"description": "Not modified: `If-None-Match` names the current `ETag`"}},
        }),
    }
}

fn json_body(schema: &str, example: Value) -> Value {
    json!({"application/json": {
        "schema": {"$ref": format!("#/components/schemas/{schema}")},
        "example": example,
    }})
}

fn error_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/responses/{name}")})
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

fn name_param(name: &str, description: &str) -> Value {
    json!({
        "name": name, "in": "path", "required": true, "description": description,
        "schema": {"type": "string", "minLength": 1},
    })
}

/// The schema of the query parameter `name` of the listing, history and
/// detail routes: exactly what the handlers accept (`None`: free text).
fn query_schema(name: &str) -> Option<Value> {
    const STATUS: &str = "(up|unhealthy|down|unknown)";
    const PORT: &str =
        "([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])";
    let max_page = json!(crate::api::listing::MAX_PAGE);
    Some(match name {
        "status" => json!({"type": "string", "pattern": format!("^{STATUS}?(,{STATUS}?)*$")}),
        "mode" => json!({"type": "string", "enum": ["continuous", "on_access", "none"]}),
        "sort" => json!({"type": "string",
            "enum": ["host", "segment", "status", "port", "protocol", "mode", "changed"]}),
        "order" => json!({"type": "string", "enum": ["asc", "desc"]}),
        "view" => json!({"type": "string", "enum": ["full", "summary"]}),
        "page" => json!({"type": "integer", "minimum": 1, "maximum": max_page}),
        "protocol" => json!({"type": "string", "enum": ["tcp", "udp"]}),
        "port" => json!({"type": "integer", "minimum": 0, "maximum": 65535}),
        "since" | "until" => json!({"anyOf": [
            {"type": "integer", "minimum": i64::MIN, "maximum": i64::MAX},
            {"type": "string", "format": "date-time"}]}),
        "address" => json!({"anyOf": [
            {"type": "string", "format": "ipv4"},
            {"type": "string", "format": "ipv6"},
            {"type": "string", "enum": ["*"]}]}),
        "app" => json!({"type": "string",
            "pattern": format!("^[^/]+/.+/(tcp|udp)/{PORT}$")}),
        _ => return None,
    })
}

/// `schema`, or the empty string: an optional filter sent empty
/// (`?status=`, as a form sends it) is not given.
fn or_empty(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "string", "maxLength": 0}]})
}

/// A query parameter typed by [`query_schema`].
fn query_param(name: &str, required: bool, description: &str) -> Value {
    let schema = match query_schema(name) {
        Some(s) if !required => or_empty(s),
        Some(s) => s,
        None => json!({"type": "string"}),
    };
    json!({"name": name, "in": "query", "required": required, "description": description,
        "schema": schema})
}

/// Every route the router serves, documented.
pub fn operations() -> Vec<Op> {
    let mut ops = api_operations();
    ops.extend(auth_ops());
    ops
}

/// The API's, the dashboard's and the operations' routes.
fn api_operations() -> Vec<Op> {
    use crate::credentials::auth::Scope::{Access, Admin, Read};
    let health_params: Vec<Value> =
        crate::api::listing::RawQuery::into_params(|| Some(ParameterIn::Query))
            .into_iter()
            .filter_map(|p| serde_json::to_value(p).ok())
            .map(|mut p| {
                let name = p["name"].as_str().unwrap_or_default().to_owned();
                let per_page = json!({"type": "integer", "minimum": 1,
                    "maximum": crate::api::listing::MAX_PER_PAGE});
                match (name.as_str(), query_schema(&name)) {
                    ("per_page", _) => p["schema"] = or_empty(per_page),
                    (_, Some(schema)) => p["schema"] = or_empty(schema),
                    _ => {}
                }
                p
            })
            .collect();
    let access_ok = json!({
        "connector": "c1", "group": "dc-east", "segment": "jira",
        "explanation": {
            "segment": "jira", "matched_entry": "jira.lanukcorp.com", "strategy": "nearest",
            "mode": "continuous",
            "candidates": [{"connector": "c1", "group": "dc-east", "connected": true,
                            "status": "up", "eligible": true, "rtt_ms": 5.0,
                            "distance_km": 477.9, "user_rtt_ms": 4.779, "score_ms": 9.779,
                            "reason": "reports the application up; rtt 5.000 ms + 4.779 ms from the user (477.9 km) = score 9.779 ms is within the tolerance of the nearest (9.779 ms best, up to 11.779 ms): drawn at random among these"}],
            "eligible_groups": [],
            "user_location": {"latitude": 48.85, "longitude": 2.35, "used": true,
                "reason": "used: each candidate's score is its rtt plus the round trip from the user to its group's location (1 ms per 100 km of great-circle distance)"},
            "chosen_group": null, "forwarded_to": [],
            "discovery_waited": false, "discovery_ms": 0,
        },
    });
    let refusal = |reason: &str, message: &str| {
        json!({"error": {"reason": reason, "message": message}, "explanation": {
            "segment": null, "matched_entry": null, "strategy": "healthy", "mode": null,
            "candidates": [], "eligible_groups": [], "user_location": null, "chosen_group": null,
            "forwarded_to": [], "discovery_waited": false, "discovery_ms": 0,
        }})
    };
    let refusal_response = |reasons: &[RefusalReason], description: &str| {
        let r = reasons[0];
        json!({
            "description": format!(
                "{description} (reason {})",
                reasons.iter().map(|r| format!("`{}`", r.as_str())).collect::<Vec<_>>().join(", ")
            ),
            "content": json_body("Error", refusal(r.as_str(), "no segment matches host \"nope.example\"")),
        })
    };
    let not_found = |what: &str| {
        json!({
            "description": format!("no such {what} (reason `not_found`)"),
            "content": json_body("Error", json!({"error": {"reason": "not_found",
                "message": format!("no {what} \"x\"")}})),
        })
    };
    vec![
        Op {
            method: "get",
            path: "/",
            auth: Auth::None,
            spec: json!({
                "operationId": "dashboard",
                "summary": "The Health dashboard (HTML)",
                "tags": ["dashboard"],
                "responses": {"200": {"description": "the dashboard page",
                    "content": {"text/html": {"schema": {"type": "string"}}}}},
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/health",
            auth: Auth::Scope(Read),
            spec: json!({
                "operationId": "listHealth",
                "summary": "Every visible application with its status per connector and address",
                "description": "Applications of segments with `client_hostname_validation = true` are not listed. Filtered by the parameters; sorted naturally (IP addresses numerically, then names); paged when `page` or `per_page` is given (else every row). `counts` are taken before the status filter.",
                "tags": ["health"],
                "parameters": health_params,
                "responses": {"200": {"description": "the health table",
                    "content": json_body("HealthBody", json!({"applications": [{
                        "segment": "jira", "host": "jira.lanukcorp.com", "protocol": "tcp",
                        "port": 80, "health_reporting": "continuous", "status": "up",
                        "connectors": [{"connector": "c1", "group": "dc-east", "status": "up",
                            "unknown_cause": null, "reported_at": 1_764_000_000_000u64,
                            "report_age_ms": 1200, "checked_age_ms": 1300,
                            "checked_at": 1_763_999_999_900u64,
                            "addresses": [{"address": "10.1.2.1", "status": "up",
                                "method": "tcp", "rtt_ms": 0.8, "error": null, "failure": null}],
                            "dns_error": null}],
                        "transitions": []}],
                        "total": 1, "page": 1, "per_page": 1, "pages": 1,
                        "counts": {"up": 1, "unhealthy": 0, "down": 0, "unknown": 0},
                        "version": 0, "epoch": "5f0c2a9e41d7b3c8"}))},
                    "400": error_ref("InvalidRequest")},
            }),
        },
        Op {
            method: "get",
            path: "/app",
            auth: Auth::None,
            spec: json!({
                "operationId": "dashboardApplication",
                "summary": "The dashboard's application detail page (HTML shell; data from the JSON API)",
                "tags": ["dashboard"],
                "responses": {"200": {"description": "the page",
                    "content": {"text/html": {"schema": {"type": "string"}}}}},
            }),
        },
        Op {
            method: "get",
            path: "/connectors",
            auth: Auth::None,
            spec: json!({
                "operationId": "dashboardConnectors",
                "summary": "The dashboard's connectors page (HTML shell; data from the JSON API)",
                "tags": ["dashboard"],
                "responses": {"200": {"description": "the page",
                    "content": {"text/html": {"schema": {"type": "string"}}}}},
            }),
        },
        asset_op(
            "/assets/dashboard.js",
            "dashboardScript",
            "The dashboard's script",
            "text/javascript",
            "JavaScript (with an `ETag`: a hash of the embedded asset)",
        ),
        asset_op(
            "/assets/dashboard-stream.js",
            "dashboardStreamWorker",
            "The dashboard's SharedWorker: one change stream shared by a browser's tabs over HTTP/1.1",
            "text/javascript",
            "JavaScript (with an `ETag`: a hash of the embedded asset)",
        ),
        asset_op(
            "/favicon.ico",
            "favicon",
            "The dashboard's icon (SVG)",
            "image/svg+xml",
            "SVG (with an `ETag`: a hash of the embedded icon)",
        ),
        asset_op(
            "/assets/dashboard.css",
            "dashboardStyle",
            "The dashboard's style sheet",
            "text/css",
            "CSS (with an `ETag`: a hash of the embedded asset)",
        ),
        Op {
            method: "get",
            path: "/api/v1/health/stream",
            auth: Auth::Scope(Read),
            spec: json!({
                "operationId": "streamHealth",
                "summary": "Status transitions as they happen (server-sent events)",
                "description": "Events: `hello` (data `{\"version\", \"epoch\"}`: every transition numbered after `version` is in this stream; `epoch` is new in every CA process, so data read under another epoch (a restart, another replica) must be re-read whatever its version), `transition` (data: one entry of `GET /api/v1/events` plus `seq`, also the event id), `lagged` (this client fell behind: re-read the listing); a comment every 15 s keeps proxies from closing the stream. Ends when the CA shuts down. Auth: the read scope, or instead a one-time `ticket` from `POST /api/v1/health/stream/ticket` (for browsers: `EventSource` cannot send `Authorization`).",
                "tags": ["health"],
                "parameters": [{"name": "ticket", "in": "query", "required": false,
                    "description": "a one-time stream ticket (64 hex digits; opens one stream within 30 s of its issue); replaces the bearer token",
                    "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the stream",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}}}},
            }),
        },
        Op {
            method: "post",
            path: "/api/v1/health/stream/ticket",
            auth: Auth::Scope(Read),
            spec: json!({
                "operationId": "streamTicket",
                "summary": "A one-time ticket that opens the change stream (for browsers)",
                "description": "Trades the read token for a ticket to put in `GET /api/v1/health/stream?ticket=`: 256 random bits, valid for one stream opened within 30 s, granting nothing else. At most 10,000 unused tickets exist at once (503 past that). The request body is ignored (send `{}` as `application/json`).",
                "tags": ["health"],
                "responses": {
                    "200": {"description": "the ticket",
                        "content": {"application/json": {"schema": {"type": "object",
                            "required": ["ticket", "expires_in_ms"],
                            "properties": {"ticket": {"type": "string"}, "expires_in_ms": {"type": "integer"}}},
                            "example": {"ticket": "9f2c…", "expires_in_ms": 30000}}}},
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/application",
            auth: Auth::Scope(Read),
            spec: json!({
                "operationId": "getApplication",
                "summary": "One row of the health listing (port 0 for a wildcard or subnet entry's row)",
                "tags": ["health"],
                "parameters": [
                    {"name": "segment", "in": "query", "required": true, "description": "segment name", "schema": {"type": "string", "minLength": 1}},
                    {"name": "host", "in": "query", "required": true, "description": "host (FQDN, IP, or the entry of a wildcard/subnet row)", "schema": {"type": "string", "minLength": 1}},
                    query_param("protocol", true, "tcp or udp"),
                    query_param("port", true, "0 for a wildcard or subnet entry's row"),
                ],
                "responses": {
                    "200": {"description": "the application, and each connector's smoothed RTT to it over the last hour",
                        "content": json_body("ApplicationBody", json!({"application": {
                            "segment": "jira", "host": "jira.example.com", "protocol": "tcp", "port": 443,
                            "health_reporting": "continuous", "status": "up", "connectors": [], "transitions": []},
                            "rtt_series": [{"connector": "c1", "start": 1_764_000_000_000u64, "interval_ms": 60000,
                                "rtt_ms": [4.2, null, 4.5]}],
                            "version": 12, "epoch": "5f0c2a9e41d7b3c8"}))},
                    "400": error_ref("InvalidRequest"),
                    "404": not_found("application"),
                },
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/overview",
            auth: Auth::Scope(Read),
            spec: json!({
                "operationId": "getOverview",
                "summary": "Counts by status of the applications, and of the connectors",
                "tags": ["health"],
                "responses": {"200": {"description": "the counts",
                    "content": {"application/json": {"schema": {"type": "object"},
                        "example": {"applications": {"up": 3, "unhealthy": 0, "down": 1, "unknown": 2},
                            "applications_total": 6,
                            "connectors": {"total": 2, "connected": 2, "disconnected": 0, "over_budget": 0, "disabled": 0, "drained": 0},
                            "check_budget": 6000, "version": 12, "epoch": "5f0c2a9e41d7b3c8"}}}},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable")},
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/events",
            auth: Auth::Scope(Read),
            spec: json!({
                "operationId": "listEvents",
                "summary": "The status history: every transition, newest first, paged",
                "tags": ["health"],
                "parameters": [
                    query_param("app", false, "segment/host/protocol/port in one (overrides those four)"),
                    query_param("segment", false, "segment name"),
                    query_param("host", false, "host (FQDN, IP, or the entry of a wildcard/subnet row)"),
                    query_param("protocol", false, "tcp or udp"),
                    query_param("port", false, "0-65535"),
                    query_param("connector", false, "connector name"),
                    query_param("address", false, "the address history instead: changes of this IP address of the application (appeared, its result changed where the status history does not show it, left), or `*` for every address"),
                    query_param("since", false, "Unix ms or RFC 3339"),
                    query_param("until", false, "Unix ms or RFC 3339"),
                    query_param("page", false, "page from 1"),
                    {"name": "per_page", "in": "query", "required": false, "description": "1-1000",
                        "schema": or_empty(json!({"type": "integer", "minimum": 1, "maximum": crate::api::listing::MAX_EVENTS_PER_PAGE}))},
                ],
                "responses": {
                    "200": {"description": "one page of transitions",
                        "content": {"application/json": {"schema": {"type": "object"}}}},
                    "400": error_ref("InvalidRequest"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/connectors",
            auth: Auth::Scope(Read),
            spec: json!({
                "operationId": "listConnectors",
                "summary": "Every known connector: session, check load, budget, enrollment, drain",
                "description": "`session_id`, `version` and `certificate_serial` only for an `admin` token.",
                "tags": ["connectors"],
                "responses": {"200": {"description": "the connectors, sorted by name",
                    "content": json_body("ConnectorsBody", json!({"check_budget": 6000, "connectors": [{
                        "name": "c1", "group": "dc-east", "connected": true,
                        "checks_per_cycle": 6, "cycle_seconds": 0.3, "over_budget": false,
                        "check_budget": 6000, "load": null, "connected_since": 1_764_000_000_000u64,
                        "last_seen": 1_764_000_005_000u64, "enrolled": true, "disabled": false,
                        "drained": {"since": 1_764_000_003_000u64, "by": {"kind": "token", "name": "ops"}, "until": null},
                        "certificate_not_after": 1_795_536_000_000u64, "certificates": []}]}))}},
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/load",
            auth: Auth::Scope(Read),
            spec: json!({
                "operationId": "getLoad",
                "summary": "Each connector's check-load estimate over the last day against the budget",
                "description": "One value per five minutes (the highest estimate of checks per cycle in it), at most 288 per connector, kept in memory by this CA process since it started.",
                "tags": ["connectors"],
                "responses": {"200": {"description": "the series, sorted by connector name",
                    "content": json_body("LoadBody", json!({"check_budget": 6000, "connectors": [{
                        "connector": "c1", "start": 1_764_000_000_000u64, "interval_ms": 300_000,
                        "checks_per_cycle": [6, 6, null, 8]}]}))}},
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/replicas",
            auth: Auth::Scope(Read),
            spec: json!({
                "operationId": "listReplicas",
                "summary": "The CA replicas sharing this one's store: heartbeat, version, policy hash; and whether the store answers",
                "description": "Answers while the store does not: `store.up` is then false and `replicas` empty (this replica keeps deciding access; enrollment, renewal, new connector sessions and admin changes are refused with `store_unavailable` until the store is back). `reach_ca_store_up` is the same signal for Prometheus.",
                "tags": ["operations"],
                "responses": {
                    "200": {"description": "the store's state and every replica it knows",
                        "content": json_body("ReplicasBody", json!({"this": "ca-1",
                            "store": {"backend": "postgres", "up": true, "since": 1_764_000_000_000u64,
                                "checked_at": 1_764_000_005_000u64, "message": "the store answers"},
                            "replicas": [{
                            "id": "ca-1", "addresses": ["10.0.0.1:7443"], "version": "0.1.0",
                            "started_at": 1_764_000_000_000u64, "last_heartbeat": 1_764_000_005_000u64,
                            "policy_hash": "3f2a…", "live": true, "this": true}]}))},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/log_receivers",
            auth: Auth::Scope(Admin),
            spec: json!({
                "operationId": "listLogReceivers",
                "summary": "The log receivers (`[[log_receivers]]`) this replica streams to: connection, spool, records sent and dropped, last error",
                "description": "Each replica streams the records it wrote itself (its access decisions, the transitions it appended to the history, its sessions' connector status, its audit entries) to every receiver, so each replica answers for its own streams. Counters start at 0 when the replica starts; a record sent again after a broken connection counts again.",
                "tags": ["operations"],
                "responses": {
                    "200": {"description": "every receiver in force, in configuration order",
                        "content": json_body("LogReceiversBody", json!({"replica": "ca-1", "log_receivers": [{
                            "name": "siem", "destination": "tls://siem.example:6514", "format": "syslog",
                            "types": ["connector_status", "health", "access", "audit"],
                            "connected": true, "spool_bytes": 4096, "spool_records": 12,
                            "sent_total": 1520, "dropped_total": 0, "last_error": null,
                            "last_error_unix_ms": null, "last_sent_unix_ms": 1_764_000_005_000u64}]}))},
                },
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/root",
            auth: Auth::Scope(Read),
            spec: json!({
                "operationId": "rootRotation",
                "summary": "Where a rotation of the issuing root stands: the trusted roots, the phase, the connectors still on the old root",
                "description": "A rotation is three reloads of every replica's `[tls]`: introduce (`next_root_file`), switch (`issuer_*_file` name the new root, `previous_root_file` the old one) and retire (`previous_root_file` removed). `on_old_root` lists the enrolled connectors whose current certificate is not from the new root (from the store: the same on every replica); retire once it is empty. `without_trust_bundle` lists the connectors connected to this replica that do not keep the trust bundle the CA sends: the root file they trust must hold the new root before the switch.",
                "tags": ["operations"],
                "responses": {
                    "200": {"description": "the roots, the phase and the connectors still on the old root",
                        "content": json_body("RootStatus", json!({"phase": "switch",
                            "roots": [
                                {"role": "issuing", "fingerprint": "9b1c…", "subject": "O=reach, CN=reach central authority root", "not_after": 2_395_000_000_000u64},
                                {"role": "previous", "fingerprint": "41e7…", "subject": "O=reach, CN=reach central authority root", "not_after": 2_390_000_000_000u64}],
                            "on_old_root": [{"name": "c7", "group": "dc-east", "disabled": false,
                                "root": "41e7…", "certificate_not_after": 1_765_000_000_000u64}],
                            "without_trust_bundle": []}))},
                    "404": {"description": "the CA runs without TLS (reason `not_found`)",
                        "content": json_body("Error", json!({"error": {"reason": "not_found",
                            "message": "this CA runs without TLS ([tls] enabled = false): it has no roots"}}))},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        Op {
            method: "post",
            path: "/api/v1/access",
            auth: Auth::Scope(Access),
            spec: json!({
                "operationId": "resolveAccess",
                "summary": "Select a connector for a user's request",
                "description": "Matches the request to a segment and picks a connector that reports the application reachable (on-access segments: forwards the access and waits for discovery). A refusal is an answer with its reason and the explanation.",
                "tags": ["access"],
                "requestBody": {"required": true, "content": json_body("AccessBody",
                    json!({"host": "jira.lanukcorp.com", "protocol": "tcp", "port": 80,
                        "user_location": {"latitude": 48.85, "longitude": 2.35}}))},
                "responses": {
                    "200": {"description": "the selected connector",
                        "content": json_body("SelectedBody", access_ok)},
                    "400": error_ref("InvalidRequest"),
                    "403": refusal_response(&[RefusalReason::PortNotInSegment],
                        "the deciding segment does not include the port; also `forbidden` and `cross_origin`"),
                    "404": refusal_response(&[RefusalReason::NoSegment], "no segment matches"),
                    "503": refusal_response(&[RefusalReason::NoConnector, RefusalReason::AllDown,
                        RefusalReason::NoHealthReport, RefusalReason::DiscoveryTimeout,
                        RefusalReason::AllDrained],
                        "no connector can carry it; also `unavailable` while the CA shuts down"),
                },
            }),
        },
        Op {
            method: "get",
            path: "/metrics",
            auth: Auth::Scope(Read),
            spec: json!({
                "operationId": "metrics",
                "summary": "Prometheus metrics (OpenMetrics text)",
                "description": "OpenMetrics; the classic Prometheus text format (0.0.4) when `Accept` names `text/plain` and not OpenMetrics.",
                "tags": ["operations"],
                "responses": {"200": {"description": "the metrics",
                    "content": {"application/openmetrics-text": {"schema": {"type": "string"},
                        "example": "# TYPE reach_ca_connectors_connected gauge\nreach_ca_connectors_connected 1\n# EOF\n"},
                        "text/plain": {"schema": {"type": "string"},
                        "example": "# HELP reach_ca_reports_received_total Application health results accepted from connectors.\n# TYPE reach_ca_reports_received_total counter\nreach_ca_reports_received_total 1\n"}}}},
            }),
        },
        Op {
            method: "get",
            path: "/livez",
            auth: Auth::None,
            spec: json!({
                "operationId": "livez",
                "summary": "Liveness: `ok` while the process serves HTTP",
                "description": "Neither the store nor the health table is consulted: restart a CA only when this stops answering.",
                "tags": ["operations"],
                "responses": {"200": {"description": "alive",
                    "content": {"text/plain": {"schema": {"type": "string", "const": "ok\n"},
                        "example": "ok\n"}}}},
            }),
        },
        Op {
            method: "get",
            path: "/readyz",
            auth: Auth::None,
            spec: json!({
                "operationId": "readyz",
                "summary": "Readiness: `ok` while this replica decides access (policy loaded, health table warm)",
                "description": READYZ_DESCRIPTION,
                "tags": ["operations"],
                "responses": {"200": {"description": "ready",
                    "content": {"text/plain": {"schema": {"type": "string", "const": "ok\n"},
                        "example": "ok\n"}}},
                    "503": error_ref("NotReady")},
            }),
        },
        Op {
            method: "get",
            path: "/healthz",
            auth: Auth::None,
            spec: json!({
                "operationId": "healthz",
                "summary": "`/readyz` under its older name (kept for existing probes)",
                "description": READYZ_DESCRIPTION,
                "tags": ["operations"],
                "responses": {"200": {"description": "ready",
                    "content": {"text/plain": {"schema": {"type": "string", "const": "ok\n"},
                        "example": "ok\n"}}},
                    "503": error_ref("NotReady")},
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/openapi.json",
            auth: Auth::None,
            spec: json!({
                "operationId": "openapi",
                "summary": "This document",
                "tags": ["operations"],
                "responses": {"200": {"description": "the OpenAPI 3.1 document",
                    "content": {"application/json": {"schema": {"type": "object"}}}}},
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/provisioning_keys",
            auth: Auth::Scope(Admin),
            spec: json!({
                "operationId": "listProvisioningKeys",
                "summary": "Each group's provisioning key: uses, expiry, revocation (never the key)",
                "tags": ["admin"],
                "responses": {
                    "200": {"description": "one entry per connector group",
                        "content": json_body("ProvisioningKeysBody", json!({"provisioning_keys": [{
                            "group": "dc-east", "uses": 1, "max_uses": 10, "expires_at": null,
                            "revoked_at": null, "last_used_at": 1_764_000_000_000u64, "usable": true}]}))},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        Op {
            method: "post",
            path: "/api/v1/provisioning_keys/{group}/revoke",
            auth: Auth::Scope(Admin),
            spec: json!({
                "operationId": "revokeProvisioningKey",
                "summary": "Revoke a group's provisioning key (no more enrollments with it)",
                "tags": ["admin"],
                "parameters": [name_param("group", "connector group")],
                "responses": {
                    "200": {"description": "revoked",
                        "content": json_body("KeyRevokedBody", json!({"group": "dc-east", "revoked": true}))},
                    "404": not_found("connector group"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        Op {
            method: "post",
            path: "/api/v1/connectors/{name}/{action}",
            auth: Auth::Scope(Admin),
            spec: json!({
                "operationId": "connectorAction",
                "summary": "Disable, enable, revoke a connector, or allow it to re-enroll",
                "description": "`disable` ends its session; it can neither reconnect nor re-enroll. `enable` undoes that. `revoke` revokes its certificates and ends its session. `allow-reenroll`: the next enrollment of that name with its group's key is allowed although it holds a valid certificate (once, within 15 minutes).",
                "tags": ["admin"],
                "parameters": [
                    name_param("name", "enrolled connector"),
                    {"name": "action", "in": "path", "required": true,
                     "schema": {"type": "string", "enum": ["disable", "enable", "revoke", "allow-reenroll"]}},
                ],
                "responses": {
                    "200": {"description": "done; the fields depend on the action",
                        "content": json_body("ConnectorActionBody", json!({"name": "c1", "disabled": true}))},
                    "404": not_found("enrolled connector (or unknown action)"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        Op {
            method: "delete",
            path: "/api/v1/connectors/{name}",
            auth: Auth::Scope(Admin),
            spec: json!({
                "operationId": "deleteConnector",
                "summary": "Revoke a connector's certificates, end its session and forget it",
                "tags": ["admin"],
                "parameters": [name_param("name", "enrolled connector")],
                "responses": {
                    "200": {"description": "deleted; the name is free for any group",
                        "content": json_body("ConnectorDeletedBody",
                            json!({"name": "c1", "deleted": true, "certificates_revoked": 1}))},
                    "404": not_found("enrolled connector"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        Op {
            method: "post",
            path: "/api/v1/connectors/{name}/drain",
            auth: Auth::Scope(Admin),
            spec: json!({
                "operationId": "drainConnector",
                "summary": "Drain a connector before maintenance: selected for no new access, on every replica",
                "description": "The connector keeps its session and reports; access decisions skip it (reason `drained` in their explanations) and on-access accesses are no longer forwarded to it. The drain is kept in the store: in force on this replica at once, on the others within a second (on PostgreSQL at once). Refused with 409 `last_healthy_connector` when an application would be left without a healthy (Up or Unhealthy), undrained connector by this replica's health table, naming them, unless `force=true`. Draining a drained connector changes nothing (`already`). Recorded in the audit trail (`connector.drain`), also when refused.",
                "tags": ["admin"],
                "parameters": [
                    name_param("name", "connector: enrolled, or connected since this CA started"),
                    {"name": "force", "in": "query", "required": false,
                     "description": "`true`: drain although applications are left without a healthy, undrained connector",
                     "schema": {"type": "string", "enum": ["true", "false", ""]}},
                ],
                "responses": {
                    "200": {"description": "drained",
                        "content": json_body("DrainedBody", json!({"name": "c1", "drained": true,
                            "already": false, "since": 1_764_000_000_000u64,
                            "by": {"kind": "token", "name": "ops"}, "forced": false, "stranded": 0}))},
                    "400": error_ref("InvalidRequest"),
                    "404": not_found("connector"),
                    "409": {"description": "not drained: applications would be left without a healthy, undrained connector (reason `last_healthy_connector`)",
                        "content": json_body("DrainRefusedBody", json!({
                            "error": {"reason": "last_healthy_connector",
                                "message": "draining \"c1\" would leave 1 application(s) without a healthy, undrained connector: jira: jira.lanukcorp.com:80/tcp; force it (CLI --force, API ?force=true) to drain anyway"},
                            "whatif": {"without": ["c1"], "stranded": 1, "hidden_stranded": 0,
                                "applications": [{"segment": "jira", "host": "jira.lanukcorp.com",
                                    "protocol": "tcp", "port": 80, "health_reporting": "continuous",
                                    "losing": ["c1"], "left": [], "stranded": true}]}}))},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        Op {
            method: "post",
            path: "/api/v1/connectors/{name}/undrain",
            auth: Auth::Scope(Admin),
            spec: json!({
                "operationId": "undrainConnector",
                "summary": "End an administrator's drain of a connector, on every replica",
                "description": "A connector's own drain while it shuts down ends with its session, not here. Recorded in the audit trail (`connector.undrain`).",
                "tags": ["admin"],
                "parameters": [name_param("name", "connector: enrolled, drained, or connected since this CA started")],
                "responses": {
                    "200": {"description": "not drained (any more)",
                        "content": json_body("UndrainedBody",
                            json!({"name": "c1", "drained": false, "was_drained": true}))},
                    "404": not_found("connector"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/whatif",
            auth: Auth::Scope(Read),
            spec: json!({
                "operationId": "whatIf",
                "summary": "Which applications would lose their last healthy connector without these connectors",
                "description": "Changes nothing: the check to run before a maintenance window. `without` names connectors and connector groups (a group: every connector of it this replica knows), comma-separated; a name that is both says `connector:NAME` or `group:NAME`. An application counts when one of the named connectors carries it now: connected, undrained, Up or Unhealthy by this replica's health table (on-access applications while their window is live; a `none` segment's applications as one row, carried by every connected connector of its groups). Applications of segments with `client_hostname_validation = true` are listed only for callers with the `admin` scope, counted for everyone.",
                "tags": ["connectors"],
                "parameters": [
                    {"name": "without", "in": "query", "required": true,
                     "description": "connector or group names, comma-separated (at most 100)",
                     "schema": {"type": "string", "pattern": "^((connector:|group:)?[A-Za-z0-9_][A-Za-z0-9._-]{0,127})(,(connector:|group:)?[A-Za-z0-9_][A-Za-z0-9._-]{0,127})*$"}},
                ],
                "responses": {
                    "200": {"description": "what taking them away would do",
                        "content": json_body("WhatIfView", json!({"without": ["c1", "c2"],
                            "stranded": 1, "hidden_stranded": 0, "applications": [
                                {"segment": "jira", "host": "jira.lanukcorp.com", "protocol": "tcp",
                                 "port": 80, "health_reporting": "continuous",
                                 "losing": ["c1", "c2"], "left": [], "stranded": true},
                                {"segment": "legacy", "host": null, "protocol": null, "port": null,
                                 "health_reporting": "none", "losing": ["c1"], "left": ["c3"],
                                 "stranded": false}]}))},
                    "400": error_ref("InvalidRequest"),
                    "404": not_found("connector or connector group"),
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        Op {
            method: "get",
            path: "/api/v1/audit",
            auth: Auth::Scope(Admin),
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
    ]
}

/// People's sign-in (`api::auth`).
fn auth_ops() -> Vec<Op> {
    let page = |what: &str| {
        json!({"description": what,
        "content": {"text/html": {"schema": {"type": "string"}}}})
    };
    let redirect = |to: &str| {
        json!({"description": format!("redirect to {to}"),
        "headers": {"Location": {"schema": {"type": "string"}}}})
    };
    let mut ops = vec![
        Op {
            method: "get",
            path: "/auth/login",
            auth: Auth::None,
            spec: json!({
                "operationId": "signIn",
                "summary": "Sign in: to the OpenID provider (authorization code flow with PKCE)",
                "tags": ["sign-in"],
                "parameters": [
                    {"name": "provider", "in": "query", "required": false, "description": "an `[[oidc]]` name (default: the first)", "schema": {"type": "string"}},
                    {"name": "next", "in": "query", "required": false, "description": "a path of this CA to return to, with its query and fragment (default `/`); one with a control character, whitespace or backslash anywhere, or whose path resolves or percent-decodes to another host, returns to `/`", "schema": {"type": "string"}},
                ],
                "responses": {"303": redirect("the provider's authorization endpoint"),
                    "404": page("no such provider"), "429": page("too many sign-ins started from this source or in all (`Retry-After`)"), "502": page("the provider could not be reached"),
                    "503": page("the store does not answer")},
            }),
        },
        Op {
            method: "get",
            path: "/auth/callback",
            auth: Auth::None,
            spec: json!({
                "operationId": "signInCallback",
                "summary": "The provider's redirect back: verifies the ID token, maps roles, opens the session",
                "description": "Sets the session cookie (`__Host-reach_session`: `Secure; HttpOnly; SameSite=Lax; Path=/`, `[[oidc]] session_lifetime_s`). For a sign-in the CLI started, sets no cookie and redirects to its loopback listener with a one-time `code` (and its `state`) that it exchanges with `POST /auth/cli`. A person whose roles claim maps to no scope gets a 403 page.",
                "tags": ["sign-in"],
                "parameters": [
                    {"name": "code", "in": "query", "required": false, "schema": {"type": "string"}},
                    {"name": "state", "in": "query", "required": false, "schema": {"type": "string"}},
                    {"name": "error", "in": "query", "required": false, "schema": {"type": "string"}},
                    {"name": "error_description", "in": "query", "required": false, "schema": {"type": "string"}},
                ],
                "responses": {"303": redirect("the `next` path, signed in"),
                    "403": page("sign-in refused (no mapped role, a token that does not verify, a sign-in not started in this browser)"),
                    "503": page("the store does not answer")},
            }),
        },
    ];
    ops.extend(session_ops());
    ops.extend(people_session_ops());
    ops
}

/// Administrators' view of people's sessions, and the provider's
/// back-channel logout (`api::sessions`).
fn people_session_ops() -> Vec<Op> {
    use crate::credentials::auth::Scope::Admin;
    let session = json!({"type": "object", "properties": {
        "id": {"type": "string", "description": "SHA-256 (hex) of the session id; not a credential"},
        "person": {"type": "string"}, "provider": {"type": "string"},
        "subject": {"type": "string", "description": "the person's `sub` at the provider (empty for a session a 0.1.0 CA opened)"},
        "scopes": {"type": "array", "items": {"type": "string"}, "description": "what the person's roles map to now"},
        "created_at": {"type": "integer", "description": "Unix ms"},
        "expires_at": {"type": "integer", "description": "Unix ms"},
        "checked_at": {"type": "integer", "description": "Unix ms: when the provider last confirmed it"}}});
    let example = json!({"id": "5f1c…", "person": "alice", "provider": "corp",
        "subject": "248289761001", "scopes": ["admin"], "created_at": 1_764_000_000_000u64,
        "expires_at": 1_764_028_800_000u64, "checked_at": 1_764_000_300_000u64});
    vec![
        Op {
            method: "get",
            path: "/api/v1/sessions",
            auth: Auth::Scope(Admin),
            spec: json!({
                "operationId": "listSessions",
                "summary": "People's live sessions, newest first",
                "description": "Every replica's: sessions are kept in the store. Each is confirmed with its provider every `[[oidc]] revalidate_s` at its next request; `scopes` are its roles claim's values mapped by the roles as configured now.",
                "tags": ["admin"],
                "responses": {
                    "200": {"description": "the live sessions",
                        "content": {"application/json": {"schema": {"type": "object", "properties": {
                            "sessions": {"type": "array", "items": session}}},
                            "example": {"sessions": [example]}}}},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        Op {
            method: "delete",
            path: "/api/v1/sessions/{id}",
            auth: Auth::Scope(Admin),
            spec: json!({
                "operationId": "endSession",
                "summary": "End a person's session on every replica; its next request is refused (401)",
                "description": "Recorded in the audit trail (`session.end`), also when refused or not found.",
                "tags": ["admin"],
                "parameters": [{"name": "id", "in": "path", "required": true,
                    "description": "the session's `id` from `GET /api/v1/sessions`",
                    "schema": {"type": "string"}}],
                "responses": {
                    "200": {"description": "ended",
                        "content": {"application/json": {"schema": {"type": "object", "properties": {
                            "id": {"type": "string"}, "person": {"type": "string"}, "ended": {"type": "boolean"}}},
                            "example": {"id": "5f1c…", "person": "bob", "ended": true}}}},
                    "404": {"description": "no such live session (reason `not_found`)",
                        "content": json_body("Error", json!({"error": {"reason": "not_found",
                            "message": "no live session \"x\""}}))},
                    "500": error_ref("Internal"),
                    "503": error_ref("Unavailable"),
                },
            }),
        },
        backchannel_op(),
    ]
}

/// `POST /auth/backchannel-logout` (`api::sessions`).
fn backchannel_op() -> Op {
    Op {
        method: "post",
        path: "/auth/backchannel-logout",
        auth: Auth::None,
        spec: json!({
            "operationId": "backchannelLogout",
            "summary": "OpenID Connect Back-Channel Logout 1.0: the provider ends a person's sessions",
            "description": "Register `https://CA/auth/backchannel-logout` as the client's `backchannel_logout_uri` at the provider. The logout token must be signed with a key of the provider's JWKS, name this CA's client id in `aud`, be recent (`iat`), carry the back-channel logout event and `sid` or `sub`, and no `nonce`; its `jti` is accepted once. Ends the sessions of the provider session `sid`, else every session of `sub`.",
            "tags": ["sign-in"],
            "requestBody": {"required": true, "content": {"application/x-www-form-urlencoded": {
                "schema": {"type": "object", "required": ["logout_token"],
                    "properties": {"logout_token": {"type": "string", "description": "a signed JWT"}}}}}},
            "responses": {
                "200": {"description": "valid; its sessions ended",
                    "content": {"application/json": {"schema": {"type": "object", "properties": {
                        "sessions_ended": {"type": "integer"}}}, "example": {"sessions_ended": 1}}}},
                "400": {"description": "refused (`invalid_request`), with why",
                    "content": {"application/json": {"schema": {"type": "object", "properties": {
                        "error": {"type": "string"}, "error_description": {"type": "string"}}},
                        "example": {"error": "invalid_request", "error_description": "this logout token was used already (jti)"}}}},
                "503": error_ref("Unavailable"),
            },
        }),
    }
}

/// Signing out and who is signed in (`api::auth`).
fn session_ops() -> Vec<Op> {
    vec![
        Op {
            method: "post",
            path: "/auth/logout",
            auth: Auth::None,
            spec: json!({
                "operationId": "signOut",
                "summary": "Sign out: the session is revoked on every replica and its cookie removed",
                "description": "Needs the session's `X-CSRF-Token`.",
                "tags": ["sign-in"],
                "responses": {"200": {"description": "signed out (`signed_out`: whether a session was open)",
                    "content": {"application/json": {"schema": {"type": "object",
                        "properties": {"signed_out": {"type": "boolean"}}}, "example": {"signed_out": true}}}},
                    "401": error_ref("Unauthorized")},
            }),
        },
        Op {
            method: "post",
            path: "/auth/cli",
            auth: Auth::None,
            spec: json!({
                "operationId": "signInCliExchange",
                "summary": "The CLI exchanges the one-time code its loopback listener received for its credential",
                "description": "The code is good once, for a minute, and only with the `state` of the CLI that started the sign-in (`cli_state`); the credential (a session of at most an hour) is never in a URL.",
                "tags": ["sign-in"],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {
                    "type": "object", "additionalProperties": false, "required": ["code", "state"],
                    "properties": {"code": {"type": "string"}, "state": {"type": "string"}}}}}},
                "responses": {"200": {"description": "the credential",
                    "content": {"application/json": {"schema": {"type": "object",
                        "properties": {"credential": {"type": "string"}, "csrf_token": {"type": "string"},
                            "expires_at": {"type": "integer", "description": "Unix ms"}}},
                        "example": {"credential": "9f1c…", "csrf_token": "2b63…", "expires_at": 1_764_003_600_000u64}}}},
                    "400": error_ref("InvalidRequest"),
                    "403": {"description": "the code is unknown, used, over a minute old or not this CLI's (reason `invalid_code`)",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
                    "503": error_ref("Unavailable")},
            }),
        },
        Op {
            method: "get",
            path: "/auth/session",
            auth: Auth::None,
            spec: json!({
                "operationId": "whoAmI",
                "summary": "Who is signed in with this browser's session cookie, and the session's CSRF token",
                "tags": ["sign-in"],
                "responses": {"200": {"description": "`person` null when nobody is signed in",
                    "content": {"application/json": {"schema": {"type": "object", "properties": {
                        "person": {"type": ["string", "null"]},
                        "scopes": {"type": "array", "items": {"type": "string"}},
                        "csrf_token": {"type": ["string", "null"]},
                        "expires_at": {"type": ["integer", "null"], "description": "Unix ms"},
                        "providers": {"type": "array", "items": {"type": "string"}}}},
                        "example": {"person": "alice", "scopes": ["admin"], "csrf_token": "2b63…",
                            "expires_at": 1_764_028_800_000u64, "providers": ["corp"]}}}}},
            }),
        },
    ]
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

/// The whole document.
pub fn document() -> Value {
    let mut paths = serde_json::Map::new();
    for op in operations() {
        let mut spec = op.spec;
        let changes_state = matches!(op.method, "post" | "put" | "patch" | "delete");
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
        item[op.method] = spec;
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
        let generated = document_text();
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

    /// The route calls in the crate's source (`.route(` with a path
    /// literal and a method router): (method, path) pairs.
    fn routes_in_source() -> Vec<(String, String)> {
        let mut files = Vec::new();
        let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("src dir") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(std::fs::read_to_string(&path).expect("read"));
                }
            }
        }
        let mut out = Vec::new();
        for text in files {
            for chunk in text.split(".route(\"").skip(1) {
                let Some((path, rest)) = chunk.split_once('"') else {
                    continue;
                };
                // The method router: up to the call's closing parenthesis.
                let mut depth = 1;
                let mut end = rest.len();
                for (i, c) in rest.char_indices() {
                    match c {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                end = i;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                let router = &rest[..end];
                for method in ["get", "post", "put", "patch", "delete"] {
                    let called = router.match_indices(&format!("{method}(")).any(|(i, _)| {
                        i == 0
                            || !router[..i]
                                .chars()
                                .last()
                                .is_some_and(|c| c.is_alphanumeric() || c == '_')
                    });
                    if called {
                        out.push((method.to_owned(), path.to_owned()));
                    }
                }
            }
        }
        out
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
    fn every_route_is_documented_and_nothing_else() {
        let routes = routes_in_source();
        assert!(
            routes.len() >= 10,
            "the scan found too few routes: {routes:?}"
        );
        let doc = document();
        for (method, path) in &routes {
            assert!(
                doc["paths"][path][method].is_object(),
                "{} {path} is served but not documented in openapi.rs",
                method.to_uppercase()
            );
        }
        let paths = doc["paths"].as_object().expect("paths");
        for (path, item) in paths {
            for method in item.as_object().expect("item").keys() {
                assert!(
                    routes.iter().any(|(m, p)| m == method && p == path),
                    "{} {path} is documented but not served",
                    method.to_uppercase()
                );
            }
        }
    }

    #[test]
    fn every_operation_names_its_auth_and_every_reason_is_listed() {
        let doc = document();
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
