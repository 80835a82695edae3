use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use bpftime_isa::opcode::*;
use bpftime_isa::uapi::{helper, MAX_CALL_FRAMES, MAX_TAIL_CALLS, STACK_SIZE};
use bpftime_isa::Insn;

use crate::env::{Environment, MemoryPolicy, Policy};
use crate::error::{Access, ExecError};

/// What `bpf_tail_call` leaves in r0 when it falls through (no target, or the chain is at
/// its limit): `-ENOENT`, as the helper's contract promises a negative error.
pub const TAIL_CALL_FAILED: u64 = -2i64 as u64;

const STACK_BYTES: usize = STACK_SIZE * MAX_CALL_FRAMES;

/// Every frame's stack, the first frame at the top; 16-byte aligned so that the aligned
/// accesses a verified program makes to its stack are aligned in host memory too.
#[repr(C, align(16))]
struct Stack([u8; STACK_BYTES]);

/// Runs `prog` with r1 and r2 set, until its first frame exits, and returns r0.
pub fn execute(
    prog: &[Insn],
    r1: u64,
    r2: u64,
    env: &dyn Environment,
    mem: &MemoryPolicy,
) -> Result<u64, ExecError> {
    match &mem.0 {
        Policy::Unchecked => run::<false, false>(Start::entry(prog, r1, r2, 0), env, &[]),
        Policy::Checked(ranges) => run::<true, false>(Start::entry(prog, r1, r2, 0), env, ranges),
    }
    .map(|(r0, _)| r0)
}

/// [`execute`], stopping with [`ExecError::BudgetExceeded`] once `budget` instructions
/// (across calls and tail calls) have run.
pub fn execute_with_budget(
    prog: &[Insn],
    r1: u64,
    r2: u64,
    env: &dyn Environment,
    mem: &MemoryPolicy,
    budget: u64,
) -> Result<u64, ExecError> {
    match &mem.0 {
        Policy::Unchecked => run::<false, true>(Start::entry(prog, r1, r2, budget), env, &[]),
        Policy::Checked(ranges) => {
            run::<true, true>(Start::entry(prog, r1, r2, budget), env, ranges)
        }
    }
    .map(|(r0, _)| r0)
}

/// Where a run begins: a program's entry, or a `bpf_loop` callback inside it.
struct Start<'p> {
    prog: &'p [Insn],
    pc: usize,
    r1: u64,
    r2: u64,
    /// Instructions left to run (with a budget).
    budget: u64,
    /// The budget the caller of `execute_with_budget` set, for the error.
    full_budget: u64,
    /// Frames the callers of this run already use.
    frames_above: usize,
    /// Tail calls this run may still make count from here.
    tail_calls: u32,
}

impl<'p> Start<'p> {
    fn entry(prog: &'p [Insn], r1: u64, r2: u64, budget: u64) -> Self {
        Start {
            prog,
            pc: 0,
            r1,
            r2,
            budget,
            full_budget: budget,
            frames_above: 0,
            tail_calls: 0,
        }
    }
}

/// A caller's state, saved across a bpf-to-bpf call.
#[derive(Clone, Copy)]
struct Frame<'p> {
    prog: &'p [Insn],
    ret_pc: usize,
    callee_saved: [u64; 4],
}

/// Decides whether an access may happen; with `CHECKED` false it compiles to nothing.
struct Guard<'a, const CHECKED: bool> {
    ranges: &'a [Range<u64>],
    /// The live stack: from the bottom of the innermost frame to the top of the first.
    stack: Range<u64>,
}

impl<const CHECKED: bool> Guard<'_, CHECKED> {
    #[inline(always)]
    fn check(&self, pc: usize, addr: u64, len: usize, access: Access) -> Result<(), ExecError> {
        if !CHECKED {
            return Ok(());
        }
        let inside = |r: &Range<u64>| {
            addr >= r.start && addr.checked_add(len as u64).is_some_and(|end| end <= r.end)
        };
        if inside(&self.stack) || self.ranges.iter().any(inside) {
            Ok(())
        } else {
            Err(ExecError::MemoryViolation {
                pc,
                addr,
                len,
                access,
            })
        }
    }
}

