//! The interpreter's corner cases: each test pins behaviour RFC 9669 (or the kernel, where
//! the RFC is silent) specifies.

use std::sync::Arc;

use bpftime_interpreter::{
    execute, execute_with_budget, Access, Environment, ExecError, HelperFn, MemoryPolicy,
    NoEnvironment, TAIL_CALL_FAILED,
};
use bpftime_isa::asm::assemble;
use bpftime_isa::Insn;

fn no_mem() -> MemoryPolicy {
    MemoryPolicy::checked([])
}

/// Runs assembler text with no memory but the stack.
fn run(src: &str) -> Result<u64, ExecError> {
    execute(&assemble(src).unwrap(), 0, 0, &NoEnvironment, &no_mem())
}

fn r0(src: &str) -> u64 {
    run(src).unwrap_or_else(|e| panic!("{e}\n{src}"))
}

/// Runs with `mem` lent to the program in r1/r2, checked.
fn run_mem(src: &str, mem: &mut [u8]) -> Result<u64, ExecError> {
    let start = mem.as_mut_ptr() as u64;
    let policy = MemoryPolicy::checked(std::iter::once(start..start + mem.len() as u64));
    execute(
        &assemble(src).unwrap(),
        start,
        mem.len() as u64,
        &NoEnvironment,
        &policy,
    )
}

#[test]
fn division_by_zero_yields_zero_and_modulo_keeps_the_dividend() {
    assert_eq!(r0("mov %r0, 7\nmov %r1, 0\ndiv %r0, %r1\nexit"), 0);
    assert_eq!(r0("mov %r0, 7\nmov %r1, 0\nsdiv %r0, %r1\nexit"), 0);
    assert_eq!(r0("mov %r0, 7\nmov %r1, 0\nmod %r0, %r1\nexit"), 7);
    assert_eq!(
        r0("mov %r0, -7\nmov %r1, 0\nsmod %r0, %r1\nexit"),
        -7i64 as u64
    );
    // 32-bit forms zero the upper half even when the dividend is kept.
    assert_eq!(
        r0("lddw %r0, 0x100000005\nmov %r1, 0\nmod32 %r0, %r1\nexit"),
        5
    );
    assert_eq!(
        r0("lddw %r0, 0x100000005\nmov32 %r1, 0\ndiv32 %r0, %r1\nexit"),
        0
    );
    assert_eq!(r0("lddw %r0, 0xffffffff00000009\nsmod32 %r0, 0\nexit"), 9);
}

#[test]
fn signed_division_overflow_and_sign_rules() {
    assert_eq!(
        r0("lddw %r0, 0x8000000000000000\nsdiv %r0, -1\nexit"),
        0x8000_0000_0000_0000
    );
    assert_eq!(r0("lddw %r0, 0x8000000000000000\nsmod %r0, -1\nexit"), 0);
    assert_eq!(
        r0("mov32 %r0, 0x80000000\nsdiv32 %r0, -1\nexit"),
        0x8000_0000
    );
    assert_eq!(r0("mov32 %r0, 0x80000000\nsmod32 %r0, -1\nexit"), 0);
    // The remainder takes the dividend's sign (truncating division).
    assert_eq!(r0("mov %r0, -7\nsmod %r0, 3\nexit"), -1i64 as u64);
    assert_eq!(r0("mov %r0, 7\nsmod %r0, -3\nexit"), 1);
    assert_eq!(r0("mov %r0, -7\nsdiv %r0, 2\nexit"), -3i64 as u64);
    assert_eq!(r0("mov32 %r0, -7\nsmod32 %r0, 3\nexit"), 0xffff_ffff);
}

#[test]
fn unsigned_division_reads_a_negative_immediate_as_sign_extended() {
    // 64-bit: imm -1 is 2^64-1, so anything smaller divides to 0.
    assert_eq!(r0("mov %r0, -2\ndiv %r0, -1\nexit"), 0);
    assert_eq!(r0("mov %r0, -1\ndiv %r0, -1\nexit"), 1);
    // 32-bit: imm -1 is 2^32-1.
    assert_eq!(r0("mov32 %r0, -1\ndiv32 %r0, -1\nexit"), 1);
    assert_eq!(r0("mov32 %r0, 10\nmod32 %r0, -1\nexit"), 10);
}

