//! `ApplicationReport`: one application's entry in a connector's health
//! report, the same value on both ends (the connector builds it, the CA
//! stores it); `protocol` converts it to and from the wire, where malformed
//! input is rejected.

use crate::model::AppKey;
use crate::status::{AddressResult, Status};

/// Longest resolver reason or failure detail kept from a report, in
/// characters: enough for any resolver's message, bounded for a hostile
/// peer.
pub const MAX_DETAIL_CHARS: usize = 512;

/// Most addresses one application's entry may carry (the addresses its
/// FQDN resolves to, or its one IP). A connector checks at most this many
/// addresses of one name (the first in answer order) and the CA refuses an
/// entry with more: one entry cannot make the CA hold an unbounded list.
pub const MAX_ADDRESSES_PER_ENTRY: usize = 256;

/// Longest access id (bytes) an entry may echo; the CA's ids are shorter.
pub const MAX_ACCESS_ID_BYTES: usize = 128;

/// What a connector reports about one application.
#[derive(Clone, Debug, PartialEq)]
pub struct ApplicationReport {
    /// Which application.
    pub key: AppKey,
    /// Up / Unhealthy / Down, or Unknown (always Unknown when `expired`).
    pub status: Status,
    /// Per-address results of the latest check round (empty when DNS
    /// failed or the application expired).
    pub addresses: Vec<AddressResult>,
    /// When the latest round finished (or, for an expired application, when
    /// the report was made), Unix milliseconds on the connector's clock.
    /// For display; staleness counts from `age`.
    pub checked_at_unix_ms: i64,
    /// The resolver's reason when resolution failed (at most
    /// `MAX_DETAIL_CHARS` characters).
    pub dns_error: Option<String>,
    /// The on-access window ended and the connector stopped checking.
    pub expired: bool,
    /// How old the check was when the report was sent, on the connector's
    /// monotonic clock (zero: checked just now). The CA judges staleness
    /// from its receive time minus this age, immune to clock skew.
    pub age: std::time::Duration,
    /// On-access applications: the id of the access that opened (or last
    /// renewed) the window, echoed from the CA's `AccessEvent` so that any
    /// CA replica can verify an access asked for this result. Opaque here.
    pub access_id: Option<String>,
}
