//! Added cost per call of a uprobe, and of a uprobe plus a uretprobe, with a trivial counting
//! handler (and a uprobe with a handler that does nothing), against the same function
//! unhooked; then the same counting uprobe hooked as a function entry (no flags kept), and
//! as a lone code handler the stub calls itself (as the agent runs a bpftrace `count()`), and
//! the same lone code handler behind a one-byte breakpoint (`int3` and the SIGTRAP handler,
//! as a USDT site or an instruction before a loop head gets).
//! Subtract the `plain` median from the others for the ns a hook adds.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bpftime_attach::{
    attach_uprobe, attach_uprobe_code, attach_uretprobe, detach, use_static_tls_flag, CodeHandler,
    Handler, HookAddress, PtRegs,
};
use criterion::{criterion_group, criterion_main, Criterion};

// One copy per case so each keeps its own hooks for the whole run.
#[inline(never)]
extern "C" fn plain(x: u64) -> u64 {
    black_box(x).wrapping_mul(0x9e37_79b9).rotate_left(7)
}

#[inline(never)]
extern "C" fn with_uprobe(x: u64) -> u64 {
    black_box(x).wrapping_mul(0x9e37_79b9).rotate_left(9)
}

#[inline(never)]
extern "C" fn with_noop(x: u64) -> u64 {
    black_box(x).wrapping_mul(0x9e37_79b9).rotate_left(13)
}

#[inline(never)]
extern "C" fn with_both(x: u64) -> u64 {
    black_box(x).wrapping_mul(0x9e37_79b9).rotate_left(11)
}

#[inline(never)]
extern "C" fn at_function_entry(x: u64) -> u64 {
    black_box(x).wrapping_mul(0x9e37_79b9).rotate_left(15)
}

#[inline(never)]
extern "C" fn with_code(x: u64) -> u64 {
    black_box(x).wrapping_mul(0x9e37_79b9).rotate_left(17)
}

#[inline(never)]
extern "C" fn with_breakpoint(x: u64) -> u64 {
    black_box(x).wrapping_mul(0x9e37_79b9).rotate_left(19)
}

bpftime_attach::static_tls_flag!(fn flag_offset, "bpftime_bench_hook_flag");

// Counts into the word at `arg`, touching no vector register.
std::arch::global_asm!(
    ".text",
    ".globl bpftime_bench_counting",
    "bpftime_bench_counting:",
    "lock inc qword ptr [rsi]",
    "xor eax, eax",
    "ret",
);

extern "C" {
    fn bpftime_bench_counting(regs: *mut PtRegs, arg: u64, zero: u64) -> u64;
}

fn bench(c: &mut Criterion) {
    // SAFETY: the byte is this binary's alone; nothing is attached yet.
    unsafe { use_static_tls_flag(flag_offset()) }.unwrap();
    let hits = Arc::new(AtomicU64::new(0));
    let counting = || -> Handler {
        let h = hits.clone();
        Arc::new(move |_| {
            h.fetch_add(1, Ordering::Relaxed);
        })
    };
    let code_hits = Arc::new(AtomicU64::new(0));
    // SAFETY: all are whole functions of this binary, entered by call; the code handler
    // is the assembly above, which keeps the vector registers.
    let ids = unsafe {
        [
            attach_uprobe(with_uprobe as *const () as usize, counting()).unwrap(),
            attach_uprobe(with_noop as *const () as usize, Arc::new(|_| {})).unwrap(),
            attach_uprobe(with_both as *const () as usize, counting()).unwrap(),
            attach_uretprobe(with_both as *const () as usize, counting()).unwrap(),
            attach_uprobe(
                HookAddress::function_entry(at_function_entry as *const () as usize),
                counting(),
            )
            .unwrap(),
            attach_uprobe_code(
                HookAddress::function_entry(with_code as *const () as usize),
                CodeHandler {
                    entry: bpftime_bench_counting,
                    arg: Arc::as_ptr(&code_hits) as u64,
                    owner: code_hits.clone(),
                    keeps_vector_registers: true,
                    regs_read: 0,
                },
            )
            .unwrap(),
            attach_uprobe_code(
                HookAddress::breakpoint(with_breakpoint as *const () as usize),
                CodeHandler {
                    entry: bpftime_bench_counting,
                    arg: Arc::as_ptr(&code_hits) as u64,
                    owner: code_hits.clone(),
                    keeps_vector_registers: true,
                    regs_read: 0,
                },
            )
            .unwrap(),
        ]
    };
    let mut g = c.benchmark_group("hooked_call");
    for (name, f) in [
        ("plain", plain as extern "C" fn(u64) -> u64),
        ("uprobe", with_uprobe),
        // The hook's own share, without the handler's atomic add.
        ("uprobe_noop_handler", with_noop),
        ("uprobe+uretprobe", with_both),
        ("uprobe_at_function_entry", at_function_entry),
        ("uprobe_lone_code_handler", with_code),
        ("uprobe_lone_code_handler_breakpoint", with_breakpoint),
    ] {
        let f = black_box(f);
        g.bench_function(name, |b| {
            let mut x = 1u64;
            b.iter(|| {
                x = f(x);
                x
            })
        });
    }
    g.finish();
    for id in ids {
        detach(id).unwrap();
    }
    assert!(hits.load(Ordering::Relaxed) > 0);
    assert!(code_hits.load(Ordering::Relaxed) > 0);
}

criterion_group!(benches, bench);
criterion_main!(benches);
