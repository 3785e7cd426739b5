//! The connector's status for its heartbeats (`v1::ConnectorStatus`): its
//! version and platform, when the process and the host started, CPU and
//! memory of both, its default route's interface and its DNS servers.
//!
//! On Linux everything comes from /proc (parsed here, each parser a pure
//! function over the file's text so that it is tested on fixtures); what
//! cannot be read is left 0 or empty (unknown) with a debug log. Other
//! platforms report version and platform only.
//!
//! CPU figures are rates over the interval between two samples, so a
//! [`StatusMeter`] keeps the previous sample (one per session: each session
//! measures over its own heartbeat interval).

use protocol::v1;

/// Clock ticks per second of /proc's tick counts (Linux's `USER_HZ`: 100
/// on every architecture reach builds for).
const TICKS_PER_SECOND: u64 = 100;

/// Figures of /proc/self/stat: when the process started and the CPU time
/// it used, both in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SelfStat {
    /// Start time, ticks after boot (field 22).
    pub start_ticks: u64,
    /// User plus system CPU time (fields 14 and 15).
    pub cpu_ticks: u64,
}

/// Parses /proc/self/stat. The command name (field 2) is in parentheses and
/// may hold spaces and parentheses itself: fields are counted after the
/// last `)`.
pub fn parse_self_stat(text: &str) -> Option<SelfStat> {
    let rest = &text[text.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(SelfStat {
        start_ticks: field(22)?,
        cpu_ticks: field(14)?.checked_add(field(15)?)?,
    })
}

/// Figures of /proc/stat: the boot time and the host's CPU time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostStat {
    /// Boot time, Unix seconds (`btime`).
    pub boot_unix_s: Option<u64>,
    /// The `cpu` line: (all ticks, busy ticks), where idle and iowait are
    /// not busy (guest time is inside user time and not counted twice).
    pub cpu: Option<(u64, u64)>,
}

/// Parses /proc/stat.
pub fn parse_proc_stat(text: &str) -> HostStat {
    let mut out = HostStat {
        boot_unix_s: None,
        cpu: None,
    };
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("btime") => out.boot_unix_s = words.next().and_then(|w| w.parse().ok()),
            Some("cpu") => {
                let ticks: Vec<u64> = words.map_while(|w| w.parse().ok()).take(8).collect();
                // user nice system idle iowait irq softirq steal
                if ticks.len() >= 4 {
                    let all: u64 = ticks.iter().sum();
                    let idle = ticks[3] + ticks.get(4).copied().unwrap_or(0);
                    out.cpu = Some((all, all - idle));
                }
            }
            _ => {}
        }
    }
    out
}

/// A `Key:   123 kB` line's value in bytes, from /proc/meminfo or
/// /proc/self/status.
fn kb_line(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?;
        let mut words = value.split_whitespace();
        let n: u64 = words.next()?.parse().ok()?;
        match words.next() {
            Some("kB") => n.checked_mul(1024),
            None => Some(n),
            Some(_) => None,
        }
    })
}

/// Parses /proc/meminfo: (`MemTotal`, `MemAvailable`) in bytes.
pub fn parse_meminfo(text: &str) -> (Option<u64>, Option<u64>) {
    (kb_line(text, "MemTotal"), kb_line(text, "MemAvailable"))
}

/// Parses /proc/self/status: the resident set (`VmRSS`) in bytes.
pub fn parse_status_rss(text: &str) -> Option<u64> {
    kb_line(text, "VmRSS")
}

/// Parses /proc/net/route: the interface of the IPv4 default route (the
/// destination 0.0.0.0/0 that is up, with the lowest metric).
pub fn parse_default_route(text: &str) -> Option<String> {
    const RTF_UP: u32 = 0x1;
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (iface, dest, flags, metric, mask) =
                (f.first()?, f.get(1)?, f.get(3)?, f.get(6)?, f.get(7)?);
            let flags = u32::from_str_radix(flags, 16).ok()?;
            let default = u32::from_str_radix(dest, 16).ok()? == 0
                && u32::from_str_radix(mask, 16).ok()? == 0
                && flags & RTF_UP != 0;
            default.then(|| (metric.parse::<u64>().unwrap_or(u64::MAX), *iface))
        })
        .min_by_key(|(metric, _)| *metric)
        .map(|(_, iface)| iface.to_owned())
}

/// One sample of the tick counters the CPU percentages are rates of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSample {
    /// The process's CPU ticks.
    pub process: Option<u64>,
    /// The host's (all, busy) ticks.
    pub host: Option<(u64, u64)>,
}

