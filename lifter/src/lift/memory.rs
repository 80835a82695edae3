//! Loads, stores and atomics: eBPF memory instructions as LLVM memory operations with
//! the alignment the program can prove.

use super::*;

impl<'ctx> Lifter<'_, 'ctx> {
    /// The pointer for `[base + off]`, and its alignment where it is known. Frame-pointer
    /// accesses index the stack alloca directly so the optimizer can keep stack slots in
    /// registers, and their alignment follows from the offset; everything else goes
    /// through an integer-to-pointer cast, as eBPF pointers are plain integers.
    pub(super) fn address(
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
    pub(super) fn with_alignment(
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
    pub(super) fn load(
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
    pub(super) fn store(
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
    pub(super) fn byte_at(&self, ptr: PointerValue<'ctx>, k: u32) -> Result<PointerValue<'ctx>> {
        let b = &self.builder;
        let addr = b.build_ptr_to_int(ptr, self.i64t, "addr")?;
        let addr = b.build_int_add(addr, self.i64t.const_int(u64::from(k), false), "byte_addr")?;
        Ok(b.build_int_to_ptr(addr, ptr.get_type(), "byte_at")?)
    }

    pub(super) fn atomic(&self, f: &Frame<'ctx>, pc: usize, i: &Insn, bits: u32) -> Result<()> {
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
}
