//! The pacer: every check starts here. At most N check starts per second
//! (governor, paced on an ideal timeline so the long-run rate is exactly N),
//! a separate bound on checks in flight, the check a user's access
//! triggered ahead of everything, periodic on-access re-checks and
//! continuous checks sharing the rest fairly (see [`Lanes`]), and one probe
//! per target no matter how many segments ask for it at once.
//!
//! **Invariant:** nothing else in the connector opens a socket toward an
//! application. That is why `--allow-networks` is enforced here, in
//! `enqueue`, which every check goes through: an address outside the allowed
//! networks is answered "not allowed" without ever reaching the prober.

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use governor::clock::{Clock, MonotonicClock, Reference};
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use ipnet::IpNet;
use policy::{AddressResult, CheckTarget, Failure, FailureKind};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::checks::probe::{Prober, not_run};
use crate::metrics::Metrics;

/// The networks the connector may probe (`--allow-networks`); empty means
/// no restriction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowNetworks(Vec<IpNet>);

/// The failure detail of an address outside `--allow-networks`.
pub const NOT_ALLOWED_DETAIL: &str = "outside --allow-networks";

impl AllowNetworks {
    /// Probing restricted to `networks` (host bits are ignored); an empty
    /// list allows everything.
    pub fn new(networks: impl IntoIterator<Item = IpNet>) -> Self {
        AllowNetworks(networks.into_iter().map(|n| n.trunc()).collect())
    }

    /// Whether probing `ip` is allowed. An IPv4-mapped IPv6 address is
    /// judged as the IPv4 address it reaches.
    pub fn permits(&self, ip: std::net::IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.is_empty() || self.0.iter().any(|n| n.contains(&ip))
    }

    /// Whether there is no restriction.
    pub fn is_unrestricted(&self) -> bool {
        self.0.is_empty()
    }
}

/// The result for a target the connector refuses to probe: down, with
/// failure `NotAllowed`, and no packet sent.
pub fn not_allowed(target: CheckTarget) -> AddressResult {
    let mut result = not_run(target, NOT_ALLOWED_DETAIL);
    result.failure = Some(Failure {
        kind: FailureKind::NotAllowed,
        detail: NOT_ALLOWED_DETAIL.to_owned(),
    });
    result
}

/// Which queue a check waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// The check a user's access triggered: a user is waiting, so it goes
    /// ahead of everything and starts in the next rate slot.
    Triggered,
    /// A periodic re-check of an on-access application inside its window:
    /// shares the rate with continuous checks (weight
    /// [`ON_ACCESS_WEIGHT`] : [`CONTINUOUS_WEIGHT`]).
    OnAccess,
    /// Background checking of continuous segments.
    Continuous,
}

/// Turns periodic on-access re-checks get per round-robin cycle while both
/// they and continuous checks wait.
pub const ON_ACCESS_WEIGHT: u32 = 1;
/// Turns continuous checks get per round-robin cycle while both they and
/// periodic on-access re-checks wait. With 1 : 1, continuous checks get at
/// least half the rate however many on-access windows are open, so `N`
/// continuous targets are all started within `2 N / rate` seconds (plus the
/// triggered checks, which are rare: one per access that opens a window).
pub const CONTINUOUS_WEIGHT: u32 = 1;

/// The pacer's three queues and the order they are served in: a triggered
/// check first, always; otherwise weighted round robin between periodic
/// on-access re-checks and continuous checks, so that neither class can
/// starve the other (an idle class's turns go to the other: the rate is
/// never left unused while anything waits). Continuous checks start in the
/// order of their deadlines (a check is due by its round's start plus its
/// report interval), ties first come first served: a 1-s application's
/// check does not wait behind a burst of checks that have a minute to go.
///
/// Entries may be stale (the check already started from another queue, or
/// finished): the caller says which are still waiting, and stale entries
/// are skipped without using up a turn.
#[derive(Debug)]
pub struct Lanes<T> {
    triggered: VecDeque<T>,
    on_access: VecDeque<T>,
    continuous: std::collections::BinaryHeap<Due<T>>,
    /// Numbers continuous entries, for first come first served among equal
    /// deadlines.
    pushed: u64,
    /// Position in the round-robin cycle of
    /// `ON_ACCESS_WEIGHT + CONTINUOUS_WEIGHT` turns; on-access first.
    turn: u32,
}

impl<T> Default for Lanes<T> {
    fn default() -> Self {
        Lanes {
            triggered: VecDeque::new(),
            on_access: VecDeque::new(),
            continuous: std::collections::BinaryHeap::new(),
            pushed: 0,
            turn: 0,
        }
    }
}

