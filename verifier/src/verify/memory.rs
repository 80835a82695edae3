//! Memory: pointer arithmetic, loads, stores and atomics on the context, the stack,
//! map values and packets, and the memory helpers are given.

use super::*;

impl Verifier<'_> {
    pub(super) fn ptr_add(&self, p: Reg, s: Scalar, reg: u8) -> R<Reg> {
        match p {
            Reg::Ptr { nullable: true, .. } | Reg::MapPtr { .. } | Reg::Func { .. } => {
                Err(RejectKind::PtrArithProhibited {
                    reg,
                    ty: p.type_name(),
                })
            }
            Reg::Ptr {
                region,
                off_min,
                off_max,
                off_bits,
                ref_id,
                ..
            } => {
                if s.smin < -MAX_VAR_OFF || s.smax > MAX_VAR_OFF {
                    return Err(RejectKind::UnboundedOffset { reg });
                }
                let (lo, hi) = (off_min + s.smin, off_max + s.smax);
                if lo < -MAX_VAR_OFF || hi > MAX_VAR_OFF {
                    return Err(RejectKind::UnboundedOffset { reg });
                }
                Ok(Reg::Ptr {
                    region,
                    off_min: lo,
                    off_max: hi,
                    off_bits: off_bits.plus(s.tnum),
                    nullable: false,
                    id: 0,
                    ref_id,
                })
            }
            _ => Err(RejectKind::PtrArithProhibited {
                reg,
                ty: p.type_name(),
            }),
        }
    }

    // ---- memory ------------------------------------------------------------

    /// Like the kernel, the context is only read through the pointer the program
    /// got (its field offsets are rewritten per program type), never a moved copy.
    pub(super) fn ctx_unmodified(reg: u8, off_min: i64, off_max: i64) -> R<()> {
        if off_min != off_max {
            return Err(RejectKind::VariableCtxAccess { reg });
        }
        if off_min != 0 {
            return Err(RejectKind::ModifiedCtxDeref { reg, off: off_min });
        }
        Ok(())
    }

    pub(super) fn ctx_access(&self, off: i64, size: u32, write: bool) -> R<()> {
        let range = ctx_range(self.p.prog_type).unwrap_or(0..0);
        // A tracepoint's record is read-only, and so are a probe's registers: a uprobe
        // program does not change the traced code's state. Linux 6.18 takes a negative
        // offset into a tracepoint's record; what lies before it is not the program's.
        if write || off < range.start || off + size as i64 > range.end {
            return Err(RejectKind::CtxAccess { off, size });
        }
        if off % size as i64 != 0 {
            return Err(RejectKind::MisalignedCtxAccess { off, size });
        }
        Ok(())
    }

    /// Bounds of a sized region (map value, ring buffer record, buffer).
    pub(super) fn region_bounds(region: Region, lo: i64, hi: i64, size: u64) -> R<()> {
        let (name, limit) = match region {
            Region::MapValue { size, .. } => ("map value", size),
            Region::Ringbuf { size } => ("ringbuf record", size),
            Region::Mem { size } => ("memory", size),
            Region::Task => return Err(RejectKind::TaskStructAccess),
            _ => unreachable!("only sized regions"),
        };
        if lo < 0 || hi + size as i64 > limit as i64 {
            return Err(RejectKind::RegionOutOfBounds {
                region: name,
                region_size: limit,
                off_min: lo,
                off_max: hi,
                size,
            });
        }
        Ok(())
    }

    pub(super) fn not_memory(reg: u8, p: &Reg) -> RejectKind {
        RejectKind::InvalidMemAccess {
            reg,
            ty: p.type_name(),
        }
    }

    pub(super) fn load(
        &mut self,
        st: &mut State,
        reg: u8,
        base: Reg,
        off: i64,
        size: u32,
    ) -> R<Reg> {
        match base {
            Reg::Ptr {
                nullable: false,
                region,
                off_min,
                off_max,
                off_bits,
                ..
            } => {
                let (lo, hi) = (off_min + off, off_max + off);
                let bits = off_bits.plus(Tnum::konst(off as u64));
                match region {
                    Region::Ctx => {
                        Self::ctx_unmodified(reg, off_min, off_max)?;
                        self.ctx_access(lo, size, false)?;
                        // Aligned and at most 8 bytes (ctx_access): inside one word.
                        self.stats.ctx_words_read |= 1u64.checked_shl((lo / 8) as u32).unwrap_or(0);
                        self.stats.ctx_read_end =
                            self.stats.ctx_read_end.max((lo + size as i64) as u32);
                        Ok(unknown_bytes(size))
                    }
                    Region::Stack { frame } => {
                        Self::stack_aligned(lo, bits, size)?;
                        self.stack_read(st, frame, lo, hi, size)
                    }
                    _ => {
                        self.gpu_aligned(lo, bits, size)?;
                        Self::region_bounds(region, lo, hi, size as u64)?;
                        Ok(unknown_bytes(size))
                    }
                }
            }
            p => Err(Self::not_memory(reg, &p)),
        }
    }

    pub(super) fn store(
        &mut self,
        st: &mut State,
        reg: u8,
        base: Reg,
        off: i64,
        size: u32,
        val: Reg,
    ) -> R<()> {
        match base {
            Reg::Ptr {
                nullable: false,
                region,
                off_min,
                off_max,
                off_bits,
                ..
            } => {
                let (lo, hi) = (off_min + off, off_max + off);
                let bits = off_bits.plus(Tnum::konst(off as u64));
                match region {
                    Region::Ctx => {
                        Self::ctx_unmodified(reg, off_min, off_max)?;
                        self.ctx_access(lo, size, true)
                    }
                    Region::Stack { frame } => {
                        Self::stack_aligned(lo, bits, size)?;
                        if val.is_pointer() && size != 8 {
                            return Err(RejectKind::PartialPointerSpill { size });
                        }
                        // As in the kernel: a stack address never goes into another
                        // frame's stack, where it could outlive its frame.
                        let stack_ptr = matches!(
                            val,
                            Reg::Ptr {
                                region: Region::Stack { .. },
                                ..
                            }
                        );
                        if stack_ptr && frame as usize + 1 != st.frames.len() {
                            return Err(RejectKind::StackPointerToCallerFrame);
                        }
                        self.stack_write(st, frame, lo, hi, size, Some(val))
                    }
                    _ => {
                        self.gpu_aligned(lo, bits, size)?;
                        Self::region_bounds(region, lo, hi, size as u64)
                    }
                }
            }
            p => Err(Self::not_memory(reg, &p)),
        }
    }

    pub(super) fn atomic(&mut self, st: &mut State, i: &Insn, base: Reg, size: u32) -> R<()> {
        let base_op = i.imm & !op::FETCH;
        let valid_op = matches!(i.imm, op::ATOMIC_XCHG | op::ATOMIC_CMPXCHG)
            || matches!(
                base_op,
                op::ATOMIC_ADD | op::ATOMIC_OR | op::ATOMIC_AND | op::ATOMIC_XOR
            );
        if !valid_op || !(size == 4 || size == 8) {
            return Err(RejectKind::InvalidAtomic { imm: i.imm, size });
        }
        // A pointer operand leaks an address into memory, which privileged
        // programs may do; it only has to be initialized.
        Self::read(st, i.src)?;
        if i.imm == op::ATOMIC_CMPXCHG {
            Self::read(st, 0)?;
        }
        let mut old = unknown_bytes(size);
        match base {
            Reg::Ptr {
                nullable: false,
                region,
                off_min,
                off_max,
                off_bits,
                ..
            } => {
                let (lo, hi) = (off_min + i.off as i64, off_max + i.off as i64);
                let bits = off_bits.plus(Tnum::konst(i.off as i64 as u64));
                // Atomics need natural alignment on every target; on the stack
                // every possible offset must be aligned, as for other accesses.
                if lo == hi && lo % size as i64 != 0 {
                    return Err(RejectKind::MisalignedAccess { off: lo, size });
                }
                if matches!(region, Region::Stack { .. }) {
                    Self::stack_aligned(lo, bits, size)?;
                }
                match region {
                    Region::Ctx => return Err(RejectKind::CtxAccess { off: lo, size }),
                    Region::Stack { frame } => {
                        // The fetch returns what the slot held (a spilled pointer
                        // too); what the slot holds after is some number.
                        old = self.stack_read(st, frame, lo, hi, size)?;
                        self.stack_write(st, frame, lo, hi, size, None)?;
                    }
                    _ => Self::region_bounds(region, lo, hi, size as u64)?,
                }
            }
            p => return Err(Self::not_memory(i.dst, &p)),
        }
        if i.imm == op::ATOMIC_CMPXCHG {
            Self::write(st, 0, old)?;
        } else if i.imm & op::FETCH != 0 {
            Self::write(st, i.src, old)?;
        }
        Ok(())
    }

    pub(super) fn note_depth(&mut self, st: &State, frame: u8, lo: i64) -> R<()> {
        let sp = st.frames[frame as usize].subprog;
        let d = (-lo) as u32;
        let e = self.depth.entry(sp).or_insert(0);
        if d > *e {
            *e = d;
        }
        Ok(())
    }

    /// Whether the frames of a call chain share one stack of
    /// [`uapi::STACK_SIZE`] bytes, which the kernel checks after verification.
    ///
    /// 6.13 brought private stacks (x86-64 JIT): a subprogram whose frame is 64
    /// bytes or more gets its own, checked alone, unless some subprogram
    /// tail-calls; 6.13's rule gives them to every kprobe program. On 6.18 (seen
    /// on 6.18.44) only perf_event programs and kprobe programs of the
    /// kprobe_multi and kprobe_session attach types get them; plain kprobe
    /// programs (kprobes and uprobes), uprobe_multi, tracepoint and
    /// raw_tracepoint programs do not. 6.1 has none. A `KPROBE` program here has
    /// no attach type, so its frames share the stack, as 6.1 and 6.18 require.
    /// Our own engines give each frame its own stack, so the conformance type is
    /// bound only where a tail call keeps the callers' frames.
    pub(super) fn frames_share_stack(&self) -> bool {
        self.p.prog_type != PROG_TYPE_CONFORMANCE || self.has_tail_call
    }

    /// The kernel's stack check over the call graph: from the main program,
    /// through every bpf-to-bpf call and callback reference, in instruction
    /// order, each subprogram's deepest use (rounded as
    /// [`Self::rounded_frame`] says) is added to its callers'; the first chain
    /// over [`uapi::STACK_SIZE`] is refused. A subprogram that tail-calls must be
    /// reached with its callers' frames below 256 bytes: a tail call keeps them
    /// while the next program adds its own, up to 33 times.
    pub(super) fn check_stack_chains(&self) -> Result<(), Rejection> {
        if !self.frames_share_stack() {
            return Ok(());
        }
        let insns = self.p.insns;
        let target = |pc: usize| {
            let i = &insns[pc];
            let call = i.code == op::CALL_INSN && i.src == op::CALL_PSEUDO;
            let func = i.is_lddw() && i.src == op::PSEUDO_FUNC;
            (call || func).then(|| (pc as i64 + i.imm as i64 + 1) as usize)
        };
        let mut starts = vec![0usize];
        let mut pc = 0;
        while pc < insns.len() {
            starts.extend(target(pc));
            pc += if insns[pc].is_lddw() { 2 } else { 1 };
        }
        starts.sort_unstable();
        starts.dedup();
        // The calls each subprogram makes, in instruction order.
        let mut calls: HashMap<usize, Vec<(usize, usize)>> = HashMap::new();
        for (n, &start) in starts.iter().enumerate() {
            let end = starts.get(n + 1).copied().unwrap_or(insns.len());
            let mut pc = start;
            let out = calls.entry(start).or_default();
            while pc < end {
                if let Some(t) = target(pc) {
                    out.push((pc, t));
                }
                pc += if insns[pc].is_lddw() { 2 } else { 1 };
            }
        }
        let tail_calls = |start: usize| {
            let n = starts.partition_point(|&s| s <= start);
            let end = starts.get(n).copied().unwrap_or(insns.len());
            insns[start..end].iter().any(|i| {
                i.code == op::CALL_INSN && i.src == op::CALL_HELPER && i.imm == h::TAIL_CALL as i32
            })
        };
        // (subprogram, the call that entered it, callers' bytes, frames) per chain.
        let mut work = vec![(0usize, 0usize, 0u32, 1usize)];
        let fail = |at: usize, kind: RejectKind| Rejection {
            insn: at,
            kind,
            disasm: Box::default(),
            regs: Vec::new(),
            verbose: self.log.clone().into(),
            source_line: None,
        };
        while let Some((sp, at, below, frames)) = work.pop() {
            if frames > uapi::MAX_CALL_FRAMES {
                return Err(fail(at, RejectKind::CallStackTooDeep { frames }));
            }
            if sp != 0 && below >= 256 && tail_calls(sp) {
                return Err(fail(at, RejectKind::TailCallStackTooLarge { depth: below }));
            }
            let depth = below + Self::rounded_frame(self.depth.get(&sp).copied().unwrap_or(0));
            if depth as usize > uapi::STACK_SIZE {
                return Err(fail(
                    at,
                    RejectKind::CombinedStackTooLarge { frames, depth },
                ));
            }
            // Reversed onto the stack, so the first call is walked first.
            for &(call, t) in calls.get(&sp).into_iter().flatten().rev() {
                work.push((t, call, depth, frames + 1));
            }
        }
        Ok(())
    }

    /// A frame's share of the stack: its deepest use rounded up to 32 bytes, and
    /// 32 for a frame that uses none. 6.1 rounds so, and so do later kernels
    /// for a program they interpret; 6.8+ round a JIT-compiled program's frames
    /// to 16 bytes (none for none). The coarser rounding refuses every chain
    /// either refuses.
    pub(super) fn rounded_frame(depth: u32) -> u32 {
        depth.max(1).div_ceil(32) * 32
    }

    /// GPU loads and stores fault when misaligned (x86 does not care): every
    /// offset the pointer may hold must be aligned.
    pub(super) fn gpu_aligned(&self, lo: i64, bits: Tnum, size: u32) -> R<()> {
        if self.p.gpu && !bits.aligned(size as u64) {
            return Err(RejectKind::MisalignedAccess { off: lo, size });
        }
        Ok(())
    }

    /// The kernel requires aligned stack accesses (its spill tracking relies on it),
    /// for every offset a variable pointer may hold; so do GPUs for every access.
    pub(super) fn stack_aligned(lo: i64, bits: Tnum, size: u32) -> R<()> {
        if !bits.aligned(size as u64) {
            return Err(RejectKind::MisalignedStackAccess { off: lo, size });
        }
        Ok(())
    }

    pub(super) fn stack_bounds(lo: i64, hi: i64, size: u64) -> R<()> {
        if lo < -(uapi::STACK_SIZE as i64) || hi + size as i64 > 0 || size == 0 {
            let off = if lo < -(uapi::STACK_SIZE as i64) {
                lo
            } else {
                hi
            };
            return Err(RejectKind::StackOutOfBounds { off, size });
        }
        Ok(())
    }

    /// Reads `size` bytes at `[lo, hi]` (a range when the offset is variable).
    pub(super) fn stack_read(
        &mut self,
        st: &mut State,
        frame: u8,
        lo: i64,
        hi: i64,
        size: u32,
    ) -> R<Reg> {
        Self::stack_bounds(lo, hi, size as u64)?;
        self.note_depth(st, frame, lo)?;
        let f = &st.frames[frame as usize];
        if lo == hi && lo % size as i64 == 0 {
            // A fill of exactly what was spilled gets the register back.
            let (k, b) = Frame::locate(lo);
            let slot = f.slot(k);
            let exact = slot
                .bytes
                .iter()
                .enumerate()
                .all(|(i, x)| (*x == Byte::Spill) == (i >= b && i < b + size as usize));
            if let (Some(r), true) = (slot.spill, exact) {
                return Ok(r);
            }
            // A narrower fill of a spilled number's low bytes (its first bytes,
            // little-endian) keeps what is known of them.
            let first = slot.bytes.iter().position(|x| *x == Byte::Spill);
            let spilled = slot.bytes.iter().filter(|x| **x == Byte::Spill).count();
            if let (Some(Reg::Scalar { s, .. }), Some(first)) = (slot.spill, first) {
                if first == b && size as usize <= spilled {
                    let fits = size == 8 || s.umax < 1u64 << (size * 8);
                    return Ok(Reg::scalar(if fits {
                        s
                    } else {
                        Scalar::from_tnum(s.tnum.cast(size))
                    }));
                }
            }
        }
        let mut all_zero = true;
        for a in lo..hi + size as i64 {
            let (k, b) = Frame::locate(a);
            let slot = f.slot(k);
            match slot.bytes[b] {
                // Privileged programs may read stack bytes never written (the kernel
                // allows it with CAP_PERFMON): they are some number.
                Byte::Invalid | Byte::Misc => all_zero = false,
                Byte::Spill => {
                    if lo == hi && !matches!(slot.spill, Some(Reg::Scalar { .. })) {
                        return Err(RejectKind::PartialSpillRead { off: lo, size });
                    }
                    if slot
                        .spill
                        .and_then(|r| r.as_scalar())
                        .and_then(|s| s.as_const())
                        != Some(0)
                    {
                        all_zero = false;
                    }
                }
                Byte::Zero => {}
            }
        }
        Ok(if all_zero {
            Reg::konst(0)
        } else {
            unknown_bytes(size)
        })
    }

    /// Writes `size` bytes at `[lo, hi]`; `val` is the register stored (`None` for
    /// helper writes, which leave unknown scalar data).
    pub(super) fn stack_write(
        &mut self,
        st: &mut State,
        frame: u8,
        lo: i64,
        hi: i64,
        size: u32,
        val: Option<Reg>,
    ) -> R<()> {
        Self::stack_bounds(lo, hi, size as u64)?;
        self.note_depth(st, frame, lo)?;
        let f = &mut st.frames[frame as usize];
        if lo == hi && size == 8 && lo % 8 == 0 {
            if let Some(v) = val {
                *f.slot_mut(Frame::locate(lo).0) = Slot {
                    bytes: [Byte::Spill; 8],
                    spill: Some(v),
                };
                return Ok(());
            }
        }
        let zero =
            lo == hi && val.and_then(|v| v.as_scalar()).and_then(|s| s.as_const()) == Some(0);
        for a in lo..hi + size as i64 {
            let (k, b) = Frame::locate(a);
            let slot = f.slot_mut(k);
            if slot.bytes[b] == Byte::Spill {
                unspill(slot);
            }
            slot.bytes[b] = if zero { Byte::Zero } else { Byte::Misc };
        }
        // A narrow aligned store of a scalar keeps its bounds for a fill of the same
        // size (clang spills u32s under register pressure).
        if let (Some(Reg::Scalar { s, id }), true) =
            (val, lo == hi && size < 8 && lo % size as i64 == 0)
        {
            if !zero {
                let fits = s.umax < 1u64 << (size * 8);
                let kept = if fits {
                    Reg::Scalar { s, id }
                } else {
                    Reg::scalar(Scalar::from_tnum(s.tnum.cast(size)))
                };
                let (k, b) = Frame::locate(lo);
                let slot = f.slot_mut(k);
                unspill(slot);
                slot.bytes[b..b + size as usize].fill(Byte::Spill);
                slot.spill = Some(kept);
            }
        }
        Ok(())
    }

    /// A helper reads or writes `[ptr, ptr + size)` for sizes `size_min..=size_max`.
    pub(super) fn helper_mem(
        &mut self,
        st: &mut State,
        reg: u8,
        p: Reg,
        size_max: u64,
        write: bool,
    ) -> R<()> {
        if size_max == 0 {
            // Even an empty stack range must start inside the frame, as the
            // kernel requires.
            if let Reg::Ptr {
                region: Region::Stack { .. },
                off_min,
                off_max,
                ..
            } = p
            {
                if off_min < -(uapi::STACK_SIZE as i64) || off_min > -1 || off_max > 0 {
                    return Err(RejectKind::StackOutOfBounds {
                        off: off_min,
                        size: 0,
                    });
                }
            }
            return Ok(());
        }
        match p {
            Reg::Ptr {
                nullable: false,
                region,
                off_min,
                off_max,
                ..
            } => match region {
                Region::Ctx => Err(RejectKind::HelperArgType {
                    reg,
                    found: "ctx",
                    expected: "pointer to stack or map value",
                }),
                Region::Stack { frame } => {
                    Self::stack_bounds(off_min, off_max, size_max)?;
                    if write {
                        self.stack_write(st, frame, off_min, off_max, size_max as u32, None)
                    } else {
                        // Bytes never written are readable, as for direct loads.
                        self.note_depth(st, frame, off_min)
                    }
                }
                _ => Self::region_bounds(region, off_min, off_max, size_max),
            },
            _ => Err(RejectKind::HelperArgType {
                reg,
                found: p.type_name(),
                expected: "pointer to memory",
            }),
        }
    }

    /// The string a constant-string argument points to (its bytes before the NUL), once
    /// it is shown to be one as the kernel shows it: a constant offset into the value of
    /// a frozen array of one element that programs cannot write, with a NUL in it.
    pub(super) fn const_str(&mut self, reg: u8, p: Reg) -> R<Vec<u8>> {
        let Reg::Ptr {
            region: region @ Region::MapValue { fd, size },
            nullable: false,
            off_min,
            off_max,
            ..
        } = p
        else {
            return Err(RejectKind::HelperArgType {
                reg,
                found: p.type_name(),
                expected: "map_value",
            });
        };
        let m = self.map(fd)?;
        if m.flags & map_flags::RDONLY_PROG == 0 || !m.frozen {
            return Err(RejectKind::NotReadonlyMap { reg });
        }
        if off_min != off_max {
            return Err(RejectKind::NotConstantAddress { reg });
        }
        if !matches!(m.map_type, mt::ARRAY | mt::GPU_ARRAY) {
            return Err(RejectKind::NoDirectValueAccess);
        }
        // The string may run to the value's end; an offset at or past the end (or
        // before the start) reads nothing, which is out of bounds too.
        let rest = (i64::from(size) - off_min).max(1) as u64;
        Self::region_bounds(region, off_min, off_max, rest)?;
        // Only an array of one element has one address for its value; the loader
        // gives the bytes of those alone.
        let value = match &m.frozen_value {
            Some(v) if m.max_entries == 1 => v,
            _ => return Err(RejectKind::DirectValueAccessFailed),
        };
        let tail = value.get(off_min as usize..).unwrap_or_default();
        let nul = tail
            .iter()
            .position(|&b| b == 0)
            .ok_or(RejectKind::StringNotTerminated)?;
        Ok(tail[..nul].to_vec())
    }

    /// `bpf_snprintf`'s format, checked at load for the arguments `data_len` (r5)
    /// holds. The count comes from r5's known bits even when r5 is not a constant,
    /// as the kernel takes it: a range the program narrows counts as its known bits.
    pub(super) fn snprintf_format(&self, st: &State, fmt: &[u8]) -> R<()> {
        let len = st.cur().regs[5].as_scalar().map_or(0, |s| s.tnum.value);
        if !len.is_multiple_of(8) {
            return Err(RejectKind::SnprintfDataLen { len });
        }
        bprintf::parse(fmt, (len / 8) as usize)
            .map(|_| ())
            .map_err(|error| RejectKind::InvalidFormat { error })
    }

    // ---- jumps and calls ---------------------------------------------------
}