// Full opcodes, named for the match below (inline const patterns are not stable).
const ALU64_ADD_K: u8 = ALU64 | ADD | K;
const ALU64_ADD_X: u8 = ALU64 | ADD | X;
const ALU64_SUB_K: u8 = ALU64 | SUB | K;
const ALU64_SUB_X: u8 = ALU64 | SUB | X;
const ALU64_MUL_K: u8 = ALU64 | MUL | K;
const ALU64_MUL_X: u8 = ALU64 | MUL | X;
const ALU64_DIV_K: u8 = ALU64 | DIV | K;
const ALU64_DIV_X: u8 = ALU64 | DIV | X;
const ALU64_MOD_K: u8 = ALU64 | MOD | K;
const ALU64_MOD_X: u8 = ALU64 | MOD | X;
const ALU64_OR_K: u8 = ALU64 | OR | K;
const ALU64_OR_X: u8 = ALU64 | OR | X;
const ALU64_AND_K: u8 = ALU64 | AND | K;
const ALU64_AND_X: u8 = ALU64 | AND | X;
const ALU64_XOR_K: u8 = ALU64 | XOR | K;
const ALU64_XOR_X: u8 = ALU64 | XOR | X;
const ALU64_LSH_K: u8 = ALU64 | LSH | K;
const ALU64_LSH_X: u8 = ALU64 | LSH | X;
const ALU64_RSH_K: u8 = ALU64 | RSH | K;
const ALU64_RSH_X: u8 = ALU64 | RSH | X;
const ALU64_ARSH_K: u8 = ALU64 | ARSH | K;
const ALU64_ARSH_X: u8 = ALU64 | ARSH | X;
const ALU64_NEG_K: u8 = ALU64 | NEG | K;
const ALU64_MOV_K: u8 = ALU64 | MOV | K;
const ALU64_MOV_X: u8 = ALU64 | MOV | X;
const ALU64_END_K: u8 = ALU64 | END | K;
const ALU_ADD_K: u8 = ALU | ADD | K;
const ALU_ADD_X: u8 = ALU | ADD | X;
const ALU_SUB_K: u8 = ALU | SUB | K;
const ALU_SUB_X: u8 = ALU | SUB | X;
const ALU_MUL_K: u8 = ALU | MUL | K;
const ALU_MUL_X: u8 = ALU | MUL | X;
const ALU_DIV_K: u8 = ALU | DIV | K;
const ALU_DIV_X: u8 = ALU | DIV | X;
const ALU_MOD_K: u8 = ALU | MOD | K;
const ALU_MOD_X: u8 = ALU | MOD | X;
const ALU_OR_K: u8 = ALU | OR | K;
const ALU_OR_X: u8 = ALU | OR | X;
const ALU_AND_K: u8 = ALU | AND | K;
const ALU_AND_X: u8 = ALU | AND | X;
const ALU_XOR_K: u8 = ALU | XOR | K;
const ALU_XOR_X: u8 = ALU | XOR | X;
const ALU_LSH_K: u8 = ALU | LSH | K;
const ALU_LSH_X: u8 = ALU | LSH | X;
const ALU_RSH_K: u8 = ALU | RSH | K;
const ALU_RSH_X: u8 = ALU | RSH | X;
const ALU_ARSH_K: u8 = ALU | ARSH | K;
const ALU_ARSH_X: u8 = ALU | ARSH | X;
const ALU_NEG_K: u8 = ALU | NEG | K;
const ALU_MOV_K: u8 = ALU | MOV | K;
const ALU_MOV_X: u8 = ALU | MOV | X;
const ALU_END_K: u8 = ALU | END | K;
const ALU_END_X: u8 = ALU | END | X;
const JMP_JA: u8 = JMP | JA;
const JMP_JEQ_K: u8 = JMP | JEQ | K;
const JMP_JEQ_X: u8 = JMP | JEQ | X;
const JMP_JNE_K: u8 = JMP | JNE | K;
const JMP_JNE_X: u8 = JMP | JNE | X;
const JMP_JGT_K: u8 = JMP | JGT | K;
const JMP_JGT_X: u8 = JMP | JGT | X;
const JMP_JGE_K: u8 = JMP | JGE | K;
const JMP_JGE_X: u8 = JMP | JGE | X;
const JMP_JLT_K: u8 = JMP | JLT | K;
const JMP_JLT_X: u8 = JMP | JLT | X;
const JMP_JLE_K: u8 = JMP | JLE | K;
const JMP_JLE_X: u8 = JMP | JLE | X;
const JMP_JSET_K: u8 = JMP | JSET | K;
const JMP_JSET_X: u8 = JMP | JSET | X;
const JMP_JSGT_K: u8 = JMP | JSGT | K;
const JMP_JSGT_X: u8 = JMP | JSGT | X;
const JMP_JSGE_K: u8 = JMP | JSGE | K;
const JMP_JSGE_X: u8 = JMP | JSGE | X;
const JMP_JSLT_K: u8 = JMP | JSLT | K;
const JMP_JSLT_X: u8 = JMP | JSLT | X;
const JMP_JSLE_K: u8 = JMP | JSLE | K;
const JMP_JSLE_X: u8 = JMP | JSLE | X;
const JMP32_JA: u8 = JMP32 | JA;
const JMP32_JEQ_K: u8 = JMP32 | JEQ | K;
const JMP32_JEQ_X: u8 = JMP32 | JEQ | X;
const JMP32_JNE_K: u8 = JMP32 | JNE | K;
const JMP32_JNE_X: u8 = JMP32 | JNE | X;
const JMP32_JGT_K: u8 = JMP32 | JGT | K;
const JMP32_JGT_X: u8 = JMP32 | JGT | X;
const JMP32_JGE_K: u8 = JMP32 | JGE | K;
const JMP32_JGE_X: u8 = JMP32 | JGE | X;
const JMP32_JLT_K: u8 = JMP32 | JLT | K;
const JMP32_JLT_X: u8 = JMP32 | JLT | X;
const JMP32_JLE_K: u8 = JMP32 | JLE | K;
const JMP32_JLE_X: u8 = JMP32 | JLE | X;
const JMP32_JSET_K: u8 = JMP32 | JSET | K;
const JMP32_JSET_X: u8 = JMP32 | JSET | X;
const JMP32_JSGT_K: u8 = JMP32 | JSGT | K;
const JMP32_JSGT_X: u8 = JMP32 | JSGT | X;
const JMP32_JSGE_K: u8 = JMP32 | JSGE | K;
const JMP32_JSGE_X: u8 = JMP32 | JSGE | X;
const JMP32_JSLT_K: u8 = JMP32 | JSLT | K;
const JMP32_JSLT_X: u8 = JMP32 | JSLT | X;
const JMP32_JSLE_K: u8 = JMP32 | JSLE | K;
const JMP32_JSLE_X: u8 = JMP32 | JSLE | X;
const JMP_CALL_K: u8 = JMP | CALL | K;
const JMP_CALL_X: u8 = JMP | CALL | X;
const JMP_EXIT: u8 = JMP | EXIT;
const LD_IMM_DW: u8 = LD | IMM | DW;
const LDX_MEM_B: u8 = LDX | MEM | B;
const LDX_MEM_H: u8 = LDX | MEM | H;
const LDX_MEM_W: u8 = LDX | MEM | W;
const LDX_MEM_DW: u8 = LDX | MEM | DW;
const LDX_MEMSX_B: u8 = LDX | MEMSX | B;
const LDX_MEMSX_H: u8 = LDX | MEMSX | H;
const LDX_MEMSX_W: u8 = LDX | MEMSX | W;
const ST_MEM_B: u8 = ST | MEM | B;
const ST_MEM_H: u8 = ST | MEM | H;
const ST_MEM_W: u8 = ST | MEM | W;
const ST_MEM_DW: u8 = ST | MEM | DW;
const STX_MEM_B: u8 = STX | MEM | B;
const STX_MEM_H: u8 = STX | MEM | H;
const STX_MEM_W: u8 = STX | MEM | W;
const STX_MEM_DW: u8 = STX | MEM | DW;
const STX_ATOMIC_W: u8 = STX | ATOMIC | W;
const STX_ATOMIC_DW: u8 = STX | ATOMIC | DW;

