//! The `gpu` engine: each program is compiled to PTX by `bpftime-jit-ptx` and its
//! kernel entry runs as one thread on an NVIDIA GPU through the
//! stand-alone runner (`gpu_runner`), with the test's memory copied to the device and back.

use std::sync::OnceLock;

use bpftime_isa::Insn;
use bpftime_jit_ptx::{compile, CompileError, GpuEnv, GpuHelper, PtxOptions, PtxProgram};
use cudarc::driver::LaunchConfig;

pub use crate::gpu_runner::{check_libcuda, GpuDevice, GpuRunError, LIBCUDA, ONE_THREAD};
pub use bpftime_gpu_device::clock::host_monotonic_ns;

use crate::engine::Engine;

/// The symbol uBPF's harness helper 5 gets inside conformance programs.
const UNWIND: &str = "bpf_conformance_unwind";

/// The helpers the bpf_conformance programs call on a GPU: uBPF's `unwind` (id 5,
/// returns its first argument), defined inside the module so that each program's PTX
/// is complete on its own.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConformanceGpuEnv;

impl GpuEnv for ConformanceGpuEnv {
    fn helper(&self, id: u32) -> Option<GpuHelper> {
        (id == 5).then(|| GpuHelper::Extern(UNWIND.to_string()))
    }

    fn library(&self) -> Option<&str> {
        Some(
            "define i64 @bpf_conformance_unwind(i64 %a, i64 %b, i64 %c, i64 %d, i64 %e) {\n  \
             ret i64 %a\n}\n",
        )
    }
}

/// A conformance program as PTX for `opts`.
pub fn conformance_ptx(prog: &[Insn], opts: &PtxOptions) -> Result<PtxProgram, CompileError> {
    compile(prog, &ConformanceGpuEnv, opts)
}

/// The GPU as an [`Engine`]: opens the device at the first run.
#[derive(Default)]
pub struct GpuEngine {
    device: OnceLock<Result<GpuDevice, GpuRunError>>,
    options: PtxOptions,
}

impl GpuEngine {
    pub fn new() -> Self {
        GpuEngine::default()
    }

    fn device(&self) -> Result<&GpuDevice, GpuRunError> {
        self.device
            .get_or_init(GpuDevice::open)
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Like [`Engine::run`], telling apart a program that does not compile from a
    /// device failure.
    pub fn run_program(&self, prog: &[Insn], mem: &mut [u8]) -> Result<u64, GpuRunError> {
        let program = conformance_ptx(prog, &self.options)
            .map_err(|e| GpuRunError::Compile(e.to_string()))?;
        self.device()?.launch(&program, mem, ONE_THREAD)
    }
}

impl Engine for GpuEngine {
    fn name(&self) -> &str {
        "gpu"
    }

