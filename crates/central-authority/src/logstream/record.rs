//! One log record: its type, its time and its fields, the same in every
//! format. The replica and the sequence number are added where a record is
//! written for one receiver (`format`).

use std::fmt::Write as _;

/// What a record reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A connector's heartbeat or session change.
    ConnectorStatus,
    /// A health transition of an application on a connector.
    Health,
    /// An access decision.
    Access,
    /// An administrator's action.
    Audit,
}

impl Kind {
    /// Every kind, in the order the configuration lists them.
    pub const ALL: [Kind; 4] = [
        Kind::ConnectorStatus,
        Kind::Health,
        Kind::Access,
        Kind::Audit,
    ];

    /// The name in `type`, in `types = [...]` and in syslog's MSGID.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::ConnectorStatus => "connector_status",
            Kind::Health => "health",
            Kind::Access => "access",
            Kind::Audit => "audit",
        }
    }

    /// The kind a name stands for.
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// A bit of its own, for sets of kinds.
    pub(crate) fn bit(self) -> u8 {
        1 << (self as u8)
    }

    /// The field a receiver's `statuses` filter reads for this kind.
    pub fn status_field(self) -> Field {
        match self {
            Kind::ConnectorStatus => Field::Status,
            Kind::Health => Field::To,
            Kind::Access => Field::Decision,
            Kind::Audit => Field::Outcome,
        }
    }
}

macro_rules! fields {
    ($($variant:ident => $name:literal,)*) => {
        /// A record's field beyond `type`, `time`, `replica` and `seq`; its
        /// order here is the csv/tsv column order.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Field {
            $(
                #[doc = concat!("`", $name, "`")]
                $variant,
            )*
        }

        impl Field {
            /// Every field, in column order.
            pub const ALL: &'static [Field] = &[$(Field::$variant,)*];

            /// Its name in every format.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Field::$variant => $name,)*
                }
            }
        }
    };
}

fields! {
    Connector => "connector",
    Group => "group",
    Segment => "segment",
    Event => "event",
    Status => "status",
    Version => "version",
    Os => "os",
    Arch => "arch",
    ProcessCpuPercent => "process_cpu_percent",
    HostCpuPercent => "host_cpu_percent",
    ProcessMemoryBytes => "process_memory_bytes",
    HostMemoryTotalBytes => "host_memory_total_bytes",
    HostMemoryAvailableBytes => "host_memory_available_bytes",
    Applications => "applications",
    BytesToCa => "bytes_to_ca",
    BytesFromCa => "bytes_from_ca",
    Address => "address",
    Application => "application",
    Host => "host",
    Protocol => "protocol",
    Port => "port",
    From => "from",
    To => "to",
    Decision => "decision",
    RequestId => "request_id",
    Subject => "subject",
    CandidatesHealthy => "candidates_healthy",
    CandidatesTotal => "candidates_total",
    MatchUs => "match_us",
    SelectUs => "select_us",
    TotalUs => "total_us",
    Reason => "reason",
    Actor => "actor",
    Action => "action",
    Target => "target",
    Outcome => "outcome",
    Source => "source",
    Detail => "detail",
}

/// A field's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Text.
    Text(String),
    /// A whole number.
    Int(u64),
    /// A measurement (CPU percent); not finite is written as empty / null.
    Float(f64),
}

impl Value {
    /// The value as text (numbers in decimal; a float with at most two
    /// decimals; a float that is not finite is empty).
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Value::Text(s) => std::borrow::Cow::Borrowed(s),
            Value::Int(n) => std::borrow::Cow::Owned(n.to_string()),
            Value::Float(f) if f.is_finite() => {
                let mut s = String::new();
                let _ = write!(s, "{}", (f * 100.0).round() / 100.0);
                std::borrow::Cow::Owned(s)
            }
            Value::Float(_) => std::borrow::Cow::Borrowed(""),
        }
    }
}

