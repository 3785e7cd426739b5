//! `[[log_receivers]]`: each entry checked into a `logstream::ReceiverSpec`,
//! every problem named by the receiver and the key.

use std::collections::HashSet;
use std::path::Path;

use crate::logstream::{Destination, Filter, Format, Kind, ReceiverSpec};

use super::file::{DEFAULT_FILE_KEEP, DEFAULT_FILE_MAX_BYTES, ReceiverSection};
use super::{Problem, setting};

/// The receivers of the file; problems go to `problems`.
pub(super) fn receivers(
    sections: &[ReceiverSection],
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Vec<ReceiverSpec> {
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for (i, r) in sections.iter().enumerate() {
        let subject = if r.name.is_empty() {
            format!("log_receivers #{}", i + 1)
        } else {
            format!("log_receivers {:?}", r.name)
        };
        let before = problems.len();
        let name_ok = r.name.len() <= 64
            && !r.name.is_empty()
            && r.name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if !name_ok {
            setting(
                problems,
                format!("{subject}.name"),
                "must be 1 to 64 of a-z, 0-9, _ and -",
            );
        } else if !names.insert(r.name.as_str()) {
            setting(
                problems,
                format!("{subject}.name"),
                "is used by another log receiver",
            );
        }
        let format = Format::parse(&r.format);
        if format.is_none() {
            setting(
                problems,
                format!("{subject}.format"),
                format!(
                    "unknown format {:?} (expected \"json\", \"syslog\", \"csv\" or \"tsv\")",
                    r.format
                ),
            );
        }
        let types = kinds(r, &subject, problems);
        let destination = destination(r, &subject, base, problems);
        r.check_bounds(&subject, problems);
        if let (Some(destination), Some(format), true) =
            (destination, format, problems.len() == before)
        {
            out.push(ReceiverSpec {
                name: r.name.clone(),
                url: r.destination.clone(),
                destination,
                format,
                types,
                filter: Filter {
                    groups: r.filter.groups.clone(),
                    segments: r.filter.segments.clone(),
                    statuses: r.filter.statuses.clone(),
                },
                spool_bytes: r.spool_bytes,
                file_max_bytes: r.file_max_bytes.unwrap_or(DEFAULT_FILE_MAX_BYTES),
                file_keep: r.file_keep.unwrap_or(DEFAULT_FILE_KEEP),
            });
        }
    }
    out
}

fn kinds(r: &ReceiverSection, subject: &str, problems: &mut Vec<Problem>) -> Vec<Kind> {
    let Some(types) = &r.types else {
        return Kind::ALL.to_vec();
    };
    if types.is_empty() {
        setting(
            problems,
            format!("{subject}.types"),
            "is empty (leave it out for every type)",
        );
    }
    let mut out = Vec::new();
    for t in types {
        match Kind::parse(t) {
            Some(k) if !out.contains(&k) => out.push(k),
            Some(_) => {}
            None => setting(
                problems,
                format!("{subject}.types"),
                format!(
                    "unknown type {t:?} (expected \"connector_status\", \"health\", \"access\" or \"audit\")"
                ),
            ),
        }
    }
    out.sort_unstable();
    out
}

/// The destination URL and the keys that go with its scheme.
fn destination(
    r: &ReceiverSection,
    subject: &str,
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Option<Destination> {
    let field = format!("{subject}.destination");
    let expected = "(expected tcp://host:port, tls://host:port or file:///path)";
    let url = match url::Url::parse(&r.destination) {
        Ok(u) => u,
        Err(e) => {
            setting(
                problems,
                field,
                format!("{:?} is not a URL: {e} {expected}", r.destination),
            );
            return None;
        }
    };
    let scheme = url.scheme();
    let tls_keys = [
        ("root_file", r.root_file.is_some()),
        ("server_name", r.server_name.is_some()),
        ("client_cert_file", r.client_cert_file.is_some()),
        ("client_key_file", r.client_key_file.is_some()),
    ];
    if scheme != "tls" {
        for (key, _) in tls_keys.iter().filter(|(_, set)| *set) {
            setting(
                problems,
                format!("{subject}.{key}"),
                "is for tls:// destinations only",
            );
        }
    }
    if scheme != "file" {
        for (key, set) in [
            ("file_max_bytes", r.file_max_bytes.is_some()),
            ("file_keep", r.file_keep.is_some()),
        ] {
            if set {
                setting(
                    problems,
                    format!("{subject}.{key}"),
                    "is for file:// destinations only",
                );
            }
        }
    }
    match scheme {
        "file" => file_destination(&url, &field, problems),
        "tcp" | "tls" => {
            let (host, port) = host_port(&url, &field, problems)?;
            if scheme == "tcp" {
                return Some(Destination::Tcp { host, port });
            }
            tls_destination(r, subject, base, host, port, problems)
        }
        other => {
            setting(
                problems,
                field,
                format!("unknown scheme {other:?} {expected}"),
            );
            None
        }
    }
}

fn file_destination(
    url: &url::Url,
    field: &str,
    problems: &mut Vec<Problem>,
) -> Option<Destination> {
    if url.host_str().is_some_and(|h| !h.is_empty()) {
        setting(
            problems,
            field,
            "a file:// destination names no host (file:///path)",
        );
        return None;
    }
    match url.to_file_path() {
        Ok(path) if url.path().len() > 1 && !url.path().ends_with('/') => {
            Some(Destination::File { path })
        }
        _ => {
            setting(problems, field, "names no file (file:///path)");
            None
        }
    }
}

fn host_port(url: &url::Url, field: &str, problems: &mut Vec<Problem>) -> Option<(String, u16)> {
    let host = match url.host() {
        Some(url::Host::Domain(d)) if !d.is_empty() => d.to_owned(),
        Some(url::Host::Ipv4(a)) => a.to_string(),
        Some(url::Host::Ipv6(a)) => a.to_string(),
        _ => {
            setting(problems, field, "names no host");
            return None;
        }
    };
    let Some(port) = url.port() else {
        setting(problems, field, "names no port");
        return None;
    };
    if !matches!(url.path(), "" | "/") || url.query().is_some() {
        setting(problems, field, "a stream destination is host:port only");
        return None;
    }
    Some((host, port))
}

fn tls_destination(
    r: &ReceiverSection,
    subject: &str,
    base: &Path,
    host: String,
    port: u16,
    problems: &mut Vec<Problem>,
) -> Option<Destination> {
    let client = match (&r.client_cert_file, &r.client_key_file) {
        (Some(c), Some(k)) => Some((base.join(c), base.join(k))),
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            setting(
                problems,
                format!("{subject}.client_cert_file"),
                "client_cert_file and client_key_file go together",
            );
            return None;
        }
    };
    let Some(root_file) = r.root_file.as_ref().map(|f| base.join(f)) else {
        setting(
            problems,
            format!("{subject}.root_file"),
            "is required for a tls:// destination",
        );
        return None;
    };
    // The files are read now, so a wrong one is an error of the
    // configuration rather than of every connection.
    if let Err(e) = crate::logstream::sender::tls_config(&root_file, client.as_ref()) {
        setting(problems, subject.to_owned(), e);
        return None;
    }
    Some(Destination::Tls {
        server_name: r.server_name.clone().unwrap_or_else(|| host.clone()),
        host,
        port,
        root_file,
        client,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;
    use crate::logstream::{Destination, Format, Kind};

    fn messages(receivers: &str) -> Vec<String> {
        match Config::from_toml(receivers, Path::new("/etc/reach")) {
            Ok(_) => Vec::new(),
            Err(e) => e.messages(),
        }
    }

    fn one(receiver: &str) -> String {
        let all = messages(&format!("[[log_receivers]]\nname = \"siem\"\n{receiver}\n"));
        assert_eq!(all.len(), 1, "{receiver}: {all:?}");
        all[0].clone()
    }

    #[test]
    fn a_receiver_is_read_with_its_defaults() {
        let c = Config::from_toml(
            "[[log_receivers]]\nname = \"siem\"\ndestination = \"tcp://[::1]:6514\"\n\
             [[log_receivers]]\nname = \"file\"\ndestination = \"file:///var/log/reach.tsv\"\n\
             format = \"tsv\"\ntypes = [\"audit\", \"access\"]\nfile_keep = 2\n\
             filter = { statuses = [\"refused\"] }\n",
            Path::new("."),
        )
        .expect("valid");
        let [siem, file] = &c.log_receivers[..] else {
            panic!("{:?}", c.log_receivers)
        };
        assert_eq!(
            siem.destination,
            Destination::Tcp {
                host: "::1".into(),
                port: 6514
            }
        );
        assert_eq!(
            (siem.format, &siem.types[..], siem.spool_bytes),
            (Format::Json, &Kind::ALL[..], 64 << 20)
        );
        assert_eq!(
            file.destination,
            Destination::File {
                path: "/var/log/reach.tsv".into()
            }
        );
        assert_eq!(file.types, [Kind::Access, Kind::Audit]);
        assert_eq!((file.file_max_bytes, file.file_keep), (100 << 20, 2));
        assert_eq!(file.filter.statuses, ["refused"]);
    }

    #[test]
    fn each_mistake_names_the_receiver_and_the_key() {
        assert_eq!(
            one("destination = \"udp://siem:514\""),
            "log_receivers \"siem\".destination: unknown scheme \"udp\" (expected tcp://host:port, tls://host:port or file:///path)"
        );
        assert_eq!(
            one("destination = \"tcp://siem\""),
            "log_receivers \"siem\".destination: names no port"
        );
        assert_eq!(
            one("destination = \"tls://siem:6514\""),
            "log_receivers \"siem\".root_file: is required for a tls:// destination"
        );
        assert_eq!(
            one(
                "destination = \"tls://siem:6514\"\nroot_file = \"r.pem\"\nclient_cert_file = \"c.pem\""
            ),
            "log_receivers \"siem\".client_cert_file: client_cert_file and client_key_file go together"
        );
        assert!(
            one("destination = \"tls://siem:6514\"\nroot_file = \"/nonexistent/r.pem\"")
                .starts_with("log_receivers \"siem\": root_file /nonexistent/r.pem: "),
        );
        assert_eq!(
            one("destination = \"tcp://siem:514\"\nroot_file = \"r.pem\""),
            "log_receivers \"siem\".root_file: is for tls:// destinations only"
        );
        assert_eq!(
            one("destination = \"tcp://siem:514\"\nfile_keep = 3"),
            "log_receivers \"siem\".file_keep: is for file:// destinations only"
        );
        assert_eq!(
            one("destination = \"tcp://siem:514\"\nformat = \"cef\""),
            "log_receivers \"siem\".format: unknown format \"cef\" (expected \"json\", \"syslog\", \"csv\" or \"tsv\")"
        );
        assert_eq!(
            one("destination = \"tcp://siem:514\"\ntypes = [\"user_activity\"]"),
            "log_receivers \"siem\".types: unknown type \"user_activity\" (expected \"connector_status\", \"health\", \"access\" or \"audit\")"
        );
        assert_eq!(
            one("destination = \"tcp://siem:514\"\nspool_bytes = 1000"),
            "log_receivers \"siem\".spool_bytes: must be at least 65536"
        );
        assert_eq!(
            one("destination = \"file:///var/log/\""),
            "log_receivers \"siem\".destination: names no file (file:///path)"
        );
        let twice = messages(
            "[[log_receivers]]\nname = \"siem\"\ndestination = \"tcp://a:1\"\n\
             [[log_receivers]]\nname = \"siem\"\ndestination = \"tcp://b:1\"\n",
        );
        assert_eq!(
            twice,
            ["log_receivers \"siem\".name: is used by another log receiver"]
        );
        let bad_name =
            messages("[[log_receivers]]\nname = \"SIEM 1\"\ndestination = \"tcp://a:1\"\n");
        assert_eq!(
            bad_name,
            ["log_receivers \"SIEM 1\".name: must be 1 to 64 of a-z, 0-9, _ and -"]
        );
    }
}