#[test]
fn shift_amounts_are_masked_to_the_operand_width() {
    assert_eq!(r0("mov %r0, 1\nlsh %r0, 65\nexit"), 2);
    assert_eq!(r0("mov %r0, 1\nmov %r1, 33\nlsh32 %r0, %r1\nexit"), 2);
    assert_eq!(r0("lddw %r0, 0x8000000000000000\nrsh %r0, 127\nexit"), 1);
    assert_eq!(
        r0("mov32 %r0, 0x80000000\narsh32 %r0, 4\nexit"),
        0xf800_0000
    );
    assert_eq!(
        r0("lddw %r0, 0x8000000000000000\narsh %r0, 68\nexit"),
        0xf800_0000_0000_0000
    );
    assert_eq!(r0("mov %r0, -1\nrsh32 %r0, 28\nexit"), 0xf);
}

#[test]
fn moves_sign_extend_or_zero_extend_as_the_opcode_says() {
    assert_eq!(r0("mov32 %r0, -1\nexit"), 0xffff_ffff);
    assert_eq!(r0("mov %r0, -1\nexit"), u64::MAX);
    assert_eq!(r0("mov %r1, 0x80\nmovsx864 %r0, %r1\nexit"), -128i64 as u64);
    assert_eq!(r0("mov %r1, 0x80\nmovsx832 %r0, %r1\nexit"), 0xffff_ff80);
    assert_eq!(r0("mov %r1, 0x7fff\nmovsx1664 %r0, %r1\nexit"), 0x7fff);
    assert_eq!(
        r0("mov32 %r1, 0x80000000\nmovsx3264 %r0, %r1\nexit"),
        0xffff_ffff_8000_0000
    );
    assert_eq!(
        r0("lddw %r1, 0x1ffffffff\nmov32 %r0, %r1\nexit"),
        0xffff_ffff
    );
    assert_eq!(r0("mov %r0, 5\nneg32 %r0\nexit"), 0xffff_fffb);
    // movsx from 32 bits exists only in ALU64; in ALU the offset is invalid.
    let bad = [Insn::new(0xbc, 0, 1, 32, 0), Insn::new(0x95, 0, 0, 0, 0)];
    assert_eq!(
        execute(&bad, 0, 0, &NoEnvironment, &no_mem()),
        Err(ExecError::InvalidField {
            pc: 0,
            code: 0xbc,
            field: "offset",
            value: 32
        })
    );
}

#[test]
fn byte_swaps_truncate_then_convert() {
    let v = "lddw %r0, 0x1122334455667788\n";
    assert_eq!(r0(&format!("{v}be16 %r0\nexit")), 0x8877);
    assert_eq!(r0(&format!("{v}be32 %r0\nexit")), 0x8877_6655);
    assert_eq!(r0(&format!("{v}le16 %r0\nexit")), 0x7788);
    assert_eq!(r0(&format!("{v}le64 %r0\nexit")), 0x1122_3344_5566_7788);
    assert_eq!(r0(&format!("{v}bswap64 %r0\nexit")), 0x8877_6655_4433_2211);
    assert_eq!(r0(&format!("{v}swap32 %r0\nexit")), 0x8877_6655);
}

#[test]
fn jmp32_compares_low_halves_and_gotol_uses_imm() {
    // 64-bit compare sees the upper half; 32-bit compare does not.
    let src = "lddw %r1, 0x100000001\nmov %r0, 0\njeq32 %r1, 1, +1\nexit\nmov %r0, 1\njeq %r1, 1, +1\nexit\nmov %r0, 2\nexit";
    assert_eq!(r0(src), 1);
    assert_eq!(r0("mov %r0, 1\nja32 +1\nmov %r0, 2\nexit"), 1);
    assert_eq!(
        r0("mov32 %r1, -1\nmov %r0, 0\njslt32 %r1, 0, +1\nexit\nmov %r0, 1\nexit"),
        1
    );
    assert_eq!(
        r0("mov32 %r1, -1\nmov %r0, 0\njslt %r1, 0, +1\nexit\nmov %r0, 1\nexit"),
        0
    );
}

