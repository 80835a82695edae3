//! The CUDA driver entry points GPU attach replaces, and their replacements.
//!
//! Interception is at the driver (docs/ARCHITECTURE.md decision 6), so it works whatever the application
//! is built with: cudart (static or shared) resolves these through `cuGetProcAddress`,
//! driver-API programs call them through the PLT, CuPy and PyTorch through either. Each
//! entry point is detoured where libcuda exports it and also at any other address
//! `cuGetProcAddress` hands out for it (per-thread-stream variants, versioned ABIs).
//!
//! Module and library loads are passed through and their PTX noted; function and kernel
//! lookups are noted; launches are passed through, to the instrumented kernel when a
//! probe names it (`session`). A replacement never fails a call the driver would have
//! served: whatever goes wrong on our side, the application's call goes through as made.

use bpftime_gpu_device::tensor_maps;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bpftime_attach::detour;

use crate::launch::Geometry;
use crate::session::{session, Owner};
use bpftime_gpu_device::cuda::{
    Api, CuResult, Handle, LaunchConfig, CUDA_SUCCESS, STREAM_PER_THREAD,
};
use bpftime_gpu_ptx::fatbin::ModulePtx;

/// How many addresses one entry point can be detoured at.
const SLOTS: usize = 4;

macro_rules! entry_point {
    (
        $name:ident, $symbols:expr,
        fn($($arg:ident: $ty:ty),* $(,)?),
        |$orig:ident, $per_thread:ident| $body:block
    ) => {
        pub(crate) mod $name {
            use super::*;

            pub(crate) type Fn = unsafe extern "C" fn($($ty),*) -> CuResult;
            pub(crate) const SYMBOLS: &[&str] = $symbols;
            pub(crate) static ORIGINAL: [AtomicUsize; SLOTS] =
                [const { AtomicUsize::new(0) }; SLOTS];
            /// Whether the slot's address serves the per-thread default stream.
            pub(crate) static PER_THREAD: [AtomicBool; SLOTS] =
                [const { AtomicBool::new(false) }; SLOTS];

            // The body runs under the FFI guard: should our code panic, the caller's call
            // still goes through as made (to the original, once: what the original
            // returned is kept if it was already called), and the panic is reported once.
            #[allow(clippy::too_many_arguments, unused_unsafe)]
            unsafe fn body(slot: usize, $($arg: $ty),*) -> CuResult {
                // SAFETY: the slot holds the original of the address it was detoured at,
                // written before the detour went live.
                let original_fn: Fn = unsafe {
                    std::mem::transmute::<usize, Fn>(ORIGINAL[slot].load(Ordering::Acquire))
                };
                let returned: std::cell::Cell<Option<CuResult>> = std::cell::Cell::new(None);
                bpftime_ffi_guard::ffi_guard!(
                    SYMBOLS[0],
                    // SAFETY: the caller's own arguments, passed as given.
                    returned.get().unwrap_or_else(|| unsafe { original_fn($($arg),*) }),
                    {
                        let began = crate::observer::call_begins();
                        let $orig = |$($arg: $ty),*| -> CuResult {
                            // SAFETY: the original, called with the arguments of a call
                            // made to it (the body's own choice of function aside).
                            let r = unsafe { original_fn($($arg),*) };
                            returned.set(Some(r));
                            r
                        };
                        let $per_thread = PER_THREAD[slot].load(Ordering::Relaxed);
                        let r: CuResult = $body;
                        crate::observer::call_ends(SYMBOLS[0], began, r);
                        r
                    }
                )
            }

            #[allow(clippy::too_many_arguments)]
            unsafe extern "C" fn r0($($arg: $ty),*) -> CuResult { unsafe { body(0, $($arg),*) } }
            #[allow(clippy::too_many_arguments)]
            unsafe extern "C" fn r1($($arg: $ty),*) -> CuResult { unsafe { body(1, $($arg),*) } }
            #[allow(clippy::too_many_arguments)]
            unsafe extern "C" fn r2($($arg: $ty),*) -> CuResult { unsafe { body(2, $($arg),*) } }
            #[allow(clippy::too_many_arguments)]
            unsafe extern "C" fn r3($($arg: $ty),*) -> CuResult { unsafe { body(3, $($arg),*) } }

            pub(crate) const REPLACEMENTS: [Fn; SLOTS] = [r0, r1, r2, r3];

            /// The original of the first address detoured, for our own calls.
            #[allow(dead_code)]
            pub(crate) fn original() -> Option<Fn> {
                let p = ORIGINAL[0].load(Ordering::Acquire);
                // SAFETY: a detour's original, with the entry point's signature.
                (p != 0).then(|| unsafe { std::mem::transmute::<usize, Fn>(p) })
            }
        }
    };
}

