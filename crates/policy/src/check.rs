//! Application-level checks: what a segment's `check` asks of a TCP port
//! beyond the handshake (a TLS handshake, an HTTP `GET` over TCP or TLS),
//! the status ranges an HTTP answer must fall in, and what a check reports
//! back besides reachability (why it failed, the certificate's expiry).
//!
//! Parsing only: the connector runs the checks. The CA roots a TLS check
//! verifies against are PEM text here (the CA reads `check_ca_file` and
//! sends the content, since the connector runs elsewhere).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// What a TCP port's check does after the handshake.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CheckKind {
    /// The TCP handshake alone (the default).
    #[default]
    Tcp,
    /// A TLS handshake.
    Tls,
    /// One HTTP/1.1 `GET` over TCP.
    Http,
    /// One HTTP/1.1 `GET` over TLS.
    Https,
}

impl CheckKind {
    /// The name in configuration and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            CheckKind::Tcp => "tcp",
            CheckKind::Tls => "tls",
            CheckKind::Http => "http",
            CheckKind::Https => "https",
        }
    }

    /// Whether the check does a TLS handshake.
    pub fn uses_tls(self) -> bool {
        matches!(self, CheckKind::Tls | CheckKind::Https)
    }

    /// Whether the check sends an HTTP request.
    pub fn uses_http(self) -> bool {
        matches!(self, CheckKind::Http | CheckKind::Https)
    }
}

impl FromStr for CheckKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tcp" => Ok(CheckKind::Tcp),
            "tls" => Ok(CheckKind::Tls),
            "http" => Ok(CheckKind::Http),
            "https" => Ok(CheckKind::Https),
            other => Err(format!(
                "unknown check {other:?} (expected \"tcp\", \"tls\", \"http\" or \"https\")"
            )),
        }
    }
}

impl fmt::Display for CheckKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Inclusive HTTP status ranges, e.g. `200-399` or `200,204,300-399`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StatusRanges(Vec<(u16, u16)>);

/// The default `check_expect`.
pub const DEFAULT_EXPECT: &str = "200-399";

impl StatusRanges {
    /// Whether `status` is in one of the ranges.
    pub fn contains(&self, status: u16) -> bool {
        self.0.iter().any(|&(lo, hi)| (lo..=hi).contains(&status))
    }
}

impl Default for StatusRanges {
    fn default() -> Self {
        StatusRanges(vec![(200, 399)])
    }
}

impl FromStr for StatusRanges {
    type Err = String;
    /// Comma-separated statuses and `low-high` ranges, each within 100-599,
    /// low <= high; spaces around items are allowed.
    fn from_str(s: &str) -> Result<Self, String> {
        let status = |t: &str| -> Result<u16, String> {
            match t.trim().parse::<u16>() {
                Ok(n) if (100..=599).contains(&n) => Ok(n),
                _ => Err(format!("{:?} is no HTTP status within 100-599", t.trim())),
            }
        };
        let mut ranges = Vec::new();
        for item in s.split(',') {
            let (lo, hi) = match item.split_once('-') {
                Some((lo, hi)) => (status(lo)?, status(hi)?),
                None => {
                    let n = status(item)?;
                    (n, n)
                }
            };
            if lo > hi {
                return Err(format!("range {:?} ends before it starts", item.trim()));
            }
            ranges.push((lo, hi));
        }
        Ok(StatusRanges(ranges))
    }
}

impl fmt::Display for StatusRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(lo, hi)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

/// A segment's application-level check of its TCP ports.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AppCheck {
    /// What the check does.
    pub kind: CheckKind,
    /// The path an HTTP check requests (starts with `/`; default `/`).
    pub path: String,
    /// The statuses an HTTP check accepts.
    pub expect: StatusRanges,
    /// The roots a TLS check verifies the server with, PEM (at least one
    /// certificate); `None`: no verification (the certificate is still
    /// read for its expiry).
    pub ca_pem: Option<Arc<str>>,
}

impl Default for AppCheck {
    /// The TCP handshake alone.
    fn default() -> Self {
        AppCheck {
            kind: CheckKind::Tcp,
            path: "/".into(),
            expect: StatusRanges::default(),
            ca_pem: None,
        }
    }
}

/// What an application-level check learned besides reachability.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CheckDetail {
    /// Why the check failed, e.g. `http 503`, `tls: certificate expired`
    /// (`None` when it passed).
    pub reason: Option<String>,
    /// The server certificate's notAfter (leaf), Unix seconds, when a TLS
    /// handshake got one.
    pub not_after: Option<i64>,
}

/// The PEM certificates in `pem`: how many, or why none can be used.
pub fn count_pem_certificates(pem: &str) -> Result<usize, String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        cert.map_err(|e| format!("is not valid PEM ({e})"))?;
        count += 1;
    }
    if count == 0 {
        return Err("holds no PEM certificate".into());
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_ranges_parse_and_match() {
        let r: StatusRanges = "200,204, 300-399".parse().expect("valid");
        for (status, ok) in [
            (200, true),
            (201, false),
            (204, true),
            (300, true),
            (399, true),
        ] {
            assert_eq!(r.contains(status), ok, "{status}");
        }
        assert!(!r.contains(400));
        assert_eq!(r.to_string(), "200,204,300-399");
        let d = StatusRanges::default();
        assert!(d.contains(200) && d.contains(399) && !d.contains(199) && !d.contains(400));
        assert_eq!(d.to_string(), DEFAULT_EXPECT);
        assert_eq!(DEFAULT_EXPECT.parse::<StatusRanges>(), Ok(d));
    }

    #[test]
    fn bad_status_ranges_are_refused_with_the_item() {
        for (text, needle) in [
            ("", "\"\" is no HTTP status"),
            ("99", "\"99\""),
            ("600", "\"600\""),
            ("200-", "\"\""),
            ("abc", "\"abc\""),
            ("200,,300", "\"\""),
            ("399-200", "range \"399-200\" ends before it starts"),
            ("100-600", "\"600\""),
        ] {
            let e = text.parse::<StatusRanges>().expect_err(text);
            assert!(e.contains(needle), "{text}: {e}");
        }
        assert!("100-599".parse::<StatusRanges>().is_ok());
    }

    #[test]
    fn pem_certificates_are_counted() {
        let one = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        assert_eq!(count_pem_certificates(one), Ok(1));
        assert_eq!(
            count_pem_certificates(&format!("junk\n{one}more\n{one}")),
            Ok(2)
        );
        assert!(count_pem_certificates("").is_err());
        assert!(count_pem_certificates("-----BEGIN PRIVATE KEY-----\nMIIB\n").is_err());
        assert!(count_pem_certificates("-----BEGIN CERTIFICATE-----\nMIIB\n").is_err());
        assert!(
            count_pem_certificates("-----BEGIN CERTIFICATE-----\n%%\n-----END CERTIFICATE-----")
                .is_err()
        );
    }

    #[test]
    fn check_kinds_parse() {
        for k in [
            CheckKind::Tcp,
            CheckKind::Tls,
            CheckKind::Http,
            CheckKind::Https,
        ] {
            assert_eq!(k.as_str().parse::<CheckKind>(), Ok(k));
        }
        assert!("HTTP".parse::<CheckKind>().is_err());
        assert!(CheckKind::Https.uses_tls() && CheckKind::Https.uses_http());
        assert!(!CheckKind::Tls.uses_http() && !CheckKind::Http.uses_tls());
    }
}
