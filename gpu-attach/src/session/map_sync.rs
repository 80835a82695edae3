//! Contexts and map sync: each context's clock, replicas and rings, the worker that
//! pulls what launches changed and drains rings, and the flush at teardown and exit.

use super::*;
use bpftime_isa::opcode as op;

impl GpuAttach {
    /// Our state in `ctx` (the current context), made on first use.
    pub(super) fn context(&self, ctx: Handle) -> Result<Arc<Context>, GpuAttachError> {
        if let Some(c) = self.read().contexts.get(&ctx) {
            return Ok(c.clone());
        }
        // One thread makes a context's resources; another asking meanwhile gets them.
        let _making = self
            .making_context
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(c) = self.read().contexts.get(&ctx) {
            return Ok(c.clone());
        }
        let api = &self.api;
        let sm = api.device_sm()?;
        let sms = api.device_attribute(ATTR_MULTIPROCESSOR_COUNT)?.max(1) as u32;
        let mut stream = 0;
        // SAFETY: writes one stream handle.
        api.check("cuStreamCreate", unsafe {
            (api.stream_create)(&mut stream, STREAM_NON_BLOCKING)
        })?;
        let mut device = 0;
        // SAFETY: writes one int.
        api.check("cuCtxGetDevice", unsafe {
            (api.ctx_get_device)(&mut device)
        })?;
        let arena = Arena::new(api, device)
            .map_err(|e| tracing::debug!("GPU attach's device memory from cuMemAlloc: {e}"))
            .ok();
        let mover = Mover {
            api,
            stream,
            arena: arena.as_ref(),
        };
        let pid_tgid_at = mover.alloc(8)?;
        mover.put(pid_tgid_at, &self.pid_tgid.to_le_bytes())?;
        let trace = RingReader::new(&mover, TRACE_RING_BYTES, 1)?;
        let load_kernel = |ptx: &str, name: &CStr| -> Result<Handle, GpuAttachError> {
            let source = CString::new(ptx)?;
            let (mut module, mut f) = (0, 0);
            // SAFETY: NUL-terminated PTX; writes a module handle.
            api.check("cuModuleLoadData", unsafe {
                (api.module_load_data)(&mut module, source.as_ptr().cast())
            })?;
            // SAFETY: writes a function handle.
            api.check("cuModuleGetFunction", unsafe {
                (api.module_get_function)(&mut f, module, name.as_ptr())
            })?;
            Ok(f)
        };
        let apply_deltas = load_kernel(APPLY_DELTAS_PTX, c"__bpftime_apply_deltas")?;
        let fold_shards = load_kernel(FOLD_SHARDS_PTX, c"__bpftime_fold_shards")?;
        let hash_ops = load_kernel(
            bpftime_gpu_device::device_maps::HASH_OPS_PTX,
            c"__bpftime_hash_ops",
        )?;
        // These were JIT-compiled, perhaps the process's first: the flush goes after the
        // compiler's teardown.
        flush_at_exit_after_loads();

        let device_name = api.device_name(device).unwrap_or_default();
        let context = Arc::new(Context {
            ctx,
            device,
            device_name,
            apply_deltas,
            fold_shards,
            hash_ops,
            sm_count: sms,
            shard_window: ShardWindow::new(sms),
            sm,
            stream,
            arena,
            pid_tgid_at,
            replicas: Mutex::new(HashMap::new()),
            trace_ring: trace.ring,
            trace: Mutex::new(trace),
            clock: Mutex::new(ContextClock::default()),
            events: Mutex::new(Vec::new()),
            timing_events: Mutex::new(Vec::new()),
            event_clock: Mutex::new(None),
            tensor_maps: Mutex::new(TensorMapTable::default()),
        });
        self.write().contexts.insert(ctx, context.clone());
        Ok(context)
    }