/// After a call that wrote a handle into `out`: hands it to `note`, with the session,
/// when the call succeeded and there is a session. The driver's result goes back to the
/// caller as it is.
///
/// # Safety
/// `out` must be what the call just wrote through.
unsafe fn noted(
    r: CuResult,
    out: *const Handle,
    note: impl FnOnce(&'static crate::GpuAttach, Handle),
) -> CuResult {
    if r == CUDA_SUCCESS && !out.is_null() {
        if let Some(s) = session() {
            // SAFETY: the driver wrote the handle (the caller's contract).
            note(s, unsafe { *out });
        }
    }
    r
}

/// After a load that wrote a module or library handle into `out`: notes the image the
/// driver took. The driver's result goes back to the caller as it is.
///
/// # Safety
/// `image` must be what the call just gave the driver, and `out` what it wrote through.
unsafe fn loaded(r: CuResult, out: *mut Handle, owner: Owner, image: *const c_void) -> CuResult {
    if image.is_null() {
        return r;
    }
    // SAFETY: `out` is what the call wrote through; the driver accepted the image, so it
    // is a well-formed one.
    unsafe {
        noted(r, out, |s, handle| {
            s.note_image(handle, owner, ModulePtx::from_image_ptr(image.cast()))
        })
    }
}

/// As [`loaded`], for an image the driver read from the file at `path`.
///
/// # Safety
/// `path` must be the NUL-terminated path the call just gave the driver.
unsafe fn loaded_file(
    r: CuResult,
    out: *mut Handle,
    owner: Owner,
    path: *const c_char,
) -> CuResult {
    if r != CUDA_SUCCESS || out.is_null() || path.is_null() {
        return r;
    }
    let Some(s) = session() else { return r };
    // SAFETY: the driver just opened this path and wrote `out`.
    let (handle, path) = unsafe { (*out, CStr::from_ptr(path).to_string_lossy().into_owned()) };
    let ptx = std::fs::read(&path)
        .map_err(|e| bpftime_gpu_ptx::fatbin::FatbinError::Decompress {
            what: "module file",
            arch: 0,
            reason: format!("{path}: {e}"),
        })
        .and_then(|bytes| ModulePtx::from_bytes(&bytes));
    s.note_image(handle, owner, ptx);
    r
}

/// After a lookup that wrote a function or kernel handle into `out`: notes its name and
/// module.
///
/// # Safety
/// `name` must be the NUL-terminated name the call just gave the driver.
unsafe fn found(r: CuResult, out: *mut Handle, owner: Handle, name: *const c_char) -> CuResult {
    if name.is_null() {
        return r;
    }
    // SAFETY: `out` is what the call wrote through; the driver found the name, which is
    // NUL-terminated (the caller's contract).
    unsafe {
        noted(r, out, |s, handle| {
            s.note_function(handle, owner, CStr::from_ptr(name))
        })
    }
}

entry_point!(
    module_load_data,
    &["cuModuleLoadData"],
    fn(module: *mut Handle, image: *const c_void),
    |original, _per_thread| {
        // SAFETY: the caller's arguments, passed as given.
        unsafe { loaded(original(module, image), module, Owner::Module, image) }
    }
);

entry_point!(
    module_load_data_ex,
    &["cuModuleLoadDataEx"],
    fn(
        module: *mut Handle,
        image: *const c_void,
        n: c_uint,
        options: *mut c_void,
        values: *mut *mut c_void,
    ),
    |original, _per_thread| {
        // SAFETY: the caller's arguments, passed as given.
        unsafe {
            let r = original(module, image, n, options, values);
            loaded(r, module, Owner::Module, image)
        }
    }
);

entry_point!(
    module_load_fat_binary,
    &["cuModuleLoadFatBinary"],
    fn(module: *mut Handle, image: *const c_void),
    |original, _per_thread| {
        // SAFETY: the caller's arguments, passed as given.
        unsafe { loaded(original(module, image), module, Owner::Module, image) }
    }
);

entry_point!(
    module_load,
    &["cuModuleLoad"],
    fn(module: *mut Handle, path: *const c_char),
    |original, _per_thread| {
        // SAFETY: the caller's arguments, passed as given.
        unsafe { loaded_file(original(module, path), module, Owner::Module, path) }
    }
);

entry_point!(
    library_load_data,
    &["cuLibraryLoadData"],
    fn(
        library: *mut Handle,
        code: *const c_void,
        jit_options: *mut c_void,
        jit_values: *mut *mut c_void,
        n_jit: c_uint,
        lib_options: *mut c_void,
        lib_values: *mut *mut c_void,
        n_lib: c_uint,
    ),
    |original, _per_thread| {
        // SAFETY: the caller's arguments, passed as given.
        unsafe {
            let r = original(
                library,
                code,
                jit_options,
                jit_values,
                n_jit,
                lib_options,
                lib_values,
                n_lib,
            );
            loaded(r, library, Owner::Library, code)
        }
    }
);

entry_point!(
    library_load_from_file,
    &["cuLibraryLoadFromFile"],
    fn(
        library: *mut Handle,
        path: *const c_char,
        jit_options: *mut c_void,
        jit_values: *mut *mut c_void,
        n_jit: c_uint,
        lib_options: *mut c_void,
        lib_values: *mut *mut c_void,
        n_lib: c_uint,
    ),
    |original, _per_thread| {
        // SAFETY: the caller's arguments, passed as given.
        unsafe {
            let r = original(
                library,
                path,
                jit_options,
                jit_values,
                n_jit,
                lib_options,
                lib_values,
                n_lib,
            );
            loaded_file(r, library, Owner::Library, path)
        }
    }
);

entry_point!(
    module_get_function,
    &["cuModuleGetFunction"],
    fn(function: *mut Handle, module: Handle, name: *const c_char),
    |original, _per_thread| {
        // SAFETY: the caller's arguments, passed as given.
        unsafe { found(original(function, module, name), function, module, name) }
    }
);

entry_point!(
    library_get_kernel,
    &["cuLibraryGetKernel"],
    fn(kernel: *mut Handle, library: Handle, name: *const c_char),
    |original, _per_thread| {
        // SAFETY: the caller's arguments, passed as given.
        unsafe { found(original(kernel, library, name), kernel, library, name) }
    }
);

entry_point!(
    kernel_get_function,
    &["cuKernelGetFunction"],
    fn(function: *mut Handle, kernel: Handle),
    |original, _per_thread| {
        // SAFETY: the caller's arguments, passed as given; the driver writes `function`.
        unsafe {
            noted(original(function, kernel), function, |s, f| {
                s.note_alias(f, kernel)
            })
        }
    }
);

entry_point!(
    library_get_module,
    &["cuLibraryGetModule"],
    fn(module: *mut Handle, library: Handle),
    |original, _per_thread| {
        // SAFETY: the caller's arguments, passed as given; the driver writes `module`.
        unsafe {
            noted(original(module, library), module, |s, m| {
                s.note_owner_alias(m, library)
            })
        }
    }
);

entry_point!(
    module_unload,
    &["cuModuleUnload"],
    fn(module: Handle),
    |original, _per_thread| {
        if let Some(s) = session() {
            s.forget(module);
        }
        // SAFETY: the caller's argument, passed as given.
        unsafe { original(module) }
    }
);

entry_point!(
    library_unload,
    &["cuLibraryUnload"],
    fn(library: Handle),
    |original, _per_thread| {
        if let Some(s) = session() {
            s.forget(library);
        }
        // SAFETY: the caller's argument, passed as given.
        unsafe { original(library) }
    }
);

/// Runs a context teardown (`call`) with the context's GPU work synced before it and
/// our state for it dropped after it.
fn around_teardown(
    ctx: Option<Handle>,
    device: Option<c_int>,
    call: impl FnOnce() -> CuResult,
) -> CuResult {
    if let Some(s) = session() {
        s.before_context_teardown(ctx, device);
    }
    let r = call();
    if r == CUDA_SUCCESS {
        if let Some(s) = session() {
            s.after_context_teardown(ctx, device);
        }
    }
    r
}

entry_point!(
    ctx_destroy,
    &["cuCtxDestroy_v2", "cuCtxDestroy"],
    fn(ctx: Handle),
    |original, _per_thread| {
        // SAFETY: the caller's argument, passed as given.
        around_teardown(Some(ctx), None, || unsafe { original(ctx) })
    }
);

entry_point!(
    primary_ctx_release,
    &["cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"],
    fn(device: c_int),
    |original, _per_thread| {
        // SAFETY: the caller's argument, passed as given.
        around_teardown(None, Some(device), || unsafe { original(device) })
    }
);

entry_point!(
    primary_ctx_reset,
    &["cuDevicePrimaryCtxReset_v2", "cuDevicePrimaryCtxReset"],
    fn(device: c_int),
    |original, _per_thread| {
        // SAFETY: the caller's argument, passed as given.
        around_teardown(None, Some(device), || unsafe { original(device) })
    }
);

/// Runs a launch of `f` on `stream` (`call` launches the function it is given): the
/// instrumented function when a probe names the kernel, with its maps synced around it,
/// and the launch programs that watch it. A NULL stream given to a `_ptsz` entry point is
/// the per-thread default stream.
fn launched(
    f: Handle,
    stream: Handle,
    per_thread: bool,
    geometry: Geometry,
    call: impl FnOnce(Handle) -> CuResult,
) -> CuResult {
    let Some(s) = session() else {
        return call(f);
    };
    let stream = if stream == 0 && per_thread {
        STREAM_PER_THREAD
    } else {
        stream
    };
    // The call's time only where launch programs will read it: a clock read per launch
    // otherwise.
    let called = if s.watches_launches() {
        bpftime_gpu_device::clock::host_monotonic_ns()
    } else {
        0
    };
    let launch = s.before_launch(f, stream);
    // The start event goes last before the launch: after the work of building an
    // instrumented module and of pushing map values, which is not the kernel's.
    let observed = s.observe_launch(f, stream, geometry, called);
    let r = call(launch.function);
    s.after_launch(launch, r);
    if let Some(o) = observed {
        s.after_observed_launch(o, r);
    }
    r
}

// An instrumented function takes the same parameters as the one it stands for, so the
// caller's arguments go to it unchanged.

entry_point!(
    launch_kernel,
    &["cuLaunchKernel", "cuLaunchKernel_ptsz"],
    fn(
        f: Handle,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        shared: c_uint,
        stream: Handle,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ),
    |original, per_thread| {
        let geometry = Geometry {
            grid: [gx, gy, gz],
            block: [bx, by, bz],
            shared_mem_bytes: shared,
        };
        launched(f, stream, per_thread, geometry, |f| {
            // SAFETY: the caller's arguments, the function aside.
            unsafe { original(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) }
        })
    }
);

entry_point!(
    launch_kernel_ex,
    &["cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"],
    fn(config: *const LaunchConfig, f: Handle, params: *mut *mut c_void, extra: *mut *mut c_void),
    |original, per_thread| {
        if config.is_null() {
            // SAFETY: the caller's arguments, passed as given (the driver refuses them).
            unsafe { original(config, f, params, extra) }
        } else {
            // SAFETY: the caller's config, valid for the call.
            let c = unsafe { *config };
            let geometry = Geometry {
                grid: c.grid,
                block: c.block,
                shared_mem_bytes: c.shared_mem_bytes,
            };
            launched(f, c.stream, per_thread, geometry, |f| {
                // SAFETY: the caller's arguments, the function aside.
                unsafe { original(config, f, params, extra) }
            })
        }
    }
);

entry_point!(
    launch_cooperative_kernel,
    &[
        "cuLaunchCooperativeKernel",
        "cuLaunchCooperativeKernel_ptsz"
    ],
    fn(
        f: Handle,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        shared: c_uint,
        stream: Handle,
        params: *mut *mut c_void,
    ),
    |original, per_thread| {
        let geometry = Geometry {
            grid: [gx, gy, gz],
            block: [bx, by, bz],
            shared_mem_bytes: shared,
        };
        launched(f, stream, per_thread, geometry, |f| {
            // SAFETY: the caller's arguments, the function aside.
            unsafe { original(f, gx, gy, gz, bx, by, bz, shared, stream, params) }
        })
    }
);

// A graph's kernel nodes hold the functions their capture launched, instrumented ones
// among them (`launched` swapped them in); the launch itself only tells GPU attach to
// bring their maps back once the graph has run.
entry_point!(
    graph_launch,
    &["cuGraphLaunch", "cuGraphLaunch_ptsz"],
    fn(exec: Handle, stream: Handle),
    |original, per_thread| {
        let called = bpftime_gpu_device::clock::host_monotonic_ns();
        let s = session();
        let ours = if stream == 0 && per_thread {
            STREAM_PER_THREAD
        } else {
            stream
        };
        let observed = s.and_then(|s| s.observe_graph_launch(exec, ours, called));
        // SAFETY: the caller's arguments, passed as given.
        let r = unsafe { original(exec, stream) };
        if let Some(s) = s {
            if let Some(o) = observed {
                s.after_observed_graph_launch(o, r);
            }
            s.after_graph_launch(ours, r);
        }
        r
    }
);

// A graph's instantiation is where its watched kernel nodes get the event-record nodes
// that time them (`Session::before_instantiate`); the executable graph is noted with them.
entry_point!(
    graph_instantiate_with_flags,
    &["cuGraphInstantiateWithFlags"],
    fn(exec: *mut Handle, graph: Handle, flags: u64),
    |original, _per_thread| {
        instantiated(exec, graph, || {
            // SAFETY: the caller's arguments, passed as given.
            unsafe { original(exec, graph, flags) }
        })
    }
);

entry_point!(
    graph_instantiate_with_params,
    &[
        "cuGraphInstantiateWithParams",
        "cuGraphInstantiateWithParams_ptsz"
    ],
    fn(exec: *mut Handle, graph: Handle, params: *mut c_void),
    |original, _per_thread| {
        instantiated(exec, graph, || {
            // SAFETY: the caller's arguments, passed as given.
            unsafe { original(exec, graph, params) }
        })
    }
);

entry_point!(
    graph_instantiate_v2,
    &["cuGraphInstantiate_v2"],
    fn(
        exec: *mut Handle,
        graph: Handle,
        error_node: *mut Handle,
        log: *mut c_char,
        log_size: usize,
    ),
    |original, _per_thread| {
        instantiated(exec, graph, || {
            // SAFETY: the caller's arguments, passed as given.
            unsafe { original(exec, graph, error_node, log, log_size) }
        })
    }
);

/// An instantiation of `graph` into `*exec`, made by `call`, with GPU attach's look at the
/// graph before it and at the executable graph after it.
fn instantiated(exec: *mut Handle, graph: Handle, call: impl FnOnce() -> CuResult) -> CuResult {
    let s = session();
    if let Some(s) = s {
        s.before_instantiate(graph);
    }
    let r = call();
    if let (Some(s), false) = (s, exec.is_null()) {
        // SAFETY: the driver wrote the executable graph's handle where the caller asked.
        s.after_instantiate(graph, unsafe { *exec }, r);
    }
    r
}

// A capture must not run beside GPU attach's own CUDA work (module loads, copies): its
// start waits for that work, which then waits for the capture's end.
entry_point!(
    stream_begin_capture,
    &[
        "cuStreamBeginCapture_v2",
        "cuStreamBeginCapture",
        "cuStreamBeginCapture_ptsz",
        "cuStreamBeginCapture_v2_ptsz"
    ],
    fn(stream: Handle, mode: c_int),
    |original, _per_thread| {
        let s = session();
        if let Some(s) = s {
            s.capture_begins();
        }
        // SAFETY: the caller's arguments, passed as given.
        let r = unsafe { original(stream, mode) };
        if let (Some(s), true) = (s, r != CUDA_SUCCESS) {
            s.capture_ends();
        }
        r
    }
);

entry_point!(
    stream_end_capture,
    &["cuStreamEndCapture", "cuStreamEndCapture_ptsz"],
    fn(stream: Handle, graph: *mut Handle),
    |original, _per_thread| {
        // SAFETY: the caller's arguments, passed as given.
        let r = unsafe { original(stream, graph) };
        if let Some(s) = session() {
            s.capture_ends();
        }
        r
    }
);

// Tensor maps, noted with what they were made from: memory-access probes find a tensor
// copy's global memory through them (`tensor_maps`).
entry_point!(
    tensor_map_encode_tiled,
    &["cuTensorMapEncodeTiled"],
    fn(
        map: *mut c_void,
        data_type: c_uint,
        rank: c_uint,
        global_address: *mut c_void,
        dims: *const u64,
        strides: *const u64,
        box_dims: *const c_uint,
        element_strides: *const c_uint,
        interleave: c_uint,
        swizzle: c_uint,
        l2_promotion: c_uint,
        oob_fill: c_uint,
    ),
    |original, _per_thread| {
        // SAFETY: the caller's arguments, passed as given.
        let r = unsafe {
            original(
                map,
                data_type,
                rank,
                global_address,
                dims,
                strides,
                box_dims,
                element_strides,
                interleave,
                swizzle,
                l2_promotion,
                oob_fill,
            )
        };
        if r == CUDA_SUCCESS && !map.is_null() && (1..=5).contains(&rank) {
            let rank = rank as usize;
            // SAFETY: the driver accepted them: `rank` dimensions, box sizes and element
            // strides, `rank - 1` strides, and the 128-byte map it wrote.
            let noted = unsafe {
                let t = tensor_maps::Tiled {
                    data_type,
                    global_address: global_address as u64,
                    dims: std::slice::from_raw_parts(dims, rank),
                    strides: if rank > 1 {
                        std::slice::from_raw_parts(strides, rank - 1)
                    } else {
                        &[]
                    },
                    box_dims: std::slice::from_raw_parts(box_dims, rank),
                    element_strides: std::slice::from_raw_parts(element_strides, rank),
                    interleave,
                };
                tensor_maps::note(&*map.cast::<[u8; tensor_maps::MAP_BYTES]>(), &t)
            };
            if let (Err(why), Some(s)) = (noted, session()) {
                s.tensor_map_refused(&why);
            }
        }
        r
    }
);

entry_point!(
    tensor_map_replace_address,
    &["cuTensorMapReplaceAddress"],
    fn(map: *mut c_void, global_address: *mut c_void),
    |original, _per_thread| {
        type Map = [u8; tensor_maps::MAP_BYTES];
        // SAFETY: the map the caller asks the driver to change: 128 bytes it may read.
        let before: Option<Map> = (!map.is_null()).then(|| unsafe { *map.cast::<Map>() });
        // SAFETY: the caller's arguments, passed as given.
        let r = unsafe { original(map, global_address) };
        if let (CUDA_SUCCESS, Some(before)) = (r, before) {
            // SAFETY: the map the driver just wrote.
            let after = unsafe { *map.cast::<Map>() };
            tensor_maps::address_replaced(&before, &after, global_address as u64);
        }
        r
    }
);

/// One entry point's detouring: its symbols, replacements and slots.
struct Table {
    symbols: &'static [&'static str],
    replacements: Vec<usize>,
    originals: &'static [AtomicUsize; SLOTS],
    per_thread: &'static [AtomicBool; SLOTS],
}

