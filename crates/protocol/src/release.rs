//! Which connector releases a CA works with: the release this contract
//! is (the workspace's version), the release a connector states in
//! `Hello.release`, and the rule between them, written once for both
//! binaries (the CA enforces it at `Hello`; the connector says its own).
//!
//! The rule (`proto/reach/v1/connector.proto`, the book's "Rolling
//! upgrades"): a CA accepts a connector whose release has the CA's major
//! version and a minor version at most one apart from the CA's, either
//! way. Patch releases never matter. An empty `Hello.release` is a
//! connector written before the field existed, against release 0.1.

use std::fmt;

/// This contract's release: the version of the workspace that built it
/// (`MAJOR.MINOR.PATCH`), what reach's own connector sends in
/// `Hello.release`.
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// How far apart (in minor releases, same major) a connector and a CA may
/// be.
pub const MINOR_SKEW: u64 = 1;

/// A release as the rule compares it: major and minor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release {
    /// Major version.
    pub major: u64,
    /// Minor version.
    pub minor: u64,
}

impl Release {
    /// What an empty `Hello.release` stands for: the field came with
    /// release 0.2, so a connector that leaves it empty was written
    /// against 0.1.
    pub const UNSTATED: Release = Release { major: 0, minor: 1 };

    /// `MAJOR.MINOR` or `MAJOR.MINOR.PATCH`, each a decimal number,
    /// optionally followed by a semver pre-release (`-rc.1`) or build
    /// (`+abc`) part, which is ignored like the patch.
    pub fn parse(text: &str) -> Result<Release, Malformed> {
        let malformed = || Malformed(text.chars().take(64).collect());
        let core = text.split(['-', '+']).next().unwrap_or_default();
        let mut parts = core.split('.');
        let mut number = || -> Result<u64, Malformed> {
            let part = parts.next().ok_or_else(malformed)?;
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(malformed());
            }
            part.parse().map_err(|_| malformed())
        };
        let (major, minor) = (number()?, number()?);
        match (parts.next(), parts.next()) {
            (None, _) => {}
            (Some(patch), None)
                if !patch.is_empty() && patch.bytes().all(|b| b.is_ascii_digit()) => {}
            _ => return Err(malformed()),
        }
        Ok(Release { major, minor })
    }

    /// This contract's release ([`RELEASE`]).
    pub fn current() -> Release {
        // The workspace's version is a valid release (a unit test holds
        // it to that); the fallback only keeps this total.
        Release::parse(RELEASE).unwrap_or(Release::UNSTATED)
    }

    /// The release a connector's `Hello.release` states (`UNSTATED` when
    /// empty).
    pub fn of_hello(field: &str) -> Result<Release, Malformed> {
        if field.is_empty() {
            Ok(Release::UNSTATED)
        } else {
            Release::parse(field)
        }
    }

    /// The oldest and newest connector releases a CA of this release
    /// accepts.
    pub fn window(self) -> (Release, Release) {
        (
            Release {
                major: self.major,
                minor: self.minor.saturating_sub(MINOR_SKEW),
            },
            Release {
                major: self.major,
                minor: self.minor.saturating_add(MINOR_SKEW),
            },
        )
    }

    /// Whether a CA of this release accepts a connector that sent
    /// `hello_release` (`Hello.release`); the refusal says why.
    pub fn accepts(self, hello_release: &str) -> Result<Release, Incompatible> {
        let connector = Release::of_hello(hello_release).map_err(Incompatible::Malformed)?;
        let (oldest, newest) = self.window();
        let ca = self;
        if connector < oldest {
            Err(Incompatible::TooOld {
                connector,
                ca,
                unstated: hello_release.is_empty(),
            })
        } else if connector > newest {
            Err(Incompatible::TooNew { connector, ca })
        } else {
            Ok(connector)
        }
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A `Hello.release` that is not `MAJOR.MINOR[.PATCH]` (the text, cut to
/// 64 characters).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "Hello.release {0:?} is not a release: send MAJOR.MINOR or MAJOR.MINOR.PATCH (the reach release whose proto/ the connector implements, e.g. {RELEASE:?})"
)]
pub struct Malformed(pub String);

/// Why a CA refuses a connector's release.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Incompatible {
    /// The connector is more than one minor release behind the CA.
    #[error(
        "connector release {connector}{} is too old for this CA (release {ca}): {policy}; upgrade the connector to {} or later",
        if *unstated { " (Hello.release is empty: written before release 0.2)" } else { "" },
        ca.window().0,
        policy = Policy(*ca)
    )]
    TooOld {
        /// What the connector stated (or `UNSTATED`).
        connector: Release,
        /// The CA's.
        ca: Release,
        /// Whether `Hello.release` was empty.
        unstated: bool,
    },
    /// The connector is more than one minor release ahead of the CA.
    #[error(
        "connector release {connector} is too new for this CA (release {ca}): {policy}; upgrade the CA to {} or later first",
        Release { major: connector.major, minor: connector.minor.saturating_sub(MINOR_SKEW) },
        policy = Policy(*ca)
    )]
    TooNew {
        /// What the connector stated.
        connector: Release,
        /// The CA's.
        ca: Release,
    },
    /// `Hello.release` is not a release.
    #[error(transparent)]
    Malformed(#[from] Malformed),
}