/// A continuous check and its deadline; the heap's greatest is the one
/// due first (then pushed first).
#[derive(Debug)]
struct Due<T> {
    deadline: Instant,
    seq: u64,
    item: T,
}

impl<T> Due<T> {
    fn key(&self) -> (std::cmp::Reverse<Instant>, std::cmp::Reverse<u64>) {
        (
            std::cmp::Reverse(self.deadline),
            std::cmp::Reverse(self.seq),
        )
    }
}

impl<T> PartialEq for Due<T> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl<T> Eq for Due<T> {}

impl<T> PartialOrd for Due<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Due<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

impl<T> Lanes<T> {
    /// Queues `item` in the lane of `priority`; a continuous one due now.
    pub fn push(&mut self, priority: Priority, item: T) {
        self.push_due(priority, item, Instant::now());
    }

    /// Queues `item` in the lane of `priority`; a continuous one ordered by
    /// `deadline`.
    pub fn push_due(&mut self, priority: Priority, item: T, deadline: Instant) {
        match priority {
            Priority::Triggered => self.triggered.push_back(item),
            Priority::OnAccess => self.on_access.push_back(item),
            Priority::Continuous => {
                self.pushed += 1;
                self.continuous.push(Due {
                    deadline,
                    seq: self.pushed,
                    item,
                });
            }
        }
    }

    /// The next item to start, skipping those `waiting` says are stale.
    pub fn pop(&mut self, waiting: impl Fn(&T) -> bool) -> Option<T> {
        for lane in [&mut self.triggered, &mut self.on_access] {
            while lane.front().is_some_and(|t| !waiting(t)) {
                lane.pop_front();
            }
        }
        while self.continuous.peek().is_some_and(|d| !waiting(&d.item)) {
            self.continuous.pop();
        }
        if let Some(item) = self.triggered.pop_front() {
            return Some(item);
        }
        let cycle = ON_ACCESS_WEIGHT + CONTINUOUS_WEIGHT;
        let on_access_turn = self.turn < ON_ACCESS_WEIGHT;
        let on_access = match (self.on_access.is_empty(), self.continuous.is_empty()) {
            (true, true) => return None,
            (false, true) => true,
            (true, false) => false,
            // Both wait: the turn decides, and only then does it advance
            // (a class alone is not "using up" the other's turns).
            (false, false) => {
                self.turn = (self.turn + 1) % cycle;
                on_access_turn
            }
        };
        if on_access {
            self.on_access.pop_front()
        } else {
            self.continuous.pop().map(|d| d.item)
        }
    }
}

/// Check-start pacing against an ideal timeline.
///
/// governor's GCRA with burst 1 paces exactly, but every late timer wake-up
/// pushes its schedule back (the long-run rate came out ~19.9/s for 20/s).
/// `Pace` keeps its own ideal timeline — start k is due at `t0 + k/rate` —
/// and asks governor for each start. governor is given a burst of 2 (at
/// periods shorter than `CATCH_UP`, as many as fall due in it) so that a
/// start that woke up late (by less than one period, or `CATCH_UP`) does not
/// delay the next ones; the timeline, not governor, provides the smoothness,
/// and it never lets two starts come closer than one period unless the
/// first was late. When the queue runs dry for longer the timeline restarts
/// at the next start, so idle time is never "saved up" into a larger burst.
///
/// Staying on the ideal timeline after a late start means the next start can
/// come a little less than a period later; on its own that could put
/// `rate + 1` starts into some one-second window. A sliding window of the
/// last `rate` start times closes that gap: a start is allowed only when the
/// start `rate` places back is at least one second old. The guarantee "never
/// more than `rate` starts in any one-second window" is therefore exact; the
/// price is that a late wake-up for the window constraint itself is not made
/// up, about 0.2 ms per second at 20/s (a long-run rate of ~19.996/s, well
/// inside 20.00 ± 0.05).
///
/// Generic over governor's clock so that tests drive it with
/// `FakeRelativeClock`.
pub struct Pace<C: Clock> {
    limiter: RateLimiter<NotKeyed, InMemoryState, C, NoOpMiddleware<C::Instant>>,
    clock: C,
    period: Duration,
    next_ideal: Option<C::Instant>,
    /// Start times of the last `window_len` starts (see the type's docs).
    window: VecDeque<C::Instant>,
    window_len: usize,
}

/// Above this rate the one-second window is not tracked: timer granularity
/// already dominates, and the ring would only cost memory.
const MAX_WINDOWED_RATE: u32 = 10_000;

/// How late a start may be and still keep the timeline: tokio's timers
/// tick in milliseconds and wake up late under load, so at a period shorter
/// than this a late wake-up starts the checks that fell due meanwhile at
/// once. Without it, 4,000 checks a second ran at 740: each wake-up a
/// millisecond late restarted the timeline.
const CATCH_UP: Duration = Duration::from_millis(5);