/// An integer the interpreter moves to or from memory.
trait Word: Copy {
    fn to_u64(self) -> u64;
    fn from_u64(v: u64) -> Self;
}

macro_rules! word {
    ($($t:ty),*) => {$(
        impl Word for $t {
            #[inline(always)]
            fn to_u64(self) -> u64 {
                self as u64
            }
            #[inline(always)]
            fn from_u64(v: u64) -> Self {
                v as $t
            }
        }
    )*};
}
word!(u8, u16, u32, u64);

#[inline(always)]
fn load<T: Word, const CHECKED: bool>(
    g: &Guard<'_, CHECKED>,
    pc: usize,
    addr: u64,
) -> Result<u64, ExecError> {
    g.check(pc, addr, size_of::<T>(), Access::Load)?;
    // SAFETY: under a checked policy the guard just proved [addr, addr+size) lies in memory
    // the caller lent us or in the live stack; under an unchecked policy the caller of
    // `MemoryPolicy::unchecked` vouched for every access the program makes. Programs may
    // access memory unaligned, hence read_unaligned.
    Ok(unsafe { (addr as usize as *const T).read_unaligned() }.to_u64())
}

#[inline(always)]
fn store<T: Word, const CHECKED: bool>(
    g: &Guard<'_, CHECKED>,
    pc: usize,
    addr: u64,
    value: u64,
) -> Result<(), ExecError> {
    g.check(pc, addr, size_of::<T>(), Access::Store)?;
    // SAFETY: as in `load`, for a write.
    unsafe { (addr as usize as *mut T).write_unaligned(T::from_u64(value)) };
    Ok(())
}

fn atomic_access<const CHECKED: bool>(
    g: &Guard<'_, CHECKED>,
    pc: usize,
    addr: u64,
    len: usize,
) -> Result<(), ExecError> {
    // Checked even when unchecked: a misaligned atomic is undefined behaviour in Rust, and
    // atomics are rare enough that the test costs nothing.
    if !addr.is_multiple_of(len as u64) {
        return Err(ExecError::MisalignedAtomic { pc, addr, len });
    }
    g.check(pc, addr, len, Access::Atomic)
}

/// Applies an atomic read-modify-write; returns the new values of (src, r0).
fn atomic64<const CHECKED: bool>(
    g: &Guard<'_, CHECKED>,
    pc: usize,
    insn: Insn,
    addr: u64,
    src: u64,
    r0: u64,
) -> Result<(u64, u64), ExecError> {
    atomic_access(g, pc, addr, 8)?;
    // SAFETY: the address is 8-byte aligned (checked above) and valid for a read and a write,
    // by the guard or by the promise behind an unchecked policy; all concurrent access to it
    // from programs goes through atomics too.
    let a = unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) };
    let sc = Ordering::SeqCst;
    let old = match insn.imm & !FETCH {
        ATOMIC_ADD => a.fetch_add(src, sc),
        ATOMIC_OR => a.fetch_or(src, sc),
        ATOMIC_AND => a.fetch_and(src, sc),
        ATOMIC_XOR => a.fetch_xor(src, sc),
        _ if insn.imm == ATOMIC_XCHG => a.swap(src, sc),
        _ if insn.imm == ATOMIC_CMPXCHG => {
            let old = a.compare_exchange(r0, src, sc, sc).unwrap_or_else(|v| v);
            return Ok((src, old));
        }
        _ => return Err(bad_imm(pc, insn)),
    };
    Ok((if insn.imm & FETCH != 0 { old } else { src }, r0))
}

