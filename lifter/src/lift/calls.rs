//! Calls: helpers (inlined where a map's layout allows: array lookups and updates in
//! place), the program's own functions, `callx` and tail calls.

use super::*;

impl<'ctx> Lifter<'_, 'ctx> {
    pub(super) fn args(
        &self,
        f: &Frame<'ctx>,
        pc: usize,
    ) -> Result<Vec<BasicMetadataValueEnum<'ctx>>> {
        (1..=5).map(|r| Ok(self.read(f, pc, r)?.into())).collect()
    }

    pub(super) fn call(&self, f: &Frame<'ctx>, pc: usize, i: &Insn) -> Result<()> {
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
    pub(super) fn array_slot(
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
    pub(super) fn cpu_number(&self) -> Option<CpuNumber> {
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
    pub(super) fn slot_taking_entry(
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
    pub(super) fn inline_or_helper(
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
    pub(super) fn inline_answer_or_helper(
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
    pub(super) fn inline_array_lookup(
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
    pub(super) fn inline_array_update(
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
    pub(super) fn call_helper_on_slow_path(
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

    pub(super) fn call_helper(
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

    pub(super) fn constant_pointer(&self, addr: u64) -> Result<PointerValue<'ctx>> {
        let v = self.i64t.const_int(addr, false);
        Ok(self
            .builder
            .build_int_to_ptr(v, self.context.ptr_type(Default::default()), "fnptr")?)
    }

    /// `callx`: the register holds a helper id, as in uBPF. The target is only known at
    /// run time, so dispatch over every helper the target offers; an unknown id leaves 0
    /// in r0 rather than trapping inside the host process.
    pub(super) fn callx(&self, f: &Frame<'ctx>, pc: usize, i: &Insn) -> Result<()> {
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
    pub(super) fn tail_call(&self, f: &Frame<'ctx>, pc: usize) -> Result<()> {
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
