//! The launch path: what happens around each launch of a kernel a probe names, from
//! picking the instrumented copy and pushing the CPU's map changes to queueing the
//! completion that pulls the GPU's.

use super::*;

impl GpuAttach {
    /// Before a launch of `function` on `stream`: the function to launch instead, with the
    /// maps it uses pushed to the device.
    pub(crate) fn before_launch(&'static self, function: Handle, stream: Handle) -> Launch {
        let plain = Launch::plain(function, stream);
        if !self.active.load(Ordering::Acquire) {
            return plain;
        }
        flush_at_exit_once();
        // Some(Some(..)): its image; Some(None): no PTX known for the current probes;
        // None: not known, or looked up before the probes changed.
        let known = {
            let st = self.read();
            st.functions
                .get(&function)
                .and_then(|f| match (f.image, f.origin) {
                    (Some(image), _) => Some(Some((image, f.name.clone()))),
                    (None, Origin::Unseen(g)) if g != st.generation => None,
                    (None, _) => Some(None),
                })
        };
        let (image, name) = match known {
            Some(Some(found)) => found,
            Some(None) => return plain,
            // A kernel whose module was loaded before GPU attach started.
            None => match self.discover(function) {
                Some(found) => found,
                None => return plain,
            },
        };
        let ctx = self.api.current_context();
        if ctx == 0 {
            return plain;
        }
        // Under a capture (CUDA graphs, as PyTorch makes them) the launch becomes a graph
        // node. Loading a module while a capture runs invalidates it, from any thread and
        // in any capture mode; the copies that push CPU-written values go on a thread of
        // ours, which does not capture; and nothing may be queued on the captured stream
        // but what every replay should do.
        if self.api.stream_capturing(stream) {
            if self.ready_patched(ctx, image).is_none() {
                // Building loads a module, which no thread may do while a capture runs
                // without invalidating it: this graph gets the kernel as it is.
                self.notice(&format!("graph-early:{name}"), || {
                    format!(
                        "{name} was captured into a CUDA graph before its instrumented \
                         module was ready: that graph runs it uninstrumented (launch it once \
                         before capturing, as CUDA graph warm-ups do, to have it probed)"
                    )
                });
                return plain;
            }
            return self.prepare_captured(ctx, image, name, function, stream);
        }
        // A launch from another thread while the process exits runs as it is: the
        // exit-time flush has the last word, and the driver goes away right after it.
        if bpftime_gpu_device::exiting::is_exiting() {
            return plain;
        }
        // Building and pushing beside another stream's capture would invalidate it:
        // this launch runs as it is (rare: captures are short, and made after warm-up).
        let Some(_quiet) = self.quiet() else {
            self.notice(&format!("beside-capture:{name}"), || {
                format!(
                    "a launch of {name} made while a CUDA graph was being captured on \
                     another stream ran uninstrumented"
                )
            });
            return plain;
        };
        self.prepare_launch(ctx, image, name, function, stream)
    }

    /// A launch into a capturing stream, whose instrumented module is ready: the graph
    /// node gets the instrumented function. Values the CPU wrote since the last launch
    /// are not pushed now (copies while a capture runs invalidate it); the next launch
    /// outside a capture pushes them.
    pub(super) fn prepare_captured(
        &self,
        ctx: Handle,
        image: u64,
        name: Arc<str>,
        function: Handle,
        stream: Handle,
    ) -> Launch {
        let plain = Launch::plain(function, stream);
        let Some(patched) = self.ready_patched(ctx, image) else {
            return plain;
        };
        let Some((instrumented, context)) = patched.instrumented(&name) else {
            return plain;
        };
        if self.copy_variables_in(&patched.variables, stream).is_err() {
            return plain;
        }
        self.notice(&format!("graph:{name}"), || {
            format!(
                "{name} was captured into a CUDA graph: its probes run in every launch of \
                 the graph, and its maps are brought back after each"
            )
        });
        Launch::instrumented(instrumented, stream, context, &patched, true)
    }

