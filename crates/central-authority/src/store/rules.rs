//! The rules of enrollment, decided once for both backends: each backend
//! reads the provisioning key's row and the name's connector row inside its
//! enrollment transaction, `decide` says whether the enrollment may go
//! ahead and what becomes of the name, and the backend writes that. The
//! backends hold only the I/O, so SQLite and PostgreSQL cannot drift apart
//! on who may enroll.

use super::EnrollRefusal;

/// The provisioning key's row (`provisioning_keys`), if it was used before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyRow {
    /// Enrollments so far.
    pub(crate) uses: u32,
    /// Revoked by an administrator.
    pub(crate) revoked: bool,
}

/// The row of the name being enrolled (`connectors`), if it ever was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NameRow {
    /// Its group.
    pub(crate) group: String,
    /// Disabled by an administrator.
    pub(crate) disabled: bool,
    /// Re-enrollment allowed by an administrator until then (Unix ms).
    pub(crate) reenroll_until_ms: Option<i64>,
    /// Deleted by an administrator: the name is free.
    pub(crate) deleted: bool,
    /// Whether it holds a valid (unrevoked, unexpired) certificate now.
    pub(crate) valid_certificate: bool,
}

/// What an allowed enrollment does to the name's row. Every allowed
/// enrollment also counts the key's use, supersedes the connector's earlier
/// certificates and records the new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NameClaim {
    /// A name never enrolled: insert its row.
    Insert,
    /// A deleted connector's name: its row is reset for the new group.
    ReuseDeleted,
    /// The connector's own name, holding no valid certificate: unchanged.
    Keep,
    /// The connector's own name under an administrator's leave to
    /// re-enroll: the leave is for one enrollment and is used up.
    UseLeave,
}

/// Whether a connector `name` of `group` may enroll with a key allowed
/// `max_uses` enrollments at `now_ms`, given the rows read: the key is not
/// revoked and has uses left; the name is new or deleted, or it is of the
/// same group, not disabled, and holds no valid certificate unless an
/// administrator's leave to re-enroll is still running.
pub(crate) fn decide(
    name: &str,
    group: &str,
    max_uses: u32,
    now_ms: i64,
    key: Option<KeyRow>,
    existing: Option<NameRow>,
) -> Result<NameClaim, EnrollRefusal> {
    let key = key.unwrap_or_default();
    if key.revoked {
        return Err(EnrollRefusal::KeyRevoked(group.to_owned()));
    }
    if key.uses >= max_uses {
        return Err(EnrollRefusal::KeyExhausted {
            group: group.to_owned(),
            uses: key.uses,
            max: max_uses,
        });
    }
    let Some(row) = existing else {
        return Ok(NameClaim::Insert);
    };
    if row.deleted {
        return Ok(NameClaim::ReuseDeleted);
    }
    if row.disabled {
        return Err(EnrollRefusal::Disabled(name.to_owned()));
    }
    if row.group != group {
        return Err(EnrollRefusal::OtherGroup {
            name: name.to_owned(),
            group: row.group,
        });
    }
    if !row.valid_certificate {
        return Ok(NameClaim::Keep);
    }
    match row.reenroll_until_ms {
        Some(until) if now_ms <= until => Ok(NameClaim::UseLeave),
        _ => Err(EnrollRefusal::NameTaken(name.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000;

    fn enrolled() -> NameRow {
        NameRow {
            group: "g".into(),
            disabled: false,
            reenroll_until_ms: None,
            deleted: false,
            valid_certificate: true,
        }
    }

    fn decide_for(
        key: Option<KeyRow>,
        existing: Option<NameRow>,
    ) -> Result<NameClaim, EnrollRefusal> {
        decide("c1", "g", 2, NOW, key, existing)
    }

    #[test]
    fn a_new_name_with_an_unused_key_is_inserted() {
        assert_eq!(decide_for(None, None), Ok(NameClaim::Insert));
    }

    #[test]
    fn a_revoked_key_is_refused_even_with_uses_left() {
        let key = KeyRow {
            uses: 0,
            revoked: true,
        };
        assert_eq!(
            decide_for(Some(key), None),
            Err(EnrollRefusal::KeyRevoked("g".into()))
        );
    }

    #[test]
    fn a_key_with_no_uses_left_is_refused_and_the_counts_named() {
        let key = |uses| {
            Some(KeyRow {
                uses,
                revoked: false,
            })
        };
        assert_eq!(decide_for(key(1), None), Ok(NameClaim::Insert));
        assert_eq!(
            decide_for(key(2), None),
            Err(EnrollRefusal::KeyExhausted {
                group: "g".into(),
                uses: 2,
                max: 2
            })
        );
    }

    #[test]
    fn the_key_is_checked_before_the_name() {
        let key = KeyRow {
            uses: 0,
            revoked: true,
        };
        let disabled = NameRow {
            disabled: true,
            ..enrolled()
        };
        assert_eq!(
            decide_for(Some(key), Some(disabled)),
            Err(EnrollRefusal::KeyRevoked("g".into()))
        );
    }

    #[test]
    fn a_deleted_name_is_free_whatever_its_old_row_says() {
        let deleted = NameRow {
            group: "h".into(),
            disabled: true,
            deleted: true,
            ..enrolled()
        };
        assert_eq!(decide_for(None, Some(deleted)), Ok(NameClaim::ReuseDeleted));
    }

    #[test]
    fn a_disabled_connector_is_refused_before_its_group_is_compared() {
        let disabled = NameRow {
            group: "h".into(),
            disabled: true,
            ..enrolled()
        };
        assert_eq!(
            decide_for(None, Some(disabled)),
            Err(EnrollRefusal::Disabled("c1".into()))
        );
    }

    #[test]
    fn a_name_of_another_group_is_refused_and_the_group_named() {
        let other = NameRow {
            group: "h".into(),
            valid_certificate: false,
            ..enrolled()
        };
        assert_eq!(
            decide_for(None, Some(other)),
            Err(EnrollRefusal::OtherGroup {
                name: "c1".into(),
                group: "h".into()
            })
        );
    }

    #[test]
    fn a_name_without_a_valid_certificate_is_re_enrolled_by_the_key() {
        let lapsed = NameRow {
            valid_certificate: false,
            ..enrolled()
        };
        assert_eq!(decide_for(None, Some(lapsed)), Ok(NameClaim::Keep));
    }

    #[test]
    fn a_valid_certificate_holds_the_name_without_leave() {
        assert_eq!(
            decide_for(None, Some(enrolled())),
            Err(EnrollRefusal::NameTaken("c1".into()))
        );
    }

    #[test]
    fn leave_to_re_enroll_counts_until_its_end_and_is_used_up() {
        let leave = |until| NameRow {
            reenroll_until_ms: Some(until),
            ..enrolled()
        };
        assert_eq!(decide_for(None, Some(leave(NOW))), Ok(NameClaim::UseLeave));
        assert_eq!(
            decide_for(None, Some(leave(NOW - 1))),
            Err(EnrollRefusal::NameTaken("c1".into())),
            "leave that ran out is no leave"
        );
    }
}
