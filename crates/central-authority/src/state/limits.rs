//! Rate limits on attempts, with their state: failed bearer tokens and
//! failed enrollments per source address ([`Throttle`]) and renewals per
//! connector ([`RenewLimit`]). `trust::throttle` and `trust::renew` consult
//! them; `Authority` holds one of each.
//!
//! Throttling of guesses: a source that used up its allowance is refused
//! *before* its next attempt is even compared, until the allowance refills.
//! A whole-CA limit on failures is the last resort against a guesser with
//! many addresses; it is consulted only after the per-source one and counts
//! only failures, so one flooding source is stopped by its own limit and
//! cannot starve everyone else.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::HashMapStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::error::RenewError;
use crate::state::sync::lock;

/// What a throttle guards (the `what` label of `reach_ca_throttled_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guarded {
    /// Bearer tokens (HTTP API and gRPC).
    Token,
    /// Connector enrollments (provisioning keys).
    Enrollment,
}

impl Guarded {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Guarded::Token => "token",
            Guarded::Enrollment => "enrollment",
        }
    }
}

/// Which limit refused an attempt (the `scope` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The source address used up its own allowance of failures.
    Source,
    /// The whole CA saw too many failures (many sources at once).
    Global,
}

impl Refused {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Source => "source",
            Refused::Global => "global",
        }
    }
}

/// Allowances of failed attempts.
#[derive(Clone, Copy, Debug)]
pub struct Quotas {
    /// Failures one source address may make in a burst…
    pub source_burst: u32,
    /// …and one more per this period after.
    pub source_period: Duration,
    /// Failures the whole CA accepts per second…
    pub global_per_second: u32,
    /// …with this burst.
    pub global_burst: u32,
}

impl Quotas {
    /// Ten failures per address, then one every six seconds (a person who
    /// mistypes a token is not slowed; a guesser gets ten a minute), and
    /// 20 per second (burst 100) for the whole CA: far above any real
    /// fleet's mistakes, far below guessing.
    pub const DEFAULT: Quotas = Quotas {
        source_burst: 10,
        source_period: Duration::from_secs(6),
        global_per_second: 20,
        global_burst: 100,
    };
}

type Keyed<C> =
    RateLimiter<IpAddr, HashMapStateStore<IpAddr>, C, NoOpMiddleware<<C as Clock>::Instant>>;
type Direct<C> = RateLimiter<NotKeyed, InMemoryState, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// One guarded operation's throttle. `C` is governor's clock: the real
/// monotonic one in the CA, a fake one in tests.
pub struct Throttle<C: Clock = DefaultClock> {
    clock: C,
    source: Keyed<C>,
    global: Direct<C>,
    /// Sources refused until the given time (their allowance is used up).
    blocked: Mutex<HashMap<IpAddr, C::Instant>>,
    /// Everyone refused until the given time (the whole-CA allowance is
    /// used up).
    global_blocked: Mutex<Option<C::Instant>>,
    /// Whether either of the above may refuse anyone: while neither holds
    /// an entry (nobody guessed lately), `admit` takes no lock, so a
    /// request with a good token does not serialise the workers on them.
    /// Set under the lock that adds an entry, cleared by `retain_recent`
    /// once both are empty.
    refusing: AtomicBool,
}

impl<C: Clock> std::fmt::Debug for Throttle<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Throttle")
            .field("sources", &self.source.len())
            .finish_non_exhaustive()
    }
}

impl Throttle<DefaultClock> {
    /// A throttle on the real clock.
    pub fn new(quotas: Quotas) -> Self {
        Self::with_clock(quotas, DefaultClock::default())
    }
}

/// Attempts made without a known source (a router served without the
/// listener, as in unit tests) share this key.
const UNKNOWN_SOURCE: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

impl<C: Clock + Clone> Throttle<C> {
    /// A throttle on `clock`.
    pub fn with_clock(quotas: Quotas, clock: C) -> Self {
        let one = NonZeroU32::MIN;
        let source = Quota::with_period(quotas.source_period.max(Duration::from_millis(1)))
            .map(|q| q.allow_burst(NonZeroU32::new(quotas.source_burst).unwrap_or(one)))
            .unwrap_or_else(|| Quota::per_second(one));
        let global = Quota::per_second(NonZeroU32::new(quotas.global_per_second).unwrap_or(one))
            .allow_burst(NonZeroU32::new(quotas.global_burst).unwrap_or(one));
        Throttle {
            source: RateLimiter::hashmap_with_clock(source, clock.clone()),
            global: RateLimiter::direct_with_clock(global, clock.clone()),
            clock,
            blocked: Mutex::new(HashMap::new()),
            global_blocked: Mutex::new(None),
            refusing: AtomicBool::new(false),
        }
    }

