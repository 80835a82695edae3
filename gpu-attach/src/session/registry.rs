//! The module registry: the images the application loaded (modules, libraries, their
//! functions and kernels, with the PTX each came with), found again by name or handle.

use super::*;
use bpftime_gpu_device::tensor_maps;

impl GpuAttach {
    /// The device address of module `handle`'s global `name`, if it has one.
    pub(super) fn module_global(&self, handle: Handle, name: &str) -> Option<DevicePtr> {
        let name = CString::new(name).ok()?;
        let (mut ptr, mut size) = (0, 0);
        // SAFETY: writes a device pointer and a size.
        let r = unsafe { (self.api.module_get_global)(&mut ptr, &mut size, handle, name.as_ptr()) };
        (r == CUDA_SUCCESS).then_some(ptr)
    }

    /// `context`'s table of tensor maps, made if need be and brought up to the process's
    /// (the copy waits for itself, so a launch queued after sees it).
    pub(super) fn tensor_map_table(
        &self,
        context: &Context,
    ) -> Result<DevicePtr, bpftime_gpu_device::cuda::CudaError> {
        let mut table = context
            .tensor_maps
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if table.generation == Some(tensor_maps::generation()) {
            return Ok(table.at);
        }
        let mover = self.mover(context);
        if table.at == 0 {
            table.at = mover.alloc(tensor_maps::TABLE_BYTES)?;
        }
        let (generation, bytes) = tensor_maps::table();
        mover.put(table.at, &bytes)?;
        table.generation = Some(generation);
        Ok(table.at)
    }

    /// A tensor map was made whose copies memory-access probes cannot follow: said once
    /// per reason, where such probes are attached.
    pub(crate) fn tensor_map_refused(&self, why: &tensor_maps::TensorMapError) {
        let probing = self
            .read()
            .probes
            .values()
            .any(|p| p.point.sees(bpftime_gpu_ptx::ptx::SiteSpace::Global));
        if probing {
            self.notice(&format!("tensor-map:{why}"), || {
                format!("memory-access probes do not see the tensor copies through {why}")
            });
        }
    }

    pub(super) fn notice(&self, key: &str, line: impl FnOnce() -> String) {
        let mut noticed = self.noticed.lock().unwrap_or_else(|e| e.into_inner());
        if noticed.insert(key.to_string()) {
            let line = line();
            // The user's line is the one below; the log keeps it at debug level, so that
            // the default log level does not print it twice.
            tracing::debug!("{line}");
            eprintln!("bpftime: {line}");
        }
    }

    pub(crate) fn note_image(
        &'static self,
        handle: Handle,
        owner: Owner,
        ptx: Result<ModulePtx, FatbinError>,
    ) {
        let image = Arc::new(Image {
            ptx: ptx.map_err(GpuAttachError::from),
            owner: (owner, handle),
        });
        let (id, probed) = {
            let mut st = self.write();
            let id = st.next_image;
            st.next_image += 1;
            st.images.insert(id, image.clone());
            st.owners.insert(handle, id);
            (id, !st.probes.is_empty())
        };
        if probed {
            self.build_ahead(id, image);
        }
    }

    /// Builds the instrumented module of an image just loaded, on a thread of ours, when a
    /// probe names one of its kernels and a context is current: the time between a load
    /// and the first launch (allocations, copies, other loads) is then spent building, and
    /// the first launch waits only for what is left, if anything.
    pub(super) fn build_ahead(&'static self, id: u64, image: Arc<Image>) {
        let ctx = self.api.current_context();
        if ctx == 0 {
            return;
        }
        // The exit-time flush waits for the build: registered now, after the CUDA
        // runtime's teardown (a module load comes after the runtime's start), it runs
        // before it.
        flush_at_exit_once();
        let build = move || {
            bpftime_attach::never_run_handlers_on_this_thread();
            let _capture = self.api.relaxed_capture();
            let Some(_quiet) = self.wait_quiet() else {
                return;
            };
            self.set_context(ctx);
            let Ok(ptx) = &image.ptx else { return };
            let Ok(sm) = self.api.device_sm() else { return };
            let Ok(Some((text, _))) = ptx.ptx_for(sm) else {
                return;
            };
            let Ok(module) = PtxModule::parse(&text) else {
                return;
            };
            let probed = module
                .kernels
                .iter()
                .find(|k| self.any_probe_matches(&k.name));
            if let Some(kernel) = probed {
                tracing::info!(kernel = %kernel.name, "building an instrumented module ahead of its launch");
                self.patched(ctx, id, &kernel.name);
            }
        };
        if let Err(e) = std::thread::Builder::new()
            .name("bpftime-gpu-build".into())
            .spawn(build)
        {
            tracing::debug!("no thread to build ahead ({e}): the first launch builds");
        }
    }

    pub(crate) fn note_function(&self, function: Handle, owner: Handle, name: &CStr) {
        let mut st = self.write();
        if let Some(&image) = st.owners.get(&owner) {
            let name: Arc<str> = name.to_string_lossy().into();
            st.functions.insert(
                function,
                FunctionInfo {
                    image: Some(image),
                    name,
                    origin: Origin::Seen,
                },
            );
        }
    }

    pub(crate) fn note_alias(&self, function: Handle, kernel: Handle) {
        let mut st = self.write();
        if let Some(info) = st.functions.get(&kernel) {
            let alias = FunctionInfo {
                image: info.image,
                name: info.name.clone(),
                origin: info.origin,
            };
            st.functions.insert(function, alias);
        }
    }

