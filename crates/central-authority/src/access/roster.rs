//! A decision on an application's roster (`state::rosters`): for a segment
//! that is not on-access, the choice and its explanation read what changed
//! since the last decision and what the explanation lists, not every
//! member of the segment's groups. On-access decisions forward the access
//! to every connected candidate anyway, and build their slice
//! (`access::decide::candidates`).

use std::sync::Arc;
use std::time::Instant;

use policy::{
    AppKey, Decision, Explanation, HealthReporting, Proximity, RefusalReason, Segment, Strategy,
};
use rand::Rng;

use crate::state::authority::Authority;
use crate::state::policy_state::PolicyState;
use crate::state::registry::Links;
use crate::state::rosters::Rules;

/// A decision's choice (connector and group) or refusal, and its
/// explanation.
pub(crate) type Decided = (Result<(String, String), RefusalReason>, Explanation);

/// How many times a decision reads the changes again when other decisions
/// on the same roster applied theirs first, before it builds its slice.
const TRIES: usize = 3;

/// The decision on `key`'s roster at `now` under `how` (the segment's
/// mode, the strategy, the user's proximity), drawing from `rng`; `None`
/// when there is no roster to decide on (too many kept, or decisions
/// on it raced this one `TRIES` times): the caller builds the slice.
pub(crate) fn decide_on_roster<R: Rng + ?Sized>(
    authority: &Authority,
    state: &Arc<PolicyState>,
    segment: &Segment,
    key: &AppKey,
    how: (HealthReporting, Strategy, Proximity),
    now: Instant,
    rng: &mut R,
) -> Option<Decided> {
    let (mode, strategy, proximity) = how;
    let rules = Rules {
        interval: segment.report_interval,
        stale_after: state.settings().stale_after_intervals,
    };
    let judge =
        |stored, age, link| Authority::effective(state, segment, stored, age, Some(link), true).0;
    for _ in 0..TRIES {
        let ticket = authority.rosters().ticket(key, state)?;
        let links = authority
            .registry()
            .links(&segment.connector_groups, ticket.links);
        let since = match links {
            Links::All { .. } => None,
            Links::Changed { .. } => ticket.facts,
        };
        let facts = authority.health().facts(key, since);
        let decided = authority.rosters().decide(
            key,
            (state, segment),
            (ticket, facts, links),
            now,
            (rules, &judge),
            |roster| {
                let decision = roster.select_with(mode, strategy, proximity, &mut *rng);
                let (chosen, decision) = match decision {
                    Decision::Selected { index } => {
                        let c = roster.get(index);
                        let names = c.map(|c| (c.connector.clone(), c.group.clone()));
                        (Some(index), names.ok_or(RefusalReason::NoConnector))
                    }
                    Decision::Refused(reason) => (None, Err(reason)),
                };
                (decision, roster.explain(chosen, mode, strategy, proximity))
            },
        );
        if decided.is_some() {
            return decided;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::decide_on_roster;
    use crate::access;
    use std::sync::Arc;
    use std::time::{Duration, Instant, SystemTime};

    use policy::{
        AddressResult, AppKey, Decision, Host, Method, Protocol, Proximity, Segment, Status,
        Strategy,
    };
    use protocol::v1;
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};
    use tokio::sync::{Notify, mpsc};

    use super::Decided;
    use crate::state::authority::Authority;
    use crate::state::health::{Report, UnknownCause};
    use crate::state::policy_state::PolicyState;
    use crate::state::registry::{Arrival, LiveSession};
    use crate::store::{DrainRecord, Store};

    const POLICY: &str = r#"
        [server]
        allow_short_secrets = true
        [[connector_groups]]
        name = "a"
        provisioning_key = "k"
        location = { latitude = 40.7, longitude = -74.0 }
        [[connector_groups]]
        name = "b"
        provisioning_key = "k"
        [[segments]]
        name = "healthy"
        applications = ["h.test"]
        tcp_ports = ["80"]
        health_reporting = "continuous"
        report_interval_s = 1
        connector_groups = ["a", "b"]
        [[segments]]
        name = "grouped"
        applications = ["g.test"]
        tcp_ports = ["80"]
        health_reporting = "continuous"
        report_interval_s = 1
        strategy = "group"
        connector_groups = ["b", "a"]
        [[segments]]
        name = "near"
        applications = ["n.test"]
        tcp_ports = ["80"]
        health_reporting = "continuous"
        report_interval_s = 2
        strategy = "nearest"
        connector_groups = ["a", "b"]
        [[segments]]
        name = "plain"
        applications = ["p.test"]
        tcp_ports = ["80"]
        health_reporting = "none"
        connector_groups = ["a"]
    "#;

    /// Connectors the runs use: more than an explanation lists.
    const CONNECTORS: usize = 48;

    fn authority() -> Authority {
        let config = crate::Config::from_toml(POLICY, std::path::Path::new(".")).expect("valid");
        Authority::with_trust(config, None, Store::in_memory().expect("db"))
    }

    fn key(segment: &Segment) -> AppKey {
        let host = segment.applications[0].to_string();
        AppKey {
            segment: segment.name.clone(),
            host: Host::parse(&host).expect("host"),
            protocol: Protocol::Tcp,
            port: 80,
        }
    }

    fn connect(a: &Authority, i: usize, id: u64) {
        let name = format!("c{i:02}");
        let (tx, _) = mpsc::channel(1);
        a.registry().open_pending(
            &name,
            LiveSession {
                id,
                label: format!("s{id}"),
                cert_serial: None,
                key_sha256: None,
                cert_root: None,
                tx,
                kill: Arc::new(Notify::new()),
                draining: None,
            },
        );
        let hello = v1::Hello::default();
        let group = if i.is_multiple_of(3) { "b" } else { "a" };
        let arrival = Arrival {
            name: &name,
            group,
            hello: &hello,
        };
        assert!(a.registry().register(arrival, id, |_| 0).is_ok());
    }

    fn report(a: &Authority, key: &AppKey, i: usize, rng: &mut SmallRng, now: Instant) {
        let status =
            [Status::Up, Status::Unhealthy, Status::Down, Status::Unknown][rng.random_range(0..4)];
        let reachable = status != Status::Down && rng.random_bool(0.8);
        let age = Duration::from_millis(rng.random_range(0..4_000));
        let report = Report {
            group: "a".into(),
            status,
            addresses: [AddressResult {
                address: "127.0.0.1".parse().expect("ip"),
                reachable,
                method: Method::Tcp,
                rtt: Duration::from_micros(rng.random_range(100..50_000)),
                failure: None,
                check: None,
            }]
            .into_iter()
            .collect(),
            dns_error: None,
            received_at: now,
            checked_at: now.checked_sub(age).unwrap_or(now),
            received_wall: SystemTime::now(),
            checked_at_unix_ms: 0,
            unknown_cause: (status == Status::Unknown).then_some(UnknownCause::Reported),
            rtt: None,
        };
        a.health()
            .record(key.clone(), &format!("c{i:02}"), report, 4);
    }

    /// The decision without a roster: the slice of every candidate.
    fn on_slice(
        a: &Authority,
        state: &PolicyState,
        segment: &Segment,
        key: &AppKey,
        how: (policy::HealthReporting, Strategy, Proximity),
        now: Instant,
        seed: u64,
    ) -> Decided {
        let (mode, strategy, proximity) = how;
        let candidates = access::decide::candidates(a, state, segment, key, now);
        let mut rng = SmallRng::seed_from_u64(seed);
        let (chosen, decision) =
            match policy::select_with(&candidates, mode, strategy, proximity, &mut rng) {
                Decision::Selected { index } => (
                    Some(index),
                    Ok((
                        candidates[index].connector.clone(),
                        candidates[index].group.clone(),
                    )),
                ),
                Decision::Refused(r) => (None, Err(r)),
            };
        let e = policy::explain_owned(candidates, chosen, mode, strategy, proximity);
        (decision, e)
    }

    /// One random step: a connection, a disconnection, a drain or its
    /// end, a deletion, reports, or time passing.
    fn step(a: &Authority, keys: &[AppKey], rng: &mut SmallRng, now: &mut Instant, id: &mut u64) {
        let i = rng.random_range(0..CONNECTORS);
        let name = format!("c{i:02}");
        match rng.random_range(0..100) {
            0..10 => {
                *id += 1;
                connect(a, i, *id);
            }
            10..14 => {
                if a.registry().close(&name).is_some() {
                    a.forget_connector(&name, UnknownCause::Disconnected);
                }
            }
            14..18 => a.registry().drained(DrainRecord {
                connector: name,
                since_ms: 1,
                actor_kind: "token".into(),
                actor: "t".into(),
            }),
            18..22 => a.registry().undrained(&name),
            22..23 => a.registry().forget(&name),
            23..80 => {
                let key = &keys[rng.random_range(0..keys.len())];
                report(a, key, i, rng, *now);
            }
            _ => *now += Duration::from_millis(rng.random_range(0..2_500)),
        }
    }

    /// Over random connections, disconnections, drains, deletions,
    /// reports and time passing (results turning stale), every decision
    /// on a roster chooses and explains as the slice of every candidate
    /// does, for each strategy and mode, with and without a user's
    /// location.
    #[test]
    fn a_roster_decides_and_explains_as_the_slice_does() {
        for seed in 0..12u64 {
            let a = authority();
            let state = a.snapshot();
            let segments: Vec<&Segment> = state.policy().segments.iter().collect();
            let keys: Vec<AppKey> = segments.iter().map(|s| key(s)).collect();
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut now = Instant::now();
            let mut id = 0;
            let mut rostered = 0;
            for n in 0..400u64 {
                step(&a, &keys, &mut rng, &mut now, &mut id);
                if !n.is_multiple_of(3) {
                    continue;
                }
                for (segment, key) in segments.iter().zip(&keys) {
                    let user =
                        (n % 2 == 0).then(|| policy::Location::new(51.5, -0.1).expect("a place"));
                    let proximity = Proximity {
                        tolerance: state.settings().nearest_tolerance,
                        user,
                    };
                    let strategy = segment.strategy.unwrap_or(state.settings().strategy);
                    let how = (segment.health_reporting, strategy, proximity);
                    let pick = n * 31 + seed;
                    let slice = on_slice(&a, &state, segment, key, how, now, pick);
                    let mut r = SmallRng::seed_from_u64(pick);
                    let kept = decide_on_roster(&a, &state, segment, key, how, now, &mut r);
                    let kept = kept.expect("a roster decides");
                    assert_eq!(
                        kept, slice,
                        "seed {seed}, step {n}, segment {}",
                        segment.name
                    );
                    rostered += 1;
                }
            }
            assert!(rostered > 0);
        }
    }

    /// The answer through `resolve` (on the roster) after each change: a
    /// transition to Down, a drain, its end, a disconnection and a stale
    /// result each move the choice, or refuse, as the slice would.
    #[tokio::test]
    async fn each_change_moves_the_next_answer() {
        use crate::access::decide::AccessRequest;
        let a = authority();
        let state = a.snapshot();
        let segment = &state.policy().segments[0];
        let key = key(segment);
        let answer = async |a: &Authority| {
            let request = AccessRequest {
                host: "h.test".into(),
                protocol: Protocol::Tcp,
                port: 80,
            };
            let outcome = access::decide::resolve(a, request)
                .await
                .expect("a usable request");
            outcome.decision.map(|s| s.connector).map_err(|r| r.reason)
        };
        let set = |i: usize, status: Status, age: Duration| {
            let now = Instant::now();
            let report = Report {
                group: "a".into(),
                status,
                addresses: Default::default(),
                dns_error: None,
                received_at: now,
                checked_at: now.checked_sub(age).expect("after the clock's start"),
                received_wall: SystemTime::now(),
                checked_at_unix_ms: 0,
                unknown_cause: None,
                rtt: None,
            };
            a.health()
                .record(key.clone(), &format!("c{i:02}"), report, 4);
        };
        for (i, id) in [(1, 1), (2, 2)] {
            connect(&a, i, id);
            set(i, Status::Up, Duration::ZERO);
        }
        let both = ["c01".to_owned(), "c02".to_owned()];
        let first = answer(&a).await.expect("selected");
        assert!(both.contains(&first));
        set(1, Status::Down, Duration::ZERO);
        for _ in 0..8 {
            assert_eq!(answer(&a).await, Ok("c02".to_owned()), "c01 is Down");
        }
        a.registry().drained(DrainRecord {
            connector: "c02".into(),
            since_ms: 1,
            actor_kind: "token".into(),
            actor: "t".into(),
        });
        assert_eq!(answer(&a).await, Err(policy::RefusalReason::AllDown));
        a.registry().undrained("c02");
        assert_eq!(answer(&a).await, Ok("c02".to_owned()));
        assert!(a.registry().close("c02").is_some());
        a.forget_connector("c02", UnknownCause::Disconnected);
        assert_eq!(answer(&a).await, Err(policy::RefusalReason::AllDown));
        set(1, Status::Up, Duration::ZERO);
        assert_eq!(answer(&a).await, Ok("c01".to_owned()));
        // Older than 3 intervals of 1 s and the cycle: stale, Unknown.
        set(1, Status::Up, Duration::from_secs(600));
        assert_eq!(answer(&a).await, Err(policy::RefusalReason::NoHealthReport));
    }
}