#[test]
fn loads_and_stores_of_every_size_including_sign_extension() {
    let mut mem = [0u8; 16];
    let src = "stdw [%r1], -2\nsth [%r1+8], 0x8001\nldxsh %r0, [%r1+8]\nldxh %r2, [%r1+8]\nadd %r0, %r2\nldxsw %r3, [%r1]\nadd %r0, %r3\nexit";
    let got = run_mem(src, &mut mem).unwrap();
    assert_eq!(got, (-32767i64 + 0x8001 - 2) as u64);
    assert_eq!(
        &mem[..10],
        &[0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x80]
    );
    // Unaligned accesses are fine outside atomics.
    let mut mem = [1u8, 2, 3, 4, 5, 6, 7, 8, 9];
    assert_eq!(
        run_mem("ldxdw %r0, [%r1+1]\nexit", &mut mem).unwrap(),
        0x0908_0706_0504_0302
    );
}

#[test]
fn atomics_return_old_values_where_asked() {
    let mut mem = [0u8; 8];
    mem.copy_from_slice(&10u64.to_le_bytes());
    let src = "mov %r2, 5\nlock fetch add [%r1], %r2\nmov %r3, 3\nlock add [%r1], %r3\nmov %r0, %r2\nlsh %r0, 8\nor %r0, %r3\nexit";
    assert_eq!(run_mem(src, &mut mem).unwrap(), (10 << 8) | 3);
    assert_eq!(u64::from_le_bytes(mem), 18);

    // cmpxchg32 compares only the low half of r0, stores on a match, and always returns the
    // old value zero-extended in r0.
    let mut mem = 0xaaaa_aaaa_0000_0007u64.to_le_bytes();
    let src = "lddw %r0, 0xffffffff00000007\nmov %r2, 9\nlock cmpxchg32 [%r1], %r2\nexit";
    assert_eq!(run_mem(src, &mut mem).unwrap(), 7);
    assert_eq!(u64::from_le_bytes(mem), 0xaaaa_aaaa_0000_0009);
    let src = "mov %r0, 1\nmov %r2, 3\nlock cmpxchg32 [%r1], %r2\nexit";
    assert_eq!(run_mem(src, &mut mem).unwrap(), 9);
    assert_eq!(u64::from_le_bytes(mem), 0xaaaa_aaaa_0000_0009);

    let mut mem = 0x0f0fu64.to_le_bytes();
    let src = "mov %r2, 0xff\nlock fetch xchg [%r1], %r2\nmov %r0, %r2\nexit";
    assert_eq!(run_mem(src, &mut mem).unwrap(), 0x0f0f);
    assert_eq!(u64::from_le_bytes(mem), 0xff);
}

#[test]
fn atomic_adds_from_many_threads_do_not_lose_updates() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let counter = AtomicU64::new(0);
    let addr = counter.as_ptr() as u64;
    let prog = assemble(
        "mov %r3, 0\nloop:\nmov %r2, 1\nlock add [%r1], %r2\nadd %r3, 1\njlt %r3, 10000, loop\nexit",
    )
    .unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                let policy = MemoryPolicy::checked(std::iter::once(addr..addr + 8));
                execute(&prog, addr, 0, &NoEnvironment, &policy).unwrap();
            });
        }
    });
    assert_eq!(counter.load(Ordering::SeqCst), 40_000);
}

#[test]
fn misaligned_atomics_are_refused() {
    let mut mem = [0u8; 16];
    let start = mem.as_ptr() as u64;
    let src = "mov %r2, 1\nlock add [%r1+1], %r2\nexit";
    let err = run_mem(src, &mut mem).unwrap_err();
    assert!(
        matches!(err, ExecError::MisalignedAtomic { pc: 1, addr, len: 8 } if addr == start + 1),
        "{err}"
    );
}

#[test]
fn calls_preserve_r6_to_r9_and_give_each_frame_its_own_stack() {
    let src = "
mov %r6, 6
mov %r9, 9
stdw [%r10-8], 100
mov %r1, %r10
call local f
ldxdw %r2, [%r10-8]
add %r0, %r2
add %r0, %r6
add %r0, %r9
exit
f:
mov %r6, 0
mov %r9, 0
stdw [%r10-8], 1000
ldxdw %r0, [%r1-8]
ldxdw %r3, [%r10-8]
add %r0, %r3
exit";
    // callee: 100 (caller's slot via r1) + 1000 (its own slot); caller adds 100 + 6 + 9.
    assert_eq!(r0(src), 1100 + 100 + 15);
}

