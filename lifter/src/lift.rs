use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

use bpftime_isa::opcode as op;
use bpftime_isa::uapi::{helper, update_flags, MAX_TAIL_CALLS, STACK_SIZE};

/// Linux's errno values that inlined map updates return negated.
const E2BIG: u64 = 7;
const EEXIST: u64 = 17;
use bpftime_isa::Insn;
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::basic_block::BasicBlock;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{FunctionType, IntType, StructType};
use inkwell::values::{
    BasicMetadataValueEnum, BasicValue, CallSiteValue, FunctionValue, IntValue, PointerValue,
};
use inkwell::{AtomicOrdering, AtomicRMWBinOp, IntPredicate};
use tracing::debug;

use crate::target::{ArrayMapLayout, CpuNumber, CpuSlotTable, HelperLowering, LoweringTarget};
use crate::LiftError;

type Result<T> = std::result::Result<T, LiftError>;

/// `-ENOENT`, what a failed tail call leaves in r0, as the kernel's helper documents.
const TAIL_CALL_FAILED: u64 = (-2i64) as u64;

/// A lifted program: one LLVM module holding the entry function and one internal
/// function per bpf-to-bpf subprogram.
pub struct Lifted<'ctx> {
    pub module: Module<'ctx>,
    pub entry: FunctionValue<'ctx>,
    /// Calls out of the program other than those on the slow paths of inlined map
    /// operations made through [`LoweringTarget::slow_path_call_wrapper`]: helper calls,
    /// `callx` dispatches and tail calls. 0 means the program's own code is all there is
    /// to look at to know what it touches.
    pub plain_calls: usize,
}

impl std::fmt::Debug for Lifted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifted")
            .field("module", &self.module.get_name())
            .field("entry", &self.entry.get_name())
            .field("plain_calls", &self.plain_calls)
            .finish()
    }
}

/// Lifts `insns` into a new module in `context`.
///
/// The module has no triple or data layout; the backend sets both before optimizing.
pub fn lift<'ctx>(
    context: &'ctx Context,
    insns: &[Insn],
    target: &dyn LoweringTarget,
) -> Result<Lifted<'ctx>> {
    if insns.is_empty() {
        return Err(LiftError::Empty);
    }
    let starts = function_starts(insns)?;
    let module = context.create_module("bpf");
    let i64t = context.i64_type();
    let entry_ty = i64t.fn_type(&[i64t.into(); 3], false);
    let sub_ty = i64t.fn_type(&[i64t.into(); 6], false);

    // Declare every function first: calls may point forwards.
    let mut functions = BTreeMap::new();
    for (i, &start) in starts.iter().enumerate() {
        let f = if i == 0 && target.cpu_slots().is_some() {
            // The entry proper takes a CPU slot, then calls this.
            module.add_function("bpf_body", entry_ty, Some(Linkage::Internal))
        } else if i == 0 {
            module.add_function(target.entry_name(), entry_ty, Some(Linkage::External))
        } else {
            module.add_function(&format!("bpf_sub_{start}"), sub_ty, Some(Linkage::Internal))
        };
        // eBPF code never unwinds; saying so spares every backend unwind tables.
        let nounwind = Attribute::get_named_enum_kind_id("nounwind");
        f.add_attribute(
            AttributeLoc::Function,
            context.create_enum_attribute(nounwind, 0),
        );
        functions.insert(start, f);
    }

    let lifter = Lifter {
        context,
        module: &module,
        builder: context.create_builder(),
        insns,
        target,
        functions: &functions,
        i64t,
        helper_ty: i64t.fn_type(&[i64t.into(); 5], false),
        entry_ty,
        stack_ty: context.struct_type(&vec![context.i8_type().into(); STACK_SIZE], true),
        plain_calls: Cell::new(0),
    };
    for (i, &start) in starts.iter().enumerate() {
        let end = starts.get(i + 1).copied().unwrap_or(insns.len());
        lifter.lift_function(start, end, i == 0)?;
    }
    let entry = match target.cpu_slots() {
        Some(slots) => lifter.slot_taking_entry(functions[&0], &slots)?,
        None => functions[&0],
    };
    module.verify().map_err(|e| LiftError::InvalidIr {
        message: e.to_string(),
    })?;
    debug!(
        insns = insns.len(),
        functions = starts.len(),
        "lifted program"
    );
    let plain_calls = lifter.plain_calls.get();
    drop(lifter);
    Ok(Lifted {
        module,
        entry,
        plain_calls,
    })
}

/// Runs an LLVM new-pass-manager pipeline (`"default<O2>"`, say) over a lifted module
/// whose triple and data layout the backend has set.
pub fn optimize(
    module: &Module<'_>,
    machine: &inkwell::targets::TargetMachine,
    pipeline: &str,
) -> Result<()> {
    module
        .run_passes(
            pipeline,
            machine,
            inkwell::passes::PassBuilderOptions::create(),
        )
        .map_err(|e| LiftError::Passes {
            pipeline: pipeline.to_owned(),
            message: e.to_string(),
        })
}

fn is_pseudo_call(i: &Insn) -> bool {
    i.code == op::CALL_INSN && i.src == op::CALL_PSEUDO
}

/// Whether `i` is `lddw rX, func`: the address of a callback subprogram.
fn is_func_address(i: &Insn) -> bool {
    i.is_lddw() && i.src == op::PSEUDO_FUNC
}

/// Slot indices where functions begin: 0, every bpf-to-bpf call target and every
/// callback (`lddw rX, func`) target.
fn function_starts(insns: &[Insn]) -> Result<Vec<usize>> {
    let mut starts = BTreeSet::from([0usize]);
    for (pc, i) in insns.iter().enumerate() {
        if is_func_address(i) {
            let target = pc as i64 + 1 + i64::from(i.imm);
            // The entry has another signature than a callback's: it cannot be one.
            if target <= 0 || target >= insns.len() as i64 {
                return Err(LiftError::CallOutOfRange { pc, target });
            }
            starts.insert(target as usize);
        }
        if is_pseudo_call(i) {
            let target = pc as i64 + 1 + i64::from(i.imm);
            if target < 0 || target >= insns.len() as i64 {
                return Err(LiftError::CallOutOfRange { pc, target });
            }
            starts.insert(target as usize);
        }
    }
    Ok(starts.into_iter().collect())
}

struct Lifter<'a, 'ctx> {
    context: &'ctx Context,
    module: &'a Module<'ctx>,
    builder: Builder<'ctx>,
    insns: &'a [Insn],
    target: &'a dyn LoweringTarget,
    functions: &'a BTreeMap<usize, FunctionValue<'ctx>>,
    i64t: IntType<'ctx>,
    helper_ty: FunctionType<'ctx>,
    entry_ty: FunctionType<'ctx>,
    /// A packed struct of single bytes: field `k` is byte `k`, so frame accesses become
    /// constant struct GEPs that SROA can split, without unchecked pointer arithmetic.
    stack_ty: StructType<'ctx>,
    /// See [`Lifted::plain_calls`].
    plain_calls: Cell<usize>,
}

/// How one memory access is emitted.
#[derive(Clone, Copy)]
enum Emit {
    /// One access, claiming this alignment.
    Whole(u32),
    /// One access per byte.
    Bytes,
}

/// Per-function state.
struct Frame<'ctx> {
    function: FunctionValue<'ctx>,
    regs: [PointerValue<'ctx>; 11],
    stack: PointerValue<'ctx>,
    tail_depth: IntValue<'ctx>,
    blocks: BTreeMap<usize, BasicBlock<'ctx>>,
    start: usize,
    end: usize,
    /// The constant an `lddw` left in r1 earlier in this basic block, if nothing has
    /// overwritten it since: the map a helper call is about to use.
    known_r1: Cell<Option<u64>>,
}

