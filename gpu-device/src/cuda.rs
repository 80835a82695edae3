//! The slice of the CUDA driver API that GPU attach calls, resolved from the libcuda this
//! process already loaded (never loading one: a process that does not use CUDA never gets
//! it from us).
//!
//! Results and enums stay plain integers and handles plain addresses: a code this table
//! did not expect must not become an invalid Rust enum. For the entry points GPU attach
//! detours, the session's [`Api`] holds the originals, so that our own calls never come
//! back through our replacements.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

/// `CUresult`.
pub type CuResult = c_uint;
pub const CUDA_SUCCESS: CuResult = 0;
pub const CUDA_ERROR_NOT_READY: CuResult = 600;

/// Opaque driver handles: `CUcontext`, `CUmodule`, `CUlibrary`, `CUfunction`, `CUkernel`,
/// `CUstream`, `CUevent`.
pub type Handle = usize;
/// `CUdeviceptr`.
pub type DevicePtr = u64;

/// The per-thread default stream, `CU_STREAM_PER_THREAD`.
pub const STREAM_PER_THREAD: Handle = 0x2;
pub const STREAM_NON_BLOCKING: c_uint = 0x1;
pub const EVENT_DEFAULT: c_uint = 0x0;
pub const EVENT_DISABLE_TIMING: c_uint = 0x2;

pub const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
pub const ATTR_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub const ATTR_COMPUTE_CAPABILITY_MINOR: c_int = 76;

/// A module or a library, as the driver answers what a function belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    Module(Handle),
    Library(Handle),
}

impl Owned {
    pub fn handle(self) -> Handle {
        match self {
            Owned::Module(h) | Owned::Library(h) => h,
        }
    }
}

/// `CUlaunchConfig`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct LaunchConfig {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: Handle,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// Why a driver call failed, with the driver's own words for the code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {name} ({code})")]
pub struct CudaError {
    pub call: &'static str,
    pub code: CuResult,
    pub name: String,
}