impl Incompatible {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Incompatible::TooOld { .. } => "release_too_old",
            Incompatible::TooNew { .. } => "release_too_new",
            Incompatible::Malformed(_) => "release_malformed",
        }
    }
}

/// The rule as one sentence, for a CA of release `.0`.
struct Policy(Release);

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (oldest, newest) = self.0.window();
        write!(
            f,
            "the compatibility policy accepts connectors of the CA's major release within {MINOR_SKEW} minor release of it, either way (here {oldest} to {newest})"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(major: u64, minor: u64) -> Release {
        Release { major, minor }
    }

    #[test]
    fn releases_parse_as_major_and_minor() {
        for (text, want) in [
            ("0.2", r(0, 2)),
            ("0.2.0", r(0, 2)),
            ("0.2.17", r(0, 2)),
            ("1.10.3-rc.1", r(1, 10)),
            ("0.3.0+abc", r(0, 3)),
            ("12.0", r(12, 0)),
        ] {
            assert_eq!(Release::parse(text), Ok(want), "{text}");
        }
        // The pre-release part is free text.
        assert_eq!(Release::parse("0.0.1-broken.x.y"), Ok(r(0, 0)));
        for bad in [
            "",
            "0",
            "1.",
            ".1",
            "0.x",
            "a.b",
            "0.2.0.1",
            "0.2.",
            "-0.2",
            "0.-2",
            " 0.2",
            "0.2 ",
            "v0.2",
            "99999999999999999999.1",
        ] {
            assert!(Release::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn the_workspace_version_is_a_release() {
        assert_eq!(
            Release::parse(RELEASE).ok(),
            Some(Release::current()),
            "{RELEASE}"
        );
    }

    #[test]
    fn a_ca_accepts_one_minor_release_either_way() {
        let ca = r(0, 2);
        for ok in ["0.1", "0.1.9", "0.2.0", "0.2.5-rc.1", "0.3", "0.3.4", ""] {
            assert!(ca.accepts(ok).is_ok(), "{ok:?} refused");
        }
        assert_eq!(ca.accepts(""), Ok(Release::UNSTATED));
        assert_eq!(
            ca.accepts("0.0.9"),
            Err(Incompatible::TooOld {
                connector: r(0, 0),
                ca,
                unstated: false
            })
        );
        assert_eq!(
            ca.accepts("0.4.0"),
            Err(Incompatible::TooNew {
                connector: r(0, 4),
                ca
            })
        );
        // Another major is never within the window.
        assert!(matches!(
            ca.accepts("1.2"),
            Err(Incompatible::TooNew { .. })
        ));
        assert!(matches!(
            r(1, 0).accepts("0.9"),
            Err(Incompatible::TooOld { .. })
        ));
        assert!(matches!(
            ca.accepts("latest"),
            Err(Incompatible::Malformed(_))
        ));
        // A CA two minors on refuses what an empty field stands for.
        assert_eq!(
            r(0, 3).accepts(""),
            Err(Incompatible::TooOld {
                connector: Release::UNSTATED,
                ca: r(0, 3),
                unstated: true
            })
        );
        // At minor 0 the window does not wrap.
        assert_eq!(r(1, 0).window(), (r(1, 0), r(1, 1)));
    }

    #[test]
    fn a_refusal_names_both_releases_and_the_rule() {
        let ca = r(0, 2);
        let old = ca.accepts("0.0.3").err().map(|e| e.to_string());
        assert_eq!(
            old.as_deref(),
            Some(
                "connector release 0.0 is too old for this CA (release 0.2): the compatibility policy accepts connectors of the CA's major release within 1 minor release of it, either way (here 0.1 to 0.3); upgrade the connector to 0.1 or later"
            )
        );
        let new = ca.accepts("0.5.1").err().map(|e| e.to_string());
        assert_eq!(
            new.as_deref(),
            Some(
                "connector release 0.5 is too new for this CA (release 0.2): the compatibility policy accepts connectors of the CA's major release within 1 minor release of it, either way (here 0.1 to 0.3); upgrade the CA to 0.4 or later first"
            )
        );
        let unstated = r(0, 3).accepts("").err().map(|e| e.to_string());
        assert!(
            unstated.as_deref().is_some_and(|m| m.starts_with(
                "connector release 0.1 (Hello.release is empty: written before release 0.2) is too old for this CA (release 0.3)"
            )),
            "{unstated:?}"
        );
        let bad = ca.accepts("latest").err().map(|e| e.to_string());
        assert!(
            bad.as_deref()
                .is_some_and(|m| m.contains("\"latest\"") && m.contains("MAJOR.MINOR")),
            "{bad:?}"
        );
    }

    #[test]
    fn the_contract_states_its_release() {
        let proto = include_str!("../../../proto/reach/v1/connector.proto");
        let stated = format!("This contract is reach release {}.", Release::current());
        assert!(
            proto.contains(&stated),
            "proto/reach/v1/connector.proto must say {stated:?} (the workspace version is {RELEASE}): third-party connectors fill Hello.release from it"
        );
    }
}
