//! Hooks on functions of this test binary: what handlers see, and that hooked code still works.

mod common;
use common::CMP_CASES;

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bpftime_attach::{
    attach_uprobe, attach_uretprobe, detach, original_return_address, prime_returns, AttachError,
    Handler, HookAddress, PtRegs,
};

fn handler(f: impl Fn(&mut PtRegs) + Send + Sync + 'static) -> Handler {
    Arc::new(f)
}

fn addr(f: *const ()) -> usize {
    f as usize
}

/// The first bytes of a function, read through the pointer (code is readable).
fn head(f: usize) -> [u8; 5] {
    // SAFETY: `f` is a function of this binary, at least 5 bytes long, and mapped readable.
    unsafe { std::ptr::read_volatile(f as *const [u8; 5]) }
}

/// The permissions of the mapping that holds `addr`, from /proc/self/maps.
fn perms_at(addr: usize) -> String {
    mapping_at(addr)[..4].to_owned()
}

/// The `/proc/self/maps` line holding `addr`, from its permissions on.
fn mapping_at(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .find_map(|l| {
            let (range, rest) = l.split_once(' ')?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            (a <= addr && addr < b).then(|| rest.to_owned())
        })
        .unwrap()
}

#[inline(never)]
extern "C" fn three_args(a: u64, b: u64, c: u64) -> u64 {
    black_box(a).wrapping_mul(b) ^ c.rotate_left(5)
}

#[test]
fn uprobe_sees_arguments_ip_and_entry_stack() {
    let f = addr(three_args as *const ());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let h = handler(move |r| {
        // SAFETY: at a function entry [sp] is the return address, on the live stack.
        let ret = unsafe { *(r.sp as *const u64) };
        s.lock()
            .unwrap()
            .push((r.di, r.si, r.dx, r.ip, r.sp, ret, r.cs, r.ss, r.orig_ax));
    });
    // SAFETY: `three_args` is a whole function of this binary.
    let id = unsafe { attach_uprobe(f, h) }.unwrap();
    let call = black_box(three_args as extern "C" fn(u64, u64, u64) -> u64);
    assert_eq!(call(3, 5, 7), 15 ^ 7u64.rotate_left(5));
    assert_eq!(call(11, 13, 17), 143 ^ 17u64.rotate_left(5));
    detach(id).unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2);
    let (di, si, dx, ip, sp, ret, cs, ss, orig_ax) = seen[0];
    assert_eq!((di, si, dx), (3, 5, 7));
    assert_eq!(seen[1].0..=seen[1].2, 11..=17);
    assert_eq!(ip, f as u64);
    // At an entry the call has just pushed 8 bytes onto a 16-aligned stack.
    assert_eq!(sp % 16, 8);
    assert_ne!(ret, 0);
    assert_eq!((cs, ss, orig_ax), (0x33, 0x2b, u64::MAX));
}

#[inline(never)]
extern "C" fn counted(x: u64) -> u64 {
    black_box(x).wrapping_add(1).wrapping_mul(3)
}

#[test]
fn counts_every_call_from_many_threads_and_detach_stops_it() {
    let f = addr(counted as *const ());
    let before = head(f);
    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    // SAFETY: `counted` is a whole function of this binary.
    let id = unsafe {
        attach_uprobe(
            f,
            handler(move |_| {
                h.fetch_add(1, Ordering::Relaxed);
            }),
        )
    }
    .unwrap();
    assert_eq!(head(f)[0], 0xe9, "the entry is a jmp now");
    assert_eq!(perms_at(f), "r-xp", "patched code never becomes writable");
    let call = black_box(counted as extern "C" fn(u64) -> u64);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            s.spawn(move || {
                for i in 0..5000u64 {
                    assert_eq!(call(t * 10_000 + i), (t * 10_000 + i + 1) * 3);
                }
            });
        }
    });
    assert_eq!(hits.load(Ordering::Relaxed), 40_000);
    detach(id).unwrap();
    assert_eq!(head(f), before, "the original bytes are back");
    assert_eq!(call(1), 6);
    assert_eq!(hits.load(Ordering::Relaxed), 40_000);
    assert!(matches!(detach(id), Err(AttachError::UnknownHook { .. })));
}

#[inline(never)]
extern "C" fn ret_val(a: u64, b: u64) -> u64 {
    black_box(a) * 1000 + b
}

#[test]
fn uretprobe_sees_return_value_and_return_address() {
    let f = addr(ret_val as *const ());
    let entry_ret = Arc::new(Mutex::new(Vec::new()));
    let returns = Arc::new(Mutex::new(Vec::new()));
    let (e, r) = (entry_ret.clone(), returns.clone());
    // SAFETY: at a function entry [sp] is the return address, on the live stack.
    let on_entry = handler(move |r| e.lock().unwrap().push(unsafe { *(r.sp as *const u64) }));
    let on_return = handler(move |regs| r.lock().unwrap().push((regs.ax, regs.ip, regs.sp)));
    // SAFETY: `ret_val` is a whole function of this binary, entered by call.
    let ids = unsafe {
        [
            attach_uprobe(f, on_entry).unwrap(),
            attach_uretprobe(f, on_return).unwrap(),
        ]
    };
    let call = black_box(ret_val as extern "C" fn(u64, u64) -> u64);
    assert_eq!(call(4, 2), 4002);
    assert_eq!(call(7, 1), 7001);
    for id in ids {
        detach(id).unwrap();
    }
    let entry_ret = entry_ret.lock().unwrap();
    let returns = returns.lock().unwrap();
    assert_eq!(
        returns.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![4002, 7001]
    );
    // ip is the address the function returned to, which is where its caller's call pushed.
    assert_eq!(returns[0].1, entry_ret[0]);
    assert_eq!(returns[1].1, entry_ret[1]);
    assert_eq!(
        returns[0].2 % 16,
        0,
        "sp after the return is the caller's, 16-aligned at a call site"
    );
}