fn atomic32<const CHECKED: bool>(
    g: &Guard<'_, CHECKED>,
    pc: usize,
    insn: Insn,
    addr: u64,
    src: u64,
    r0: u64,
) -> Result<(u64, u64), ExecError> {
    atomic_access(g, pc, addr, 4)?;
    // SAFETY: as in `atomic64`, with 4-byte alignment.
    let a = unsafe { AtomicU32::from_ptr(addr as usize as *mut u32) };
    let sc = Ordering::SeqCst;
    let v = src as u32;
    let old = match insn.imm & !FETCH {
        ATOMIC_ADD => a.fetch_add(v, sc),
        ATOMIC_OR => a.fetch_or(v, sc),
        ATOMIC_AND => a.fetch_and(v, sc),
        ATOMIC_XOR => a.fetch_xor(v, sc),
        _ if insn.imm == ATOMIC_XCHG => a.swap(v, sc),
        _ if insn.imm == ATOMIC_CMPXCHG => {
            let old = a
                .compare_exchange(r0 as u32, v, sc, sc)
                .unwrap_or_else(|v| v);
            return Ok((src, old as u64));
        }
        _ => return Err(bad_imm(pc, insn)),
    };
    Ok((
        if insn.imm & FETCH != 0 {
            old as u64
        } else {
            src
        },
        r0,
    ))
}

#[cold]
fn bad_imm(pc: usize, insn: Insn) -> ExecError {
    ExecError::InvalidField {
        pc,
        code: insn.code,
        field: "imm",
        value: insn.imm as i64,
    }
}

#[cold]
fn bad_off(pc: usize, insn: Insn) -> ExecError {
    ExecError::InvalidField {
        pc,
        code: insn.code,
        field: "offset",
        value: insn.off as i64,
    }
}

/// The slot `delta` slots after `next` (the slot after the jump at `pc`), if it exists.
#[inline(always)]
fn jump_target(pc: usize, next: usize, delta: i64, len: usize) -> Result<usize, ExecError> {
    let target = next as i64 + delta;
    if (0..len as i64).contains(&target) {
        Ok(target as usize)
    } else {
        Err(ExecError::JumpOutOfRange { pc, target, len })
    }
}

#[inline(always)]
fn div<T>(a: T, b: T, signed: bool, udiv: fn(T, T) -> T, sdiv: fn(T, T) -> T) -> T
where
    T: Default + PartialEq,
{
    if b == T::default() {
        T::default()
    } else if signed {
        sdiv(a, b)
    } else {
        udiv(a, b)
    }
}

#[inline(always)]
fn rem<T>(a: T, b: T, signed: bool, urem: fn(T, T) -> T, srem: fn(T, T) -> T) -> T
where
    T: Default + PartialEq,
{
    if b == T::default() {
        a
    } else if signed {
        srem(a, b)
    } else {
        urem(a, b)
    }
}

