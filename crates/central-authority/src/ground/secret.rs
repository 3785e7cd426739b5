//! A secret (an API token, a provisioning key, a password): compared in
//! constant time and never printed.

use std::fmt;

use subtle::ConstantTimeEq;

/// A secret (API token or provisioning key). Its `Debug` output is redacted
/// so that logging a config or an error can never leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// Whether `candidate` equals the secret. The comparison takes the same
    /// time wherever the first differing byte is (only the length leaks).
    pub fn matches(&self, candidate: &[u8]) -> bool {
        bool::from(self.0.as_bytes().ct_eq(candidate))
    }

    /// Whether the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many characters the secret has (its length may be reported; its
    /// value never is).
    pub fn char_count(&self) -> usize {
        self.0.chars().count()
    }

    /// The secret without surrounding whitespace (as read from a file or
    /// written inline).
    pub fn trimmed(&self) -> Secret {
        Secret(self.0.trim().to_owned())
    }

    /// The secret's bytes, for a constant-time comparison with another secret.
    fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    /// SHA-256 of the secret (lower-case hex): what the database keeps to
    /// count a provisioning key's uses without storing the key.
    pub fn sha256(&self) -> String {
        crate::ground::digest::sha256_hex(self.0.as_bytes())
    }

    /// The secret itself, for handing it to what needs it (the database
    /// driver's password); never for logs or comparisons.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Constant-time equality with another secret.
    pub fn same_as(&self, other: &Secret) -> bool {
        self.matches(other.bytes())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn secrets_are_redacted() {
        assert_eq!(format!("{:?}", Secret::new("hunter2")), "Secret(***)");
    }
}
