//! Calls: helper calls with their argument and return rules, calls of the program's
//! own functions and callbacks, and `exit` from each frame.

use super::*;

impl Verifier<'_> {
    pub(super) fn exit(&mut self, st: &mut State) -> R<Flow> {
        // A callee may return nothing (a void function); only its caller's read of
        // r0 must find a value.
        let r0 = match st.cur().kind {
            FrameKind::Call { .. } => st.cur().regs[0],
            _ => Self::read(st, 0)?,
        };
        let depth = st.frames.len() - 1;
        match st.cur().kind {
            // The return value of a probe is ignored; privileged programs may
            // return a pointer, so r0 only has to be initialized.
            FrameKind::Main => {
                if let Some(&(ref_id, alloc_insn)) = st.refs.first() {
                    return Err(RejectKind::UnreleasedReference { ref_id, alloc_insn });
                }
                Ok(Flow::End)
            }
            FrameKind::Call { ret } => {
                if matches!(r0, Reg::Ptr { region: Region::Stack { frame }, .. } if frame as usize == depth)
                {
                    return Err(RejectKind::ReturnStackPointer);
                }
                st.frames.pop();
                forget_frame(st, depth);
                let f = st.cur_mut();
                f.regs[0] = r0;
                f.regs[1..6].fill(Reg::Uninit);
                Ok(Flow::Goto(ret))
            }
            FrameKind::Loop { call, ctx } => {
                let Some(s) = r0.as_scalar() else {
                    return Err(RejectKind::ReturnNotScalar { ty: r0.type_name() });
                };
                if s.umax > 1 {
                    return Err(RejectKind::CallbackReturnRange {
                        umin: s.umin,
                        umax: s.umax,
                    });
                }
                // Either another iteration runs, or the loop ends and the helper returns.
                let sp = st.cur().subprog;
                let invocation = st.cur().invocation;
                let iteration = st.cur().iteration + 1;
                st.frames.pop();
                forget_frame(st, depth);
                let mut again = st.clone();
                again.frames.push(Self::callback_frame(
                    depth as u8,
                    call,
                    ctx,
                    sp,
                    invocation,
                    iteration,
                ));
                let f = st.cur_mut();
                f.regs[0] = Reg::unknown();
                f.regs[1..6].fill(Reg::Uninit);
                Ok(Flow::Fork(call + 1, again, sp))
            }
        }
    }

    pub(super) fn callback_frame(
        depth: u8,
        call: usize,
        ctx: Reg,
        subprog: usize,
        invocation: u32,
        iteration: u32,
    ) -> Frame {
        let mut f = Frame::new(depth, FrameKind::Loop { call, ctx }, subprog);
        f.invocation = invocation;
        f.iteration = iteration;
        f.regs[1] = Reg::unknown();
        f.regs[2] = ctx;
        f
    }

    pub(super) fn push_frame_check(&self, st: &State, target: usize) -> R<()> {
        if st.frames.len() >= uapi::MAX_CALL_FRAMES {
            return Err(RejectKind::CallStackTooDeep {
                frames: st.frames.len() + 1,
            });
        }
        if st.frames.iter().any(|f| f.subprog == target) {
            return Err(RejectKind::RecursiveCall { target });
        }
        Ok(())
    }

    pub(super) fn call(&mut self, st: &mut State, pc: usize, target: usize) -> R<Flow> {
        self.push_frame_check(st, target)?;
        let depth = st.frames.len() as u8;
        let mut f = Frame::new(depth, FrameKind::Call { ret: pc + 1 }, target);
        f.regs[1..6].copy_from_slice(&st.cur().regs[1..6]);
        st.frames.push(f);
        Ok(Flow::Goto(target))
    }

    pub(super) fn helper(&mut self, st: &mut State, id: i32, pc: usize) -> R<Flow> {
        let proto = u32::try_from(id)
            .ok()
            .and_then(helpers::proto)
            .ok_or(RejectKind::UnknownHelper { id })?;
        let uid = id as u32;
        if self.p.gpu && !proto.gpu {
            return Err(RejectKind::HelperNotOnGpu {
                id: uid,
                name: proto.name,
            });
        }
        if !self.p.gpu && !proto.cpu {
            return Err(RejectKind::HelperNotOnCpu {
                id: uid,
                name: proto.name,
            });
        }
        let mut map: Option<(i32, MapDesc)> = None;
        let mut pending_mem: Option<(u8, Reg, Arg)> = None;
        let mut reserve_size = 0u32;
        let mut callback = None;
        let mut const_key = None;
        let mut size_max = u64::MAX;
        let mut const_str = None;
        let mut null_ctx = None;
        for (n, arg) in proto.args.iter().enumerate() {
            let r = n as u8 + 1;
            let v = Self::read(st, r)?;
            if matches!(
                v,
                Reg::Ptr {
                    region: Region::Ctx,
                    ..
                }
            ) {
                self.stats.ctx_words_read = u64::MAX;
            }
            let wrong = |expected: &'static str| RejectKind::HelperArgType {
                reg: r,
                found: v.type_name(),
                expected,
            };
            match *arg {
                Arg::Anything => {}
                Arg::Scalar => {
                    if v.as_scalar().is_none() {
                        return Err(wrong("scalar"));
                    }
                }
                Arg::Map(types) => {
                    let Reg::MapPtr { fd } = v else {
                        return Err(wrong("map_ptr"));
                    };
                    let m = self.map(fd)?;
                    if !types.contains(&m.map_type) {
                        return Err(RejectKind::MapHelperMismatch {
                            map_type: m.map_type,
                            id: uid,
                            name: proto.name,
                        });
                    }
                    map = Some((fd, m));
                }
                Arg::MapKey | Arg::MapValue | Arg::MapValueOut => {
                    let (_, m) = map.as_ref().expect("prototypes name the map first");
                    let (size, write) = match *arg {
                        Arg::MapKey => (m.key_size, false),
                        Arg::MapValue => (m.value_size, false),
                        _ => (m.value_size, true),
                    };
                    if !matches!(
                        v,
                        Reg::Ptr {
                            nullable: false,
                            ..
                        }
                    ) {
                        return Err(wrong("pointer to stack or map value"));
                    }
                    self.helper_mem(st, r, v, size as u64, write)?;
                    // A per-thread array's lookup misses for threads past its count.
                    if *arg == Arg::MapKey
                        && matches!(mt::served_as(m.map_type), mt::ARRAY | mt::PERCPU_ARRAY)
                    {
                        const_key = const_stack_key(st, v, m.key_size);
                    }
                }
                Arg::Mem | Arg::MemOut | Arg::MemOrNull => pending_mem = Some((r, v, *arg)),
                Arg::MemOutFixed(size) => self.helper_mem(st, r, v, size as u64, true)?,
                Arg::Str => self.helper_mem(st, r, v, 1, false)?,
                Arg::ConstStr => const_str = Some(self.const_str(r, v)?),
                Arg::Size | Arg::SizeOrZero => {
                    let Some(s) = v.as_scalar() else {
                        return Err(wrong("scalar"));
                    };
                    if s.smin < 0 {
                        return Err(RejectKind::SizeNegative { reg: r });
                    }
                    if s.umax >= MAX_VAR_OFF as u64 {
                        return Err(RejectKind::SizeUnbounded { reg: r });
                    }
                    if *arg == Arg::Size && s.umin == 0 {
                        return Err(RejectKind::SizeZero { reg: r });
                    }
                    size_max = s.umax;
                    let (mr, mv, kind) = pending_mem
                        .take()
                        .expect("prototypes put the memory before its size");
                    let null = mv.as_scalar().and_then(|s| s.as_const()) == Some(0);
                    if kind == Arg::MemOrNull && null {
                        continue;
                    }
                    if s.umax == 0 && null {
                        continue;
                    }
                    if !matches!(
                        mv,
                        Reg::Ptr {
                            nullable: false,
                            ..
                        }
                    ) {
                        return Err(RejectKind::HelperArgType {
                            reg: mr,
                            found: mv.type_name(),
                            expected: "pointer to memory",
                        });
                    }
                    self.helper_mem(st, mr, mv, s.umax, kind == Arg::MemOut)?;
                }
                Arg::ConstSize => {
                    let c = v
                        .as_scalar()
                        .and_then(|s| s.as_const())
                        .ok_or(RejectKind::NotConstant { reg: r })?;
                    // Any constant: a reservation larger than the ring fails at
                    // run time (NULL), and no ring holds more than u32::MAX bytes.
                    reserve_size = c.min(u64::from(u32::MAX)) as u32;
                }
                Arg::Ctx => {
                    let null = v.as_scalar().and_then(|s| s.as_const()) == Some(0);
                    if null && uid == h::PERF_EVENT_OUTPUT {
                        // bpftime's GPU programs pass NULL to bpf_perf_event_output on
                        // a GPU ring buffer (which has no use for it): allowed there
                        // alone, once the map argument shows which map it is.
                        null_ctx = Some(wrong("ctx"));
                    } else if !matches!(
                        v,
                        Reg::Ptr {
                            region: Region::Ctx,
                            off_min: 0,
                            off_max: 0,
                            ..
                        }
                    ) {
                        return Err(wrong("ctx"));
                    }
                }
                Arg::RingbufRelease => {
                    let Reg::Ptr {
                        region: Region::Ringbuf { .. },
                        nullable: false,
                        off_min: 0,
                        off_max: 0,
                        ref_id,
                        ..
                    } = v
                    else {
                        return Err(RejectKind::BadRelease { reg: r });
                    };
                    if ref_id == 0 || !st.refs.iter().any(|(x, _)| *x == ref_id) {
                        return Err(RejectKind::BadRelease { reg: r });
                    }
                    release(st, ref_id);
                }
                Arg::TaskOrNull => {
                    let null = v.as_scalar().and_then(|s| s.as_const()) == Some(0);
                    let task = matches!(
                        v,
                        Reg::Ptr {
                            region: Region::Task,
                            off_min: 0,
                            off_max: 0,
                            ..
                        }
                    );
                    if !null && !task {
                        return Err(wrong("ptr_task_struct"));
                    }
                }
                Arg::MapValueOrNull => {
                    let (_, m) = map.as_ref().expect("prototypes name the map first");
                    let null = v.as_scalar().and_then(|s| s.as_const()) == Some(0);
                    if !null {
                        if !matches!(
                            v,
                            Reg::Ptr {
                                nullable: false,
                                ..
                            }
                        ) {
                            return Err(wrong("pointer to stack or map value"));
                        }
                        self.helper_mem(st, r, v, m.value_size as u64, false)?;
                    }
                }
                Arg::StackOrNull => {
                    let null = v.as_scalar().and_then(|s| s.as_const()) == Some(0);
                    let stack = matches!(
                        v,
                        Reg::Ptr {
                            region: Region::Stack { .. },
                            nullable: false,
                            ..
                        }
                    );
                    if !null && !stack {
                        return Err(wrong("fp"));
                    }
                }
                Arg::Callback => {
                    let Reg::Func { pc } = v else {
                        return Err(wrong("func"));
                    };
                    callback = Some(pc);
                }
            }
        }
        if uid == h::SNPRINTF {
            let fmt = const_str.expect("bpf_snprintf's format is a constant string");
            self.snprintf_format(st, &fmt)?;
        }
        if let Some(refused) = null_ctx {
            if map
                .as_ref()
                .is_none_or(|(_, m)| m.map_type != mt::GPU_RINGBUF)
            {
                return Err(refused);
            }
        }
        let ctx_arg = st.cur().regs[3];
        // bpf_loop told to run no iteration never calls its callback (the kernel
        // does not look at the callback then either).
        let no_iterations =
            uid == h::LOOP && st.cur().regs[1].as_scalar().and_then(|s| s.as_const()) == Some(0);
        let r0 = match proto.ret {
            // These return how many bytes they wrote (at most the size they were
            // given) or a negative errno, which the kernel also knows.
            Ret::Integer if returns_length(uid) => Reg::scalar(
                Scalar {
                    smin: -MAX_ERRNO,
                    smax: size_max as i64,
                    ..Scalar::UNKNOWN
                }
                .normalized()
                .unwrap_or(Scalar::UNKNOWN),
            ),
            Ret::Integer => Reg::unknown(),
            Ret::Void => Reg::Uninit,
            Ret::MapValueOrNull
                if map.as_ref().is_some_and(|(_, m)| {
                    matches!(m.map_type, mt::ARRAY_OF_MAPS | mt::HASH_OF_MAPS)
                }) =>
            {
                // A lookup in a map of maps gives an inner map, or NULL: the program
                // may pass it to map helpers once it tested it, as in the kernel.
                let fd = map.as_ref().expect("lookup names a map").0;
                let inner = inner_map_key(fd);
                self.map(inner)?;
                Reg::Ptr {
                    region: Region::InnerMap { fd: inner },
                    off_min: 0,
                    off_max: 0,
                    off_bits: Tnum::konst(0),
                    nullable: true,
                    id: self.fresh_id(),
                    ref_id: 0,
                }
            }
            Ret::MapValueOrNull => {
                let (fd, m) = map.as_ref().expect("lookup names a map");
                let fd = *fd;
                // An array lookup with a constant key in range cannot miss (the
                // kernel drops the null check there too).
                let hit = uid == h::MAP_LOOKUP_ELEM
                    && const_key.is_some_and(|k| k < u64::from(m.max_entries));
                let id = if hit { 0 } else { self.fresh_id() };
                Reg::Ptr {
                    region: Region::MapValue {
                        fd,
                        size: m.value_size,
                    },
                    off_min: 0,
                    off_max: 0,
                    off_bits: Tnum::konst(0),
                    nullable: !hit,
                    id,
                    ref_id: 0,
                }
            }
            Ret::Task => Reg::ptr(Region::Task, 0),
            Ret::RingbufOrNull => {
                let id = self.fresh_id();
                st.refs.push((id, pc));
                Reg::Ptr {
                    region: Region::Ringbuf { size: reserve_size },
                    off_min: 0,
                    off_max: 0,
                    off_bits: Tnum::konst(0),
                    nullable: true,
                    id,
                    ref_id: id,
                }
            }
        };
        let f = st.cur_mut();
        f.regs[1..6].fill(Reg::Uninit);
        f.regs[0] = r0;
        if uid == h::LOOP && !no_iterations {
            let target = callback.expect("bpf_loop takes a callback");
            self.push_frame_check(st, target)?;
            let mut inside = st.clone();
            let depth = inside.frames.len() as u8;
            let invocation = self.fresh_id();
            inside.frames.push(Self::callback_frame(
                depth, pc, ctx_arg, target, invocation, 0,
            ));
            // Zero iterations is one outcome; the callback running is the other.
            return Ok(Flow::Fork(pc + 1, inside, target));
        }
        Ok(Flow::Goto(pc + 1))
    }
}