/// Runs from `start` until its first frame exits; returns r0 and the budget left.
fn run<const CHECKED: bool, const BUDGET: bool>(
    start: Start<'_>,
    env: &dyn Environment,
    ranges: &[Range<u64>],
) -> Result<(u64, u64), ExecError> {
    let Start {
        prog: entry,
        pc: entry_pc,
        r1,
        r2,
        budget,
        full_budget,
        frames_above,
        tail_calls: first_tail_call,
    } = start;
    // Declared first so that it is dropped last: `prog` and the saved frames may point into
    // the programs it keeps alive.
    let mut tail_progs: Vec<Arc<[Insn]>> = Vec::new();

    // Only the frames in use are zeroed, so an unused frame costs nothing.
    let mut stack = MaybeUninit::<Stack>::uninit();
    let stack_base = stack.as_mut_ptr() as *mut u8;
    let stack_top = stack_base as usize as u64 + STACK_BYTES as u64;
    // SAFETY: the top frame lies inside `stack`, which we own.
    unsafe {
        stack_base
            .add(STACK_BYTES - STACK_SIZE)
            .write_bytes(0, STACK_SIZE)
    };

    let mut guard = Guard::<CHECKED> {
        ranges,
        stack: stack_top - STACK_SIZE as u64..stack_top,
    };

    let mut regs = [0u64; 16];
    regs[1] = r1;
    regs[2] = r2;
    regs[10] = stack_top;

    let mut frames = [Frame {
        prog: &[],
        ret_pc: 0,
        callee_saved: [0; 4],
    }; MAX_CALL_FRAMES];
    let mut depth = 0usize;
    let mut tail_calls = first_tail_call;
    let mut left = budget;

    let mut prog = entry;
    let mut next = entry_pc;
    loop {
        let pc = next;
        let Some(&insn) = prog.get(pc) else {
            return Err(ExecError::FellOffEnd {
                pc,
                len: prog.len(),
            });
        };
        if BUDGET {
            if left == 0 {
                return Err(ExecError::BudgetExceeded {
                    pc,
                    budget: full_budget,
                });
            }
            left -= 1;
        }
        next = pc + 1;
        // Registers 11-15 do not exist; the 16-entry file makes a bad index harmless
        // instead of a panic.
        let dst = (insn.dst & 0x0f) as usize;
        let src = (insn.src & 0x0f) as usize;
        let k64 = insn.imm as i64 as u64;
        let k32 = insn.imm as u32;
        let d = regs[dst];
        let d32 = d as u32;
        let x64 = regs[src];
        let x32 = x64 as u32;

        macro_rules! jump_if {
            ($cond:expr) => {
                if $cond {
                    next = jump_target(pc, next, insn.off as i64, prog.len())?;
                }
            };
        }
        macro_rules! addr {
            ($base:expr) => {
                $base.wrapping_add(insn.off as i64 as u64)
            };
        }
        macro_rules! divlike {
            () => {
                // off 1 selects the signed form (sdiv, smod); nothing else is defined.
                if !matches!(insn.off, 0 | 1) {
                    return Err(bad_off(pc, insn));
                }
            };
        }

        match insn.code {
            // ALU64.
            ALU64_ADD_K => regs[dst] = d.wrapping_add(k64),
            ALU64_ADD_X => regs[dst] = d.wrapping_add(x64),
            ALU64_SUB_K => regs[dst] = d.wrapping_sub(k64),
            ALU64_SUB_X => regs[dst] = d.wrapping_sub(x64),
            ALU64_MUL_K => regs[dst] = d.wrapping_mul(k64),
            ALU64_MUL_X => regs[dst] = d.wrapping_mul(x64),
            ALU64_DIV_K | ALU64_DIV_X => {
                divlike!();
                let b = if insn.code & X != 0 { x64 } else { k64 };
                regs[dst] = div(
                    d,
                    b,
                    insn.off == 1,
                    |a, b| a / b,
                    |a, b| (a as i64).wrapping_div(b as i64) as u64,
                );
            }
            ALU64_MOD_K | ALU64_MOD_X => {
                divlike!();
                let b = if insn.code & X != 0 { x64 } else { k64 };
                regs[dst] = rem(
                    d,
                    b,
                    insn.off == 1,
                    |a, b| a % b,
                    |a, b| (a as i64).wrapping_rem(b as i64) as u64,
                );
            }
            ALU64_OR_K => regs[dst] = d | k64,
            ALU64_OR_X => regs[dst] = d | x64,
            ALU64_AND_K => regs[dst] = d & k64,
            ALU64_AND_X => regs[dst] = d & x64,
            ALU64_XOR_K => regs[dst] = d ^ k64,
            ALU64_XOR_X => regs[dst] = d ^ x64,
            ALU64_LSH_K => regs[dst] = d << (k64 & 63),
            ALU64_LSH_X => regs[dst] = d << (x64 & 63),
            ALU64_RSH_K => regs[dst] = d >> (k64 & 63),
            ALU64_RSH_X => regs[dst] = d >> (x64 & 63),
            ALU64_ARSH_K => regs[dst] = ((d as i64) >> (k64 & 63)) as u64,
            ALU64_ARSH_X => regs[dst] = ((d as i64) >> (x64 & 63)) as u64,
            ALU64_NEG_K => regs[dst] = d.wrapping_neg(),
            ALU64_MOV_K => regs[dst] = k64,
            ALU64_MOV_X => {
                regs[dst] = match insn.off {
                    0 => x64,
                    8 => x64 as i8 as i64 as u64,
                    16 => x64 as i16 as i64 as u64,
                    32 => x64 as i32 as i64 as u64,
                    _ => return Err(bad_off(pc, insn)),
                }
            }
            ALU64_END_K => {
                regs[dst] = match insn.imm {
                    16 => (d as u16).swap_bytes() as u64,
                    32 => (d as u32).swap_bytes() as u64,
                    64 => d.swap_bytes(),
                    _ => return Err(bad_imm(pc, insn)),
                }
            }

            // ALU: 32-bit operands, result zero-extended.
            ALU_ADD_K => regs[dst] = d32.wrapping_add(k32) as u64,
            ALU_ADD_X => regs[dst] = d32.wrapping_add(x32) as u64,
            ALU_SUB_K => regs[dst] = d32.wrapping_sub(k32) as u64,
            ALU_SUB_X => regs[dst] = d32.wrapping_sub(x32) as u64,
            ALU_MUL_K => regs[dst] = d32.wrapping_mul(k32) as u64,
            ALU_MUL_X => regs[dst] = d32.wrapping_mul(x32) as u64,
            ALU_DIV_K | ALU_DIV_X => {
                divlike!();
                let b = if insn.code & X != 0 { x32 } else { k32 };
                regs[dst] = div(
                    d32,
                    b,
                    insn.off == 1,
                    |a, b| a / b,
                    |a, b| (a as i32).wrapping_div(b as i32) as u32,
                ) as u64;
            }
            ALU_MOD_K | ALU_MOD_X => {
                divlike!();
                let b = if insn.code & X != 0 { x32 } else { k32 };
                regs[dst] = rem(
                    d32,
                    b,
                    insn.off == 1,
                    |a, b| a % b,
                    |a, b| (a as i32).wrapping_rem(b as i32) as u32,
                ) as u64;
            }
            ALU_OR_K => regs[dst] = (d32 | k32) as u64,
            ALU_OR_X => regs[dst] = (d32 | x32) as u64,
            ALU_AND_K => regs[dst] = (d32 & k32) as u64,
            ALU_AND_X => regs[dst] = (d32 & x32) as u64,
            ALU_XOR_K => regs[dst] = (d32 ^ k32) as u64,
            ALU_XOR_X => regs[dst] = (d32 ^ x32) as u64,
            ALU_LSH_K => regs[dst] = (d32 << (k32 & 31)) as u64,
            ALU_LSH_X => regs[dst] = (d32 << (x32 & 31)) as u64,
            ALU_RSH_K => regs[dst] = (d32 >> (k32 & 31)) as u64,
            ALU_RSH_X => regs[dst] = (d32 >> (x32 & 31)) as u64,
            ALU_ARSH_K => regs[dst] = ((d32 as i32) >> (k32 & 31)) as u32 as u64,
            ALU_ARSH_X => regs[dst] = ((d32 as i32) >> (x32 & 31)) as u32 as u64,
            ALU_NEG_K => regs[dst] = d32.wrapping_neg() as u64,
            ALU_MOV_K => regs[dst] = k32 as u64,
            ALU_MOV_X => {
                regs[dst] = match insn.off {
                    0 => x32,
                    8 => x32 as i8 as i32 as u32,
                    16 => x32 as i16 as i32 as u32,
                    _ => return Err(bad_off(pc, insn)),
                } as u64
            }
            // Host-to-little-endian and host-to-big-endian conversions.
            ALU_END_K => {
                regs[dst] = match insn.imm {
                    16 => (d as u16).to_le() as u64,
                    32 => (d as u32).to_le() as u64,
                    64 => d.to_le(),
                    _ => return Err(bad_imm(pc, insn)),
                }
            }
            ALU_END_X => {
                regs[dst] = match insn.imm {
                    16 => (d as u16).to_be() as u64,
                    32 => (d as u32).to_be() as u64,
                    64 => d.to_be(),
                    _ => return Err(bad_imm(pc, insn)),
                }
            }

            // JMP: 64-bit comparisons, imm sign-extended.
            JMP_JA => next = jump_target(pc, next, insn.off as i64, prog.len())?,
            JMP_JEQ_K => jump_if!(d == k64),
            JMP_JEQ_X => jump_if!(d == x64),
            JMP_JNE_K => jump_if!(d != k64),
            JMP_JNE_X => jump_if!(d != x64),
            JMP_JGT_K => jump_if!(d > k64),
            JMP_JGT_X => jump_if!(d > x64),
            JMP_JGE_K => jump_if!(d >= k64),
            JMP_JGE_X => jump_if!(d >= x64),
            JMP_JLT_K => jump_if!(d < k64),
            JMP_JLT_X => jump_if!(d < x64),
            JMP_JLE_K => jump_if!(d <= k64),
            JMP_JLE_X => jump_if!(d <= x64),
            JMP_JSET_K => jump_if!(d & k64 != 0),
            JMP_JSET_X => jump_if!(d & x64 != 0),
            JMP_JSGT_K => jump_if!((d as i64) > (k64 as i64)),
            JMP_JSGT_X => jump_if!((d as i64) > (x64 as i64)),
            JMP_JSGE_K => jump_if!((d as i64) >= (k64 as i64)),
            JMP_JSGE_X => jump_if!((d as i64) >= (x64 as i64)),
            JMP_JSLT_K => jump_if!((d as i64) < (k64 as i64)),
            JMP_JSLT_X => jump_if!((d as i64) < (x64 as i64)),
            JMP_JSLE_K => jump_if!((d as i64) <= (k64 as i64)),
            JMP_JSLE_X => jump_if!((d as i64) <= (x64 as i64)),

            // JMP32: 32-bit comparisons; `gotol` keeps its 32-bit offset in imm.
            JMP32_JA => next = jump_target(pc, next, insn.imm as i64, prog.len())?,
            JMP32_JEQ_K => jump_if!(d32 == k32),
            JMP32_JEQ_X => jump_if!(d32 == x32),
            JMP32_JNE_K => jump_if!(d32 != k32),
            JMP32_JNE_X => jump_if!(d32 != x32),
            JMP32_JGT_K => jump_if!(d32 > k32),
            JMP32_JGT_X => jump_if!(d32 > x32),
            JMP32_JGE_K => jump_if!(d32 >= k32),
            JMP32_JGE_X => jump_if!(d32 >= x32),
            JMP32_JLT_K => jump_if!(d32 < k32),
            JMP32_JLT_X => jump_if!(d32 < x32),
            JMP32_JLE_K => jump_if!(d32 <= k32),
            JMP32_JLE_X => jump_if!(d32 <= x32),
            JMP32_JSET_K => jump_if!(d32 & k32 != 0),
            JMP32_JSET_X => jump_if!(d32 & x32 != 0),
            JMP32_JSGT_K => jump_if!((d32 as i32) > (k32 as i32)),
            JMP32_JSGT_X => jump_if!((d32 as i32) > (x32 as i32)),
            JMP32_JSGE_K => jump_if!((d32 as i32) >= (k32 as i32)),
            JMP32_JSGE_X => jump_if!((d32 as i32) >= (x32 as i32)),
            JMP32_JSLT_K => jump_if!((d32 as i32) < (k32 as i32)),
            JMP32_JSLT_X => jump_if!((d32 as i32) < (x32 as i32)),
            JMP32_JSLE_K => jump_if!((d32 as i32) <= (k32 as i32)),
            JMP32_JSLE_X => jump_if!((d32 as i32) <= (x32 as i32)),

            // Calls and exit.
            JMP_CALL_K => match insn.src {
                CALL_HELPER if insn.imm as u32 == helper::TAIL_CALL => {
                    let target = if tail_calls < MAX_TAIL_CALLS {
                        env.tail_call_target(regs[2], regs[3])
                    } else {
                        None
                    };
                    match target {
                        Some(p) => {
                            tail_calls += 1;
                            tail_progs.push(p);
                            let last: &[Insn] = tail_progs.last().map(|p| &**p).unwrap_or(&[]);
                            // SAFETY: the program lives in an `Arc` that `tail_progs` keeps
                            // alive, unmoved on the heap, until this function returns; `prog`
                            // and `frames` never outlive it.
                            prog = unsafe { &*(last as *const [Insn]) };
                            next = 0;
                        }
                        None => regs[0] = TAIL_CALL_FAILED,
                    }
                }
                CALL_HELPER if insn.imm as u32 == helper::LOOP => {
                    let outer = Outer {
                        prog,
                        pc,
                        frames: frames_above + depth + 1,
                        full_budget,
                    };
                    regs[0] = bpf_loop::<CHECKED, BUDGET>(&outer, &regs, env, &guard, &mut left)?;
                }
                CALL_HELPER => {
                    let id = insn.imm as u32;
                    regs[0] = call_helper(env, pc, id as u64, &regs)?;
                }
                CALL_PSEUDO => {
                    let target = jump_target(pc, next, insn.imm as i64, prog.len())?;
                    if frames_above + depth + 1 >= MAX_CALL_FRAMES {
                        return Err(ExecError::CallDepthExceeded {
                            pc,
                            max: MAX_CALL_FRAMES,
                        });
                    }
                    frames[depth] = Frame {
                        prog,
                        ret_pc: next,
                        callee_saved: [regs[6], regs[7], regs[8], regs[9]],
                    };
                    depth += 1;
                    let bottom = STACK_BYTES - (depth + 1) * STACK_SIZE;
                    // SAFETY: depth < MAX_CALL_FRAMES, so the new frame lies inside `stack`.
                    unsafe { stack_base.add(bottom).write_bytes(0, STACK_SIZE) };
                    regs[10] = stack_base as usize as u64 + (bottom + STACK_SIZE) as u64;
                    guard.stack.start = stack_base as usize as u64 + bottom as u64;
                    next = target;
                }
                other => return Err(ExecError::UnsupportedCall { pc, src: other }),
            },
            JMP_CALL_X => {
                // LLVM names the register in dst; older encoders put it in imm.
                let reg = if dst != 0 {
                    dst
                } else {
                    (insn.imm & 0x0f) as usize
                };
                regs[0] = if regs[reg] == u64::from(helper::LOOP) {
                    let outer = Outer {
                        prog,
                        pc,
                        frames: frames_above + depth + 1,
                        full_budget,
                    };
                    bpf_loop::<CHECKED, BUDGET>(&outer, &regs, env, &guard, &mut left)?
                } else {
                    call_helper(env, pc, regs[reg], &regs)?
                };
            }
            JMP_EXIT => {
                if depth == 0 {
                    return Ok((regs[0], left));
                }
                depth -= 1;
                let f = frames[depth];
                [regs[6], regs[7], regs[8], regs[9]] = f.callee_saved;
                regs[10] += STACK_SIZE as u64;
                guard.stack.start += STACK_SIZE as u64;
                prog = f.prog;
                next = f.ret_pc;
            }

            // 64-bit immediate load: the second slot holds the upper half.
            LD_IMM_DW => {
                let Some(hi) = prog.get(next) else {
                    return Err(ExecError::IncompleteLddw { pc });
                };
                regs[dst] = if insn.src == PSEUDO_FUNC {
                    // A callback: the slot it starts at in this program, which `bpf_loop`
                    // runs from.
                    (pc as i64 + 1 + insn.imm as i64) as u64
                } else {
                    (insn.imm as u32 as u64) | ((hi.imm as u32 as u64) << 32)
                };
                next += 1;
            }

            // Loads.
            LDX_MEM_B => regs[dst] = load::<u8, CHECKED>(&guard, pc, addr!(x64))?,
            LDX_MEM_H => regs[dst] = load::<u16, CHECKED>(&guard, pc, addr!(x64))?,
            LDX_MEM_W => regs[dst] = load::<u32, CHECKED>(&guard, pc, addr!(x64))?,
            LDX_MEM_DW => regs[dst] = load::<u64, CHECKED>(&guard, pc, addr!(x64))?,
            LDX_MEMSX_B => {
                regs[dst] = load::<u8, CHECKED>(&guard, pc, addr!(x64))? as i8 as i64 as u64
            }
            LDX_MEMSX_H => {
                regs[dst] = load::<u16, CHECKED>(&guard, pc, addr!(x64))? as i16 as i64 as u64
            }
            LDX_MEMSX_W => {
                regs[dst] = load::<u32, CHECKED>(&guard, pc, addr!(x64))? as i32 as i64 as u64
            }

            // Stores.
            ST_MEM_B => store::<u8, CHECKED>(&guard, pc, addr!(d), k64)?,
            ST_MEM_H => store::<u16, CHECKED>(&guard, pc, addr!(d), k64)?,
            ST_MEM_W => store::<u32, CHECKED>(&guard, pc, addr!(d), k64)?,
            ST_MEM_DW => store::<u64, CHECKED>(&guard, pc, addr!(d), k64)?,
            STX_MEM_B => store::<u8, CHECKED>(&guard, pc, addr!(d), x64)?,
            STX_MEM_H => store::<u16, CHECKED>(&guard, pc, addr!(d), x64)?,
            STX_MEM_W => store::<u32, CHECKED>(&guard, pc, addr!(d), x64)?,
            STX_MEM_DW => store::<u64, CHECKED>(&guard, pc, addr!(d), x64)?,

            // Atomics.
            STX_ATOMIC_W => {
                let (fetched, r0) = atomic32(&guard, pc, insn, addr!(d), x64, regs[0])?;
                // Only one register changes, even when the source is r0 itself.
                if insn.imm == ATOMIC_CMPXCHG {
                    regs[0] = r0;
                } else {
                    regs[src] = fetched;
                }
            }
            STX_ATOMIC_DW => {
                let (fetched, r0) = atomic64(&guard, pc, insn, addr!(d), x64, regs[0])?;
                // Only one register changes, even when the source is r0 itself.
                if insn.imm == ATOMIC_CMPXCHG {
                    regs[0] = r0;
                } else {
                    regs[src] = fetched;
                }
            }

            code => return Err(ExecError::UnknownOpcode { pc, code }),
        }
    }
}

