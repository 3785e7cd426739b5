//! Access decisions: `POST /api/v1/access`, its body parsed and its answer
//! written by hand.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use policy::{Location, RefusalReason};
use serde_json::{Value, json};

use crate::access;
use crate::access::decide::{AccessRequest, Refusal, access_port, port_outside};
use crate::api::body::{AccessBody, SelectedBody, error_body, refusal_status};
use crate::api::route::{Auth, Method, Op, Route, error_ref, json_body, route};
use crate::credentials::auth::Scope;
use crate::error::ApiError;
use crate::state::authority::Authority;

use super::Shared;
use super::extract::{RequireScope, scope};
use super::respond::json_response;

/// The example of an access granted.
fn access_example() -> Value {
    json!({
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
    })
}

/// A refusal's answer (`Error` with the explanation) for `reasons`, the
/// first one in its example.
fn refusal_response(reasons: &[RefusalReason], description: &str) -> Value {
    let r = reasons[0];
    let example = json!({"error": {"reason": r.as_str(),
        "message": "no segment matches host \"nope.example\""}, "explanation": {
        "segment": null, "matched_entry": null, "strategy": "healthy", "mode": null,
        "candidates": [], "eligible_groups": [], "user_location": null, "chosen_group": null,
        "forwarded_to": [], "discovery_waited": false, "discovery_ms": 0,
    }});
    json!({
        "description": format!(
            "{description} (reason {})",
            reasons.iter().map(|r| format!("`{}`", r.as_str())).collect::<Vec<_>>().join(", ")
        ),
        "content": json_body("Error", example),
    })
}

/// `POST /api/v1/access`, served by `access`, and its document.
pub(super) fn access_route() -> Route {
    route(
        Op {
            method: Method::Post,
            path: "/api/v1/access",
            auth: Auth::Scope(Scope::Access),
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
                        "content": json_body("SelectedBody", access_example())},
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
        access,
    )
}

pub(super) async fn access(
    State(a): State<Shared>,
    _: RequireScope<scope::Access>,
    body: Bytes,
) -> Response {
    match access_inner(&a, &body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

/// Parses a `POST /api/v1/access` body (untrusted JSON: the fuzz target
/// `http_bodies` runs it on arbitrary bytes): the request and the user's
/// location, if it names one.
pub(crate) fn parse_access_body(
    body: &[u8],
) -> Result<(AccessRequest, Option<Location>), ApiError> {
    // serde reads a struct from a JSON array too (`["h","tcp",80]`); the
    // document says object.
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        return Err(ApiError::InvalidRequest(
            "body: expected a JSON object {\"host\", \"protocol\", \"port\"}".into(),
        ));
    }
    let body: AccessBody =
        serde_json::from_slice(body).map_err(|e| ApiError::InvalidRequest(format!("body: {e}")))?;
    let protocol = crate::api::body::api_protocol(&body.protocol)?;
    let integral = body.port.as_i64().or_else(|| {
        body.port
            .as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
            .map(|f| f as i64)
    });
    let port = integral
        .ok_or_else(|| port_outside(&body.port))
        .and_then(access_port)?;
    let user_location = body
        .user_location
        .map(|l| Location::new(l.latitude, l.longitude))
        .transpose()
        .map_err(|e| ApiError::InvalidRequest(format!("user_location.{e}")))?;
    Ok((
        AccessRequest {
            host: body.host,
            protocol,
            port: u32::from(port),
        },
        user_location,
    ))
}

async fn access_inner(a: &Authority, body: &[u8]) -> Result<Response, ApiError> {
    let (request, user_location) = parse_access_body(body)?;
    let outcome = access::decide::resolve_from(a, request, user_location).await?;
    Ok(match outcome.decision {
        Ok(s) => json_response(selected_json(&SelectedBody {
            connector: s.connector,
            group: s.group,
            segment: s.segment,
            explanation: outcome.explanation,
        })),
        Err(Refusal { reason, message }) => error_body(
            refusal_status(reason),
            reason.as_str(),
            &message,
            serde_json::to_value(&outcome.explanation).ok(),
        ),
    })
}

/// The JSON of `body` (the same bytes as serde's; a test compares them),
/// written by hand into a buffer sized for it (see
/// `ExplanationView::write_json`).
fn selected_json(body: &SelectedBody) -> Vec<u8> {
    use crate::access::explain::json;
    let candidates = body
        .explanation
        .selection
        .as_ref()
        .map_or(0, |e| e.candidates.len());
    let mut out = Vec::with_capacity(512 + 160 * candidates);
    out.extend_from_slice(b"{\"connector\":");
    json::str(&mut out, &body.connector);
    out.extend_from_slice(b",\"group\":");
    json::str(&mut out, &body.group);
    out.extend_from_slice(b",\"segment\":");
    json::str(&mut out, &body.segment);
    out.extend_from_slice(b",\"explanation\":");
    body.explanation.write_json(&mut out);
    out.push(b'}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The access answer written by hand is serde's JSON of `SelectedBody`.
    #[test]
    fn selected_json_is_serdes() {
        let candidates = [policy::Candidate {
            connector: "c\"1".into(),
            group: "g".into(),
            connected: true,
            drained: false,
            status: policy::Status::Up,
            rtt: Some(std::time::Duration::from_micros(500)),
            location: None,
        }];
        let mut explanation =
            crate::access::explain::ExplanationView::new(policy::Strategy::Healthy);
        explanation.selection = Some(policy::explain(
            &candidates,
            policy::HealthReporting::Continuous,
            policy::Strategy::Healthy,
        ));
        let body = SelectedBody {
            connector: "c\"1".into(),
            group: "g\\".into(),
            segment: "web".into(),
            explanation,
        };
        assert_eq!(
            String::from_utf8_lossy(&selected_json(&body)),
            String::from_utf8_lossy(&serde_json::to_vec(&body).expect("json"))
        );
    }
}