/// CPU percentages between two samples, `cores` CPUs: (the process's, in
/// percent of one core; the host's, in percent of all cores). `None` where
/// a sample lacks a figure or no time passed.
pub fn cpu_percent(before: CpuSample, after: CpuSample, cores: u64) -> (Option<f64>, Option<f64>) {
    let host = match (before.host, after.host) {
        (Some((a0, b0)), Some((a1, b1))) if a1 > a0 => {
            Some(b1.saturating_sub(b0) as f64 * 100.0 / (a1 - a0) as f64)
        }
        _ => None,
    };
    // The host's `cpu` line sums all cores: its ticks per core are the
    // wall time the process's ticks are measured against.
    let process = match (before.process, after.process, before.host, after.host) {
        (Some(p0), Some(p1), Some((a0, _)), Some((a1, _))) if a1 > a0 && cores > 0 => {
            let wall = (a1 - a0) as f64 / cores as f64;
            Some(p1.saturating_sub(p0) as f64 * 100.0 / wall)
        }
        _ => None,
    };
    (process, host)
}

/// Reads one /proc file, `None` (with a debug log) when it cannot.
fn read(path: &str) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(e) => {
            tracing::debug!(path, error = %e, "cannot read for the connector's status");
            None
        }
    }
}

/// Measures the status between heartbeats: keeps the previous CPU sample.
#[derive(Debug, Default)]
pub struct StatusMeter {
    previous: Option<CpuSample>,
}

impl StatusMeter {
    /// A meter with no sample yet (its first status has no CPU figures).
    pub fn new() -> Self {
        Self::default()
    }

    /// The status now, read from the host; `applications`, `resolvers`
    /// and the byte counts come from the caller.
    pub fn measure(&mut self) -> v1::ConnectorStatus {
        let mut status = v1::ConnectorStatus {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            os: std::env::consts::OS.to_owned(),
            arch: std::env::consts::ARCH.to_owned(),
            ..Default::default()
        };
        if cfg!(target_os = "linux") {
            self.linux(&mut status);
        }
        status
    }

