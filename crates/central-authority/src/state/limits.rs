//! Rate limits on attempts, with their state: failed bearer tokens, failed
//! enrollments and sign-ins started per source ([`Throttle`]; a source is
//! an IPv4 address or an IPv6 /64, at most `max_sources` of them apart) and
//! renewals per connector ([`RenewLimit`]). `trust::throttle` and
//! `trust::renew` consult them; `Authority` holds them.
//!
//! Throttling of guesses counts failures only: an attempt is always
//! evaluated first (a constant-time compare), so a valid token or key is
//! never refused, whatever its source sent before. A source that used up
//! its allowance of failures gets its further failures answered "throttled"
//! with the time its allowance refills (`Retry-After`), and a log line at
//! most once a minute. A whole-CA limit on failures is the last resort
//! against a guesser with many addresses; it is consulted only after the
//! per-source one and counts only failures, so one flooding source is
//! stopped by its own limit and cannot starve everyone else, and it never
//! touches a valid attempt.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::HashMapStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::error::RenewError;
use crate::ground::sync::lock;

/// What a throttle guards (the `what` label of `reach_ca_throttled_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guarded {
    /// Bearer tokens (HTTP API and gRPC).
    Token,
    /// Connector enrollments (provisioning keys).
    Enrollment,
    /// Sign-ins started (`GET /auth/login`): each writes a store row, so
    /// every call counts, not only failures.
    Login,
}

impl Guarded {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Guarded::Token => "token",
            Guarded::Enrollment => "enrollment",
            Guarded::Login => "login",
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
    /// Addresses are counted by their network of this many bits: IPv4…
    pub ipv4_prefix: u8,
    /// …and IPv6 (a /64 is one subscriber's: a host has as many addresses
    /// in it as it likes).
    pub ipv6_prefix: u8,
    /// Sources the throttle keeps apart; beyond it new sources share one
    /// allowance, so a spray of addresses cannot grow the table.
    pub max_sources: usize,
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
        ipv4_prefix: 32,
        ipv6_prefix: 64,
        max_sources: 65_536,
    };
}

impl Quotas {
    /// The failed attempts' quotas and the sign-ins' of `[limits]`.
    pub fn of(limits: &crate::config::Limits) -> (Quotas, Quotas) {
        let keyed = Quotas {
            ipv4_prefix: limits.throttle_ipv4_prefix,
            ipv6_prefix: limits.throttle_ipv6_prefix,
            max_sources: limits.throttle_max_sources,
            ..Quotas::DEFAULT
        };
        let per_minute = limits.login_per_source_per_minute.max(1);
        let login = Quotas {
            source_burst: per_minute,
            source_period: Duration::from_secs(60) / per_minute,
            global_per_second: limits.login_per_second,
            global_burst: limits.login_per_second.saturating_mul(10),
            ..keyed
        };
        (keyed, login)
    }
}

/// `source`'s network of `ipv4_prefix` or `ipv6_prefix` bits (an
/// IPv4-mapped IPv6 address as IPv4): what the throttle counts by.
pub fn network(source: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> IpAddr {
    let v4 = |a: Ipv4Addr| {
        let mask = u32::MAX
            .checked_shl(32 - u32::from(ipv4_prefix.min(32)))
            .unwrap_or(0);
        IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
    };
    match source {
        IpAddr::V4(a) => v4(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(mapped) => v4(mapped),
            None => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(ipv6_prefix.min(128)))
                    .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        },
    }
}

type Keyed<C> =
    RateLimiter<IpAddr, HashMapStateStore<IpAddr>, C, NoOpMiddleware<<C as Clock>::Instant>>;
type Direct<C> = RateLimiter<NotKeyed, InMemoryState, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// How often a throttled source is logged: one line per source per this
/// period, with the count of failures refused since the last line.
pub const LOG_EVERY: Duration = Duration::from_secs(60);

/// A failure answered "throttled": which limit, and when to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The limit that is used up.
    pub scope: Refused,
    /// Whole seconds until it refills (at least 1): the `Retry-After`.
    pub retry_after_s: u64,
    /// A log line is due: failures of this source refused since its last
    /// line, this one included.
    pub log: Option<u64>,
}

