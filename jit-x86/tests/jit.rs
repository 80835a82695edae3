//! End-to-end tests of the x86-64 JIT: hand-written programs per instruction group, calls
//! of every kind and the compile cache. The bpf_conformance suite runs on the JIT through
//! the conformance crate's engine trait (`cargo test -p bpftime-conformance`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use bpftime_isa::asm::assemble;
use bpftime_isa::opcode as op;
use bpftime_isa::uapi::helper::TAIL_CALL;
use bpftime_isa::Insn;
use bpftime_jit_x86::{
    lifted_ir, ArrayMapLayout, JitCache, JitEnv, JitError, JitOptions, JitProgram,
};
use bpftime_lifter::LiftError;

extern "C" fn helper_sum(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
    a.wrapping_add(b.wrapping_mul(10))
        .wrapping_add(c.wrapping_mul(100))
        .wrapping_add(d.wrapping_mul(1000))
        .wrapping_add(e.wrapping_mul(10000))
}

extern "C" fn helper_const(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    0x1234
}

fn addr(f: extern "C" fn(u64, u64, u64, u64, u64) -> u64) -> u64 {
    f as *const () as u64
}

fn helpers(id: u32) -> Option<u64> {
    match id {
        1 => Some(addr(helper_sum)),
        5 => Some(addr(helper_const)),
        _ => None,
    }
}

