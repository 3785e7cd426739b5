//! The rosters: per application of a `continuous` or `none` segment that
//! was decided on, its candidates kept indexed by state
//! (`policy::Roster`), so a decision costs what it lists, not the size of
//! the segment's groups.
//!
//! A roster follows its inputs by reading what changed since it last
//! read: the registry's link changes (`Registry::links`), the health
//! table's writes to the application's reports (`HealthTable::facts`),
//! and time (a result turns stale at a known instant: each member's is
//! kept in a heap and judged again once passed). A decision reads those
//! changes first (each owner under its own lock), then applies them and
//! decides under the roster's lock, if no other decision applied changes
//! in between (else it reads again). A roster is built again whole when
//! the policy changes or a group's membership does.
//!
//! **Invariant:** a candidate's status in a roster is `Authority::effective`
//! of its inputs at the decision's instant, as the slice of candidates a
//! decision without a roster builds (`access::decide::candidates`) holds it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use policy::{AppKey, Candidate, Roster, Segment, Status};

use crate::ground::sync::lock;
use crate::state::health::{Fact, Facts, FactsAt};
use crate::state::policy_state::PolicyState;
use crate::state::registry::{Link, Links, LinksAt};

/// Most members all rosters hold together (about 200 bytes each); past it,
/// decisions on applications without a roster build their slice.
pub(crate) const MEMBERS_MAX: usize = 500_000;

/// Every roster. One per `Authority`.
#[derive(Debug, Default)]
pub(crate) struct Rosters {
    map: Mutex<Map>,
}

#[derive(Debug, Default)]
struct Map {
    kept: HashMap<AppKey, Arc<Mutex<Kept>>>,
    /// Members of the rosters in `kept`, as last built.
    members: usize,
}

/// Where a roster's reading stands: what a decision reads changes since.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticket {
    version: u64,
    /// `None`: read every report.
    pub facts: Option<FactsAt>,
    /// `None`: read every member.
    pub links: Option<LinksAt>,
}

/// The rules a member's status follows.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules {
    /// The segment's report interval.
    pub interval: Duration,
    /// `[health] stale_after_intervals`.
    pub stale_after: u32,
}

/// The effective status of a stored status, its age and the connector's
/// link (`Authority::effective` for a segment that is not on-access).
pub(crate) type Judge<'a> = &'a dyn Fn(Status, Duration, Link) -> Status;

/// One application's roster and what it was built from.
#[derive(Debug)]
struct Kept {
    policy: Weak<PolicyState>,
    /// Bumped by every decision that applied changes.
    version: u64,
    facts: Option<FactsAt>,
    links: Option<LinksAt>,
    /// The latest instant a decision judged at (never goes back).
    now: Option<Instant>,
    roster: Roster,
    /// Per member: its link, its report if any, and when its result
    /// turns stale.
    inputs: Vec<Inputs>,
    /// Each group's members (in name order) by group name.
    runs: Vec<(String, Range<usize>)>,
    /// `inputs`' stale instants; an entry that is no longer its member's
    /// is skipped.
    stale_at: BinaryHeap<Reverse<(Instant, usize)>>,
}

#[derive(Clone, Copy, Debug)]
struct Inputs {
    link: Link,
    fact: Option<Fact>,
    stale_at: Option<Instant>,
}

impl Kept {
    fn empty(policy: Weak<PolicyState>) -> Kept {
        Kept {
            policy,
            version: 0,
            facts: None,
            links: None,
            now: None,
            roster: Roster::new(Vec::new()),
            inputs: Vec::new(),
            runs: Vec::new(),
            stale_at: BinaryHeap::new(),
        }
    }

    /// Member `name`'s index (in `group`, if given).
    fn index(&self, group: Option<&str>, name: &str) -> Option<usize> {
        let members = self.roster.candidates();
        self.runs
            .iter()
            .filter(|(g, _)| group.is_none_or(|group| g == group))
            .find_map(|(_, run)| {
                members[run.clone()]
                    .binary_search_by(|c| c.connector.as_str().cmp(name))
                    .ok()
                    .map(|i| run.start + i)
            })
    }