/// A source's log state: when its next line may be written, and the
/// refusals not yet reported.
#[derive(Clone, Copy, Debug)]
struct LogState<I> {
    next_at: I,
    unreported: u64,
}

/// One guarded operation's throttle. `C` is governor's clock: the real
/// monotonic one in the CA, a fake one in tests.
pub struct Throttle<C: Clock = DefaultClock> {
    clock: C,
    source: Keyed<C>,
    global: Direct<C>,
    /// Throttled sources' log lines (one per source per `LOG_EVERY`).
    logs: Mutex<HashMap<IpAddr, LogState<C::Instant>>>,
    /// The sources (networks) with an allowance of their own, with their
    /// last attempt: at most `max_sources`.
    admitted: Mutex<HashMap<IpAddr, C::Instant>>,
    /// How a source is keyed and how many are kept apart.
    quotas: Quotas,
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

/// Sources beyond `max_sources` share this key (`::`, no source's
/// network: the unspecified address never sends).
const OVERFLOW: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

/// Whole seconds in `wait`, rounded up, at least one.
fn whole_seconds(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

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
            logs: Mutex::new(HashMap::new()),
            admitted: Mutex::new(HashMap::new()),
            quotas,
        }
    }

    /// The key `source` is counted under: its network, if it has an
    /// allowance or the table has room for one; else the shared one.
    fn key(&self, source: IpAddr, now: C::Instant) -> IpAddr {
        let q = &self.quotas;
        let net = network(source, q.ipv4_prefix, q.ipv6_prefix);
        let mut admitted = lock(&self.admitted);
        if let Some(last) = admitted.get_mut(&net) {
            *last = now;
            return net;
        }
        if admitted.len() < q.max_sources {
            admitted.insert(net, now);
            return net;
        }
        OVERFLOW
    }

    /// Counts a failed attempt from `source` (a success is never counted
    /// nor refused). `Err` when the failure is over the source's allowance,
    /// or over the whole CA's: answer it "throttled" with the `Refusal`'s
    /// retry delay. Only failures within a source's allowance count
    /// towards the whole CA's.
    pub fn failed(&self, source: Option<IpAddr>) -> Result<(), Refusal> {
        let source = self.key(source.unwrap_or(UNKNOWN_SOURCE), self.clock.now());
        let (scope, not_until) = match self.source.check_key(&source) {
            Err(not_until) => (Refused::Source, not_until),
            Ok(()) => match self.global.check() {
                Ok(()) => return Ok(()),
                Err(not_until) => (Refused::Global, not_until),
            },
        };
        let now = self.clock.now();
        Err(Refusal {
            scope,
            retry_after_s: whole_seconds(not_until.wait_time_from(now)),
            log: self.log_due(source, now),
        })
    }

    /// Records one refusal of `source`; the count to log when its line is
    /// due (its first refusal, then at most once per `LOG_EVERY`).
    fn log_due(&self, source: IpAddr, now: C::Instant) -> Option<u64> {
        let mut logs = lock(&self.logs);
        let entry = logs.entry(source).or_insert(LogState {
            next_at: now,
            unreported: 0,
        });
        entry.unreported += 1;
        if now < entry.next_at {
            return None;
        }
        entry.next_at = now + LOG_EVERY.into();
        Some(std::mem::take(&mut entry.unreported))
    }

    /// Forgets sources whose allowance has refilled, so the maps stay as
    /// small as the set of recent guessers (called by housekeeping).
    /// Returns the log lines due of sources that stopped being refused
    /// (source, refusals since its last line), so no count goes unlogged.
    pub fn retain_recent(&self) -> Vec<(IpAddr, u64)> {
        self.source.retain_recent();
        self.source.shrink_to_fit();
        let now = self.clock.now();
        // A source quiet for as long as its allowance takes to refill has
        // nothing left to remember (what governor forgets too).
        let full = self.quotas.source_period * self.quotas.source_burst.max(1);
        lock(&self.admitted).retain(|_, last| now < *last + full.into());
        let mut due = Vec::new();
        lock(&self.logs).retain(|source, state| {
            if now < state.next_at {
                return true;
            }
            if state.unreported == 0 {
                return false;
            }
            due.push((*source, std::mem::take(&mut state.unreported)));
            state.next_at = now + LOG_EVERY.into();
            true
        });
        due.sort();
        due
    }

    /// Sources the throttle remembers (tests: the maps stay bounded):
    /// governor's map holds admitted sources and the shared key only.
    pub fn tracked(&self) -> usize {
        self.source.len().max(lock(&self.admitted).len()) + lock(&self.logs).len()
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
            ..Quotas::DEFAULT
        }
    }

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
    }

    #[test]
    fn failures_over_a_sources_allowance_are_throttled_with_the_time_it_refills() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(quotas(), clock.clone());
        for _ in 0..3 {
            assert_eq!(t.failed(ip(2)), Ok(()));
        }
        // The fourth failure is over the allowance (3, then one per 10 s).
        let refused = t.failed(ip(2)).expect_err("over the allowance");
        assert_eq!(refused.scope, Refused::Source);
        assert_eq!(refused.retry_after_s, 10);
        // Another source is untouched.
        assert_eq!(t.failed(ip(1)), Ok(()));
        clock.advance(Duration::from_millis(8_500));
        // Rounded up to whole seconds.
        assert_eq!(t.failed(ip(2)).map_err(|r| r.retry_after_s), Err(2));
        clock.advance(Duration::from_millis(1_500));
        assert_eq!(t.failed(ip(2)), Ok(()), "one more after the period");
        assert_eq!(t.failed(ip(2)).map_err(|r| r.retry_after_s), Err(10));
    }

    #[test]
    fn a_throttled_source_is_logged_once_a_minute_with_its_count() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(quotas(), clock.clone());
        let two = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
        // One guess a second for 130 s: most are refused (one passes per
        // 10 s refill); each line reports the refusals since the last one.
        let (mut unreported, mut lines) = (0, Vec::new());
        for second in 0..130u64 {
            if let Err(refused) = t.failed(Some(two)) {
                unreported += 1;
                if let Some(count) = refused.log {
                    assert_eq!(count, unreported, "at {second} s");
                    unreported = 0;
                    lines.push(second);
                }
            }
            clock.advance(Duration::from_secs(1));
        }
        assert_eq!(lines.len(), 3, "{lines:?}");
        for gap in lines.windows(2) {
            assert!((60..=62).contains(&(gap[1] - gap[0])), "{lines:?}");
        }
        // Another source has its own line at once.
        for _ in 0..3 {
            t.failed(ip(3)).expect("within the allowance");
        }
        assert_eq!(t.failed(ip(3)).map_err(|r| r.log), Err(Some(1)));
        // A source that stops is flushed by housekeeping once its minute
        // is up, so its last refusals are logged too.
        assert!(unreported > 0);
        assert!(t.retain_recent().is_empty(), "not a minute yet");
        clock.advance(Duration::from_secs(60));
        assert_eq!(t.retain_recent(), vec![(two, unreported)]);
        clock.advance(Duration::from_secs(60));
        assert!(t.retain_recent().is_empty());
        assert_eq!(t.tracked(), 0, "quiet sources are forgotten");
    }

    #[test]
    fn successes_are_never_counted_nor_refused() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(quotas(), clock);
        // A source far over its allowance: only its failures are answered
        // "throttled"; nothing here stands before a valid attempt (the
        // caller compares first and reports failures only).
        for _ in 0..100 {
            let _ = t.failed(ip(2));
        }
        assert_eq!(t.tracked(), 2);
    }

    #[test]
    fn a_throttled_source_does_not_use_up_the_global_allowance() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(quotas(), clock);
        // One source floods: only its first three failures count globally
        // (global burst 5), so everyone else's failures are still told
        // apart from guessing.
        for _ in 0..1000 {
            let _ = t.failed(ip(2));
        }
        assert_eq!(t.failed(ip(1)), Ok(()));
    }

    #[test]
    fn many_sources_at_once_trip_the_global_limit_as_a_last_resort() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(quotas(), clock.clone());
        for last in 10..15 {
            assert_eq!(t.failed(ip(last)), Ok(()));
        }
        let refused = t.failed(ip(15)).expect_err("over the global burst");
        assert_eq!((refused.scope, refused.retry_after_s), (Refused::Global, 1));
        clock.advance(Duration::from_secs(1));
        assert_eq!(t.failed(ip(1)), Ok(()));
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
                let _ = t.failed(ip(last));
            }
        }
        assert!(t.tracked() >= 256);
        clock.advance(Duration::from_secs(60));
        assert!(t.retain_recent().is_empty(), "each was logged once");
        clock.advance(Duration::from_secs(60));
        t.retain_recent();
        assert_eq!(t.tracked(), 0);
        assert_eq!(t.failed(ip(7)), Ok(()));
    }

    /// One host's many IPv6 addresses (its /64) are one source; the
    /// prefix lengths are the operator's.
    #[test]
    fn an_ipv6_64_is_one_source_and_the_prefixes_are_configurable() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(quotas(), clock.clone());
        let v6 = |s: &str| Some(s.parse::<IpAddr>().expect("address"));
        for host in ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:aaaa::3"] {
            assert_eq!(t.failed(v6(host)), Ok(()), "{host}");
        }
        let refused = t.failed(v6("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        assert_eq!(refused.map_err(|r| r.scope), Err(Refused::Source));
        assert_eq!(t.failed(v6("2001:db8:1:3::1")), Ok(()), "another /64");
        // IPv4-mapped is IPv4; IPv4 is per address by default.
        assert_eq!(
            network(v6("::ffff:10.1.2.3").unwrap(), 32, 64),
            v6("10.1.2.3").unwrap()
        );
        assert_eq!(
            network(v6("10.1.2.3").unwrap(), 24, 64),
            v6("10.1.2.0").unwrap()
        );
        assert_eq!(
            network(v6("2001:db8::1").unwrap(), 32, 128),
            v6("2001:db8::1").unwrap()
        );
        let per_24 = Throttle::with_clock(
            Quotas {
                ipv4_prefix: 24,
                ..quotas()
            },
            clock,
        );
        for last in 1..=3 {
            assert_eq!(per_24.failed(ip(last)), Ok(()));
        }
        assert!(per_24.failed(ip(200)).is_err(), "the same /24");
    }

    /// A spray from a /48 (65,536 /64s, several addresses each) keeps the
    /// table at its cap; beyond it the new sources share one allowance,
    /// while a source admitted before keeps its own.
    #[test]
    fn a_spray_from_a_48_keeps_the_table_bounded() {
        let clock = FakeRelativeClock::default();
        let t = Throttle::with_clock(
            Quotas {
                global_per_second: 1_000_000,
                global_burst: 1_000_000,
                max_sources: 1_000,
                ..quotas()
            },
            clock.clone(),
        );
        let early = Some("2001:db8:ffff::1".parse::<IpAddr>().expect("address"));
        assert_eq!(t.failed(early), Ok(()));
        let (mut refused, mut admitted) = (0u32, 0u32);
        for subnet in 0..=u16::MAX {
            for host in [1u16, 0x8000] {
                let a = Ipv6Addr::new(0x2001, 0xdb8, 0x1, subnet, host, 0, 0, 7);
                match t.failed(Some(IpAddr::V6(a))) {
                    Ok(()) => admitted += 1,
                    Err(_) => refused += 1,
                }
            }
        }
        assert!(t.tracked() <= 1_000 + 2, "{} tracked", t.tracked());
        // 999 /64s got an allowance of their own (both their addresses
        // pass), the rest share one: its burst of three.
        assert_eq!(
            (admitted, refused),
            (999 * 2 + 3, 131_072 - 999 * 2 - 3),
            "admitted, refused"
        );
        assert_eq!(t.failed(early), Ok(()), "an admitted source keeps its own");
        // Once the spray stops and the allowances refill, the table empties.
        clock.advance(Duration::from_secs(120));
        t.retain_recent();
        clock.advance(Duration::from_secs(60));
        t.retain_recent();
        assert_eq!(t.tracked(), 0);
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
