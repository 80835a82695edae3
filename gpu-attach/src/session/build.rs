//! The instrumented-module build: probes compiled for a context, spliced into the
//! module's PTX, loaded by the driver, refitted to the kernel's register budget.

use super::*;

impl GpuAttach {
    pub(super) fn any_probe_matches(&self, kernel: &str) -> bool {
        self.read()
            .probes
            .values()
            .any(|p| names::matches(&p.pattern, kernel))
    }

    /// The instrumented module of `image` in `ctx` for the current probes, built on first
    /// use. `None` when nothing in it is probed or it cannot be instrumented.
    /// The instrumented module of `image` in `ctx`, if built for the current probes.
    pub(super) fn ready_patched(&self, ctx: Handle, image: u64) -> Option<Arc<Patched>> {
        let st = self.read();
        st.patched
            .get(&(ctx, image))
            .filter(|p| p.generation == st.generation)
            .cloned()
    }

    pub(super) fn patched(
        &'static self,
        ctx: Handle,
        image: u64,
        kernel: &str,
    ) -> Option<Arc<Patched>> {
        if let Some(p) = self.ready_patched(ctx, image) {
            return Some(p);
        }
        let generation = self.read().generation;
        let _build = self.build.lock().unwrap_or_else(|e| e.into_inner());
        // Again under the build lock: another thread may have just built it.
        if let Some(p) = self.ready_patched(ctx, image) {
            return Some(p);
        }
        let (img, probes) = {
            let st = self.read();
            (
                st.images.get(&image).cloned()?,
                st.probes.values().cloned().collect::<Vec<_>>(),
            )
        };
        let started = Instant::now();
        let (built, refit) = match self.build_patched(ctx, &img, &probes, kernel, generation) {
            Some((built, refit)) => (Some(built), refit),
            None => (None, None),
        };
        let patched = Arc::new(built.unwrap_or_else(|| Patched {
            generation,
            context: None,
            functions: HashMap::new(),
            replicas: Vec::new(),
            variables: Arc::new([]),
            tensor_copies: false,
        }));
        if !patched.functions.is_empty() {
            tracing::info!(
                kernels = patched.functions.len(),
                ms = started.elapsed().as_secs_f64() * 1e3,
                "instrumented module ready"
            );
        }
        self.write().patched.insert((ctx, image), patched.clone());
        if let Some(refit) = refit {
            self.refit_behind(ctx, image, refit, patched.clone());
        }
        Some(patched)
    }

