//! The scheduler task: owns the `Schedule`, runs the check rounds it asks
//! for (resolve the host, then every address through the pacer) and hands
//! the reports it produces to every subscribed session: one schedule and one
//! pacer however many CA replicas the connector reports to, so the check
//! rate never grows with the replica count.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use policy::{AddressResult, AppKey, CheckTarget, Segment};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::inbox::{Inbox, InboxSender, inbox};
use super::{Action, Round, Schedule};
use crate::checks::pacer::{Completion, CompletionSender, Pacer, Priority};
use crate::metrics::Metrics;
use crate::resolver::Resolver;
use crate::send::report::Outgoing;

/// Load figures the heartbeat reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    /// Distinct targets scheduled.
    pub targets: u32,
    /// Checks in one full cycle.
    pub checks_per_cycle: u32,
    /// One cycle at the rate limit.
    pub cycle: Duration,
}

enum Command {
    Apply {
        segments: Vec<Segment>,
        window: Duration,
        done: oneshot::Sender<()>,
    },
    /// An access, how long before it reached us it happened, and the CA's
    /// id for it (echoed in reports).
    Access(AppKey, Duration, Option<String>),
    FullState(oneshot::Sender<Vec<Outgoing>>),
    /// A session wants every report from now on, after the full state.
    Subscribe(oneshot::Sender<Subscription>),
}

/// What a subscribing session gets: the complete current state, then every
/// report produced after it, in order, in its [`Inbox`] (nothing between the
/// two is lost or duplicated: both come from the scheduler task in one
/// step).
pub type Subscription = (Vec<Outgoing>, Inbox);

/// Where the task hands its reports: a channel given at spawn (every
/// report, as produced) or a session's inbox.
enum Subscriber {
    Channel(mpsc::UnboundedSender<Vec<Outgoing>>),
    Inbox(InboxSender),
}

impl Subscriber {
    fn is_closed(&self) -> bool {
        match self {
            Subscriber::Channel(s) => s.is_closed(),
            Subscriber::Inbox(s) => s.is_closed(),
        }
    }

    fn send(&self, batch: Vec<Outgoing>, now: std::time::Instant) {
        match self {
            Subscriber::Channel(s) => {
                let _ = s.send(batch);
            }
            Subscriber::Inbox(s) => {
                s.deliver(batch, now);
            }
        }
    }
}

/// Handle to the scheduler task. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Scheduler {
    commands: mpsc::UnboundedSender<Command>,
    load: Arc<Mutex<Load>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Command")
    }
}

/// Everything a round needs.
#[derive(Clone, Debug)]
struct Runner {
    resolver: Resolver,
    pacer: Pacer,
    metrics: Metrics,
}

impl Scheduler {
    /// Starts the scheduler task; every report also goes to `reports` (a
    /// subscriber for the task's whole life, without a full state). The
    /// task ends when every `Scheduler` handle is dropped.
    pub fn spawn(
        resolver: Resolver,
        pacer: Pacer,
        metrics: Metrics,
        reports: mpsc::UnboundedSender<Vec<Outgoing>>,
    ) -> (Scheduler, tokio::task::JoinHandle<()>) {
        Self::spawn_with(resolver, pacer, metrics, vec![Subscriber::Channel(reports)])
    }

    /// Starts the scheduler task with no subscriber: sessions
    /// [`Scheduler::subscribe`].
    pub fn spawn_shared(
        resolver: Resolver,
        pacer: Pacer,
        metrics: Metrics,
    ) -> (Scheduler, tokio::task::JoinHandle<()>) {
        Self::spawn_with(resolver, pacer, metrics, Vec::new())
    }

    fn spawn_with(
        resolver: Resolver,
        pacer: Pacer,
        metrics: Metrics,
        subscribers: Vec<Subscriber>,
    ) -> (Scheduler, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let load = Arc::new(Mutex::new(Load::default()));
        let runner = Runner {
            resolver,
            pacer,
            metrics,
        };
        let task = tokio::spawn(drive(rx, runner, subscribers, load.clone()));
        (Scheduler { commands: tx, load }, task)
    }