#[test]
fn call_depth_is_limited_to_eight_frames() {
    // Recurses while r1 > 0: r1 = 6 makes eight frames in all, r1 = 7 a ninth.
    let rec = "call local f\nexit\nf:\njeq %r1, 0, +2\nsub %r1, 1\ncall local f\nmov %r0, 42\nexit";
    let prog = assemble(rec).unwrap();
    let go = |n| execute(&prog, n, 0, &NoEnvironment, &no_mem());
    assert_eq!(go(6), Ok(42));
    assert_eq!(go(7), Err(ExecError::CallDepthExceeded { pc: 4, max: 8 }));
}

#[test]
fn a_returned_frame_is_no_longer_accessible() {
    // The callee returns a pointer into its own frame; once it has returned, that frame is dead.
    let src = "call local f\nldxdw %r0, [%r0]\nexit\nf:\nstdw [%r10-8], 1\nmov %r0, %r10\nsub %r0, 8\nexit";
    assert!(matches!(
        run(src),
        Err(ExecError::MemoryViolation {
            pc: 1,
            len: 8,
            access: Access::Load,
            ..
        })
    ));
}

struct TestEnv {
    progs: Vec<Arc<[Insn]>>,
}

const PROG_ARRAY: u64 = 0xdead_0000;

unsafe extern "C" fn add3(a: u64, b: u64, c: u64, _: u64, _: u64) -> u64 {
    a + b + c
}

// SAFETY: the one helper touches no memory.
unsafe impl Environment for TestEnv {
    fn helper(&self, id: u32) -> Option<HelperFn> {
        (id == 1).then_some(add3 as HelperFn)
    }

    fn tail_call_target(&self, map: u64, index: u64) -> Option<Arc<[Insn]>> {
        (map == PROG_ARRAY)
            .then(|| self.progs.get(index as usize).cloned())
            .flatten()
    }
}

fn env(progs: &[&str]) -> TestEnv {
    TestEnv {
        progs: progs
            .iter()
            .map(|s| Arc::from(assemble(s).unwrap()))
            .collect(),
    }
}

#[test]
fn helpers_by_imm_and_by_register() {
    let e = env(&[]);
    let p = assemble("mov %r1, 1\nmov %r2, 2\nmov %r3, 3\ncall 1\nexit").unwrap();
    assert_eq!(execute(&p, 0, 0, &e, &no_mem()), Ok(6));
    let p = assemble("mov %r1, 1\nmov %r2, 2\nmov %r3, 4\nmov %r7, 1\ncall %r7\nexit").unwrap();
    assert_eq!(execute(&p, 0, 0, &e, &no_mem()), Ok(7));
    let p = assemble("call 99\nexit").unwrap();
    assert_eq!(
        execute(&p, 0, 0, &e, &no_mem()),
        Err(ExecError::UnknownHelper { pc: 0, id: 99 })
    );
}

#[test]
fn tail_call_starts_the_target_with_the_same_r1() {
    let e = env(&["mov %r0, %r1\nadd %r0, 1000\nexit"]);
    let caller = assemble(&format!(
        "mov %r6, %r1\nlddw %r2, {PROG_ARRAY}\nmov %r3, 0\nmov %r1, %r6\ncall 12\nmov %r0, 1\nexit"
    ))
    .unwrap();
    assert_eq!(execute(&caller, 5, 0, &e, &no_mem()), Ok(1005));
}

#[test]
fn tail_call_to_a_missing_target_falls_through() {
    let e = env(&[]);
    let caller = assemble(&format!(
        "lddw %r2, {PROG_ARRAY}\nmov %r3, 7\ncall 12\nexit"
    ))
    .unwrap();
    assert_eq!(execute(&caller, 5, 0, &e, &no_mem()), Ok(TAIL_CALL_FAILED));
}