fn asm(src: &str) -> Vec<Insn> {
    assemble(src).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

fn run_with(src: &str, mem: &mut [u8], opts: &JitOptions) -> u64 {
    let prog = JitProgram::compile(&asm(src), &helpers, opts).expect("compiles");
    // SAFETY: the test programs only touch `mem` and their own stack.
    unsafe { prog.call(mem.as_mut_ptr() as u64, mem.len() as u64) }
}

/// The default's IR passes with `O1` code generation for every program: what loops get
/// by default, applied to loop-free programs too.
fn o1_codegen_throughout() -> JitOptions {
    JitOptions {
        loop_free_codegen_level: None,
        ..JitOptions::default()
    }
}

/// Runs with the default options, with `O1` code generation throughout, at O2 and with no
/// optimization at all: all must agree.
fn run_mem(src: &str, mem: &[u8]) -> u64 {
    let r = run_with(src, &mut mem.to_vec(), &JitOptions::default());
    for opts in [
        o1_codegen_throughout(),
        JitOptions::optimized(),
        JitOptions::fastest(),
    ] {
        assert_eq!(
            r,
            run_with(src, &mut mem.to_vec(), &opts),
            "{opts:?} disagrees on\n{src}"
        );
    }
    r
}

fn run(src: &str) -> u64 {
    run_mem(src, &[])
}

#[test]
fn alu64_arithmetic_and_bitwise() {
    assert_eq!(
        run("mov %r0, 7\nadd %r0, 5\nmul %r0, 3\nsub %r0, 1\nexit"),
        35
    );
    assert_eq!(
        run("mov %r0, -1\nmov %r1, 0xf0\nand %r0, %r1\nor %r0, 1\nxor %r0, 0xff\nexit"),
        0x0e
    );
    assert_eq!(run("mov %r0, 5\nneg %r0\nexit"), (-5i64) as u64);
    // 64-bit shifts mask their amount to 6 bits.
    assert_eq!(run("mov %r0, 1\nmov %r1, 65\nlsh %r0, %r1\nexit"), 2);
    assert_eq!(run("mov %r0, -16\narsh %r0, 2\nexit"), (-4i64) as u64);
    assert_eq!(run("mov %r0, -16\nrsh %r0, 60\nexit"), 0xf);
}

#[test]
fn alu32_zero_extends_and_masks() {
    assert_eq!(run("lddw %r0, 0x1ffffffff\nadd32 %r0, 1\nexit"), 0);
    assert_eq!(run("mov %r0, -1\nmov32 %r0, %r0\nexit"), 0xffff_ffff);
    assert_eq!(run("mov32 %r0, 1\nmov32 %r1, 33\nlsh32 %r0, %r1\nexit"), 2);
    assert_eq!(run("mov32 %r0, -8\narsh32 %r0, 1\nexit"), 0xffff_fffc);
    assert_eq!(run("mov32 %r0, 3\nneg32 %r0\nexit"), 0xffff_fffd);
}

#[test]
fn division_edge_cases_follow_the_isa() {
    // Division by zero yields 0, modulo by zero leaves dst (zero-extended in 32-bit).
    assert_eq!(run("mov %r0, 9\nmov %r1, 0\ndiv %r0, %r1\nexit"), 0);
    assert_eq!(run("mov %r0, 9\nmov %r1, 0\nmod %r0, %r1\nexit"), 9);
    assert_eq!(
        run("mov %r0, -1\nmov %r1, 0\nmod32 %r0, %r1\nexit"),
        0xffff_ffff
    );
    assert_eq!(run("mov %r0, 9\nmov %r1, 0\nsdiv %r0, %r1\nexit"), 0);
    assert_eq!(
        run("mov %r0, -9\nmov %r1, 0\nsmod %r0, %r1\nexit"),
        (-9i64) as u64
    );
    // INT_MIN / -1 wraps and INT_MIN % -1 is 0, without trapping.
    let min = "lddw %r0, 0x8000000000000000\nmov %r1, -1\n";
    assert_eq!(
        run(&format!("{min}sdiv %r0, %r1\nexit")),
        0x8000_0000_0000_0000
    );
    assert_eq!(run(&format!("{min}smod %r0, %r1\nexit")), 0);
    assert_eq!(
        run("mov32 %r0, 0x80000000\nsdiv32 %r0, -1\nexit"),
        0x8000_0000
    );
    assert_eq!(run("mov32 %r0, 0x80000000\nsmod32 %r0, -1\nexit"), 0);
    assert_eq!(run("mov %r0, -7\nsdiv %r0, 2\nexit"), (-3i64) as u64);
    assert_eq!(run("mov %r0, -7\nsmod %r0, 2\nexit"), (-1i64) as u64);
    assert_eq!(run("mov %r0, -7\ndiv %r0, 2\nexit"), (-7i64 as u64) / 2);
}

#[test]
fn sign_extending_moves() {
    assert_eq!(
        run("mov %r1, 0x180\nmovsx864 %r0, %r1\nexit"),
        (-128i64) as u64
    );
    assert_eq!(
        run("mov %r1, 0x18000\nmovsx1664 %r0, %r1\nexit"),
        (-32768i64) as u64
    );
    assert_eq!(
        run("lddw %r1, 0x180000000\nmovsx3264 %r0, %r1\nexit"),
        0xffff_ffff_8000_0000
    );
    assert_eq!(run("mov %r1, 0x80\nmovsx832 %r0, %r1\nexit"), 0xffff_ff80);
}

#[test]
fn byte_swaps() {
    let v = "lddw %r0, 0x1122334455667788\n";
    assert_eq!(run(&format!("{v}be16 %r0\nexit")), 0x8877);
    assert_eq!(run(&format!("{v}be32 %r0\nexit")), 0x8877_6655);
    assert_eq!(run(&format!("{v}be64 %r0\nexit")), 0x8877_6655_4433_2211);
    assert_eq!(run(&format!("{v}le16 %r0\nexit")), 0x7788);
    assert_eq!(run(&format!("{v}le32 %r0\nexit")), 0x5566_7788);
    assert_eq!(run(&format!("{v}le64 %r0\nexit")), 0x1122_3344_5566_7788);
    assert_eq!(run(&format!("{v}bswap16 %r0\nexit")), 0x8877);
    assert_eq!(run(&format!("{v}bswap64 %r0\nexit")), 0x8877_6655_4433_2211);
}

#[test]
fn jumps_signed_unsigned_and_32_bit() {
    let prog = |cond: &str| {
        format!("mov %r0, 1\nmov %r1, -1\nmov %r2, 1\n{cond}\nmov %r0, 0\nexit\ntaken:\nexit")
    };
    assert_eq!(run(&prog("jgt %r1, %r2, taken")), 1, "unsigned -1 > 1");
    assert_eq!(run(&prog("jsgt %r1, %r2, taken")), 0, "signed -1 > 1");
    assert_eq!(run(&prog("jslt %r1, 0, taken")), 1);
    assert_eq!(run(&prog("jset %r2, 3, taken")), 1);
    assert_eq!(run(&prog("jne %r2, 1, taken")), 0);
    // JMP32 compares only the low halves.
    let p32 = "lddw %r1, 0x100000005\nmov %r0, 1\njeq32 %r1, 5, taken\nmov %r0, 0\ntaken:\nexit";
    assert_eq!(run(p32), 1);
    let p64 = "lddw %r1, 0x100000005\nmov %r0, 1\njeq %r1, 5, taken\nmov %r0, 0\ntaken:\nexit";
    assert_eq!(run(p64), 0);
    // A backward loop: sum 1..=10.
    let sum = "mov %r0, 0\nmov %r1, 10\nloop:\nadd %r0, %r1\nsub %r1, 1\njne %r1, 0, loop\nexit";
    assert_eq!(run(sum), 55);
    // gotol carries its offset in imm.
    assert_eq!(run("mov %r0, 3\nja32 end\nmov %r0, 4\nend:\nexit"), 3);
}

#[test]
fn loads_stores_and_sign_extending_loads() {
    let mem = [0x80u8, 0xff, 0x01, 0x02, 0x03, 0x04, 0x05, 0x86];
    assert_eq!(run_mem("ldxb %r0, [%r1]\nexit", &mem), 0x80);
    assert_eq!(run_mem("ldxh %r0, [%r1+1]\nexit", &mem), 0x01ff);
    assert_eq!(run_mem("ldxw %r0, [%r1+4]\nexit", &mem), 0x8605_0403);
    assert_eq!(
        run_mem("ldxdw %r0, [%r1]\nexit", &mem),
        0x8605_0403_0201_ff80
    );
    assert_eq!(run_mem("ldxsb %r0, [%r1]\nexit", &mem), (-128i64) as u64);
    assert_eq!(
        run_mem("ldxsh %r0, [%r1]\nexit", &mem),
        0xffff_ffff_ffff_ff80
    );
    assert_eq!(
        run_mem("ldxsw %r0, [%r1+4]\nexit", &mem),
        0xffff_ffff_8605_0403
    );
    // Stores through the frame pointer and through a copy of it: byte 0 gets the
    // frame pointer's low byte, bytes 2-3 a halfword.
    let stack = "
        stdw [%r10-8], 0x11
        mov %r2, %r10
        stxb [%r2-8], %r2
        sth [%r10-6], 0x2233
        ldxb %r4, [%r10-8]
        and %r2, 0xff
        mov %r0, -1
        jne %r4, %r2, out
        ldxdw %r0, [%r10-8]
        and %r0, -256
    out:
        exit";
    assert_eq!(run(stack), 0x2233_0000);
    let s = "stw [%r1], 0x55667788\nstxh [%r1+4], %r2\nldxdw %r0, [%r1]\nexit";
    let mut buf = [0u8; 8];
    let r = run_with(s, &mut buf, &JitOptions::default());
    assert_eq!(r, 0x0000_0008_5566_7788, "r2 is the buffer length");
}

#[test]
fn atomics() {
    let mut mem = 10u64.to_le_bytes().to_vec();
    mem.extend_from_slice(&[0; 8]);
    assert_eq!(
        run_mem(
            "mov %r2, 5\nlock add [%r1], %r2\nldxdw %r0, [%r1]\nexit",
            &mem
        ),
        15
    );
    assert_eq!(
        run_mem(
            "mov %r2, 5\nlock fetch add [%r1], %r2\nmov %r0, %r2\nexit",
            &mem
        ),
        10
    );
    assert_eq!(
        run_mem(
            "mov %r2, 6\nlock or [%r1], %r2\nldxdw %r0, [%r1]\nexit",
            &mem
        ),
        14
    );
    assert_eq!(
        run_mem(
            "mov %r2, 6\nlock and [%r1], %r2\nldxdw %r0, [%r1]\nexit",
            &mem
        ),
        2
    );
    assert_eq!(
        run_mem(
            "mov %r2, 6\nlock xor [%r1], %r2\nldxdw %r0, [%r1]\nexit",
            &mem
        ),
        12
    );
    assert_eq!(
        run_mem(
            "mov %r2, 3\nlock fetch xor [%r1], %r2\nldxdw %r0, [%r1]\nadd %r0, %r2\nexit",
            &mem
        ),
        9 + 10
    );
    assert_eq!(
        run_mem(
            "mov %r2, 7\nlock xchg [%r1], %r2\nldxdw %r0, [%r1]\nlsh %r0, 8\nor %r0, %r2\nexit",
            &mem
        ),
        0x70a
    );
    // cmpxchg: r0 gets the old value; the store happens only on a match.
    assert_eq!(run_mem("mov %r0, 10\nmov %r2, 99\nlock cmpxchg [%r1], %r2\nldxdw %r1, [%r1]\nlsh %r1, 8\nor %r0, %r1\nexit", &mem), 99 << 8 | 10);
    assert_eq!(run_mem("mov %r0, 11\nmov %r2, 99\nlock cmpxchg [%r1], %r2\nldxdw %r1, [%r1]\nlsh %r1, 8\nor %r0, %r1\nexit", &mem), 10 << 8 | 10);
    // 32-bit forms touch four bytes and zero-extend what they fetch.
    assert_eq!(run_mem("lddw %r2, 0xffffffff00000001\nlock fetch add32 [%r1], %r2\nldxdw %r0, [%r1]\nlsh %r0, 32\nor %r0, %r2\nexit", &mem), 11 << 32 | 10);
}

#[test]
fn helper_calls_pass_five_arguments() {
    let p = "mov %r1, 1\nmov %r2, 2\nmov %r3, 3\nmov %r4, 4\nmov %r5, 5\ncall 1\nexit";
    assert_eq!(run(p), 54321);
    // callx dispatches on a helper id held in a register.
    assert_eq!(run("mov %r2, 5\ncall %r2\nexit"), 0x1234);
}

#[test]
fn unknown_helper_is_a_compile_error_naming_id_and_pc() {
    let err = JitProgram::compile(
        &asm("mov %r0, 0\ncall 77\nexit"),
        &helpers,
        &JitOptions::default(),
    )
    .expect_err("helper 77 does not exist");
    assert!(
        matches!(
            err,
            JitError::Lift {
                source: LiftError::UnknownHelper { pc: 1, id: 77 }
            }
        ),
        "{err:?}"
    );
}

#[test]
fn bpf_to_bpf_calls_get_their_own_stack_and_preserve_callee_saved() {
    let p = "
        mov %r6, 100
        stdw [%r10-8], 7
        mov %r1, 2
        mov %r2, 3
        call local square_sum
        ldxdw %r1, [%r10-8]
        add %r0, %r1
        add %r0, %r6
        exit
    square_sum:
        stdw [%r10-8], 1000
        mov %r6, %r1
        mul %r6, %r1
        mov %r0, %r2
        mul %r0, %r2
        add %r0, %r6
        mov %r1, %r0
        call local twice
        exit
    twice:
        mov %r0, %r1
        add %r0, %r1
        exit";
    // (2*2 + 3*3) * 2 + 7 + 100
    assert_eq!(run(p), 133);
}

#[test]
fn recursive_subprogram() {
    let p = "mov %r1, 10\ncall local fact\nexit\nfact:\nmov %r0, 1\njeq %r1, 0, done\nmov %r6, %r1\nsub %r1, 1\ncall local fact\nmul %r0, %r6\ndone:\nexit";
    assert_eq!(run(p), 3_628_800);
}

static TAIL_TARGET: AtomicU64 = AtomicU64::new(0);

/// A one-slot program array: index 0 resolves to `TAIL_TARGET`, anything else is empty.
extern "C" fn resolver(_ctx: u64, _map: u64, index: u64, _: u64, _: u64) -> u64 {
    if index == 0 {
        TAIL_TARGET.load(Ordering::SeqCst)
    } else {
        0
    }
}

fn tail_helpers(id: u32) -> Option<u64> {
    if id == TAIL_CALL {
        Some(addr(resolver))
    } else {
        helpers(id)
    }
}

#[test]
fn tail_calls_replace_the_program_and_stop_at_33() {
    let opts = JitOptions::default();
    // The target reads the context and returns ctx + 1000.
    let target = JitProgram::compile(
        &asm("mov %r0, %r1\nadd %r0, 1000\nexit"),
        &tail_helpers,
        &opts,
    )
    .unwrap();
    TAIL_TARGET.store(target.entry_address(), Ordering::SeqCst);
    let caller = JitProgram::compile(
        &asm("mov %r6, %r1\nmov %r2, 0\nmov %r3, 0\ncall 12\nmov %r0, 5\nexit"),
        &tail_helpers,
        &opts,
    )
    .unwrap();
    // SAFETY: neither program touches memory.
    assert_eq!(unsafe { caller.call(7, 0) }, 1007);
    let empty_slot = JitProgram::compile(
        &asm("mov %r2, 0\nmov %r3, 1\ncall 12\nexit"),
        &tail_helpers,
        &opts,
    )
    .unwrap();
    // SAFETY: as above.
    assert_eq!(
        unsafe { empty_slot.call(7, 0) },
        (-2i64) as u64,
        "failed tail call falls through"
    );

    // A program tail-calling itself: each run adds 1 to a counter in memory; the chain
    // ends after the kernel's 33 tail calls, so it runs 34 times.
    let looping = JitProgram::compile(
        &asm("ldxdw %r2, [%r1]\nadd %r2, 1\nstxdw [%r1], %r2\nmov %r2, 0\nmov %r3, 0\ncall 12\nldxdw %r0, [%r1]\nexit"),
        &tail_helpers,
        &opts,
    )
    .unwrap();
    TAIL_TARGET.store(looping.entry_address(), Ordering::SeqCst);
    let mut counter = 0u64;
    // SAFETY: the program only touches `counter`.
    let r = unsafe { looping.call(&mut counter as *mut u64 as u64, 8) };
    assert_eq!((r, counter), (34, 34));
}

#[test]
fn cache_shares_code_for_identical_bytecode_and_helpers() {
    let cache = JitCache::new();
    let opts = JitOptions::default();
    let p = asm("mov %r1, 1\ncall 1\nexit");
    let a = cache.get_or_compile(&p, &helpers, &opts).unwrap();
    let b = cache.get_or_compile(&p, &helpers, &opts).unwrap();
    assert_eq!(a.entry_address(), b.entry_address());
    // Another address for helper 1 is another program.
    let other = |id: u32| {
        if id == 1 {
            Some(addr(helper_const))
        } else {
            None
        }
    };
    let c = cache.get_or_compile(&p, &other, &opts).unwrap();
    assert_ne!(a.entry_address(), c.entry_address());
    assert_eq!(cache.len(), 2);
    // SAFETY: no memory access.
    assert_eq!(unsafe { c.call(0, 0) }, 0x1234);
}

#[test]
fn programs_are_send_and_sync_and_run_on_many_threads() {
    fn check<T: Send + Sync>() {}
    check::<JitProgram>();
    check::<JitCache>();
    let prog = JitProgram::compile(
        &asm("mov %r0, %r1\nmul %r0, %r1\nexit"),
        &helpers,
        &JitOptions::default(),
    )
    .unwrap();
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let prog = prog.clone();
            // SAFETY: no memory access.
            std::thread::spawn(move || {
                (0..1000).all(|i| unsafe { prog.call(t * i, 0) } == t * i * t * i)
            })
        })
        .collect();
    assert!(handles.into_iter().all(|h| h.join().unwrap()));
}

