//! The `Connect` stream's outbound side: a `HealthReport` assembled from
//! entries already encoded ([`crate::send::report`]: each report's encoding is
//! shared by every replica's session, its `age_ms` written per send, with
//! `protocol::compose`), sent as they are by `protocol::compose::RawCodec`;
//! every other message is encoded with prost ([`encode`]).

use prost::Message;
use protocol::compose::ReportWriter;
use protocol::v1;

use crate::send::report::Entry;

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
