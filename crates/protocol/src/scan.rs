//! The CA's fast path for health reports: a `ConnectorMessage` carrying a
//! `HealthReport` is read straight from its encoded bytes into the domain
//! form ([`scan_report`]), borrowing the application key's text from the
//! message instead of decoding it into `String`s with prost and converting
//! those (`ApplicationReport::try_from`). The report intake looks the key up
//! in the policy and the health table by that borrowed text.
//!
//! **Invariant:** the scan either gives exactly what prost decoding followed
//! by `ApplicationReport::try_from` of every entry gives, or `None`. It
//! accepts only the plain shape a connector sends (each field at most once,
//! no unknown fields, every entry valid and its host already normalised);
//! anything else — malformed, invalid, merely unusual — is `None`, and the
//! caller takes the prost path ([`decode_connector_message`]), which reports
//! every error as before. Nothing a connector sees changes.

use std::net::IpAddr;
use std::time::Duration;

use policy::report::{MAX_ACCESS_ID_BYTES, MAX_ADDRESSES_PER_ENTRY};
use policy::{AddressResult, AppKey, ApplicationReport, Failure, Host, HostRef, Protocol, Status};
use prost::Message as _;
use prost::bytes::Bytes;

use crate::convert::{
    bounded, failure_kind_from_wire, method_from_wire, port, protocol_from_wire, status_from_wire,
    text_ok,
};
use crate::v1;

/// An entry's per-address results. Nearly every entry has one address,
/// which is then held inline: the CA stores it in its health table without
/// an allocation of its own, and replacing a report frees none.
pub type Addresses = smallvec::SmallVec<[AddressResult; 1]>;

/// A health report read by [`scan_report`].
#[derive(Debug, PartialEq)]
pub struct ScannedReport<'a> {
    /// The entries, in message order.
    pub entries: Entries<'a>,
    /// `HealthReport.full_state`.
    pub full_state: bool,
    /// `HealthReport.sequence`.
    pub sequence: u64,
}

/// A report's entries: the first held inline (a report of one entry, what
/// a connector sends for each change, needs no allocation), the rest in a
/// vector.
#[derive(Debug, Default, PartialEq)]
pub struct Entries<'a> {
    first: Option<EntryView<'a>>,
    rest: Vec<EntryView<'a>>,
}

impl<'a> Entries<'a> {
    fn push(&mut self, entry: EntryView<'a>) {
        if self.first.is_none() {
            self.first = Some(entry);
        } else {
            self.rest.push(entry);
        }
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// The entries in message order, in place (the report intake moves
    /// out what it keeps instead of copying each entry out first).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut EntryView<'a>> {
        self.first.iter_mut().chain(self.rest.iter_mut())
    }
}

impl<'a> IntoIterator for Entries<'a> {
    type Item = EntryView<'a>;
    type IntoIter =
        std::iter::Chain<std::option::IntoIter<EntryView<'a>>, std::vec::IntoIter<EntryView<'a>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.rest)
    }
}

/// One valid report entry whose key's text is borrowed from the message.
#[derive(Debug, PartialEq)]
pub struct EntryView<'a> {
    /// The segment name (checked as `ApplicationKey.segment` is).
    pub segment: &'a str,
    /// The host, already in normal form.
    pub host: HostRef<'a>,
    /// The protocol.
    pub protocol: Protocol,
    /// The port (1-65535).
    pub port: u16,
    /// The reported status.
    pub status: Status,
    /// The per-address results.
    pub addresses: Addresses,
    /// `ApplicationHealth.checked_at_unix_ms`.
    pub checked_at_unix_ms: i64,
    /// The resolver's reason as sent (empty: none); see [`EntryView::dns_error`].
    pub dns_error: &'a str,
    /// `ApplicationHealth.expired`.
    pub expired: bool,
    /// `ApplicationHealth.age_ms`.
    pub age: Duration,
    /// The echoed access id as sent (empty: none; at most
    /// `MAX_ACCESS_ID_BYTES`).
    pub access_id: &'a str,
}

