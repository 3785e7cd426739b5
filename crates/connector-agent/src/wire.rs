//! Reports encoded once for every CA session. A result goes to every
//! replica's session, and each session used to convert it to its wire form
//! and encode it on its own. Its encoding, except `age_ms` (which depends on
//! when each session sends it), is now computed once, by the first session
//! that sends it, and shared by every session's copy ([`WireCache`]); each
//! session writes the shared bytes followed by its own `age_ms` field. A
//! repeated embedded message is its tag, its length and its bytes, and a
//! message's fields may come in any order, so the result is valid protobuf
//! that decodes to exactly the message the conversion would have built (the
//! test below checks every field). An expired on-access result (no round)
//! is stamped with the time it is sent, so it is encoded per session.
//!
//! The `Connect` stream then carries bytes ([`RawCodec`]): every other
//! message is encoded with prost as before.

use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prost::Message;
use prost::bytes::{Buf, BufMut};
use protocol::v1;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use crate::schedule::AppReport;

/// `HealthReport.applications` (field 1, length-delimited).
const TAG_APPLICATIONS: u8 = 1 << 3 | 2;
/// `HealthReport.full_state` (field 2, varint).
const TAG_FULL_STATE: u8 = 2 << 3;
/// `HealthReport.sequence` (field 3, varint).
const TAG_SEQUENCE: u8 = 3 << 3;
/// `ApplicationHealth.age_ms` (field 7, varint).
const TAG_AGE_MS: u8 = 7 << 3;
/// `ConnectorMessage.report` (field 2, length-delimited).
const TAG_REPORT: u8 = 2 << 3 | 2;

/// A result's shared encoding (without `age_ms`), computed by the first
/// session that sends it. Clones share it; it is not part of the result's
/// value (every `WireCache` equals every other).
#[derive(Clone, Default)]
pub struct WireCache(Arc<OnceLock<Vec<u8>>>);

impl std::fmt::Debug for WireCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WireCache")
    }
}

impl PartialEq for WireCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// One entry of a report as a session sends it: the entry's bytes without
/// `age_ms`, and its `age_ms`.
#[derive(Clone, Debug)]
pub struct Entry {
    body: Body,
    age_ms: u64,
}

#[derive(Clone, Debug)]
enum Body {
    /// The result's shared encoding.
    Shared(WireCache),
    /// Encoded for this send alone (an expired result).
    Own(Vec<u8>),
}

impl Entry {
    /// `report` sent at `now` (wall clock) and `sent` (monotonic), as
    /// [`crate::session::application_report`] states it.
    pub fn new(report: &AppReport, now: SystemTime, sent: Instant) -> Entry {
        let age_ms = report.checked.map_or(0, |at| {
            u64::try_from(sent.saturating_duration_since(at).as_millis()).unwrap_or(u64::MAX)
        });
        let body = if report.round.is_some() {
            // Everything but the age is fixed once the round finished.
            report
                .wire
                .0
                .get_or_init(|| without_age(report, UNIX_EPOCH, sent));
            Body::Shared(report.wire.clone())
        } else {
            Body::Own(without_age(report, now, sent))
        };
        Entry { body, age_ms }
    }

    fn body(&self) -> &[u8] {
        match &self.body {
            Body::Shared(cache) => cache.0.get().map_or(&[], Vec::as_slice),
            Body::Own(bytes) => bytes,
        }
    }

    /// The entry's encoded length (without its tag and length prefix).
    pub fn len(&self) -> usize {
        self.body().len() + age_len(self.age_ms)
    }

    /// Whether the entry encodes to nothing (never: an entry has a key).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.push(TAG_APPLICATIONS);
        prost::encoding::encode_varint(self.len() as u64, out);
        out.extend_from_slice(self.body());
        if self.age_ms != 0 {
            out.push(TAG_AGE_MS);
            prost::encoding::encode_varint(self.age_ms, out);
        }
    }
}

/// The encoding of `report`'s wire form with `age_ms` left out.
fn without_age(report: &AppReport, now: SystemTime, sent: Instant) -> Vec<u8> {
    let mut wire: v1::ApplicationHealth =
        crate::session::application_report(report, now, sent).into();
    wire.age_ms = 0;
    wire.encode_to_vec()
}

fn age_len(age_ms: u64) -> usize {
    if age_ms == 0 {
        0
    } else {
        1 + prost::encoding::encoded_len_varint(age_ms)
    }
}

/// A `HealthReport` ready to send.
#[derive(Clone, Debug)]
pub struct Report {
    /// Its entries.
    pub entries: Vec<Entry>,
    /// The complete state after a (re)connect.
    pub full_state: bool,
    /// Its sequence number.
    pub sequence: u64,
}

