//! The scheduler task: owns the `Schedule`, runs the check rounds it asks
//! for (resolve the host, then every address through the pacer) and hands
//! the reports it produces to the session.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::join_all;
use policy::{AppKey, CheckTarget, Segment, cycle_time};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::pacer::{Pacer, Priority};
use crate::resolver::Resolver;
use crate::schedule::{Action, AppReport, Round, Schedule};

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
    Access(AppKey),
    FullState(oneshot::Sender<Vec<AppReport>>),
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
    /// Starts the scheduler task; reports go to `reports`. The task ends
    /// when every `Scheduler` handle is dropped.
    pub fn spawn(
        resolver: Resolver,
        pacer: Pacer,
        metrics: Metrics,
        reports: mpsc::UnboundedSender<Vec<AppReport>>,
    ) -> (Scheduler, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let load = Arc::new(Mutex::new(Load::default()));
        let runner = Runner {
            resolver,
            pacer,
            metrics,
        };
        let task = tokio::spawn(drive(rx, runner, reports, load.clone()));
        (Scheduler { commands: tx, load }, task)
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

    /// Forwards an access event.
    pub fn access(&self, key: AppKey) {
        let _ = self.commands.send(Command::Access(key));
    }

    /// Every application with a result.
    pub async fn full_state(&self) -> Vec<AppReport> {
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

async fn drive(
    mut commands: mpsc::UnboundedReceiver<Command>,
    runner: Runner,
    reports: mpsc::UnboundedSender<Vec<AppReport>>,
    load: Arc<Mutex<Load>>,
) {
    let mut schedule = Schedule::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(AppKey, u64, Round)>();
    loop {
        let wake = schedule.next_wakeup().map(Instant::from_std);
        let actions = tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(Command::Apply { segments, window, done }) => {
                    let actions = schedule.apply(segments, window, now());
                    let _ = done.send(());
                    actions
                }
                Some(Command::Access(key)) => match schedule.access(key.clone(), now()) {
                    Ok(actions) => {
                        tracing::debug!(app = %key, "access: checking");
                        actions
                    }
                    Err(e) => {
                        tracing::warn!(app = %key, reason = %e, "access event ignored");
                        Vec::new()
                    }
                },
                Some(Command::FullState(tx)) => {
                    let _ = tx.send(schedule.full_state());
                    Vec::new()
                }
            },
            Some((key, generation, round)) = done_rx.recv() => {
                schedule.round_done(&key, generation, round, now())
            }
            () = sleep_until(wake) => schedule.poll(now()),
        };
        let mut batch = Vec::new();
        for action in actions {
            match action {
                check @ Action::Check { .. } => start(&runner, &done_tx, check),
                Action::Report(apps) => batch.extend(apps),
            }
        }
        // Several rounds finishing together go out as one report.
        while let Ok((key, generation, round)) = done_rx.try_recv() {
            for action in schedule.round_done(&key, generation, round, now()) {
                match action {
                    Action::Report(apps) => batch.extend(apps),
                    check @ Action::Check { .. } => start(&runner, &done_tx, check),
                }
            }
        }
        if !batch.is_empty() {
            let _ = reports.send(batch);
        }
        let targets = schedule.targets().len();
        let targets_u32 = u32::try_from(targets).unwrap_or(u32::MAX);
        runner.metrics.targets.set(targets as i64);
        let rate = runner.pacer.rate();
        *load.lock().unwrap_or_else(|p| p.into_inner()) = Load {
            targets: targets_u32,
            // Shared targets are probed once per round: a cycle is one check
            // per distinct target.
            checks_per_cycle: targets_u32,
            cycle: cycle_time(u64::from(targets_u32), rate),
        };
    }
}

type Done = mpsc::UnboundedSender<(AppKey, u64, Round)>;

/// Runs the round a `Check` action asks for in its own task.
fn start(runner: &Runner, done: &Done, action: Action) {
    let Action::Check {
        key,
        generation,
        on_access,
        max_age,
    } = action
    else {
        return;
    };
    let runner = runner.clone();
    let done = done.clone();
    tokio::spawn(async move {
        let round = runner.round(&key, on_access, max_age).await;
        // The scheduler is gone when the connector stops: nothing to do.
        let _ = done.send((key, generation, round));
    });
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Runner {
    /// One check round: resolve the host, check every address.
    async fn round(&self, key: &AppKey, on_access: bool, max_age: Duration) -> Round {
        let addresses: Arc<[IpAddr]> = match key.host.parse::<IpAddr>() {
            Ok(ip) => Arc::from([ip]),
            Err(_) => match self.resolver.resolve(&key.host).await {
                Ok(addrs) => {
                    self.count_dns("ok");
                    addrs
                }
                Err(failure) => {
                    self.count_dns("error");
                    return Round {
                        addresses: Vec::new(),
                        dns_error: Some(failure.reason),
                        finished_at: SystemTime::now(),
                    };
                }
            },
        };
        let priority = if on_access {
            Priority::OnAccess
        } else {
            Priority::Continuous
        };
        let checks = addresses.iter().map(|&address| {
            self.pacer.check(
                CheckTarget {
                    address,
                    protocol: key.protocol,
                    port: key.port,
                },
                priority,
                max_age,
            )
        });
        Round {
            addresses: join_all(checks).await,
            dns_error: None,
            finished_at: SystemTime::now(),
        }
    }

    fn count_dns(&self, result: &str) {
        self.metrics
            .dns_lookups
            .get_or_create(&crate::metrics::DnsLabels {
                result: result.to_owned(),
            })
            .inc();
    }
}