    /// The complete current state and, after it, every report the schedule
    /// produces until the receiver is dropped (each CA session subscribes
    /// when it is welcomed: the same results go to every replica).
    pub async fn subscribe(&self) -> Subscription {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Subscribe(tx)).is_ok()
            && let Ok(subscription) = rx.await
        {
            return subscription;
        }
        // The scheduler is gone (the connector stops): nothing will come.
        (Vec::new(), inbox().1)
    }

    /// Replaces the assignment; returns once it is in effect.
    pub async fn apply(&self, segments: Vec<Segment>, window: Duration) {
        let (done, rx) = oneshot::channel();
        if self
            .commands
            .send(Command::Apply {
                segments,
                window,
                done,
            })
            .is_ok()
        {
            let _ = rx.await;
        }
    }

    /// Forwards an access event that happened `ago` before now (0 for a
    /// fresh access; a CA renewal of coalesced accesses says how long ago).
    pub fn access(&self, key: AppKey, ago: Duration) {
        self.access_with_id(key, ago, None);
    }

    /// `access` for an event that carries the CA's access id (echoed in
    /// every report of the window it opens or renews).
    pub fn access_with_id(&self, key: AppKey, ago: Duration, id: Option<String>) {
        let _ = self.commands.send(Command::Access(key, ago, id));
    }

    /// Every application with a result.
    pub async fn full_state(&self) -> Vec<Outgoing> {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::FullState(tx)).is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    /// The current load.
    pub fn load(&self) -> Load {
        *self.load.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn now() -> std::time::Instant {
    Instant::now().into_std()
}

/// The scheduler task: carries out commands, rounds finishing and the
/// schedule's wake-ups, hands the reports to the subscribers and keeps the
/// load figures current.
async fn drive(
    mut commands: mpsc::UnboundedReceiver<Command>,
    runner: Runner,
    mut subscribers: Vec<Subscriber>,
    load: Arc<Mutex<Load>>,
) {
    let mut schedule = Schedule::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Completion>();
    let (resolved_tx, mut resolved_rx) = mpsc::unbounded_channel::<Resolved>();
    let mut flights = Flights {
        runner,
        rounds: HashMap::new(),
        done: done_tx,
        resolved: resolved_tx,
        finished: Vec::new(),
    };
    let mut targets_version = None;
    loop {
        let wake = schedule.next_wakeup().map(Instant::from_std);
        let actions = tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(command) => obey(&mut schedule, &mut subscribers, command),
            },
            Some(completion) = done_rx.recv() => {
                flights.completed(completion);
                Vec::new()
            }
            Some(resolved) = resolved_rx.recv() => {
                flights.resolved(resolved);
                Vec::new()
            }
            () = sleep_until(wake) => schedule.poll(now()),
        };
        let batch = flights.carry_out(&mut schedule, actions, &mut done_rx);
        if !batch.is_empty() {
            fan_out(&mut subscribers, batch);
        }
        // The target set is rebuilt only when the schedule says it may
        // have changed (not after every check).
        if targets_version != Some(schedule.targets_version()) {
            targets_version = Some(schedule.targets_version());
            publish_load(&schedule, &flights.runner, &load);
        }
    }
}

/// Carries out one command; returns the schedule's actions.
fn obey(
    schedule: &mut Schedule,
    subscribers: &mut Vec<Subscriber>,
    command: Command,
) -> Vec<Action> {
    match command {
        Command::Apply {
            segments,
            window,
            done,
        } => {
            let actions = schedule.apply(segments, window, now());
            let _ = done.send(());
            actions
        }
        Command::Access(key, ago, id) => {
            let now = now();
            let accessed = now.checked_sub(ago).unwrap_or(now);
            match schedule.access_event(key.clone(), accessed, id, now) {
                Ok(actions) => {
                    tracing::debug!(app = %key, "access: checking");
                    actions
                }
                Err(e) => {
                    tracing::warn!(app = %key, reason = %e, "access event ignored");
                    Vec::new()
                }
            }
        }
        Command::FullState(tx) => {
            let _ = tx.send(schedule.full_state());
            Vec::new()
        }
        Command::Subscribe(tx) => {
            let (reports, rx) = inbox();
            if tx.send((schedule.full_state(), rx)).is_ok() {
                subscribers.push(Subscriber::Inbox(reports));
            }
            Vec::new()
        }
    }
}