/// JIT memory is never writable and executable at once: after loading it is r-x.
#[test]
fn jit_code_is_mapped_read_execute_only() {
    let prog =
        JitProgram::compile(&asm("mov %r0, 1\nexit"), &helpers, &JitOptions::default()).unwrap();
    let entry = prog.entry_address();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let perms = maps
        .lines()
        .find_map(|l| {
            let mut it = l.split_whitespace();
            let (range, perms) = (it.next()?, it.next()?);
            let (lo, hi) = range.split_once('-')?;
            let (lo, hi) = (
                u64::from_str_radix(lo, 16).ok()?,
                u64::from_str_radix(hi, 16).ok()?,
            );
            (lo..hi).contains(&entry).then(|| perms.to_owned())
        })
        .expect("entry lies in a mapping");
    assert_eq!(perms, "r-xp");
}

/// The optimized IR of a fixed program is a golden file; `BPFTIME_BLESS=1` rewrites it, so
/// a change in what the lifter emits shows up as a reviewed diff.
#[test]
fn lifted_ir_matches_golden_file() {
    let prog = asm("
        mov %r6, %r1
        stdw [%r10-8], 0
        ldxw %r1, [%r6+4]
        stxw [%r10-8], %r1
        mov %r2, %r10
        add %r2, -8
        call 1
        jeq %r0, 0, miss
        ldxdw %r0, [%r0]
        exit
    miss:
        mov %r0, 0
        exit");
    // A fixed fake address keeps the text stable across runs.
    let fake_helpers = |id: u32| (id == 1).then_some(0x1000);
    let ir = lifted_ir(&prog, &fake_helpers, &JitOptions::optimized()).unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/lookup.ll");
    bpftime_golden::assert_golden(&path, &ir);
}

static ARRAY: [u64; 4] = [10, 11, 12, 13];
static SLOW_PATH_VALUE: u64 = 99;

/// A `bpf_map_lookup_elem` that ignores its arguments, so a result from it is telling.
extern "C" fn slow_lookup(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    &SLOW_PATH_VALUE as *const u64 as u64
}

struct ArrayEnv {
    inline: bool,
}

impl JitEnv for ArrayEnv {
    fn helper(&self, id: u32) -> Option<u64> {
        (id == 1).then(|| addr(slow_lookup))
    }

    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        (self.inline && map == 0xabc).then_some(ArrayMapLayout {
            values: ARRAY.as_ptr() as u64,
            key_stride: 8,
            max_entries: 4,
            update_size: 8,
            per_cpu: None,
        })
    }
}

