//! The `Connect` stream's outbound side: a `HealthReport` assembled from
//! entries already encoded ([`crate::report`]: each report's encoding is
//! shared by every replica's session, its `age_ms` written per send, with
//! `protocol::compose`), and the codec that sends bytes as they are
//! ([`RawCodec`]); every other message is encoded with prost ([`encode`]).

use prost::Message;
use prost::bytes::{Buf, BufMut};
use protocol::compose::ReportWriter;
use protocol::v1;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use crate::report::Entry;

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
        let mut writer = ReportWriter::for_entries(self.entries.iter().map(Entry::len));
        for entry in &self.entries {
            entry.write(&mut writer);
        }
        writer.finish(self.full_state, self.sequence)
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

    #[test]
    fn an_empty_report_encodes_as_prost_encodes_it() {
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