impl<C: Clock> std::fmt::Debug for Pace<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pace")
            .field("period", &self.period)
            .finish()
    }
}

/// The period between starts at `rate` checks per second.
pub fn period(rate: u32) -> Duration {
    Duration::from_nanos(1_000_000_000 / u64::from(rate.max(1)))
}

impl<C: Clock + Clone> Pace<C> {
    /// Pacing at `rate` starts per second (0 is treated as 1).
    pub fn new(rate: u32, clock: C) -> Self {
        let period = period(rate);
        let late =
            u32::try_from(CATCH_UP.as_nanos() / period.as_nanos().max(1)).unwrap_or(u32::MAX);
        let burst = NonZeroU32::MIN.saturating_add(late.max(1));
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(burst);
        Pace {
            limiter: RateLimiter::direct_with_clock(quota, clock.clone()),
            clock,
            period,
            next_ideal: None,
            window: VecDeque::new(),
            window_len: if rate.max(1) <= MAX_WINDOWED_RATE {
                rate.max(1) as usize
            } else {
                0
            },
        }
    }

    /// The period between starts.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// Takes one start slot now and returns the instant it was taken at (the
    /// instant the window holds for it), or says how long to wait for it.
    pub fn try_start(&mut self) -> Result<C::Instant, Duration> {
        let now = self.clock.now();
        if let Some(ideal) = self.next_ideal
            && now < ideal
        {
            return Err(ideal.duration_since(now).into());
        }
        if self.window_len > 0
            && self.window.len() >= self.window_len
            && let Some(&oldest) = self.window.front()
        {
            let open = oldest + Duration::from_secs(1).into();
            if now < open {
                return Err(open.duration_since(now).into());
            }
        }
        if let Err(not_until) = self.limiter.check() {
            return Err(not_until.wait_time_from(now));
        }
        if self.window_len > 0 {
            self.window.push_back(now);
            while self.window.len() > self.window_len {
                self.window.pop_front();
            }
        }
        let base = match self.next_ideal {
            // Late by less than a period (or, at short periods, than
            // `CATCH_UP`): stay on the timeline.
            Some(ideal)
                if Duration::from(now.duration_since(ideal)) < self.period.max(CATCH_UP) =>
            {
                ideal
            }
            // First start, or the queue was idle: the timeline restarts now.
            _ => now,
        };
        self.next_ideal = Some(base + self.period.into());
        Ok(now)
    }
}

/// A snapshot of the pacer's load.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PacerStats {
    /// Checks waiting to start.
    pub queue_depth: u32,
    /// Checks in flight.
    pub in_flight: u32,
    /// Checks started since the pacer began.
    pub started: u64,
    /// The current rate limit.
    pub rate: u32,
}

/// A result sent to a channel, tagged with the submitter's round and the
/// address's position in it.
#[derive(Debug)]
pub struct Completion {
    /// The `round` given to `Pacer::submit`.
    pub round: u64,
    /// The `index` given to `Pacer::submit`.
    pub index: u32,
    /// The check's result.
    pub result: AddressResult,
}

/// Where `Pacer::submit` delivers results.
pub type CompletionSender = mpsc::UnboundedSender<Completion>;

/// Who waits for a check.
enum Waiter {
    /// `check` / `check_timed`.
    Once(oneshot::Sender<(AddressResult, Instant)>),
    /// `submit`: no task per waiting check, one channel for all.
    Sink {
        tx: CompletionSender,
        round: u64,
        index: u32,
    },
}

impl Waiter {
    fn send(self, result: AddressResult, started: Instant) {
        // A waiter that went away (round cancelled, connector stopping)
        // needs nothing.
        match self {
            Waiter::Once(tx) => {
                let _ = tx.send((result, started));
            }
            Waiter::Sink { tx, round, index } => {
                let _ = tx.send(Completion {
                    round,
                    index,
                    result,
                });
            }
        }
    }
}

/// The waiters of one check: nearly every check has exactly one, kept
/// inline (no allocation per queued check).
enum Waiters {
    One(Waiter),
    Many(Vec<Waiter>),
}

impl Waiters {
    fn push(&mut self, waiter: Waiter) {
        match self {
            Waiters::Many(all) => all.push(waiter),
            Waiters::One(_) => {
                let first = std::mem::replace(self, Waiters::Many(Vec::with_capacity(2)));
                if let (Waiters::One(first), Waiters::Many(all)) = (first, &mut *self) {
                    all.push(first);
                    all.push(waiter);
                }
            }
        }
    }
}