impl<'a> EntryView<'a> {
    /// The application key, owned.
    pub fn key(&self) -> AppKey {
        AppKey {
            segment: self.segment.to_owned(),
            host: self.host.to_host(),
            protocol: self.protocol,
            port: self.port,
        }
    }

    /// The resolver's reason as `ApplicationReport::dns_error` holds it.
    pub fn dns_error(&self) -> Option<String> {
        (!self.dns_error.is_empty()).then(|| bounded(self.dns_error.to_owned()))
    }

    /// `report` (an entry decoded with prost and converted) as a view: the
    /// key's text borrowed from it, its addresses moved out. The report
    /// intake takes every entry in this one form, whichever way it was read.
    pub fn lend(report: &'a mut ApplicationReport) -> EntryView<'a> {
        EntryView {
            segment: &report.key.segment,
            host: report.key.host.as_host_ref(),
            protocol: report.key.protocol,
            port: report.key.port,
            status: report.status,
            addresses: Addresses::from_vec(std::mem::take(&mut report.addresses)),
            checked_at_unix_ms: report.checked_at_unix_ms,
            dns_error: report.dns_error.as_deref().unwrap_or(""),
            expired: report.expired,
            age: report.age,
            access_id: report.access_id.as_deref().unwrap_or(""),
        }
    }

    /// The entry as `ApplicationReport::try_from` gives it.
    pub fn into_report(mut self) -> ApplicationReport {
        self.take_report()
    }

    /// [`EntryView::into_report`] of an entry in place: its addresses are
    /// moved out (left empty), the rest copied.
    pub fn take_report(&mut self) -> ApplicationReport {
        ApplicationReport {
            key: self.key(),
            status: self.status,
            dns_error: self.dns_error(),
            checked_at_unix_ms: self.checked_at_unix_ms,
            expired: self.expired,
            age: self.age,
            access_id: (!self.access_id.is_empty()).then(|| self.access_id.to_owned()),
            addresses: std::mem::take(&mut self.addresses).into_vec(),
        }
    }
}

/// Decodes a `ConnectorMessage` with prost, failing as tonic's prost codec
/// does (`INTERNAL` with prost's message): the path for every message
/// [`scan_report`] does not take.
pub fn decode_connector_message(bytes: Bytes) -> Result<v1::ConnectorMessage, tonic::Status> {
    v1::ConnectorMessage::decode(bytes).map_err(|e| tonic::Status::internal(e.to_string()))
}

/// `bytes` (an encoded `ConnectorMessage`) as a health report whose every
/// entry is valid, or `None` (see the module's invariant).
pub fn scan_report(bytes: &[u8]) -> Option<ScannedReport<'_>> {
    let mut r = Reader(bytes);
    // Exactly one field: `report = 2`.
    let (field, wire) = r.key()?;
    if field != 2 || wire != LEN {
        return None;
    }
    let report = r.len_delimited()?;
    if !r.0.is_empty() {
        return None;
    }
    health_report(report)
}

/// The codec of the CA's side of `ConnectorSession.Connect`: answers are
/// encoded with prost; each inbound message is handed over still encoded
/// (its bytes, not copied), for [`scan_report`] or, failing that,
/// [`decode_connector_message`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ConnectCodec;

/// [`ConnectCodec`]'s decoder: one message's bytes per frame.
#[derive(Clone, Copy, Debug, Default)]
pub struct BytesDecoder;

impl tonic::codec::Codec for ConnectCodec {
    type Encode = v1::AuthorityMessage;
    type Decode = Bytes;
    type Encoder = tonic_prost::ProstEncoder<v1::AuthorityMessage>;
    type Decoder = BytesDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstEncoder::new(tonic::codec::BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        BytesDecoder
    }
}