impl<'ctx> Lifter<'_, 'ctx> {
    fn lift_function(&self, start: usize, end: usize, is_entry: bool) -> Result<()> {
        let function = self.functions[&start];
        let b = &self.builder;
        let prologue = self.context.append_basic_block(function, "prologue");
        b.position_at_end(prologue);

        // Allocated as i64 words for 8-byte alignment; accessed through `stack_ty`.
        let words = self.i64t.array_type((STACK_SIZE / 8) as u32);
        let stack = b.build_alloca(words, "stack")?;
        // Frame-pointer accesses claim alignment from their offset (see `address`).
        if let Some(alloca) = stack.as_instruction() {
            let _ = alloca.set_alignment(8);
        }
        let mut regs = [stack; 11];
        for (r, slot) in regs.iter_mut().enumerate() {
            *slot = b.build_alloca(self.i64t, &format!("r{r}"))?;
        }

        let params = function.get_params();
        let nargs = if is_entry { 2 } else { 5 };
        let zero = self.i64t.const_zero();
        for r in 0..10 {
            let v = if (1..=nargs).contains(&r) {
                params[r - 1].into_int_value()
            } else {
                // Never read by verified code; zero keeps the IR free of undef.
                zero
            };
            b.build_store(regs[r], v)?;
        }
        let fp = b.build_ptr_to_int(stack, self.i64t, "fp_base")?;
        let fp = b.build_int_add(fp, self.i64t.const_int(STACK_SIZE as u64, false), "fp")?;
        b.build_store(regs[10], fp)?;
        let tail_depth = params[nargs].into_int_value();

        let mut frame = Frame {
            function,
            regs,
            stack,
            tail_depth,
            blocks: BTreeMap::new(),
            start,
            end,
            known_r1: Cell::new(None),
        };
        for leader in self.leaders(start, end)? {
            let bb = self
                .context
                .append_basic_block(function, &format!("pc{leader}"));
            frame.blocks.insert(leader, bb);
        }
        b.build_unconditional_branch(frame.blocks[&start])?;

        let mut pc = start;
        let mut open = false;
        while pc < end {
            if let Some(&bb) = frame.blocks.get(&pc) {
                if open {
                    b.build_unconditional_branch(bb)?;
                }
                b.position_at_end(bb);
                open = true;
                frame.known_r1.set(None);
            }
            let insn = self.insns[pc];
            let (next, terminated) = self.lift_insn(&frame, pc, &insn)?;
            frame.known_r1.set(if insn.is_lddw() && insn.dst == 1 {
                Some(u64::from(insn.imm as u32) | u64::from(self.insns[pc + 1].imm as u32) << 32)
            } else if writes_r1(&insn) {
                None
            } else {
                frame.known_r1.get()
            });
            if terminated {
                open = false;
            }
            pc = next;
        }
        if open {
            return Err(LiftError::FallsOffEnd { start, end });
        }
        Ok(())
    }

    /// Slots that begin a basic block: the function start, every jump target and
    /// whatever follows a jump or an exit.
    fn leaders(&self, start: usize, end: usize) -> Result<BTreeSet<usize>> {
        let mut leaders = BTreeSet::from([start]);
        let mut lddw_tails = BTreeSet::new();
        let mut pc = start;
        while pc < end {
            let i = &self.insns[pc];
            if i.is_lddw() {
                if pc + 1 >= self.insns.len() {
                    return Err(LiftError::TruncatedLddw { pc });
                }
                lddw_tails.insert(pc + 1);
                pc += 2;
                continue;
            }
            let class = i.class();
            if class == op::JMP || class == op::JMP32 {
                let o = i.code & op::OP_MASK;
                if o == op::EXIT {
                    if pc + 1 < end {
                        leaders.insert(pc + 1);
                    }
                } else if o != op::CALL {
                    let t = self.jump_target(pc, i, start, end)?;
                    leaders.insert(t);
                    if pc + 1 < end {
                        leaders.insert(pc + 1);
                    }
                }
            }
            pc += 1;
        }
        if let Some(&pc) = leaders.intersection(&lddw_tails).next() {
            return Err(LiftError::JumpIntoLddw { pc });
        }
        Ok(leaders)
    }

    fn jump_target(&self, pc: usize, i: &Insn, start: usize, end: usize) -> Result<usize> {
        // `gotol` (JMP32 | JA) carries its 32-bit offset in imm.
        let off = if i.class() == op::JMP32 && i.code & op::OP_MASK == op::JA {
            i64::from(i.imm)
        } else {
            i64::from(i.off)
        };
        let target = pc as i64 + 1 + off;
        if target < start as i64 || target >= end as i64 {
            return Err(LiftError::JumpOutOfRange {
                pc,
                target,
                start,
                end,
            });
        }
        Ok(target as usize)
    }

    fn reg(&self, f: &Frame<'ctx>, pc: usize, r: u8) -> Result<PointerValue<'ctx>> {
        f.regs
            .get(usize::from(r))
            .copied()
            .ok_or(LiftError::InvalidRegister { pc, reg: r })
    }

    fn read(&self, f: &Frame<'ctx>, pc: usize, r: u8) -> Result<IntValue<'ctx>> {
        let p = self.reg(f, pc, r)?;
        Ok(self
            .builder
            .build_load(self.i64t, p, &format!("r{r}"))?
            .into_int_value())
    }

    fn write(&self, f: &Frame<'ctx>, pc: usize, r: u8, v: IntValue<'ctx>) -> Result<()> {
        if r == 10 {
            return Err(LiftError::WriteToFramePointer { pc });
        }
        let p = self.reg(f, pc, r)?;
        let v = if v.get_type().get_bit_width() < 64 {
            self.builder.build_int_z_extend(v, self.i64t, "zext")?
        } else {
            v
        };
        self.builder.build_store(p, v)?;
        Ok(())
    }

    fn int(&self, bits: u32) -> IntType<'ctx> {
        match bits {
            8 => self.context.i8_type(),
            16 => self.context.i16_type(),
            32 => self.context.i32_type(),
            _ => self.i64t,
        }
    }

    /// Lifts one instruction; returns the next pc and whether the block ended.
    fn lift_insn(&self, f: &Frame<'ctx>, pc: usize, i: &Insn) -> Result<(usize, bool)> {
        let unsupported = LiftError::UnsupportedOpcode { pc, code: i.code };
        match i.class() {
            op::ALU | op::ALU64 => self.alu(f, pc, i).map(|()| (pc + 1, false)),
            op::JMP | op::JMP32 => self.jump(f, pc, i).map(|t| (pc + 1, t)),
            op::LD if is_func_address(i) => {
                // The callback's compiled function, which `bpf_loop` (a runtime helper)
                // calls with the subprogram signature.
                let target = (pc as i64 + 1 + i64::from(i.imm)) as usize;
                let callee = self.functions[&target];
                let v = self.builder.build_ptr_to_int(
                    callee.as_global_value().as_pointer_value(),
                    self.i64t,
                    "callback",
                )?;
                self.write(f, pc, i.dst, v)?;
                Ok((pc + 2, false))
            }
            op::LD if i.is_lddw() => {
                let hi = self.insns[pc + 1].imm as u32;
                let v = u64::from(i.imm as u32) | (u64::from(hi) << 32);
                self.write(f, pc, i.dst, self.i64t.const_int(v, false))?;
                Ok((pc + 2, false))
            }
            op::LDX => {
                let mode = i.code & op::MODE_MASK;
                if mode != op::MEM && mode != op::MEMSX {
                    return Err(unsupported);
                }
                let bits = op::size_bytes(i.code) as u32 * 8;
                let (ptr, align) = self.address(f, pc, i.src, i.off, bits)?;
                let v = self.load(f, ptr, align, bits)?;
                let v = if mode == op::MEMSX {
                    self.builder
                        .build_int_s_extend_or_bit_cast(v, self.i64t, "sx")?
                } else {
                    v
                };
                self.write(f, pc, i.dst, v)?;
                Ok((pc + 1, false))
            }
            op::ST | op::STX => {
                let mode = i.code & op::MODE_MASK;
                let bits = op::size_bytes(i.code) as u32 * 8;
                let ty = self.int(bits);
                if mode == op::ATOMIC && i.class() == op::STX && (bits == 32 || bits == 64) {
                    self.atomic(f, pc, i, bits)?;
                    return Ok((pc + 1, false));
                }
                if mode != op::MEM {
                    return Err(unsupported);
                }
                let v = if i.class() == op::ST {
                    ty.const_int(i64::from(i.imm) as u64, false)
                } else {
                    let v = self.read(f, pc, i.src)?;
                    self.builder.build_int_truncate_or_bit_cast(v, ty, "st")?
                };
                let (ptr, align) = self.address(f, pc, i.dst, i.off, bits)?;
                self.store(f, ptr, align, v)?;
                Ok((pc + 1, false))
            }
            _ => Err(unsupported),
        }
    }

    /// The pointer for `[base + off]`, and its alignment where it is known. Frame-pointer
    /// accesses index the stack alloca directly so the optimizer can keep stack slots in
    /// registers, and their alignment follows from the offset; everything else goes
    /// through an integer-to-pointer cast, as eBPF pointers are plain integers.
    fn address(
        &self,
        f: &Frame<'ctx>,
        pc: usize,
        base: u8,
        off: i16,
        bits: u32,
    ) -> Result<(PointerValue<'ctx>, Option<u32>)> {
        let b = &self.builder;
        if base == 10 {
            let slot = STACK_SIZE as i64 + i64::from(off);
            let size = i64::from(bits / 8);
            if slot >= 0 && slot + size <= STACK_SIZE as i64 {
                let ptr = b.build_struct_gep(self.stack_ty, f.stack, slot as u32, "slot")?;
                // The largest power of two dividing the slot, up to the frame's own
                // alignment and the access size: what the offset alone guarantees.
                let align = (1u32 << (slot as u32).trailing_zeros().min(3)).min(bits / 8);
                return Ok((ptr, Some(align)));
            }
        }
        let v = self.read(f, pc, base)?;
        let addr = b.build_int_add(v, self.i64t.const_int(i64::from(off) as u64, true), "addr")?;
        let pty = self.context.ptr_type(self.target.memory_address_space());
        Ok((b.build_int_to_ptr(addr, pty, "ptr")?, None))
    }

    /// Emits `access` for a `bits`-wide access at `ptr`: as one access claiming the
    /// alignment `known` (from the stack offset), else as one access of alignment 1 on
    /// targets that take them; on targets that [split misaligned
    /// accesses](LoweringTarget::split_misaligned_access), behind a test of the
    /// address's low bits, as one naturally aligned access or byte by byte. Returns the
    /// value of each emitted access, joined.
    fn with_alignment(
        &self,
        f: &Frame<'ctx>,
        ptr: PointerValue<'ctx>,
        known: Option<u32>,
        bits: u32,
        access: impl Fn(Emit) -> Result<Option<IntValue<'ctx>>>,
    ) -> Result<Option<IntValue<'ctx>>> {
        let size = bits / 8;
        if size == 1 {
            return access(Emit::Whole(1));
        }
        if let Some(align) = known {
            return access(Emit::Whole(align.min(size)));
        }
        if !self.target.split_misaligned_access() {
            return access(Emit::Whole(1));
        }
        let b = &self.builder;
        let addr = b.build_ptr_to_int(ptr, self.i64t, "addr")?;
        let low = b.build_and(addr, self.i64t.const_int(u64::from(size - 1), false), "low")?;
        let aligned =
            b.build_int_compare(IntPredicate::EQ, low, self.i64t.const_zero(), "aligned")?;
        let whole = self.context.append_basic_block(f.function, "aligned");
        let split = self.context.append_basic_block(f.function, "misaligned");
        let join = self.context.append_basic_block(f.function, "accessed");
        b.build_conditional_branch(aligned, whole, split)?;
        b.position_at_end(whole);
        let fast = access(Emit::Whole(size))?;
        b.build_unconditional_branch(join)?;
        b.position_at_end(split);
        // Spelled out byte by byte: an align-1 access would be merged with the aligned
        // path's, which is the same instruction but for its alignment.
        let slow = access(Emit::Bytes)?;
        b.build_unconditional_branch(join)?;
        b.position_at_end(join);
        Ok(match (fast, slow) {
            (Some(fast), Some(slow)) => {
                let phi = b.build_phi(fast.get_type(), "loaded")?;
                phi.add_incoming(&[(&fast, whole), (&slow, split)]);
                Some(phi.as_basic_value().into_int_value())
            }
            _ => None,
        })
    }

    /// A `bits`-wide load from `ptr`, as one access where it is known aligned.
    fn load(
        &self,
        f: &Frame<'ctx>,
        ptr: PointerValue<'ctx>,
        known: Option<u32>,
        bits: u32,
    ) -> Result<IntValue<'ctx>> {
        let ty = self.int(bits);
        let b = &self.builder;
        let v = self.with_alignment(f, ptr, known, bits, |emit| {
            let Emit::Whole(align) = emit else {
                let i8t = self.context.i8_type();
                let mut v = ty.const_zero();
                for k in 0..bits / 8 {
                    let at = self.byte_at(ptr, k)?;
                    let byte = b.build_load(i8t, at, "byte")?.into_int_value();
                    let byte = b.build_int_z_extend(byte, ty, "byte_ext")?;
                    let byte =
                        b.build_left_shift(byte, ty.const_int(u64::from(k * 8), false), "")?;
                    v = b.build_or(v, byte, "bytes")?;
                }
                return Ok(Some(v));
            };
            let v = b.build_load(ty, ptr, "ld")?.into_int_value();
            set_alignment(v.as_instruction_value(), align);
            Ok(Some(v))
        })?;
        v.ok_or_else(|| LiftError::InvalidIr {
            message: "a load produced no value".into(),
        })
    }

    /// A store of `v` (already of the access's width) to `ptr`, as one access where it
    /// is known aligned.
    fn store(
        &self,
        f: &Frame<'ctx>,
        ptr: PointerValue<'ctx>,
        known: Option<u32>,
        v: IntValue<'ctx>,
    ) -> Result<()> {
        let bits = v.get_type().get_bit_width();
        let b = &self.builder;
        self.with_alignment(f, ptr, known, bits, |emit| {
            let Emit::Whole(align) = emit else {
                let i8t = self.context.i8_type();
                for k in 0..bits / 8 {
                    let at = self.byte_at(ptr, k)?;
                    let shift = v.get_type().const_int(u64::from(k * 8), false);
                    let shifted = b.build_right_shift(v, shift, false, "")?;
                    let byte = b.build_int_truncate(shifted, i8t, "byte")?;
                    b.build_store(at, byte)?;
                }
                return Ok(None);
            };
            let s = b.build_store(ptr, v)?;
            set_alignment(Some(s), align);
            Ok(None)
        })?;
        Ok(())
    }

    /// `ptr + k`, computed on the integer address as every eBPF pointer is.
    fn byte_at(&self, ptr: PointerValue<'ctx>, k: u32) -> Result<PointerValue<'ctx>> {
        let b = &self.builder;
        let addr = b.build_ptr_to_int(ptr, self.i64t, "addr")?;
        let addr = b.build_int_add(addr, self.i64t.const_int(u64::from(k), false), "byte_addr")?;
        Ok(b.build_int_to_ptr(addr, ptr.get_type(), "byte_at")?)
    }

    fn atomic(&self, f: &Frame<'ctx>, pc: usize, i: &Insn, bits: u32) -> Result<()> {
        let b = &self.builder;
        let ty = self.int(bits);
        // The verifier requires atomics to be aligned.
        let (ptr, _) = self.address(f, pc, i.dst, i.off, bits)?;
        let src = self.read(f, pc, i.src)?;
        let src = b.build_int_truncate_or_bit_cast(src, ty, "src")?;
        let seq = AtomicOrdering::SequentiallyConsistent;
        if i.imm == op::ATOMIC_CMPXCHG {
            let r0 = self.read(f, pc, 0)?;
            let expected = b.build_int_truncate_or_bit_cast(r0, ty, "expected")?;
            let pair = b.build_cmpxchg(ptr, expected, src, seq, seq)?;
            let old = b.build_extract_value(pair, 0, "old")?.into_int_value();
            return self.write(f, pc, 0, old);
        }
        let rmw = match i.imm & !op::FETCH {
            op::ATOMIC_ADD => AtomicRMWBinOp::Add,
            op::ATOMIC_OR => AtomicRMWBinOp::Or,
            op::ATOMIC_AND => AtomicRMWBinOp::And,
            op::ATOMIC_XOR => AtomicRMWBinOp::Xor,
            _ if i.imm == op::ATOMIC_XCHG => AtomicRMWBinOp::Xchg,
            _ => return Err(LiftError::UnsupportedOpcode { pc, code: i.code }),
        };
        let old = b.build_atomicrmw(rmw, ptr, src, seq)?;
        if i.imm & op::FETCH != 0 {
            self.write(f, pc, i.src, old)?;
        }
        Ok(())
    }

    fn alu(&self, f: &Frame<'ctx>, pc: usize, i: &Insn) -> Result<()> {
        let b = &self.builder;
        let is64 = i.class() == op::ALU64;
        let bits = if is64 { 64 } else { 32 };
        let ty = self.int(bits);
        let operation = i.code & op::OP_MASK;
        let from_reg = i.code & op::SRC_MASK == op::X;

        if operation == op::END {
            return self.byte_swap(f, pc, i);
        }
        if operation == op::NEG && from_reg {
            return Err(LiftError::UnsupportedOpcode { pc, code: i.code });
        }
        let dst64 = self.read(f, pc, i.dst)?;
        let dst = b.build_int_truncate_or_bit_cast(dst64, ty, "dst")?;
        let src = if from_reg {
            let s = self.read(f, pc, i.src)?;
            if operation == op::MOV && i.off != 0 {
                // movsx: sign-extend the low `off` bits of src.
                let narrow = match i.off {
                    8 | 16 => i.off as u32,
                    32 if is64 => 32,
                    _ => return Err(LiftError::UnsupportedOpcode { pc, code: i.code }),
                };
                let t = b.build_int_truncate(s, self.int(narrow), "narrow")?;
                b.build_int_s_extend(t, ty, "movsx")?
            } else {
                b.build_int_truncate_or_bit_cast(s, ty, "src")?
            }
        } else {
            // imm is sign-extended to the operation width.
            ty.const_int(i64::from(i.imm) as u64, true)
        };
        let signed = i.off == 1;
        let r = match operation {
            op::ADD => b.build_int_add(dst, src, "add")?,
            op::SUB => b.build_int_sub(dst, src, "sub")?,
            op::MUL => b.build_int_mul(dst, src, "mul")?,
            op::OR => b.build_or(dst, src, "or")?,
            op::AND => b.build_and(dst, src, "and")?,
            op::XOR => b.build_xor(dst, src, "xor")?,
            op::MOV => src,
            op::NEG => b.build_int_neg(dst, "neg")?,
            op::LSH | op::RSH | op::ARSH => {
                // The ISA masks the shift amount to the operand width; LLVM would make
                // an over-wide shift poison.
                let amount = b.build_and(src, ty.const_int(u64::from(bits - 1), false), "amt")?;
                match operation {
                    op::LSH => b.build_left_shift(dst, amount, "shl")?,
                    op::RSH => b.build_right_shift(dst, amount, false, "lshr")?,
                    _ => b.build_right_shift(dst, amount, true, "ashr")?,
                }
            }
            op::DIV | op::MOD => self.div_mod(dst, src, operation == op::DIV, signed)?,
            _ => return Err(LiftError::UnsupportedOpcode { pc, code: i.code }),
        };
        self.write(f, pc, i.dst, r)
    }

    /// Division without LLVM's undefined cases: x/0 = 0, x%0 = x, and for signed
    /// operations MIN/-1 = MIN (wrapping) and MIN%-1 = 0, as the ISA defines them.
    fn div_mod(
        &self,
        dst: IntValue<'ctx>,
        src: IntValue<'ctx>,
        div: bool,
        signed: bool,
    ) -> Result<IntValue<'ctx>> {
        let b = &self.builder;
        let ty = dst.get_type();
        let zero = ty.const_zero();
        let one = ty.const_int(1, false);
        let is_zero = b.build_int_compare(IntPredicate::EQ, src, zero, "by_zero")?;
        let mut trapping_divisor = is_zero;
        let mut minus_one = None;
        if signed {
            let m1 = b.build_int_compare(IntPredicate::EQ, src, ty.const_all_ones(), "by_m1")?;
            trapping_divisor = b.build_or(is_zero, m1, "guard")?;
            minus_one = Some(m1);
        }
        let divisor = b
            .build_select(trapping_divisor, one, src, "divisor")?
            .into_int_value();
        let mut r = match (div, signed) {
            (true, false) => b.build_int_unsigned_div(dst, divisor, "udiv")?,
            (true, true) => b.build_int_signed_div(dst, divisor, "sdiv")?,
            (false, false) => b.build_int_unsigned_rem(dst, divisor, "urem")?,
            (false, true) => b.build_int_signed_rem(dst, divisor, "srem")?,
        };
        if let Some(m1) = minus_one {
            let v = if div {
                b.build_int_neg(dst, "neg")?
            } else {
                zero
            };
            r = b.build_select(m1, v, r, "m1")?.into_int_value();
        }
        let on_zero = if div { zero } else { dst };
        Ok(b.build_select(is_zero, on_zero, r, "div0")?
            .into_int_value())
    }

    fn byte_swap(&self, f: &Frame<'ctx>, pc: usize, i: &Insn) -> Result<()> {
        let b = &self.builder;
        let bits = match i.imm {
            16 | 32 | 64 => i.imm as u32,
            _ => return Err(LiftError::UnsupportedOpcode { pc, code: i.code }),
        };
        // Class ALU: source bit K is to-little-endian (a truncation on our little-endian
        // targets), X is to-big-endian. Class ALU64: unconditional swap.
        let swap = i.class() == op::ALU64 || i.code & op::SRC_MASK == op::X;
        let dst = self.read(f, pc, i.dst)?;
        let ty = self.int(bits);
        let mut v = b.build_int_truncate_or_bit_cast(dst, ty, "narrow")?;
        if swap {
            v = self.call_intrinsic("llvm.bswap", ty, &[v.into()])?;
        }
        self.write(f, pc, i.dst, v)
    }

    fn call_intrinsic(
        &self,
        name: &str,
        ty: IntType<'ctx>,
        args: &[BasicMetadataValueEnum<'ctx>],
    ) -> Result<IntValue<'ctx>> {
        let decl = inkwell::intrinsics::Intrinsic::find(name)
            .and_then(|x| x.get_declaration(self.module, &[ty.into()]))
            .ok_or_else(|| LiftError::InvalidIr {
                message: format!("intrinsic {name} is missing"),
            })?;
        let call = self.builder.build_call(decl, args, name)?;
        call.returned_int(format!("intrinsic {name}"))
    }

    /// Lifts a jump-class instruction; returns whether it ended the block.
    fn jump(&self, f: &Frame<'ctx>, pc: usize, i: &Insn) -> Result<bool> {
        let b = &self.builder;
        let operation = i.code & op::OP_MASK;
        if i.class() == op::JMP32 && (operation == op::CALL || operation == op::EXIT) {
            return Err(LiftError::UnsupportedOpcode { pc, code: i.code });
        }
        match operation {
            op::EXIT => {
                let r0 = self.read(f, pc, 0)?;
                b.build_return(Some(&r0))?;
                return Ok(true);
            }
            op::CALL => {
                self.call(f, pc, i)?;
                return Ok(false);
            }
            op::JA => {
                let t = self.jump_target(pc, i, f.start, f.end)?;
                b.build_unconditional_branch(f.blocks[&t])?;
                return Ok(true);
            }
            _ => {}
        }
        let is32 = i.class() == op::JMP32;
        let ty = self.int(if is32 { 32 } else { 64 });
        let dst = self.read(f, pc, i.dst)?;
        let dst = b.build_int_truncate_or_bit_cast(dst, ty, "a")?;
        let src = if i.code & op::SRC_MASK == op::X {
            let s = self.read(f, pc, i.src)?;
            b.build_int_truncate_or_bit_cast(s, ty, "b")?
        } else {
            ty.const_int(i64::from(i.imm) as u64, true)
        };
        let pred = match operation {
            op::JEQ => Some(IntPredicate::EQ),
            op::JNE => Some(IntPredicate::NE),
            op::JGT => Some(IntPredicate::UGT),
            op::JGE => Some(IntPredicate::UGE),
            op::JLT => Some(IntPredicate::ULT),
            op::JLE => Some(IntPredicate::ULE),
            op::JSGT => Some(IntPredicate::SGT),
            op::JSGE => Some(IntPredicate::SGE),
            op::JSLT => Some(IntPredicate::SLT),
            op::JSLE => Some(IntPredicate::SLE),
            op::JSET => None,
            _ => return Err(LiftError::UnsupportedOpcode { pc, code: i.code }),
        };
        let cond = match pred {
            Some(p) => b.build_int_compare(p, dst, src, "cond")?,
            None => {
                let m = b.build_and(dst, src, "mask")?;
                b.build_int_compare(IntPredicate::NE, m, ty.const_zero(), "cond")?
            }
        };
        let t = self.jump_target(pc, i, f.start, f.end)?;
        let fallthrough = f.blocks.get(&(pc + 1)).ok_or(LiftError::FallsOffEnd {
            start: f.start,
            end: f.end,
        })?;
        b.build_conditional_branch(cond, f.blocks[&t], *fallthrough)?;
        Ok(true)
    }

    fn args(&self, f: &Frame<'ctx>, pc: usize) -> Result<Vec<BasicMetadataValueEnum<'ctx>>> {
        (1..=5).map(|r| Ok(self.read(f, pc, r)?.into())).collect()
    }

    fn call(&self, f: &Frame<'ctx>, pc: usize, i: &Insn) -> Result<()> {
        let b = &self.builder;
        if i.code & op::SRC_MASK == op::X {
            return self.callx(f, pc, i);
        }
        match i.src {
            op::CALL_PSEUDO => {
                let target = (pc as i64 + 1 + i64::from(i.imm)) as usize;
                let callee = self.functions[&target];
                let mut args = self.args(f, pc)?;
                args.push(f.tail_depth.into());
                let r0 = b
                    .build_call(callee, &args, "sub")?
                    .returned_int("subprogram")?;
                self.write(f, pc, 0, r0)
            }
            op::CALL_HELPER => {
                let id = i.imm as u32;
                if id == helper::TAIL_CALL {
                    return self.tail_call(f, pc);
                }
                let lowering = self
                    .target
                    .helper(id)
                    .ok_or(LiftError::UnknownHelper { pc, id })?;
                let inline = f
                    .known_r1
                    .get()
                    .and_then(|m| self.target.array_map(m))
                    .filter(|l| l.per_cpu.is_none() || self.cpu_number().is_some());
                match (id, inline) {
                    (helper::MAP_LOOKUP_ELEM, Some(layout)) => {
                        return self.inline_array_lookup(f, pc, layout, &lowering)
                    }
                    (helper::MAP_UPDATE_ELEM, Some(layout)) if layout.update_size > 0 => {
                        return self.inline_array_update(f, pc, layout, &lowering)
                    }
                    _ => {}
                }
                let args = self.args(f, pc)?;
                let r0 = self.call_helper(&lowering, id, &args)?;
                self.write(f, pc, 0, r0)
            }
            _ => Err(LiftError::UnsupportedOpcode { pc, code: i.code }),
        }
    }

    /// The address of the value of the u32 key at `*r2` (this CPU's copy, for a per-CPU
    /// map), whether the key is in range, and whether the CPU has a copy (always, for a
    /// map that is not per-CPU).
    fn array_slot(
        &self,
        f: &Frame<'ctx>,
        pc: usize,
        map: &ArrayMapLayout,
    ) -> Result<(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)> {
        let b = &self.builder;
        let i64t = self.i64t;
        let (key_ptr, align) = self.address(f, pc, 2, 0, 32)?;
        let key = self.load(f, key_ptr, align, 32)?;
        let key = b.build_int_z_extend(key, i64t, "key64")?;
        let max = i64t.const_int(u64::from(map.max_entries), false);
        let in_range = b.build_int_compare(IntPredicate::ULT, key, max, "in_range")?;
        let stride = i64t.const_int(u64::from(map.key_stride), false);
        let offset = b.build_int_mul(key, stride, "offset")?;
        let value = b.build_int_add(i64t.const_int(map.values, false), offset, "value")?;
        let (Some(per_cpu), Some(cpu)) = (map.per_cpu, self.cpu_number()) else {
            return Ok((value, in_range, self.context.bool_type().const_all_ones()));
        };
        let space = inkwell::AddressSpace::from(cpu.address_space);
        let at = b.build_int_to_ptr(
            i64t.const_int(cpu.offset, false),
            self.context.ptr_type(space),
            "cpu_number_at",
        )?;
        let n = b.build_load(self.int(32), at, "cpu")?.into_int_value();
        // Read once per use: the thread may migrate, as it may between the helper's
        // own read and its access.
        set_alignment(n.as_instruction_value(), 4);
        if let Some(load) = n.as_instruction_value() {
            let _ = load.set_volatile(true);
        }
        let n = b.build_int_z_extend(n, i64t, "cpu64")?;
        let has_copy = b.build_int_compare(
            IntPredicate::ULT,
            n,
            i64t.const_int(u64::from(per_cpu.cpus), false),
            "has_copy",
        )?;
        let copy = b.build_int_mul(n, i64t.const_int(u64::from(per_cpu.stride), false), "copy")?;
        let value = b.build_int_add(value, copy, "cpu_value")?;
        Ok((value, in_range, has_copy))
    }

    /// Where per-CPU accesses read the CPU: the slot the entry took, when it takes one
    /// (its low 32 bits; the entry has set the word), else the target's CPU number.
    fn cpu_number(&self) -> Option<CpuNumber> {
        match self.target.cpu_slots() {
            Some(t) => Some(CpuNumber {
                address_space: t.address_space,
                offset: t.slot_offset,
            }),
            None => self.target.cpu_number(),
        }
    }

    /// The external entry of a program that runs as a CPU slot: takes one (unless the
    /// thread holds one already, in a tail call), runs `body`, frees it.
    ///
    /// The fast path is `claim_own` (the CPU's own slot, free); anything else (the slot
    /// held by a preempted thread, ids not yet cached) goes through `claim`, which waits.
    fn slot_taking_entry(
        &self,
        body: FunctionValue<'ctx>,
        t: &CpuSlotTable,
    ) -> Result<FunctionValue<'ctx>> {
        let c = self.context;
        let b = &self.builder;
        let i64t = self.i64t;
        let i32t = c.i32_type();
        let entry = self.module.add_function(
            self.target.entry_name(),
            self.entry_ty,
            Some(Linkage::External),
        );
        let nounwind = Attribute::get_named_enum_kind_id("nounwind");
        entry.add_attribute(AttributeLoc::Function, c.create_enum_attribute(nounwind, 0));
        let params: Vec<BasicMetadataValueEnum<'ctx>> =
            entry.get_params().into_iter().map(Into::into).collect();
        let start = c.append_basic_block(entry, "start");
        let nested = c.append_basic_block(entry, "nested");
        let fast = c.append_basic_block(entry, "own_cpu");
        let took_own = c.append_basic_block(entry, "took_own_slot");
        let slow = c.append_basic_block(entry, "claim");
        let run = c.append_basic_block(entry, "run");
        let space = inkwell::AddressSpace::from(t.address_space);
        let tls = |offset: u64, name: &str| {
            b.build_int_to_ptr(i64t.const_int(offset, false), c.ptr_type(space), name)
        };
        let volatile_load = |ty: IntType<'ctx>, at: PointerValue<'ctx>, name: &str| {
            let v = b.build_load(ty, at, name)?.into_int_value();
            if let Some(load) = v.as_instruction_value() {
                let _ = load.set_volatile(true);
            }
            Ok::<_, LiftError>(v)
        };
        let not_taken = i64t.const_int(u64::from(u32::MAX), false);

        b.position_at_end(start);
        let held_at = tls(t.slot_offset, "held_at")?;
        let held = volatile_load(i64t, held_at, "held")?;
        let held_flag = b.build_right_shift(held, i64t.const_int(32, false), false, "held_flag")?;
        let holds = b.build_int_compare(IntPredicate::NE, held_flag, i64t.const_zero(), "holds")?;
        b.build_conditional_branch(holds, nested, fast)?;

        b.position_at_end(nested);
        b.build_unconditional_branch(run)?;

        b.position_at_end(fast);
        let ids = volatile_load(i64t, tls(t.ids_offset, "ids_at")?, "ids")?;
        let tid = b.build_int_truncate(ids, i32t, "tid")?;
        let known = b.build_int_compare(IntPredicate::NE, tid, i32t.const_zero(), "tid_known")?;
        let try_own = c.append_basic_block(entry, "try_own_slot");
        b.build_conditional_branch(known, try_own, slow)?;

        b.position_at_end(try_own);
        let claim_own_ty =
            i32t.fn_type(&[i64t.into(), i32t.into(), i64t.into(), i32t.into()], false);
        let own = b
            .build_indirect_call(
                claim_own_ty,
                self.constant_pointer(t.claim_own)?,
                &[
                    i64t.const_int(t.slots, false).into(),
                    tid.into(),
                    i64t.const_int(t.rseq_offset, false).into(),
                    i32t.const_int(u64::from(t.cpus), false).into(),
                ],
                "own_slot",
            )?
            .returned_int("claim_own")?;
        let own = b.build_int_z_extend(own, i64t, "own_slot64")?;
        let took = b.build_int_compare(IntPredicate::NE, own, not_taken, "took")?;
        b.build_conditional_branch(took, took_own, slow)?;

        b.position_at_end(took_own);
        let word = b.build_or(own, i64t.const_int(1 << 32, false), "held_word")?;
        let st = b.build_store(held_at, word)?;
        let _ = st.set_volatile(true);
        b.build_unconditional_branch(run)?;

        b.position_at_end(slow);
        let zero = i64t.const_zero().into();
        let claimed = self.call_helper_on_slow_path(
            &HelperLowering::Address(t.claim),
            u32::MAX,
            vec![zero; 5],
        )?;
        let slow_end = b.get_insert_block().unwrap_or(slow);
        b.build_unconditional_branch(run)?;

        b.position_at_end(run);
        let slot = b.build_phi(i64t, "slot")?;
        slot.add_incoming(&[(&own, took_own), (&claimed, slow_end), (&not_taken, nested)]);
        // One call site, so that the body is inlined here.
        let r0 = b.build_call(body, &params, "r0")?.returned_int("entry")?;
        let slot = slot.as_basic_value().into_int_value();
        let release = c.append_basic_block(entry, "release");
        let done = c.append_basic_block(entry, "done");
        let took_slot = b.build_int_compare(IntPredicate::NE, slot, not_taken, "took_slot")?;
        b.build_conditional_branch(took_slot, release, done)?;
        b.position_at_end(release);
        // The thread's word first: a signal handler running a program in between then
        // takes a slot of its own rather than using one it no longer holds.
        let st = b.build_store(held_at, i64t.const_zero())?;
        let _ = st.set_volatile(true);
        let off = b.build_int_mul(slot, i64t.const_int(u64::from(t.stride), false), "off")?;
        let at = b.build_int_add(i64t.const_int(t.slots, false), off, "slot_at")?;
        let word = b.build_int_to_ptr(at, c.ptr_type(Default::default()), "slot_word")?;
        let freed = b.build_store(word, i32t.const_zero())?;
        freed
            .set_atomic_ordering(AtomicOrdering::Release)
            .map_err(|e| LiftError::InvalidIr {
                message: format!("slot release: {e}"),
            })?;
        let _ = freed.set_alignment(4);
        b.build_unconditional_branch(done)?;
        b.position_at_end(done);
        b.build_return(Some(&r0))?;
        let always_inline = Attribute::get_named_enum_kind_id("alwaysinline");
        body.add_attribute(
            AttributeLoc::Function,
            c.create_enum_attribute(always_inline, 0),
        );
        Ok(entry)
    }

    /// `fast` where `usable` holds, the helper call otherwise, joined into r0.
    fn inline_or_helper(
        &self,
        f: &Frame<'ctx>,
        pc: usize,
        usable: IntValue<'ctx>,
        lowering: &HelperLowering,
        id: u32,
        fast: impl FnOnce() -> Result<IntValue<'ctx>>,
    ) -> Result<()> {
        self.inline_answer_or_helper(f, pc, usable, None, lowering, id, fast)
    }

    /// [`Self::inline_or_helper`], with the answers the helper would give where `known`'s
    /// condition holds (an error the map's type decides) given without a call: a call
    /// left in the code, even one never made, costs a GPU module the whole helper.
    #[allow(clippy::too_many_arguments)]
    fn inline_answer_or_helper(
        &self,
        f: &Frame<'ctx>,
        pc: usize,
        usable: IntValue<'ctx>,
        known: Option<(IntValue<'ctx>, IntValue<'ctx>)>,
        lowering: &HelperLowering,
        id: u32,
        fast: impl FnOnce() -> Result<IntValue<'ctx>>,
    ) -> Result<()> {
        let b = &self.builder;
        let inline = self.context.append_basic_block(f.function, "inline");
        let call = self.context.append_basic_block(f.function, "helper");
        let join = self.context.append_basic_block(f.function, "helper_done");
        b.build_conditional_branch(usable, inline, call)?;
        b.position_at_end(inline);
        let r0_fast = fast()?;
        let inline_end = b.get_insert_block().unwrap_or(inline);
        b.build_unconditional_branch(join)?;
        b.position_at_end(call);
        let mut incoming = vec![(r0_fast, inline_end)];
        if let Some((answered, answer)) = known {
            let calling = self.context.append_basic_block(f.function, "helper_call");
            b.build_conditional_branch(answered, join, calling)?;
            incoming.push((answer, call));
            b.position_at_end(calling);
        }
        let args = self.args(f, pc)?;
        let r0_call = self.call_helper_on_slow_path(lowering, id, args)?;
        let call_end = b.get_insert_block().unwrap_or(call);
        b.build_unconditional_branch(join)?;
        incoming.push((r0_call, call_end));
        b.position_at_end(join);
        let r0 = b.build_phi(self.i64t, "r0")?;
        for (value, block) in &incoming {
            r0.add_incoming(&[(value, *block)]);
        }
        self.write(f, pc, 0, r0.as_basic_value().into_int_value())
    }

    /// `r0 = key < max_entries ? &value[key] : NULL` (this CPU's copy for a per-CPU map,
    /// through the helper on a CPU without one), with the u32 key read from `*r2`.
    fn inline_array_lookup(
        &self,
        f: &Frame<'ctx>,
        pc: usize,
        map: ArrayMapLayout,
        lowering: &HelperLowering,
    ) -> Result<()> {
        let b = &self.builder;
        let (value, in_range, has_copy) = self.array_slot(f, pc, &map)?;
        let found = || -> Result<IntValue<'ctx>> {
            let r0 = b.build_select(in_range, value, self.i64t.const_zero(), "lookup")?;
            Ok(r0.into_int_value())
        };
        if map.per_cpu.is_none() {
            let r0 = found()?;
            return self.write(f, pc, 0, r0);
        }
        self.inline_or_helper(f, pc, has_copy, lowering, helper::MAP_LOOKUP_ELEM, found)
    }

    /// `bpf_map_update_elem` on an array map: with the key in range and flags `BPF_ANY`
    /// or `BPF_EXIST`, the value at `*r3` is copied into place and r0 = 0; a key out of
    /// range, or `BPF_NOEXIST`, is the kernel's error; anything else (other flags,
    /// `BPF_F_LOCK`, a per-CPU map on a CPU without a copy) goes to the helper.
    fn inline_array_update(
        &self,
        f: &Frame<'ctx>,
        pc: usize,
        map: ArrayMapLayout,
        lowering: &HelperLowering,
    ) -> Result<()> {
        let b = &self.builder;
        let i64t = self.i64t;
        let (value, in_range, has_copy) = self.array_slot(f, pc, &map)?;
        let usable = b.build_and(in_range, has_copy, "usable")?;
        let flags = self.read(f, pc, 4)?;
        let flags_are = |p: IntPredicate, v: u64, name: &str| {
            b.build_int_compare(p, flags, i64t.const_int(v, false), name)
        };
        let any = flags_are(IntPredicate::EQ, update_flags::ANY, "any")?;
        let exist = flags_are(IntPredicate::EQ, update_flags::EXIST, "exist")?;
        let plain = b.build_or(any, exist, "plain_flags")?;
        let usable = b.build_and(usable, plain, "inline_update")?;
        // The kernel's array update, for flags it takes (BPF_ANY, BPF_NOEXIST, BPF_EXIST):
        // a key out of range is -E2BIG, else BPF_NOEXIST is -EEXIST (every key of an
        // array exists).
        let settled_flags = flags_are(IntPredicate::ULE, update_flags::EXIST, "settled_flags")?;
        let answered = b.build_and(has_copy, settled_flags, "answered")?;
        let error = b.build_select(
            in_range,
            i64t.const_int(EEXIST.wrapping_neg(), false),
            i64t.const_int(E2BIG.wrapping_neg(), false),
            "update_error",
        )?;
        let known = Some((answered, error.into_int_value()));
        self.inline_answer_or_helper(
            f,
            pc,
            usable,
            known,
            lowering,
            helper::MAP_UPDATE_ELEM,
            || {
                let ptr = self.context.ptr_type(self.target.memory_address_space());
                let dst = b.build_int_to_ptr(value, ptr, "dst")?;
                let src = self.read(f, pc, 3)?;
                let src = b.build_int_to_ptr(src, ptr, "src")?;
                let size = i64t.const_int(u64::from(map.update_size), false);
                b.build_memcpy(dst, 1, src, 1, size)
                    .map_err(|e| LiftError::InvalidIr {
                        message: format!("inline update: {e}"),
                    })?;
                Ok(i64t.const_zero())
            },
        )
    }

    /// A helper call on the slow path of an inlined map operation: through the target's
    /// wrapper, when it has one, as `wrapper(r1, .., r5, helper)`.
    fn call_helper_on_slow_path(
        &self,
        lowering: &HelperLowering,
        id: u32,
        mut args: Vec<BasicMetadataValueEnum<'ctx>>,
    ) -> Result<IntValue<'ctx>> {
        let (Some(wrapper), HelperLowering::Address(helper)) =
            (self.target.slow_path_call_wrapper(), lowering)
        else {
            return self.call_helper(lowering, id, &args);
        };
        args.push(self.i64t.const_int(*helper, false).into());
        let ty = self.i64t.fn_type(&[self.i64t.into(); 6], false);
        let p = self.constant_pointer(wrapper)?;
        self.builder
            .build_indirect_call(ty, p, &args, &format!("slow_helper{id}"))?
            .returned_int(format!("wrapped helper {id}"))
    }

    fn call_helper(
        &self,
        lowering: &HelperLowering,
        id: u32,
        args: &[BasicMetadataValueEnum<'ctx>],
    ) -> Result<IntValue<'ctx>> {
        let b = &self.builder;
        self.plain_calls.set(self.plain_calls.get() + 1);
        let call = match lowering {
            HelperLowering::Address(addr) => {
                let p = self.constant_pointer(*addr)?;
                b.build_indirect_call(self.helper_ty, p, args, &format!("helper{id}"))?
            }
            HelperLowering::Symbol(name) => {
                let callee = self.module.get_function(name).unwrap_or_else(|| {
                    self.module
                        .add_function(name, self.helper_ty, Some(Linkage::External))
                });
                b.build_call(callee, args, &format!("helper{id}"))?
            }
        };
        call.returned_int(format!("helper {id}"))
    }

    fn constant_pointer(&self, addr: u64) -> Result<PointerValue<'ctx>> {
        let v = self.i64t.const_int(addr, false);
        Ok(self
            .builder
            .build_int_to_ptr(v, self.context.ptr_type(Default::default()), "fnptr")?)
    }

    /// `callx`: the register holds a helper id, as in uBPF. The target is only known at
    /// run time, so dispatch over every helper the target offers; an unknown id leaves 0
    /// in r0 rather than trapping inside the host process.
    fn callx(&self, f: &Frame<'ctx>, pc: usize, i: &Insn) -> Result<()> {
        let b = &self.builder;
        let id = self.read(f, pc, i.dst)?;
        let args = self.args(f, pc)?;
        let done = self.context.append_basic_block(f.function, "callx_done");
        let fallback = self.context.append_basic_block(f.function, "callx_unknown");
        let mut cases = Vec::new();
        let mut results = Vec::new();
        let here = b.get_insert_block().ok_or_else(|| LiftError::InvalidIr {
            message: "builder is not positioned".into(),
        })?;
        for hid in self.target.callx_helpers() {
            if hid == helper::TAIL_CALL {
                continue;
            }
            let Some(lowering) = self.target.helper(hid) else {
                continue;
            };
            let bb = self
                .context
                .append_basic_block(f.function, &format!("callx{hid}"));
            b.position_at_end(bb);
            let r0 = self.call_helper(&lowering, hid, &args)?;
            b.build_unconditional_branch(done)?;
            cases.push((self.i64t.const_int(u64::from(hid), false), bb));
            results.push((r0, bb));
        }
        b.position_at_end(fallback);
        b.build_unconditional_branch(done)?;
        b.position_at_end(here);
        b.build_switch(id, fallback, &cases)?;
        b.position_at_end(done);
        let phi = b.build_phi(self.i64t, "callx_r0")?;
        phi.add_incoming(&[(&self.i64t.const_zero(), fallback)]);
        for (v, bb) in &results {
            phi.add_incoming(&[(v, *bb)]);
        }
        self.write(f, pc, 0, phi.as_basic_value().into_int_value())
    }

    /// `bpf_tail_call(ctx, prog_array, index)`, lowered as call-and-return: the runtime's
    /// resolver (the target's lowering of helper 12) maps the slot to an entry address,
    /// and the target runs as `entry(ctx, 0, depth + 1)`; its r0 is returned directly. The
    /// native stack therefore grows by one frame per tail call, bounded by the kernel's
    /// limit of `MAX_TAIL_CALLS` (33) per chain, counted through the hidden depth argument
    /// that every lifted function carries. A failed tail call (limit reached, empty
    /// slot) falls through with -ENOENT in r0.
    fn tail_call(&self, f: &Frame<'ctx>, pc: usize) -> Result<()> {
        let b = &self.builder;
        let lowering = self
            .target
            .helper(helper::TAIL_CALL)
            .ok_or(LiftError::UnknownHelper {
                pc,
                id: helper::TAIL_CALL,
            })?;
        let resolve = self.context.append_basic_block(f.function, "tail_resolve");
        let jump = self.context.append_basic_block(f.function, "tail_jump");
        let fail = self.context.append_basic_block(f.function, "tail_fail");
        let limit = self.i64t.const_int(u64::from(MAX_TAIL_CALLS), false);
        let ok = b.build_int_compare(IntPredicate::ULT, f.tail_depth, limit, "tail_ok")?;
        b.build_conditional_branch(ok, resolve, fail)?;

        b.position_at_end(resolve);
        let args = self.args(f, pc)?;
        let entry = self.call_helper(&lowering, helper::TAIL_CALL, &args)?;
        let found =
            b.build_int_compare(IntPredicate::NE, entry, self.i64t.const_zero(), "found")?;
        b.build_conditional_branch(found, jump, fail)?;

        b.position_at_end(jump);
        let p = b.build_int_to_ptr(entry, self.context.ptr_type(Default::default()), "entry")?;
        let depth = b.build_int_add(f.tail_depth, self.i64t.const_int(1, false), "depth")?;
        let ctx = self.read(f, pc, 1)?;
        let r = b
            .build_indirect_call(
                self.entry_ty,
                p,
                &[ctx.into(), self.i64t.const_zero().into(), depth.into()],
                "tail",
            )?
            .returned_int("tail call target")?;
        b.build_return(Some(&r))?;

        b.position_at_end(fail);
        self.write(f, pc, 0, self.i64t.const_int(TAIL_CALL_FAILED, false))
    }
}