    /// The instrumented module of `image` for the probes, and its second build with fewer
    /// registers to make off the launch path where one may pay (see [`BuildInputs`]).
    pub(super) fn build_patched(
        &self,
        ctx: Handle,
        image: &Arc<Image>,
        probes: &[Arc<GpuProbe>],
        kernel: &str,
        generation: u64,
    ) -> Option<(Patched, Option<BuildInputs>)> {
        let context = match self.context(ctx) {
            Ok(c) => c,
            Err(e) => {
                self.notice(&format!("ctx:{ctx}"), || {
                    format!("GPU probes are off in this CUDA context: {e}")
                });
                return None;
            }
        };
        let ptx = match &image.ptx {
            Ok(p) => p,
            Err(e) => {
                self.notice(&format!("image:{kernel}"), || {
                    format!(
                        "kernel {kernel} runs uninstrumented: its module image is unreadable ({e})"
                    )
                });
                return None;
            }
        };
        let text = match ptx.ptx_for(context.sm) {
            Ok(Some((text, _))) => text,
            Ok(None) => {
                for p in probes.iter().filter(|p| names::matches(&p.pattern, kernel)) {
                    self.lock_matched().insert(p.link_id);
                }
                if probes.iter().any(|p| names::matches(&p.pattern, kernel)) {
                    self.notice(&format!("noptx:{kernel}"), || {
                        format!(
                            "kernel {kernel} has no PTX for sm_{} (its module carries only \
                             machine code): device probes cannot run in it; it gets launch \
                             events only (build it with PTX: nvcc -gencode \
                             arch=compute_XX,code=compute_XX; CuPy: CUPY_COMPILE_WITH_PTX=1)",
                            context.sm
                        )
                    });
                }
                return None;
            }
            Err(e) => {
                self.notice(&format!("ptx:{kernel}"), || {
                    format!("kernel {kernel} runs uninstrumented: its PTX cannot be read ({e})")
                });
                return None;
            }
        };
        let module = match PtxModule::parse(&text) {
            Ok(m) => m,
            Err(e) => {
                self.notice(&format!("parse:{kernel}"), || {
                    format!("kernel {kernel} runs uninstrumented: its PTX does not parse ({e})")
                });
                return None;
            }
        };
        // The probes this module gets, each named by its place among them: the same tool
        // on the same module compiles to the same text in every run, whatever link ids
        // the store handed out (the caches key on the text).
        let used: Vec<Arc<GpuProbe>> = probes
            .iter()
            .filter(|p| {
                module
                    .kernels
                    .iter()
                    .any(|k| names::matches(&p.pattern, &k.name))
            })
            .cloned()
            .collect();
        let symbol_of = |link_id: u32| {
            probe_symbol(used.iter().position(|u| u.link_id == link_id).unwrap_or(0) as u32)
        };
        // Which probes go where.
        let mut calls: Vec<(String, Vec<ProbeCall>)> = Vec::new();
        for k in &module.kernels {
            let mine: Vec<&Arc<GpuProbe>> = probes
                .iter()
                .filter(|p| names::matches(&p.pattern, &k.name))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let shared = mine.iter().any(|p| p.point == ProbePoint::SharedAccess);
            let unseen: Vec<&String> = k
                .unseen_accesses
                .iter()
                .chain(k.unseen_shared_accesses.iter().filter(|_| shared))
                .collect();
            if let Some(first) = unseen.first() {
                if shared || mine.iter().any(|p| p.point == ProbePoint::Access) {
                    let (name, n) = (&k.name, unseen.len());
                    self.notice(&format!("unseen:{name}"), || {
                        format!(
                            "kernel {name}: memory-access probes miss {n} of its memory statements, e.g. {first}"
                        )
                    });
                }
            }
            calls.push((
                k.name.clone(),
                mine.iter()
                    .map(|p| ProbeCall {
                        point: p.point,
                        symbol: symbol_of(p.link_id),
                    })
                    .collect(),
            ));
            for p in mine {
                self.lock_matched().insert(p.link_id);
            }
        }
        if calls.is_empty() {
            return None;
        }
        let probe_sm = module.sm.unwrap_or(context.sm).clamp(70, 90);
        let compile_started = Instant::now();
        let mut definitions = String::new();
        let mut replicas: Vec<Arc<Replica>> = Vec::new();
        let mut clock_globals = Vec::new();
        let mut failed: Vec<(u32, GpuAttachError)> = Vec::new();
        for (p, compiled) in used
            .iter()
            .zip(self.compile_probes(&context, &used, probe_sm))
        {
            match compiled {
                Ok(compiled) => {
                    definitions.push_str(&strip_header(&compiled.ptx));
                    definitions.push('\n');
                    clock_globals.extend(compiled.clock_offset);
                    for r in compiled.replicas {
                        if !replicas.iter().any(|x| Arc::ptr_eq(x, &r)) {
                            replicas.push(r);
                        }
                    }
                }
                Err(e) => failed.push((p.link_id, e)),
            }
        }
        if !failed.is_empty() {
            for (link, e) in &failed {
                let name = used
                    .iter()
                    .find(|p| p.link_id == *link)
                    .map_or("?", |p| p.name.as_str());
                self.notice(&format!("compile:{link}"), || {
                    format!("GPU probe {name} cannot run: {e}")
                });
            }
            let failed_symbols: Vec<String> = failed.iter().map(|(l, _)| symbol_of(*l)).collect();
            for (_, c) in &mut calls {
                c.retain(|call| !failed_symbols.contains(&call.symbol));
            }
            calls.retain(|(_, c)| !c.is_empty());
            if calls.is_empty() {
                return None;
            }
        }
        let splice = Splice {
            definitions,
            needs_version: Some(Version::new(7, 8)),
            needs_sm: Some(probe_sm),
            calls,
            inline: true,
        };
        let limit = Version::newest_for_driver(self.driver_version.max(11080));
        let spliced = match module.splice(&splice, limit) {
            Ok(s) => s,
            Err(e) => {
                self.notice(&format!("splice:{kernel}"), || {
                    format!("kernel {kernel} runs uninstrumented: {e}")
                });
                return None;
            }
        };
        if std::env::var_os("BPFTIME_GPU_DUMP").is_some() {
            let path = std::env::temp_dir()
                .join(format!("bpftime-gpu-{}-{kernel}.ptx", std::process::id()));
            let _ = std::fs::write(&path, &spliced);
            tracing::info!(path = %path.display(), "instrumented PTX written");
        }
        let compile_ms = compile_started.elapsed().as_secs_f64() * 1e3;
        let load_started = Instant::now();
        let loaded = self.api.load_ptx(&spliced);
        // The driver's JIT may have come in with this load: the flush goes after it.
        flush_at_exit_after_loads();
        let handle = match loaded {
            Ok(handle) => handle,
            Err(r) => {
                let names: Vec<&str> = splice.calls.iter().map(|(k, _)| k.as_str()).collect();
                let why = self.api.error_name(r);
                self.notice(&format!("load:{kernel}"), || {
                    format!(
                        "kernels {} run uninstrumented: the driver refused the instrumented module ({why})",
                        names.join(", ")
                    )
                });
                return None;
            }
        };
        let caps = self.register_caps(&splice, handle);
        let load_ms = load_started.elapsed().as_secs_f64() * 1e3;
        let built = BuildInputs {
            caps,
            spliced,
            image: image.clone(),
            module,
            kernels: splice.calls.iter().map(|(k, _)| k.clone()).collect(),
            clock_globals,
            replicas,
            generation,
            kernel: kernel.to_string(),
        };
        let patched = self.patched_from(&built, context, handle)?;
        tracing::info!(
            kernel,
            probes_and_splice_ms = compile_ms,
            driver_load_ms = load_ms,
            "instrumented module built"
        );
        Some((patched, (!built.caps.is_empty()).then_some(built)))
    }

