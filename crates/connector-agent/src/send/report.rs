//! One application's report on its way to the CA, and its one path to the
//! bytes every session sends.
//!
//! The report is `policy::ApplicationReport`, the value the CA decodes: the
//! schedule builds it when a round finishes (or an on-access window ends),
//! with no `age`, since a report's age is how long ago its check finished
//! when a session sends it, and each session sends it at its own time.
//! [`Outgoing`] carries it to the sessions with what only the connector
//! needs: when the check finished on the monotonic clock, whether a user
//! waits for it, and its encoding.
//!
//! Every replica's session sends every report, so its encoding
//! (`protocol`'s conversion to `v1::ApplicationHealth`, then prost) is
//! computed once, by the first session that sends it, and shared by every
//! copy; each session writes the shared bytes followed by its own `age_ms`
//! field ([`Entry`], with `protocol::compose`): the result decodes to
//! exactly the report with its age (the test below checks every field).
//! An expired on-access application's
//! report is made when it is sent (it is stamped with that time), so it is
//! encoded per send.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use policy::{AppKey, ApplicationReport};
use prost::Message;
use protocol::compose::{self, ReportWriter};
use protocol::v1;

/// A report's shared encoding (without `age_ms`), computed by the first
/// session that sends it. Clones share it; it is not part of the report's
/// value (every `Encoding` equals every other).
#[derive(Clone, Default)]
pub struct Encoding(Arc<OnceLock<Vec<u8>>>);

impl std::fmt::Debug for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Encoding")
    }
}

impl PartialEq for Encoding {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Encoding {
    /// The shared bytes, once a session computed them.
    pub fn get(&self) -> Option<&[u8]> {
        self.0.get().map(Vec::as_slice)
    }
}

/// One application's report from the schedule to every session's outbox.
#[derive(Clone, Debug, PartialEq)]
pub struct Outgoing {
    /// The report, its `age` zero (each send adds its own). For an expired
    /// application: Unknown, no addresses, `expired`, stamped when sent.
    pub report: ApplicationReport,
    /// When the round behind the report finished, on the monotonic clock
    /// (None for an expired application): the report's age is measured
    /// from here when it is sent, so a re-sent result keeps its true age
    /// whatever the clocks of connector and CA say.
    pub checked: Option<Instant>,
    /// The result of a round a user's access triggered: the CA holds that
    /// user's request until it arrives, so it goes out at once rather than
    /// after the outbox's batch window.
    pub awaited: bool,
    /// The report's encoding, shared by every replica's copy.
    pub encoding: Encoding,
}

impl Outgoing {
    /// A report whose check finished at `checked`.
    pub fn checked(report: ApplicationReport, checked: Instant, awaited: bool) -> Outgoing {
        Outgoing {
            report,
            checked: Some(checked),
            awaited,
            encoding: Encoding::default(),
        }
    }

    /// The report that an on-access application's window ended: Unknown,
    /// no longer checked, with the window's access id.
    pub fn expired(key: AppKey, access_id: Option<String>) -> Outgoing {
        Outgoing {
            report: ApplicationReport {
                key,
                status: policy::Status::Unknown,
                addresses: Vec::new(),
                checked_at_unix_ms: 0,
                dns_error: None,
                expired: true,
                age: Duration::ZERO,
                access_id,
            },
            checked: None,
            awaited: false,
            encoding: Encoding::default(),
        }
    }

    /// Which application.
    pub fn key(&self) -> &AppKey {
        &self.report.key
    }

    /// How old the report is when sent at `sent` (monotonic).
    pub fn age(&self, sent: Instant) -> Duration {
        self.checked
            .map_or(Duration::ZERO, |at| sent.saturating_duration_since(at))
    }

    /// The report as the CA receives it when sent at `wall` (wall clock)
    /// and `sent` (monotonic): with its age, and, expired, stamped `wall`.
    pub fn as_sent(&self, wall: SystemTime, sent: Instant) -> ApplicationReport {
        let mut report = self.report.clone();
        report.age = self.age(sent);
        if self.checked.is_none() {
            report.checked_at_unix_ms = unix_ms(wall);
        }
        report
    }