    /// Judges member `i` at `now` from its inputs.
    fn judge(&mut self, i: usize, now: Instant, rules: Rules, judge: Judge<'_>) {
        let Inputs { link, fact, .. } = self.inputs[i];
        let mut stale_at = None;
        let status = match fact {
            None => Status::Unknown,
            Some(f) => {
                let s = judge(f.status, now.saturating_duration_since(f.checked_at), link);
                if s != Status::Unknown {
                    let limit = policy::stale_limit(rules.interval, rules.stale_after, link.cycle);
                    stale_at = f.checked_at.checked_add(limit);
                }
                s
            }
        };
        if stale_at != self.inputs[i].stale_at {
            self.inputs[i].stale_at = stale_at;
            if let Some(at) = stale_at {
                self.stale_at.push(Reverse((at, i)));
            }
        }
        self.roster.set_link(i, link.connected, link.drained);
        self.roster.set_status(i, status);
        self.roster.set_rtt(i, fact.and_then(|f| f.rtt));
    }

    /// Builds the roster from every member (`groups`, in `segment`'s group
    /// order), none judged yet.
    fn build(&mut self, state: &PolicyState, segment: &Segment, groups: Vec<Vec<(String, Link)>>) {
        let (candidates, links, runs) = unjudged(state, segment, groups);
        self.inputs.clear();
        self.stale_at.clear();
        self.inputs.extend(links.into_iter().map(|link| Inputs {
            link,
            fact: None,
            stale_at: None,
        }));
        self.runs.clear();
        self.runs
            .extend(segment.connector_groups.iter().cloned().zip(runs));
        self.roster = Roster::new(candidates);
    }

    /// Applies what a decision read at `now`, returning the members to
    /// judge; `None` when a link names a member the roster does not know
    /// (it must be built again).
    fn apply(
        &mut self,
        facts: Facts,
        links: Vec<(String, String, Link)>,
        now: Instant,
    ) -> Option<Vec<usize>> {
        let mut judged: Vec<usize> = Vec::new();
        for (name, group, link) in links {
            let i = self.index(Some(&group), &name)?;
            self.inputs[i].link = link;
            judged.push(i);
        }
        match facts {
            Facts::Absent => {
                for (i, input) in self.inputs.iter_mut().enumerate() {
                    if input.fact.take().is_some() {
                        judged.push(i);
                    }
                }
                self.facts = None;
            }
            Facts::All { at, reports } => {
                let mut found = vec![None; self.inputs.len()];
                for (name, fact) in reports {
                    if let Some(i) = self.index(None, &name) {
                        found[i] = Some(fact);
                    }
                }
                for (i, fact) in found.into_iter().enumerate() {
                    self.inputs[i].fact = fact;
                    judged.push(i);
                }
                self.facts = Some(at);
            }
            Facts::Changed { at, changed } => {
                for (name, fact) in changed {
                    if let Some(i) = self.index(None, &name) {
                        self.inputs[i].fact = fact;
                        judged.push(i);
                    }
                }
                self.facts = Some(at);
            }
        }
        while let Some(Reverse((at, i))) = self.stale_at.peek().copied() {
            if at >= now {
                break;
            }
            self.stale_at.pop();
            if self.inputs[i].stale_at == Some(at) {
                judged.push(i);
            }
        }
        if self.stale_at.len() > self.inputs.len().saturating_mul(4).saturating_add(64) {
            self.stale_at = (self.inputs.iter().enumerate())
                .filter_map(|(i, input)| Some(Reverse((input.stale_at?, i))))
                .collect();
        }
        Some(judged)
    }
}

