//! The lifter proper: each eBPF function to an LLVM function, instruction by
//! instruction, over registers kept in allocas that LLVM's mem2reg promotes.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};

use bpftime_isa::opcode as op;
use bpftime_isa::uapi::{helper, update_flags, MAX_TAIL_CALLS, STACK_SIZE};

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

mod calls;
mod memory;

/// Linux's errno values that inlined map updates return negated.
const E2BIG: u64 = 7;
const EEXIST: u64 = 17;

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