    /// Whether an attempt from `source` may be evaluated now: `Err` names
    /// the limit that refuses it. The source's own limit is consulted first.
    pub fn admit(&self, source: Option<IpAddr>) -> Result<(), Refused> {
        if !self.refusing.load(Ordering::Acquire) {
            return Ok(());
        }
        let source = source.unwrap_or(UNKNOWN_SOURCE);
        let now = self.clock.now();
        if lock(&self.blocked)
            .get(&source)
            .is_some_and(|&until| now < until)
        {
            return Err(Refused::Source);
        }
        if lock(&self.global_blocked).is_some_and(|until| now < until) {
            return Err(Refused::Global);
        }
        Ok(())
    }

    /// Counts a failed attempt from `source`: when it uses up the source's
    /// allowance, the source is refused until the allowance refills; only
    /// failures within a source's allowance count towards the whole CA's.
    pub fn failed(&self, source: Option<IpAddr>) {
        let source = source.unwrap_or(UNKNOWN_SOURCE);
        if let Err(not_until) = self.source.check_key(&source) {
            let mut blocked = lock(&self.blocked);
            blocked.insert(source, not_until.earliest_possible());
            self.refusing.store(true, Ordering::Release);
            return;
        }
        if let Err(not_until) = self.global.check() {
            let mut global = lock(&self.global_blocked);
            *global = Some(not_until.earliest_possible());
            self.refusing.store(true, Ordering::Release);
        }
    }

    /// Forgets sources whose allowance has refilled, so the maps stay as
    /// small as the set of recent guessers (called by housekeeping).
    pub fn retain_recent(&self) {
        self.source.retain_recent();
        self.source.shrink_to_fit();
        let now = self.clock.now();
        let mut blocked = lock(&self.blocked);
        blocked.retain(|_, until| now < *until);
        let mut global = lock(&self.global_blocked);
        if global.is_some_and(|until| now >= until) {
            *global = None;
        }
        // Both locks held: `failed` cannot add an entry meanwhile.
        if blocked.is_empty() && global.is_none() {
            self.refusing.store(false, Ordering::Release);
        }
    }

    /// Sources the throttle remembers (tests: the map stays bounded).
    pub fn tracked(&self) -> usize {
        self.source.len() + lock(&self.blocked).len()
    }
}

type ByName<C> =
    RateLimiter<String, HashMapStateStore<String>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// How often one connector may renew: each renewal signs a certificate and
/// records it, so a connector (or a stolen certificate) renewing in a loop
/// would cost CPU and grow the store without end. A healthy connector renews
/// at two thirds of its lifetime (hours to months); the burst leaves room
/// for retries after a lost response and for tests with lifetimes of a
/// minute. Counted per connector name, whichever certificate it presents.
pub struct RenewLimit<C: Clock = DefaultClock> {
    limiter: ByName<C>,
    clock: C,
    burst: u32,
    period: Duration,
}

impl<C: Clock> std::fmt::Debug for RenewLimit<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenewLimit")
            .field("burst", &self.burst)
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}

impl RenewLimit<DefaultClock> {
    /// Five renewals per connector, then one per minute.
    pub fn new() -> Self {
        Self::with_clock(5, Duration::from_secs(60), DefaultClock::default())
    }
}

impl Default for RenewLimit<DefaultClock> {
    fn default() -> Self {
        Self::new()
    }
}

impl<C: Clock + Clone> RenewLimit<C> {
    /// `burst` renewals per connector, then one per `period`, on `clock`.
    pub fn with_clock(burst: u32, period: Duration, clock: C) -> Self {
        let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        let period = period.max(Duration::from_millis(1));
        let quota = Quota::with_period(period)
            .map(|q| q.allow_burst(burst))
            .unwrap_or_else(|| Quota::per_minute(burst));
        RenewLimit {
            limiter: RateLimiter::hashmap_with_clock(quota, clock.clone()),
            clock,
            burst: burst.get(),
            period,
        }
    }

    /// Takes one renewal of `name`'s allowance, or says when it refills.
    pub fn admit(&self, name: &str) -> Result<(), RenewError> {
        self.limiter
            .check_key(&name.to_owned())
            .map_err(|not_until| {
                let wait = not_until.wait_time_from(self.clock.now());
                RenewError::TooFrequent {
                    name: name.to_owned(),
                    burst: self.burst,
                    period_s: self.period.as_secs(),
                    retry_after_s: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
                }
            })
    }

