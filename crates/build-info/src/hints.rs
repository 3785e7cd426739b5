//! The hints both binaries print with an error an operator can fix, one
//! copy of the words for both: each ends with [`see`] naming its heading of
//! the book's Troubleshooting page (`book/src/troubleshooting.md`), so a
//! hint leads to its entry and a test pairs them.
//!
//! **Invariant:** every heading in [`HEADINGS`] is a `## ` heading of that
//! page (tested here); every heading of that page is in [`HEADINGS`] or
//! names an HTTP error reason (tested by the CA, which owns the reasons).

use std::path::Path;

/// The CA's certificate does not chain to the root the client trusts.
pub const CHAIN: &str = "The CA's certificate does not chain (wrong `--ca-cert`)";
/// The CA's certificate does not name the host the client dials.
pub const NAME: &str = "The CA's certificate does not name the address dialled";
/// The CA no longer accepts the connector's certificate.
pub const REENROLL: &str = "Re-enrollment needed";
/// The CA's compatibility policy refuses the connector's release.
pub const RELEASE: &str = "The CA refuses this connector's release";
/// The connector can open no ICMP socket.
pub const ICMP: &str = "ICMP not permitted";
/// A configuration file the CA refuses.
pub const CONFIG: &str = "A configuration is refused";

/// Every heading a hint names.
pub const HEADINGS: &[&str] = &[CHAIN, NAME, REENROLL, RELEASE, ICMP, CONFIG];

/// The reference a hint ends with: `see Troubleshooting: HEADING`.
pub fn see(heading: &str) -> String {
    format!("see Troubleshooting: {heading}")
}

/// The CA's certificate does not chain to the root in `root_file` (the
/// `--ca-cert` file; `None` when it was not given).
pub fn chain(root_file: Option<&Path>) -> String {
    let what = match root_file {
        Some(path) => format!(
            "the CA's certificate does not chain to the root in {} (--ca-cert): check that the file is the CA's data_dir/ca.pem",
            path.display()
        ),
        None => "the CA's certificate does not chain to the trusted root: check --ca-cert (the CA's data_dir/ca.pem)".to_owned(),
    };
    format!("{what}; {}", see(CHAIN))
}

/// The CA's server certificate does not name `dialled` (`None` when the
/// error did not say), the host given by the client's flag `flag`
/// (`--ca`, `--url`).
pub fn name(dialled: Option<&str>, flag: &str) -> String {
    let what = match dialled {
        Some(name) => format!(
            "the CA's server certificate does not name \"{name}\", the name dialled ({flag}): add \"{name}\" to [tls] server_names on the CA and restart it, or dial a name the certificate carries"
        ),
        None => format!(
            "the CA's server certificate does not name the host dialled ({flag}): add that name to [tls] server_names on the CA and restart it, or dial a name the certificate carries"
        ),
    };
    format!("{what}; {}", see(NAME))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `## ` headings of the book's Troubleshooting page.
    fn headings() -> Vec<String> {
        let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../book/src/troubleshooting.md");
        let text = std::fs::read_to_string(&page).expect("book/src/troubleshooting.md");
        text.lines()
            .filter_map(|l| l.strip_prefix("## "))
            .map(|h| h.trim().to_owned())
            .collect()
    }

    #[test]
    fn every_hint_names_a_heading_of_the_troubleshooting_page() {
        let page = headings();
        for heading in HEADINGS {
            assert!(
                page.iter().any(|h| h == heading),
                "a hint names \"{heading}\", which is no heading of troubleshooting.md: {page:?}"
            );
        }
        for hint in [
            chain(Some(Path::new("/etc/reach/ca.pem"))),
            chain(None),
            name(Some("10.77.0.1"), "--ca"),
            name(None, "--url"),
        ] {
            let (_, heading) = hint
                .rsplit_once("; see Troubleshooting: ")
                .unwrap_or_else(|| panic!("no reference in {hint:?}"));
            assert!(page.iter().any(|h| h == heading), "{hint:?}");
        }
    }
}