    /// The instrumented function for a launch of `function` (built if need be), with the
    /// maps' CPU-written values pushed to the device before it.
    pub(super) fn prepare_launch(
        &'static self,
        ctx: Handle,
        image: u64,
        name: Arc<str>,
        function: Handle,
        stream: Handle,
    ) -> Launch {
        let plain = Launch::plain(function, stream);
        let asked = Instant::now();
        let patched = self.patched(ctx, image, &name);
        let waited = asked.elapsed();
        if waited > Duration::from_micros(200) {
            tracing::info!(
                kernel = %name,
                ms = waited.as_secs_f64() * 1e3,
                "a launch waited for its instrumented module"
            );
        }
        let Some(patched) = patched else {
            return plain;
        };
        let Some((instrumented, context)) = patched.instrumented(&name) else {
            return plain;
        };
        // Under lazy loading the application's own function would otherwise load at its
        // first use by the application, which may be inside a stream capture, where a
        // load invalidates the capture.
        if self.lock_originals_loaded().insert(function) {
            self.api.load_function(function);
        }
        if patched.tensor_copies {
            if let Err(e) = self.tensor_map_table(&context) {
                tracing::warn!("bringing the tensor map table up to date failed: {e}");
            }
        }
        if let Err(e) = self.copy_variables_in(&patched.variables, stream) {
            self.notice(&format!("variables:{name}"), || {
                format!("{name} runs uninstrumented: its module's variables cannot be copied ({e})")
            });
            return plain;
        }
        let mover = self.mover(&context);
        let mut deltas = Vec::new();
        let mut hash_ops = Vec::new();
        for r in &patched.replicas {
            // A table a pull found full of tombstones is laid out anew once the launches
            // queued before this one in its stream are done (none uses it meanwhile); not
            // inside a capture, which a synchronization would invalidate.
            if r.wants_compaction() && !self.api.stream_capturing(stream) {
                // SAFETY: the application's stream, as it handed it to the launch.
                let synced = self.api.check("cuStreamSynchronize", unsafe {
                    (self.api.stream_synchronize)(stream)
                });
                if let Err(e) = synced.and_then(|()| r.compact(&mover)) {
                    tracing::warn!(
                        map = r.map.id(),
                        "laying a GPU hash table out anew failed: {e}"
                    );
                }
            }
            match r.push(&mover) {
                Ok(p) => {
                    deltas.extend(p.deltas);
                    hash_ops.extend(p.hash_ops);
                }
                Err(e) => tracing::warn!(
                    map = r.map.id(),
                    "pushing CPU-written values to the GPU failed: {e}"
                ),
            }
        }
        if !deltas.is_empty() {
            if let Err(e) = self.apply_deltas(&context, stream, &deltas) {
                tracing::warn!("applying CPU-written values on the GPU failed: {e}");
            }
        }
        for ops in hash_ops {
            if let Err(e) = self.make_hash_ops(&context, stream, ops) {
                tracing::warn!("making the CPU's per-CPU hash changes on the GPU failed: {e}");
            }
        }
        Launch::instrumented(instrumented, stream, context, &patched, false)
    }

    /// Before an instrumented launch in `stream`: the application's values of its module's
    /// variables into the instrumented module's.
    pub(super) fn copy_variables_in(
        &self,
        variables: &[SharedVariable],
        stream: Handle,
    ) -> Result<(), bpftime_gpu_device::cuda::CudaError> {
        for v in variables {
            // SAFETY: both are device allocations of the variable's size, made by the
            // driver for the two modules; the copy is ordered in the launch's stream.
            self.api.check("cuMemcpyDtoDAsync", unsafe {
                (self.api.memcpy_dtod_async)(v.copy, v.original, v.bytes, stream)
            })?;
        }
        Ok(())
    }

    /// After an instrumented launch in `stream`: what it may have written into the
    /// application's variables.
    pub(super) fn copy_variables_back(&self, variables: &[SharedVariable], stream: Handle) {
        for v in variables.iter().filter(|v| v.writable) {
            // SAFETY: as in `copy_variables_in`, the other way.
            let r = unsafe { (self.api.memcpy_dtod_async)(v.original, v.copy, v.bytes, stream) };
            if r != CUDA_SUCCESS && may_log() {
                tracing::warn!(
                    "copying a kernel's module variable back failed: {}",
                    self.api.error_name(r)
                );
            }
        }
    }