macro_rules! api {
    ($( $field:ident: $symbol:literal fn($($arg:ty),*) ;)*) => {
        /// Driver entry points, resolved by name.
        #[derive(Clone, Copy)]
        pub struct Api {
            $( pub $field: unsafe extern "C" fn($($arg),*) -> CuResult, )*
            /// `cuFuncGetName` (CUDA 12.3 and newer drivers).
            pub func_get_name: Option<unsafe extern "C" fn(*mut *const c_char, Handle) -> CuResult>,
            /// `cuKernelGetName` (CUDA 12.3 and newer drivers).
            pub kernel_get_name: Option<unsafe extern "C" fn(*mut *const c_char, Handle) -> CuResult>,
            /// `cuFuncLoad` (CUDA 12.4 and newer drivers).
            pub func_load: Option<unsafe extern "C" fn(Handle) -> CuResult>,
            /// `cuKernelGetFunction`.
            pub kernel_get_function: Option<unsafe extern "C" fn(*mut Handle, Handle) -> CuResult>,
            /// The graph calls that time a graph's kernel nodes, where the driver has them all.
            pub graph: Option<GraphApi>,
            pub vmm: Option<VmmApi>,
            /// `cuLibraryGetGlobal` (CUDA 12.0 and newer drivers).
            pub library_get_global: Option<unsafe extern "C" fn(*mut DevicePtr, *mut usize, Handle, *const c_char) -> CuResult>,
            /// `cuFuncGetModule` (CUDA 11 and newer drivers).
            pub func_get_module: Option<unsafe extern "C" fn(*mut Handle, Handle) -> CuResult>,
            /// `cuKernelGetLibrary` (CUDA 12.5 and newer drivers).
            pub kernel_get_library: Option<unsafe extern "C" fn(*mut Handle, Handle) -> CuResult>,
            /// `cuModuleGetFunctionCount` and `cuModuleEnumerateFunctions` (CUDA 12.4).
            pub module_function_count: Option<unsafe extern "C" fn(*mut c_uint, Handle) -> CuResult>,
            pub module_enumerate_functions: Option<unsafe extern "C" fn(*mut Handle, c_uint, Handle) -> CuResult>,
            /// `cuLibraryGetKernelCount` and `cuLibraryEnumerateKernels` (CUDA 12.4).
            pub library_kernel_count: Option<unsafe extern "C" fn(*mut c_uint, Handle) -> CuResult>,
            pub library_enumerate_kernels: Option<unsafe extern "C" fn(*mut Handle, c_uint, Handle) -> CuResult>,
        }

        impl Api {
            /// Resolves every entry point in `lib` (a `dlopen` handle).
            ///
            /// # Safety
            /// `lib` must be a live handle of the CUDA driver library.
            unsafe fn resolve(lib: *mut c_void) -> Result<Api, MissingEntryPoint> {
                Ok(Api {
                    $( $field: {
                        // SAFETY: the driver exports this symbol with this signature
                        // (cuda.h of CUDA 12 and 13).
                        let p = unsafe { symbol(lib, $symbol) }
                            .ok_or(MissingEntryPoint($symbol))?;
                        // SAFETY: as above.
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CuResult>(p) }
                    }, )*
                    // SAFETY: as above, where the driver has them.
                    func_get_name: unsafe { symbol(lib, "cuFuncGetName") }
                        .map(|p| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut *const c_char, Handle) -> CuResult>(p) }),
                    // SAFETY: as above.
                    kernel_get_name: unsafe { symbol(lib, "cuKernelGetName") }
                        .map(|p| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut *const c_char, Handle) -> CuResult>(p) }),
                    // SAFETY: as above.
                    func_load: unsafe { symbol(lib, "cuFuncLoad") }
                        .map(|p| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(Handle) -> CuResult>(p) }),
                    // SAFETY: as above.
                    kernel_get_function: unsafe { symbol(lib, "cuKernelGetFunction") }
                        .map(|p| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut Handle, Handle) -> CuResult>(p) }),
                    // SAFETY: as above.
                    graph: unsafe { GraphApi::resolve(lib) },
                    // SAFETY: as above.
                    vmm: unsafe { VmmApi::resolve(lib) },
                    // SAFETY: as above.
                    library_get_global: unsafe { symbol(lib, "cuLibraryGetGlobal") }
                        .map(|p| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut DevicePtr, *mut usize, Handle, *const c_char) -> CuResult>(p) }),
                    // SAFETY: as above.
                    func_get_module: unsafe { symbol(lib, "cuFuncGetModule") }
                        .map(|p| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut Handle, Handle) -> CuResult>(p) }),
                    // SAFETY: as above.
                    kernel_get_library: unsafe { symbol(lib, "cuKernelGetLibrary") }
                        .map(|p| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut Handle, Handle) -> CuResult>(p) }),
                    // SAFETY: as above.
                    module_function_count: unsafe { symbol(lib, "cuModuleGetFunctionCount") }
                        .map(|p| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_uint, Handle) -> CuResult>(p) }),
                    // SAFETY: as above.
                    module_enumerate_functions: unsafe { symbol(lib, "cuModuleEnumerateFunctions") }
                        .map(|p| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut Handle, c_uint, Handle) -> CuResult>(p) }),
                    // SAFETY: as above.
                    library_kernel_count: unsafe { symbol(lib, "cuLibraryGetKernelCount") }
                        .map(|p| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_uint, Handle) -> CuResult>(p) }),
                    // SAFETY: as above.
                    library_enumerate_kernels: unsafe { symbol(lib, "cuLibraryEnumerateKernels") }
                        .map(|p| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut Handle, c_uint, Handle) -> CuResult>(p) }),
                })
            }
        }
    };
}