#[test]
fn tail_call_chains_stop_after_33() {
    // Counts its runs in memory and tail-calls itself until the chain limit makes the call
    // fall through.
    let looping = format!(
        "ldxdw %r2, [%r1]\nadd %r2, 1\nstxdw [%r1], %r2\nlddw %r2, {PROG_ARRAY}\nmov %r3, 0\ncall 12\nmov %r0, 7\nexit"
    );
    let e = env(&[&looping]);
    let mut count = 0u64;
    let addr = &mut count as *mut u64 as u64;
    let policy = MemoryPolicy::checked(std::iter::once(addr..addr + 8));
    let prog = assemble(&looping).unwrap();
    assert_eq!(execute(&prog, addr, 0, &e, &policy), Ok(7));
    assert_eq!(count, 34, "the first run and 33 tail calls");
}

#[test]
fn checked_mode_names_the_pc_and_address_it_refuses() {
    let mut mem = [0u8; 8];
    let start = mem.as_ptr() as u64;
    assert_eq!(
        run_mem("mov %r0, 0\nstxw [%r1+6], %r0\nexit", &mut mem),
        Err(ExecError::MemoryViolation {
            pc: 1,
            addr: start + 6,
            len: 4,
            access: Access::Store
        })
    );
    assert_eq!(mem, [0; 8], "a refused store writes nothing");
    assert!(matches!(
        run("ldxb %r0, [%r10-513]\nexit"),
        Err(ExecError::MemoryViolation { pc: 0, len: 1, .. })
    ));
    assert!(matches!(
        run("ldxb %r0, [%r10]\nexit"),
        Err(ExecError::MemoryViolation { pc: 0, .. })
    ));
    assert_eq!(r0("stb [%r10-512], 3\nldxb %r0, [%r10-512]\nexit"), 3);
    assert!(matches!(
        run("mov %r1, 0\nldxdw %r0, [%r1]\nexit"),
        Err(ExecError::MemoryViolation { pc: 1, addr: 0, .. })
    ));
}

#[test]
fn unchecked_mode_reads_memory_directly() {
    let data = [0x11u8, 0x22, 0x33, 0x44];
    let prog = assemble("ldxw %r0, [%r1]\nadd %r0, %r2\nexit").unwrap();
    // SAFETY: the program reads four bytes at r1, which points at `data`.
    let policy = unsafe { MemoryPolicy::unchecked() };
    assert_eq!(
        execute(&prog, data.as_ptr() as u64, 1, &NoEnvironment, &policy),
        Ok(0x4433_2212)
    );
}

#[test]
fn malformed_programs_stop_with_an_error_naming_the_pc() {
    assert_eq!(
        execute(
            &[Insn::new(0xff, 0, 0, 0, 0)],
            0,
            0,
            &NoEnvironment,
            &no_mem()
        ),
        Err(ExecError::UnknownOpcode { pc: 0, code: 0xff })
    );
    assert_eq!(
        run("mov %r0, 0\nja +5\nexit"),
        Err(ExecError::JumpOutOfRange {
            pc: 1,
            target: 7,
            len: 3
        })
    );
    assert_eq!(
        run("mov %r0, 0"),
        Err(ExecError::FellOffEnd { pc: 1, len: 1 })
    );
    assert_eq!(
        execute(
            &[Insn::new(0x18, 0, 0, 0, 1)],
            0,
            0,
            &NoEnvironment,
            &no_mem()
        ),
        Err(ExecError::IncompleteLddw { pc: 0 })
    );
    assert_eq!(
        execute(
            &[Insn::new(0x85, 0, 2, 0, 1)],
            0,
            0,
            &NoEnvironment,
            &no_mem()
        ),
        Err(ExecError::UnsupportedCall { pc: 0, src: 2 })
    );
    assert_eq!(
        execute(
            &[Insn::new(0xd4, 0, 0, 0, 17)],
            0,
            0,
            &NoEnvironment,
            &no_mem()
        ),
        Err(ExecError::InvalidField {
            pc: 0,
            code: 0xd4,
            field: "imm",
            value: 17
        })
    );
}