/// One record, built once and shared by every receiver that takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// What it reports.
    pub kind: Kind,
    /// When, in Unix milliseconds.
    pub time_ms: u64,
    /// Its fields in the order formats write them.
    pub fields: Vec<(Field, Value)>,
}

impl Record {
    /// A record of `kind` at `time_ms` without fields.
    pub fn new(kind: Kind, time_ms: u64) -> Record {
        Record {
            kind,
            time_ms,
            fields: Vec::with_capacity(16),
        }
    }

    /// With a text field (left out when `value` is empty).
    #[must_use]
    pub fn text(mut self, field: Field, value: impl Into<String>) -> Record {
        let value = value.into();
        if !value.is_empty() {
            self.fields.push((field, Value::Text(value)));
        }
        self
    }

    /// With a number field.
    #[must_use]
    pub fn int(mut self, field: Field, value: u64) -> Record {
        self.fields.push((field, Value::Int(value)));
        self
    }

    /// With a measurement field.
    #[must_use]
    pub fn float(mut self, field: Field, value: f64) -> Record {
        self.fields.push((field, Value::Float(value)));
        self
    }

    /// The value of `field`, if the record has it.
    pub fn get(&self, field: Field) -> Option<&Value> {
        self.fields
            .iter()
            .find(|(f, _)| *f == field)
            .map(|(_, v)| v)
    }

    /// The text of `field`, if the record has it as text.
    pub fn get_text(&self, field: Field) -> Option<&str> {
        match self.get(field) {
            Some(Value::Text(s)) => Some(s),
            _ => None,
        }
    }
}

/// A connector's session changes or heartbeat as a `connector_status`
/// record: `event` is `heartbeat`, `connected`, `disconnected` or
/// `drained`, `status` `online`, `draining` or `offline`; `s` what its
/// latest heartbeat said of it.
pub fn connector_status(
    time_ms: u64,
    (connector, group): (&str, &str),
    (event, status): (&str, &str),
    s: Option<&protocol::v1::ConnectorStatus>,
    address: Option<std::net::SocketAddr>,
) -> Record {
    let mut r = Record::new(Kind::ConnectorStatus, time_ms)
        .text(Field::Connector, connector)
        .text(Field::Group, group)
        .text(Field::Event, event)
        .text(Field::Status, status);
    if let Some(s) = s {
        r = r
            .text(Field::Version, s.version.as_str())
            .text(Field::Os, s.os.as_str())
            .text(Field::Arch, s.arch.as_str())
            .float(Field::ProcessCpuPercent, s.process_cpu_percent)
            .float(Field::HostCpuPercent, s.host_cpu_percent)
            .int(Field::ProcessMemoryBytes, s.process_memory_bytes)
            .int(Field::HostMemoryTotalBytes, s.host_memory_total_bytes)
            .int(
                Field::HostMemoryAvailableBytes,
                s.host_memory_available_bytes,
            )
            .int(Field::Applications, u64::from(s.applications))
            .int(Field::BytesToCa, s.bytes_sent)
            .int(Field::BytesFromCa, s.bytes_received);
    }
    r.text(
        Field::Address,
        address.map(|a| a.to_string()).unwrap_or_default(),
    )
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds
/// (`2026-12-07T11:12:13.456Z`).
pub fn rfc3339_ms(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let ms = unix_ms % 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 as a proleptic Gregorian (year, month, day)
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339_ms(1_796_641_933_456), "2026-12-07T11:12:13.456Z");
    }

    #[test]
    fn empty_text_is_left_out_and_floats_are_rounded() {
        let r = Record::new(Kind::Audit, 0)
            .text(Field::Actor, "")
            .float(Field::HostCpuPercent, 12.3456)
            .float(Field::ProcessCpuPercent, f64::NAN);
        assert_eq!(r.get(Field::Actor), None);
        assert_eq!(r.fields[0].1.text(), "12.35");
        assert_eq!(r.fields[1].1.text(), "");
    }
}