api! {
    get_error_name: "cuGetErrorName" fn(CuResult, *mut *const c_char);
    driver_get_version: "cuDriverGetVersion" fn(*mut c_int);
    ctx_get_current: "cuCtxGetCurrent" fn(*mut Handle);
    ctx_set_current: "cuCtxSetCurrent" fn(Handle);
    ctx_get_device: "cuCtxGetDevice" fn(*mut c_int);
    primary_ctx_get_state: "cuDevicePrimaryCtxGetState" fn(c_int, *mut c_uint, *mut c_int);
    device_get_attribute: "cuDeviceGetAttribute" fn(*mut c_int, c_int, c_int);
    device_get_name: "cuDeviceGetName" fn(*mut c_char, c_int, c_int);
    module_load_data: "cuModuleLoadData" fn(*mut Handle, *const c_void);
    module_get_function: "cuModuleGetFunction" fn(*mut Handle, Handle, *const c_char);
    module_get_global: "cuModuleGetGlobal_v2" fn(*mut DevicePtr, *mut usize, Handle, *const c_char);
    module_unload: "cuModuleUnload" fn(Handle);
    func_get_attribute: "cuFuncGetAttribute" fn(*mut c_int, c_int, Handle);
    mem_alloc: "cuMemAlloc_v2" fn(*mut DevicePtr, usize);
    mem_host_alloc: "cuMemHostAlloc" fn(*mut *mut c_void, usize, c_uint);
    memcpy_htod_async: "cuMemcpyHtoDAsync_v2" fn(DevicePtr, *const c_void, usize, Handle);
    memcpy_dtoh_async: "cuMemcpyDtoHAsync_v2" fn(*mut c_void, DevicePtr, usize, Handle);
    memset_d8_async: "cuMemsetD8Async" fn(DevicePtr, u8, usize, Handle);
    memcpy_dtod_async: "cuMemcpyDtoDAsync_v2" fn(DevicePtr, DevicePtr, usize, Handle);
    stream_create: "cuStreamCreate" fn(*mut Handle, c_uint);
    stream_synchronize: "cuStreamSynchronize" fn(Handle);
    event_create: "cuEventCreate" fn(*mut Handle, c_uint);
    event_record: "cuEventRecord" fn(Handle, Handle);
    event_query: "cuEventQuery" fn(Handle);
    event_synchronize: "cuEventSynchronize" fn(Handle);
    event_elapsed_time: "cuEventElapsedTime" fn(*mut f32, Handle, Handle);
    stream_is_capturing: "cuStreamIsCapturing" fn(Handle, *mut c_int);
    thread_exchange_stream_capture_mode: "cuThreadExchangeStreamCaptureMode" fn(*mut c_int);
    launch_kernel: "cuLaunchKernel" fn(Handle, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, Handle, *mut *mut c_void, *mut *mut c_void);
    library_get_kernel: "cuLibraryGetKernel" fn(*mut Handle, Handle, *const c_char);
    get_proc_address: "cuGetProcAddress_v2" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int);
}

/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: c_int = 2;

/// The calling thread's stream capture mode, relaxed while this lives.
pub struct RelaxedCapture<'a> {
    api: &'a Api,
    previous: Option<c_int>,
}

impl Drop for RelaxedCapture<'_> {
    fn drop(&mut self) {
        if let Some(mut mode) = self.previous {
            // SAFETY: reads and writes one int.
            unsafe { (self.api.thread_exchange_stream_capture_mode)(&mut mode) };
        }
    }
}

/// The driver library's name, as the loader finds it.
pub const LIBCUDA: &str = "libcuda.so.1";

/// `dlsym`, or `None`.
///
/// # Safety
/// `lib` must be a live `dlopen` handle.
/// `CU_GRAPH_NODE_TYPE_KERNEL`.
pub const GRAPH_NODE_KERNEL: c_int = 0;

/// `CUDA_KERNEL_NODE_PARAMS_v2` (cuda.h of CUDA 12 and 13).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelNodeParams {
    pub func: Handle,
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
    pub kern: Handle,
    pub ctx: Handle,
}

const _: () = assert!(std::mem::size_of::<KernelNodeParams>() == 72);

/// A group of driver calls GPU attach uses only when the driver has them all: the struct
/// `$name` of their entry points, resolved together or not at all.
macro_rules! optional_api {
    ($(#[$doc:meta])* $name:ident { $( $field:ident: $symbol:literal fn($($arg:ty),*) ;)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        pub struct $name {
            $( pub $field: unsafe extern "C" fn($($arg),*) -> CuResult, )*
        }

        impl $name {
            /// # Safety
            /// `lib` must be a live handle of the CUDA driver library.
            unsafe fn resolve(lib: *mut c_void) -> Option<$name> {
                Some($name {
                    $( $field: {
                        // SAFETY: the driver exports this symbol with this signature.
                        let p = unsafe { symbol(lib, $symbol) }?;
                        // SAFETY: as above.
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CuResult>(p) }
                    }, )*
                })
            }
        }
    };
}