#[test]
fn the_budget_stops_infinite_loops() {
    let prog = assemble("mov %r0, 0\nloop:\nadd %r0, 1\nja loop").unwrap();
    assert_eq!(
        execute_with_budget(&prog, 0, 0, &NoEnvironment, &no_mem(), 101),
        Err(ExecError::BudgetExceeded { pc: 1, budget: 101 })
    );
    let done = assemble("mov %r0, 3\nexit").unwrap();
    assert_eq!(
        execute_with_budget(&done, 0, 0, &NoEnvironment, &no_mem(), 2),
        Ok(3)
    );
}

/// Found by the JIT's differential test: a fetching atomic whose source is r0
/// wrote the fetched value and then put the old r0 back.
#[test]
fn fetching_atomic_with_r0_as_source_keeps_the_fetched_value() {
    let xchg = "mov %r1, 5\nstxdw [%r10-8], %r1\nmov %r0, 7\nlock xchg [%r10-8], %r0\nexit";
    assert_eq!(r0(xchg), 5);
    let fetch_add = "mov %r1, 5\nstxdw [%r10-8], %r1\nmov %r0, 7\nlock fetch add [%r10-8], %r0\nldxdw %r1, [%r10-8]\nadd %r0, %r1\nexit";
    assert_eq!(r0(fetch_add), 5 + 12);
}

/// A program summing the indices `bpf_loop` hands its callback into a stack slot (the
/// callback's ctx), stopping after index 4; r0 = iterations * 1000 + sum. `nr` and
/// `flags` are bpf_loop's first and last arguments.
fn loop_program(nr: i32, flags: i32) -> Vec<Insn> {
    let mut insns = assemble(&format!(
        "stdw [%r10-8], 0
         mov %r1, {nr}
         lddw %r2, 0
         mov %r3, %r10
         add %r3, -8
         mov %r4, {flags}
         call 181
         ldxdw %r1, [%r10-8]
         mul %r0, 1000
         add %r0, %r1
         exit
         ldxdw %r3, [%r2]
         add %r3, %r1
         stxdw [%r2], %r3
         mov %r0, 0
         jne %r1, 4, +1
         mov %r0, 1
         exit"
    ))
    .unwrap();
    // `lddw %r2, func` at slot 2: the callback starts at slot 12.
    insns[2].src = bpftime_isa::opcode::PSEUDO_FUNC;
    insns[2].imm = 12 - 2 - 1;
    insns
}

#[test]
fn bpf_loop_runs_its_callback_until_it_returns_one() {
    let run = |nr, flags| {
        execute(&loop_program(nr, flags), 0, 0, &NoEnvironment, &no_mem())
            .unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(run(10, 0), 5 * 1000 + (1 + 2 + 3 + 4));
    assert_eq!(run(3, 0), 3 * 1000 + (1 + 2));
    assert_eq!(run(0, 0), 0);
    let neg = |e: i64| (e as u64).wrapping_mul(1000);
    assert_eq!(run(3, 1), neg(-22), "flags other than 0 are -EINVAL");
    assert_eq!(
        run((1 << 23) + 1, 0),
        neg(-7),
        "more than 1 << 23 is -E2BIG"
    );
    assert_eq!(
        run(1 << 23, 0),
        5 * 1000 + 10,
        "the limit itself is allowed"
    );
}

#[test]
fn bpf_loop_callbacks_count_against_the_budget_and_frames() {
    let p = loop_program(10, 0);
    // SAFETY: the callback only touches the caller's stack slot.
    let unchecked = unsafe { MemoryPolicy::unchecked() };
    assert_eq!(
        execute_with_budget(&p, 0, 0, &NoEnvironment, &unchecked, 1000).unwrap(),
        5010
    );
    let e = execute_with_budget(&p, 0, 0, &NoEnvironment, &no_mem(), 20).unwrap_err();
    assert!(
        matches!(e, ExecError::BudgetExceeded { budget: 20, .. }),
        "{e}"
    );
    // A callback that is not a slot of the program stops it, naming the call.
    let mut bad = p.clone();
    bad[2].imm = 1000;
    let e = execute(&bad, 0, 0, &NoEnvironment, &no_mem()).unwrap_err();
    assert!(matches!(e, ExecError::BadCallback { pc: 7, .. }), "{e}");
}