    fn run(&self, prog: &[Insn], mem: &mut [u8]) -> Result<u64, String> {
        self.run_program(prog, mem).map_err(|e| e.to_string())
    }
}

/// A program that records, for each GPU thread, what every GPU helper tells it: the
/// launch geometry (503, 504, 505, 508), lane (511), SM (509 and 8), warp (510), both
/// clocks (502 and 5) and the barrier's r0 (506), into a [`HELPER_RECORD`]-byte record at
/// `mem + global_thread_index * HELPER_RECORD`. Field 19 is a marker that the record was
/// written. Checked by [`check_helper_records`].
pub const HELPER_PROBE: &str = "
mov %r9, %r1
mov %r1, %r10
add %r1, -8
mov %r2, %r10
add %r2, -16
mov %r3, %r10
add %r3, -24
call 505
mov %r1, %r10
add %r1, -32
mov %r2, %r10
add %r2, -40
mov %r3, %r10
add %r3, -48
call 503
mov %r1, %r10
add %r1, -56
mov %r2, %r10
add %r2, -64
mov %r3, %r10
add %r3, -72
call 504
mov %r1, %r10
add %r1, -80
mov %r2, %r10
add %r2, -88
mov %r3, %r10
add %r3, -96
call 508
# r6 = index in the block: (tid.z * bdim.y + tid.y) * bdim.x + tid.x
ldxdw %r6, [%r10-24]
ldxdw %r7, [%r10-64]
mul %r6, %r7
ldxdw %r7, [%r10-16]
add %r6, %r7
ldxdw %r7, [%r10-56]
mul %r6, %r7
ldxdw %r7, [%r10-8]
add %r6, %r7
# r8 = index of the block: (bid.z * grid.y + bid.y) * grid.x + bid.x
ldxdw %r8, [%r10-48]
ldxdw %r7, [%r10-88]
mul %r8, %r7
ldxdw %r7, [%r10-40]
add %r8, %r7
ldxdw %r7, [%r10-80]
mul %r8, %r7
ldxdw %r7, [%r10-32]
add %r8, %r7
# r8 = r8 * threads per block + r6
ldxdw %r7, [%r10-56]
ldxdw %r5, [%r10-64]
mul %r7, %r5
ldxdw %r5, [%r10-72]
mul %r7, %r5
mul %r8, %r7
add %r8, %r6
lsh %r8, 8
add %r9, %r8
ldxdw %r0, [%r10-8]
stxdw [%r9+0], %r0
ldxdw %r0, [%r10-16]
stxdw [%r9+8], %r0
ldxdw %r0, [%r10-24]
stxdw [%r9+16], %r0
ldxdw %r0, [%r10-32]
stxdw [%r9+24], %r0
ldxdw %r0, [%r10-40]
stxdw [%r9+32], %r0
ldxdw %r0, [%r10-48]
stxdw [%r9+40], %r0
ldxdw %r0, [%r10-56]
stxdw [%r9+48], %r0
ldxdw %r0, [%r10-64]
stxdw [%r9+56], %r0
ldxdw %r0, [%r10-72]
stxdw [%r9+64], %r0
ldxdw %r0, [%r10-80]
stxdw [%r9+72], %r0
ldxdw %r0, [%r10-88]
stxdw [%r9+80], %r0
ldxdw %r0, [%r10-96]
stxdw [%r9+88], %r0
call 511
stxdw [%r9+96], %r0
call 509
stxdw [%r9+104], %r0
call 510
stxdw [%r9+112], %r0
call 502
stxdw [%r9+120], %r0
call 5
stxdw [%r9+128], %r0
call 8
stxdw [%r9+136], %r0
call 506
stxdw [%r9+144], %r0
mov %r0, 0x5a5a
stxdw [%r9+152], %r0
mov %r0, 0
exit
";

/// Bytes per thread in [`HELPER_PROBE`]'s output.
pub const HELPER_RECORD: usize = 256;

/// The launch [`HELPER_PROBE`] is checked with: 3 x 2 blocks of 8 x 4 x 2 threads.
pub const HELPER_LAUNCH: LaunchConfig = LaunchConfig {
    grid_dim: (3, 2, 1),
    block_dim: (8, 4, 2),
    shared_mem_bytes: 0,
};

/// Checks the records [`HELPER_PROBE`] wrote under `launch` against the launch geometry
/// and the device's `sm_count`; returns one line per wrong field (empty when all hold).
/// When a helper-probe launch ran, on the host's clock, and the calibration it used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostClockWindow {
    /// `CLOCK_MONOTONIC` just before the launch and just after it finished.
    pub before_ns: u64,
    pub after_ns: u64,
    /// The calibration whose offset the launch's `ktime_get_ns` added.
    pub offset_ns: i64,
    pub error_ns: u64,
}