/// The program a `bpf_loop` call is made from.
struct Outer<'p> {
    prog: &'p [Insn],
    pc: usize,
    /// Frames in use, counting the caller's.
    frames: usize,
    full_budget: u64,
}

/// `bpf_loop(nr_loops, callback, ctx, flags)`: runs the callback subprogram (r2 holds
/// the slot an `lddw rX, func` gave it) with (index, ctx) until it returns non-zero or
/// `nr_loops` calls are done; returns the calls made, or a negative errno as the kernel
/// does. Each call runs on its own stack frames below the caller's, and sees the caller's
/// live stack (where ctx usually points) under a checked policy.
fn bpf_loop<const CHECKED: bool, const BUDGET: bool>(
    outer: &Outer<'_>,
    regs: &[u64; 16],
    env: &dyn Environment,
    guard: &Guard<'_, CHECKED>,
    left: &mut u64,
) -> Result<u64, ExecError> {
    let n = match bpftime_isa::helpers::loop_iterations(regs[1], regs[4]) {
        Ok(n) => n,
        Err(errno) => return Ok(-(i64::from(errno)) as u64),
    };
    if n == 0 {
        return Ok(0);
    }
    let pc = outer.pc;
    let target = usize::try_from(regs[2])
        .ok()
        .filter(|&t| t < outer.prog.len())
        .ok_or(ExecError::BadCallback { pc, value: regs[2] })?;
    if outer.frames >= MAX_CALL_FRAMES {
        return Err(ExecError::CallDepthExceeded {
            pc,
            max: MAX_CALL_FRAMES,
        });
    }
    let ranges: Vec<Range<u64>> = if CHECKED {
        guard
            .ranges
            .iter()
            .cloned()
            .chain([guard.stack.clone()])
            .collect()
    } else {
        Vec::new()
    };
    for i in 0..n {
        let start = Start {
            prog: outer.prog,
            pc: target,
            r1: u64::from(i),
            r2: regs[3],
            budget: *left,
            full_budget: outer.full_budget,
            frames_above: outer.frames,
            // A callback starts its tail-call chain at the limit, as the JIT's do: a
            // tail call inside it falls through.
            tail_calls: MAX_TAIL_CALLS,
        };
        let (r0, l) = run::<CHECKED, BUDGET>(start, env, &ranges)?;
        *left = l;
        if r0 != 0 {
            return Ok(u64::from(i) + 1);
        }
    }
    Ok(u64::from(n))
}

fn call_helper(
    env: &dyn Environment,
    pc: usize,
    id: u64,
    regs: &[u64; 16],
) -> Result<u64, ExecError> {
    let f = u32::try_from(id)
        .ok()
        .and_then(|id| env.helper(id))
        .ok_or(ExecError::UnknownHelper { pc, id })?;
    // SAFETY: `Environment` is an unsafe trait whose implementors vouch that their helpers
    // are sound for any arguments under the policy in use.
    Ok(unsafe { f(regs[1], regs[2], regs[3], regs[4], regs[5]) })
}