    /// Patched from the loaded instrumented module `handle`: its functions, its twins of
    /// the application's module variables, and its probes' clock offsets set.
    pub(super) fn patched_from(
        &self,
        b: &BuildInputs,
        context: Arc<Context>,
        handle: Handle,
    ) -> Option<Patched> {
        let mut functions = HashMap::new();
        for k in &b.kernels {
            if let Some(f) = self.api.module_function(handle, k) {
                functions.insert(Arc::<str>::from(k.as_str()), f);
            }
        }
        let variables = match self.share_variables(&b.image, &b.module, handle) {
            Ok(v) => v,
            Err(why) => {
                let kernel = &b.kernel;
                self.notice(&format!("variables:{kernel}"), || {
                    format!("kernels {} run uninstrumented: {why}", b.kernels.join(", "))
                });
                return None;
            }
        };
        // The probes' clock offsets, and the context's clock.
        let globals: Vec<DevicePtr> = b
            .clock_globals
            .iter()
            .filter_map(|g| self.module_global(handle, g))
            .collect();
        // A timeline places GPU trace lines on the host clock by the context's calibration.
        let timed_lines = crate::observer::observing();
        if !globals.is_empty() || timed_lines {
            let mover = self.mover(&context);
            let mut clock = context.clock.lock().unwrap_or_else(|e| e.into_inner());
            clock.wanted |= timed_lines;
            if clock.calibration.is_none() {
                clock.calibration = self.calibrate(&context, &mut clock).ok();
            }
            if let Some(c) = clock.calibration {
                for &g in &globals {
                    let _ = mover.put(g, &c.offset_ns.to_le_bytes());
                }
            }
            clock.globals.extend(globals);
        }
        // The table of tensor maps its tensor copies' probes look in.
        let tensor_copies = match self
            .module_global(handle, bpftime_gpu_ptx::ptx::TENSOR_MAPS_GLOBAL)
        {
            Some(global) => match self.tensor_map_table(&context) {
                Ok(at) => {
                    let mover = self.mover(&context);
                    if let Err(e) = mover.put(global, &at.to_le_bytes()) {
                        tracing::warn!("pointing probes at the tensor map table failed: {e}");
                    }
                    true
                }
                Err(e) => {
                    self.notice("tensor-table", || {
                        format!("tensor copies are not probed: their table cannot be made ({e})")
                    });
                    false
                }
            },
            None => false,
        };
        Some(Patched {
            generation: b.generation,
            context: Some(context),
            functions,
            replicas: b.replicas.to_vec(),
            variables: variables.into(),
            tensor_copies,
        })
    }