#[inline(never)]
extern "C" fn fib(n: u64) -> u64 {
    let call = black_box(fib as extern "C" fn(u64) -> u64);
    if n < 2 {
        n
    } else {
        call(n - 1) + call(n - 2)
    }
}

fn fib_post_order(n: u64, out: &mut Vec<(u64, u64)>) -> u64 {
    let v = if n < 2 {
        n
    } else {
        fib_post_order(n - 1, out) + fib_post_order(n - 2, out)
    };
    out.push((n, v));
    v
}

#[test]
fn uretprobe_pairs_returns_with_calls_under_recursion() {
    let f = addr(fib as *const ());
    let args = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (a, s) = (args.clone(), seen.clone());
    // SAFETY: `fib` is a whole function of this binary, entered by call.
    let ids = unsafe {
        [
            attach_uprobe(f, handler(move |r| a.lock().unwrap().push(r.di))).unwrap(),
            attach_uretprobe(f, handler(move |r| s.lock().unwrap().push(r.ax))).unwrap(),
        ]
    };
    assert_eq!(fib(15), 610);
    for id in ids {
        detach(id).unwrap();
    }
    let mut expected = Vec::new();
    fib_post_order(15, &mut expected);
    assert_eq!(
        *seen.lock().unwrap(),
        expected.iter().map(|e| e.1).collect::<Vec<_>>()
    );
    assert_eq!(args.lock().unwrap().len(), expected.len());
    assert_eq!(fib(10), 55);
}

#[inline(never)]
extern "C" fn depth(n: u64) -> u64 {
    if n == 0 {
        0
    } else {
        black_box(depth as extern "C" fn(u64) -> u64)(n - 1) + 1
    }
}

#[test]
fn uretprobe_survives_deep_nesting() {
    let f = addr(depth as *const ());
    let returns = Arc::new(AtomicU64::new(0));
    let in_order = Arc::new(AtomicBool::new(true));
    let (r, o) = (returns.clone(), in_order.clone());
    // SAFETY: `depth` is a whole function of this binary, entered by call.
    let id = unsafe {
        attach_uretprobe(
            f,
            handler(move |regs| {
                // Innermost returns first: the k-th return (from 0) returns k.
                let k = r.fetch_add(1, Ordering::Relaxed);
                if regs.ax != k {
                    o.store(false, Ordering::Relaxed);
                }
            }),
        )
    }
    .unwrap();
    let got = std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(|| depth(20_000))
        .unwrap()
        .join()
        .unwrap();
    detach(id).unwrap();
    assert_eq!(got, 20_000);
    assert_eq!(returns.load(Ordering::Relaxed), 20_001);
    assert!(in_order.load(Ordering::Relaxed));
}

#[inline(never)]
extern "C" fn ordered(x: u64) -> u64 {
    black_box(x) ^ 0x5a5a
}

#[test]
fn handlers_on_one_address_run_in_attach_order() {
    let f = addr(ordered as *const ());
    let log = Arc::new(Mutex::new(String::new()));
    let push = |c: char| {
        let log = log.clone();
        handler(move |_| log.lock().unwrap().push(c))
    };
    // SAFETY: `ordered` is a whole function of this binary, entered by call.
    let ids = unsafe {
        [
            attach_uprobe(f, push('a')).unwrap(),
            attach_uretprobe(f, push('X')).unwrap(),
            attach_uprobe(f, push('b')).unwrap(),
            attach_uretprobe(f, push('Y')).unwrap(),
        ]
    };
    let call = black_box(ordered as extern "C" fn(u64) -> u64);
    assert_eq!(call(0), 0x5a5a);
    detach(ids[0]).unwrap();
    detach(ids[3]).unwrap();
    assert_eq!(call(0x5a5a), 0);
    assert_eq!(*log.lock().unwrap(), "abXYbX");
    detach(ids[1]).unwrap();
    detach(ids[2]).unwrap();
    assert_eq!(call(1), 0x5a5b);
    assert_eq!(*log.lock().unwrap(), "abXYbX");
}

#[inline(never)]
extern "C" fn overridden(x: u64) -> u64 {
    black_box(x) + 1
}

#[test]
fn handlers_can_change_arguments_and_return_values() {
    let f = addr(overridden as *const ());
    // SAFETY: `overridden` is a whole function of this binary, entered by call.
    let ids = unsafe {
        [
            attach_uprobe(f, handler(|r| r.di *= 10)).unwrap(),
            attach_uretprobe(f, handler(|r| r.ax += 1000)).unwrap(),
        ]
    };
    let call = black_box(overridden as extern "C" fn(u64) -> u64);
    assert_eq!(call(4), 1041);
    for id in ids {
        detach(id).unwrap();
    }
    assert_eq!(call(4), 5);
}

