//! A record as bytes in each format: pure functions, no I/O.
//!
//! - `json`: one object per line, `type`, `time`, `replica`, `seq` first,
//!   then the record's fields; numbers as JSON numbers.
//! - `syslog`: RFC 5424, `<PRI>1 TIME HOST central-authority - MSGID
//!   [reach@32473 ...] MSG`, facility 13 (log audit); over tcp/tls framed
//!   by octet counting (RFC 6587), in a file one message a line.
//! - `csv` / `tsv`: one row per record under a header naming every column
//!   (`columns`); csv quotes as RFC 4180, tsv escapes `\t`, `\n`, `\r` and
//!   `\` with a backslash.

use std::fmt::Write as _;

use super::record::{Field, Kind, Record, Value, rfc3339_ms};

/// How records are written for a receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JSON lines.
    Json,
    /// RFC 5424 syslog with structured data.
    Syslog,
    /// Comma-separated values with a header.
    Csv,
    /// Tab-separated values with a header.
    Tsv,
}

impl Format {
    /// The name in `format = "..."`.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Syslog => "syslog",
            Format::Csv => "csv",
            Format::Tsv => "tsv",
        }
    }

    /// The format a name stands for.
    pub fn parse(name: &str) -> Option<Format> {
        [Format::Json, Format::Syslog, Format::Csv, Format::Tsv]
            .into_iter()
            .find(|f| f.as_str() == name)
    }
}

/// The structured data's SD-ID: `reach` at the documentation PEN.
pub const SD_ID: &str = "reach@32473";
/// Syslog's APP-NAME.
pub const APP_NAME: &str = "central-authority";
/// Syslog facility 13, log audit.
const FACILITY: u8 = 13;

/// Every column of csv and tsv, in order.
pub fn columns() -> impl Iterator<Item = &'static str> {
    ["type", "time", "replica", "seq"]
        .into_iter()
        .chain(Field::ALL.iter().map(|f| f.as_str()))
}

/// The header line of csv and tsv (with its newline), `None` for the other
/// formats.
pub fn header(format: Format) -> Option<Vec<u8>> {
    let sep = match format {
        Format::Csv => ",",
        Format::Tsv => "\t",
        Format::Json | Format::Syslog => return None,
    };
    let mut line = columns().collect::<Vec<_>>().join(sep);
    line.push('\n');
    Some(line.into_bytes())
}

/// The message of `record` as written for one receiver, without framing.
pub fn message(format: Format, record: &Record, replica: &str, seq: u64) -> Vec<u8> {
    let text = match format {
        Format::Json => json(record, replica, seq),
        Format::Syslog => syslog(record, replica, seq),
        Format::Csv => row(record, replica, seq, ',', csv_cell),
        Format::Tsv => row(record, replica, seq, '\t', tsv_cell),
    };
    text.into_bytes()
}

/// Appends `message` to `out` framed for the transport: octet counting for
/// syslog over a stream (`stream`), else the message and a newline.
pub fn frame(format: Format, stream: bool, message: &[u8], out: &mut Vec<u8>) {
    if format == Format::Syslog && stream {
        out.extend_from_slice(message.len().to_string().as_bytes());
        out.push(b' ');
        out.extend_from_slice(message);
    } else {
        out.extend_from_slice(message);
        out.push(b'\n');
    }
}

fn json(record: &Record, replica: &str, seq: u64) -> String {
    let mut s = String::with_capacity(256);
    s.push_str("{\"type\":");
    json_string(&mut s, record.kind.as_str());
    s.push_str(",\"time\":");
    json_string(&mut s, &rfc3339_ms(record.time_ms));
    s.push_str(",\"replica\":");
    json_string(&mut s, replica);
    let _ = write!(s, ",\"seq\":{seq}");
    for (field, value) in &record.fields {
        s.push(',');
        json_string(&mut s, field.as_str());
        s.push(':');
        match value {
            Value::Text(t) => json_string(&mut s, t),
            Value::Int(n) => {
                let _ = write!(s, "{n}");
            }
            Value::Float(f) if f.is_finite() => s.push_str(&value.text()),
            Value::Float(_) => s.push_str("null"),
        }
    }
    s.push('}');
    s
}

