//! Launch timing: CUDA events around launches (graph launches too) give every kernel's
//! GPU time, for launch-level programs, timelines and flame graphs.

use super::*;

impl GpuAttach {
    /// The launch programs watching `function`, with its name; `None` when none does.
    /// Cached per function and set of launch programs, since a pattern match demangles.
    pub(super) fn launch_probes_for(&self, function: Handle) -> Option<(Arc<str>, Watchers)> {
        let generation = self
            .launch
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .generation;
        let mut cache = self
            .launch_matches
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(m) = cache.get(&function) {
            if m.generation == generation {
                return (!m.probes.is_empty()).then(|| (m.name.clone(), m.probes.clone()));
            }
        }
        let known = self.read().functions.get(&function).map(|f| f.name.clone());
        let name: Arc<str> = known
            .or_else(|| self.api.function_name(function).map(Into::into))
            .unwrap_or_else(|| "".into());
        let probes: Watchers = if name.is_empty() {
            Arc::new([])
        } else {
            self.launch
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .probes
                .values()
                .filter(|p| names::matches(&p.pattern, &name))
                .cloned()
                .collect()
        };
        self.lock_matched().extend(probes.iter().map(|p| p.link_id));
        if !probes.is_empty() {
            // Lazy loading would load the kernel inside its first launch call, after the
            // start event: that launch's GPU time would count the load.
            let loaded = self.api.load_function(function);
            tracing::debug!(kernel = %name, loaded, "launch events watch a kernel");
        }
        cache.insert(
            function,
            LaunchMatch {
                generation,
                name: name.clone(),
                probes: probes.clone(),
            },
        );
        (!probes.is_empty()).then_some((name, probes))
    }

    /// Before a launch call: when launch programs watch the kernel, its launch context, and
    /// the start of its timing recorded on `stream`.
    /// Whether launch programs are attached (before the call: whether to note its time).
    pub(crate) fn watches_launches(&self) -> bool {
        self.launch_active.load(Ordering::Acquire)
    }

    /// `cpu_ns` is when the application made the call.
    pub(crate) fn observe_launch(
        &self,
        function: Handle,
        stream: Handle,
        geometry: Geometry,
        cpu_ns: u64,
    ) -> Option<Observed> {
        if !self.watches_launches() {
            return None;
        }
        // Attached between the caller's look and ours: the time is taken now.
        let cpu_ns = if cpu_ns == 0 {
            clock::host_monotonic_ns()
        } else {
            cpu_ns
        };
        let (name, probes) = self.launch_probes_for(function)?;
        flush_at_exit_once();
        let ctx = self.api.current_context();
        if ctx == 0 {
            return None;
        }
        // Before anything that allocates: a capture in global mode forbids it.
        if self.api.stream_capturing(stream) {
            self.notice(&format!("capture:{name}"), || {
                format!(
                    "launches of {name} captured into a CUDA graph get their launch events \
                     when the graph is launched (a graph instantiated before the tool \
                     attached gets none)"
                )
            });
            return None;
        }
        let context = match self.context(ctx) {
            Ok(c) => c,
            Err(e) => {
                self.notice(&format!("ctx:{ctx}"), || {
                    format!("launch events are off in this CUDA context: {e}")
                });
                return None;
            }
        };
        let mut info = LaunchContext::new(&name, geometry, stream as u64, context.device);
        info.function = function as u64;
        info.cpu_ns = cpu_ns;
        let in_flight = self.lock_timings().len();
        let events = if in_flight >= TIMINGS_IN_FLIGHT {
            self.untimed.fetch_add(1, Ordering::Relaxed);
            self.notice("untimed", || {
                format!(
                    "more than {TIMINGS_IN_FLIGHT} launches await their GPU times: later \
                     launches get only their launch-time run until the GPU catches up"
                )
            });
            None
        } else {
            self.timing_event(&context)
                .zip(self.timing_event(&context))
                .and_then(|(start, end)| {
                    // SAFETY: an event of the current context, recorded on the caller's stream.
                    if unsafe { (self.api.event_record)(start, stream) } == CUDA_SUCCESS {
                        Some((start, end))
                    } else {
                        self.recycle_timing_events(&context, &[start, end]);
                        None
                    }
                })
        };
        let submitted_ns = if events.is_some() {
            clock::host_monotonic_ns()
        } else {
            0
        };
        Some(Observed {
            context,
            probes,
            kernel: name,
            info,
            events,
            submitted_ns,
        })
    }

