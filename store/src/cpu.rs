//! How many CPUs there are, as libbpf counts them.

use std::sync::OnceLock;

/// Number of possible CPUs, as libbpf counts them for per-CPU values.
pub fn possible_cpus() -> u32 {
    static N: OnceLock<u32> = OnceLock::new();
    *N.get_or_init(|| {
        std::fs::read_to_string("/sys/devices/system/cpu/possible")
            .ok()
            .and_then(|s| parse_cpu_list(s.trim()))
            .unwrap_or_else(|| {
                std::thread::available_parallelism()
                    .map(|n| n.get() as u32)
                    .unwrap_or(1)
            })
    })
}

fn parse_cpu_list(s: &str) -> Option<u32> {
    let mut max = None;
    for part in s.split(',') {
        let last = part.rsplit('-').next()?.parse::<u32>().ok()?;
        max = Some(max.map_or(last, |m: u32| m.max(last)));
    }
    max.map(|m| m + 1)
}
