//! `bpf_ktime_get_ns` from the TSC: CLOCK_MONOTONIC for a third of the vDSO's price.
//!
//! Where the kernel's clocksource is the TSC and the CPU's TSC is invariant, CLOCK_MONOTONIC
//! is the TSC scaled and offset, with NTP's slew on top. A probe that reads the clock twice
//! per call (funclatency) paid two vDSO calls (24 ns each on our 2-core VM, 34-44 ns on the
//! GPU host); `rdtsc` and one multiply cost about 10.
//!
//! The line from ticks to nanoseconds is re-anchored on CLOCK_MONOTONIC every
//! [`ANCHOR_EVERY_NS`]: each segment starts no lower than anything the previous one
//! answered (so the clock never goes back on a thread), and is sloped from the rate measured
//! over the longest baseline seen so far, bent to meet CLOCK_MONOTONIC at the end of its
//! period. A segment answers for one period only; a read after a quiet spell re-anchors
//! first. The error against CLOCK_MONOTONIC is then bounded by one period's drift: at NTP's
//! largest slew (500 ppm) over 1 ms, 0.5 µs, and in practice a few tens of nanoseconds. Elsewhere (another clocksource, no invariant TSC, not x86-64) the vDSO is
//! used, unchanged.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;

/// How often the line is re-anchored on CLOCK_MONOTONIC.
const ANCHOR_EVERY_NS: u64 = 1_000_000;
/// Slopes are fixed point: nanoseconds per tick, times 2^SHIFT.
const SHIFT: u32 = 32;

fn vdso_monotonic() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A tick count and CLOCK_MONOTONIC read together: the ticks are the midpoint of two
/// reads around the vDSO's, retried while a preemption or an interrupt stretched them
/// (an anchor taken across one would tilt the line by as much).
fn paired_now() -> (u64, u64) {
    /// About 7 µs at 3 GHz: far above a quiet read (about 100 ticks).
    const MOST_TICKS: u64 = 20_000;
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..16 {
        let a = ticks();
        let ns = vdso_monotonic();
        let b = ticks();
        let span = b.wrapping_sub(a);
        if span < best.0 {
            best = (span, a + span / 2, ns);
        }
        if span <= MOST_TICKS {
            break;
        }
    }
    (best.1, best.2)
}

#[cfg(target_arch = "x86_64")]
fn ticks() -> u64 {
    // SAFETY: rdtsc has no preconditions; `usable` checked the TSC is invariant.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn ticks() -> u64 {
    0
}