#[inline(never)]
extern "C" fn float_math(a: f64, b: f64, c: f32) -> f64 {
    black_box(a) * b + f64::from(c)
}

#[test]
fn floating_point_arguments_and_results_survive_handlers() {
    let f = addr(float_math as *const ());
    let sink = Arc::new(Mutex::new(0.0f64));
    let (s1, s2) = (sink.clone(), sink.clone());
    // Handlers that do floating-point work of their own, clobbering xmm registers if unsaved.
    // SAFETY: `float_math` is a whole function of this binary, entered by call.
    let ids = unsafe {
        [
            attach_uprobe(
                f,
                handler(move |r| *s1.lock().unwrap() += black_box(r.di as f64).sqrt() * 3.25),
            )
            .unwrap(),
            attach_uretprobe(
                f,
                handler(move |r| *s2.lock().unwrap() += black_box(r.ax as f64) / 7.5),
            )
            .unwrap(),
        ]
    };
    let call = black_box(float_math as extern "C" fn(f64, f64, f32) -> f64);
    assert_eq!(call(1.5, 4.0, 0.25), 6.25);
    assert_eq!(call(-2.0, 8.5, 1.0), -16.0);
    for id in ids {
        detach(id).unwrap();
    }
}

#[inline(never)]
extern "C" fn panicky(x: u64) -> u64 {
    black_box(x) * 2
}

#[test]
fn a_panicking_handler_is_disabled_and_the_others_keep_running() {
    let f = addr(panicky as *const ());
    let bad = Arc::new(AtomicU64::new(0));
    let good = Arc::new(AtomicU64::new(0));
    let (b, g) = (bad.clone(), good.clone());
    // SAFETY: `panicky` is a whole function of this binary, entered by call.
    let ids = unsafe {
        [
            attach_uprobe(
                f,
                handler(move |_| {
                    b.fetch_add(1, Ordering::Relaxed);
                    panic!("handler bug");
                }),
            )
            .unwrap(),
            attach_uprobe(
                f,
                handler(move |_| {
                    g.fetch_add(1, Ordering::Relaxed);
                }),
            )
            .unwrap(),
        ]
    };
    let call = black_box(panicky as extern "C" fn(u64) -> u64);
    for i in 0..3 {
        assert_eq!(call(i), i * 2);
    }
    for id in ids {
        detach(id).unwrap();
    }
    assert_eq!(bad.load(Ordering::Relaxed), 1);
    assert_eq!(good.load(Ordering::Relaxed), 3);
}

#[inline(never)]
extern "C" fn busy(x: u64) -> u64 {
    black_box(x)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .rotate_left(17)
}

#[test]
fn attaching_and_detaching_while_other_threads_run_the_function() {
    let f = addr(busy as *const ());
    let stop = AtomicBool::new(false);
    let hits = Arc::new(AtomicU64::new(0));
    let call = black_box(busy as extern "C" fn(u64) -> u64);
    /// Stops the callers even when an assertion below fails, or the scope would never end.
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for t in 0..3u64 {
            let stop = &stop;
            s.spawn(move || {
                let mut i = t;
                while !stop.load(Ordering::Relaxed) {
                    assert_eq!(
                        call(i),
                        i.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17)
                    );
                    i += 3;
                }
            });
        }
        for _ in 0..200 {
            let h = hits.clone();
            // SAFETY: `busy` is a whole function of this binary, entered by call.
            let ids = unsafe {
                [
                    attach_uprobe(
                        f,
                        handler(move |_| {
                            h.fetch_add(1, Ordering::Relaxed);
                        }),
                    )
                    .unwrap(),
                    attach_uretprobe(f, handler(|r| assert_ne!(r.ip, 0))).unwrap(),
                ]
            };
            std::thread::yield_now();
            for id in ids {
                detach(id).unwrap();
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(hits.load(Ordering::Relaxed) > 0, "the hooks saw some calls");
}

// A probe point where flags are live: between a `cmp` and the `pushfq` that reads its result,
// with DF set on request. 8 bytes of flag-neutral `mov`s give the patch room.
std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl bpftime_attach_test_flags",
    "bpftime_attach_test_flags:",
    "test rdx, rdx",
    "jz 3f",
    "std",
    "3:",
    "cmp rdi, rsi",
    ".globl bpftime_attach_test_flags_probe",
    "bpftime_attach_test_flags_probe:",
    "mov rax, rdi",
    "mov rax, rsi",
    "mov rcx, rdi",
    "pushfq",
    "pop rax",
    "cld",
    "ret",
);

extern "C" {
    fn bpftime_attach_test_flags(a: u64, b: u64, set_df: u64) -> u64;
    fn bpftime_attach_test_flags_probe();
}

const ARITH_AND_DF: u64 = 0x1 | 0x4 | 0x10 | 0x40 | 0x80 | 0x400 | 0x800;

fn flags_after_cmp(a: u64, b: u64, set_df: u64) -> u64 {
    // SAFETY: the stub above takes three integers, clears DF again before returning.
    (unsafe { bpftime_attach_test_flags(a, b, set_df) }) & ARITH_AND_DF
}

