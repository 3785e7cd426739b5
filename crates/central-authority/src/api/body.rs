//! The JSON API's request and response bodies (their `utoipa::ToSchema`
//! feeds the OpenAPI document) and the error body every HTTP refusal uses.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use policy::RefusalReason;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::access::explain::ExplanationView;
use crate::api::listing::{Counts, Page};
use crate::api::views::{
    AddressHistoryView, ApplicationView, ConnectorView, LoadSeriesView, RttSeriesView,
};

/// The HTTP status of a refusal reason.
pub fn refusal_status(reason: RefusalReason) -> StatusCode {
    match reason {
        RefusalReason::NoSegment => StatusCode::NOT_FOUND,
        RefusalReason::PortNotInSegment => StatusCode::FORBIDDEN,
        RefusalReason::NoConnector
        | RefusalReason::AllDown
        | RefusalReason::NoHealthReport
        | RefusalReason::DiscoveryTimeout
        | RefusalReason::AllDrained => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// A `protocol` field or parameter: exactly `tcp` or `udp`, as the
/// document's enum says (the configuration file is more lenient).
pub(crate) fn api_protocol(value: &str) -> Result<policy::Protocol, crate::error::ApiError> {
    match value {
        "tcp" => Ok(policy::Protocol::Tcp),
        "udp" => Ok(policy::Protocol::Udp),
        other => Err(crate::error::ApiError::InvalidRequest(format!(
            "protocol: {:?} is neither \"tcp\" nor \"udp\" (lower case)",
            other.chars().take(16).collect::<String>()
        ))),
    }
}

/// An error response: `{"error":{"reason","message"}}` (plus the access
/// explanation, when there is one).
pub(crate) fn error_body(
    status: StatusCode,
    reason: &str,
    message: &str,
    extra: Option<serde_json::Value>,
) -> Response {
    let mut body = json!({"error": {"reason": reason, "message": message}});
    if let (Some(extra), Some(obj)) = (extra, body.as_object_mut()) {
        obj.insert("explanation".into(), extra);
    }
    (status, axum::Json(body)).into_response()
}

/// `GET /api/v1/health`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct HealthBody {
    #[serde(flatten)]
    pub(crate) listing: Listing,
    /// The stream's latest transition number when the listing was taken.
    pub(crate) version: u64,
    /// The stream's epoch (16 hex digits), new in every CA process: a
    /// `version` compares only with one of the same epoch (the stream's
    /// `hello` names both).
    pub(crate) epoch: String,
}

/// `GET /api/v1/connectors`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ConnectorsBody {
    /// Every known connector, sorted by name.
    pub(crate) connectors: Vec<ConnectorView>,
    /// The configured check budget per connector cycle.
    pub(crate) check_budget: u64,
}

/// `GET /api/v1/application`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ApplicationBody {
    /// The application.
    pub(crate) application: ApplicationView,
    /// Each connector's smoothed RTT to it over the last hour, one value a
    /// minute (connectors with no reachable result in that hour are left
    /// out), sorted by connector name.
    pub(crate) rtt_series: Vec<RttSeriesView>,
    /// Every address the connectors' answers have had since this CA
    /// process started (at most 16): those in an answer now first, then
    /// those that left (a DNS change), latest first, each with its last
    /// result.
    pub(crate) address_history: Vec<AddressHistoryView>,
    /// The change stream's latest transition number when the view was
    /// taken.
    pub(crate) version: u64,
    /// The change stream's epoch (new in every CA process): `version`
    /// compares only with one of the same epoch.
    pub(crate) epoch: String,
}

/// `GET /api/v1/load`.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct LoadBody {
    /// The configured check budget per connector cycle (the line the
    /// series are drawn against).
    pub(crate) check_budget: u64,
    /// Each connector's checks per cycle over the last day, the highest of
    /// every five minutes, sorted by name (connectors the CA has made no
    /// estimate for since it started are left out).
    pub(crate) connectors: Vec<LoadSeriesView>,
}

/// `POST /api/v1/access`'s request.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AccessBody {
    /// The host the user asked for (FQDN or IP).
    #[schema(schema_with = crate::ground::schema::request_host)]
    pub(crate) host: String,
    /// `tcp` or `udp`.
    #[schema(schema_with = crate::ground::schema::protocol)]
    pub(crate) protocol: String,
    /// 1-65535 (an integral number such as `80.0` is accepted: JSON
    /// Schema counts it as an integer).
    #[schema(value_type = i64, minimum = 1, maximum = 65535)]
    pub(crate) port: serde_json::Number,
    /// Where the user is (optional). Under the `nearest` strategy, when
    /// every reachable candidate's connector group has a `location`, each
    /// candidate's score is its smoothed RTT plus the round trip the
    /// distance from here to its group costs at least (1 ms per 100 km);
    /// otherwise it is ignored and the explanation's `user_location` says
    /// why.
    #[serde(default)]
    pub(crate) user_location: Option<UserLocationBody>,
}

/// A user's location in `POST /api/v1/access`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UserLocationBody {
    /// Degrees north (negative: south).
    #[schema(minimum = -90, maximum = 90)]
    pub(crate) latitude: f64,
    /// Degrees east (negative: west).
    #[schema(minimum = -180, maximum = 180)]
    pub(crate) longitude: f64,
}

/// `POST /api/v1/access`'s answer when a connector was selected.
#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct SelectedBody {
    /// The connector that carries the request.
    pub(crate) connector: String,
    /// Its group.
    pub(crate) group: String,
    /// The matched segment.
    pub(crate) segment: String,
    /// How it was chosen.
    pub(crate) explanation: ExplanationView,
}

/// One answer of the listing.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Listing {
    /// The rows of the page (every row when no paging was asked for).
    pub applications: Vec<ApplicationView>,
    /// Rows matching every filter.
    pub total: usize,
    /// The page shown, from 1.
    pub page: usize,
    /// Rows per page (`total` when no paging was asked for).
    pub per_page: usize,
    /// Number of pages (at least 1).
    pub pages: usize,
    /// Matching rows by status, before the status filter.
    pub counts: Counts,
}

impl Listing {
    /// The answer for `page` with the views of its rows.
    pub fn new<T>(page: Page<T>, applications: Vec<ApplicationView>) -> Listing {
        Listing {
            applications,
            total: page.total,
            page: page.page,
            per_page: page.per_page,
            pages: page.pages,
            counts: page.counts,
        }
    }
}
