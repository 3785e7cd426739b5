//! Every address an application has had: when it appeared in a
//! connector's answer, when it left every connector's answer, and its last
//! result. The health table keeps one `AddressBook` per application and
//! feeds it each report that carries addresses (a resolved answer); a
//! report without any (DNS failed, or a status the CA set Unknown) says
//! nothing about which addresses the name has and changes nothing. Time is
//! an argument (Unix milliseconds), never read here.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use policy::{AddressResult, Status};

/// Most addresses kept per application: past it, the one that left
/// longest ago goes (an address still in an answer is never dropped for
/// one that left).
pub const MAX_ADDRESSES: usize = 16;

/// One address of an application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressEntry {
    /// The address.
    pub address: IpAddr,
    /// When a connector first reported it, Unix ms (again after it left
    /// and came back).
    pub appeared_ms: i64,
    /// When it left the last connector's answer that had it, Unix ms;
    /// `None` while some connector's latest answer has it.
    pub left_ms: Option<i64>,
    /// Its latest result: Up (reachable) or Down.
    pub status: Status,
    /// When that result was received, Unix ms.
    pub last_seen_ms: i64,
    /// The connector whose result that was.
    pub last_connector: Arc<str>,
    /// The result the address history's last change of it ended with
    /// (Unknown before it appeared and once it left): a result the status
    /// history showed instead leaves it behind `status`.
    shown: Status,
    /// The connectors whose latest answer has it.
    present: Present,
}

/// The connectors whose latest answer has an address: a short list (an
/// address is mostly in one or two connectors' answers), a set once more
/// than `FEW` have it. A list alone made each report of an application a
/// large group serves a walk over every connector of it: at 10,000
/// connectors, a reconnect storm spent most of a replica's CPU comparing
/// names here.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Present {
    Few(Vec<Arc<str>>),
    /// Boxed: the entry stays the size it was with the list alone (96
    /// bytes, `the_book_is_bounded`); a set in place would add 16 to every
    /// address of every application for the few that need it.
    #[expect(
        clippy::box_collection,
        reason = "keeps every AddressEntry at 96 bytes"
    )]
    Many(Box<HashSet<Arc<str>, foldhash::fast::RandomState>>),
}

/// Most connectors `Present` lists before it becomes a set.
const FEW: usize = 8;

impl Present {
    /// Adds `connector` if it is not there yet.
    fn insert(&mut self, connector: &Arc<str>) {
        match self {
            // A session reports under one shared name: its pointer
            // matches first, the text only for another session's copy.
            Present::Few(list) => {
                if list
                    .iter()
                    .any(|c| Arc::ptr_eq(c, connector) || **c == **connector)
                {
                    return;
                }
                if list.len() < FEW {
                    // Exactly as many as held (one, mostly): grown rarely.
                    list.reserve_exact(1);
                    list.push(Arc::clone(connector));
                } else {
                    let mut set: HashSet<_, _> = list.drain(..).collect();
                    set.insert(Arc::clone(connector));
                    *self = Present::Many(Box::new(set));
                }
            }
            Present::Many(set) => {
                if !set.contains(&**connector) {
                    set.insert(Arc::clone(connector));
                }
            }
        }
    }

    /// Removes `connector`; whether it was there.
    fn remove(&mut self, connector: &str) -> bool {
        match self {
            Present::Few(list) => {
                let before = list.len();
                list.retain(|c| **c != *connector);
                before != list.len()
            }
            Present::Many(set) => set.remove(connector),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Present::Few(list) => list.is_empty(),
            Present::Many(set) => set.is_empty(),
        }
    }
}

/// A change of one address of an application, for the address history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressChange {
    /// The address.
    pub address: IpAddr,
    /// The connector whose report showed the change.
    pub connector: Arc<str>,
    /// Its result as the address history last showed it (Unknown before
    /// it appeared).
    pub from: Status,
    /// Its result after (Unknown once it left).
    pub to: Status,
    /// `appeared`, `report` (its result changed) or `left`.
    pub cause: &'static str,
}

/// Whether a report's address results are all the address history needs
/// to show, or its connector's status change already shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusRow {
    /// The connector's status of the application changed with this report:
    /// the status history has a row for it.
    Written,
    /// It did not.
    None,
}

impl StatusRow {
    /// `Written` when the report `changed` the connector's status.
    pub fn after(changed: bool) -> StatusRow {
        if changed {
            StatusRow::Written
        } else {
            StatusRow::None
        }
    }
}

/// An application's addresses, in the order they first appeared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressBook {
    entries: Vec<AddressEntry>,
}

impl AddressBook {
    /// Every address kept.
    pub fn entries(&self) -> &[AddressEntry] {
        &self.entries
    }