pub fn check_helper_records(
    mem: &[u8],
    launch: &LaunchConfig,
    sm_count: u32,
    window: &HostClockWindow,
) -> Vec<String> {
    let (gx, gy, gz) = launch.grid_dim;
    let (bx, by, bz) = launch.block_dim;
    let per_block = u64::from(bx * by * bz);
    let threads = per_block * u64::from(gx * gy * gz);
    let field = |t: u64, i: usize| {
        let at = t as usize * HELPER_RECORD + i * 8;
        mem.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let mut problems = Vec::new();
    let mut clocks = Vec::new();
    for t in 0..threads {
        let (block, local) = (t / per_block, t % per_block);
        let (bx64, by64) = (u64::from(bx), u64::from(by));
        let expected = [
            (0, "thread_idx.x", local % bx64),
            (1, "thread_idx.y", local / bx64 % by64),
            (2, "thread_idx.z", local / (bx64 * by64)),
            (3, "block_idx.x", block % u64::from(gx)),
            (4, "block_idx.y", block / u64::from(gx) % u64::from(gy)),
            (5, "block_idx.z", block / u64::from(gx * gy)),
            (6, "block_dim.x", bx64),
            (7, "block_dim.y", by64),
            (8, "block_dim.z", u64::from(bz)),
            (9, "grid_dim.x", u64::from(gx)),
            (10, "grid_dim.y", u64::from(gy)),
            (11, "grid_dim.z", u64::from(gz)),
            (12, "lane_id", local % 32),
            (18, "membar r0", 0),
            (19, "marker", 0x5a5a),
        ];
        let Some(marker) = field(t, 19) else {
            problems.push(format!("thread {t}: record is outside the buffer"));
            continue;
        };
        if marker != 0x5a5a {
            problems.push(format!("thread {t}: no record written"));
            continue;
        }
        for (i, what, want) in expected {
            let got = field(t, i).unwrap_or(u64::MAX);
            if got != want {
                problems.push(format!("thread {t}: {what} = {got}, expected {want}"));
            }
        }
        let sm = field(t, 13).unwrap_or(u64::MAX);
        if sm >= u64::from(sm_count) {
            problems.push(format!(
                "thread {t}: sm_id = {sm}, the device has {sm_count} SMs"
            ));
        }
        let cpu = field(t, 17).unwrap_or(u64::MAX);
        if cpu != sm {
            problems.push(format!(
                "thread {t}: get_smp_processor_id = {cpu}, sm_id = {sm}"
            ));
        }
        // PTX's %warpid is below the SM's warp slots (at most 64 on sm_70 to sm_90).
        let warp = field(t, 14).unwrap_or(u64::MAX);
        if warp >= 64 {
            problems.push(format!(
                "thread {t}: warp_id = {warp}, beyond 64 warp slots"
            ));
        }
        clocks.push((t, field(t, 15).unwrap_or(0), field(t, 16).unwrap_or(0)));
    }
    // The raw timer moves forward in nanoseconds within one short launch.
    const SPAN_NS: u64 = 10_000_000_000;
    let raw: Vec<u64> = clocks.iter().map(|&(_, g, _)| g).collect();
    if let (Some(&lo), Some(&hi)) = (raw.iter().min(), raw.iter().max()) {
        if lo == 0 {
            problems.push("the global timer read 0".to_string());
        } else if hi - lo > SPAN_NS {
            problems.push(format!(
                "the global timer spans {} ns within one launch",
                hi - lo
            ));
        }
    }
    // ktime_get_ns is on the host's clock: inside the launch's host window, give or take
    // the calibration's error, and at or after the raw timer read just before it.
    let earliest = window.before_ns.saturating_sub(window.error_ns);
    let latest = window.after_ns.saturating_add(window.error_ns);
    for &(t, globaltimer, ktime) in &clocks {
        if ktime < earliest || ktime > latest {
            problems.push(format!(
                "thread {t}: ktime_get_ns {ktime} is outside the launch's host window \
                 [{earliest}, {latest}] (calibration error {} ns)",
                window.error_ns
            ));
        }
        let on_gpu_clock = ktime as i64 - window.offset_ns;
        if on_gpu_clock < globaltimer as i64 {
            problems.push(format!(
                "thread {t}: ktime_get_ns {ktime} less the offset {} is {on_gpu_clock}, before \
                 the global timer {globaltimer} read earlier",
                window.offset_ns
            ));
        }
    }
    problems
}

/// The bytes [`HELPER_PROBE`] needs under `launch`, filled with a poison pattern.
pub fn helper_buffer(launch: &LaunchConfig) -> Vec<u8> {
    let (gx, gy, gz) = launch.grid_dim;
    let (bx, by, bz) = launch.block_dim;
    vec![0xa5; (gx * gy * gz * bx * by * bz) as usize * HELPER_RECORD]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A launch seen from the host between 5 and 6 ms, with the global timer 4 ms behind.
    const WINDOW: HostClockWindow = HostClockWindow {
        before_ns: 5_000_000,
        after_ns: 6_000_000,
        offset_ns: 4_000_000,
        error_ns: 2_000,
    };

    /// Records as a correct GPU would write them.
    fn correct(launch: &LaunchConfig) -> Vec<u8> {
        let mut mem = helper_buffer(launch);
        let (gx, gy, gz) = launch.grid_dim;
        let (bx, by, bz) = launch.block_dim;
        let per_block = bx * by * bz;
        for t in 0..per_block * gx * gy * gz {
            let (block, local) = (t / per_block, t % per_block);
            let fields: [u64; 20] = [
                (local % bx).into(),
                (local / bx % by).into(),
                (local / (bx * by)).into(),
                (block % gx).into(),
                (block / gx % gy).into(),
                (block / (gx * gy)).into(),
                bx.into(),
                by.into(),
                bz.into(),
                gx.into(),
                gy.into(),
                gz.into(),
                (local % 32).into(),
                (block % 7).into(),
                (local / 32).into(),
                1_000_000 + u64::from(t),
                WINDOW.before_ns + 100 + u64::from(t),
                (block % 7).into(),
                0,
                0x5a5a,
            ];
            for (i, v) in fields.iter().enumerate() {
                let at = t as usize * HELPER_RECORD + i * 8;
                mem[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
        mem
    }

    #[test]
    fn helper_records_are_checked_field_by_field() {
        let mem = correct(&HELPER_LAUNCH);
        assert_eq!(
            check_helper_records(&mem, &HELPER_LAUNCH, 132, &WINDOW),
            Vec::<String>::new()
        );
        // Too few SMs for the ids seen.
        assert!(!check_helper_records(&mem, &HELPER_LAUNCH, 4, &WINDOW).is_empty());
        // A swapped thread index, a missing record, a poisoned buffer.
        let mut bad = mem.clone();
        let at = 9 * HELPER_RECORD;
        bad[at..at + 8].copy_from_slice(&7u64.to_le_bytes());
        let p = check_helper_records(&bad, &HELPER_LAUNCH, 132, &WINDOW);
        assert_eq!(
            p,
            vec!["thread 9: thread_idx.x = 7, expected 1".to_string()]
        );
        let mut bad = mem.clone();
        bad[5 * HELPER_RECORD + 152] = 0;
        let p = check_helper_records(&bad, &HELPER_LAUNCH, 132, &WINDOW);
        assert_eq!(p, vec!["thread 5: no record written".to_string()]);
        // A ktime on the raw GPU clock (no offset applied), and one from after the launch.
        let mut bad = mem.clone();
        let at = 3 * HELPER_RECORD + 128;
        bad[at..at + 8].copy_from_slice(&1_000_103u64.to_le_bytes());
        let p = check_helper_records(&bad, &HELPER_LAUNCH, 132, &WINDOW);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("outside the launch's host window"), "{p:?}");
        assert!(p[1].contains("before the global timer"), "{p:?}");
        let mut bad = mem.clone();
        bad[at..at + 8].copy_from_slice(&6_002_001u64.to_le_bytes());
        let p = check_helper_records(&bad, &HELPER_LAUNCH, 132, &WINDOW);
        assert_eq!(p.len(), 1, "{p:?}");
        let poisoned = helper_buffer(&HELPER_LAUNCH);
        assert_eq!(
            check_helper_records(&poisoned, &HELPER_LAUNCH, 132, &WINDOW).len(),
            384
        );
    }

    #[test]
    fn the_helper_probe_compiles_to_self_contained_ptx() {
        let prog = bpftime_isa::asm::assemble(HELPER_PROBE).expect("assembles");
        let p = compile(
            &prog,
            &bpftime_jit_ptx::StandardGpuEnv,
            &PtxOptions::default(),
        )
        .expect("compiles");
        assert!(p.externs.is_empty(), "{:?}", p.externs);
        for reg in [
            "%tid.z",
            "%ctaid.y",
            "%ntid.x",
            "%nctaid.z",
            "%laneid",
            "%smid",
        ] {
            assert!(p.ptx.contains(reg), "no {reg}");
        }
    }

    #[test]
    fn missing_libcuda_is_an_error_naming_the_library_not_a_panic() {
        match check_libcuda() {
            Ok(()) => eprintln!("{LIBCUDA} loads here; the missing-driver path is not exercised"),
            Err(e) => {
                assert!(e.contains(LIBCUDA), "{e}");
                let engine = GpuEngine::new();
                let err = engine
                    .run(
                        &bpftime_isa::asm::assemble("mov %r0, 1\nexit").unwrap(),
                        &mut [],
                    )
                    .expect_err("no GPU here");
                assert!(err.contains(LIBCUDA), "{err}");
            }
        }
    }
}