/// The schedule's load at the pacer's rate, for the heartbeat and the
/// metrics.
fn publish_load(schedule: &Schedule, runner: &Runner, load: &Mutex<Load>) {
    let (targets, cycle) = schedule.load(runner.pacer.rate());
    let targets_u32 = u32::try_from(targets).unwrap_or(u32::MAX);
    runner.metrics.targets.set(targets as i64);
    *load.lock().unwrap_or_else(|p| p.into_inner()) = Load {
        targets: targets_u32,
        // Shared targets are probed once per round: a cycle is one
        // check per distinct target.
        checks_per_cycle: targets_u32,
        cycle,
    };
}

/// Sends `batch` to every subscriber (one per CA session), forgetting the
/// ones whose session ended.
fn fan_out(subscribers: &mut Vec<Subscriber>, batch: Vec<Outgoing>) {
    subscribers.retain(|s| !s.is_closed());
    let Some((last, rest)) = subscribers.split_last() else {
        return;
    };
    let now = now();
    for s in rest {
        s.send(batch.clone(), now);
    }
    last.send(batch, now);
}

/// A resolution's outcome for a round: the addresses (with the DNS error
/// when they are stale), or the resolver's reason.
struct Resolved {
    generation: u64,
    priority: Priority,
    max_age: Duration,
    outcome: Result<(Arc<[IpAddr]>, Option<String>), String>,
}

/// A round in progress: its host being resolved, or its checks queued or
/// running in the pacer. Rounds hold no task and no future while they wait
/// (only a resolution runs in a task of its own): results come back through
/// one channel, tagged with the round's generation.
struct InFlight {
    key: AppKey,
    /// The application-level check's id (0: the TCP handshake alone).
    check: u32,
    /// Checks not answered yet.
    remaining: u32,
    /// Answers so far, with each address's position in the resolution.
    results: Vec<(u32, AddressResult)>,
    /// The DNS error when the round checks stale addresses.
    stale_dns: Option<String>,
    /// When its checks are due: its start plus its report interval (the
    /// pacer starts continuous checks in the order of their deadlines).
    deadline: Instant,
}

/// The rounds in progress, by generation.
struct Flights {
    runner: Runner,
    rounds: HashMap<u64, InFlight>,
    done: CompletionSender,
    resolved: mpsc::UnboundedSender<Resolved>,
    /// Rounds that finished, for `Schedule::round_done`.
    finished: Vec<(AppKey, u64, Round)>,
}

impl Flights {
    /// Carries out `actions`: starts the rounds they ask for and feeds the
    /// rounds that finish meanwhile back to `schedule`, until nothing is
    /// left to do; returns the reports made on the way. Several rounds
    /// finishing together go out as one report.
    fn carry_out(
        &mut self,
        schedule: &mut Schedule,
        actions: Vec<Action>,
        done: &mut mpsc::UnboundedReceiver<Completion>,
    ) -> Vec<Outgoing> {
        let mut batch = Vec::new();
        let mut actions = VecDeque::from(actions);
        loop {
            while let Some(action) = actions.pop_front() {
                match action {
                    check @ Action::Check { .. } => self.start(schedule, check),
                    Action::Report(apps) => batch.extend(apps),
                }
            }
            while let Ok(completion) = done.try_recv() {
                self.completed(completion);
            }
            if self.finished.is_empty() {
                return batch;
            }
            for (key, generation, round) in std::mem::take(&mut self.finished) {
                actions.extend(schedule.round_done(&key, generation, round, now()));
            }
        }
    }