#[test]
fn array_map_lookups_inline_when_the_target_knows_the_layout() {
    let p = asm("
        stxw [%r10-4], %r1
        lddw %r1, 0xabc
        mov %r2, %r10
        add %r2, -4
        call 1
        mov %r1, 1000
        jeq %r0, 0, out
        ldxdw %r1, [%r0]
    out:
        mov %r0, %r1
        exit");
    for opts in [
        JitOptions::default(),
        JitOptions::optimized(),
        JitOptions::fastest(),
    ] {
        let inlined = JitProgram::compile_with(&p, &ArrayEnv { inline: true }, &opts).unwrap();
        let called = JitProgram::compile_with(&p, &ArrayEnv { inline: false }, &opts).unwrap();
        // SAFETY: the programs read only their stack and the static arrays.
        unsafe {
            assert_eq!(inlined.call(2, 0), 12);
            assert_eq!(inlined.call(4, 0), 1000, "out of range is NULL");
            assert_eq!(inlined.call(u64::MAX, 0), 1000);
            assert_eq!(called.call(2, 0), 99);
        }
    }
}

thread_local! {
    /// Stands in for the rseq area's `cpu_id`: the per-CPU tests say which CPU the thread
    /// is on by writing it here, and tell the JIT where it lives.
    static FAKE_CPU: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// `FAKE_CPU`'s offset from the FS segment base on this thread (the thread pointer is
/// the first word at FS on x86-64 Linux).
fn fake_cpu_offset() -> u64 {
    let tp: u64;
    // SAFETY: reads the thread control block's self pointer, always present.
    unsafe { std::arch::asm!("mov {}, fs:[0]", out(reg) tp, options(nostack, readonly)) };
    FAKE_CPU.with(|c| c.as_ptr() as u64).wrapping_sub(tp)
}

/// Two keys, each with 3 per-CPU copies of 16 bytes: key k, cpu c at (k * 3 + c) * 2 words.
static mut PER_CPU: [u64; 12] = [0; 12];
static mut UPDATED: [u64; 4] = [0; 4];
static SLOW_UPDATES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A `bpf_map_update_elem` that only counts, so a call to it is visible.
extern "C" fn slow_update(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    SLOW_UPDATES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    7
}

/// r0 = address of this CPU's copy of key r1 in map 0xabc, or 1000 when NULL.
const PER_CPU_LOOKUP: &str = "
    stxw [%r10-4], %r1
    lddw %r1, 0xabc
    mov %r2, %r10
    add %r2, -4
    call 1
    jne %r0, 0, found
    mov %r0, 1000
found:
    exit";

struct PerCpuEnv {
    cpu_offset: u64,
    /// Helpers 1 (lookup) and 5 change every vector register.
    clobbering: bool,
}

impl PerCpuEnv {
    fn new(clobbering: bool) -> PerCpuEnv {
        PerCpuEnv {
            cpu_offset: fake_cpu_offset(),
            clobbering,
        }
    }
}

impl JitEnv for PerCpuEnv {
    fn helper(&self, id: u32) -> Option<u64> {
        match id {
            1 | 5 if self.clobbering => Some(addr(clobbering_lookup)),
            1 => Some(addr(slow_lookup)),
            2 => Some(addr(slow_update)),
            _ => None,
        }
    }

    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        match map {
            0xabc => Some(ArrayMapLayout {
                values: std::ptr::addr_of!(PER_CPU) as u64,
                key_stride: 48,
                max_entries: 2,
                update_size: 16,
                per_cpu: Some(bpftime_jit_x86::PerCpuCopies {
                    cpus: 3,
                    stride: 16,
                }),
            }),
            0xdef => Some(ArrayMapLayout {
                values: std::ptr::addr_of!(UPDATED) as u64,
                key_stride: 16,
                max_entries: 2,
                update_size: 12,
                per_cpu: None,
            }),
            _ => None,
        }
    }

    fn cpu_number_offset(&self) -> Option<u64> {
        Some(self.cpu_offset)
    }
}

#[test]
fn per_cpu_lookups_inline_to_the_running_cpus_copy() {
    let p = asm(PER_CPU_LOOKUP);
    let env = PerCpuEnv::new(false);
    let base = std::ptr::addr_of!(PER_CPU) as u64;
    for opts in [JitOptions::default(), JitOptions::optimized()] {
        let prog = JitProgram::compile_with(&p, &env, &opts).unwrap();
        for (cpu, key, want) in [
            (0, 0, base),
            (2, 0, base + 32),
            (1, 1, base + 48 + 16),
            (2, 1, base + 48 + 32),
            (1, 2, 1000),
        ] {
            FAKE_CPU.with(|c| c.set(cpu));
            // SAFETY: the program reads its stack and computes addresses only.
            assert_eq!(unsafe { prog.call(key, 0) }, want, "cpu {cpu}, key {key}");
        }
        // A CPU without a copy takes the helper (which answers its own value).
        FAKE_CPU.with(|c| c.set(3));
        // SAFETY: as above.
        assert_eq!(
            unsafe { prog.call(0, 0) },
            &SLOW_PATH_VALUE as *const u64 as u64
        );
    }
}

#[test]
fn array_updates_inline_as_copies_or_the_kernels_errors_and_leave_the_rest_to_the_helper() {
    // Updates key r1 of the map in r2's low half (0xabc per-CPU, 0xdef plain) with the
    // flags in r2's high half, from the 16 bytes (0x1111, 0x2222) at [r10-16].
    let p = asm("
        stxw [%r10-20], %r1
        mov %r4, %r2
        rsh %r4, 32
        mov %r6, %r2
        lsh %r6, 32
        rsh %r6, 32
        stdw [%r10-16], 0x1111
        stdw [%r10-8], 0x2222
        mov %r2, %r10
        add %r2, -20
        mov %r3, %r10
        add %r3, -16
        jeq %r6, 0xabc, per_cpu
        lddw %r1, 0xdef
        call 2
        exit
    per_cpu:
        lddw %r1, 0xabc
        call 2
        exit");
    let env = PerCpuEnv::new(false);
    let per_cpu = std::ptr::addr_of_mut!(PER_CPU).cast::<u64>();
    let plain = std::ptr::addr_of_mut!(UPDATED).cast::<u64>();
    let read = |words: *mut u64, i: usize| unsafe { words.add(i).read_volatile() };
    let slow = || SLOW_UPDATES.load(std::sync::atomic::Ordering::SeqCst);
    for opts in [JitOptions::default(), JitOptions::optimized()] {
        let prog = JitProgram::compile_with(&p, &env, &opts).unwrap();
        // SAFETY: nothing else touches these statics while this test runs.
        unsafe {
            per_cpu.add(10).write_volatile(0);
            plain.add(0).write_volatile(0);
            plain.add(1).write_volatile(0xffff_ffff_0000_0000);
        }
        FAKE_CPU.with(|c| c.set(2));
        let before = slow();
        // SAFETY: the program writes only the statics, through the layouts above.
        let call = |key: u64, map: u64, flags: u64| unsafe { prog.call(key, map | flags << 32) };
        assert_eq!(call(1, 0xabc, 0), 0, "BPF_ANY on a per-CPU map");
        assert_eq!((read(per_cpu, 10), read(per_cpu, 11)), (0x1111, 0x2222));
        assert_eq!(read(per_cpu, 6), 0, "another CPU's copy is untouched");
        assert_eq!(call(0, 0xdef, 2), 0, "BPF_EXIST");
        assert_eq!(read(plain, 0), 0x1111);
        assert_eq!(
            read(plain, 1),
            0xffff_ffff_0000_2222,
            "12 bytes copied, not the stride's 16"
        );
        assert_eq!(slow(), before, "no helper call so far");
        // The kernel's errors for an array, without the helper.
        assert_eq!(call(0, 0xdef, 1), (-17i64) as u64, "BPF_NOEXIST: -EEXIST");
        assert_eq!(
            call(2, 0xdef, 0),
            (-7i64) as u64,
            "key out of range: -E2BIG"
        );
        assert_eq!(
            call(2, 0xdef, 1),
            (-7i64) as u64,
            "out of range before NOEXIST"
        );
        assert_eq!(
            read(plain, 0),
            0x1111,
            "nothing written by a refused update"
        );
        assert_eq!(
            slow(),
            before,
            "no helper call for errors the map's type decides"
        );
        // Each of these is the helper's to answer.
        assert_eq!(call(0, 0xdef, 4), 7, "BPF_F_LOCK");
        assert_eq!(call(0, 0xdef, 3), 7, "unknown flags");
        FAKE_CPU.with(|c| c.set(3));
        assert_eq!(call(0, 0xabc, 0), 7, "a CPU without a copy");
        assert_eq!(slow(), before + 3);
    }
}

// Calls `entry(r1, r2, 0)` with xmm_i = i + 1 for i in 0..16, and stores into `*changed`
// how many of them came back different.
std::arch::global_asm!(
    ".text",
    ".globl bpftime_test_call_counting_vector_changes",
    "bpftime_test_call_counting_vector_changes:",
    "push rbx",
    "push r12",
    "push r13",
    "mov rbx, rcx",
    "mov rax, rdi",
    "mov rdi, rsi",
    "mov rsi, rdx",
    "xor edx, edx",
    ".irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "mov r12d, \\i + 1",
    "movq xmm\\i, r12",
    ".endr",
    "call rax",
    "xor r13d, r13d",
    ".irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "movq r12, xmm\\i",
    "cmp r12, \\i + 1",
    "setne cl",
    "movzx ecx, cl",
    "add r13, rcx",
    ".endr",
    "mov [rbx], r13",
    "pop r13",
    "pop r12",
    "pop rbx",
    "ret",
);

extern "C" {
    fn bpftime_test_call_counting_vector_changes(
        entry: u64,
        r1: u64,
        r2: u64,
        changed: *mut u64,
    ) -> u64;
}

/// Runs `prog` and answers its r0 and how many of xmm0-15 it changed.
fn run_counting_vector_changes(prog: &JitProgram, r1: u64, r2: u64) -> (u64, u64) {
    let mut changed = 0;
    // SAFETY: the shim takes the entry and its two arguments, and writes one word.
    let r0 = unsafe {
        bpftime_test_call_counting_vector_changes(prog.entry_address(), r1, r2, &mut changed)
    };
    (r0, changed)
}

/// A helper that changes every vector register, as any Rust or C function may.
extern "C" fn clobbering_lookup(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    // SAFETY: only writes registers it declares.
    unsafe {
        std::arch::asm!(
            ".irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
            "pcmpeqd xmm\\i, xmm\\i",
            ".endr",
            out("xmm0") _, out("xmm1") _, out("xmm2") _, out("xmm3") _,
            out("xmm4") _, out("xmm5") _, out("xmm6") _, out("xmm7") _,
            out("xmm8") _, out("xmm9") _, out("xmm10") _, out("xmm11") _,
            out("xmm12") _, out("xmm13") _, out("xmm14") _, out("xmm15") _,
        )
    };
    &SLOW_PATH_VALUE as *const u64 as u64
}

#[test]
fn programs_whose_map_accesses_all_inline_keep_the_vector_registers() {
    // A per-CPU lookup, as bpftrace's count() does, with the helper only on the slow path.
    let lookup = asm(PER_CPU_LOOKUP);
    let with_helper = asm("
        call 5
        exit");
    let env = PerCpuEnv::new(true);
    let base = std::ptr::addr_of!(PER_CPU) as u64;
    for opts in [JitOptions::default(), JitOptions::optimized()] {
        let prog = JitProgram::compile_with(&lookup, &env, &opts).unwrap();
        assert!(prog.keeps_vector_registers(), "{opts:?}");
        FAKE_CPU.with(|c| c.set(1));
        assert_eq!(run_counting_vector_changes(&prog, 0, 0), (base + 16, 0));
        // A CPU without a copy: the helper runs, through the wrapper that saves them.
        FAKE_CPU.with(|c| c.set(3));
        assert_eq!(
            run_counting_vector_changes(&prog, 0, 0),
            (&SLOW_PATH_VALUE as *const u64 as u64, 0)
        );

        let prog = JitProgram::compile_with(&with_helper, &env, &opts).unwrap();
        assert!(!prog.keeps_vector_registers(), "a plain helper call");
        let (_, changed) = run_counting_vector_changes(&prog, 0, 0);
        assert_eq!(
            changed, 16,
            "the helper did change them, as the answer warns"
        );
    }
}

#[test]
fn dense_branch_chains_become_tables_in_rodata() {
    // SimplifyCFG turns this into a switch, lowered to a lookup or jump table: the loader
    // must relocate references from code into .rodata.
    let p = "
        mov %r0, 0
        jeq %r1, 0, a
        jeq %r1, 1, b
        jeq %r1, 2, c
        jeq %r1, 3, d
        jeq %r1, 4, e
        jeq %r1, 5, f
        exit
    a:
        mov %r0, 17
        exit
    b:
        mov %r0, 4242
        exit
    c:
        mov %r0, 99
        exit
    d:
        lddw %r0, 0x123456789
        exit
    e:
        mov %r0, 5
        exit
    f:
        mov %r0, 1
        exit";
    let want = [17, 4242, 99, 0x1_2345_6789, 5, 1, 0, 0];
    for opts in [JitOptions::default(), JitOptions::optimized()] {
        let prog = JitProgram::compile(&asm(p), &helpers, &opts).unwrap();
        for (k, w) in want.iter().enumerate() {
            // SAFETY: no memory access.
            assert_eq!(
                unsafe { prog.call(k as u64, 0) },
                *w,
                "case {k} with {opts:?}"
            );
        }
    }
}

// ---- differential: the interpreter judges the JIT ----

/// xorshift64*, so the generated programs are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }

    fn value(&mut self) -> u64 {
        let special = [
            0,
            1,
            u64::MAX,
            0x8000_0000,
            0x8000_0000_0000_0000,
            0x7fff_ffff,
            0xffff_ffff,
            63,
            64,
        ];
        if self.below(3) == 0 {
            self.pick(&special)
        } else {
            self.next()
        }
    }
}

fn lddw(dst: u8, v: u64) -> [Insn; 2] {
    [
        Insn::new(op::LD_DW_IMM, dst, 0, 0, v as u32 as i32),
        Insn::new(0, 0, 0, 0, (v >> 32) as u32 as i32),
    ]
}

/// A random straight-line-and-forward-branch program over r0-r9 and the stack, ending
/// with every register folded into r0 so any disagreement shows.
fn random_program(rng: &mut Rng) -> Vec<Insn> {
    let mut p = Vec::new();
    for r in 0..10 {
        p.extend(lddw(r, rng.value()));
    }
    for k in 1..=8 {
        p.push(Insn::new(op::ST | op::MEM | op::DW, 10, 0, -8 * k, 0));
    }
    let body = 24 + rng.below(16) as usize;
    let alu_ops = [
        op::ADD,
        op::SUB,
        op::MUL,
        op::DIV,
        op::OR,
        op::AND,
        op::LSH,
        op::RSH,
        op::NEG,
        op::MOD,
        op::XOR,
        op::MOV,
        op::ARSH,
    ];
    let jmp_ops = [
        op::JEQ,
        op::JGT,
        op::JGE,
        op::JSET,
        op::JNE,
        op::JSGT,
        op::JSGE,
        op::JLT,
        op::JLE,
        op::JSLT,
        op::JSLE,
    ];
    let sizes = [op::B, op::H, op::W, op::DW];
    let body_start = p.len();
    while p.len() < body_start + body {
        let dst = rng.below(10) as u8;
        let src = rng.below(10) as u8;
        let imm = rng.value() as i32;
        let slot = -8 * (1 + rng.below(8) as i16);
        match rng.below(10) {
            0..=4 => {
                let class = rng.pick(&[op::ALU, op::ALU64]);
                let o = rng.pick(&alu_ops);
                let x = if o == op::NEG {
                    op::K
                } else {
                    rng.pick(&[op::K, op::X])
                };
                // off 1 selects signed div/mod; off 8/16/32 on mov selects movsx.
                let off = match o {
                    op::DIV | op::MOD => rng.below(2) as i16,
                    op::MOV if x == op::X => {
                        rng.pick(&[0, 8, 16, if class == op::ALU64 { 32 } else { 0 }])
                    }
                    _ => 0,
                };
                p.push(Insn::new(class | o | x, dst, src, off, imm));
            }
            5 => {
                let (class, x) =
                    rng.pick(&[(op::ALU, op::K), (op::ALU, op::X), (op::ALU64, op::K)]);
                p.push(Insn::new(
                    class | op::END | x,
                    dst,
                    0,
                    0,
                    rng.pick(&[16, 32, 64]),
                ));
            }
            6 => {
                let size = rng.pick(&sizes);
                p.push(Insn::new(op::STX | op::MEM | size, 10, src, slot, 0));
            }
            7 => {
                let size = rng.pick(&sizes);
                let mode = if size != op::DW && rng.below(2) == 0 {
                    op::MEMSX
                } else {
                    op::MEM
                };
                p.push(Insn::new(op::LDX | mode | size, dst, 10, slot, 0));
            }
            8 => {
                let size = rng.pick(&[op::W, op::DW]);
                let aop = rng.pick(&[
                    op::ATOMIC_ADD,
                    op::ATOMIC_OR,
                    op::ATOMIC_AND,
                    op::ATOMIC_XOR,
                    op::ATOMIC_ADD | op::FETCH,
                    op::ATOMIC_XOR | op::FETCH,
                    op::ATOMIC_XCHG,
                    op::ATOMIC_CMPXCHG,
                ]);
                // The interpreter drops the fetched value of a fetching atomic whose src
                // is r0 (it writes src, then restores r0); keep r0 out until it is fixed.
                let fetch = aop & op::FETCH != 0 && aop != op::ATOMIC_CMPXCHG;
                let src = if fetch && src == 0 { 1 } else { src };
                p.push(Insn::new(op::STX | op::ATOMIC | size, 10, src, slot, aop));
            }
            _ => {
                let class = rng.pick(&[op::JMP, op::JMP32]);
                let x = rng.pick(&[op::K, op::X]);
                let o = rng.pick(&jmp_ops);
                let remaining = (body_start + body - p.len() - 1) as u64;
                let off = rng.below(remaining.min(3) + 1) as i16;
                p.push(Insn::new(class | o | x, dst, src, off, imm));
            }
        }
    }
    for r in 1..10 {
        p.push(Insn::new(op::ALU64 | op::XOR | op::X, 0, r, 0, 0));
        p.push(Insn::new(op::ALU64 | op::MUL | op::K, 0, 0, 0, 0x100_0193));
    }
    p.push(Insn::new(op::EXIT_INSN, 0, 0, 0, 0));
    p
}

#[test]
fn jit_agrees_with_the_interpreter_on_random_programs() {
    use bpftime_interpreter::{execute, MemoryPolicy, NoEnvironment};
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let opts = [
        JitOptions::default(),
        o1_codegen_throughout(),
        JitOptions::fastest(),
        JitOptions::optimized(),
    ];
    for n in 0..800 {
        let p = random_program(&mut rng);
        let want = execute(&p, 0, 0, &NoEnvironment, &MemoryPolicy::checked([]))
            .unwrap_or_else(|e| panic!("program {n}: interpreter failed: {e}"));
        let o = &opts[n % opts.len()];
        let prog = JitProgram::compile(&p, &helpers, o).unwrap();
        // SAFETY: the program touches only its own stack.
        let got = unsafe { prog.call(0, 0) };
        assert_eq!(
            got, want,
            "program {n} with {o:?} disagrees with the interpreter: {p:?}"
        );
    }
}

thread_local! {
    /// Stand in for the static TLS the agent gives programs that run as a CPU slot: the
    /// slot word (`1 << 32 | slot` while held) and the cached `tgid << 32 | tid`.
    static FAKE_SLOT_WORD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    static FAKE_IDS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Three slots, a cache line each: 0 or the holder's tid.
#[repr(C, align(64))]
struct SlotLine(std::sync::atomic::AtomicU32);
static SLOTS: [SlotLine; 3] = [const { SlotLine(std::sync::atomic::AtomicU32::new(0)) }; 3];
static CLAIMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Makes `fake_claim` answer as for a thread that cannot take slots.
static REFUSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
const FAKE_TID: u32 = 4242;

fn tp_offset_of(p: *const u8) -> u64 {
    let tp: u64;
    // SAFETY: reads the thread control block's self pointer, always present.
    unsafe { std::arch::asm!("mov {}, fs:[0]", out(reg) tp, options(nostack, readonly)) };
    (p as u64).wrapping_sub(tp)
}

/// The runtime's fast path, reduced: the CPU's own slot if free.
extern "C" fn fake_claim_own(slots: u64, tid: u32, _rseq: u64, cpus: u32) -> u32 {
    assert_eq!(slots, SLOTS.as_ptr() as u64);
    let cpu = FAKE_CPU.with(|c| c.get());
    if cpu < cpus
        && SLOTS[cpu as usize]
            .0
            .compare_exchange(
                0,
                tid,
                std::sync::atomic::Ordering::Acquire,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok()
    {
        return cpu;
    }
    u32::MAX
}

/// The runtime's slow path, reduced: the first free slot from 2 down.
extern "C" fn fake_claim(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    CLAIMS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    if REFUSE.load(std::sync::atomic::Ordering::SeqCst) {
        return u64::from(u32::MAX);
    }
    for i in (0..3).rev() {
        if SLOTS[i]
            .0
            .compare_exchange(
                0,
                FAKE_TID,
                std::sync::atomic::Ordering::Acquire,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok()
        {
            FAKE_SLOT_WORD.with(|w| w.set(1 << 32 | i as u64));
            return i as u64;
        }
    }
    unreachable!("the tests leave a slot free")
}

struct SlotEnv(PerCpuEnv);

impl JitEnv for SlotEnv {
    fn helper(&self, id: u32) -> Option<u64> {
        self.0.helper(id)
    }
    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        self.0.array_map(map)
    }
    fn cpu_number_offset(&self) -> Option<u64> {
        self.0.cpu_number_offset()
    }
    fn cpu_slots(&self) -> Option<bpftime_jit_x86::CpuSlotTable> {
        Some(bpftime_jit_x86::CpuSlotTable {
            address_space: bpftime_jit_x86::FS_SEGMENT,
            slot_offset: tp_offset_of(FAKE_SLOT_WORD.with(|w| w.as_ptr()).cast()),
            ids_offset: tp_offset_of(FAKE_IDS.with(|w| w.as_ptr()).cast()),
            rseq_offset: 0,
            slots: SLOTS.as_ptr() as u64,
            stride: 64,
            cpus: 3,
            claim_own: fake_claim_own as *const () as u64,
            claim: addr(fake_claim),
        })
    }
}

/// A program that runs as a CPU slot takes its CPU's slot when free, another through the
/// slow path when not, uses the slot's copy of per-CPU values, and frees it on exit; in
/// a tail call (the thread holds a slot already) it uses that one and frees nothing.
#[test]
fn per_cpu_accesses_use_the_slot_the_entry_takes() {
    use std::sync::atomic::Ordering::SeqCst;
    let p = asm(PER_CPU_LOOKUP);
    let env = SlotEnv(PerCpuEnv::new(false));
    let base = std::ptr::addr_of!(PER_CPU) as u64;
    let held = |i: usize| SLOTS[i].0.load(SeqCst);
    for opts in [JitOptions::default(), JitOptions::optimized()] {
        let prog = JitProgram::compile_with(&p, &env, &opts).unwrap();
        assert!(
            prog.keeps_vector_registers(),
            "the slow path keeps vectors too"
        );
        let claims = CLAIMS.load(SeqCst);
        FAKE_IDS.with(|w| w.set(7 << 32 | u64::from(FAKE_TID)));
        // Its own CPU's slot, free: no slow path.
        FAKE_CPU.with(|c| c.set(1));
        // SAFETY: the program reads its stack and computes addresses only.
        assert_eq!(unsafe { prog.call(0, 0) }, base + 16);
        assert_eq!(CLAIMS.load(SeqCst), claims);
        assert_eq!((held(0), held(1), held(2)), (0, 0, 0), "freed on exit");
        assert_eq!(FAKE_SLOT_WORD.with(|w| w.get()), 0);
        // The CPU's slot held by a preempted thread: the slow path gives slot 2.
        SLOTS[1].0.store(99, SeqCst);
        // SAFETY: as above.
        assert_eq!(unsafe { prog.call(1, 0) }, base + 48 + 32);
        assert_eq!(CLAIMS.load(SeqCst), claims + 1);
        assert_eq!((held(1), held(2)), (99, 0), "slot 2 freed, slot 1 not ours");
        SLOTS[1].0.store(0, SeqCst);
        // Ids not yet cached, or a CPU without a slot: the slow path.
        FAKE_IDS.with(|w| w.set(0));
        // SAFETY: as above.
        assert_eq!(unsafe { prog.call(0, 0) }, base + 32);
        FAKE_IDS.with(|w| w.set(7 << 32 | u64::from(FAKE_TID)));
        FAKE_CPU.with(|c| c.set(5));
        // SAFETY: as above.
        assert_eq!(unsafe { prog.call(0, 0) }, base + 32);
        assert_eq!(CLAIMS.load(SeqCst), claims + 3);
        assert_eq!((held(0), held(1), held(2)), (0, 0, 0));
        // A tail call: the thread runs as slot 0 already.
        FAKE_SLOT_WORD.with(|w| w.set(1 << 32));
        FAKE_CPU.with(|c| c.set(2));
        // SAFETY: as above.
        assert_eq!(unsafe { prog.call(1, 0) }, base + 48);
        assert_eq!(FAKE_SLOT_WORD.with(|w| w.get()), 1 << 32, "still held");
        assert_eq!(CLAIMS.load(SeqCst), claims + 3);
        FAKE_SLOT_WORD.with(|w| w.set(0));
        // A thread that cannot take a slot (no rseq area) still runs, and frees nothing.
        SLOTS[2].0.store(99, SeqCst);
        REFUSE.store(true, SeqCst);
        // SAFETY: as above.
        assert_eq!(unsafe { prog.call(0, 0) }, base);
        REFUSE.store(false, SeqCst);
        assert_eq!(CLAIMS.load(SeqCst), claims + 4);
        assert_eq!((held(0), held(1), held(2)), (0, 0, 99));
        SLOTS[2].0.store(0, SeqCst);
    }
}