    /// After a watched launch call returned `result`: the end of its timing recorded, its
    /// programs run, and its completion awaited.
    pub(crate) fn after_observed_launch(&self, observed: Observed, result: CuResult) {
        let Observed {
            context,
            probes,
            kernel,
            mut info,
            events,
            submitted_ns,
        } = observed;
        info.result = result;
        info.phase = PHASE_LAUNCHED;
        info.launch_id = self.next_launch_id.fetch_add(1, Ordering::Relaxed);
        let timed = events.and_then(|(start, end)| {
            // SAFETY: an event of the current context, on the stream the launch went to.
            let recorded = result == CUDA_SUCCESS
                && unsafe { (self.api.event_record)(end, info.stream as Handle) } == CUDA_SUCCESS;
            if recorded {
                Some((start, end))
            } else {
                self.recycle_timing_events(&context, &[start, end]);
                None
            }
        });
        run_watchers(&probes, &kernel, info);
        // Queued after the first run, so the completion run never comes first.
        if let Some((start, end)) = timed {
            self.await_timing(Timing {
                context,
                probes,
                kernel,
                info,
                start,
                end,
                submitted_ns,
            });
        }
    }

    /// Before `graph` is instantiated, while launch programs are attached: each kernel node
    /// they watch gets an event-record node before it (after the node's own dependencies)
    /// and one after it (before its dependents), recording an idle event until a launch
    /// sets timing events in. Nothing is removed: the kernel keeps its dependencies, so a
    /// failure halfway leaves the graph's order as the application made it.
    pub(crate) fn before_instantiate(&self, graph: Handle) {
        tracing::debug!(
            graph,
            watching = self.watches_launches(),
            "a CUDA graph is instantiated"
        );
        if !self.watches_launches() || graph == 0 {
            return;
        }
        let Some(g) = self.api.graph else {
            self.notice("graph-api", || {
                "kernels launched through CUDA graphs get no launch events: this driver lacks \
                 the graph calls that time them"
                    .into()
            });
            return;
        };
        let previous = self.lock_timed_graphs().get(&graph).cloned();
        let mut nodes: Vec<TimedNode> =
            previous.as_ref().map_or_else(Vec::new, |p| p.nodes.clone());
        let idle_event = match &previous {
            Some(p) => p.idle_event,
            None => {
                let mut e = 0;
                // SAFETY: writes one event handle.
                let r = unsafe { (self.api.event_create)(&mut e, EVENT_DISABLE_TIMING) };
                if r != CUDA_SUCCESS {
                    tracing::debug!(error = %self.api.error_name(r), "no idle event for a graph's timing nodes");
                    return;
                }
                e
            }
        };
        let list = |get: &dyn Fn(Handle, *mut Handle, *mut usize) -> CuResult,
                    of: Handle|
         -> Option<Vec<Handle>> {
            let mut n = 0usize;
            let r = get(of, std::ptr::null_mut(), &mut n);
            if r != CUDA_SUCCESS {
                tracing::debug!(error = %self.api.error_name(r), "graph nodes not listed");
                return None;
            }
            if n == 0 {
                // A non-null array of no room is refused.
                return Some(Vec::new());
            }
            let mut v = vec![0 as Handle; n];
            let r = get(of, v.as_mut_ptr(), &mut n);
            if r != CUDA_SUCCESS {
                tracing::debug!(error = %self.api.error_name(r), "graph nodes not listed");
                return None;
            }
            v.truncate(n);
            Some(v)
        };
        // SAFETY (the three listings): with a null array each writes the count; with an
        // array of that many handles, the handles and how many it wrote.
        let nodes_of = |graph, out, n: *mut usize| unsafe { (g.get_nodes)(graph, out, n) };
        let dependencies = |node, out, n: *mut usize| unsafe {
            (g.node_get_dependencies)(node, out, std::ptr::null_mut(), n)
        };
        let dependents = |node, out, n: *mut usize| unsafe {
            (g.node_get_dependent_nodes)(node, out, std::ptr::null_mut(), n)
        };
        let Some(all) = list(&nodes_of, graph) else {
            return;
        };
        tracing::debug!(graph, nodes = all.len(), "graph nodes");
        for node in all {
            if nodes.iter().any(|t| t.kernel_node == node) {
                continue;
            }
            let mut kind = -1;
            // SAFETY: writes the node's type.
            let r = unsafe { (g.node_get_type)(node, &mut kind) };
            if r != CUDA_SUCCESS || kind != cuda::GRAPH_NODE_KERNEL {
                tracing::debug!(node, kind, r, "graph node: not a kernel");
                continue;
            }
            // SAFETY: a zeroed parameter block the driver fills in.
            let mut params: cuda::KernelNodeParams = unsafe { std::mem::zeroed() };
            // SAFETY: a kernel node; writes its parameters.
            let r = unsafe { (g.kernel_node_get_params)(node, &mut params) };
            if r != CUDA_SUCCESS {
                tracing::debug!(node, error = %self.api.error_name(r), "graph kernel node's parameters unreadable");
                continue;
            }
            let mut function = params.func;
            if function == 0 && params.kern != 0 {
                if let Some(get) = self.api.kernel_get_function {
                    // SAFETY: writes the kernel's function in the current context.
                    if unsafe { get(&mut function, params.kern) } != CUDA_SUCCESS {
                        function = 0;
                    }
                }
            }
            if function == 0 || self.launch_probes_for(function).is_none() {
                tracing::debug!(
                    node,
                    function,
                    kern = params.kern,
                    "graph kernel node not watched"
                );
                continue;
            }
            let (Some(before), Some(after)) = (list(&dependencies, node), list(&dependents, node))
            else {
                continue;
            };
            let (mut start_node, mut end_node) = (0, 0);
            // SAFETY: a node of `graph` after the kernel's own dependencies.
            let added = unsafe {
                (g.add_event_record_node)(&mut start_node, graph, before.as_ptr(), before.len(), idle_event)
            } == CUDA_SUCCESS
                // SAFETY: one edge, start node to kernel node, both of `graph`.
                && unsafe { (g.add_dependencies)(graph, &start_node, &node, std::ptr::null(), 1) } == CUDA_SUCCESS
                // SAFETY: a node of `graph` after the kernel node.
                && unsafe { (g.add_event_record_node)(&mut end_node, graph, &node, 1, idle_event) }
                    == CUDA_SUCCESS
                && after.iter().all(|s| {
                    // SAFETY: one edge, end node to a dependent of the kernel, both of `graph`.
                    let r = unsafe { (g.add_dependencies)(graph, &end_node, s, std::ptr::null(), 1) };
                    r == CUDA_SUCCESS
                });
            if !added {
                self.notice("graph-node", || {
                    "a CUDA graph's kernel node could not be given timing nodes: it gets no \
                     launch events"
                        .into()
                });
                continue;
            }
            nodes.push(TimedNode {
                kernel_node: node,
                function,
                geometry: Geometry {
                    grid: params.grid,
                    block: params.block,
                    shared_mem_bytes: params.shared_mem_bytes,
                },
                start_node,
                end_node,
            });
        }
        if nodes.is_empty() {
            return;
        }
        tracing::debug!(graph, kernels = nodes.len(), "graph kernel nodes timed");
        self.lock_timed_graphs()
            .insert(graph, Arc::new(TimedGraph { nodes, idle_event }));
    }