struct Pending {
    waiters: Waiters,
    /// Queued in the triggered lane (also or only).
    triggered: bool,
    started: bool,
    enqueued: Instant,
    /// The earliest deadline a waiter gave (continuous checks).
    deadline: Instant,
}

/// The hasher of the pacer's maps: foldhash, randomly seeded per process
/// (targets come from DNS answers, so they must not be able to choose
/// collisions), and a fraction of SipHash's cost on a check's path, which
/// looks a target up three times.
type TargetHasher = foldhash::fast::RandomState;

#[derive(Default)]
struct Queues {
    lanes: Lanes<CheckTarget>,
    pending: HashMap<CheckTarget, Pending, TargetHasher>,
    recent: HashMap<CheckTarget, (Instant, AddressResult), TargetHasher>,
    waiting: usize,
    completions: u64,
}

/// Results older than this are never reused; bounds `recent`.
const MAX_REUSE: Duration = Duration::from_secs(600);

/// A check the pacer started, waiting for a probe worker: its target, when
/// its start slot was taken, and that slot (released when it completes).
struct Job {
    target: CheckTarget,
    begun: Instant,
    slot: OwnedSemaphorePermit,
}

/// Started checks on their way to the probe workers. The workers are tasks
/// that live as long as the pacer and run one probe after another: a task
/// spawned per check cost more than the rest of the check's bookkeeping
/// together (tokio's task cells are 128-byte aligned, which glibc's
/// allocator serves through its slow `memalign` path; callgrind: 2,600 of
/// the agent's instructions per TCP check, 3,500 per ICMP echo).
struct Jobs {
    queue: Mutex<VecDeque<Job>>,
    /// One permit per queued job; closed when the pacer task ends, which
    /// ends the idle workers (busy ones finish their probe first).
    ready: Semaphore,
}

impl Jobs {
    fn new() -> Self {
        Jobs {
            queue: Mutex::default(),
            ready: Semaphore::new(0),
        }
    }

    fn push(&self, job: Job) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(job);
        self.ready.add_permits(1);
    }

    /// The next job. Once the pacer task ended, the jobs it started are
    /// still handed out (their waiters get results), then `None`.
    async fn next(&self) -> Option<Job> {
        loop {
            match self.ready.acquire().await {
                Ok(permit) => permit.forget(),
                Err(_closed) => return self.pop(),
            }
            if let Some(job) = self.pop() {
                return Some(job);
            }
        }
    }

    fn pop(&self) -> Option<Job> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }
}

/// Closes the job queue when the pacer task ends (or is aborted).
struct CloseJobs(Arc<Jobs>);

impl Drop for CloseJobs {
    fn drop(&mut self) {
        self.0.ready.close();
    }
}

struct Inner {
    queues: Mutex<Queues>,
    work: Notify,
    rate_changed: Notify,
    rate: AtomicU32,
    max_in_flight: u32,
    slots: Arc<Semaphore>,
    started: AtomicU64,
    prober: Arc<Prober>,
    allowed: AllowNetworks,
    metrics: Metrics,
}