impl Rosters {
    /// Where `key`'s roster stands under `state` (made empty, or emptied
    /// for another policy); `None` when the rosters hold
    /// [`MEMBERS_MAX`] members already and `key` has none.
    pub(crate) fn ticket(&self, key: &AppKey, state: &Arc<PolicyState>) -> Option<Ticket> {
        let kept = {
            let mut map = lock(&self.map);
            if let Some(k) = map.kept.get(key) {
                Arc::clone(k)
            } else {
                if map.members >= MEMBERS_MAX {
                    return None;
                }
                let k = Arc::new(Mutex::new(Kept::empty(Arc::downgrade(state))));
                map.kept.insert(key.clone(), Arc::clone(&k));
                k
            }
        };
        let mut k = lock(&kept);
        if !std::ptr::eq(k.policy.as_ptr(), Arc::as_ptr(state)) {
            *k = Kept::empty(Arc::downgrade(state));
        }
        Some(Ticket {
            version: k.version,
            facts: k.facts,
            links: k.links,
        })
    }

    /// Applies what a decision read with a ticket (`facts` and `links`) at
    /// `now` to `key`'s roster and runs `decide` on it, under its lock
    /// (`decide` takes no lock); `None` when another decision applied
    /// changes since `ticket`, or the roster must be built again (the
    /// next decision builds it). Links read whole build the roster, and
    /// then `facts` must be whole too.
    pub(crate) fn decide<R>(
        &self,
        key: &AppKey,
        (state, segment): (&Arc<PolicyState>, &Segment),
        (ticket, facts, links): (Ticket, Facts, Links),
        now: Instant,
        (rules, judge): (Rules, Judge<'_>),
        decide: impl FnOnce(&Roster) -> R,
    ) -> Option<R> {
        let kept = Arc::clone(lock(&self.map).kept.get(key)?);
        let (result, grew) = {
            let mut k = lock(&kept);
            if k.version != ticket.version || !std::ptr::eq(k.policy.as_ptr(), Arc::as_ptr(state)) {
                return None;
            }
            k.version += 1;
            let before = k.roster.len();
            let now = k.now.map_or(now, |t| t.max(now));
            k.now = Some(now);
            let changed = match links {
                Links::All { at, groups } => {
                    if matches!(facts, Facts::Changed { .. }) {
                        k.links = None;
                        return None;
                    }
                    k.build(state, segment, groups);
                    k.links = Some(at);
                    Vec::new()
                }
                Links::Changed { at, changed } => {
                    k.links = Some(at);
                    changed
                }
            };
            let Some(judged) = k.apply(facts, changed, now) else {
                k.links = None;
                k.facts = None;
                return None;
            };
            for i in judged {
                k.judge(i, now, rules, judge);
            }
            let grew = k.roster.len().cast_signed() - before.cast_signed();
            (decide(&k.roster), grew)
        };
        if grew != 0 {
            let mut map = lock(&self.map);
            map.members = map.members.saturating_add_signed(grew);
        }
        Some(result)
    }

    /// Forgets every roster (the policy changed).
    pub(crate) fn clear(&self) {
        let mut map = lock(&self.map);
        map.kept.clear();
        map.members = 0;
    }
}

/// Every member of `segment`'s groups (`groups`, one list per group in the
/// segment's order) as a candidate not judged yet: Unknown, no RTT, its
/// group's location. Returns the candidates, each one's link, and the
/// range each group's members take.
pub(crate) fn unjudged(
    state: &PolicyState,
    segment: &Segment,
    groups: impl IntoIterator<Item = Vec<(String, Link)>>,
) -> (Vec<Candidate>, Vec<Link>, Vec<Range<usize>>) {
    let mut candidates = Vec::new();
    let mut links = Vec::new();
    let mut runs = Vec::with_capacity(segment.connector_groups.len());
    for (group, members) in segment.connector_groups.iter().zip(groups) {
        let location = state.policy().group(group).and_then(|g| g.location);
        let start = candidates.len();
        for (name, link) in members {
            candidates.push(Candidate {
                connector: name,
                group: group.clone(),
                connected: link.connected,
                drained: link.drained,
                status: Status::Unknown,
                rtt: None,
                location,
            });
            links.push(link);
        }
        runs.push(start..candidates.len());
    }
    (candidates, links, runs)
}
