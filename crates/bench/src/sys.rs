//! What the kernel says about a process (CPU time and RSS from `/proc`) and
//! about the machine.

use std::time::{Duration, Instant};

/// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ, 100 on Linux).
const USER_HZ: u64 = 100;

fn proc_path(pid: Option<u32>, file: &str) -> String {
    match pid {
        Some(pid) => format!("/proc/{pid}/{file}"),
        None => format!("/proc/self/{file}"),
    }
}

/// The fields of a `/proc/<pid>/stat` line after the command name (which
/// may hold spaces: they count from after its `)`), as numbers (0 where a
/// field is not one, such as the state): field `n` of the line is `n - 3`
/// here, so the parent pid is 1, utime and stime 11 and 12, the reaped
/// children's 13 and 14.
fn stat_fields(path: &str) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(path).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(
        rest.split_whitespace()
            .map(|f| f.parse().unwrap_or(0))
            .collect(),
    )
}

/// User + system CPU time of a process (this one when `pid` is `None`), all
/// threads; zero when it cannot be read.
pub fn cpu_time(pid: Option<u32>) -> Duration {
    let fields = stat_fields(&proc_path(pid, "stat")).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).copied().unwrap_or(0);
    Duration::from_millis((ticks(11) + ticks(12)) * 1000 / USER_HZ)
}

/// The parent pid and the user + system CPU ticks of a process and of its
/// reaped children (`utime`, `stime`, `cutime`, `cstime`).
fn ppid_and_ticks(pid: u32) -> Option<(u32, u64)> {
    let fields = stat_fields(&proc_path(Some(pid), "stat"))?;
    let num = |i: usize| fields.get(i).copied();
    let ppid = u32::try_from(num(1)?).ok()?;
    Some((ppid, num(11)? + num(12)? + num(13)? + num(14)?))
}

/// The parent of a process, if it can be read.
pub fn parent(pid: u32) -> Option<u32> {
    ppid_and_ticks(pid).map(|(p, _)| p)
}

/// CPU time of a server and its worker processes: `root`'s own and that of
/// the children it reaped, plus each live child's (a forking server such
/// as PostgreSQL: a backend's CPU counts while it runs and, once it ended,
/// in its parent's reaped-children time).
pub fn family_cpu_time(root: u32) -> Duration {
    let mut ticks = ppid_and_ticks(root).map_or(0, |(_, t)| t);
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some((ppid, t)) = ppid_and_ticks(pid)
                && ppid == root
            {
                ticks += t;
            }
        }
    }
    Duration::from_millis(ticks * 1000 / USER_HZ)
}

/// What a process's live threads have run and how often they were switched
/// out, summed over `/proc/PID/task/*` (this process when `pid` is `None`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadTimes {
    /// Time on a CPU (the scheduler's `sum_exec_runtime`, `schedstat`'s
    /// first field): nanosecond resolution, not the 10-ms ticks of `stat`.
    pub cpu: Duration,
    /// Voluntary and involuntary context switches (`status`): every time a
    /// thread parked (a task woke on another worker, an idle wait) or was
    /// preempted.
    pub switches: u64,
    /// Of those, the involuntary ones: preempted while runnable.
    pub preempted: u64,
    /// Time runnable but waiting for a CPU (`schedstat`'s second field).
    pub waited: Duration,
}

impl ThreadTimes {
    /// What ran between `self` (earlier) and `later`.
    pub fn until(&self, later: &ThreadTimes) -> ThreadTimes {
        ThreadTimes {
            cpu: later.cpu.saturating_sub(self.cpu),
            switches: later.switches.saturating_sub(self.switches),
            preempted: later.preempted.saturating_sub(self.preempted),
            waited: later.waited.saturating_sub(self.waited),
        }
    }
}

/// CPU time of a process's live threads whose name (`comm`) starts with
/// `prefix`; zero when none can be read.
pub fn named_thread_cpu(pid: Option<u32>, prefix: &str) -> Duration {
    let Ok(tasks) = std::fs::read_dir(proc_path(pid, "task")) else {
        return Duration::ZERO;
    };
    let mut cpu = Duration::ZERO;
    for task in tasks.flatten() {
        let dir = task.path();
        let named = std::fs::read_to_string(dir.join("comm")).is_ok_and(|c| c.starts_with(prefix));
        if !named {
            continue;
        }
        if let Ok(stat) = std::fs::read_to_string(dir.join("schedstat"))
            && let Some(Ok(ns)) = stat.split_whitespace().next().map(str::parse::<u64>)
        {
            cpu += Duration::from_nanos(ns);
        }
    }
    cpu
}