    /// Starts the round a `Check` action asks for: an IP literal goes to the
    /// pacer at once; a name is resolved first (in a task).
    fn start(&mut self, schedule: &Schedule, action: Action) {
        let Action::Check {
            key,
            generation,
            on_access,
            triggered,
            max_age,
        } = action
        else {
            return;
        };
        let priority = priority(on_access, triggered);
        let ip = key.host.ip();
        let host = ip.is_none().then(|| key.host.clone());
        // A TCP port's application-level check (the segment's `check`).
        let segment = schedule.segment(&key.segment);
        let interval = segment.map_or(Duration::from_secs(60), |s| s.report_interval);
        let check = match (key.protocol, segment) {
            (policy::Protocol::Tcp, Some(segment)) => self
                .runner
                .pacer
                .prober()
                .check_id(&key.host, &segment.check),
            _ => 0,
        };
        self.rounds.insert(
            generation,
            InFlight {
                check,
                key,
                remaining: 0,
                results: Vec::new(),
                stale_dns: None,
                deadline: Instant::now() + interval,
            },
        );
        if let Some(ip) = ip {
            self.launch(generation, priority, max_age, &[ip]);
        } else if let Some(host) = host {
            let runner = self.runner.clone();
            let resolved = self.resolved.clone();
            tokio::spawn(async move {
                // Shared: every port and segment of this name waiting now
                // awaits the same lookup.
                let outcome = match runner.resolver.resolution(&host).await {
                    Ok(r) => match r.stale {
                        None => {
                            runner.count_dns("ok");
                            Ok((r.addresses, None))
                        }
                        Some(failure) => {
                            runner.count_dns("stale");
                            let error = format!("{failure}; checking the last known addresses");
                            Ok((r.addresses, Some(error)))
                        }
                    },
                    Err(failure) => {
                        runner.count_dns("error");
                        Err(failure.reason)
                    }
                };
                // The scheduler is gone when the connector stops.
                let _ = resolved.send(Resolved {
                    generation,
                    priority,
                    max_age,
                    outcome,
                });
            });
        }
    }

    /// A resolution finished: check every address, or end the round with
    /// the resolver's reason.
    fn resolved(&mut self, r: Resolved) {
        match r.outcome {
            Ok((addresses, stale)) => {
                if let Some(round) = self.rounds.get_mut(&r.generation) {
                    round.stale_dns = stale;
                }
                self.launch(r.generation, r.priority, r.max_age, &addresses);
            }
            Err(reason) => self.finish(r.generation, Some(reason)),
        }
    }

    /// Hands every address of round `generation` to the pacer.
    fn launch(
        &mut self,
        generation: u64,
        priority: Priority,
        max_age: Duration,
        addresses: &[IpAddr],
    ) {
        let Some(round) = self.rounds.get_mut(&generation) else {
            return;
        };
        round.remaining = u32::try_from(addresses.len()).unwrap_or(u32::MAX);
        for (index, &address) in (0u32..).zip(addresses) {
            let target = CheckTarget {
                address,
                protocol: round.key.protocol,
                port: round.key.port,
                check: round.check,
            };
            let reused = self.runner.pacer.submit_by(
                target,
                priority,
                max_age,
                &self.done,
                (generation, index),
                round.deadline,
            );
            if let Some(result) = reused {
                round.results.push((index, result));
                round.remaining -= 1;
            }
        }
        if round.remaining == 0 {
            self.finish(generation, None);
        }
    }

    /// One check of a round answered.
    fn completed(&mut self, c: Completion) {
        let Some(round) = self.rounds.get_mut(&c.round) else {
            return;
        };
        round.results.push((c.index, c.result));
        round.remaining = round.remaining.saturating_sub(1);
        if round.remaining == 0 {
            self.finish(c.round, None);
        }
    }

    /// Ends round `generation`: results in address order.
    fn finish(&mut self, generation: u64, dns_error: Option<String>) {
        let Some(mut round) = self.rounds.remove(&generation) else {
            return;
        };
        round.results.sort_by_key(|(index, _)| *index);
        let dns_stale = dns_error.is_none() && round.stale_dns.is_some();
        self.finished.push((
            round.key,
            generation,
            Round {
                addresses: round.results.into_iter().map(|(_, r)| r).collect(),
                dns_error: dns_error.or(round.stale_dns),
                dns_stale,
                finished_at: SystemTime::now(),
            },
        ));
    }
}

/// The pacer queue a round's checks wait in: only the round a user's
/// access triggered jumps the queue; periodic on-access re-checks share the
/// rate fairly with continuous checks.
fn priority(on_access: bool, triggered: bool) -> Priority {
    match (on_access, triggered) {
        (_, true) => Priority::Triggered,
        (true, false) => Priority::OnAccess,
        (false, false) => Priority::Continuous,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Runner {
    fn count_dns(&self, result: &str) {
        self.metrics
            .dns_lookups
            .get_or_create(&crate::metrics::DnsLabels {
                result: result.to_owned(),
            })
            .inc();
    }
}