impl tonic::codec::Decoder for BytesDecoder {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Bytes>, tonic::Status> {
        use prost::bytes::Buf as _;
        let len = src.remaining();
        Ok(Some(src.copy_to_bytes(len)))
    }
}

/// Wire types.
const VARINT: u8 = 0;
const LEN: u8 = 2;

/// A cursor over encoded protobuf.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// A varint as prost reads it (at most ten bytes, the tenth at most 1).
    #[inline]
    fn varint(&mut self) -> Option<u64> {
        // Most of a report's varints (keys, lengths, enums) are one byte.
        if let [byte @ 0..0x80, rest @ ..] = self.0 {
            self.0 = rest;
            return Some(u64::from(*byte));
        }
        self.varint_long()
    }

    /// [`Reader::varint`] of more than one byte.
    #[inline(never)]
    fn varint_long(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let (&byte, rest) = self.0.split_first()?;
            self.0 = rest;
            if i == 9 && byte > 1 {
                return None;
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Some(value);
            }
        }
        None
    }

    /// The next field's number and wire type, from a key of one byte:
    /// every field of a report has a number below 16, which an encoder
    /// writes in one byte. A longer key (an unknown field, or a known one
    /// spelled in more bytes than it needs) is `None`: prost's to read.
    #[inline]
    fn key(&mut self) -> Option<(u32, u8)> {
        let (&key, rest) = self.0.split_first()?;
        if key >= 0x80 {
            return None;
        }
        self.0 = rest;
        let field = u32::from(key >> 3);
        (field >= 1).then_some((field, key & 7))
    }

    /// A length-delimited field's bytes.
    fn len_delimited(&mut self) -> Option<&'a [u8]> {
        let len = usize::try_from(self.varint()?).ok()?;
        if len > self.0.len() {
            return None;
        }
        let (field, rest) = self.0.split_at(len);
        self.0 = rest;
        Some(field)
    }

    /// A string field.
    fn str(&mut self) -> Option<&'a str> {
        std::str::from_utf8(self.len_delimited()?).ok()
    }

    /// The next field's number and wire type, refusing a field number
    /// read before (`seen` holds a bit per field number).
    fn field(&mut self, seen: &mut u32) -> Option<(u32, u8)> {
        let (field, wire) = self.key()?;
        once(seen, field)?;
        Some((field, wire))
    }
}

fn health_report(bytes: &[u8]) -> Option<ScannedReport<'_>> {
    let mut r = Reader(bytes);
    let mut report = ScannedReport {
        entries: Entries::default(),
        full_state: false,
        sequence: 0,
    };
    let mut seen = 0;
    while !r.0.is_empty() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, LEN) => report.entries.push(entry(r.len_delimited()?)?),
            (2 | 3, VARINT) => {
                once(&mut seen, field)?;
                let value = r.varint()?;
                if field == 2 {
                    report.full_state = value != 0;
                } else {
                    report.sequence = value;
                }
            }
            _ => return None,
        }
    }
    Some(report)
}

fn entry(bytes: &[u8]) -> Option<EntryView<'_>> {
    let mut r = Reader(bytes);
    let mut key: Option<(&str, HostRef<'_>, Protocol, u16)> = None;
    let mut status = 0i32;
    let mut addresses = Addresses::new();
    let (mut checked_at_unix_ms, mut dns_error, mut expired, mut age_ms, mut access_id) =
        (0i64, "", false, 0u64, "");
    let mut seen = 0;
    while !r.0.is_empty() {
        let (field, wire) = r.key()?;
        // `addresses` repeats; every other field appears once.
        if (field, wire) == (3, LEN) {
            if addresses.len() == MAX_ADDRESSES_PER_ENTRY {
                return None;
            }
            // An IP application's address is usually its own host: the
            // host's parse is reused for the same text (keys come first in
            // field order, as every encoder writes them).
            let own = key.and_then(|(_, host, _, _)| Some((host.as_str(), host.ip()?)));
            addresses.push(address(r.len_delimited()?, own)?);
            continue;
        }
        once(&mut seen, field)?;
        match (field, wire) {
            (1, LEN) => key = Some(app_key(r.len_delimited()?)?),
            (2, VARINT) => status = r.varint()? as i32,
            (4, VARINT) => checked_at_unix_ms = r.varint()? as i64,
            (5, LEN) => dns_error = r.str()?,
            (6, VARINT) => expired = r.varint()? != 0,
            (7, VARINT) => age_ms = r.varint()?,
            (10, LEN) => access_id = r.str()?,
            _ => return None,
        }
    }
    let (segment, host, protocol, port) = key?;
    if access_id.len() > MAX_ACCESS_ID_BYTES {
        return None;
    }
    Some(EntryView {
        segment,
        host,
        protocol,
        port,
        status: status_from_wire("status", status).ok()?,
        addresses,
        checked_at_unix_ms,
        dns_error,
        expired,
        age: Duration::from_millis(age_ms),
        access_id,
    })
}

