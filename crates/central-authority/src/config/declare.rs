//! How a section of `ca.toml` is declared: each key once, with its type,
//! default, bounds, allowed values, whether a reload applies it and its
//! line in the reference. `section!` makes from
//! that one declaration the serde struct with its `Default`, the check of
//! the bounds and the reference's rows, so none of them can say something
//! the others do not.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::Problem;
use crate::ground::secret::Secret;

/// Whether a reload applies a key, or only the next start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applies {
    /// A reload applies it.
    Reload,
    /// Read once, at start; a reload that changes it logs that it takes
    /// effect at the next start.
    Restart,
}

/// A key's default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyDefault {
    /// The TOML value serde fills in when the key is absent, written from
    /// the declared default itself.
    Value(String),
    /// No value of its own: what absence means.
    Absent(&'static str),
}

/// One key of the reference.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Its section.
    pub section: &'static str,
    /// Its name.
    pub key: &'static str,
    /// Its TOML type.
    pub ty: &'static str,
    /// Its default.
    pub default: KeyDefault,
    /// Inclusive numeric bounds the CA enforces (`None` upper: unbounded).
    pub bounds: Option<(u64, Option<u64>)>,
    /// Allowed values or form, when not just bounds.
    pub values: &'static str,
    /// Whether a reload applies it.
    pub applies: Applies,
    /// What it does.
    pub about: &'static str,
}

/// Bounds `lo..`.
pub(super) const fn lo(n: u64) -> Option<(u64, Option<u64>)> {
    Some((n, None))
}

/// Bounds `a..=b`.
pub(super) const fn within(a: u64, b: u64) -> Option<(u64, Option<u64>)> {
    Some((a, Some(b)))
}

/// What a key's Rust type is in TOML, and its number when it has one (the
/// value bounds are checked on; an absent optional key has none).
pub(super) trait KeyType {
    /// The type's name in the reference.
    const TOML: &'static str;
    /// The value as a number, for the bounds check.
    fn number(&self) -> Option<u64> {
        None
    }
}

macro_rules! integer {
    ($($t:ty),*) => {$(
        impl KeyType for $t {
            const TOML: &'static str = "integer";
            fn number(&self) -> Option<u64> {
                u64::try_from(*self).ok()
            }
        }
    )*};
}
integer!(u8, u32, u64, usize);

macro_rules! plain {
    ($($t:ty => $name:literal),* $(,)?) => {$(
        impl KeyType for $t {
            const TOML: &'static str = $name;
        }
    )*};
}
plain!(
    bool => "bool",
    String => "string",
    Secret => "string",
    PathBuf => "path",
    Vec<String> => "array of strings",
    BTreeMap<String, Vec<String>> => "table",
    policy::LocationSpec => "table",
);

impl<T: KeyType> KeyType for Option<T> {
    const TOML: &'static str = T::TOML;
    fn number(&self) -> Option<u64> {
        self.as_ref().and_then(KeyType::number)
    }
}

/// A declared default as the TOML the reference shows.
pub(super) fn toml_text<T: serde::Serialize>(value: &T) -> String {
    match toml::Value::try_from(value) {
        Ok(toml::Value::Table(t)) if t.is_empty() => "{}".to_owned(),
        Ok(v) => v.to_string(),
        Err(e) => format!("(not TOML: {e})"),
    }
}

/// Adds a problem with `subject.key` unless `value` (when there is one) is
/// within `bounds`.
pub(super) fn check_bound(
    problems: &mut Vec<Problem>,
    subject: &str,
    key: &str,
    value: Option<u64>,
    bounds: Option<(u64, Option<u64>)>,
) {
    let (Some(value), Some((lo, hi))) = (value, bounds) else {
        return;
    };
    let field = format!("{subject}.{key}");
    match hi {
        Some(hi) => super::range(problems, &field, value, lo..=hi),
        None => super::range(problems, &field, value, lo..),
    };
}

/// Declares a section: a struct read with `#[serde(default)]` (an absent
/// key takes its declared default, an unknown key is an error), its
/// `Default`, `entries()` (the reference's rows, in declaration order) and
/// `check_bounds(subject)`. Each key is written
/// `name: Type = value(EXPR) | absent("what absence means"), bounds B,
/// values "allowed", Reload | Restart, "what it does";`.
macro_rules! section {
    (
        $(#[$meta:meta])*
        struct $name:ident in $section:literal {
            $(
                $(#[$fmeta:meta])*
                $key:ident : $ty:ty = $kind:ident ( $def:expr ),
                bounds $bounds:expr,
                values $values:literal,
                $applies:ident,
                $about:literal;
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub(super) struct $name {
            $( $(#[$fmeta])* pub(super) $key: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $( $key: section!(@default $kind $def), )* }
            }
        }

        impl $name {
            /// The reference's rows of this section.
            pub(super) fn entries() -> Vec<$crate::config::declare::Entry> {
                vec![$(
                    $crate::config::declare::Entry {
                        section: $section,
                        key: stringify!($key),
                        ty: <$ty as $crate::config::declare::KeyType>::TOML,
                        default: section!(@text $ty, $kind $def),
                        bounds: $bounds,
                        values: $values,
                        applies: $crate::config::declare::Applies::$applies,
                        about: $about,
                    },
                )*]
            }

            /// Adds a problem for each key outside its declared bounds,
            /// named `subject.key`.
            pub(super) fn check_bounds(
                &self,
                subject: &str,
                problems: &mut Vec<$crate::config::Problem>,
            ) {
                $(
                    $crate::config::declare::check_bound(
                        problems,
                        subject,
                        stringify!($key),
                        $crate::config::declare::KeyType::number(&self.$key),
                        $bounds,
                    );
                )*
            }
        }
    };
    (@default value $def:expr) => { $def };
    (@default absent $def:expr) => { Default::default() };
    (@text $ty:ty, value $def:expr) => {
        $crate::config::declare::KeyDefault::Value(
            $crate::config::declare::toml_text::<$ty>(&$def),
        )
    };
    (@text $ty:ty, absent $def:expr) => {
        $crate::config::declare::KeyDefault::Absent($def)
    };
}
pub(super) use section;