    /// After `graph` was instantiated into `exec`.
    pub(crate) fn after_instantiate(&self, graph: Handle, exec: Handle, result: CuResult) {
        if result != CUDA_SUCCESS || exec == 0 {
            return;
        }
        let timed = self.lock_timed_graphs().get(&graph).cloned();
        let mut execs = self.lock_timed_execs();
        match timed {
            Some(t) => execs.insert(exec, t),
            // A handle the driver gave back before, to a graph timed then.
            None => execs.remove(&exec),
        };
    }

    pub(super) fn lock_timed_graphs(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Handle, Arc<TimedGraph>>> {
        self.timed_graphs.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn lock_timed_execs(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<Handle, Arc<TimedGraph>>> {
        self.timed_execs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Before a launch of `exec` on `stream`, called at `cpu_ns`: timing events set into
    /// the event-record nodes of each watched kernel node, the idle event into the others
    /// (events of an earlier launch may be back in use elsewhere).
    pub(crate) fn observe_graph_launch(
        &self,
        exec: Handle,
        stream: Handle,
        cpu_ns: u64,
    ) -> Option<GraphObserved> {
        let timed = self.lock_timed_execs().get(&exec).cloned()?;
        let g = self.api.graph?;
        let set = |node: Handle, event: Handle| {
            // SAFETY: an event-record node of the graph `exec` was instantiated from.
            let r = unsafe { (g.exec_event_record_node_set_event)(exec, node, event) };
            r == CUDA_SUCCESS
        };
        let idle = |n: &TimedNode| {
            set(n.start_node, timed.idle_event);
            set(n.end_node, timed.idle_event);
        };
        let ctx = self.api.current_context();
        let context = (self.watches_launches() && ctx != 0 && !self.api.stream_capturing(stream))
            .then(|| self.context(ctx).ok())
            .flatten();
        let Some(context) = context else {
            timed.nodes.iter().for_each(idle);
            return None;
        };
        flush_at_exit_once();
        let mut nodes = Vec::new();
        for n in &timed.nodes {
            let Some((kernel, probes)) = self.launch_probes_for(n.function) else {
                idle(n);
                continue;
            };
            let mut info = LaunchContext::new(&kernel, n.geometry, stream as u64, context.device);
            info.function = n.function as u64;
            info.cpu_ns = cpu_ns;
            let events = (self.lock_timings().len() < TIMINGS_IN_FLIGHT)
                .then(|| self.timing_event(&context).zip(self.timing_event(&context)))
                .flatten()
                .and_then(|(start, end)| {
                    if set(n.start_node, start) && set(n.end_node, end) {
                        Some((start, end))
                    } else {
                        idle(n);
                        self.recycle_timing_events(&context, &[start, end]);
                        None
                    }
                });
            if events.is_none() {
                idle(n);
            }
            nodes.push(ObservedNode {
                probes,
                kernel,
                info,
                events,
            });
        }
        (!nodes.is_empty()).then(|| GraphObserved {
            context,
            nodes,
            submitted_ns: clock::host_monotonic_ns(),
        })
    }

    /// After an observed graph launch returned `result`: each kernel node's programs run,
    /// and its completion awaited, as for a launch of its own.
    pub(crate) fn after_observed_graph_launch(&self, observed: GraphObserved, result: CuResult) {
        let GraphObserved {
            context,
            nodes,
            submitted_ns,
        } = observed;
        for node in nodes {
            let ObservedNode {
                probes,
                kernel,
                mut info,
                events,
            } = node;
            info.result = result;
            info.phase = PHASE_LAUNCHED;
            info.launch_id = self.next_launch_id.fetch_add(1, Ordering::Relaxed);
            run_watchers(&probes, &kernel, info);
            let Some((start, end)) = events else { continue };
            if result != CUDA_SUCCESS {
                self.recycle_timing_events(&context, &[start, end]);
                continue;
            }
            self.await_timing(Timing {
                context: context.clone(),
                probes,
                kernel,
                info,
                start,
                end,
                submitted_ns,
            });
        }
    }

    /// Queues a timed launch for the sync thread, which runs its completion once its end
    /// event completed.
    pub(super) fn await_timing(&self, timing: Timing) {
        let mut timings = self.lock_timings();
        let was_idle = timings.is_empty();
        timings.push_back(timing);
        drop(timings);
        if was_idle {
            self.wake_worker();
        }
    }

    /// Wakes the sync thread from its idle wait: a launch is queued for it.
    pub(super) fn wake_worker(&self) {
        if let Some(t) = self.worker.get() {
            t.unpark();
        }
    }

    pub(super) fn lock_timings(&self) -> std::sync::MutexGuard<'_, VecDeque<Timing>> {
        self.timings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A timing event of `context` (the current context), reused or made.
    pub(super) fn timing_event(&self, context: &Context) -> Option<Handle> {
        if let Some(e) = context
            .timing_events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
        {
            return Some(e);
        }
        let mut e = 0;
        // SAFETY: writes one event handle.
        let r = unsafe { (self.api.event_create)(&mut e, EVENT_DEFAULT) };
        (r == CUDA_SUCCESS).then_some(e)
    }

    pub(super) fn recycle_timing_events(&self, context: &Context, events: &[Handle]) {
        context
            .timing_events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(events);
    }

    /// Runs the completion of every timed launch that completed (with `wait`, of every
    /// one). A stream completes its launches in order, so a stream's first launch not yet
    /// complete stands for the rest of that stream.
    pub(super) fn sync_timings(&self, wait: bool) {
        let _pass = self.lock_syncing();
        let ready: Vec<(Timing, CuResult)> = {
            let mut timings = self.lock_timings();
            if timings.is_empty() {
                return;
            }
            let mut waiting: HashSet<(Handle, Handle)> = HashSet::new();
            let mut ready = Vec::new();
            let mut left = VecDeque::with_capacity(timings.len());
            for t in timings.drain(..) {
                let key = (t.context.ctx, t.info.stream as Handle);
                if waiting.contains(&key) {
                    left.push_back(t);
                    continue;
                }
                self.set_context(t.context.ctx);
                // SAFETY: an event we recorded.
                let r = unsafe {
                    if wait {
                        (self.api.event_synchronize)(t.end)
                    } else {
                        (self.api.event_query)(t.end)
                    }
                };
                if r == CUDA_ERROR_NOT_READY {
                    waiting.insert(key);
                    left.push_back(t);
                } else {
                    ready.push((t, r));
                }
            }
            *timings = left;
            ready
        };
        for (mut t, r) in ready {
            self.set_context(t.context.ctx);
            let times = (r == CUDA_SUCCESS)
                .then(|| self.event_clock(&t.context))
                .and_then(|c| c.ok())
                .and_then(|c| {
                    let start = self.api.elapsed_ms(c.base, t.start).ok()?;
                    let end = c.host_ns(self.api.elapsed_ms(c.base, t.end).ok()?);
                    let start = c.host_ns(start).max(t.submitted_ns).min(end);
                    Some((start, end, c.bound_ns()))
                });
            self.recycle_timing_events(&t.context, &[t.start, t.end]);
            let Some((start, end, bound)) = times else {
                if may_log() {
                    tracing::warn!(
                        kernel = %t.info.name(),
                        "a launch's GPU times are unreadable ({}): no completion run",
                        self.api.error_name(r)
                    );
                }
                continue;
            };
            t.info.gpu_start_ns = start;
            t.info.gpu_end_ns = end;
            t.info.clock_error_ns = bound;
            t.info.phase = PHASE_COMPLETED;
            run_watchers(&t.probes, &t.kernel, t.info);
        }
    }

    /// The event clock of `context` (current), calibrated on first use and again once it
    /// is [`REANCHOR_EVERY`] old: an event recorded and waited for on our stream, bracketed
    /// by host readings, the tightest of [`clock::CLOCK_SAMPLES`].
    pub(super) fn event_clock(&self, context: &Context) -> Result<EventClock, GpuAttachError> {
        let mut slot = context
            .event_clock
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(c) = *slot {
            if c.taken.elapsed() < REANCHOR_EVERY {
                return Ok(c);
            }
        }
        let api = &self.api;
        let (Some(base), Some(probe)) = (self.timing_event(context), self.timing_event(context))
        else {
            return Err(GpuAttachError::NoEvent);
        };
        let record_and_wait = |e: Handle| -> Result<(), GpuAttachError> {
            // SAFETY: an event of this context, on our own stream.
            api.check("cuEventRecord", unsafe {
                (api.event_record)(e, context.stream)
            })?;
            // SAFETY: as above.
            api.check("cuEventSynchronize", unsafe { (api.event_synchronize)(e) })?;
            Ok(())
        };
        let calibrated = record_and_wait(base).and_then(|()| {
            clock::calibrate(|| -> Result<u64, GpuAttachError> {
                record_and_wait(probe)?;
                let ms = api.elapsed_ms(base, probe)?;
                Ok((ms.max(0.0) as f64 * 1e6).round() as u64)
            })
            .map_err(GpuAttachError::from)
        });
        self.recycle_timing_events(context, &[probe]);
        let c = match calibrated {
            Ok(c) => c,
            Err(e) => {
                self.recycle_timing_events(context, &[base]);
                return Err(e);
            }
        };
        let clock = EventClock {
            base,
            offset_ns: c.offset_ns,
            error_ns: c.error_ns,
            taken: c.taken,
        };
        if let Some(old) = slot.replace(clock) {
            self.recycle_timing_events(context, &[old.base]);
        }
        Ok(clock)
    }
}
