//! bpftime's GPU map types in programs: GPU programs use all of them as bpftime's own
//! do, with the rules of the standard map each is served as.

mod common;

use bpftime_isa::uapi::prog_type;
use bpftime_verifier::RejectKind;
use common::*;

fn gpu(src: &str) -> Result<bpftime_verifier::Verified, bpftime_verifier::Rejection> {
    run_with(&asm(src), prog_type::KPROBE, true)
}

/// A 24-byte record on the stack, then `bpf_perf_event_output(R1, map FD, 0, record,
/// 24)` with R1 as `ctx` sets it.
fn perf_output(ctx: &str, fd: i32) -> String {
    format!(
        "mov %r6, %r1\nstdw [%r10-8], 1\nstdw [%r10-16], 2\nstdw [%r10-24], 3\n{ctx}\n\
         ldmap %r2, {fd}\nmov %r3, 0\nmov %r4, %r10\nadd %r4, -24\nmov %r5, 24\ncall 25\n\
         mov %r0, 0\nexit"
    )
}

/// bpftime's kernelretsnoop passes NULL as the context of bpf_perf_event_output on its
/// GPU ring buffer: taken there (the ring has no use for it), and still refused for a
/// perf event array, as the kernel refuses it.
#[test]
fn a_null_context_is_taken_for_a_gpu_ring_buffer_only() {
    gpu(&perf_output("mov %r1, 0", GPU_RINGBUF)).unwrap();
    gpu(&perf_output("mov %r1, %r6", GPU_RINGBUF)).unwrap();
    let e = gpu(&perf_output("mov %r1, 0", PERF)).unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::HelperArgType { reg: 1, .. }),
        "{}",
        e.log()
    );
    // A pointer that is no context is refused for any map.
    let e = gpu(&perf_output("mov %r1, %r10", GPU_RINGBUF)).unwrap_err();
    assert!(
        matches!(e.kind, RejectKind::HelperArgType { reg: 1, .. }),
        "{}",
        e.log()
    );
    gpu(&perf_output("mov %r1, %r6", PERF)).unwrap();
}

const LOOKUP_KEY_0: &str = "stw [%r10-4], 0\nmov %r2, %r10\nadd %r2, -4\n";

/// Lookups, updates and deletes on every bpftime GPU map that holds values, in a GPU
/// program, as bpftime's examples make them.
#[test]
fn every_gpu_map_with_values_takes_the_map_helpers() {
    for fd in [
        GPU_ARRAY,
        GPU_HASH,
        GPU_KERNEL_SHARED,
        GPU_ARRAY_HOST,
        PER_THREAD,
        PER_THREAD_HOST,
    ] {
        let src = format!(
            "{LOOKUP_KEY_0}ldmap %r1, {fd}\ncall 1\njeq %r0, 0, +2\nldxdw %r1, [%r0]\n\
             stxdw [%r0], %r1\n{LOOKUP_KEY_0}stdw [%r10-16], 5\nmov %r3, %r10\nadd %r3, -16\n\
             ldmap %r1, {fd}\nmov %r4, 0\ncall 2\n{LOOKUP_KEY_0}ldmap %r1, {fd}\ncall 3\n\
             mov %r0, 0\nexit"
        );
        gpu(&src).unwrap_or_else(|e| panic!("map {fd}:\n{}", e.log()));
    }
}

/// A constant key in range makes a standard array's lookup (and a GPU array's, which is
/// one) certain to hit; a per-thread array's lookup misses for a thread past the map's
/// thread count, so its result must be checked.
#[test]
fn a_per_thread_lookup_may_miss_where_an_array_lookup_cannot() {
    let unchecked =
        |fd: i32| format!("{LOOKUP_KEY_0}ldmap %r1, {fd}\ncall 1\nldxdw %r0, [%r0]\nexit");
    gpu(&unchecked(GPU_ARRAY)).unwrap();
    gpu(&unchecked(GPU_KERNEL_SHARED)).unwrap();
    for fd in [PER_THREAD, PER_THREAD_HOST] {
        let e = gpu(&unchecked(fd)).unwrap_err();
        assert!(
            matches!(e.kind, RejectKind::InvalidMemAccess { ty, .. } if ty.contains("or_null")),
            "map {fd}: {}",
            e.log()
        );
    }
}
