//! A segment's candidates kept indexed by state, so a decision and its
//! explanation cost what they list, not the size of the groups.
//!
//! A `Roster` holds the candidates in candidate order (group order, then
//! name) and, for each state a candidate can be in (not connected, drained,
//! or connected with a status), the set of the candidates in it: a bitset
//! of their indices with its count. An update (`set_status`, `set_link`)
//! moves one index between two of those sets, a bit cleared and a bit set
//! (sorted lists of indices made each move shift up to the whole group:
//! in a group of 10,000, moves were a quarter of a decision's CPU), so
//! every count is a set's length, always equal to a recount (`recount`).
//!
//! `select_with` and `explain` follow `select::select_with` and
//! `select::explain_owned` exactly: with the same random numbers they
//! choose the same candidate and explain it the same, but they find the
//! k-th eligible candidate by counting bits a word at a time, count by
//! the sets' lengths, and read only the candidates they list.
//!
//! The `nearest` strategy over a measured segment ranks by RTT, which
//! changes with every report: it judges every candidate
//! (`select::select_with`), as it does over a slice.

#[cfg(test)]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand::{Rng, RngExt};

use crate::model::HealthReporting;
use crate::select::{
    self, Candidate, Decision, EXPLAINED_CANDIDATES, Eligibility, Explanation, LocationUse,
    Proximity, RefusalReason, Strategy, judge, user_location_note,
};
use crate::status::Status;

/// The state a candidate is counted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    NotConnected = 0,
    Drained = 1,
    Up = 2,
    Unhealthy = 3,
    Down = 4,
    Unknown = 5,
}

const CLASSES: usize = 6;

impl Class {
    fn of(c: &Candidate) -> Class {
        match c.status {
            _ if !c.connected => Class::NotConnected,
            _ if c.drained => Class::Drained,
            Status::Up => Class::Up,
            Status::Unhealthy => Class::Unhealthy,
            Status::Down => Class::Down,
            Status::Unknown => Class::Unknown,
        }
    }
}

/// Connected, not drained: may carry access in a `none` segment.
const LIVE: &[Class] = &[Class::Up, Class::Unhealthy, Class::Down, Class::Unknown];
/// Reachable (healthy strategy) in a measured segment.
const REACHABLE: &[Class] = &[Class::Up, Class::Unhealthy];
/// Not Down (group strategy, in an eligible group) in a measured segment.
const NOT_DOWN: &[Class] = &[Class::Up, Class::Unhealthy, Class::Unknown];
/// Connected, drained or not.
const CONNECTED: &[Class] = &[
    Class::Drained,
    Class::Up,
    Class::Unhealthy,
    Class::Down,
    Class::Unknown,
];

/// How many of a roster's candidates are in each state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RosterCounts {
    /// Without a live session.
    pub not_connected: usize,
    /// Connected and drained.
    pub drained: usize,
    /// Connected, not drained, reporting Up.
    pub up: usize,
    /// … Unhealthy.
    pub unhealthy: usize,
    /// … Down.
    pub down: usize,
    /// … Unknown (no current result).
    pub unknown: usize,
}

/// Member indices: a bitset from `base` (a multiple of 64) and how many
/// it holds. A group's set spans its members' indices only, so the groups
/// of a roster in candidate order take a bit per member between them.
#[derive(Clone, Debug, Default)]
struct Set {
    base: usize,
    words: Vec<u64>,
    len: usize,
}