    /// The variables of `module` that its functions use, each found in the application's
    /// module and in the instrumented one (`copy`). Fails when one cannot be paired: an
    /// instrumented kernel would read and write a variable the application never sees.
    pub(super) fn share_variables(
        &self,
        image: &Image,
        module: &PtxModule,
        copy: Handle,
    ) -> Result<Vec<SharedVariable>, GpuAttachError> {
        let api = &self.api;
        let (owner, original) = image.owner;
        let mut shared = Vec::new();
        let mut total = 0usize;
        for v in module.variables.iter().filter(|v| v.used) {
            let name = CString::new(v.name.as_str())?;
            let (mut ours, mut ours_bytes) = (0, 0);
            // SAFETY: writes a device pointer and a size.
            let r =
                unsafe { (api.module_get_global)(&mut ours, &mut ours_bytes, copy, name.as_ptr()) };
            if r != CUDA_SUCCESS {
                // The driver's compile dropped it: nothing of ours reads it.
                continue;
            }
            let (mut theirs, mut theirs_bytes) = (0, 0);
            let r = match owner {
                // SAFETY: writes a device pointer and a size; `original` is the
                // application's module.
                Owner::Module => unsafe {
                    (api.module_get_global)(&mut theirs, &mut theirs_bytes, original, name.as_ptr())
                },
                Owner::Library => match api.library_get_global {
                    // SAFETY: as above, for the application's library.
                    Some(get) => unsafe {
                        get(&mut theirs, &mut theirs_bytes, original, name.as_ptr())
                    },
                    None => {
                        return Err(GpuAttachError::NoLibraryGetGlobal {
                            variable: v.name.clone(),
                        })
                    }
                },
            };
            if r != CUDA_SUCCESS || theirs_bytes != ours_bytes {
                return Err(GpuAttachError::VariableUnpaired {
                    variable: v.name.clone(),
                    why: if r != CUDA_SUCCESS {
                        api.error_name(r)
                    } else {
                        format!("{theirs_bytes} bytes there, {ours_bytes} here")
                    },
                });
            }
            total += ours_bytes;
            shared.push(SharedVariable {
                original: theirs,
                copy: ours,
                bytes: ours_bytes,
                writable: !v.constant,
            });
        }
        if total > SHARED_VARIABLES_MAX {
            return Err(GpuAttachError::VariablesTooLarge { mib: total >> 20 });
        }
        Ok(shared)
    }