    /// Takes `connector`'s report of `results` at `at_ms`: each address
    /// in it is present for that connector with its result; each address
    /// that connector had and this answer lacks leaves its answer (and
    /// the application, when no other connector's answer has it). Empty
    /// `results` change nothing. Pushed to `changes` (the address
    /// history): each address that appeared or left, and each result that
    /// differs from the one its history last showed, unless `status` says
    /// the status history has this report's row and the answer is this one
    /// address (that row shows its result: docs/decisions.md).
    pub fn record(
        &mut self,
        connector: &Arc<str>,
        results: &[AddressResult],
        at_ms: i64,
        status: StatusRow,
        changes: &mut Vec<AddressChange>,
    ) {
        if results.is_empty() {
            return;
        }
        let shown_by_status = status == StatusRow::Written && results.len() == 1;
        for r in results {
            let status = if r.reachable {
                Status::Up
            } else {
                Status::Down
            };
            let i = match self.entries.iter().position(|e| e.address == r.address) {
                Some(i) => i,
                None => self.insert(r.address, connector, at_ms),
            };
            let e = &mut self.entries[i];
            let appeared = e.left_ms.take().is_some() || e.status == Status::Unknown;
            if appeared {
                e.appeared_ms = at_ms;
            }
            if appeared || (e.shown != status && !shown_by_status) {
                changes.push(AddressChange {
                    address: e.address,
                    connector: Arc::clone(connector),
                    from: if appeared { Status::Unknown } else { e.shown },
                    to: status,
                    cause: if appeared { "appeared" } else { "report" },
                });
                e.shown = status;
            }
            e.status = status;
            e.last_seen_ms = at_ms;
            if !Arc::ptr_eq(&e.last_connector, connector) {
                e.last_connector = Arc::clone(connector);
            }
            e.present.insert(connector);
        }
        for e in &mut self.entries {
            if e.left_ms.is_some() || results.iter().any(|r| r.address == e.address) {
                continue;
            }
            if e.present.remove(connector) && e.present.is_empty() {
                e.left_ms = Some(at_ms);
                changes.push(AddressChange {
                    address: e.address,
                    connector: Arc::clone(connector),
                    from: std::mem::replace(&mut e.shown, Status::Unknown),
                    to: Status::Unknown,
                    cause: "left",
                });
            }
        }
    }