impl Set {
    /// Adds `i`.
    fn insert(&mut self, i: usize) {
        if self.words.is_empty() {
            self.base = i / 64 * 64;
        } else if i < self.base {
            let below = (self.base - i).div_ceil(64);
            self.words.splice(0..0, std::iter::repeat_n(0, below));
            self.base -= below * 64;
        }
        let w = (i - self.base) / 64;
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
        }
        let bit = 1u64 << (i % 64);
        self.len += usize::from(self.words[w] & bit == 0);
        self.words[w] |= bit;
    }

    /// Takes `i` out; whether it was there.
    fn remove(&mut self, i: usize) -> bool {
        let Some(word) = i
            .checked_sub(self.base)
            .and_then(|d| self.words.get_mut(d / 64))
        else {
            return false;
        };
        let bit = 1u64 << (i % 64);
        let removed = *word & bit != 0;
        *word &= !bit;
        self.len -= usize::from(removed);
        removed
    }

    fn len(&self) -> usize {
        self.len
    }

    /// The bits of indices `64 * w` to `64 * w + 63`.
    fn word(&self, w: usize) -> u64 {
        (w * 64)
            .checked_sub(self.base)
            .and_then(|d| self.words.get(d / 64))
            .copied()
            .unwrap_or(0)
    }

    /// The words it spans: `64 * start` to `64 * end`.
    fn span(&self) -> (usize, usize) {
        (self.base / 64, self.base / 64 + self.words.len())
    }

    /// The indices, ascending.
    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        (self.words.iter().enumerate()).flat_map(|(w, word)| {
            let (at, mut word) = (self.base + w * 64, *word);
            std::iter::from_fn(move || {
                let i = at + (word != 0).then_some(word)?.trailing_zeros() as usize;
                word &= word - 1;
                Some(i)
            })
        })
    }
}

/// Per `Class`, its members.
type Lists = [Set; CLASSES];

/// A segment's candidates, indexed by state (see the module).
#[derive(Debug)]
pub struct Roster {
    members: Vec<Candidate>,
    class: Vec<Class>,
    /// Each member's group (index into `groups`).
    group_of: Vec<usize>,
    /// Distinct group names, in first-seen order.
    groups: Vec<String>,
    /// Every member by state.
    by_class: Lists,
    /// Each group's members by state.
    by_group: Vec<Lists>,
    /// Members read (counted in tests only).
    reads: Reads,
}

