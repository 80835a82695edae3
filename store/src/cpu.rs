//! Which CPU a program runs as, and how many there are.

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

/// Offset from the FS segment base of the `u32` in which the kernel keeps the number of
/// the CPU the thread runs on: the `cpu_id` field (offset 4) of the rseq area glibc
/// (2.35 and newer) registers for every thread, else of ours, which a thread registers
/// when it first takes a CPU slot (`cpu_slots::use_own_rseq_area`; -1 there until then).
/// `None` where there is neither.
pub fn cpu_number_offset() -> Option<u64> {
    static OFFSET: OnceLock<Option<u64>> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        // SAFETY: dlsym with NUL-terminated names; both symbols, where glibc has them,
        // are constants set before any user code runs.
        unsafe {
            let offset = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr());
            let size = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr());
            if offset.is_null() || size.is_null() || *size.cast::<u32>() < 8 {
                // Ours, which threads register as they take CPU slots.
                return crate::cpu_slots::own_rseq_offset().map(|o| (o as u64).wrapping_add(4));
            }
            Some((*offset.cast::<isize>() as u64).wrapping_add(4))
        }
    })
}

/// The CPU a program on this thread runs as, below `ncpus`: the CPU slot it holds (see
/// `cpu_slots.rs`), else the CPU it runs on.
#[inline]
pub fn current_cpu(ncpus: u32) -> usize {
    match crate::cpu_slots::held_slot() {
        Some(slot) if slot < ncpus => slot as usize,
        _ => hardware_cpu(ncpus),
    }
}

/// The CPU this thread runs on, below `ncpus`: from the rseq area when glibc keeps one,
/// from `sched_getcpu` otherwise.
pub fn hardware_cpu(ncpus: u32) -> usize {
    if let Some(offset) = cpu_number_offset() {
        let cpu: u32;
        // SAFETY: the rseq area (glibc's or ours) is at this offset from every thread's
        // pointer for the thread's whole life; the kernel keeps `cpu_id` current once
        // the area is registered, and it reads out of range before.
        unsafe {
            std::arch::asm!(
                "mov {cpu:e}, dword ptr fs:[{offset}]",
                cpu = out(reg) cpu,
                offset = in(reg) offset,
                options(nostack, readonly, preserves_flags),
            )
        };
        // A thread whose registration failed reads a negative marker.
        if cpu < ncpus {
            return cpu as usize;
        }
    }
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 {
        0
    } else {
        (c as u32 % ncpus.max(1)) as usize
    }
}