#[test]
fn flags_live_at_a_probe_point_survive_it() {
    let cases = CMP_CASES;
    let mut expected = Vec::new();
    for &(a, b) in &cases {
        for df in [0, 1] {
            expected.push(flags_after_cmp(a, b, df));
        }
    }
    assert!(
        expected.iter().any(|f| f & 0x800 != 0) && expected.iter().any(|f| f & 0x400 != 0),
        "cases cover OF and DF"
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    // A handler whose own arithmetic clobbers every flag.
    let h = handler(move |r| {
        s.lock()
            .unwrap()
            .push(black_box(r.flags).wrapping_add(black_box(1)) - 1)
    });
    let probe = bpftime_attach_test_flags_probe as *const () as usize;
    // SAFETY: the probe label starts a `mov`, and nothing jumps into the 9 bytes after it.
    let id = unsafe { attach_uprobe(probe, h) }.unwrap();
    let mut got = Vec::new();
    for &(a, b) in &cases {
        for df in [0, 1] {
            got.push(flags_after_cmp(a, b, df));
        }
    }
    detach(id).unwrap();
    assert_eq!(got, expected);
    let seen: Vec<u64> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|f| f & ARITH_AND_DF)
        .collect();
    assert_eq!(seen, expected, "handlers see the live flags");
}

thread_local! {
    static RECORDING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[test]
fn hooks_libc_malloc_while_the_whole_process_uses_it() {
    let malloc = libc::malloc as *const () as usize;
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let returned = Arc::new(Mutex::new(Vec::new()));
    let total = Arc::new(AtomicU64::new(0));
    let (s, r, t) = (sizes.clone(), returned.clone(), total.clone());
    // The handlers allocate (Vec::push): the hook must not recurse into itself.
    let on_entry = handler(move |regs| {
        t.fetch_add(1, Ordering::Relaxed);
        if RECORDING.get() {
            s.lock().unwrap().push(regs.di);
        }
    });
    let on_return = handler(move |regs| {
        if RECORDING.get() {
            r.lock().unwrap().push(regs.ax);
        }
    });
    // SAFETY: malloc is a function entry in libc, which stays mapped.
    let ids = unsafe {
        [
            attach_uprobe(malloc, on_entry).unwrap(),
            attach_uretprobe(malloc, on_return).unwrap(),
        ]
    };
    let mut mine = Vec::new();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            (0..2000)
                .map(|i| vec![i as u8; 100 + i])
                .map(|v| v.len())
                .sum::<usize>()
        });
        RECORDING.set(true);
        for size in [12_345usize, 777, 1 << 20] {
            // SAFETY: plain malloc of a nonzero size; freed below.
            mine.push((size, unsafe { libc::malloc(black_box(size)) } as u64));
        }
        RECORDING.set(false);
    });
    for id in ids {
        detach(id).unwrap();
    }
    let sizes = sizes.lock().unwrap().clone();
    let returned = returned.lock().unwrap().clone();
    for &(size, p) in &mine {
        assert_ne!(p, 0);
        // SAFETY: `p` came from malloc above and is freed once.
        unsafe { libc::free(p as *mut libc::c_void) };
        assert!(
            sizes.contains(&(size as u64)),
            "saw malloc({size}) in {sizes:?}"
        );
        assert!(returned.contains(&p), "saw malloc return {p:#x}");
    }
    assert!(
        total.load(Ordering::Relaxed) >= 2000,
        "the other thread's allocations were seen too"
    );
}

// 256 five-byte nops (`nop dword ptr [rax+rax+0]`, spelled out so the assembler cannot
// pick a shorter form) in a row, then `ret`: 256 hookable instructions, each exactly the size of
// the jump, so every one gets its own site and trampoline.
std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl bpftime_attach_test_nops",
    "bpftime_attach_test_nops:",
    ".rept 256",
    ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00",
    ".endr",
    "mov rax, rdi",
    "ret",
);

extern "C" {
    fn bpftime_attach_test_nops(x: u64) -> u64;
}

#[test]
fn hundreds_of_sites_along_one_path_fire_in_order() {
    let start = bpftime_attach_test_nops as *const () as usize;
    let order = Arc::new(Mutex::new(Vec::new()));
    let ids: Vec<_> = (0..256)
        .map(|k| {
            let o = order.clone();
            let h = handler(move |r| o.lock().unwrap().push((r.ip as usize - start) / 5));
            // SAFETY: each address starts one 5-byte nop; nothing branches into them.
            unsafe { attach_uprobe(start + 5 * k, h) }.unwrap()
        })
        .collect();
    // SAFETY: the stub takes and returns one integer.
    assert_eq!(unsafe { bpftime_attach_test_nops(black_box(42)) }, 42);
    assert_eq!(*order.lock().unwrap(), (0..256).collect::<Vec<_>>());
    for id in ids {
        detach(id).unwrap();
    }
    // SAFETY: as above.
    assert_eq!(unsafe { bpftime_attach_test_nops(black_box(7)) }, 7);
    assert_eq!(order.lock().unwrap().len(), 256);
}