/// Whether CLOCK_MONOTONIC is the TSC here, so a line through ticks follows it.
fn usable() -> bool {
    if std::env::var_os("BPFTIME_KTIME_VDSO").is_some() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let max_ext = core::arch::x86_64::__cpuid(0x8000_0000).eax;
        if max_ext < 0x8000_0007 {
            return false;
        }
        let invariant = core::arch::x86_64::__cpuid(0x8000_0007).edx & (1 << 8) != 0;
        let source = std::fs::read_to_string(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        )
        .unwrap_or_default();
        invariant && source.trim() == "tsc"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// One segment of the line, behind a sequence count (odd while it is rewritten). A
/// segment answers for one period of ticks after its base; a read past that re-anchors
/// first, so a long quiet spell is never extrapolated.
struct Line {
    seq: AtomicU32,
    base_ticks: AtomicU64,
    base_ns: AtomicU64,
    slope: AtomicU64,
    period_ticks: AtomicU64,
    /// Where the longest baseline starts: the first anchor.
    first_ticks: AtomicU64,
    first_ns: AtomicU64,
    /// Held by the thread that re-anchors.
    anchoring: AtomicBool,
}

static ENABLED: OnceLock<bool> = OnceLock::new();
static LINE: Line = Line {
    seq: AtomicU32::new(0),
    base_ticks: AtomicU64::new(0),
    base_ns: AtomicU64::new(0),
    slope: AtomicU64::new(0),
    period_ticks: AtomicU64::new(0),
    first_ticks: AtomicU64::new(0),
    first_ns: AtomicU64::new(0),
    anchoring: AtomicBool::new(false),
};

fn at(base_ns: u64, slope: u64, elapsed_ticks: u64) -> u64 {
    base_ns + ((elapsed_ticks as u128 * slope as u128) >> SHIFT) as u64
}

/// CLOCK_MONOTONIC in nanoseconds, from the TSC where that follows it.
pub fn monotonic_ns() -> u64 {
    if !*ENABLED.get_or_init(usable) {
        return vdso_monotonic();
    }
    loop {
        let s1 = LINE.seq.load(Ordering::Acquire);
        if s1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let slope = LINE.slope.load(Ordering::Relaxed);
        let base_ticks = LINE.base_ticks.load(Ordering::Relaxed);
        let base_ns = LINE.base_ns.load(Ordering::Relaxed);
        let period_ticks = LINE.period_ticks.load(Ordering::Relaxed);
        let t = ticks();
        std::sync::atomic::fence(Ordering::Acquire);
        if LINE.seq.load(Ordering::Relaxed) != s1 {
            continue;
        }
        if slope == 0 {
            // Not calibrated yet: the first anchor waits for a baseline.
            return first_anchor();
        }
        // A TSC read on another core may be a few ticks behind the anchor's.
        let elapsed = t.saturating_sub(base_ticks);
        if elapsed < period_ticks {
            return at(base_ns, slope, elapsed);
        }
        reanchor();
    }
}

/// Before a slope exists: answers from the vDSO, and sets the line up once a baseline of
/// one anchoring period is there.
fn first_anchor() -> u64 {
    let (t, ns) = paired_now();
    if LINE.anchoring.swap(true, Ordering::Acquire) {
        return ns;
    }
    let (first_ticks, first_ns) = (
        LINE.first_ticks.load(Ordering::Relaxed),
        LINE.first_ns.load(Ordering::Relaxed),
    );
    if first_ticks == 0 {
        LINE.first_ticks.store(t, Ordering::Relaxed);
        LINE.first_ns.store(ns, Ordering::Relaxed);
    } else if ns - first_ns >= ANCHOR_EVERY_NS && t > first_ticks {
        let rate = (((ns - first_ns) as u128) << SHIFT) / (t - first_ticks) as u128;
        LINE.seq.fetch_add(1, Ordering::AcqRel);
        LINE.base_ticks.store(t, Ordering::Relaxed);
        LINE.base_ns.store(ns, Ordering::Relaxed);
        LINE.period_ticks
            .store(period_ticks(rate), Ordering::Relaxed);
        LINE.slope.store(rate as u64, Ordering::Relaxed);
        LINE.seq.fetch_add(1, Ordering::Release);
    }
    LINE.anchoring.store(false, Ordering::Release);
    ns
}

fn period_ticks(rate: u128) -> u64 {
    (((ANCHOR_EVERY_NS as u128) << SHIFT) / rate.max(1)).max(1) as u64
}

/// Starts a new segment no lower than anything the last one answered, sloped to meet
/// CLOCK_MONOTONIC at the end of its period.
#[cold]
fn reanchor() {
    if LINE.anchoring.swap(true, Ordering::Acquire) {
        return;
    }
    let base_ticks = LINE.base_ticks.load(Ordering::Relaxed);
    let base_ns = LINE.base_ns.load(Ordering::Relaxed);
    let slope = LINE.slope.load(Ordering::Relaxed);
    let old_period = LINE.period_ticks.load(Ordering::Relaxed);
    // The slow part (the vDSO, retried) before readers are held up.
    let (t, truth) = paired_now();
    let (first_ticks, first_ns) = (
        LINE.first_ticks.load(Ordering::Relaxed),
        LINE.first_ns.load(Ordering::Relaxed),
    );
    let rate =
        (((truth - first_ns) as u128) << SHIFT) / t.saturating_sub(first_ticks).max(1) as u128;
    let period = period_ticks(rate);
    // Readers that take ticks after this see an odd or changed count and retry; those
    // before it read the old segment, at most its value at `now`.
    LINE.seq.fetch_add(1, Ordering::AcqRel);
    let now = ticks();
    let truth_now = truth + ((now.saturating_sub(t) as u128 * rate) >> SHIFT) as u64;
    // The most the last segment can have answered: its value at `now`, or at the end of
    // its period.
    let answered = at(
        base_ns,
        slope,
        now.saturating_sub(base_ticks).min(old_period),
    );
    let start = truth_now.max(answered);
    // Ahead of CLOCK_MONOTONIC: run slower over the next period; never by more than half,
    // so the line always rises.
    let span = (truth_now + ANCHOR_EVERY_NS)
        .saturating_sub(start)
        .clamp(ANCHOR_EVERY_NS / 2, ANCHOR_EVERY_NS * 3 / 2);
    LINE.base_ticks.store(now, Ordering::Relaxed);
    LINE.base_ns.store(start, Ordering::Relaxed);
    LINE.slope.store(
        (((span as u128) << SHIFT) / period as u128) as u64,
        Ordering::Relaxed,
    );
    LINE.period_ticks.store(period, Ordering::Relaxed);
    LINE.seq.fetch_add(1, Ordering::Release);
    LINE.anchoring.store(false, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_clock_monotonic_closely_and_never_goes_back() {
        let mut last = 0u64;
        let mut worst = 0i64;
        let end = vdso_monotonic() + 60_000_000;
        while vdso_monotonic() < end {
            let before = vdso_monotonic();
            let ours = monotonic_ns();
            let after = vdso_monotonic();
            assert!(ours >= last, "went back from {last} to {ours}");
            last = ours;
            // Distance outside [before, after], the window the true value is in.
            let off = if ours < before {
                before as i64 - ours as i64
            } else if ours > after {
                ours as i64 - after as i64
            } else {
                0
            };
            worst = worst.max(off);
        }
        assert!(worst < 5_000, "off CLOCK_MONOTONIC by {worst} ns");
    }

    #[test]
    fn threads_each_see_a_rising_clock() {
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let mut last = 0;
                    for _ in 0..2_000_000 {
                        let now = monotonic_ns();
                        assert!(now >= last);
                        last = now;
                    }
                });
            }
        });
    }
}
