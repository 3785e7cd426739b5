//! Access decisions: `POST /api/v1/access`, its body parsed and its answer
//! written by hand.

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use policy::Location;

use crate::access::decide::{AccessRequest, Refusal, access_port, port_outside};
use crate::api::body::{AccessBody, SelectedBody, error_body, refusal_status};
use crate::error::ApiError;
use crate::state::authority::Authority;

use super::Shared;
use super::extract::{RequireScope, scope};
use super::respond::json_response;

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
    let outcome = a.resolve_from(request, user_location).await?;
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