optional_api! {
    /// The graph calls of the driver API that GPU attach uses to time a graph's kernel
    /// nodes (CUDA 12.3 and newer drivers export them all). The edge calls are the `_v2`
    /// ones, with edge data (passed as null: default edges): CUDA 13's unversioned names
    /// have their signatures, CUDA 12's the older ones.
    GraphApi {
    get_nodes: "cuGraphGetNodes" fn(Handle, *mut Handle, *mut usize);
    node_get_type: "cuGraphNodeGetType" fn(Handle, *mut c_int);
    kernel_node_get_params: "cuGraphKernelNodeGetParams_v2" fn(Handle, *mut KernelNodeParams);
    node_get_dependencies: "cuGraphNodeGetDependencies_v2" fn(Handle, *mut Handle, *mut c_void, *mut usize);
    node_get_dependent_nodes: "cuGraphNodeGetDependentNodes_v2" fn(Handle, *mut Handle, *mut c_void, *mut usize);
    add_event_record_node: "cuGraphAddEventRecordNode" fn(*mut Handle, Handle, *const Handle, usize, Handle);
    add_dependencies: "cuGraphAddDependencies_v2" fn(Handle, *const Handle, *const Handle, *const c_void, usize);
    exec_event_record_node_set_event: "cuGraphExecEventRecordNodeSetEvent" fn(Handle, Handle, Handle);
}
}

