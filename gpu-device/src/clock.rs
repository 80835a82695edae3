//! One clock for CPU and GPU (docs/ARCHITECTURE.md decision 8): the GPU's `%globaltimer` measured
//! against the host's `CLOCK_MONOTONIC`, so that `bpf_ktime_get_ns` on the GPU reads the
//! host's clock and CPU and GPU events order correctly.

use std::time::{Duration, Instant};

/// Where the GPU's global timer stands against the host's `CLOCK_MONOTONIC`: host time
/// = global timer + `offset_ns`, within `error_ns` either way at `taken`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockCalibration {
    pub offset_ns: i64,
    pub error_ns: u64,
    pub taken: Instant,
}

/// How long a calibration is trusted before the next launch takes a new one: the two
/// clocks drift about 20 ppm apart (docs/ARCHITECTURE.md decision 8), 2 µs per 100 ms.
pub const CLOCK_REANCHOR: Duration = Duration::from_millis(100);

/// Global-timer readings bracketed by host readings, per calibration; the tightest wins.
pub const CLOCK_SAMPLES: usize = 16;

/// Nanoseconds on the host's `CLOCK_MONOTONIC`, the clock `bpf_ktime_get_ns` reads.
pub fn host_monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The offset and error bound from global-timer readings `gpu` each taken between
/// host readings `before` and `after`: the tightest bracket, its midpoint as the
/// estimate and half its width as the bound. `None` without a sample.
pub fn estimate_clock_offset(samples: &[(u64, u64, u64)]) -> Option<(i64, u64)> {
    samples
        .iter()
        .filter(|(before, _, after)| after >= before)
        .min_by_key(|(before, _, after)| after - before)
        .map(|&(before, gpu, after)| {
            let half = (after - before) / 2;
            ((before + half) as i64 - gpu as i64, half)
        })
}

/// Why a calibration failed: reading the GPU's timer failed, or no sample was usable.
#[derive(Debug)]
pub enum CalibrationError<E> {
    Read(E),
    NoSample,
}

impl<E> CalibrationError<E> {
    /// The read error, or `no_sample` when there was none.
    pub fn either(self, no_sample: E) -> E {
        match self {
            CalibrationError::Read(e) => e,
            CalibrationError::NoSample => no_sample,
        }
    }
}

/// Takes [`CLOCK_SAMPLES`] readings of the global timer with `read_gpu` (a launch that
/// returns `%globaltimer`, waited for), each bracketed by host readings, and keeps the
/// tightest bracket.
pub fn calibrate<E>(
    mut read_gpu: impl FnMut() -> Result<u64, E>,
) -> Result<ClockCalibration, CalibrationError<E>> {
    let mut samples = Vec::with_capacity(CLOCK_SAMPLES);
    for _ in 0..CLOCK_SAMPLES {
        let before = host_monotonic_ns();
        let gpu = read_gpu().map_err(CalibrationError::Read)?;
        let after = host_monotonic_ns();
        samples.push((before, gpu, after));
    }
    let (offset_ns, error_ns) =
        estimate_clock_offset(&samples).ok_or(CalibrationError::NoSample)?;
    Ok(ClockCalibration {
        offset_ns,
        error_ns,
        taken: Instant::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_offset_comes_from_the_tightest_bracket() {
        // (host before, gpu, host after): the second bracket is 200 ns wide.
        let samples = [
            (1_000, 500, 3_000),
            (10_000, 9_000, 10_200),
            (20_000, 0, 19_000),
        ];
        assert_eq!(estimate_clock_offset(&samples), Some((10_100 - 9_000, 100)));
        assert_eq!(estimate_clock_offset(&[]), None);
        // A sample whose host clock went backwards says nothing.
        assert_eq!(estimate_clock_offset(&[(5, 1, 4)]), None);
    }

    #[test]
    fn calibration_keeps_the_tightest_of_its_samples() {
        let mut n = 0u64;
        // The global timer runs 1 ms behind the host clock.
        let c = calibrate(|| {
            n += 1;
            Ok::<u64, ()>(host_monotonic_ns() - 1_000_000)
        })
        .unwrap();
        assert_eq!(n, CLOCK_SAMPLES as u64);
        assert!(
            (c.offset_ns - 1_000_000).abs() <= c.error_ns as i64 + 1,
            "{c:?}"
        );
        assert!(matches!(
            calibrate(|| Err::<u64, &str>("no device")),
            Err(CalibrationError::Read("no device"))
        ));
    }
}