impl Report {
    /// The `ConnectorMessage` carrying it, encoded.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(
            self.entries
                .iter()
                .map(|e| e.len() + 1 + prost::encoding::encoded_len_varint(e.len() as u64))
                .sum::<usize>()
                + 12,
        );
        for entry in &self.entries {
            entry.write(&mut body);
        }
        if self.full_state {
            body.push(TAG_FULL_STATE);
            body.push(1);
        }
        if self.sequence != 0 {
            body.push(TAG_SEQUENCE);
            prost::encoding::encode_varint(self.sequence, &mut body);
        }
        let mut out = Vec::with_capacity(body.len() + 6);
        out.push(TAG_REPORT);
        prost::encoding::encode_varint(body.len() as u64, &mut out);
        out.extend_from_slice(&body);
        out
    }

    /// The message it encodes, decoded again (for tests); `None` if it
    /// does not decode to a report.
    pub fn message(&self) -> Option<v1::HealthReport> {
        match v1::ConnectorMessage::decode(self.encode().as_slice())
            .ok()?
            .kind
        {
            Some(v1::connector_message::Kind::Report(r)) => Some(r),
            _ => None,
        }
    }
}

/// A message for the `Connect` stream, encoded.
pub fn encode(kind: v1::connector_message::Kind) -> Vec<u8> {
    v1::ConnectorMessage { kind: Some(kind) }.encode_to_vec()
}

/// The `Connect` stream's codec: outbound messages arrive encoded (a
/// [`Report`] with its shared entries, or [`encode`]), inbound ones are
/// decoded with prost.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

/// [`RawCodec`]'s encoder: copies the bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawEncoder;

/// [`RawCodec`]'s decoder: an `AuthorityMessage` per frame.
#[derive(Clone, Copy, Debug, Default)]
pub struct AuthorityDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = v1::AuthorityMessage;
    type Encoder = RawEncoder;
    type Decoder = AuthorityDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        AuthorityDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for AuthorityDecoder {
    type Item = v1::AuthorityMessage;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        let len = src.remaining();
        v1::AuthorityMessage::decode(src.copy_to_bytes(len))
            .map(Some)
            .map_err(|e| Status::internal(format!("cannot decode a message from the CA: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use policy::{AddressResult, AppKey, Method, Protocol, Status as Health};

    use crate::schedule::Round;

    fn report(host: &str, round: bool, checked: Option<Instant>, access_id: bool) -> AppReport {
        AppReport {
            key: AppKey {
                segment: "seg".into(),
                host: host.parse().expect("host"),
                protocol: Protocol::Tcp,
                port: 8443,
            },
            status: if round {
                Health::Unhealthy
            } else {
                Health::Unknown
            },
            round: round.then(|| Round {
                addresses: vec![
                    AddressResult {
                        address: "10.0.0.1".parse().expect("ip"),
                        reachable: true,
                        method: Method::Tcp,
                        rtt: Duration::from_micros(1500),
                        failure: None,
                    },
                    AddressResult {
                        address: "2001:db8::7".parse().expect("ip"),
                        reachable: false,
                        method: Method::Tcp,
                        rtt: Duration::ZERO,
                        failure: Some(policy::Failure {
                            kind: policy::FailureKind::Refused,
                            detail: "connection refused".into(),
                        }),
                    },
                ],
                dns_error: Some("SERVFAIL".into()),
                dns_stale: true,
                finished_at: SystemTime::now() - Duration::from_secs(3),
            }),
            expired: !round,
            checked,
            access_id: access_id.then(|| "acc-1".to_owned()),
            awaited: false,
            wire: WireCache::default(),
        }
    }

    #[test]
    fn a_shared_encoding_decodes_to_what_the_conversion_builds() {
        let t0 = Instant::now();
        let now = SystemTime::now();
        let reports = [
            report("app.test", true, Some(t0), true),
            report("10.1.2.3", true, Some(t0 + Duration::from_millis(5)), false),
            // Checked just now: age 0, no age field.
            report(
                "zero.test",
                true,
                Some(t0 + Duration::from_millis(1234)),
                false,
            ),
            // Expired: no round, stamped with the send time.
            report("gone.test", false, None, true),
        ];
        // A replica that sends first fills the shared encodings; the copy a
        // second replica holds reuses them with its own ages.
        let copies = reports.clone();
        for (sent, list) in [
            (t0 + Duration::from_millis(1234), &reports),
            (t0 + Duration::from_millis(99_999), &copies),
        ] {
            let encoded = Report {
                entries: list.iter().map(|r| Entry::new(r, now, sent)).collect(),
                full_state: true,
                sequence: 300,
            };
            let want = v1::HealthReport {
                applications: list
                    .iter()
                    .map(|r| crate::session::application_report(r, now, sent).into())
                    .collect(),
                full_state: true,
                sequence: 300,
            };
            assert_eq!(encoded.message().expect("decodes"), want);
            for (entry, wire) in encoded.entries.iter().zip(&want.applications) {
                assert_eq!(entry.len(), wire.encoded_len());
            }
        }
        assert!(copies[0].wire.0.get().is_some(), "shared by the copies");
        assert_eq!(
            reports[2].wire.0.get().map(Vec::len),
            Some(
                v1::ApplicationHealth::from(crate::session::application_report(
                    &reports[2],
                    now,
                    t0 + Duration::from_millis(1234)
                ))
                .encoded_len()
            )
        );
        // Defaults are left out as prost leaves them out.
        let empty = Report {
            entries: Vec::new(),
            full_state: false,
            sequence: 0,
        };
        assert_eq!(
            empty.message().expect("decodes"),
            v1::HealthReport::default()
        );
        assert_eq!(
            empty.encode(),
            encode(v1::connector_message::Kind::Report(
                v1::HealthReport::default()
            ))
        );
    }
}