macro_rules! table {
    ($($m:ident),*) => {
        vec![$(Table {
            symbols: $m::SYMBOLS,
            replacements: $m::REPLACEMENTS.iter().map(|f| *f as usize).collect(),
            originals: &$m::ORIGINAL,
            per_thread: &$m::PER_THREAD,
        }),*]
    };
}

/// The CUDA versions whose ABIs `cuGetProcAddress` is asked about: an entry point whose
/// address differs by version (or for the per-thread stream) is detoured at each.
const ABI_VERSIONS: &[i32] = &[11000, 12000, 12040, 12080, 13000];
const PROC_FLAGS: &[(u64, bool)] = &[(0, false), (2, true)];

/// Detours every entry point at every address the driver hands out for it, then puts
/// the originals of those GPU attach calls itself into `api`, so that its own calls never
/// come back through the replacements. Entry points the driver lacks are skipped (older
/// drivers); a detour that fails is logged and the rest go on, since each alone is
/// enough for what it intercepts. Returns how many detours went in; they stay for the
/// process's life.
///
/// # Safety
/// `lib` is the loaded driver's handle and `api` resolved from it.
pub(crate) unsafe fn install(lib: *mut c_void, api: &mut Api) -> usize {
    let tables = table!(
        module_load_data,
        module_load_data_ex,
        module_load_fat_binary,
        module_load,
        library_load_data,
        library_load_from_file,
        module_get_function,
        library_get_kernel,
        kernel_get_function,
        library_get_module,
        module_unload,
        library_unload,
        launch_kernel,
        launch_kernel_ex,
        launch_cooperative_kernel,
        graph_launch,
        graph_instantiate_with_flags,
        graph_instantiate_with_params,
        graph_instantiate_v2,
        stream_begin_capture,
        stream_end_capture,
        tensor_map_encode_tiled,
        tensor_map_replace_address,
        ctx_destroy,
        primary_ctx_release,
        primary_ctx_reset
    );
    let mut installed = Vec::new();
    for t in &tables {
        // (address, serves the per-thread stream)
        let mut addrs: Vec<(usize, bool)> = Vec::new();
        for sym in t.symbols {
            let name = std::ffi::CString::new(*sym).expect("no NUL");
            // SAFETY: a live handle and a NUL-terminated name.
            let p = unsafe { libc::dlsym(lib, name.as_ptr()) } as usize;
            if p != 0 && !addrs.iter().any(|(a, _)| *a == p) {
                addrs.push((p, sym.ends_with("_ptsz")));
            }
            if sym.ends_with("_ptsz") {
                continue;
            }
            for &version in ABI_VERSIONS {
                for &(flags, per_thread) in PROC_FLAGS {
                    let mut pfn: *mut c_void = std::ptr::null_mut();
                    let mut status = 0;
                    // SAFETY: writes a function pointer and a status.
                    let r = unsafe {
                        (api.get_proc_address)(name.as_ptr(), &mut pfn, version, flags, &mut status)
                    };
                    let p = pfn as usize;
                    if r == CUDA_SUCCESS && p != 0 && !addrs.iter().any(|(a, _)| *a == p) {
                        addrs.push((p, per_thread));
                    }
                }
            }
        }
        if addrs.len() > SLOTS {
            tracing::warn!(
                entry_point = t.symbols[0],
                addresses = addrs.len(),
                "more addresses than detour slots; calls through the last ones are not seen"
            );
            addrs.truncate(SLOTS);
        }
        for (slot, (addr, per_thread)) in addrs.into_iter().enumerate() {
            t.per_thread[slot].store(per_thread, Ordering::Relaxed);
            // SAFETY: `addr` is a driver entry point with the replacement's signature;
            // replacements are functions of this library, which is never unloaded.
            match unsafe { detour(addr, t.replacements[slot], &t.originals[slot]) } {
                Ok(d) => {
                    tracing::debug!(
                        entry_point = t.symbols[0],
                        slot,
                        addr = format_args!("{addr:#x}"),
                        "detoured"
                    );
                    installed.push(d);
                }
                Err(e) => tracing::warn!(entry_point = t.symbols[0], "not intercepted: {e}"),
            }
        }
    }
    if let Some(f) = module_load_data::original() {
        api.module_load_data = f;
    }
    if let Some(f) = module_get_function::original() {
        api.module_get_function = f;
    }
    if let Some(f) = launch_kernel::original() {
        api.launch_kernel = f;
    }
    if let Some(f) = library_get_kernel::original() {
        api.library_get_kernel = f;
    }
    if let Some(f) = module_unload::original() {
        api.module_unload = f;
    }
    installed.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    static ORIGINAL_CALLS: AtomicUsize = AtomicUsize::new(0);

    /// Stands for libcuda's `cuModuleLoadData`: counts its calls and succeeds.
    unsafe extern "C" fn driver_module_load_data(
        module: *mut Handle,
        _: *const c_void,
    ) -> CuResult {
        ORIGINAL_CALLS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the test passes a writable handle.
        unsafe { *module = 0x1234 };
        CUDA_SUCCESS
    }

    #[test]
    fn a_panic_in_our_code_leaves_the_applications_call_made_once() {
        // The last slot, which no detour of this test binary uses.
        module_load_data::ORIGINAL[SLOTS - 1].store(
            driver_module_load_data as *const () as usize,
            Ordering::Release,
        );
        bpftime_ffi_guard::inject_panic("cuModuleLoadData");
        let mut module: Handle = 0;
        let replacement = module_load_data::REPLACEMENTS[SLOTS - 1];
        // SAFETY: the arguments the fake driver function above accepts.
        let r = unsafe { replacement(&mut module, std::ptr::null()) };
        assert_eq!(
            r, CUDA_SUCCESS,
            "the driver's own result, not an error of ours"
        );
        assert_eq!(module, 0x1234, "the driver's call was made");
        assert_eq!(ORIGINAL_CALLS.load(Ordering::SeqCst), 1, "and made once");
    }
}