    /// The register caps worth a second build of the instrumented module `handle`: for
    /// its kernels whose probes call out of line (the ring writers), one allocation unit
    /// fewer a thread wherever they take more than [`FULL_OCCUPANCY_REGS`], with the
    /// registers and local memory they take now. ptxas gives a called function registers
    /// above all its callers', so that a probe's one rarely taken call (memtrace's one
    /// sampled access in 8192) raised vectorAdd from 40 registers to 44: 5 blocks of 256
    /// threads an SM instead of 6 (H200, 2.00x native against 1.83x at 40).
    pub(super) fn register_caps(&self, splice: &Splice, handle: Handle) -> Vec<RegisterCap> {
        let calls_out = |symbol: &str| {
            InlineBody::find(&splice.definitions, symbol).is_none_or(|b| b.calls_out())
        };
        splice
            .calls
            .iter()
            .filter(|(_, calls)| calls.iter().any(|c| calls_out(&c.symbol)))
            .filter_map(|(kernel, _)| {
                let (regs, local) = self.register_usage(handle, kernel)?;
                (regs > FULL_OCCUPANCY_REGS).then(|| RegisterCap {
                    kernel: kernel.clone(),
                    cap: (regs + REGISTER_UNIT - 1) / REGISTER_UNIT * REGISTER_UNIT - REGISTER_UNIT,
                    before: (regs, local),
                })
            })
            .collect()
    }

    /// The registers a thread and the bytes of local memory `kernel` of `module` takes.
    pub(super) fn register_usage(&self, module: Handle, kernel: &str) -> Option<(c_int, c_int)> {
        let f = self.api.module_function(module, kernel)?;
        let attribute = |which: c_int| {
            let mut v = 0;
            // SAFETY: writes one int.
            let r = unsafe { (self.api.func_get_attribute)(&mut v, which, f) };
            (r == CUDA_SUCCESS).then_some(v)
        };
        Some((attribute(FUNC_NUM_REGS)?, attribute(FUNC_LOCAL_SIZE_BYTES)?))
    }