    fn linux(&mut self, status: &mut v1::ConnectorStatus) {
        let me = read("/proc/self/stat").and_then(|t| {
            let parsed = parse_self_stat(&t);
            if parsed.is_none() {
                tracing::debug!("cannot parse /proc/self/stat");
            }
            parsed
        });
        let host = read("/proc/stat").map_or(
            HostStat {
                boot_unix_s: None,
                cpu: None,
            },
            |t| parse_proc_stat(&t),
        );
        if let Some(boot) = host.boot_unix_s {
            status.host_boot_unix_ms = i64::try_from(boot.saturating_mul(1000)).unwrap_or(0);
            if let Some(me) = me {
                let after_boot_ms = me.start_ticks.saturating_mul(1000) / TICKS_PER_SECOND;
                status.process_start_unix_ms =
                    i64::try_from(boot.saturating_mul(1000).saturating_add(after_boot_ms))
                        .unwrap_or(0);
            }
        }
        let sample = CpuSample {
            process: me.map(|m| m.cpu_ticks),
            host: host.cpu,
        };
        if let Some(before) = self.previous.replace(sample) {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
            let (process, host) = cpu_percent(before, sample, cores);
            status.process_cpu_percent = process.unwrap_or(0.0);
            status.host_cpu_percent = host.unwrap_or(0.0);
        }
        status.process_memory_bytes = read("/proc/self/status")
            .and_then(|t| parse_status_rss(&t))
            .unwrap_or(0);
        let (total, available) = read("/proc/meminfo").map_or((None, None), |t| parse_meminfo(&t));
        status.host_memory_total_bytes = total.unwrap_or(0);
        status.host_memory_available_bytes = available.unwrap_or(0);
        status.default_route_interface = read("/proc/net/route")
            .and_then(|t| parse_default_route(&t))
            .unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SELF_STAT: &str = "4242 (connector (a) b) S 1 4242 4242 0 -1 4194560 2301 0 0 0 \
        37 12 0 0 20 0 9 0 123456 1234567168 4096 18446744073709551615 1 1 0 0 0 0 0 4096 17663 0 0 0 17 1 0 0 0 0 0\n";

    const PROC_STAT: &str = "cpu  100 5 50 800 40 3 2 0 0 0\n\
        cpu0 50 2 25 400 20 1 1 0 0 0\n\
        cpu1 50 3 25 400 20 2 1 0 0 0\n\
        intr 1234 0 0\n\
        ctxt 99\n\
        btime 1767225600\n\
        processes 321\n";

    const MEMINFO: &str = "MemTotal:        8038976 kB\n\
        MemFree:          512000 kB\n\
        MemAvailable:    4019488 kB\n\
        Buffers:          100000 kB\n";

    const STATUS: &str =
        "Name:\tconnector-agent\nVmPeak:\t  300000 kB\nVmRSS:\t   20480 kB\nThreads:\t9\n";

    const ROUTE: &str = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
        wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0\n\
        eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
        eth0\t0000000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n\
        down0\t00000000\t0100000A\t0002\t0\t0\t1\t00000000\t0\t0\t0\n";

    #[test]
    fn self_stat_counts_fields_after_the_last_parenthesis() {
        let s = parse_self_stat(SELF_STAT).expect("parses");
        assert_eq!(
            s,
            SelfStat {
                start_ticks: 123_456,
                cpu_ticks: 37 + 12
            }
        );
        assert_eq!(parse_self_stat("4242 (x) S 1 2"), None);
        assert_eq!(parse_self_stat(""), None);
    }

    #[test]
    fn proc_stat_gives_the_boot_time_and_busy_ticks() {
        let s = parse_proc_stat(PROC_STAT);
        assert_eq!(s.boot_unix_s, Some(1_767_225_600));
        // all = 100+5+50+800+40+3+2+0 = 1000; idle + iowait = 840.
        assert_eq!(s.cpu, Some((1000, 160)));
        assert_eq!(
            parse_proc_stat("nothing here\n"),
            HostStat {
                boot_unix_s: None,
                cpu: None
            }
        );
    }

    #[test]
    fn memory_lines_are_read_in_bytes() {
        assert_eq!(
            parse_meminfo(MEMINFO),
            (Some(8_038_976 * 1024), Some(4_019_488 * 1024))
        );
        assert_eq!(parse_status_rss(STATUS), Some(20_480 * 1024));
        // VmRSS is not VmRSSx, and a missing line is unknown.
        assert_eq!(parse_status_rss("VmRSSx:\t1 kB\n"), None);
        assert_eq!(parse_meminfo(""), (None, None));
    }

    #[test]
    fn the_default_route_is_the_lowest_metric_one_that_is_up() {
        assert_eq!(parse_default_route(ROUTE).as_deref(), Some("eth0"));
        let header_only = ROUTE.lines().next().expect("header");
        assert_eq!(parse_default_route(header_only), None);
    }

    #[test]
    fn cpu_percentages_are_rates_between_samples() {
        let before = CpuSample {
            process: Some(100),
            host: Some((1000, 160)),
        };
        // 400 host ticks over 2 cores: 200 ticks of wall time; the process
        // used 50 of them (25 % of one core), the host 100 of 400 (25 %).
        let after = CpuSample {
            process: Some(150),
            host: Some((1400, 260)),
        };
        assert_eq!(cpu_percent(before, after, 2), (Some(25.0), Some(25.0)));
        // No time passed, or a figure missing: unknown.
        assert_eq!(cpu_percent(before, before, 2), (None, None));
        let blind = CpuSample {
            process: None,
            host: None,
        };
        assert_eq!(cpu_percent(blind, after, 2), (None, None));
    }

    /// The collectors on this host's real /proc: every figure is there and
    /// plausible.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_real_proc_gives_every_figure() {
        let mut meter = StatusMeter::new();
        let first = meter.measure();
        // Burn CPU until the kernel counted a few ticks of it.
        let ticks = || {
            let text = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
            parse_self_stat(&text).expect("parses").cpu_ticks
        };
        let start = ticks();
        let mut x = 0u64;
        while ticks() < start + 3 {
            for i in 0..1_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
        }
        let second = meter.measure();
        assert_eq!(first.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(
            (first.os.as_str(), first.arch.as_str()),
            ("linux", std::env::consts::ARCH)
        );
        let now_ms = i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_millis(),
        )
        .expect("fits");
        assert!(
            first.host_boot_unix_ms > 0 && first.host_boot_unix_ms < now_ms,
            "{first:?}"
        );
        assert!(
            first.process_start_unix_ms >= first.host_boot_unix_ms
                && first.process_start_unix_ms <= now_ms + 1000,
            "{first:?}"
        );
        assert!(first.process_memory_bytes > 0, "{first:?}");
        assert!(
            first.host_memory_total_bytes >= first.host_memory_available_bytes
                && first.host_memory_available_bytes > 0,
            "{first:?}"
        );
        assert_eq!(first.process_cpu_percent, 0.0, "no interval yet");
        assert!(second.process_cpu_percent > 0.0, "{second:?}");
        assert!(
            (0.0..=100.0).contains(&second.host_cpu_percent),
            "{second:?}"
        );
    }
}
