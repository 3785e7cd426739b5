//! What the kernel says about a process (CPU time and RSS from `/proc`) and
//! about the machine.

use std::time::Duration;

/// Clock ticks per second of `/proc/<pid>/stat` (USER_HZ, 100 on Linux).
const USER_HZ: u64 = 100;

fn proc_path(pid: Option<u32>, file: &str) -> String {
    match pid {
        Some(pid) => format!("/proc/{pid}/{file}"),
        None => format!("/proc/self/{file}"),
    }
}

/// User + system CPU time of a process (this one when `pid` is `None`), all
/// threads; zero when it cannot be read.
pub fn cpu_time(pid: Option<u32>) -> Duration {
    let Ok(stat) = std::fs::read_to_string(proc_path(pid, "stat")) else {
        return Duration::ZERO;
    };
    // The command name may hold spaces: fields count from after its ')'.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((ticks(11) + ticks(12)) * 1000 / USER_HZ)
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
}