/// Whether `i` may change r1 (conservatively: calls clobber r1-r5).
fn writes_r1(i: &Insn) -> bool {
    match i.class() {
        op::ALU | op::ALU64 | op::LDX | op::LD => i.dst == 1,
        op::STX => i.code & op::MODE_MASK == op::ATOMIC && i.src == 1 && i.imm & op::FETCH != 0,
        op::JMP | op::JMP32 => i.code & op::OP_MASK == op::CALL,
        _ => false,
    }
}

fn set_alignment(i: Option<inkwell::values::InstructionValue<'_>>, align: u32) {
    if let Some(i) = i {
        // eBPF allows misaligned access outside the stack; claiming more than is known
        // would let LLVM assume what the program never promised.
        let _ = i.set_alignment(align);
    }
}

/// The integer a call returns, which every callee the lifter calls has.
trait ReturnedInt<'ctx> {
    /// `what` names the callee in the error when it returns nothing.
    fn returned_int(self, what: impl std::fmt::Display) -> Result<IntValue<'ctx>>;
}

impl<'ctx> ReturnedInt<'ctx> for CallSiteValue<'ctx> {
    fn returned_int(self, what: impl std::fmt::Display) -> Result<IntValue<'ctx>> {
        self.try_as_basic_value()
            .basic()
            .map(|v| v.into_int_value())
            .ok_or_else(|| LiftError::InvalidIr {
                message: format!("{what} returns void"),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::HelperLowering;

    struct NoHelpers;

    impl LoweringTarget for NoHelpers {
        fn helper(&self, id: u32) -> Option<HelperLowering> {
            (id == 1).then(|| HelperLowering::Symbol("bpf_map_lookup_elem".into()))
        }
    }

    fn lift_err(insns: &[Insn]) -> LiftError {
        let context = Context::create();
        let result = lift(&context, insns, &NoHelpers).map(|_| ());
        result.expect_err("lifted an invalid program")
    }

    const EXIT: Insn = Insn::new(op::EXIT_INSN, 0, 0, 0, 0);
    const MOV0: Insn = Insn::new(op::ALU64 | op::MOV | op::K, 0, 0, 0, 0);

    #[test]
    fn lifts_without_a_target_machine_and_declares_symbol_helpers() {
        let context = Context::create();
        let call = Insn::new(op::CALL_INSN, 0, 0, 0, 1);
        let lifted = lift(&context, &[call, EXIT], &NoHelpers).expect("lifts");
        assert!(lifted.module.get_function("bpf_map_lookup_elem").is_some());
        assert_eq!(
            lifted.entry.get_name().to_str(),
            Ok(crate::DEFAULT_ENTRY_NAME)
        );
    }

    #[test]
    fn rejects_malformed_programs_naming_the_pc() {
        assert!(matches!(lift_err(&[]), LiftError::Empty));
        let call = Insn::new(op::CALL_INSN, 0, 0, 0, 9);
        assert!(matches!(
            lift_err(&[MOV0, call, EXIT]),
            LiftError::UnknownHelper { pc: 1, id: 9 }
        ));
        let ja = Insn::new(op::JMP | op::JA, 0, 0, 5, 0);
        assert!(matches!(
            lift_err(&[ja, EXIT]),
            LiftError::JumpOutOfRange {
                pc: 0,
                target: 6,
                ..
            }
        ));
        let lddw = Insn::new(op::LD_DW_IMM, 0, 0, 0, 1);
        let into_lddw = Insn::new(op::JMP | op::JA, 0, 0, 1, 0);
        let tail = Insn::default();
        assert!(matches!(
            lift_err(&[into_lddw, lddw, tail, EXIT]),
            LiftError::JumpIntoLddw { pc: 2 }
        ));
        assert!(matches!(
            lift_err(&[lddw]),
            LiftError::TruncatedLddw { pc: 0 }
        ));
        assert!(matches!(
            lift_err(&[MOV0]),
            LiftError::FallsOffEnd { start: 0, end: 1 }
        ));
        let jeq_back = Insn::new(op::JMP | op::JEQ | op::K, 0, 0, -2, 0);
        assert!(matches!(
            lift_err(&[MOV0, jeq_back]),
            LiftError::FallsOffEnd { start: 0, end: 2 }
        ));
        let bad_reg = Insn::new(op::ALU64 | op::MOV | op::K, 11, 0, 0, 0);
        assert!(matches!(
            lift_err(&[bad_reg, EXIT]),
            LiftError::InvalidRegister { pc: 0, reg: 11 }
        ));
        let write_fp = Insn::new(op::ALU64 | op::MOV | op::K, 10, 0, 0, 0);
        assert!(matches!(
            lift_err(&[write_fp, EXIT]),
            LiftError::WriteToFramePointer { pc: 0 }
        ));
        let abs = Insn::new(op::LD | op::ABS | op::W, 0, 0, 0, 0);
        assert!(matches!(
            lift_err(&[abs, EXIT]),
            LiftError::UnsupportedOpcode { pc: 0, code: 0x20 }
        ));
    }
}