/// [`ThreadTimes`] of a process's live threads (a thread that ended takes
/// its time along: for processes whose threads live as long as they do,
/// such as a tokio runtime's workers); zero when it cannot be read.
pub fn thread_times(pid: Option<u32>) -> ThreadTimes {
    let mut out = ThreadTimes::default();
    let Ok(tasks) = std::fs::read_dir(proc_path(pid, "task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let dir = task.path();
        if let Ok(stat) = std::fs::read_to_string(dir.join("schedstat")) {
            let mut fields = stat.split_whitespace().map(|f| f.parse::<u64>().ok());
            if let Some(Some(ns)) = fields.next() {
                out.cpu += Duration::from_nanos(ns);
            }
            if let Some(Some(ns)) = fields.next() {
                out.waited += Duration::from_nanos(ns);
            }
        }
        if let Ok(status) = std::fs::read_to_string(dir.join("status")) {
            for line in status.lines() {
                let (voluntary, n) = if let Some(n) = line.strip_prefix("voluntary_ctxt_switches:")
                {
                    (true, n)
                } else if let Some(n) = line.strip_prefix("nonvoluntary_ctxt_switches:") {
                    (false, n)
                } else {
                    continue;
                };
                let n = n.trim().parse::<u64>().unwrap_or(0);
                out.switches += n;
                if !voluntary {
                    out.preempted += n;
                }
            }
        }
    }
    out
}

/// The soft "Max open files" of a process (`/proc/PID/limits`).
pub fn fd_cap(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/limits"),
        None => "/proc/self/limits".to_owned(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Fails, naming `what` and the limit, unless this process (and so the
/// children it starts) may open `need` files: a group that runs out of
/// descriptors half-way measures the limit, not the CA.
pub fn need_open_files(need: u64, what: &str) -> anyhow::Result<()> {
    match fd_cap(None) {
        Some(cap) if cap < need => anyhow::bail!(
            "{what} needs at least {need} open files, the soft limit is {cap}: raise `ulimit -n` \
             (`cargo xtask bench` raises it to the hard limit) and run again"
        ),
        _ => Ok(()),
    }
}

/// Resident set size of a process in bytes (this one when `pid` is `None`);
/// zero when it cannot be read.
pub fn rss_bytes(pid: Option<u32>) -> u64 {
    let Ok(status) = std::fs::read_to_string(proc_path(pid, "status")) else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// "CPU model, N cores, M GiB RAM, Linux x.y": where the numbers came from.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0.0, |kb| kb as f64 / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    format!("{cpu}, {cores} cores, {mem_gib:.0} GiB RAM, Linux {kernel}")
}

/// Peak CPU share (of one core, per 500 ms) and peak RSS (bytes) of `pid`
/// until `done` turns true.
pub async fn peak_usage(pid: Option<u32>, done: tokio::sync::watch::Receiver<bool>) -> (f64, u64) {
    let (mut cpu, mut rss) = (0.0f64, 0u64);
    let mut last = (cpu_time(pid), Instant::now());
    while !*done.borrow() {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = (cpu_time(pid), Instant::now());
        let share = now.0.saturating_sub(last.0).as_secs_f64() / (now.1 - last.1).as_secs_f64();
        cpu = cpu.max(share);
        rss = rss.max(rss_bytes(pid));
        last = now;
    }
    (cpu, rss)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_rss_and_cpu() {
        assert!(rss_bytes(None) > 0);
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        assert!(cpu_time(None) > Duration::ZERO);
        assert!(machine().contains("cores"));
    }

    #[test]
    fn thread_times_grow_with_work_on_any_thread() {
        let before = thread_times(None);
        assert!(before.cpu > Duration::ZERO);
        // Work on another thread, which then parks on a channel until read.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            let mut x = 0u64;
            for i in 0..50_000_000u64 {
                x = x.wrapping_add(std::hint::black_box(i));
            }
            std::hint::black_box(x);
            let _ = done_tx.send(());
            let _ = rx.recv();
        });
        done_rx.recv().expect("worker done");
        let after = thread_times(None);
        let _ = tx.send(());
        worker.join().expect("worker");
        let spent = before.until(&after);
        // Only the CPU time is sure to have grown: the worker's one switch
        // (parking on `rx`) may come after the reading, and a test thread
        // of the harness that ended in between took its switches and waits
        // out of the sum. The other way round saturates at zero.
        assert!(spent.cpu > Duration::from_millis(1), "{spent:?}");
        assert_eq!(after.until(&before).cpu, Duration::ZERO);
        let some = ThreadTimes {
            cpu: Duration::from_secs(1),
            switches: 5,
            preempted: 2,
            waited: Duration::from_secs(1),
        };
        assert_eq!(ThreadTimes::default().until(&some), some);
        assert_eq!(some.until(&ThreadTimes::default()), ThreadTimes::default());
    }
}