    /// Adds `address`, first making room if the book is full; returns its
    /// index.
    fn insert(&mut self, address: IpAddr, connector: &Arc<str>, at_ms: i64) -> usize {
        if self.entries.len() >= MAX_ADDRESSES {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .filter_map(|(i, e)| e.left_ms.map(|l| (l, i)))
                .min();
            match oldest {
                Some((_, i)) => {
                    self.entries.remove(i);
                }
                // Every kept address is present: the new one replaces the
                // one seen longest ago.
                None => {
                    let stale = self
                        .entries
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, e)| e.last_seen_ms)
                        .map_or(0, |(i, _)| i);
                    self.entries.remove(stale);
                }
            }
        }
        self.entries.reserve_exact(1);
        self.entries.push(AddressEntry {
            address,
            appeared_ms: at_ms,
            left_ms: None,
            status: Status::Unknown,
            last_seen_ms: at_ms,
            last_connector: Arc::clone(connector),
            shown: Status::Unknown,
            present: Present::Few(Vec::new()),
        });
        self.entries.len() - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn result(last: u8, reachable: bool) -> AddressResult {
        AddressResult {
            address: IpAddr::from([10, 0, 0, last]),
            reachable,
            method: policy::Method::Tcp,
            rtt: Duration::from_millis(1),
            failure: None,
            check: None,
        }
    }

    fn summary(b: &AddressBook) -> Vec<(u8, i64, Option<i64>, Status)> {
        b.entries()
            .iter()
            .map(|e| {
                let last = match e.address {
                    IpAddr::V4(v4) => v4.octets()[3],
                    IpAddr::V6(_) => 0,
                };
                (last, e.appeared_ms, e.left_ms, e.status)
            })
            .collect()
    }

    /// An address many connectors answer with (past the short list) leaves
    /// only when the last of them stops answering with it; a reconnected
    /// session's own copy of a name counts as the same connector.
    #[test]
    fn an_address_of_many_connectors_leaves_with_the_last_of_them() {
        let names: Vec<Arc<str>> = (0..3 * FEW).map(|i| Arc::from(format!("c{i}"))).collect();
        let mut b = AddressBook::default();
        let mut changes = Vec::new();
        for c in &names {
            b.record(c, &[result(1, true)], 1_000, StatusRow::None, &mut changes);
        }
        // The same names again, as new sessions' copies: nobody is added.
        for c in &names {
            let copy: Arc<str> = Arc::from(&**c);
            b.record(
                &copy,
                &[result(1, true)],
                2_000,
                StatusRow::None,
                &mut changes,
            );
        }
        assert_eq!(changes.len(), 1, "appeared once: {changes:?}");
        for (i, c) in names.iter().enumerate() {
            b.record(c, &[result(2, true)], 3_000, StatusRow::None, &mut changes);
            let left = summary(&b)[0].2;
            if i + 1 < names.len() {
                assert_eq!(
                    left,
                    None,
                    "{} connectors still answer with it",
                    names.len() - i - 1
                );
            } else {
                assert_eq!(left, Some(3_000), "the last one stopped");
            }
        }
        assert_eq!(
            changes.iter().filter(|c| c.cause == "left").count(),
            1,
            "{changes:?}"
        );
    }

    /// An address that leaves the answer is kept with when it left and
    /// its last result; one that comes back appears again; a report
    /// without addresses changes nothing.
    #[test]
    fn an_address_that_leaves_is_kept_with_its_last_result() {
        let c: Arc<str> = Arc::from("c1");
        let mut b = AddressBook::default();
        let mut changes = Vec::new();
        b.record(
            &c,
            &[result(1, true), result(2, false)],
            1_000,
            StatusRow::None,
            &mut changes,
        );
        b.record(
            &c,
            &[result(1, true), result(3, true)],
            2_000,
            StatusRow::None,
            &mut changes,
        );
        assert_eq!(
            summary(&b),
            [
                (1, 1_000, None, Status::Up),
                (2, 1_000, Some(2_000), Status::Down),
                (3, 2_000, None, Status::Up),
            ]
        );
        b.record(&c, &[], 3_000, StatusRow::None, &mut changes);
        assert_eq!(summary(&b)[1], (2, 1_000, Some(2_000), Status::Down));
        b.record(&c, &[result(2, true)], 4_000, StatusRow::None, &mut changes);
        assert_eq!(
            summary(&b),
            [
                (1, 1_000, Some(4_000), Status::Up),
                (2, 4_000, None, Status::Up),
                (3, 2_000, Some(4_000), Status::Up),
            ]
        );
        // Every appearance, departure and change of result, in order.
        let seen: Vec<(u8, Status, Status, &str)> = changes
            .iter()
            .map(|c| match c.address {
                IpAddr::V4(v4) => (v4.octets()[3], c.from, c.to, c.cause),
                IpAddr::V6(_) => (0, c.from, c.to, c.cause),
            })
            .collect();
        use Status::{Down, Unknown, Up};
        assert_eq!(
            seen,
            [
                (1, Unknown, Up, "appeared"),
                (2, Unknown, Down, "appeared"),
                (3, Unknown, Up, "appeared"),
                (2, Down, Unknown, "left"),
                (2, Unknown, Up, "appeared"),
                (1, Up, Unknown, "left"),
                (3, Up, Unknown, "left"),
            ]
        );
    }

    /// What the address history shows of one address, in order: (last
    /// octet, from, to, cause).
    fn shown(changes: &[AddressChange]) -> Vec<(u8, Status, Status, &'static str)> {
        changes
            .iter()
            .map(|c| match c.address {
                IpAddr::V4(v4) => (v4.octets()[3], c.from, c.to, c.cause),
                IpAddr::V6(_) => (0, c.from, c.to, c.cause),
            })
            .collect()
    }

    /// An application with one address at each connector, its status
    /// flipping with that address's result at one connector while another
    /// still reaches it (the ingest stream): every flip is a status
    /// history row, and the address history shows only that the address
    /// appeared. A result no status change shows (the status held by
    /// damping) and the results of an answer of several addresses are
    /// shown, each from the result the history last showed.
    #[test]
    fn a_flip_the_status_history_shows_is_not_shown_twice() {
        use Status::{Down, Unknown, Up};
        let (c1, c2): (Arc<str>, Arc<str>) = (Arc::from("c1"), Arc::from("c2"));
        let mut b = AddressBook::default();
        let mut changes = Vec::new();
        b.record(
            &c1,
            &[result(1, true)],
            1_000,
            StatusRow::Written,
            &mut changes,
        );
        b.record(
            &c2,
            &[result(1, true)],
            1_000,
            StatusRow::Written,
            &mut changes,
        );
        for round in 0..10_i64 {
            let at = 2_000 + round * 1_000;
            b.record(
                &c1,
                &[result(1, false)],
                at,
                StatusRow::Written,
                &mut changes,
            );
            b.record(
                &c2,
                &[result(1, true)],
                at + 100,
                StatusRow::None,
                &mut changes,
            );
            b.record(
                &c1,
                &[result(1, true)],
                at + 500,
                StatusRow::Written,
                &mut changes,
            );
        }
        assert_eq!(shown(&changes), [(1, Unknown, Up, "appeared")]);
        // The book's latest result is still every report's.
        b.record(
            &c1,
            &[result(1, false)],
            20_000,
            StatusRow::Written,
            &mut changes,
        );
        assert_eq!(summary(&b)[0].3, Down);
        assert_eq!(changes.len(), 1);
        // c1's status held (damping): the history shows the result, from
        // Up, the result it last showed.
        b.record(
            &c1,
            &[result(1, false)],
            21_000,
            StatusRow::None,
            &mut changes,
        );
        assert_eq!(shown(&changes[1..]), [(1, Up, Down, "report")]);
        b.record(
            &c1,
            &[result(1, true)],
            22_000,
            StatusRow::Written,
            &mut changes,
        );
        // Two addresses: the status does not say which changed.
        b.record(
            &c1,
            &[result(1, false), result(2, true)],
            23_000,
            StatusRow::Written,
            &mut changes,
        );
        assert_eq!(
            shown(&changes[2..]),
            [(2, Unknown, Up, "appeared")],
            "address 1 was last shown Down"
        );
        b.record(
            &c1,
            &[result(1, true), result(2, true)],
            24_000,
            StatusRow::Written,
            &mut changes,
        );
        assert_eq!(shown(&changes[3..]), [(1, Down, Up, "report")]);
    }

    /// Whatever the reports, the changes of each address form a chain: the
    /// first from Unknown, each from the result the one before ended with,
    /// none to the result it comes from. The store relies on it: a row
    /// ending with the result its address's history ends with is another
    /// replica's copy (`store::fresh_rows`).
    #[test]
    fn each_addresses_changes_form_a_chain() {
        let names: Vec<Arc<str>> = (0..3).map(|i| Arc::from(format!("c{i}"))).collect();
        let mut b = AddressBook::default();
        let mut changes = Vec::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for at in 0..5_000_i64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let c = &names[(x % 3) as usize];
            let n = (x >> 8) % 4;
            let results: Vec<_> = (0..n)
                .map(|k| result(1 + ((x >> (10 + k)) % 3) as u8, (x >> (20 + k)) & 1 == 0))
                .collect();
            let status = if (x >> 30) & 1 == 0 {
                StatusRow::Written
            } else {
                StatusRow::None
            };
            b.record(c, &results, at, status, &mut changes);
        }
        let mut last: std::collections::HashMap<IpAddr, Status> = Default::default();
        for c in &changes {
            let before = last.insert(c.address, c.to).unwrap_or(Status::Unknown);
            assert_eq!(c.from, before, "{c:?}");
            assert_ne!(c.from, c.to, "{c:?}");
        }
        assert!(changes.iter().any(|c| c.cause == "report"));
        assert!(changes.iter().any(|c| c.cause == "left"));
    }

    /// An address leaves the application only when it left every
    /// connector's answer.
    #[test]
    fn an_address_leaves_when_no_connector_has_it() {
        let (c1, c2): (Arc<str>, Arc<str>) = (Arc::from("c1"), Arc::from("c2"));
        let mut b = AddressBook::default();
        let mut changes = Vec::new();
        b.record(
            &c1,
            &[result(1, true)],
            1_000,
            StatusRow::None,
            &mut changes,
        );
        b.record(
            &c2,
            &[result(1, false)],
            1_500,
            StatusRow::None,
            &mut changes,
        );
        b.record(
            &c1,
            &[result(2, true)],
            2_000,
            StatusRow::None,
            &mut changes,
        );
        assert_eq!(summary(&b)[0], (1, 1_000, None, Status::Down));
        assert_eq!(&*b.entries()[0].last_connector, "c2");
        b.record(
            &c2,
            &[result(2, true)],
            3_000,
            StatusRow::None,
            &mut changes,
        );
        assert_eq!(summary(&b)[0], (1, 1_000, Some(3_000), Status::Down));
    }

    /// The book holds at most `MAX_ADDRESSES`: the address that left
    /// longest ago goes first.
    #[test]
    fn the_book_is_bounded() {
        let c: Arc<str> = Arc::from("c1");
        let mut b = AddressBook::default();
        let mut changes = Vec::new();
        for i in 0..40_u8 {
            b.record(
                &c,
                &[result(i, true)],
                i64::from(i) * 1_000,
                StatusRow::None,
                &mut changes,
            );
        }
        let kept = summary(&b);
        assert_eq!(kept.len(), MAX_ADDRESSES);
        // The newest is present, the 15 before it left, oldest gone.
        assert_eq!(kept.last().map(|k| (k.0, k.2)), Some((39, None)));
        assert_eq!(kept.first().map(|k| k.0), Some(24));
        // The memory figure in docs/decisions.md.
        assert_eq!(std::mem::size_of::<AddressEntry>(), 96);
        assert!(b.entries.capacity() <= MAX_ADDRESSES + 1);
    }
}