    /// Makes `deltas` on the device in `stream`'s order: after the work queued there so far,
    /// before the launch that follows.
    pub(super) fn apply_deltas(
        &self,
        context: &Context,
        stream: Handle,
        deltas: &[DeviceDelta],
    ) -> Result<(), bpftime_gpu_device::cuda::CudaError> {
        for chunk in deltas.chunks(DELTAS_PER_LAUNCH) {
            let mut list = [0u64; 2 * DELTAS_PER_LAUNCH];
            for (i, d) in chunk.iter().enumerate() {
                list[2 * i] = d.addr;
                list[2 * i + 1] = d.delta;
            }
            let mut count = chunk.len() as u32;
            let mut params = [
                list.as_mut_ptr().cast::<std::ffi::c_void>(),
                (&mut count as *mut u32).cast(),
            ];
            // SAFETY: the apply kernel takes a 1024-byte list and a u32 count, which the
            // driver copies at the launch; it adds to device words of our replicas.
            self.api.check("cuLaunchKernel", unsafe {
                (self.api.launch_kernel)(
                    context.apply_deltas,
                    1,
                    1,
                    1,
                    DELTAS_PER_LAUNCH as u32,
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

    /// Makes `ops` (a CPU's changes to a per-CPU hash map) on the device in `stream`'s
    /// order, before the launch that follows. The ops travel in the kernel's parameters,
    /// which the driver copies at the launch.
    pub(super) fn make_hash_ops(
        &self,
        context: &Context,
        stream: Handle,
        mut ops: HashOpsLaunch,
    ) -> Result<(), bpftime_gpu_device::cuda::CudaError> {
        let mut params = [
            (&mut ops.map as *mut u64).cast::<std::ffi::c_void>(),
            (&mut ops.done as *mut u64).cast(),
            (&mut ops.seq as *mut u64).cast(),
            (&mut ops.count as *mut u32).cast(),
            ops.ops.as_mut_ptr().cast(),
        ];
        // SAFETY: hash_ops.c's kernel takes two device addresses (a table's descriptor and
        // its done word, both ours), a u64, a u32 and HASH_OPS_BYTES of ops, which the
        // driver copies at the launch.
        self.api.check("cuLaunchKernel", unsafe {
            (self.api.launch_kernel)(
                context.hash_ops,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// After the launch call returned `result`: once the kernel completes, the worker
    /// brings the maps back.
    pub(crate) fn after_launch(&self, launch: Launch, result: CuResult) {
        let Some((context, replicas)) = launch.work else {
            return;
        };
        // Tracked even without maps: its trace lines are drained when it completes.
        if result != CUDA_SUCCESS {
            return;
        }
        let _capture = launch.captured.then(|| self.api.relaxed_capture());
        self.copy_variables_back(&launch.variables, launch.stream);
        // Captured, the fold becomes the node after the kernel's: every replay folds.
        if let Err(e) = self.fold_shards(&context, launch.stream, &replicas) {
            if may_log() {
                tracing::warn!("folding per-SM counters on the GPU failed: {e}");
            }
        }
        if launch.captured {
            // An event recorded in a capture cannot be waited for; the graph's launches
            // are (`after_graph_launch`).
            let mut graphs = self.lock_graph_work();
            if !graphs
                .iter()
                .any(|(c, r)| Arc::ptr_eq(c, &context) && same_replicas(r, &replicas))
            {
                graphs.push((context, replicas));
            }
            return;
        }
        self.queue_completion(context, launch.stream, replicas);
    }

    /// After a CUDA graph launch on `stream`: the maps of every instrumented kernel
    /// captured into a graph come back once the launch completes. Graphs are not told
    /// apart: any graph launch brings back all of them, which costs a copy, never a count.
    pub(crate) fn after_graph_launch(&self, stream: Handle, result: CuResult) {
        if result != CUDA_SUCCESS || !self.active.load(Ordering::Acquire) {
            return;
        }
        let work: Vec<_> = self.lock_graph_work().clone();
        if work.is_empty() || self.api.stream_capturing(stream) {
            return;
        }
        let current = self.api.current_context();
        for (context, replicas) in work {
            if context.ctx == current {
                self.queue_completion(context, stream, replicas);
            }
        }
    }

    /// Leave to do CUDA work of GPU attach's own now: none while a capture runs, nor once
    /// the process is exiting (the exit-time flush's own work excepted).
    pub(super) fn quiet(&self) -> Option<std::sync::RwLockReadGuard<'_, ()>> {
        if self.captures.load(Ordering::Acquire) != 0 || bpftime_gpu_device::exiting::is_exiting() {
            return None;
        }
        let guard = self.cuda_work.read().unwrap_or_else(|e| e.into_inner());
        // A capture that began, or an exit that came, before the lock was ours.
        (self.captures.load(Ordering::Acquire) == 0 && !bpftime_gpu_device::exiting::is_exiting())
            .then_some(guard)
    }

    /// [`Session::quiet`], waiting for the application's captures to end (they are
    /// short: a few launches recorded into a graph); `None` once the process exits.
    pub(super) fn wait_quiet(&self) -> Option<std::sync::RwLockReadGuard<'_, ()>> {
        loop {
            if let Some(g) = self.quiet() {
                return Some(g);
            }
            if bpftime_gpu_device::exiting::is_exiting() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// At `cuStreamBeginCapture`: waits for GPU attach's CUDA work in flight, then counts
    /// the capture in.
    pub(crate) fn capture_begins(&self) {
        let _no_work = self.cuda_work.write().unwrap_or_else(|e| e.into_inner());
        self.captures.fetch_add(1, Ordering::AcqRel);
    }

    /// After a capture ended (or failed to begin).
    pub(crate) fn capture_ends(&self) {
        let _ = self
            .captures
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    pub(super) fn lock_originals_loaded(&self) -> std::sync::MutexGuard<'_, HashSet<Handle>> {
        self.originals_loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn lock_graph_work(&self) -> std::sync::MutexGuard<'_, Vec<GraphWork>> {
        self.graph_work.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Brings `replicas` back once the work queued on `stream` so far completes.
    pub(super) fn queue_completion(
        &self,
        context: Arc<Context>,
        stream: Handle,
        replicas: Vec<Arc<Replica>>,
    ) {
        let event = context
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .or_else(|| {
                let mut e = 0;
                // SAFETY: writes one event handle.
                let r = unsafe { (self.api.event_create)(&mut e, EVENT_DISABLE_TIMING) };
                (r == CUDA_SUCCESS).then_some(e)
            });
        let Some(event) = event else { return };
        // SAFETY: an event of this context, recorded on the launch's stream.
        if unsafe { (self.api.event_record)(event, stream) } != CUDA_SUCCESS {
            return;
        }
        let mut pending = self.lock_pending();
        let was_idle = pending.is_empty();
        pending.push_back(Completion {
            context,
            event,
            replicas,
        });
        drop(pending);
        if was_idle {
            self.wake_worker();
        }
    }
}