/// How many members a roster has read: counted in the tests that a
/// decision reads what it lists; nothing outside tests.
#[derive(Debug, Default)]
struct Reads(#[cfg(test)] AtomicUsize);

impl Reads {
    #[inline]
    fn add(&self, _n: usize) {
        #[cfg(test)]
        self.0.fetch_add(_n, Ordering::Relaxed);
    }
}

impl Roster {
    /// Indexes `candidates`, in candidate order.
    pub fn new(candidates: Vec<Candidate>) -> Self {
        let mut groups: Vec<String> = Vec::new();
        let mut by_class = Lists::default();
        let mut by_group: Vec<Lists> = Vec::new();
        let mut class = Vec::with_capacity(candidates.len());
        let mut group_of = Vec::with_capacity(candidates.len());
        for (i, c) in candidates.iter().enumerate() {
            // Groups are few: a search beats hashing every name.
            let g = match groups.iter().rposition(|g| *g == c.group) {
                Some(g) => g,
                None => {
                    groups.push(c.group.clone());
                    by_group.push(Lists::default());
                    groups.len() - 1
                }
            };
            let k = Class::of(c);
            by_class[k as usize].insert(i);
            by_group[g][k as usize].insert(i);
            class.push(k);
            group_of.push(g);
        }
        Roster {
            members: candidates,
            class,
            group_of,
            groups,
            by_class,
            by_group,
            reads: Reads::default(),
        }
    }

    /// How many candidates there are.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Candidate `i`.
    pub fn get(&self, i: usize) -> Option<&Candidate> {
        (i < self.len()).then(|| self.member(i))
    }

    /// Every candidate, in candidate order.
    pub fn candidates(&self) -> &[Candidate] {
        self.reads.add(self.len());
        &self.members
    }

    fn member(&self, i: usize) -> &Candidate {
        self.reads.add(1);
        &self.members[i]
    }

    /// Sets candidate `i`'s status; false when there is no such candidate.
    pub fn set_status(&mut self, i: usize, status: Status) -> bool {
        self.update(i, |c| c.status = status)
    }

    /// Sets whether candidate `i` is connected and drained; false when
    /// there is no such candidate.
    pub fn set_link(&mut self, i: usize, connected: bool, drained: bool) -> bool {
        self.update(i, |c| {
            c.connected = connected;
            c.drained = drained;
        })
    }

    /// Sets candidate `i`'s smoothed RTT; false when there is no such
    /// candidate.
    pub fn set_rtt(&mut self, i: usize, rtt: Option<Duration>) -> bool {
        self.update(i, |c| c.rtt = rtt)
    }

    /// Applies `f` to candidate `i` and moves it to its new state's lists.
    fn update(&mut self, i: usize, f: impl FnOnce(&mut Candidate)) -> bool {
        let Some(c) = self.members.get_mut(i) else {
            return false;
        };
        f(c);
        let (old, new) = (self.class[i], Class::of(c));
        if old != new {
            let g = self.group_of[i];
            for lists in [&mut self.by_class, &mut self.by_group[g]] {
                lists[old as usize].remove(i);
                lists[new as usize].insert(i);
            }
            self.class[i] = new;
        }
        true
    }

    /// The counts, as kept.
    pub fn counts(&self) -> RosterCounts {
        let n = |c: Class| self.by_class[c as usize].len();
        RosterCounts {
            not_connected: n(Class::NotConnected),
            drained: n(Class::Drained),
            up: n(Class::Up),
            unhealthy: n(Class::Unhealthy),
            down: n(Class::Down),
            unknown: n(Class::Unknown),
        }
    }

    /// The counts, recounted from every candidate.
    pub fn recount(&self) -> RosterCounts {
        let mut n = RosterCounts::default();
        for c in &self.members {
            *match Class::of(c) {
                Class::NotConnected => &mut n.not_connected,
                Class::Drained => &mut n.drained,
                Class::Up => &mut n.up,
                Class::Unhealthy => &mut n.unhealthy,
                Class::Down => &mut n.down,
                Class::Unknown => &mut n.unknown,
            } += 1;
        }
        n
    }

    /// Who may be chosen (in an eligible group, for the group strategy).
    fn pool(mode: HealthReporting, strategy: Strategy) -> &'static [Class] {
        match strategy {
            _ if mode == HealthReporting::None => LIVE,
            Strategy::Group => NOT_DOWN,
            Strategy::Healthy | Strategy::Nearest => REACHABLE,
        }
    }

    /// Group strategy: the groups with a reachable member, in the order
    /// of their first reachable member.
    fn eligible_groups(&self, mode: HealthReporting) -> Vec<usize> {
        let reachable = if mode == HealthReporting::None {
            LIVE
        } else {
            REACHABLE
        };
        let mut firsts: Vec<(usize, usize)> = self
            .by_group
            .iter()
            .enumerate()
            .filter_map(|(g, lists)| {
                let first = reachable
                    .iter()
                    .filter_map(|c| lists[*c as usize].iter().next());
                Some((first.min()?, g))
            })
            .collect();
        firsts.sort_unstable();
        firsts.into_iter().map(|(_, g)| g).collect()
    }

    /// As `select::refusal`: judged over the connected, undrained.
    fn refusal(&self, mode: HealthReporting) -> RefusalReason {
        let n = self.counts();
        let live = n.up + n.unhealthy + n.down + n.unknown;
        if live == 0 {
            if n.drained > 0 {
                RefusalReason::AllDrained
            } else {
                RefusalReason::NoConnector
            }
        } else if mode != HealthReporting::None && n.down == live {
            RefusalReason::AllDown
        } else {
            RefusalReason::NoHealthReport
        }
    }

    /// `select::select_with` over the roster: the same decision for the
    /// same random numbers, reading no candidate (but for `nearest` over a
    /// measured segment, which judges them all).
    pub fn select_with<R: Rng + ?Sized>(
        &self,
        mode: HealthReporting,
        strategy: Strategy,
        proximity: impl Into<Proximity>,
        rng: &mut R,
    ) -> Decision {
        if measures_distance(mode, strategy) {
            return select::select_with(self.candidates(), mode, strategy, proximity, rng);
        }
        let lists = match strategy {
            Strategy::Group => {
                let groups = self.eligible_groups(mode);
                if groups.is_empty() {
                    return Decision::Refused(self.refusal(mode));
                }
                &self.by_group[groups[rng.random_range(0..groups.len())]]
            }
            Strategy::Healthy | Strategy::Nearest => &self.by_class,
        };
        let pool = of(lists, Self::pool(mode, strategy));
        let n: usize = pool.iter().map(|l| l.len()).sum();
        if n == 0 {
            return Decision::Refused(self.refusal(mode));
        }
        Decision::Selected {
            index: nth(&pool, rng.random_range(0..n)),
        }
    }

    /// `select::explain_owned` over the roster, the chosen candidate
    /// `chosen`: the same explanation, reading only the candidates it
    /// lists (but for `nearest` over a measured segment).
    pub fn explain(
        &self,
        chosen: Option<usize>,
        mode: HealthReporting,
        strategy: Strategy,
        proximity: impl Into<Proximity>,
    ) -> Explanation {
        let proximity = proximity.into();
        if measures_distance(mode, strategy) {
            let all = self.candidates().to_vec();
            return select::explain_owned(all, chosen, mode, strategy, proximity);
        }
        let groups = match strategy {
            Strategy::Group => Some(self.eligible_groups(mode)),
            Strategy::Healthy | Strategy::Nearest => None,
        };
        let location = match proximity.user {
            None => LocationUse::NotGiven,
            Some(_) if strategy != Strategy::Nearest => LocationUse::OtherStrategy(strategy),
            Some(_) => LocationUse::NothingMeasured,
        };
        let names: Vec<&str> = groups
            .iter()
            .flatten()
            .map(|g| self.groups[*g].as_str())
            .collect();
        let eligible_groups = names.iter().map(|g| (*g).to_owned()).collect();
        let eligibility = Eligibility::unmeasured(mode, strategy, names, location);
        let [eligible, connected] = self.ranks(Self::pool(mode, strategy), groups.as_deref());
        let notes = self
            .listed(chosen, [&eligible, &connected])
            .into_iter()
            .map(|i| {
                let c = self.member(i);
                judge(&eligibility, c, eligibility.verdict(c)).note(c)
            })
            .collect();
        Explanation {
            strategy,
            mode,
            candidates: notes,
            candidates_total: self.len(),
            candidates_eligible: eligible.iter().map(|l| l.len()).sum(),
            candidates_connected: self.len() - self.counts().not_connected,
            eligible_groups,
            user_location: user_location_note(proximity, location),
        }
    }

    /// The lists of the eligible (`pool`, in `groups` if the strategy
    /// names them) and of the connected but not eligible.
    fn ranks(&self, pool: &[Class], groups: Option<&[usize]>) -> [Vec<&Set>; 2] {
        let others: Vec<Class> = CONNECTED
            .iter()
            .copied()
            .filter(|c| !pool.contains(c))
            .collect();
        let Some(eligible) = groups else {
            return [of(&self.by_class, pool), of(&self.by_class, &others)];
        };
        let mut rank = [Vec::new(), Vec::new()];
        for (g, lists) in self.by_group.iter().enumerate() {
            if eligible.contains(&g) {
                rank[0].extend(of(lists, pool));
                rank[1].extend(of(lists, &others));
            } else {
                rank[1].extend(of(lists, CONNECTED));
            }
        }
        rank
    }

    /// Which candidates an explanation lists, ascending, as
    /// `select::listed` ranks them: all up to `EXPLAINED_CANDIDATES`,
    /// else the chosen one, then the eligible and connected of `ranks`,
    /// then the rest.
    fn listed(&self, chosen: Option<usize>, ranks: [&[&Set]; 2]) -> Vec<usize> {
        if self.len() <= EXPLAINED_CANDIDATES {
            return (0..self.len()).collect();
        }
        let mut keep: Vec<usize> = chosen.filter(|i| *i < self.len()).into_iter().collect();
        let rest = [&self.by_class[Class::NotConnected as usize]];
        for lists in [ranks[0], ranks[1], &rest[..]] {
            take(lists, chosen, &mut keep);
        }
        keep.sort_unstable();
        keep
    }
}