/// Marks `field` read; `None` when it was read before.
fn once(seen: &mut u32, field: u32) -> Option<()> {
    let bit = 1u32.checked_shl(field)?;
    if *seen & bit != 0 {
        return None;
    }
    *seen |= bit;
    Some(())
}

fn app_key(bytes: &[u8]) -> Option<(&str, HostRef<'_>, Protocol, u16)> {
    let mut r = Reader(bytes);
    let (mut segment, mut host, mut protocol, mut number) = ("", "", 0i32, 0u32);
    let mut seen = 0;
    while !r.0.is_empty() {
        match r.field(&mut seen)? {
            (1, LEN) => segment = r.str()?,
            (2, LEN) => host = r.str()?,
            (3, VARINT) => protocol = r.varint()? as i32,
            (4, VARINT) => number = r.varint()? as u32,
            _ => return None,
        }
    }
    if !text_ok(segment) {
        return None;
    }
    Some((
        segment,
        Host::normal(host)?,
        protocol_from_wire("app.protocol", protocol).ok()?,
        port("app.port", number).ok()?,
    ))
}

/// One `AddressResult`; `own` is the entry's host text and address when
/// it is an IP literal (the same text parses to the same address).
fn address(bytes: &[u8], own: Option<(&str, IpAddr)>) -> Option<AddressResult> {
    let mut r = Reader(bytes);
    // The text is read as bytes: only its parse is kept, and the host's
    // text or a dotted quad is valid UTF-8 without checking it again.
    let (mut text, mut status, mut method, mut rtt_us, mut failure, mut detail) =
        (&[][..], 0i32, 0i32, 0u64, 0i32, "");
    let (mut reason, mut not_after): (Option<&str>, Option<i64>) = (None, None);
    let mut seen = 0;
    while !r.0.is_empty() {
        match r.field(&mut seen)? {
            (1, LEN) => text = r.len_delimited()?,
            (2, VARINT) => status = r.varint()? as i32,
            (3, VARINT) => method = r.varint()? as i32,
            (4, VARINT) => rtt_us = r.varint()?,
            (5, VARINT) => failure = r.varint()? as i32,
            (6, LEN) => detail = r.str()?,
            (7, LEN) => reason = Some(r.str()?),
            (8, VARINT) => not_after = Some(r.varint()? as i64),
            _ => return None,
        }
    }
    let address: IpAddr = match own {
        Some((host, ip)) if host.as_bytes() == text => ip,
        _ => match policy::host::parse_ipv4(text) {
            Some(v4) => IpAddr::V4(v4),
            // Anything else must be UTF-8, as prost requires of a string.
            None => policy::host::parse_ip(std::str::from_utf8(text).ok()?)?,
        },
    };
    let reachable = match status_from_wire("address.status", status).ok()? {
        Status::Up => true,
        Status::Down => false,
        _ => return None,
    };
    let failure = failure_kind_from_wire("address.failure", failure)
        .ok()?
        .map(|kind| Failure {
            kind,
            detail: bounded(detail.to_owned()),
        });
    Some(AddressResult {
        address,
        reachable,
        method: method_from_wire("address.method", method).ok()?,
        rtt: Duration::from_micros(rtt_us),
        failure,
        check: crate::convert::check_detail(reason.map(str::to_owned), not_after),
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What the prost path makes of `bytes`: the report's entries converted
    /// one by one (`Err` for a message that is no report or does not
    /// decode).
    #[allow(clippy::type_complexity)]
    fn prost_path(
        bytes: &[u8],
    ) -> Result<(Vec<Result<ApplicationReport, crate::WireError>>, bool, u64), String> {
        let message = decode_connector_message(Bytes::copy_from_slice(bytes))
            .map_err(|e| e.message().to_owned())?;
        let Some(v1::connector_message::Kind::Report(report)) = message.kind else {
            return Err("not a report".into());
        };
        Ok((
            report
                .applications
                .into_iter()
                .map(ApplicationReport::try_from)
                .collect(),
            report.full_state,
            report.sequence,
        ))
    }

    /// The scan agrees with the prost path: when it reads a message at
    /// all, the prost path takes every entry and gives the same values.
    /// Returns whether the scan read it.
    fn agree(bytes: &[u8]) -> bool {
        let Some(scanned) = scan_report(bytes) else {
            return false;
        };
        let (entries, full_state, sequence) = match prost_path(bytes) {
            Ok(p) => p,
            Err(e) => panic!("scanned, but prost fails: {e}"),
        };
        assert_eq!(scanned.full_state, full_state);
        assert_eq!(scanned.sequence, sequence);
        assert_eq!(scanned.entries.len(), entries.len());
        for (view, entry) in scanned.entries.into_iter().zip(entries) {
            // The view an entry decoded by prost lends is the scanned one:
            // the intake's one route sees no difference.
            if let Ok(expected) = &entry {
                let mut converted = expected.clone();
                let mut lent = EntryView::lend(&mut converted);
                // The scan keeps the resolver's reason as sent, the
                // conversion bounded: both give the same `dns_error()`.
                assert_eq!(lent.dns_error(), view.dns_error());
                lent.dns_error = view.dns_error;
                assert_eq!(lent, view);
            }
            let key = view.key();
            let report = view.into_report();
            assert_eq!(key, report.key);
            assert_eq!(key.host.ip(), report.key.host.ip());
            match entry {
                Ok(expected) => {
                    assert_eq!(report, expected);
                    assert_eq!(report.key.host.ip(), expected.key.host.ip());
                }
                Err(e) => panic!("scanned, but the conversion fails: {e}"),
            }
        }
        true
    }

    fn address(text: &str, status: i32, failure: i32, detail: &str) -> v1::AddressResult {
        v1::AddressResult {
            address: text.into(),
            status,
            method: v1::CheckMethod::Tcp as i32,
            rtt_us: 1234,
            failure,
            detail: detail.into(),
            reason: None,
            certificate_not_after_unix_s: None,
        }
    }

    fn app(segment: &str, host: &str, port: u32) -> v1::ApplicationHealth {
        v1::ApplicationHealth {
            app: Some(v1::ApplicationKey {
                segment: segment.into(),
                host: host.into(),
                protocol: v1::Protocol::Tcp as i32,
                port,
            }),
            status: v1::HealthStatus::Up as i32,
            addresses: vec![address("127.0.9.1", v1::HealthStatus::Up as i32, 0, "")],
            checked_at_unix_ms: 1_700_000_000_000,
            dns_error: String::new(),
            expired: false,
            age_ms: 0,
            access_id: String::new(),
        }
    }

    fn message(applications: Vec<v1::ApplicationHealth>) -> Vec<u8> {
        v1::ConnectorMessage {
            kind: Some(v1::connector_message::Kind::Report(v1::HealthReport {
                applications,
                full_state: false,
                sequence: 7,
            })),
        }
        .encode_to_vec()
    }

    /// Every entry the prost path takes is scanned, with the same values;
    /// every entry it rejects (or would change: a host not in normal
    /// form) sends the whole message to the prost path.
    #[test]
    fn the_scan_and_the_prost_path_agree_on_a_table_of_entries() {
        let long = "x".repeat(300);
        let id = "i".repeat(MAX_ACCESS_ID_BYTES + 1);
        let many = vec![address("10.0.0.1", 1, 0, ""); MAX_ADDRESSES_PER_ENTRY + 1];
        let valid: Vec<v1::ApplicationHealth> = vec![
            app("seg", "127.0.0.1", 80),
            app("seg", "db.example.test", 65535),
            app("seg", "::1", 1),
            // The address is the host itself (its parse is reused).
            app("seg", "127.0.9.1", 80),
            v1::ApplicationHealth {
                addresses: vec![
                    address("::1", v1::HealthStatus::Up as i32, 0, ""),
                    address("::2", v1::HealthStatus::Down as i32, 0, ""),
                ],
                ..app("seg", "::1", 443)
            },
            v1::ApplicationHealth {
                status: v1::HealthStatus::Down as i32,
                addresses: vec![
                    address(
                        "10.0.0.1",
                        v1::HealthStatus::Down as i32,
                        v1::FailureKind::Refused as i32,
                        "refused",
                    ),
                    address("::2", v1::HealthStatus::Up as i32, 0, "ignored"),
                ],
                dns_error: "é".repeat(600),
                expired: true,
                age_ms: 1500,
                access_id: "abc".into(),
                checked_at_unix_ms: -5,
                ..app("seg", "a.test", 443)
            },
            v1::ApplicationHealth {
                status: v1::HealthStatus::Unknown as i32,
                addresses: vec![],
                ..app("seg", "b.test", 443)
            },
            v1::ApplicationHealth {
                addresses: vec![address("10.0.0.1", 1, 0, ""); MAX_ADDRESSES_PER_ENTRY],
                ..app("seg", "b.test", 443)
            },
            // An application-level check's reason and certificate expiry
            // (a negative expiry is ten bytes on the wire).
            v1::ApplicationHealth {
                status: v1::HealthStatus::Unhealthy as i32,
                addresses: vec![
                    v1::AddressResult {
                        reason: Some("tls: certificate expired".into()),
                        certificate_not_after_unix_s: Some(1_600_000_000),
                        ..address(
                            "10.0.0.1",
                            3,
                            v1::FailureKind::Other as i32,
                            "tls: certificate expired",
                        )
                    },
                    v1::AddressResult {
                        certificate_not_after_unix_s: Some(-86_400),
                        ..address("10.0.0.2", 1, 0, "")
                    },
                    v1::AddressResult {
                        reason: Some(String::new()),
                        certificate_not_after_unix_s: Some(0),
                        ..address("10.0.0.3", 1, 0, "")
                    },
                    v1::AddressResult {
                        reason: Some("é".repeat(600)),
                        ..address("10.0.0.4", 3, v1::FailureKind::Other as i32, "http 503")
                    },
                ],
                ..app("seg", "c.test", 443)
            },
        ];
        for a in &valid {
            assert!(agree(&message(vec![a.clone()])), "{a:?}");
        }
        assert!(agree(&message(valid.clone())));
        assert!(agree(&message(vec![])));
        let invalid: Vec<v1::ApplicationHealth> = vec![
            v1::ApplicationHealth {
                app: None,
                ..app("seg", "a.test", 80)
            },
            app("", "a.test", 80),
            app("s g", "a.test", 80),
            app(&long, "a.test", 80),
            app("seg", "", 80),
            app("seg", "A.test", 80),
            app("seg", "a.test.", 80),
            app("seg", "::0001", 80),
            app("seg", "a..test", 80),
            app("seg", "a.test", 0),
            app("seg", "a.test", 70_000),
            v1::ApplicationHealth {
                status: 42,
                ..app("seg", "a.test", 80)
            },
            v1::ApplicationHealth {
                status: -1,
                ..app("seg", "a.test", 80)
            },
            v1::ApplicationHealth {
                access_id: id.clone(),
                ..app("seg", "a.test", 80)
            },
            v1::ApplicationHealth {
                addresses: many.clone(),
                ..app("seg", "a.test", 80)
            },
            v1::ApplicationHealth {
                addresses: vec![address("bad", 1, 0, "")],
                ..app("seg", "a.test", 80)
            },
            // Not std's dotted quads: the address parse refuses them.
            v1::ApplicationHealth {
                addresses: vec![address("010.0.0.1", 1, 0, "")],
                ..app("seg", "a.test", 80)
            },
            v1::ApplicationHealth {
                addresses: vec![address("10.0.0.1.", 1, 0, "")],
                ..app("seg", "10.0.0.1", 80)
            },
            v1::ApplicationHealth {
                addresses: vec![address("10.0.0.256", 1, 0, "")],
                ..app("seg", "a.test", 80)
            },
            v1::ApplicationHealth {
                addresses: vec![address("10.0.0.1", v1::HealthStatus::Unknown as i32, 0, "")],
                ..app("seg", "a.test", 80)
            },
            v1::ApplicationHealth {
                addresses: vec![address("10.0.0.1", 1, 99, "")],
                ..app("seg", "a.test", 80)
            },
            v1::ApplicationHealth {
                app: Some(v1::ApplicationKey {
                    protocol: 9,
                    ..app("seg", "a.test", 80).app.unwrap_or_default()
                }),
                ..app("seg", "a.test", 80)
            },
        ];
        for a in invalid {
            // Alone and after a valid entry: either way the whole message
            // takes the prost path.
            assert!(!agree(&message(vec![a.clone()])), "{a:?}");
            assert!(!agree(&message(vec![valid[0].clone(), a.clone()])), "{a:?}");
        }
        // Other kinds of message, unknown and repeated fields, truncation.
        let hello = v1::ConnectorMessage {
            kind: Some(v1::connector_message::Kind::Hello(v1::Hello::default())),
        }
        .encode_to_vec();
        assert!(!agree(&hello));
        let good = message(vec![valid[0].clone()]);
        for cut in 0..good.len() {
            assert!(!agree(&good[..cut]), "cut at {cut}");
        }
        let mut unknown = good.clone();
        unknown.extend([0x58, 0x01]); // field 11, varint
        assert!(!agree(&unknown));
        let mut far = good.clone();
        far.extend([0x80, 0x01, 0x01]); // field 16, varint
        assert!(!agree(&far));
        // A key in two bytes where one does: prost takes it, the scan
        // leaves it to prost.
        let mut long_key = vec![0x92, 0x00];
        long_key.extend_from_slice(&good[1..]);
        assert!(decode_connector_message(Bytes::from(long_key.clone())).is_ok());
        assert!(!agree(&long_key));
        let mut twice = good.clone();
        twice.extend_from_slice(&good);
        assert!(!agree(&twice));
    }

    /// An address is read as bytes (its text is not kept); one that is
    /// not UTF-8 still fails prost's decoding, so the scan leaves the
    /// message alone, whether or not its first bytes look like the host's
    /// or a dotted quad.
    #[test]
    fn an_address_that_is_not_utf8_is_left_to_prost() {
        for (host, text) in [
            ("127.0.0.1", "127.0.0.1"),
            ("a.test", "10.0.0.1"),
            ("a.test", "::1"),
            ("::1", "::1"),
        ] {
            let good = message(vec![v1::ApplicationHealth {
                addresses: vec![address(text, 1, 0, "")],
                ..app("seg", host, 80)
            }]);
            assert!(agree(&good), "{host} {text}");
            // The address's last byte, then its first, made invalid UTF-8.
            let at = good
                .windows(text.len())
                .rposition(|w| w == text.as_bytes())
                .unwrap_or_default();
            for i in [at + text.len() - 1, at] {
                let mut bad = good.clone();
                bad[i] = 0xff;
                assert!(decode_connector_message(Bytes::from(bad.clone())).is_err());
                assert!(!agree(&bad), "{host} {text} at {i}");
            }
        }
    }

    fn arb_text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            Just("seg".to_owned()),
            Just("127.0.0.1".to_owned()),
            Just("::1".to_owned()),
            Just("0:0::1".to_owned()),
            Just("A.Test".to_owned()),
            "[a-z0-9.:_ -]{0,12}",
        ]
    }

    prop_compose! {
        fn arb_address()(text in arb_text(), status in -1i32..4, method in -1i32..4,
                         rtt_us in any::<u64>(), failure in -1i32..12, detail in arb_text(),
                         reason in prop::option::of(arb_text()),
                         certificate_not_after_unix_s in prop::option::of(any::<i64>()))
                         -> v1::AddressResult {
            v1::AddressResult { address: text, status, method, rtt_us, failure, detail, reason, certificate_not_after_unix_s }
        }
    }

    prop_compose! {
        fn arb_app()(segment in arb_text(), host in arb_text(), protocol in -1i32..4,
                     port in prop_oneof![Just(0u32), Just(80), Just(65_536), any::<u32>()],
                     has_key in prop::bool::weighted(0.95), status in -1i32..5,
                     addresses in prop::collection::vec(arb_address(), 0..3),
                     checked_at_unix_ms in any::<i64>(), dns_error in arb_text(),
                     expired in any::<bool>(), age_ms in any::<u64>(), access_id in arb_text())
                     -> v1::ApplicationHealth {
            v1::ApplicationHealth {
                app: has_key.then_some(v1::ApplicationKey { segment, host, protocol, port }),
                status, addresses, checked_at_unix_ms, dns_error, expired, age_ms, access_id,
            }
        }
    }

    proptest! {
        /// Random reports: the scan reads exactly those whose every entry
        /// the prost path takes with its host already normalised, with the
        /// same values.
        #[test]
        fn the_scan_and_the_prost_path_agree_on_random_reports(
            apps in prop::collection::vec(arb_app(), 0..4),
            full_state in any::<bool>(),
            sequence in any::<u64>(),
        ) {
            let bytes = v1::ConnectorMessage {
                kind: Some(v1::connector_message::Kind::Report(v1::HealthReport {
                    applications: apps,
                    full_state,
                    sequence,
                })),
            }
            .encode_to_vec();
            let scanned = agree(&bytes);
            let (entries, _, _) = prost_path(&bytes).map_err(TestCaseError::fail)?;
            let takes = entries
                .iter()
                .all(|e| e.as_ref().is_ok_and(|r| Host::normal(r.key.host.as_str()).is_some()));
            // A host the conversion normalised was not in normal form on
            // the wire: those are left to the prost path too.
            let normal_on_wire = {
                let m = decode_connector_message(Bytes::copy_from_slice(&bytes)).map_err(|e| TestCaseError::fail(e.to_string()))?;
                match m.kind {
                    Some(v1::connector_message::Kind::Report(r)) => r.applications.iter().all(|a| a.app.as_ref().is_some_and(|k| Host::normal(&k.host).is_some())),
                    _ => false,
                }
            };
            prop_assert_eq!(scanned, takes && normal_on_wire);
        }

        /// Arbitrary bytes (and damaged reports) never panic, and whatever
        /// the scan reads, the prost path reads the same way.
        #[test]
        fn the_scan_agrees_on_damaged_bytes(
            app in arb_app(),
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            noise in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut bytes = message(vec![app]);
            for (at, byte) in flips {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            agree(&bytes);
            agree(&noise);
        }
    }
}