// Prologues whose stolen bytes hold relative branches, which must keep their targets when
// copied into the trampoline: a short `jz` (2 bytes, re-encoded as a near one), a `call`
// (its return lands in the trampoline, which jumps back) and a tail `jmp`.
std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl bpftime_attach_test_jz",
    "bpftime_attach_test_jz:",
    "test rdi, rdi",
    "jz 3f",
    "mov eax, 1",
    "ret",
    "3:",
    "mov eax, 2",
    "ret",
    ".p2align 4",
    ".globl bpftime_attach_test_call",
    "bpftime_attach_test_call:",
    "call 4f",
    "add rax, 1",
    "ret",
    "4:",
    "lea rax, [rdi + rdi]",
    "ret",
    ".p2align 4",
    ".globl bpftime_attach_test_tail",
    "bpftime_attach_test_tail:",
    "jmp bpftime_attach_test_call",
    "int3",
    "int3",
    "int3",
);

extern "C" {
    fn bpftime_attach_test_jz(x: u64) -> u64;
    fn bpftime_attach_test_call(x: u64) -> u64;
    fn bpftime_attach_test_tail(x: u64) -> u64;
}

#[test]
fn relative_branches_in_the_prologue_keep_their_targets() {
    type F = unsafe extern "C" fn(u64) -> u64;
    let cases: [(F, [(u64, u64); 2]); 3] = [
        (bpftime_attach_test_jz, [(0, 2), (5, 1)]),
        (bpftime_attach_test_call, [(0, 1), (20, 41)]),
        (bpftime_attach_test_tail, [(3, 7), (100, 201)]),
    ];
    for (f, io) in cases {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (s1, s2) = (seen.clone(), seen.clone());
        let on_entry = handler(move |r| s1.lock().unwrap().push(r.di));
        let on_return = handler(move |r| s2.lock().unwrap().push(r.ax));
        let at = f as *const () as usize;
        // SAFETY: each is a whole function entered by call; nothing jumps into its first
        // 5 bytes.
        let ids = unsafe {
            [
                attach_uprobe(at, on_entry).unwrap(),
                attach_uretprobe(at, on_return).unwrap(),
            ]
        };
        for (x, want) in io {
            // SAFETY: the stubs take and return one integer.
            assert_eq!(unsafe { black_box(f)(x) }, want, "{at:#x}({x})");
        }
        for id in ids {
            detach(id).unwrap();
        }
        let want: Vec<u64> = io.iter().flat_map(|&(x, y)| [x, y]).collect();
        assert_eq!(*seen.lock().unwrap(), want);
    }
}

#[inline(never)]
extern "C" fn pending_inner(x: u64) -> u64 {
    black_box(x) + 1
}

#[inline(never)]
extern "C" fn pending_outer(x: u64) -> u64 {
    black_box(pending_inner as extern "C" fn(u64) -> u64)(x) * 2
}

// Not the same code as the two above, which LLVM would merge into one function (and one
// site, made by the other test).
#[inline(never)]
extern "C" fn primed_inner(x: u64) -> u64 {
    black_box(x).wrapping_add(black_box(1))
}

#[inline(never)]
extern "C" fn primed_outer(x: u64) -> u64 {
    black_box(primed_inner as extern "C" fn(u64) -> u64)(x).wrapping_mul(black_box(2))
}

/// Hooks `outer` (an entry and a return probe) and `inner` (entry and return probes that
/// read `outer`'s return address slot while `outer`'s uretprobe is pending), calls `outer`
/// twice, and answers, per read, the value in the slot, what a stack walk reads instead,
/// and the caller's real return address.
fn pending_return_addresses(
    (outer, inner): (usize, usize),
    site: fn(usize) -> HookAddress,
    call: extern "C" fn(u64) -> u64,
) -> (Vec<(u64, u64, u64)>, u64) {
    // (slot, the caller's return address there) at each entry of outer.
    let outer_slots = Arc::new(Mutex::new(Vec::new()));
    // (value read in the slot, what a stack walk reads instead), inside inner.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let o = outer_slots.clone();
    // SAFETY: at a function entry [sp] is the return address, on the live stack.
    let on_outer = handler(move |r| {
        o.lock()
            .unwrap()
            .push((r.sp, unsafe { *(r.sp as *const u64) }))
    });
    let peek = |slots: &Arc<Mutex<Vec<(u64, u64)>>>, seen: &Arc<Mutex<Vec<(u64, u64)>>>| {
        let (slot, _) = *slots.lock().unwrap().last().unwrap();
        // SAFETY: outer's frame is live below the running inner.
        let value = unsafe { *(slot as *const u64) };
        seen.lock()
            .unwrap()
            .push((value, original_return_address(slot, value)));
    };
    let (o1, s1, o2, s2) = (
        outer_slots.clone(),
        seen.clone(),
        outer_slots.clone(),
        seen.clone(),
    );
    // SAFETY: both are whole functions of this binary, entered by call.
    let ids = unsafe {
        [
            attach_uprobe(site(outer), on_outer).unwrap(),
            attach_uretprobe(outer, handler(|_| {})).unwrap(),
            attach_uprobe(site(inner), handler(move |_| peek(&o1, &s1))).unwrap(),
            // At inner's return, outer's uretprobe is still pending.
            attach_uretprobe(inner, handler(move |_| peek(&o2, &s2))).unwrap(),
        ]
    };
    let call = black_box(call);
    assert_eq!(call(1), 4);
    assert_eq!(call(2), 6);
    for id in ids {
        detach(id).unwrap();
    }
    let outer_slots = outer_slots.lock().unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4);
    let reads = seen
        .iter()
        .enumerate()
        .map(|(i, &(value, resolved))| (value, resolved, outer_slots[i / 2].1))
        .collect();
    (reads, outer_slots[0].0)
}