    /// The entry a session sends at `wall` and `sent`.
    pub fn entry(&self, wall: SystemTime, sent: Instant) -> Entry {
        let age_ms = u64::try_from(self.age(sent).as_millis()).unwrap_or(u64::MAX);
        let body = if self.checked.is_some() {
            // Everything but the age is fixed once the round finished.
            self.encoding.0.get_or_init(|| encode(&self.report));
            Body::Shared(self.encoding.clone())
        } else {
            Body::Own(encode(&self.as_sent(wall, sent)))
        };
        Entry { body, age_ms }
    }
}

/// A report's encoding; its `age_ms` is written per send (zero here).
fn encode(report: &ApplicationReport) -> Vec<u8> {
    debug_assert!(report.age.is_zero(), "the age is written per send");
    v1::ApplicationHealth::from(report).encode_to_vec()
}

/// Unix milliseconds of `t` (0 before the epoch).
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// One entry of a report as a session sends it: the report's bytes without
/// `age_ms`, and its `age_ms`.
#[derive(Clone, Debug)]
pub struct Entry {
    body: Body,
    age_ms: u64,
}

#[derive(Clone, Debug)]
enum Body {
    /// The report's shared encoding.
    Shared(Encoding),
    /// Encoded for this send alone (an expired application).
    Own(Vec<u8>),
}

impl Entry {
    fn body(&self) -> &[u8] {
        match &self.body {
            Body::Shared(encoding) => encoding.get().unwrap_or(&[]),
            Body::Own(bytes) => bytes,
        }
    }

    /// The entry's encoded length (without its tag and length prefix).
    pub fn len(&self) -> usize {
        compose::entry_len(self.body().len(), self.age_ms)
    }

    /// Whether the entry encodes to nothing (never: an entry has a key).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the entry to a report.
    pub fn write(&self, report: &mut ReportWriter) {
        report.entry(self.body(), self.age_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use policy::{AddressResult, Method, Protocol, Status as Health};

    use crate::send::wire::Report;

    fn outgoing(host: &str, checked: Option<Instant>, access_id: bool) -> Outgoing {
        let key = AppKey {
            segment: "seg".into(),
            host: host.parse().expect("host"),
            protocol: Protocol::Tcp,
            port: 8443,
        };
        let access_id = access_id.then(|| "acc-1".to_owned());
        let Some(checked) = checked else {
            return Outgoing::expired(key, access_id);
        };
        let report = ApplicationReport {
            key,
            status: Health::Unhealthy,
            addresses: vec![
                AddressResult {
                    check: None,
                    address: "10.0.0.1".parse().expect("ip"),
                    reachable: true,
                    method: Method::Tcp,
                    rtt: Duration::from_micros(1500),
                    failure: None,
                },
                AddressResult {
                    check: None,
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
            checked_at_unix_ms: unix_ms(SystemTime::now() - Duration::from_secs(3)),
            dns_error: Some("SERVFAIL".into()),
            expired: false,
            age: Duration::ZERO,
            access_id,
        };
        Outgoing::checked(report, checked, false)
    }

    #[test]
    fn a_shared_encoding_decodes_to_the_report_as_sent() {
        let t0 = Instant::now();
        let now = SystemTime::now();
        let reports = [
            outgoing("app.test", Some(t0), true),
            outgoing("10.1.2.3", Some(t0 + Duration::from_millis(5)), false),
            // Checked just now: age 0, no age field.
            outgoing("zero.test", Some(t0 + Duration::from_millis(1234)), false),
            // Expired: no round, stamped with the send time.
            outgoing("gone.test", None, true),
        ];
        // A replica that sends first fills the shared encodings; the copy a
        // second replica holds reuses them with its own ages.
        let copies = reports.clone();
        for (sent, list) in [
            (t0 + Duration::from_millis(1234), &reports),
            (t0 + Duration::from_millis(99_999), &copies),
        ] {
            let encoded = Report {
                entries: list.iter().map(|r| r.entry(now, sent)).collect(),
                full_state: true,
                sequence: 300,
            };
            let want = v1::HealthReport {
                applications: list
                    .iter()
                    .map(|r| v1::ApplicationHealth::from(r.as_sent(now, sent)))
                    .collect(),
                full_state: true,
                sequence: 300,
            };
            assert_eq!(encoded.message().expect("decodes"), want);
            for (entry, wire) in encoded.entries.iter().zip(&want.applications) {
                assert_eq!(entry.len(), wire.encoded_len());
            }
        }
        assert!(copies[0].encoding.get().is_some(), "shared by the copies");
        assert_eq!(
            reports[2].encoding.get().map(<[u8]>::len),
            Some(
                v1::ApplicationHealth::from(
                    reports[2].as_sent(now, t0 + Duration::from_millis(1234))
                )
                .encoded_len()
            )
        );
        let expired = reports[3].as_sent(now, t0);
        assert_eq!(expired.checked_at_unix_ms, unix_ms(now));
        assert_eq!(expired.age, Duration::ZERO);
    }
}