/// Handle to the pacer. Cloning is shallow.
#[derive(Clone)]
pub struct Pacer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Pacer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pacer")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Pacer {
    /// Starts the pacer task with no network restriction; it ends when the
    /// returned handle is aborted.
    pub fn spawn(
        prober: Arc<Prober>,
        rate: u32,
        max_in_flight: u32,
        metrics: Metrics,
    ) -> (Pacer, tokio::task::JoinHandle<()>) {
        Self::spawn_restricted(
            prober,
            rate,
            max_in_flight,
            AllowNetworks::default(),
            metrics,
        )
    }

    /// Starts the pacer task, probing only addresses in `allowed`.
    pub fn spawn_restricted(
        prober: Arc<Prober>,
        rate: u32,
        max_in_flight: u32,
        allowed: AllowNetworks,
        metrics: Metrics,
    ) -> (Pacer, tokio::task::JoinHandle<()>) {
        let max_in_flight = max_in_flight.max(1);
        let inner = Arc::new(Inner {
            queues: Mutex::default(),
            work: Notify::new(),
            rate_changed: Notify::new(),
            rate: AtomicU32::new(rate.max(1)),
            max_in_flight,
            slots: Arc::new(Semaphore::new(max_in_flight as usize)),
            started: AtomicU64::new(0),
            prober,
            allowed,
            metrics,
        });
        let task = tokio::spawn(run(inner.clone()));
        (Pacer { inner }, task)
    }

    /// The prober the pacer's checks run on.
    pub fn prober(&self) -> &Arc<Prober> {
        &self.inner.prober
    }

    /// Checks `target`, reusing a result not older than `max_age`, joining a
    /// check of the same target that is already queued or in flight.
    pub async fn check(
        &self,
        target: CheckTarget,
        priority: Priority,
        max_age: Duration,
    ) -> AddressResult {
        self.check_timed(target, priority, max_age).await.0
    }

    /// Like `check`, and also says when the probe that produced the result
    /// started (`None` when a recent result was reused or the check never
    /// ran). Benchmarks measure the pacing of starts with it.
    pub async fn check_timed(
        &self,
        target: CheckTarget,
        priority: Priority,
        max_age: Duration,
    ) -> (AddressResult, Option<Instant>) {
        let (tx, rx) = oneshot::channel();
        let waiter = Waiter::Once(tx);
        if let Err(result) = self.enqueue(target, priority, max_age, waiter, Instant::now()) {
            return (result, None);
        }
        match rx.await {
            Ok((result, started)) => (result, Some(started)),
            Err(_) => (
                not_run(target, "check abandoned: the connector is stopping"),
                None,
            ),
        }
    }

    /// Like `check`, without a task or future per waiting check: a result
    /// not older than `max_age` is returned at once; otherwise the check is
    /// queued (or joined) and its result goes to `tx` as a `Completion`
    /// tagged with `round` and `index`.
    pub fn submit(
        &self,
        target: CheckTarget,
        priority: Priority,
        max_age: Duration,
        tx: &CompletionSender,
        round: u64,
        index: u32,
    ) -> Option<AddressResult> {
        self.submit_by(
            target,
            priority,
            max_age,
            tx,
            (round, index),
            Instant::now(),
        )
    }

    /// Like `submit`, for a check due by `deadline` (a continuous round's
    /// start plus its report interval): continuous checks start in the
    /// order of their deadlines. `tag` is the round and the index.
    pub fn submit_by(
        &self,
        target: CheckTarget,
        priority: Priority,
        max_age: Duration,
        tx: &CompletionSender,
        (round, index): (u64, u32),
        deadline: Instant,
    ) -> Option<AddressResult> {
        let waiter = Waiter::Sink {
            tx: tx.clone(),
            round,
            index,
        };
        self.enqueue(target, priority, max_age, waiter, deadline)
            .err()
    }

    /// Queues `target` for `waiter` (joining a queued or running check of
    /// it), or returns a recent enough result instead.
    fn enqueue(
        &self,
        target: CheckTarget,
        priority: Priority,
        max_age: Duration,
        waiter: Waiter,
        deadline: Instant,
    ) -> Result<(), AddressResult> {
        // The one gate for `--allow-networks`: every check, whichever
        // entry point it came through, passes here before it can start.
        if !self.inner.allowed.permits(target.address) {
            return Err(not_allowed(target));
        }
        let mut q = self.inner.lock();
        // No reuse asked for (a continuous round): no lookup, no clock read.
        if !max_age.is_zero()
            && let Some((at, result)) = q.recent.get(&target)
            && at.elapsed() <= max_age
        {
            return Err(result.clone());
        }
        let q = &mut *q;
        match q.pending.get_mut(&target) {
            Some(p) => {
                p.waiters.push(waiter);
                // A user now waits for a check that is queued at a lower
                // priority: it jumps the queue (its old entry goes stale).
                if priority == Priority::Triggered && !p.triggered && !p.started {
                    p.triggered = true;
                    q.lanes.push(Priority::Triggered, target);
                } else if priority == Priority::Continuous && !p.started && deadline < p.deadline {
                    // Due sooner for this waiter: queued again by the
                    // earlier deadline (the later entry goes stale).
                    p.deadline = deadline;
                    q.lanes.push_due(Priority::Continuous, target, deadline);
                }
            }
            None => {
                q.pending.insert(
                    target,
                    Pending {
                        waiters: Waiters::One(waiter),
                        triggered: priority == Priority::Triggered,
                        started: false,
                        enqueued: Instant::now(),
                        deadline,
                    },
                );
                q.lanes.push_due(priority, target, deadline);
                q.waiting += 1;
                self.inner.metrics.queue_depth.set(q.waiting as i64);
                self.inner.work.notify_one();
            }
        }
        Ok(())
    }

    /// Changes the rate limit.
    pub fn set_rate(&self, rate: u32) {
        let rate = rate.max(1);
        if self.inner.rate.swap(rate, Ordering::Relaxed) != rate {
            self.inner.rate_changed.notify_one();
        }
    }

    /// The current rate limit.
    pub fn rate(&self) -> u32 {
        self.inner.rate.load(Ordering::Relaxed)
    }

    /// The pacer's current load.
    pub fn stats(&self) -> PacerStats {
        let waiting = self.inner.lock().waiting;
        let free = self.inner.slots.available_permits();
        PacerStats {
            queue_depth: u32::try_from(waiting).unwrap_or(u32::MAX),
            in_flight: self
                .inner
                .max_in_flight
                .saturating_sub(u32::try_from(free).unwrap_or(u32::MAX)),
            started: self.inner.started.load(Ordering::Relaxed),
            rate: self.rate(),
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn has_waiting(&self) -> bool {
        self.lock().waiting > 0
    }

    /// The next target to start (see [`Lanes`]); marks it started.
    fn pop(&self) -> Option<(CheckTarget, Instant)> {
        let mut q = self.lock();
        let q = &mut *q;
        let pending = &q.pending;
        let target = q
            .lanes
            .pop(|t| pending.get(t).is_some_and(|p| !p.started))?;
        let p = q.pending.get_mut(&target)?;
        p.started = true;
        q.waiting -= 1;
        self.metrics.queue_depth.set(q.waiting as i64);
        Some((target, p.enqueued))
    }

    fn complete(&self, target: CheckTarget, result: AddressResult, started: Instant) {
        let mut q = self.lock();
        q.completions += 1;
        if q.completions.is_multiple_of(1024) {
            q.recent.retain(|_, (at, _)| at.elapsed() <= MAX_REUSE);
        }
        q.recent.insert(target, (Instant::now(), result.clone()));
        if let Some(p) = q.pending.remove(&target) {
            match p.waiters {
                Waiters::One(waiter) => waiter.send(result, started),
                Waiters::Many(all) => {
                    for waiter in all {
                        waiter.send(result.clone(), started);
                    }
                }
            }
        }
    }
}

async fn run(inner: Arc<Inner>) {
    let mut rate = inner.rate.load(Ordering::Relaxed);
    let mut pace = Pace::new(rate, MonotonicClock);
    let jobs = Arc::new(Jobs::new());
    let _close = CloseJobs(jobs.clone());
    // Probe workers, started as the checks in flight first need them (at
    // most `max_in_flight`: each check holds a slot until it completed).
    let mut workers = 0usize;
    loop {
        if !inner.has_waiting() {
            inner.work.notified().await;
            continue;
        }
        let Ok(slot) = inner.slots.clone().acquire_owned().await else {
            return;
        };
        // The instant the start slot was taken: the check's start time as
        // the pacer's one-second window counts it (the probe task begins
        // microseconds later, by however long the runtime takes to run it).
        let begun = loop {
            let current = inner.rate.load(Ordering::Relaxed);
            if current != rate {
                rate = current;
                pace = Pace::new(rate, MonotonicClock);
            }
            match pace.try_start() {
                Ok(at) => break Instant::from_std(at),
                Err(wait) => {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = inner.rate_changed.notified() => {}
                    }
                }
            }
        };
        let Some((target, enqueued)) = inner.pop() else {
            continue;
        };
        inner.started.fetch_add(1, Ordering::Relaxed);
        inner
            .metrics
            .limiter_wait
            .observe(enqueued.elapsed().as_secs_f64());
        inner.metrics.in_flight.inc();
        jobs.push(Job {
            target,
            begun,
            slot,
        });
        let in_flight =
            (inner.max_in_flight as usize).saturating_sub(inner.slots.available_permits());
        if in_flight > workers {
            workers += 1;
            tokio::spawn(probe_worker(inner.clone(), jobs.clone()));
        }
    }
}