#[test]
fn a_pending_uretprobes_return_address_is_read_back_for_stack_walks() {
    let (reads, slot) = pending_return_addresses(
        (
            addr(pending_outer as *const ()),
            addr(pending_inner as *const ()),
        ),
        HookAddress::instruction,
        pending_outer,
    );
    for &(value, resolved, real) in &reads {
        assert_ne!(value, real, "the uretprobe replaced the return address");
        // By the return stub, in this binary's text.
        assert!(mapping_at(value as usize)
            .ends_with(&std::env::current_exe().unwrap().display().to_string()));
        assert_eq!(
            resolved, real,
            "a walk reads the caller's real return address"
        );
    }
    // Nothing pending any more: values pass through, and other values always do.
    assert_eq!(original_return_address(slot, reads[0].0), reads[0].0);
    assert_eq!(original_return_address(slot, 0x1234), 0x1234);
}

#[test]
fn a_primed_pending_uretprobes_return_address_is_read_back_for_stack_walks() {
    // Function entries of a process that primes hijacked returns (Intel CPUs by default).
    prime_returns(Some(true));
    let (reads, slot) = pending_return_addresses(
        (
            addr(primed_outer as *const ()),
            addr(primed_inner as *const ()),
        ),
        HookAddress::function_entry,
        primed_outer,
    );
    prime_returns(None);
    for &(value, resolved, real) in &reads {
        assert_ne!(value, real, "the uretprobe replaced the return address");
        // By its site's landing, in the trampoline (an anonymous page), where the function's
        // `ret` goes as the return stack buffer predicts.
        let mapping = mapping_at(value as usize);
        assert!(
            mapping.starts_with("r-xp") && mapping.split_whitespace().count() == 4,
            "{value:#x} in {mapping}"
        );
        assert_eq!(
            resolved, real,
            "a walk reads the caller's real return address"
        );
    }
    assert_eq!(original_return_address(slot, reads[0].0), reads[0].0);
}

#[inline(never)]
extern "C" fn called_first(x: u64) -> u64 {
    black_box(x) + 5
}

// A prologue that calls before 5 bytes are over: the call moves into the trampoline.
std::arch::global_asm!(
    ".text",
    ".globl bpftime_test_calls_in_prologue",
    ".type bpftime_test_calls_in_prologue, @function",
    "bpftime_test_calls_in_prologue:",
    "push rbp",
    "mov rbp, rsp",
    "call {callee}",
    "add rax, 1",
    "pop rbp",
    "ret",
    ".size bpftime_test_calls_in_prologue, . - bpftime_test_calls_in_prologue",
    callee = sym called_first,
);

extern "C" {
    fn bpftime_test_calls_in_prologue(x: u64) -> u64;
}

#[test]
fn a_call_moved_into_the_trampoline_returns_into_the_hooked_function() {
    let f = addr(bpftime_test_calls_in_prologue as *const ());
    let callee = addr(called_first as *const ());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    // SAFETY: at a function entry [sp] is the return address, on the live stack.
    let on_callee = handler(move |r| s.lock().unwrap().push(unsafe { *(r.sp as *const u64) }));
    // SAFETY: both are whole functions of this binary, entered by call.
    let ids = unsafe {
        [
            attach_uprobe(f, handler(|_| {})).unwrap(),
            attach_uprobe(callee, on_callee).unwrap(),
        ]
    };
    // SAFETY: the assembly above is a plain SysV function of one integer argument.
    let got = unsafe { bpftime_test_calls_in_prologue(black_box(10)) };
    for id in ids {
        detach(id).unwrap();
    }
    assert_eq!(got, 16);
    // push rbp (1 byte), mov rbp, rsp (3), call (5): the kernel, and an unhooked run, see
    // the return address right after the call, in the hooked function.
    assert_eq!(*seen.lock().unwrap(), vec![f as u64 + 9]);
}

#[inline(never)]
extern "C" fn reentered(x: u64) -> u64 {
    black_box(x).wrapping_mul(3) ^ 0x5a
}

#[test]
fn a_handler_that_calls_its_hooked_function_again_and_again_is_never_nested() {
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    let h = handler(move |_| {
        r.fetch_add(1, Ordering::SeqCst);
        // Each of these hits the hook again on this thread: none may run a handler, the
        // second no more than the first.
        for i in 0..3 {
            black_box(reentered(black_box(i)));
        }
    });
    // SAFETY: `reentered` is a function of this binary.
    let id = unsafe { attach_uprobe(addr(reentered as *const ()), h) }.unwrap();
    for i in 0..10 {
        assert_eq!(reentered(black_box(i)), i.wrapping_mul(3) ^ 0x5a);
    }
    detach(id).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 10);
}