    /// Builds `refit` on a thread of ours, after `built` went into use: when none of its
    /// kernels then takes more local memory (what no longer fits is saved only in the
    /// called function), its module takes `built`'s place for the launches that follow;
    /// otherwise `built` stays. The driver's JIT of the second build (matmul: 25 ms on an
    /// H200) is then never on a launch's path; the launches before the swap run the first
    /// build, with the same maps.
    pub(super) fn refit_behind(
        &'static self,
        ctx: Handle,
        image: u64,
        refit: BuildInputs,
        built: Arc<Patched>,
    ) {
        let run = move || {
            bpftime_attach::never_run_handlers_on_this_thread();
            let _capture = self.api.relaxed_capture();
            let Some(_quiet) = self.wait_quiet() else {
                return;
            };
            let current = |st: &State| {
                st.patched
                    .get(&(ctx, image))
                    .is_some_and(|p| Arc::ptr_eq(p, &built))
            };
            // Unless the probes changed, or the image or the context went, meanwhile.
            if !current(&self.read()) {
                return;
            }
            self.set_context(ctx);
            let Some(context) = built.context.clone() else {
                return;
            };
            let caps: Vec<(String, u32)> = refit
                .caps
                .iter()
                .map(|c| (c.kernel.clone(), c.cap as u32))
                .collect();
            let Ok(text) =
                PtxModule::parse(&refit.spliced).and_then(|m| m.with_register_caps(&caps))
            else {
                return;
            };
            let started = Instant::now();
            let Ok(capped) = self.api.load_ptx(&text) else {
                return;
            };
            let after: Vec<Option<(c_int, c_int)>> = refit
                .caps
                .iter()
                .map(|c| self.register_usage(capped, &c.kernel))
                .collect();
            let spills = refit
                .caps
                .iter()
                .zip(&after)
                .any(|(c, now)| now.is_none_or(|(r, l)| r > c.cap || l > c.before.1));
            tracing::info!(
                kernels = ?caps,
                before = ?refit.caps.iter().map(|c| c.before).collect::<Vec<_>>(),
                ?after,
                kept = !spills,
                driver_load_ms = started.elapsed().as_secs_f64() * 1e3,
                "instrumented module built again with fewer registers"
            );
            if spills {
                // SAFETY: a module of ours that nothing else holds.
                unsafe { (self.api.module_unload)(capped) };
                return;
            }
            // Once made, its clock offsets are among the context's, which the clock's
            // recalibration writes: the module stays loaded even if it is not used.
            let Some(patched) = self.patched_from(&refit, context, capped) else {
                return;
            };
            let mut st = self.write();
            if current(&st) {
                st.patched.insert((ctx, image), Arc::new(patched));
                drop(st);
                tracing::info!(
                    kernel = %refit.kernel,
                    "the second build takes the first one's place for the launches that follow"
                );
            }
        };
        if let Err(e) = std::thread::Builder::new()
            .name("bpftime-gpu-refit".into())
            .spawn(run)
        {
            tracing::debug!("no thread for the second build ({e}): the first one stays");
        }
    }

    /// What compiling `probe` for `context` needs: its maps' replicas there (made on
    /// first use, in the current context) and the device runtime's configuration.
    pub(super) fn probe_inputs(
        &self,
        context: &Context,
        probe: &GpuProbe,
    ) -> Result<ProbeInputs, GpuAttachError> {
        let mut replicas: HashMap<u32, Arc<Replica>> = HashMap::new();
        for m in &probe.maps {
            let mut all = context.replicas.lock().unwrap_or_else(|e| e.into_inner());
            let r = match all.get(&m.id()) {
                Some(r) => r.clone(),
                None => {
                    let r = Arc::new(Replica::new(
                        &self.mover(context),
                        m.clone(),
                        context.sm_count,
                        &context.shard_window,
                    )?);
                    all.insert(m.id(), r.clone());
                    r
                }
            };
            replicas.insert(m.id(), r);
        }
        let maps: HashMap<u32, DeviceMapRef> = replicas
            .iter()
            .map(|(&id, r)| {
                (
                    id,
                    DeviceMapRef {
                        desc: r.desc_addr,
                        values: r.values_addr(),
                        array: r.array_layout(),
                    },
                )
            })
            .collect();
        let config = RuntimeConfig {
            pid_tgid_at: context.pid_tgid_at,
            trace_ring: context.trace_ring,
            shards: replicas.values().filter_map(|r| r.shards).collect(),
        };
        Ok(ProbeInputs {
            maps,
            config,
            replicas: replicas.into_values().collect(),
        })
    }