/// The sets of `classes` among `lists`.
fn of<'a>(lists: &'a Lists, classes: &[Class]) -> Vec<&'a Set> {
    classes.iter().map(|c| &lists[*c as usize]).collect()
}

/// Each word the disjoint `sets` span between them, as the union of
/// theirs, ascending, with its number: for a few sets (one state's, one
/// group's), read a word at a time.
fn union_words<'a>(sets: &'a [&'a Set]) -> impl Iterator<Item = (usize, u64)> + 'a {
    let start = sets.iter().map(|s| s.span().0).min().unwrap_or(0);
    let end = sets.iter().map(|s| s.span().1).max().unwrap_or(0);
    (start..end).map(move |w| (w, sets.iter().fold(0, |u, s| u | s.word(w))))
}

/// The `k`-th (from 0) smallest index among the disjoint `sets` (the
/// few of one pool); there must be more than `k` (else the end of their
/// last word).
fn nth(sets: &[&Set], mut k: usize) -> usize {
    let mut last = 0;
    for (w, mut word) in union_words(sets) {
        let n = word.count_ones() as usize;
        if k < n {
            for _ in 0..k {
                word &= word - 1;
            }
            return w * 64 + word.trailing_zeros() as usize;
        }
        k -= n;
        last = w * 64 + 63;
    }
    last
}

/// Sets `take` reads word by word, as their union; past this many (the
/// states of many groups) it reads each set apart and merges.
const FEW_SETS: usize = 8;

/// Appends to `keep`, until it holds `EXPLAINED_CANDIDATES`, the indices
/// of the disjoint `sets` in ascending order, but `chosen`. Each set is
/// read only as far as it is taken.
fn take(sets: &[&Set], chosen: Option<usize>, keep: &mut Vec<usize>) {
    let want = EXPLAINED_CANDIDATES.saturating_sub(keep.len());
    let mut found = Vec::with_capacity(want);
    if sets.len() <= FEW_SETS {
        for (w, mut word) in union_words(sets) {
            while word != 0 && found.len() < want {
                let i = w * 64 + word.trailing_zeros() as usize;
                word &= word - 1;
                if Some(i) != chosen {
                    found.push(i);
                }
            }
            if found.len() == want {
                break;
            }
        }
    } else {
        for set in sets {
            found.extend(set.iter().filter(|i| Some(*i) != chosen).take(want));
        }
        found.sort_unstable();
        found.truncate(want);
    }
    keep.extend(found);
}

/// Whether the decision ranks by distance: `nearest` over a measured
/// segment.
fn measures_distance(mode: HealthReporting, strategy: Strategy) -> bool {
    strategy == Strategy::Nearest && mode != HealthReporting::None
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, RwLock};

    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    /// `n` connected candidates in four groups, a quarter Down, every
    /// tenth not connected, every 25th drained; the groups one after the
    /// other, or `interleaved` (member `i` in group `i % 4`).
    fn group(n: usize, interleaved: bool) -> Vec<Candidate> {
        (0..n)
            .map(|i| Candidate {
                connector: format!("c{i:05}"),
                group: format!("g{}", if interleaved { i % 4 } else { i * 4 / n }),
                connected: i % 10 != 9,
                drained: i % 25 == 24,
                status: if i % 4 == 3 { Status::Down } else { Status::Up },
                rtt: None,
                location: None,
            })
            .collect()
    }

    const UNMEASURED: [(HealthReporting, Strategy); 5] = [
        (HealthReporting::Continuous, Strategy::Healthy),
        (HealthReporting::OnAccess, Strategy::Group),
        (HealthReporting::None, Strategy::Healthy),
        (HealthReporting::None, Strategy::Nearest),
        (HealthReporting::None, Strategy::Group),
    ];

    #[test]
    fn a_set_keeps_its_indices_and_count_wherever_they_fall() {
        let mut set = Set::default();
        // The first index sets the base; those below it move it down.
        for i in [130, 7, 200, 64, 130] {
            set.insert(i);
        }
        assert_eq!(set.iter().collect::<Vec<_>>(), [7, 64, 130, 200]);
        assert_eq!(set.len(), 4);
        assert!(set.remove(64));
        assert!(!set.remove(64), "removed twice");
        assert!(!set.remove(3) && !set.remove(5_000), "never there");
        assert_eq!(set.len(), 3);
        let other = Set {
            base: 128,
            words: vec![0b1010],
            len: 2,
        };
        // 7, 129, 130, 131, 200 between them.
        let both = [&set, &other];
        let ks: Vec<usize> = (0..5).map(|k| nth(&both, k)).collect();
        assert_eq!(ks, [7, 129, 130, 131, 200]);
        let mut keep = vec![130];
        take(&both, Some(130), &mut keep);
        assert_eq!(keep, [130, 7, 129, 131, 200]);
        // Past `FEW_SETS` sets (the states of many groups), each is read
        // apart and merged: the same order.
        let empty = Set::default();
        let singles: Vec<Set> = [200, 131, 7, 129, 130]
            .into_iter()
            .map(|i| {
                let mut one = Set::default();
                one.insert(i);
                one
            })
            .collect();
        let many: Vec<&Set> = (singles.iter())
            .chain(std::iter::repeat_n(&empty, FEW_SETS))
            .collect();
        let mut merged = vec![130];
        take(&many, Some(130), &mut merged);
        assert_eq!(merged, keep);
    }

    #[test]
    fn a_decision_in_a_group_of_ten_thousand_reads_what_it_lists() {
        let mut rng = SmallRng::seed_from_u64(1);
        for ((mode, strategy), interleaved) in UNMEASURED
            .into_iter()
            .zip([false, true].into_iter().cycle())
        {
            let roster = Roster::new(group(10_000, interleaved));
            for _ in 0..20 {
                roster.reads.0.store(0, Ordering::Relaxed);
                let chosen =
                    match roster.select_with(mode, strategy, Proximity::default(), &mut rng) {
                        Decision::Selected { index } => Some(index),
                        Decision::Refused(r) => panic!("refused: {r}"),
                    };
                let explanation = roster.explain(chosen, mode, strategy, Proximity::default());
                assert_eq!(explanation.candidates.len(), EXPLAINED_CANDIDATES);
                assert_eq!(explanation.candidates_total, 10_000);
                let read = roster.reads.0.load(Ordering::Relaxed);
                assert!(
                    read <= EXPLAINED_CANDIDATES,
                    "{mode:?}/{strategy:?} read {read} candidates to list {EXPLAINED_CANDIDATES}"
                );
            }
        }
    }

    #[test]
    fn counts_follow_updates_and_equal_a_recount() {
        let mut roster = Roster::new(group(400, false));
        let mut rng = SmallRng::seed_from_u64(3);
        let statuses = [Status::Up, Status::Unhealthy, Status::Down, Status::Unknown];
        for _ in 0..5_000 {
            let i = rng.random_range(0..roster.len());
            if rng.random_bool(0.7) {
                roster.set_status(i, statuses[rng.random_range(0..4)]);
            } else {
                roster.set_link(i, rng.random_bool(0.8), rng.random_bool(0.2));
            }
            assert_eq!(roster.counts(), roster.recount());
        }
        assert!(!roster.set_status(roster.len(), Status::Up));
    }

    /// Writers change results while readers decide and count: every
    /// reader sees counts equal to a recount, and the end state's too.
    #[test]
    fn counts_stay_exact_under_concurrent_result_updates() {
        let roster = Arc::new(RwLock::new(Roster::new(group(2_000, true))));
        let writers: Vec<_> = (0..4u64)
            .map(|seed| {
                let roster = Arc::clone(&roster);
                std::thread::spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(seed);
                    let statuses = [Status::Up, Status::Unhealthy, Status::Down, Status::Unknown];
                    for _ in 0..5_000 {
                        let mut r = roster.write().expect("not poisoned");
                        let i = rng.random_range(0..r.len());
                        r.set_status(i, statuses[rng.random_range(0..4)]);
                        if rng.random_bool(0.1) {
                            r.set_link(i, rng.random_bool(0.9), rng.random_bool(0.1));
                        }
                    }
                })
            })
            .collect();
        let readers: Vec<_> = (0..2u64)
            .map(|seed| {
                let roster = Arc::clone(&roster);
                std::thread::spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(100 + seed);
                    for _ in 0..500 {
                        let r = roster.read().expect("not poisoned");
                        assert_eq!(r.counts(), r.recount());
                        let chosen = match r.select_with(
                            HealthReporting::Continuous,
                            Strategy::Healthy,
                            Proximity::default(),
                            &mut rng,
                        ) {
                            Decision::Selected { index } => Some(index),
                            Decision::Refused(_) => None,
                        };
                        let e = r.explain(
                            chosen,
                            HealthReporting::Continuous,
                            Strategy::Healthy,
                            Proximity::default(),
                        );
                        let n = r.recount();
                        assert_eq!(e.candidates_eligible, n.up + n.unhealthy);
                        assert_eq!(e.candidates_connected, r.len() - n.not_connected);
                    }
                })
            })
            .collect();
        for t in writers.into_iter().chain(readers) {
            t.join().expect("thread finished");
        }
        let r = roster.read().expect("not poisoned");
        assert_eq!(r.counts(), r.recount());
    }
}