    /// Measures the context's global timer against the host clock with a one-thread
    /// kernel that reads it, on our own stream.
    pub(super) fn calibrate(
        &self,
        context: &Context,
        clock: &mut ContextClock,
    ) -> Result<ClockCalibration, GpuAttachError> {
        let api = &self.api;
        let mover = self.mover(context);
        if clock.timer.is_none() {
            // `return bpf_get_globaltimer();`
            let prog = [
                Insn::new(
                    op::CALL_INSN,
                    0,
                    op::CALL_HELPER,
                    0,
                    bpftime_isa::uapi::helper::GPU_GLOBALTIMER as i32,
                ),
                Insn::new(op::EXIT_INSN, 0, 0, 0, 0),
            ];
            let program = compile(
                &prog,
                &bpftime_jit_ptx::StandardGpuEnv,
                &PtxOptions {
                    sm: context.sm.clamp(70, 90),
                    symbol: "__bpftime_timer".into(),
                    ..PtxOptions::default()
                },
            )?;
            let source = CString::new(program.ptx)?;
            let mut module = 0;
            // SAFETY: NUL-terminated PTX; writes a module handle.
            api.check("cuModuleLoadData", unsafe {
                (api.module_load_data)(&mut module, source.as_ptr().cast())
            })?;
            let name = CString::new(program.kernel.unwrap_or_default())?;
            let mut f = 0;
            // SAFETY: writes a function handle.
            api.check("cuModuleGetFunction", unsafe {
                (api.module_get_function)(&mut f, module, name.as_ptr())
            })?;
            let result = mover.alloc(8)?;
            clock.timer = Some((f, result));
        }
        let (f, result) = clock.timer.expect("set above");
        clock::calibrate(|| -> Result<u64, GpuAttachError> {
            let mut mem: u64 = 0;
            let mut len: u64 = 0;
            let mut out: u64 = result;
            let mut params = [
                (&mut mem as *mut u64).cast::<std::ffi::c_void>(),
                (&mut len as *mut u64).cast(),
                (&mut out as *mut u64).cast(),
            ];
            // SAFETY: the timer kernel takes (mem, len, result) as three u64s; it only
            // writes the 8-byte result buffer.
            api.check("cuLaunchKernel", unsafe {
                (api.launch_kernel)(
                    f,
                    1,
                    1,
                    1,
                    1,
                    1,
                    1,
                    0,
                    context.stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })?;
            let mut v = [0u8; 8];
            mover.get(result, &mut v)?;
            Ok(u64::from_le_bytes(v))
        })
        .map_err(GpuAttachError::from)
    }

    /// The clock thread: re-anchors the contexts' clocks every [`REANCHOR_EVERY`], off the
    /// sync thread, whose trace lines and completion runs must not wait for it.
    pub(super) fn clock_keeper(&self) {
        loop {
            std::thread::sleep(REANCHOR_EVERY);
            let _anchoring = self.anchoring.lock().unwrap_or_else(|e| e.into_inner());
            if !may_log() {
                return;
            }
            let Some(_quiet) = self.quiet() else { continue };
            self.reanchor_all();
        }
    }

    /// The sync thread: waits for instrumented launches to complete and brings their maps
    /// back, and drains rings while kernels run.
    pub(super) fn worker(&self) {
        let mut last_drain = Instant::now();
        loop {
            // Polled often while launches are awaited (a trace line, a completion run,
            // a map's values reach the host within a fraction of a millisecond of the
            // kernel's end), seldom when the GPU has nothing of ours.
            let awaited = !self.lock_pending().is_empty() || !self.lock_timings().is_empty();
            if awaited {
                std::thread::sleep(AWAITED_POLL);
            } else {
                // Woken early by the next launch queued (`wake_worker`).
                std::thread::park_timeout(IDLE_POLL);
            }
            if !may_log() {
                // Exiting: the exit-time flush has the last word, and the driver goes
                // away right after it.
                return;
            }
            // Completions of graph launches wait for the capture beside them to end.
            let Some(_quiet) = self.quiet() else { continue };
            self.sync_completed(false);
            self.sync_timings(false);
            if last_drain.elapsed() >= DRAIN_EVERY {
                last_drain = Instant::now();
                self.drain_all();
            }
        }
    }

    pub(super) fn lock_matched(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        self.matched.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn lock_syncing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.syncing.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn lock_pending(&self) -> std::sync::MutexGuard<'_, VecDeque<Completion>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Syncs the launches that completed; with `wait`, waits for every one first.
    /// Completions come in launch order per stream; one on another stream may finish
    /// first, so each pending one is looked at.
    pub(super) fn sync_completed(&self, wait: bool) {
        let _pass = self.lock_syncing();
        let mut pending = self.lock_pending();
        let mut done = Vec::new();
        let mut i = 0;
        while i < pending.len() {
            let c = &pending[i];
            self.set_context(c.context.ctx);
            // SAFETY: an event we recorded.
            let r = unsafe {
                if wait {
                    (self.api.event_synchronize)(c.event)
                } else {
                    (self.api.event_query)(c.event)
                }
            };
            if r == CUDA_ERROR_NOT_READY {
                i += 1;
                continue;
            }
            done.push(pending.remove(i).expect("in range"));
        }
        drop(pending);
        // Launches that completed together are synced together: each map once. Arrays'
        // copies are queued together and waited for once, without their locks, which the
        // next launch's push takes (an application that waits for each launch makes its
        // next one while we pull).
        let mut pulled: Vec<*const Replica> = Vec::new();
        let warn = |r: &Replica, e: &dyn std::fmt::Display| {
            if may_log() {
                tracing::warn!(
                    map = r.map.id(),
                    "reading a map back from the GPU failed: {e}"
                );
            }
        };
        for c in &done {
            self.set_context(c.context.ctx);
            let mover = self.mover(&c.context);
            let mut copies = Vec::new();
            for r in &c.replicas {
                if pulled.contains(&Arc::as_ptr(r)) {
                    continue;
                }
                pulled.push(Arc::as_ptr(r));
                match r.take_copy(&mover) {
                    Ok(Some(copy)) => copies.push((r, copy)),
                    Ok(None) => {
                        if let Err(e) = r.pull(&mover) {
                            warn(r, &e);
                        }
                    }
                    Err(e) => warn(r, &e),
                }
            }
            if !copies.is_empty() {
                match mover.wait() {
                    Ok(()) => {
                        for (r, copy) in copies {
                            if let Err(e) = r.pull_taken(copy, &mover) {
                                warn(r, &e);
                            }
                        }
                    }
                    Err(e) => {
                        if let Some((r, _)) = copies.first() {
                            warn(r, &e);
                        }
                    }
                }
            }
            c.context
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(c.event);
        }
        // Each context's trace lines once, however many of its launches completed.
        let mut drained: Vec<*const Context> = Vec::new();
        for c in &done {
            if !drained.contains(&Arc::as_ptr(&c.context)) {
                drained.push(Arc::as_ptr(&c.context));
                self.set_context(c.context.ctx);
                self.drain_trace(&c.context);
            }
        }
    }

    /// Before a context goes away (`cuCtxDestroy`, or the primary context of `device`
    /// released or reset): everything launched in it is waited for and synced.
    pub(crate) fn before_context_teardown(&self, ctx: Option<Handle>, device: Option<i32>) {
        let current = self.api.current_context();
        let hit = |c: &Context| ctx == Some(c.ctx) || device == Some(c.device);
        if !self.contexts().iter().any(|c| hit(c)) {
            return;
        }
        // Our threads' CUDA work under way there (a build ahead of a launch, a second
        // build) ends before the context goes.
        drop(self.cuda_work.write().unwrap_or_else(|e| e.into_inner()));
        self.sync_completed(true);
        self.sync_timings(true);
        self.pull_all(hit);
        self.deliver_held(hit);
        self.set_context(current);
    }

    /// Records the store's rings had no room for yet (`replica::Backlog`), in the contexts
    /// `hit` picks, delivered before they go away (at exit, or with their context): tried
    /// again while their consumers make room, and counted as dropped once none was made
    /// for [`HELD_PATIENCE`]. Then one line for what was dropped (these, and what the
    /// devices' rings had no room for), which a consumer may never have been told: a
    /// perf buffer says what it lost only before its next record.
    pub(super) fn deliver_held(&self, hit: impl Fn(&Context) -> bool) {
        let rings: Vec<Arc<Replica>> = self
            .contexts()
            .into_iter()
            .filter(|c| hit(c))
            .flat_map(|c| {
                c.replicas
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .values()
                    .filter(|r| matches!(r.kind, DeviceKind::Ringbuf | DeviceKind::PerfEventArray))
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut least = usize::MAX;
        let mut since = Instant::now();
        let given_up = loop {
            let held: usize = rings.iter().map(|r| r.retry_held()).sum();
            if held == 0 {
                break 0;
            }
            if held < least {
                least = held;
                since = Instant::now();
            } else if since.elapsed() >= HELD_PATIENCE {
                break rings.iter().map(|r| r.give_up_held()).sum();
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let on_device: u64 = rings.iter().map(|r| r.take_device_dropped()).sum();
        // Also at exit, when tracing may be gone (`may_log`).
        if given_up > 0 {
            eprintln!(
                "bpftime: {given_up} GPU ring buffer or perf buffer records dropped: their \
                 consumer made no room for them in {} s",
                HELD_PATIENCE.as_secs()
            );
        }
        if on_device > 0 {
            eprintln!(
                "bpftime: {on_device} GPU ring buffer or perf buffer records dropped on the \
                 GPU: its ring was full before the host read it (a ring buffer's max_entries \
                 sizes it; a perf event array's is {} MiB)",
                bpftime_gpu_device::replica::PERF_RING_BYTES >> 20
            );
        }
    }

    /// Every replica of the contexts `hit` picks, pulled whatever launched (a CUDA graph's
    /// launches, say, which are not seen one by one), and their trace lines drained.
    pub(super) fn pull_all(&self, hit: impl Fn(&Context) -> bool) {
        self.pull_replicas(hit, |_| true);
    }

    /// Pulls the replicas `which` picks in the contexts `hit` picks, and drains those
    /// contexts' trace lines: one sync pass.
    pub(super) fn pull_replicas(
        &self,
        hit: impl Fn(&Context) -> bool,
        which: impl Fn(&Replica) -> bool,
    ) {
        let _pass = self.lock_syncing();
        for c in self.contexts().into_iter().filter(|c| hit(c)) {
            self.set_context(c.ctx);
            let mover = self.mover(&c);
            let replicas: Vec<Arc<Replica>> = c
                .replicas
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .filter(|r| which(r))
                .cloned()
                .collect();
            for r in replicas {
                let _ = r.pull(&mover);
            }
            self.drain_trace(&c);
        }
    }

    /// After a context went away: its replicas, modules and streams went with it.
    pub(crate) fn after_context_teardown(&self, ctx: Option<Handle>, device: Option<i32>) {
        let gone: Vec<Handle> = self
            .contexts()
            .iter()
            .filter(|c| {
                ctx == Some(c.ctx)
                    || device.is_some_and(|d| {
                        c.device == d && {
                            let (mut flags, mut active) = (0, 0);
                            // SAFETY: writes two ints.
                            let r = unsafe {
                                (self.api.primary_ctx_get_state)(d, &mut flags, &mut active)
                            };
                            r != CUDA_SUCCESS || active == 0
                        }
                    })
            })
            .map(|c| c.ctx)
            .collect();
        if gone.is_empty() {
            return;
        }
        let mut st = self.write();
        for g in &gone {
            st.contexts.remove(g);
        }
        st.patched.retain(|(c, _), _| !gone.contains(c));
        drop(st);
        self.lock_pending()
            .retain(|p| !gone.contains(&p.context.ctx));
        self.lock_timings()
            .retain(|t| !gone.contains(&t.context.ctx));
    }

    /// Brings everything the GPU has for the store in: every launch waited for and synced,
    /// every ring drained. Runs at exit, before the driver tears its contexts down.
    pub fn flush(&self) {
        // A re-anchor under way finishes first; none starts once the process is exiting.
        let _anchoring = self.anchoring.lock().unwrap_or_else(|e| e.into_inner());
        self.sync_completed(true);
        self.sync_timings(true);
        self.pull_all(|_| true);
        self.deliver_held(|_| true);
    }

    /// One line for each probe whose pattern named no kernel the process launched.
    pub(super) fn report_unmatched(&self) {
        let matched = self.lock_matched().clone();
        let mut unmatched: Vec<(String, String)> = self
            .read()
            .probes
            .values()
            .filter(|p| !matched.contains(&p.link_id))
            .map(|p| (p.name.clone(), p.pattern.clone()))
            .collect();
        unmatched.extend(
            self.launch
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .probes
                .values()
                .filter(|p| !matched.contains(&p.link_id))
                .map(|p| (p.name.clone(), p.pattern.clone())),
        );
        for (name, pattern) in unmatched {
            eprintln!(
                "bpftime: GPU probe {name} on `{pattern}` never ran: no kernel this process \
                 launched has that name (a mangled or demangled name, or a glob like \
                 `*{pattern}*`)"
            );
        }
        let untimed = self.untimed.load(Ordering::Relaxed);
        if untimed > 0 {
            eprintln!(
                "bpftime: {untimed} launches got no completion run (their GPU times): more \
                 than {TIMINGS_IN_FLIGHT} were awaited at once"
            );
        }
    }

    pub(super) fn set_context(&self, ctx: Handle) {
        // SAFETY: a context the application made; it stays current on this thread only.
        unsafe { (self.api.ctx_set_current)(ctx) };
    }

    /// Moves bytes in `context` on its stream of ours.
    pub(super) fn mover<'a>(&'a self, context: &'a Context) -> Mover<'a> {
        Mover {
            api: &self.api,
            stream: context.stream,
            arena: context.arena.as_ref(),
        }
    }

    pub(super) fn contexts(&self) -> Vec<Arc<Context>> {
        self.read().contexts.values().cloned().collect()
    }

    /// Rings (ring buffers, perf buffers, trace lines) drained while kernels run.
    pub(super) fn drain_all(&self) {
        self.pull_replicas(
            |_| true,
            |r| matches!(r.kind, DeviceKind::Ringbuf | DeviceKind::PerfEventArray),
        );
    }

    pub(super) fn drain_trace(&self, context: &Context) {
        let records = {
            let mut trace = context.trace.lock().unwrap_or_else(|e| e.into_inner());
            match trace.read(&self.mover(context)) {
                Ok((records, _)) => records,
                Err(_) => return,
            }
        };
        if records.is_empty() {
            return;
        }
        let calibration = context
            .clock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .calibration;
        for r in records {
            let Some(line) = TraceLine::parse(&r.data, r.raw) else {
                continue;
            };
            let at_ns = calibration.map(|c| line.timer.saturating_add_signed(c.offset_ns));
            match at_ns {
                Some(ns) => bpftime_runtime::helpers::emit_trace_at(&line.text, ns),
                None => bpftime_runtime::helpers::emit_trace(&line.text),
            }
            crate::observer::gpu_print(|| crate::observer::GpuPrint {
                device: context.device,
                at_ns,
                error_ns: calibration.map_or(0, |c| c.error_ns),
                sm: line.sm,
                block: line.block,
                grid: line.grid,
                text: line.text,
            });
        }
    }

    pub(super) fn reanchor_all(&self) {
        for context in self.contexts() {
            let mut clock = context.clock.lock().unwrap_or_else(|e| e.into_inner());
            if clock.globals.is_empty() && !clock.wanted {
                continue;
            }
            self.set_context(context.ctx);
            match self.calibrate(&context, &mut clock) {
                Ok(c) => {
                    let mover = self.mover(&context);
                    for &g in &clock.globals {
                        let _ = mover.put(g, &c.offset_ns.to_le_bytes());
                    }
                    clock.calibration = Some(c);
                }
                Err(e) => tracing::debug!("clock re-anchor failed: {e}"),
            }
        }
    }

    /// Each device GPU attach has worked on: its ordinal, name, and the calibration of
    /// its clock (once a probe that reads the clock, or a timeline, asked for one).
    pub fn devices(&self) -> Vec<GpuDevice> {
        let mut devices: Vec<GpuDevice> = Vec::new();
        for c in self.contexts() {
            let calibration = c
                .clock
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .calibration;
            if let Some(d) = devices.iter_mut().find(|d| d.ordinal == c.device) {
                d.calibration = d.calibration.or(calibration);
                continue;
            }
            devices.push(GpuDevice {
                ordinal: c.device,
                name: c.device_name.clone(),
                calibration,
            });
        }
        devices.sort_by_key(|d| d.ordinal);
        devices
    }

    /// The calibration of the current context's clock, with its error bound, once a probe
    /// that reads the clock has run there.
    pub fn clock_calibration(&self) -> Vec<ClockCalibration> {
        self.contexts()
            .iter()
            .filter_map(|c| {
                c.clock
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .calibration
            })
            .collect()
    }
}