    /// Compiles `probes` for `context` (LLVM, one thread each: a module's probes are
    /// ready when the slowest is), the n-th as `probe_symbol(n)`: each one's PTX, clock
    /// global and replicas, or why not.
    pub(super) fn compile_probes(
        &self,
        context: &Context,
        probes: &[Arc<GpuProbe>],
        sm: u32,
    ) -> Vec<Result<CompiledProbe, GpuAttachError>> {
        let started = Instant::now();
        let inputs: Vec<Result<ProbeInputs, GpuAttachError>> = probes
            .iter()
            .map(|p| self.probe_inputs(context, p))
            .collect();
        let replicas_ms = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        let compile = |index: usize,
                       probe: &GpuProbe,
                       inputs: ProbeInputs|
         -> Result<CompiledProbe, GpuAttachError> {
            let program = self.compiler.compile(
                probe.point,
                &probe.insns,
                &inputs.maps,
                &inputs.config,
                sm,
                &probe_symbol(index as u32),
            )?;
            Ok(CompiledProbe {
                ptx: program.ptx,
                clock_offset: program.clock_offset,
                replicas: inputs.replicas,
            })
        };
        std::thread::scope(|scope| {
            let running: Vec<_> = probes
                .iter()
                .zip(inputs)
                .enumerate()
                .map(|(index, (probe, inputs))| {
                    inputs.map(|inputs| {
                        std::thread::Builder::new()
                            .name("bpftime-gpu-jit".into())
                            .spawn_scoped(scope, move || {
                                bpftime_attach::never_run_handlers_on_this_thread();
                                compile(index, probe, inputs)
                            })
                    })
                })
                .collect();
            let compiled = running
                .into_iter()
                .map(|r| match r {
                    Ok(Ok(handle)) => handle
                        .join()
                        .unwrap_or(Err(GpuAttachError::CompilePanicked)),
                    Ok(Err(e)) => Err(GpuAttachError::NoThread(Arc::new(e))),
                    Err(e) => Err(e),
                })
                .collect();
            tracing::info!(
                probes = probes.len(),
                replicas_ms,
                compile_ms = started.elapsed().as_secs_f64() * 1e3,
                "probes compiled"
            );
            compiled
        })
    }

    /// Folds the per-SM copies of `replicas`' sharded arrays into them, in `stream`'s
    /// order (after the launch just queued there).
    pub(super) fn fold_shards(
        &self,
        context: &Context,
        stream: Handle,
        replicas: &[Arc<Replica>],
    ) -> Result<(), bpftime_gpu_device::cuda::CudaError> {
        let entries: Vec<ShardEntry> = replicas.iter().filter_map(|r| r.shards).collect();
        for chunk in entries.chunks(FOLD_ENTRIES) {
            let mut table = [0u64; FOLD_ENTRIES * 6];
            // 8-byte words of one SM's copies, both kinds, of every array in the chunk.
            let mut words = 0u64;
            let mut copies = 0u32;
            for (e, row) in chunk.iter().zip(table.chunks_mut(6)) {
                row.copy_from_slice(&[
                    e.base,
                    e.len,
                    e.shards64,
                    e.shards32,
                    e.stride,
                    u64::from(e.copies),
                ]);
                words += 2 * (e.len / 8);
                copies = copies.max(e.copies);
            }
            if words == 0 || copies == 0 {
                continue;
            }
            // Sharded arrays are small (SHARDED_ARRAY_MAX bytes, a copy per SM): far
            // fewer blocks than a grid takes.
            let blocks = words.div_ceil(u64::from(FOLD_THREADS)) as u32;
            let mut count = chunk.len() as u32;
            let mut params = [
                table.as_mut_ptr().cast::<std::ffi::c_void>(),
                (&mut count as *mut u32).cast(),
            ];
            // SAFETY: the fold kernel takes a 768-byte list of entries and a u32 count,
            // which the driver copies at the launch; it touches only the replicas' values
            // and copies.
            self.api.check("cuLaunchKernel", unsafe {
                (self.api.launch_kernel)(
                    context.fold_shards,
                    blocks,
                    copies,
                    1,
                    FOLD_THREADS,
                    1,
                    1,
                    0,
                    stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            })?;
        }
        Ok(())
    }
}