fn json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The syslog severity of a record: warning for what went down, notice
/// for refusals and failures, informational otherwise.
fn severity(record: &Record) -> u8 {
    match record.get_text(record.kind.status_field()) {
        Some("down" | "unhealthy" | "offline") => 4,
        Some("refused" | "failure" | "failed" | "denied") => 5,
        _ => 6,
    }
}

/// Text fit for a syslog header field: printable US-ASCII without spaces,
/// at most `max` characters; `-` when nothing is left.
fn header_field(text: &str, max: usize) -> String {
    let s: String = text
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(max)
        .collect();
    if s.is_empty() { "-".to_owned() } else { s }
}

fn syslog(record: &Record, replica: &str, seq: u64) -> String {
    let pri = FACILITY * 8 + severity(record);
    let mut s = String::with_capacity(320);
    let _ = write!(
        s,
        "<{pri}>1 {} {} {APP_NAME} - {} [{SD_ID} replica=\"",
        rfc3339_ms(record.time_ms),
        header_field(replica, 255),
        record.kind.as_str(),
    );
    sd_value(&mut s, replica);
    let _ = write!(s, "\" seq=\"{seq}\"");
    for (field, value) in &record.fields {
        let _ = write!(s, " {}=\"", field.as_str());
        sd_value(&mut s, &value.text());
        s.push('"');
    }
    s.push_str("] ");
    s.push_str(&summary(record).replace(['\n', '\r'], " "));
    s
}

/// An SD-PARAM value: `"`, `\` and `]` escaped with a backslash.
fn sd_value(out: &mut String, text: &str) {
    for c in text.chars() {
        if matches!(c, '"' | '\\' | ']') {
            out.push('\\');
        }
        out.push(c);
    }
}

/// The short human line of a syslog message.
fn summary(r: &Record) -> String {
    let t = |f| {
        r.get(f)
            .map(|v: &Value| v.text().into_owned())
            .unwrap_or_default()
    };
    match r.kind {
        Kind::ConnectorStatus => format!(
            "connector {} of {}: {} ({})",
            t(Field::Connector),
            t(Field::Group),
            t(Field::Event),
            t(Field::Status)
        ),
        Kind::Health => format!(
            "{} {}/{} on {}: {} -> {}",
            t(Field::Application),
            t(Field::Protocol),
            t(Field::Port),
            t(Field::Connector),
            t(Field::From),
            t(Field::To)
        ),
        Kind::Access => format!(
            "access to {} {}/{}: {} {}",
            t(Field::Host),
            t(Field::Protocol),
            t(Field::Port),
            t(Field::Decision),
            t(Field::Reason)
        ),
        Kind::Audit => format!(
            "{} {} {}: {}",
            t(Field::Actor),
            t(Field::Action),
            t(Field::Target),
            t(Field::Outcome)
        ),
    }
}

fn row(record: &Record, replica: &str, seq: u64, sep: char, cell: fn(&mut String, &str)) -> String {
    let mut s = String::with_capacity(256);
    cell(&mut s, record.kind.as_str());
    s.push(sep);
    cell(&mut s, &rfc3339_ms(record.time_ms));
    s.push(sep);
    cell(&mut s, replica);
    let _ = write!(s, "{sep}{seq}");
    for field in Field::ALL {
        s.push(sep);
        if let Some(v) = record.get(*field) {
            cell(&mut s, &v.text());
        }
    }
    s
}

/// A csv cell, quoted (RFC 4180) when it holds `,`, `"`, CR or LF.
fn csv_cell(out: &mut String, text: &str) {
    if text.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&text.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(text);
    }
}

