//! On-access ids: the CA names every access it forwards to a connector
//! (`AccessEvent.access_id`) and the connector echoes the name in every
//! report of the window it opened (`ApplicationHealth.access_id`). Any CA
//! replica sharing the store verifies an id on its own, without shared
//! memory: the id is an HMAC-SHA256 over the connector's name, the
//! application and the access time, keyed with a random secret created
//! once in the store (`Store::shared_secret`), so it works with and
//! without TLS, on SQLite and PostgreSQL alike.
//!
//! An id proves that an access to this application reached this connector
//! through some replica at the time it names; it cannot be moved to another
//! application or connector, and it lapses a window after that time.
//!
//! Format (opaque to connectors): `a1.<access time, Unix ms>.<tag>`, the
//! tag being the first 16 bytes of the MAC in lower-case hex (67 bytes or
//! so in all, well under the protocol's 128).

use policy::AppKey;
use ring::hmac;
use subtle::ConstantTimeEq;

/// The store's name of the key (`Store::shared_secret`).
pub(crate) const SECRET_NAME: &str = "access_id_hmac_sha256";

/// Bytes of a fresh key.
pub(crate) const SECRET_BYTES: usize = 32;

/// The format's version prefix.
const VERSION: &str = "a1";

/// The MAC is truncated to this many bytes (128 bits, as HMAC allows).
const TAG_BYTES: usize = 16;

/// Issues and verifies access ids with the replicas' shared key.
pub(crate) struct AccessIds {
    key: hmac::Key,
}

impl std::fmt::Debug for AccessIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AccessIds { key: <redacted> }")
    }
}

impl AccessIds {
    /// Ids keyed with `secret` (the store's shared one).
    pub(crate) fn new(secret: &[u8]) -> Self {
        AccessIds {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
        }
    }

    /// The id of an access to `key` at `accessed_unix_ms` forwarded to
    /// `connector`.
    pub(crate) fn issue(&self, connector: &str, key: &AppKey, accessed_unix_ms: i64) -> String {
        let tag = self.tag(connector, key, accessed_unix_ms);
        let mut id = format!("{VERSION}.{accessed_unix_ms}.");
        for b in &tag.as_ref()[..TAG_BYTES] {
            id.push_str(&format!("{b:02x}"));
        }
        id
    }

    /// When the access `id` names happened (Unix ms), if this deployment
    /// issued `id` for `connector` and `key`; `None` for anything else
    /// (malformed, another key, another application or connector).
    pub(crate) fn verify(&self, connector: &str, key: &AppKey, id: &str) -> Option<i64> {
        let mut parts = id.split('.');
        let (Some(VERSION), Some(ms), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let ms: i64 = ms.parse().ok()?;
        let given = unhex(tag)?;
        let expected = self.tag(connector, key, ms);
        bool::from(given.as_slice().ct_eq(&expected.as_ref()[..TAG_BYTES])).then_some(ms)
    }

    fn tag(&self, connector: &str, key: &AppKey, ms: i64) -> hmac::Tag {
        let host = key.host.to_string();
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(b"reach.v1.access_id\0");
        // Length-prefixed fields: no two inputs encode alike.
        for field in [
            connector.as_bytes(),
            key.segment.as_bytes(),
            host.as_bytes(),
            key.protocol.as_str().as_bytes(),
        ] {
            ctx.update(&(field.len() as u64).to_be_bytes());
            ctx.update(field);
        }
        ctx.update(&key.port.to_be_bytes());
        ctx.update(&ms.to_be_bytes());
        ctx.sign()
    }
}

/// `TAG_BYTES` bytes from lower-case hex, or `None`.
fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() != TAG_BYTES * 2 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some((digit(p[0])? << 4) | digit(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use policy::{Host, Protocol};

    use super::*;

    fn key(host: &str) -> AppKey {
        AppKey {
            segment: "lab".into(),
            host: Host::parse(host).expect("host"),
            protocol: Protocol::Tcp,
            port: 443,
        }
    }

    #[test]
    fn an_id_verifies_only_for_its_connector_application_and_key() {
        let ids = AccessIds::new(&[7; SECRET_BYTES]);
        let k = key("a.lab.test");
        let id = ids.issue("c1", &k, 1_700_000_000_000);
        assert!(id.len() <= policy::report::MAX_ACCESS_ID_BYTES, "{id}");
        assert_eq!(ids.verify("c1", &k, &id), Some(1_700_000_000_000));
        // Same secret (another replica): verified.
        assert_eq!(
            AccessIds::new(&[7; SECRET_BYTES]).verify("c1", &k, &id),
            Some(1_700_000_000_000)
        );
        assert_eq!(ids.verify("c2", &k, &id), None, "another connector");
        assert_eq!(ids.verify("c1", &key("b.lab.test"), &id), None);
        let other_port = AppKey {
            port: 444,
            ..k.clone()
        };
        assert_eq!(ids.verify("c1", &other_port, &id), None);
        assert_eq!(
            AccessIds::new(&[8; SECRET_BYTES]).verify("c1", &k, &id),
            None,
            "another deployment's key"
        );
        // Another time with the same tag, or a mangled tag.
        let later = id.replace("1700000000000", "1700000009999");
        assert_eq!(ids.verify("c1", &k, &later), None);
        let flipped = format!("{}0", &id[..id.len() - 1]);
        let flipped = if flipped == id {
            format!("{}1", &id[..id.len() - 1])
        } else {
            flipped
        };
        assert_eq!(ids.verify("c1", &k, &flipped), None);
        for bad in ["", "a1", "a1.1.00", "a2.1.00", &format!("{id}.x"), "a1.x.y"] {
            assert_eq!(ids.verify("c1", &k, bad), None, "{bad:?}");
        }
    }
}