/// Runs the started checks' probes, one after another, until the pacer
/// task ends.
async fn probe_worker(inner: Arc<Inner>, jobs: Arc<Jobs>) {
    while let Some(Job {
        target,
        begun,
        slot,
    }) = jobs.next().await
    {
        let result = inner.prober.check(target).await;
        // The slot is free before the waiters hear of the result (the
        // pacer's stats count it out). A check started meanwhile waits the
        // moment until this worker takes it: the pacer adds a worker only
        // when more checks are in flight than there are workers.
        drop(slot);
        inner.metrics.in_flight.dec();
        inner
            .metrics
            .check_duration
            .observe(begun.elapsed().as_secs_f64());
        inner.metrics.observe_check(&result);
        inner.complete(target, result, begun);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use governor::clock::FakeRelativeClock;

    /// Drives `pace` on a fake clock, starting `n` checks as soon as each
    /// is allowed; returns the start times in nanoseconds.
    fn drive(pace: &mut Pace<FakeRelativeClock>, clock: &FakeRelativeClock, n: usize) -> Vec<u64> {
        let mut starts = Vec::with_capacity(n);
        while starts.len() < n {
            match pace.try_start() {
                Ok(at) => starts.push(at.as_u64()),
                Err(wait) => clock.advance(wait),
            }
        }
        starts
    }

    fn max_in_window(starts: &[u64], window: u64) -> usize {
        let mut best = 0;
        let mut lo = 0;
        for hi in 0..starts.len() {
            while starts[hi] - starts[lo] >= window {
                lo += 1;
            }
            best = best.max(hi - lo + 1);
        }
        best
    }

    #[test]
    fn n_checks_take_n_over_rate_seconds() {
        let clock = FakeRelativeClock::default();
        let mut pace = Pace::new(20, clock.clone());
        let starts = drive(&mut pace, &clock, 6001);
        // 6,000 periods after the first start: exactly 300 s.
        assert_eq!(starts[6000] - starts[0], 300_000_000_000);
        assert_eq!(max_in_window(&starts, 1_000_000_000), 20);
    }

    /// At a period shorter than the timer's millisecond, every wake-up is
    /// late by several periods: the checks that fell due meanwhile start at
    /// once, so 4,000/s is kept, never more in any one second.
    #[test]
    fn a_rate_above_the_timers_resolution_is_kept() {
        let clock = FakeRelativeClock::default();
        let mut pace = Pace::new(4000, clock.clone());
        let mut starts = Vec::new();
        while starts.len() < 20_001 {
            match pace.try_start() {
                Ok(at) => starts.push(at.as_u64()),
                // tokio sleeps to the next whole millisecond at least.
                Err(wait) => clock.advance(wait.max(Duration::from_millis(1))),
            }
        }
        let elapsed = starts[20_000] - starts[0];
        // 20,000 periods = 5 s; each one-second window's wake-up may add up
        // to a millisecond.
        assert!(elapsed <= 5_000_000_000 + 6_000_000, "took {elapsed} ns");
        assert!(max_in_window(&starts, 1_000_000_000) <= 4000);
    }

    #[test]
    fn late_wakeups_do_not_slow_the_long_run_rate() {
        let clock = FakeRelativeClock::default();
        let mut pace = Pace::new(20, clock.clone());
        let mut starts = Vec::new();
        // Every wake-up comes 0.3 ms late, as tokio's timer does.
        while starts.len() < 2001 {
            match pace.try_start() {
                Ok(at) => starts.push(at.as_u64()),
                Err(wait) => clock.advance(wait + Duration::from_micros(300)),
            }
        }
        let elapsed = starts[2000] - starts[0];
        // 2,000 periods = 100 s. A late wake-up is made up on the ideal
        // timeline; only the one-second window's own wake-ups (one per 20
        // starts) add their lateness: 100 × 0.3 ms, not 2,000 × 0.3 ms.
        assert!(
            elapsed <= 100_000_000_000 + 101 * 300_000,
            "took {elapsed} ns"
        );
        let rate = 2000.0 / (elapsed as f64 / 1e9);
        assert!((rate - 20.0).abs() <= 0.05, "rate {rate}");
        // And still never more than 20 in any one-second window.
        assert_eq!(max_in_window(&starts, 1_000_000_000), 20);
        // Never two starts closer than one period minus the lateness.
        assert!(
            starts
                .windows(2)
                .all(|w| w[1] - w[0] >= 50_000_000 - 300_000)
        );
    }

    #[test]
    fn never_more_than_the_rate_in_any_window() {
        let clock = FakeRelativeClock::default();
        let mut pace = Pace::new(100, clock.clone());
        let mut starts = drive(&mut pace, &clock, 250);
        // An idle pause, then more work: no saved-up burst.
        clock.advance(Duration::from_millis(3700));
        starts.extend(drive(&mut pace, &clock, 250));
        assert_eq!(max_in_window(&starts, 1_000_000_000), 100);
        assert_eq!(
            starts[250] - starts[249],
            3_700_000_000 - 10_000_000 + 10_000_000
        );
    }

    /// Simulates the pacer's start loop on a fake clock at `rate`: before
    /// every slot `demand` new periodic on-access re-checks arrive (ids from
    /// 1,000,000 up), then one check starts. `continuous` continuous checks
    /// (ids 0..continuous) are queued at the start; `triggered_at` slot `k`
    /// a triggered check (id 999_999) arrives just after slot `k` started.
    /// Returns each started id with its start time in nanoseconds, until
    /// every continuous check started or 100 s passed.
    fn simulate(
        rate: u32,
        continuous: u64,
        demand: u64,
        triggered_at: Option<usize>,
    ) -> Vec<(u64, u64)> {
        let clock = FakeRelativeClock::default();
        let mut pace = Pace::new(rate, clock.clone());
        let mut lanes = Lanes::default();
        for id in 0..continuous {
            lanes.push(Priority::Continuous, id);
        }
        let mut next_on_access = 1_000_000;
        let mut started = Vec::new();
        let mut continuous_started = 0;
        while continuous_started < continuous && clock.now().as_u64() < 100_000_000_000 {
            match pace.try_start() {
                Ok(at) => {
                    for _ in 0..demand {
                        lanes.push(Priority::OnAccess, next_on_access);
                        next_on_access += 1;
                    }
                    if let Some(id) = lanes.pop(|_| true) {
                        if id < continuous {
                            continuous_started += 1;
                        }
                        started.push((id, at.as_u64()));
                    }
                    if triggered_at == Some(started.len() - 1) {
                        lanes.push(Priority::Triggered, 999_999);
                    }
                }
                Err(wait) => clock.advance(wait),
            }
        }
        started
    }

    #[test]
    fn continuous_checks_get_their_fair_share_under_10x_on_access_demand() {
        // 100 continuous targets at 20/s while on-access windows ask for
        // 200 re-checks a second (10x the rate). With weights 1:1 the
        // continuous class gets >= rate/2, so all 100 start within
        // 2 * 100 / 20 = 10 s of the first slot.
        const RATE: u32 = 20;
        const N: u64 = 100;
        let started = simulate(RATE, N, 10 * u64::from(RATE), None);
        let continuous: Vec<u64> = started
            .iter()
            .filter(|(id, _)| *id < N)
            .map(|(_, at)| *at)
            .collect();
        assert_eq!(
            continuous.len() as u64,
            N,
            "every continuous target started"
        );
        let bound_ns = 2 * N * 1_000_000_000 / u64::from(RATE);
        let last = continuous.last().copied().unwrap_or(u64::MAX);
        assert!(
            last < bound_ns,
            "last continuous start at {last} ns, bound {bound_ns} ns"
        );
        // And the on-access re-checks got the other half, not less.
        let on_access = started
            .iter()
            .filter(|(id, at)| *id >= N && *at < bound_ns)
            .count();
        assert!(on_access as u64 >= N - 1, "{on_access} on-access re-checks");
    }

    #[test]
    fn a_triggered_check_starts_in_the_next_slot() {
        // Both background classes saturated; the access arrives right after
        // slot 37 started and must take slot 38: one period (50 ms) later.
        let started = simulate(20, 100, 200, Some(37));
        assert_eq!(started[38].0, 999_999);
        assert_eq!(started[38].1 - started[37].1, 50_000_000);
    }

    #[test]
    fn stale_entries_do_not_use_up_a_turn() {
        let mut lanes = Lanes::default();
        for id in [1, 2, 3] {
            lanes.push(Priority::OnAccess, id);
        }
        for id in [10, 11] {
            lanes.push(Priority::Continuous, id);
        }
        // 1 started elsewhere (e.g. from the triggered lane): skipped.
        let waiting = |id: &u32| *id != 1;
        assert_eq!(lanes.pop(waiting), Some(2));
        assert_eq!(lanes.pop(waiting), Some(10));
        assert_eq!(lanes.pop(waiting), Some(3));
        assert_eq!(lanes.pop(waiting), Some(11));
        assert_eq!(lanes.pop(waiting), None);
    }

    /// Continuous checks start by deadline, ties in the order they came: a
    /// check of a 1-s application goes ahead of a burst of 60-s ones queued
    /// before it.
    #[test]
    fn continuous_checks_start_by_deadline() {
        let t0 = Instant::now();
        let mut lanes = Lanes::default();
        for id in 0..40u32 {
            lanes.push_due(Priority::Continuous, id, t0 + Duration::from_secs(60));
        }
        lanes.push_due(Priority::Continuous, 100, t0 + Duration::from_secs(1));
        lanes.push_due(Priority::Continuous, 101, t0 + Duration::from_secs(1));
        assert_eq!(lanes.pop(|_| true), Some(100));
        assert_eq!(lanes.pop(|_| true), Some(101));
        let rest: Vec<u32> = std::iter::from_fn(|| lanes.pop(|_| true)).collect();
        assert_eq!(
            rest,
            (0..40).collect::<Vec<_>>(),
            "ties first come first served"
        );
    }

    #[test]
    fn a_burst_of_requests_is_spread_out() {
        let clock = FakeRelativeClock::default();
        let mut pace = Pace::new(20, clock.clone());
        assert!(pace.try_start().is_ok());
        // Nothing more may start at the same instant.
        assert_eq!(pace.try_start(), Err(Duration::from_millis(50)));
        clock.advance(Duration::from_millis(49));
        assert_eq!(pace.try_start(), Err(Duration::from_millis(1)));
        clock.advance(Duration::from_millis(1));
        assert!(pace.try_start().is_ok());
    }
}