/// A tsv cell: tab, newline, carriage return and backslash escaped.
fn tsv_cell(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-07T11:12:13.456Z
    const T: u64 = 1_796_641_933_456;

    fn audit() -> Record {
        Record::new(Kind::Audit, T)
            .text(Field::Actor, "token \"ops\"")
            .text(Field::Action, "drain")
            .text(Field::Target, "conn-1]x\\y")
            .text(Field::Outcome, "ok")
            .text(Field::Detail, "a,b\nc")
    }

    fn access() -> Record {
        Record::new(Kind::Access, T)
            .text(Field::Host, "jira.example.test")
            .int(Field::Port, 443)
            .text(Field::Decision, "refused")
            .float(Field::HostCpuPercent, 1.5)
    }

    #[test]
    fn json_is_one_object_with_common_fields_first() {
        let m = message(Format::Json, &audit(), "r1", 7);
        assert_eq!(
            String::from_utf8(m).unwrap(),
            r#"{"type":"audit","time":"2026-12-07T11:12:13.456Z","replica":"r1","seq":7,"actor":"token \"ops\"","action":"drain","target":"conn-1]x\\y","outcome":"ok","detail":"a,b\nc"}"#
        );
        let m = message(Format::Json, &access(), "r1", 8);
        assert_eq!(
            String::from_utf8(m).unwrap(),
            r#"{"type":"access","time":"2026-12-07T11:12:13.456Z","replica":"r1","seq":8,"host":"jira.example.test","port":443,"decision":"refused","host_cpu_percent":1.5}"#
        );
    }

    #[test]
    fn syslog_escapes_sd_values_and_frames_by_octet_count() {
        let m = message(Format::Syslog, &audit(), "r 1", 7);
        let text = "<110>1 2026-12-07T11:12:13.456Z r1 central-authority - audit \
            [reach@32473 replica=\"r 1\" seq=\"7\" actor=\"token \\\"ops\\\"\" action=\"drain\" \
            target=\"conn-1\\]x\\\\y\" outcome=\"ok\" detail=\"a,b\nc\"] \
            token \"ops\" drain conn-1]x\\y: ok";
        assert_eq!(String::from_utf8(m.clone()).unwrap(), text);
        let mut out = Vec::new();
        frame(Format::Syslog, true, &m, &mut out);
        assert_eq!(out, format!("{} {text}", text.len()).into_bytes());
        let mut line = Vec::new();
        frame(Format::Syslog, false, &m, &mut line);
        assert_eq!(line, format!("{text}\n").into_bytes());
        // A refusal is a notice (13 * 8 + 5).
        let m = message(Format::Syslog, &access(), "r1", 1);
        assert!(m.starts_with(b"<109>1 "), "{}", String::from_utf8_lossy(&m));
    }

    #[test]
    fn csv_and_tsv_have_one_column_set_under_a_header() {
        let head = String::from_utf8(header(Format::Csv).unwrap()).unwrap();
        assert!(head.starts_with("type,time,replica,seq,connector,group,segment,event,status,"));
        assert!(head.ends_with(",actor,action,target,outcome,source,detail\n"));
        let n = columns().count();
        let empties = |k: usize| ",".repeat(k);
        let row = String::from_utf8(message(Format::Csv, &audit(), "r1", 7)).unwrap();
        assert_eq!(
            row,
            format!(
                "audit,2026-12-07T11:12:13.456Z,r1,7{}\"token \"\"ops\"\"\",drain,conn-1]x\\y,ok,,\"a,b\nc\"",
                empties(n - 4 - 6 + 1)
            )
        );
        let row = String::from_utf8(message(Format::Tsv, &audit(), "r1", 7)).unwrap();
        assert_eq!(row.split('\t').count(), n);
        assert!(
            row.ends_with("\ttoken \"ops\"\tdrain\tconn-1]x\\\\y\tok\t\ta,b\\nc"),
            "{row:?}"
        );
        assert_eq!(header(Format::Json), None);
        let mut out = Vec::new();
        frame(Format::Csv, true, b"a,b", &mut out);
        assert_eq!(out, b"a,b\n");
    }
}