    /// Forgets connectors whose allowance is full again (housekeeping).
    pub fn retain_recent(&self) {
        self.limiter.retain_recent();
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    fn quotas() -> Quotas {
        Quotas {
            source_burst: 3,
            source_period: Duration::from_secs(10),
            global_per_second: 1,
            global_burst: 5,
        }
    }

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
    }

    #[test]
    fn a_source_is_refused_after_its_burst_of_failures_until_it_refills() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(quotas(), clock.clone());
        for _ in 0..3 {
            assert_eq!(t.admit(ip(2)), Ok(()));
            t.failed(ip(2));
        }
        // The fourth failure is over the allowance: refused from now on.
        assert_eq!(t.admit(ip(2)), Ok(()));
        t.failed(ip(2));
        assert_eq!(t.admit(ip(2)), Err(Refused::Source));
        // Another source is untouched.
        assert_eq!(t.admit(ip(1)), Ok(()));
        clock.advance(Duration::from_secs(9));
        assert_eq!(t.admit(ip(2)), Err(Refused::Source));
        clock.advance(Duration::from_secs(1));
        assert_eq!(t.admit(ip(2)), Ok(()));
    }

    #[test]
    fn successes_cost_nothing() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(quotas(), clock);
        // Admitting without failing (a good token) never throttles.
        for _ in 0..1000 {
            assert_eq!(t.admit(ip(1)), Ok(()));
        }
    }

    #[test]
    fn a_refused_source_does_not_use_up_the_global_allowance() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(quotas(), clock);
        // One source floods: only its first three failures count globally
        // (global burst 5), so everyone else still gets in.
        for _ in 0..1000 {
            if t.admit(ip(2)).is_ok() {
                t.failed(ip(2));
            }
        }
        assert_eq!(t.admit(ip(1)), Ok(()));
    }

    #[test]
    fn many_sources_at_once_trip_the_global_limit_as_a_last_resort() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(quotas(), clock.clone());
        for last in 10..16 {
            t.failed(ip(last));
        }
        assert_eq!(t.admit(ip(1)), Err(Refused::Global));
        clock.advance(Duration::from_secs(1));
        assert_eq!(t.admit(ip(1)), Ok(()));
    }

    #[test]
    fn the_maps_forget_sources_that_refilled() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(
            Quotas {
                global_burst: 10_000,
                global_per_second: 10_000,
                ..quotas()
            },
            clock.clone(),
        );
        for last in 0..=255 {
            for _ in 0..4 {
                t.failed(ip(last));
            }
        }
        assert!(t.tracked() >= 256);
        clock.advance(Duration::from_secs(60));
        t.retain_recent();
        assert_eq!(t.tracked(), 0);
        assert_eq!(t.admit(ip(7)), Ok(()));
    }

    /// `admit` skips its locks while nobody is refused; forgetting every
    /// refused source must not turn refusing off for good.
    #[test]
    fn a_source_that_guesses_again_after_the_maps_were_cleared_is_refused_again() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(quotas(), clock.clone());
        for round in 0..2 {
            for _ in 0..4 {
                t.failed(ip(2));
            }
            assert_eq!(t.admit(ip(2)), Err(Refused::Source), "round {round}");
            clock.advance(Duration::from_secs(60));
            t.retain_recent();
            assert_eq!(t.admit(ip(2)), Ok(()), "round {round}: refilled");
        }
    }

    #[test]
    fn a_connector_renewing_in_a_loop_is_refused_after_its_burst_until_the_period_passes() {
        let clock = FakeRelativeClock::default();
        let limit = RenewLimit::with_clock(3, Duration::from_secs(60), clock.clone());
        for _ in 0..3 {
            limit.admit("c1").expect("within the burst");
        }
        let refused = limit.admit("c1").expect_err("past the burst");
        assert_eq!(refused.label(), "renew_rate_limited");
        let RenewError::TooFrequent { retry_after_s, .. } = &refused else {
            panic!("{refused:?}");
        };
        assert_eq!(*retry_after_s, 60);
        assert!(refused.to_string().contains("\"c1\""), "{refused}");
        assert_eq!(
            tonic::Status::from(refused).code(),
            tonic::Code::ResourceExhausted
        );
        // Another connector has its own allowance.
        limit.admit("c2").expect("another connector");
        clock.advance(Duration::from_secs(59));
        assert!(limit.admit("c1").is_err(), "not refilled yet");
        clock.advance(Duration::from_secs(1));
        limit.admit("c1").expect("one more after the period");
        assert!(limit.admit("c1").is_err(), "and only one");
    }
}