#[test]
fn a_thread_that_never_runs_handlers_is_not_observed() {
    let runs = Arc::new(AtomicU64::new(0));
    let r = runs.clone();
    // SAFETY: `masked_target` is a function of this binary.
    let id = unsafe {
        attach_uprobe(
            addr(masked_target as *const ()),
            handler(move |_| {
                r.fetch_add(1, Ordering::SeqCst);
            }),
        )
    }
    .unwrap();
    std::thread::spawn(|| {
        bpftime_attach::never_run_handlers_on_this_thread();
        for i in 0..5 {
            black_box(masked_target(black_box(i)));
        }
    })
    .join()
    .unwrap();
    for i in 0..4 {
        black_box(masked_target(black_box(i)));
    }
    detach(id).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

#[inline(never)]
extern "C" fn masked_target(x: u64) -> u64 {
    black_box(x).rotate_left(5)
}

#[inline(never)]
extern "C" fn code_hooked(x: u64) -> u64 {
    black_box(x).wrapping_add(41)
}

/// A code handler: adds the first argument register to the counter `arg` points at.
unsafe extern "C" fn add_first_argument(regs: *mut PtRegs, arg: u64, zero: u64) -> u64 {
    assert_eq!(zero, 0);
    // SAFETY: `regs` is the hook's live PtRegs; `arg` is the AtomicU64 the test owns.
    unsafe { (*(arg as *const AtomicU64)).fetch_add((*regs).di, Ordering::SeqCst) };
    0
}

/// A code handler: adds the return value register to the counter `arg` points at.
unsafe extern "C" fn add_return_value(regs: *mut PtRegs, arg: u64, _: u64) -> u64 {
    // SAFETY: as `add_first_argument`.
    unsafe { (*(arg as *const AtomicU64)).fetch_add((*regs).ax, Ordering::SeqCst) };
    0
}

#[test]
fn code_handlers_run_straight_from_the_hook_with_their_argument() {
    let args = Arc::new(AtomicU64::new(0));
    let rets = Arc::new(AtomicU64::new(0));
    let f = addr(code_hooked as *const ());
    let code = |entry, counter: &Arc<AtomicU64>| bpftime_attach::CodeHandler {
        entry,
        arg: Arc::as_ptr(counter) as u64,
        owner: counter.clone(),
        keeps_vector_registers: false,
        regs_read: u64::MAX,
    };
    // SAFETY: `code_hooked` is a function of this binary; the handlers do not unwind.
    let on_entry =
        unsafe { bpftime_attach::attach_uprobe_code(f, code(add_first_argument, &args)) }.unwrap();
    // SAFETY: as above.
    let on_return =
        unsafe { bpftime_attach::attach_uretprobe_code(f, code(add_return_value, &rets)) }.unwrap();
    for i in 1..=10 {
        assert_eq!(code_hooked(black_box(i)), i + 41);
    }
    detach(on_entry).unwrap();
    detach(on_return).unwrap();
    assert_eq!(args.load(Ordering::SeqCst), 55);
    assert_eq!(rets.load(Ordering::SeqCst), 55 + 410);
    code_hooked(black_box(5));
    assert_eq!(args.load(Ordering::SeqCst), 55, "detached");
}

// A one-byte instruction right before a loop head: the 5-byte jump would overwrite the
// head, which the loop's branch reaches sideways, so only a breakpoint may go at +2.
std::arch::global_asm!(
    ".globl bpftime_test_loop_sum",
    ".type bpftime_test_loop_sum, @function",
    "bpftime_test_loop_sum:",
    "  xor eax, eax",
    "  nop",
    "2: add rax, rdi",
    "  dec rdi",
    "  jnz 2b",
    "  ret",
    ".size bpftime_test_loop_sum, .-bpftime_test_loop_sum",
);
extern "C" {
    fn bpftime_test_loop_sum(n: u64) -> u64;
}

#[test]
fn breakpoints_count_every_hit_from_many_threads_with_the_registers_of_the_site() {
    let f = addr(bpftime_test_loop_sum as *const ());
    let (nop, head_at) = (f + 2, f + 3);
    let original = head(f);
    let at_nop = Arc::new(AtomicU64::new(0));
    let at_head = Arc::new(AtomicU64::new(0));
    let rdi_sum = Arc::new(AtomicU64::new(0));
    let (n, hh, rs) = (at_nop.clone(), at_head.clone(), rdi_sum.clone());
    let bad = Arc::new(AtomicBool::new(false));
    let (b1, b2) = (bad.clone(), bad.clone());
    // SAFETY: +2 is the `nop`, an instruction start; a breakpoint there replaces it alone.
    let id_nop = unsafe {
        attach_uprobe(
            bpftime_attach::HookAddress::breakpoint(nop),
            handler(move |r| {
                // At the nop, rax was just zeroed and rip is the nop's address.
                if r.ax != 0 || r.ip != nop as u64 {
                    b1.store(true, Ordering::Relaxed);
                }
                n.fetch_add(1, Ordering::Relaxed);
            }),
        )
    }
    .unwrap();
    // SAFETY: +3 is the loop head, an instruction start, probed with a breakpoint too (the
    // jump would also be safe here, but this exercises two breakpoints in a row).
    let id_head = unsafe {
        attach_uprobe(
            bpftime_attach::HookAddress::breakpoint(head_at),
            handler(move |r| {
                if r.ip != head_at as u64 {
                    b2.store(true, Ordering::Relaxed);
                }
                hh.fetch_add(1, Ordering::Relaxed);
                rs.fetch_add(r.di, Ordering::Relaxed);
            }),
        )
    }
    .unwrap();
    let patched = head(f);
    assert_eq!(
        &patched[..2],
        &original[..2],
        "the bytes before the sites are untouched"
    );
    assert_eq!(
        &patched[2..4],
        &[0xcc, 0xcc],
        "one int3 per site, nothing more"
    );
    assert_eq!(patched[4], original[4]);
    assert_eq!(perms_at(f), "r-xp", "patched code never becomes writable");
    std::thread::scope(|s| {
        for t in 0..4u64 {
            s.spawn(move || {
                for i in 0..5000u64 {
                    let k = (t + i) % 9 + 1;
                    // SAFETY: plain assembly taking and returning an integer (k >= 1).
                    assert_eq!(
                        unsafe { bpftime_test_loop_sum(black_box(k)) },
                        k * (k + 1) / 2
                    );
                }
            });
        }
    });
    let calls = 20_000u64;
    let iterations: u64 = (0..4u64)
        .flat_map(|t| (0..5000u64).map(move |i| (t + i) % 9 + 1))
        .sum();
    let rdi: u64 = (0..4u64)
        .flat_map(|t| (0..5000u64).map(move |i| (t + i) % 9 + 1))
        .map(|k| k * (k + 1) / 2)
        .sum();
    assert_eq!(at_nop.load(Ordering::Relaxed), calls);
    assert_eq!(at_head.load(Ordering::Relaxed), iterations);
    assert_eq!(rdi_sum.load(Ordering::Relaxed), rdi);
    assert!(
        !bad.load(Ordering::Relaxed),
        "a handler saw the wrong registers"
    );
    detach(id_nop).unwrap();
    detach(id_head).unwrap();
    assert_eq!(head(f), original, "the original bytes are back");
    // SAFETY: as above.
    assert_eq!(unsafe { bpftime_test_loop_sum(4) }, 10);
    assert_eq!(at_nop.load(Ordering::Relaxed), calls);
}

// A function shorter than the jump, with the next function right after it: no padding
// for the jump to spill into.
std::arch::global_asm!(
    ".globl bpftime_test_tiny",
    ".type bpftime_test_tiny, @function",
    "bpftime_test_tiny:",
    "  lea eax, [rdi + 1]",
    "  ret",
    ".size bpftime_test_tiny, .-bpftime_test_tiny",
    ".globl bpftime_test_after_tiny",
    ".type bpftime_test_after_tiny, @function",
    "bpftime_test_after_tiny:",
    "  lea eax, [rdi + rdi]",
    "  ret",
    ".size bpftime_test_after_tiny, .-bpftime_test_after_tiny",
);
extern "C" {
    fn bpftime_test_tiny(x: u32) -> u32;
    fn bpftime_test_after_tiny(x: u32) -> u32;
}

#[test]
fn a_function_shorter_than_the_jump_is_hooked_with_a_breakpoint() {
    let f = addr(bpftime_test_tiny as *const ());
    let next = addr(bpftime_test_after_tiny as *const ());
    assert_eq!(
        next - f,
        4,
        "the assembler laid the two functions back to back"
    );
    let next_bytes = head(next);
    let (calls, returns, sum) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let (c, r, s) = (calls.clone(), returns.clone(), sum.clone());
    // SAFETY: both are function entries of this binary, which stays mapped; the return
    // probe goes in first, as the uprobe's site would otherwise have decided the patch.
    let (ret_id, entry_id) = unsafe {
        (
            attach_uretprobe(
                f,
                handler(move |regs| {
                    r.fetch_add(1, Ordering::Relaxed);
                    s.fetch_add(regs.ax, Ordering::Relaxed);
                }),
            )
            .unwrap(),
            attach_uprobe(
                bpftime_attach::HookAddress::function_entry(f),
                handler(move |_| {
                    c.fetch_add(1, Ordering::Relaxed);
                }),
            )
            .unwrap(),
        )
    };
    assert_eq!(head(f)[0], 0xcc, "one int3 at the entry");
    assert_eq!(head(next), next_bytes, "the next function is untouched");
    let (threads, per) = (4u64, 20_000u64);
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for i in 0..per {
                    let x = (t * per + i) as u32;
                    // SAFETY: plain functions of this binary.
                    let (a, b) =
                        unsafe { (bpftime_test_tiny(black_box(x)), bpftime_test_after_tiny(x)) };
                    assert_eq!((a, b), (x + 1, 2 * x));
                }
            });
        }
    });
    let n = threads * per;
    assert_eq!(calls.load(Ordering::Relaxed), n);
    assert_eq!(returns.load(Ordering::Relaxed), n);
    // Every return value x + 1 for x in 0..n.
    assert_eq!(sum.load(Ordering::Relaxed), n * (n + 1) / 2);
    detach(entry_id).unwrap();
    detach(ret_id).unwrap();
    assert_eq!(
        head(f)[..4],
        [0x8d, 0x47, 0x01, 0xc3],
        "the original code is back"
    );
}