optional_api! {
    /// The virtual memory calls (CUDA 10.2 and newer) with which GPU attach places its
    /// device memory at addresses of its choosing (see [`crate::arena`]).
    VmmApi {
    address_reserve: "cuMemAddressReserve" fn(*mut DevicePtr, usize, usize, DevicePtr, u64);
    create: "cuMemCreate" fn(*mut u64, usize, *const MemAllocationProp, u64);
    map: "cuMemMap" fn(DevicePtr, usize, usize, u64, u64);
    set_access: "cuMemSetAccess" fn(DevicePtr, usize, *const MemAccessDesc, usize);
    release: "cuMemRelease" fn(u64);
    granularity: "cuMemGetAllocationGranularity" fn(*mut usize, *const MemAllocationProp, c_int);
    }
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemLocation {
    pub kind: c_int,
    pub id: c_int,
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const MEM_LOCATION_DEVICE: c_int = 1;

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAllocationProp {
    pub kind: c_int,
    pub requested_handle_types: c_int,
    pub location: MemLocation,
    pub win32_metadata: *mut c_void,
    pub flags: [u8; 8],
}

const _: () = assert!(std::mem::size_of::<MemAllocationProp>() == 32);

/// `CU_MEM_ALLOCATION_TYPE_PINNED`.
pub const MEM_ALLOCATION_PINNED: c_int = 1;

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemAccessDesc {
    pub location: MemLocation,
    pub flags: c_int,
}

/// `CU_MEM_ACCESS_FLAGS_PROT_READWRITE`.
pub const MEM_ACCESS_READ_WRITE: c_int = 3;

unsafe fn symbol(lib: *mut c_void, name: &str) -> Option<*mut c_void> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// An entry point GPU attach needs that the loaded CUDA driver lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the CUDA driver has no {0}")]
pub struct MissingEntryPoint(pub &'static str);

/// The handle of the driver library this process loaded, which is never closed: made
/// only by [`loaded_libcuda`], so that [`api_from`] resolves from a real one.
#[derive(Debug, Clone, Copy)]
pub struct LoadedDriver(*mut c_void);

impl LoadedDriver {
    /// The `dlopen` handle, for `dlsym`.
    pub fn handle(self) -> *mut c_void {
        self.0
    }
}

/// The driver library's handle if this process has loaded it, without loading it.
pub fn loaded_libcuda() -> Option<LoadedDriver> {
    // SAFETY: RTLD_NOLOAD only looks: it returns the handle of an already-loaded library
    // (taking a reference, which we keep for good) or NULL.
    let h = unsafe {
        libc::dlopen(
            c"libcuda.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_GLOBAL,
        )
    };
    (!h.is_null()).then_some(LoadedDriver(h))
}

/// Resolves the entry points from the loaded driver; an error names an entry point the
/// driver lacks.
pub fn api_from(lib: LoadedDriver) -> Result<Api, MissingEntryPoint> {
    // SAFETY: `lib` is the loaded driver's handle (a `LoadedDriver` is made from nothing
    // else), which is never closed.
    unsafe { Api::resolve(lib.0) }
}

impl Api {
    /// The driver's name for `code` (`CUDA_ERROR_INVALID_PTX`, ...).
    pub fn error_name(&self, code: CuResult) -> String {
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: writes a pointer to a static string, or fails.
        let r = unsafe { (self.get_error_name)(code, &mut name) };
        if r != CUDA_SUCCESS || name.is_null() {
            return format!("CUDA error {code}");
        }
        // SAFETY: the driver's static, NUL-terminated string.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// `Ok(())` for success, else the error with its name.
    pub fn check(&self, call: &'static str, code: CuResult) -> Result<(), CudaError> {
        if code == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(CudaError {
                call,
                code,
                name: self.error_name(code),
            })
        }
    }

    /// Loads the PTX `text` as a module in the current context: its handle, or the
    /// driver's error code (`CUDA_ERROR_INVALID_VALUE` for text holding a NUL).
    pub fn load_ptx(&self, text: &str) -> Result<Handle, CuResult> {
        /// `CUDA_ERROR_INVALID_VALUE`.
        const INVALID_VALUE: CuResult = 1;
        let source = CString::new(text).map_err(|_| INVALID_VALUE)?;
        let mut module = 0;
        // SAFETY: a NUL-terminated PTX module; writes one module handle.
        let r = unsafe { (self.module_load_data)(&mut module, source.as_ptr().cast()) };
        if r == CUDA_SUCCESS {
            Ok(module)
        } else {
            Err(r)
        }
    }

    /// The function `name` of `module`, if it has one.
    pub fn module_function(&self, module: Handle, name: &str) -> Option<Handle> {
        let name = CString::new(name).ok()?;
        let mut f = 0;
        // SAFETY: a NUL-terminated name; writes one function handle.
        let r = unsafe { (self.module_get_function)(&mut f, module, name.as_ptr()) };
        (r == CUDA_SUCCESS).then_some(f)
    }

    /// The current context (0 for none).
    pub fn current_context(&self) -> Handle {
        let mut ctx = 0;
        // SAFETY: writes one handle.
        let r = unsafe { (self.ctx_get_current)(&mut ctx) };
        if r == CUDA_SUCCESS {
            ctx
        } else {
            0
        }
    }

    /// An attribute of the current context's device.
    pub fn device_attribute(&self, attr: c_int) -> Result<i32, CudaError> {
        let mut dev = 0;
        // SAFETY: writes one int.
        self.check("cuCtxGetDevice", unsafe { (self.ctx_get_device)(&mut dev) })?;
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("cuDeviceGetAttribute", unsafe {
            (self.device_get_attribute)(&mut v, attr, dev)
        })?;
        Ok(v)
    }

    /// The name of device `ordinal` (`NVIDIA H100 80GB HBM3`), or `None`.
    pub fn device_name(&self, ordinal: c_int) -> Option<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: writes at most `buf.len()` bytes, NUL included.
        let r = unsafe { (self.device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, ordinal) };
        if r != CUDA_SUCCESS {
            return None;
        }
        // SAFETY: the driver wrote a NUL-terminated name into `buf`.
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Some(name.to_string_lossy().trim().to_string())
    }

    /// The current context's device's compute capability as `XY` (90 for sm_90).
    pub fn device_sm(&self) -> Result<u32, CudaError> {
        let major = self.device_attribute(ATTR_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = self.device_attribute(ATTR_COMPUTE_CAPABILITY_MINOR)?;
        Ok((major * 10 + minor) as u32)
    }

    /// The driver's CUDA version: 13000 for 13.0.
    pub fn driver_version(&self) -> Result<i32, CudaError> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("cuDriverGetVersion", unsafe {
            (self.driver_get_version)(&mut v)
        })?;
        Ok(v)
    }

    /// Whether `stream` is being captured into a CUDA graph (its launches do not run
    /// now); unknown counts as captured.
    pub fn stream_capturing(&self, stream: Handle) -> bool {
        let mut status = 0;
        // SAFETY: writes one int.
        let r = unsafe { (self.stream_is_capturing)(stream, &mut status) };
        r != CUDA_SUCCESS || status != 0
    }

    /// Lets this thread make calls a stream capture in global mode prohibits (allocations,
    /// module loads, synchronous copies) until the guard drops, which puts the thread's
    /// mode back: CUDA's way for a library to work beside an application's capture without
    /// invalidating it.
    pub fn relaxed_capture(&self) -> RelaxedCapture<'_> {
        let mut mode = CAPTURE_MODE_RELAXED;
        // SAFETY: reads and writes one int.
        let ok = unsafe { (self.thread_exchange_stream_capture_mode)(&mut mode) } == CUDA_SUCCESS;
        RelaxedCapture {
            api: self,
            previous: ok.then_some(mode),
        }
    }

    /// Milliseconds from `start` to `end`, two completed timing events of one context.
    pub fn elapsed_ms(&self, start: Handle, end: Handle) -> Result<f32, CudaError> {
        let mut ms = 0f32;
        // SAFETY: writes one float.
        self.check("cuEventElapsedTime", unsafe {
            (self.event_elapsed_time)(&mut ms, start, end)
        })?;
        Ok(ms)
    }

    /// Loads a function's code into the current context now, where lazy loading
    /// (`CUDA_MODULE_LOADING=LAZY`, the default) would load it inside its first launch
    /// call. `f` may be a `CUkernel` used as a function. Whether it worked.
    pub fn load_function(&self, f: Handle) -> bool {
        let Some(load) = self.func_load else {
            return false;
        };
        // SAFETY: a handle the application launches.
        if unsafe { load(f) } == CUDA_SUCCESS {
            return true;
        }
        let Some(get) = self.kernel_get_function else {
            return false;
        };
        let mut function = 0;
        // SAFETY: writes one handle; the driver refuses what is not a kernel.
        unsafe { get(&mut function, f) == CUDA_SUCCESS && load(function) == CUDA_SUCCESS }
    }

    /// What a function or kernel handle was loaded from: its module (`cuFuncGetModule`), or
    /// for a kernel of a library (`CUkernel`), its library; `None` where the driver cannot
    /// say.
    pub fn function_owner(&self, f: Handle) -> Option<Owned> {
        if let Some(get) = self.func_get_module {
            let mut module = 0;
            // SAFETY: writes one handle, or fails for a handle that is no function.
            if unsafe { get(&mut module, f) } == CUDA_SUCCESS && module != 0 {
                return Some(Owned::Module(module));
            }
        }
        let get = self.kernel_get_library?;
        let mut library = 0;
        // SAFETY: as above, for a kernel.
        (unsafe { get(&mut library, f) } == CUDA_SUCCESS && library != 0)
            .then_some(Owned::Library(library))
    }

    /// The names of every kernel of a module or library, where the driver can list them
    /// (`cuModuleEnumerateFunctions`, `cuLibraryEnumerateKernels`).
    pub fn kernel_names(&self, owner: Owned) -> Option<Vec<String>> {
        let (count, list, handle) = match owner {
            Owned::Module(m) => (
                self.module_function_count?,
                self.module_enumerate_functions?,
                m,
            ),
            Owned::Library(l) => (
                self.library_kernel_count?,
                self.library_enumerate_kernels?,
                l,
            ),
        };
        let mut n: c_uint = 0;
        // SAFETY: writes one count.
        if unsafe { count(&mut n, handle) } != CUDA_SUCCESS {
            return None;
        }
        let mut functions = vec![0 as Handle; n as usize];
        // SAFETY: room for the `n` handles asked for.
        if unsafe { list(functions.as_mut_ptr(), n, handle) } != CUDA_SUCCESS {
            return None;
        }
        functions
            .into_iter()
            .map(|f| self.function_name(f))
            .collect()
    }

    /// The name the driver gives a function or kernel handle, where it can.
    pub fn function_name(&self, f: Handle) -> Option<String> {
        for get in [self.func_get_name, self.kernel_get_name]
            .into_iter()
            .flatten()
        {
            let mut name: *const c_char = std::ptr::null();
            // SAFETY: writes a pointer to a string the driver owns, or fails.
            if unsafe { get(&mut name, f) } == CUDA_SUCCESS && !name.is_null() {
                // SAFETY: NUL-terminated, valid while the module is loaded.
                return Some(
                    unsafe { CStr::from_ptr(name) }
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
        None
    }
}
