//! The connector's fast path for health reports, the counterpart of
//! [`crate::scan`]: a `ConnectorMessage` carrying a `HealthReport` composed
//! from entries encoded earlier. A connector sends every report to every CA
//! replica's session, so an entry's encoding without its `age_ms` (the
//! `ApplicationHealth` of an `ApplicationReport` whose age is zero, by the
//! conversion in [`crate::convert`]) is computed once and shared, and each
//! session appends its own `age_ms` field ([`entry_len`], [`ReportWriter`]);
//! [`RawCodec`] sends such bytes on the `Connect` stream as they are.
//!
//! **Invariant:** a composed message is valid protobuf that decodes to
//! exactly what prost would have encoded for the same report with each
//! entry's age: a repeated embedded message is its tag, its length and its
//! bytes, a message's fields may come in any order, and defaults are left
//! out as prost leaves them out (tested below and in the connector).

use prost::Message;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{encode_varint, encoded_len_varint};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

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

/// The encoded length of an `ApplicationHealth` whose encoding without
/// `age_ms` is `body_len` bytes, with `age_ms` (without its own tag and
/// length prefix).
pub fn entry_len(body_len: usize, age_ms: u64) -> usize {
    body_len
        + if age_ms == 0 {
            0
        } else {
            1 + encoded_len_varint(age_ms)
        }
}

/// A `ConnectorMessage { report: HealthReport }` being written: entries
/// first, then [`ReportWriter::finish`].
#[derive(Debug, Default)]
pub struct ReportWriter {
    body: Vec<u8>,
}

impl ReportWriter {
    /// A writer with room for entries of these lengths (each as
    /// [`entry_len`] counts it) and the report's own fields.
    pub fn for_entries(lengths: impl Iterator<Item = usize>) -> Self {
        let bytes: usize = lengths
            .map(|len| 1 + encoded_len_varint(len as u64) + len)
            .sum();
        ReportWriter {
            body: Vec::with_capacity(bytes + 12),
        }
    }

    /// Appends one entry: its encoding without `age_ms`, then its age.
    pub fn entry(&mut self, body: &[u8], age_ms: u64) {
        self.body.push(TAG_APPLICATIONS);
        encode_varint(entry_len(body.len(), age_ms) as u64, &mut self.body);
        self.body.extend_from_slice(body);
        if age_ms != 0 {
            self.body.push(TAG_AGE_MS);
            encode_varint(age_ms, &mut self.body);
        }
    }

    /// The encoded `ConnectorMessage`.
    pub fn finish(mut self, full_state: bool, sequence: u64) -> Vec<u8> {
        if full_state {
            self.body.push(TAG_FULL_STATE);
            self.body.push(1);
        }
        if sequence != 0 {
            self.body.push(TAG_SEQUENCE);
            encode_varint(sequence, &mut self.body);
        }
        let mut out = Vec::with_capacity(self.body.len() + 6);
        out.push(TAG_REPORT);
        encode_varint(self.body.len() as u64, &mut out);
        out.extend_from_slice(&self.body);
        out
    }
}

/// The `Connect` stream's codec: outbound messages arrive encoded (a
/// a report written with [`ReportWriter`], or a message encoded with prost), inbound ones are
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
    type Decode = crate::v1::AuthorityMessage;
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
    type Item = crate::v1::AuthorityMessage;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        let len = src.remaining();
        crate::v1::AuthorityMessage::decode(src.copy_to_bytes(len))
            .map(Some)
            .map_err(|e| Status::internal(format!("cannot decode a message from the CA: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::v1;

    #[test]
    fn a_composed_report_is_what_prost_encodes() {
        let app = |host: &str, age_ms| v1::ApplicationHealth {
            app: Some(v1::ApplicationKey {
                segment: "s".into(),
                host: host.into(),
                protocol: v1::Protocol::Tcp as i32,
                port: 443,
            }),
            status: v1::HealthStatus::Up as i32,
            // An application-level check's reason and certificate expiry
            // travel inside the shared entry bytes.
            addresses: vec![v1::AddressResult {
                address: "10.0.0.1".into(),
                status: v1::HealthStatus::Down as i32,
                method: v1::CheckMethod::Tcp as i32,
                failure: v1::FailureKind::Other as i32,
                detail: "http 503".into(),
                reason: Some("http 503".into()),
                certificate_not_after_unix_s: Some(1_900_000_000),
                ..Default::default()
            }],
            checked_at_unix_ms: 1_700_000_000_000,
            age_ms,
            ..Default::default()
        };
        for (full_state, sequence) in [(false, 0), (true, 1), (false, 300)] {
            let apps = [app("a.test", 0), app("b.test", 1234), app("c.test", 99)];
            let mut writer = ReportWriter::for_entries(std::iter::empty());
            for a in &apps {
                let body = v1::ApplicationHealth {
                    age_ms: 0,
                    ..a.clone()
                }
                .encode_to_vec();
                assert_eq!(entry_len(body.len(), a.age_ms), a.encoded_len());
                writer.entry(&body, a.age_ms);
            }
            let want = v1::ConnectorMessage {
                kind: Some(v1::connector_message::Kind::Report(v1::HealthReport {
                    applications: apps.to_vec(),
                    full_state,
                    sequence,
                })),
            };
            let composed = writer.finish(full_state, sequence);
            assert_eq!(v1::ConnectorMessage::decode(composed.as_slice()), Ok(want));
        }
        // An empty report is byte for byte prost's.
        let empty = v1::ConnectorMessage {
            kind: Some(v1::connector_message::Kind::Report(
                v1::HealthReport::default(),
            )),
        };
        assert_eq!(
            ReportWriter::default().finish(false, 0),
            empty.encode_to_vec()
        );
    }
}