    pub(crate) fn note_owner_alias(&self, module: Handle, library: Handle) {
        let mut st = self.write();
        if let Some(&image) = st.owners.get(&library) {
            st.owners.insert(module, image);
        }
    }

    pub(crate) fn forget(&self, owner: Handle) {
        let mut st = self.write();
        if let Some(image) = st.owners.remove(&owner) {
            // Handles of an unloaded module may come back for another; so may the
            // handles of unseen modules, which are forgotten too.
            st.functions
                .retain(|_, f| f.image.is_some() && f.image != Some(image));
            st.patched.retain(|(_, i), _| *i != image);
            st.images.remove(&image);
            drop(st);
            // Its function handles may come back for other kernels.
            self.launch_matches
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        } else {
            // Perhaps what a function found by a scan came from, under another handle (a
            // library, where the scan asked for the module): those are looked up again,
            // cheaply, since their images stay.
            st.functions.retain(|_, f| f.origin == Origin::Seen);
        }
    }

    /// A function launched that GPU attach has not seen looked up: its module was loaded
    /// before GPU attach started (`bpftime attach PID`). When a probe names it, its PTX is
    /// looked for in the objects the process maps and, found, noted as its module's image,
    /// as if the load had been seen. Each outcome is remembered: a kernel is looked for
    /// once per set of probes, and each object scanned once.
    pub(super) fn discover(&self, function: Handle) -> Option<(u64, Arc<str>)> {
        let generation = self.read().generation;
        let name: Arc<str> = self.api.function_name(function).unwrap_or_default().into();
        let remember_unseen = |name: Arc<str>| {
            self.write().functions.insert(
                function,
                FunctionInfo {
                    image: None,
                    name,
                    origin: Origin::Unseen(generation),
                },
            );
            None
        };
        if name.is_empty() || !self.any_probe_matches(&name) {
            return remember_unseen(name);
        }
        let owner = self.api.function_owner(function);
        // Its module seen after all, the function got some way not intercepted.
        let seen = owner.and_then(|o| self.read().owners.get(&o.handle()).copied());
        let image = match (seen, owner) {
            (Some(image), _) => image,
            (None, Some(owner)) => match self.find_ptx(&name, owner) {
                Ok((ptx, object)) => {
                    tracing::info!(
                        kernel = %name,
                        object = %object.display(),
                        "the PTX of a kernel loaded before GPU attach started, found"
                    );
                    let mut st = self.write();
                    // Another thread may have found it meanwhile: one image per module.
                    match st.owners.get(&owner.handle()) {
                        Some(&id) => id,
                        None => {
                            let id = st.next_image;
                            st.next_image += 1;
                            let kind = match owner {
                                cuda::Owned::Module(_) => Owner::Module,
                                cuda::Owned::Library(_) => Owner::Library,
                            };
                            let image = Image {
                                ptx: Ok(ptx),
                                owner: (kind, owner.handle()),
                            };
                            st.images.insert(id, Arc::new(image));
                            st.owners.insert(owner.handle(), id);
                            id
                        }
                    }
                }
                Err(why) => {
                    self.unseen_notice(&name, &why);
                    return remember_unseen(name);
                }
            },
            (None, None) => {
                self.unseen_notice(&name, &GpuAttachError::ModuleUnknown);
                return remember_unseen(name);
            }
        };
        self.write().functions.insert(
            function,
            FunctionInfo {
                image: Some(image),
                name: name.clone(),
                origin: Origin::Found,
            },
        );
        Some((image, name))
    }

    /// One notice for a probed kernel whose module was loaded before GPU attach started and
    /// whose PTX is not to be had, saying `why`.
    pub(super) fn unseen_notice(&self, name: &str, why: &GpuAttachError) {
        for p in self.read().probes.values() {
            if names::matches(&p.pattern, name) {
                self.lock_matched().insert(p.link_id);
            }
        }
        self.notice(&format!("before-attach:{name}"), || {
            format!(
                "kernel {name} runs uninstrumented (launch events still see it): its module \
                 was loaded before bpftime attached to this process, and {why}"
            )
        });
    }

    /// The PTX of kernel `name` of `owner` (a module or library loaded before GPU attach
    /// started), from the fatbins of the objects this process maps, with the object it
    /// came from; or why there is none.
    pub(super) fn find_ptx(
        &self,
        name: &Arc<str>,
        owner: Owned,
    ) -> Result<(ModulePtx, PathBuf), GpuAttachError> {
        let sm = self
            .api
            .device_sm()
            .map_err(GpuAttachError::UnknownDevice)?;
        let mut d = self.discovery.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = d.missing.get(&(sm, name.clone())) {
            return Err(why.clone());
        }
        let index = d.indexes.entry(sm).or_insert_with(|| FatbinIndex::new(sm));
        let started = Instant::now();
        if let Err(e) = index.update_from_self() {
            tracing::warn!("the process's mappings are unreadable: {e}");
        }
        let kernels = self.api.kernel_names(owner);
        let found = index
            .ptx_of(name, kernels.as_deref())
            .map_err(GpuAttachError::from);
        tracing::debug!(
            kernel = %name,
            module_kernels = ?kernels,
            found = found.is_ok(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "looked for a kernel's PTX in the process's objects"
        );
        if let Err(why) = &found {
            d.missing.insert((sm, name.clone()), why.clone());
        }
        found
    }
}
