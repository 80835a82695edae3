//! GPU attach in one process: the modules the application loaded, the probes tools
//! attached, the instrumented modules built from both, and the work around each launch.
//!
//! A launch of a kernel that a probe names goes to an instrumented copy of the kernel: the
//! module's PTX with the probes spliced in (`ptx`), loaded next to the original in the
//! launch's context. The application's own handles (modules, libraries, functions,
//! kernels) stay the driver's originals and keep working; detaching only stops the
//! redirection. Anything that fails on our side (no PTX, a program the GPU cannot take, a
//! module the driver refuses, no device memory) leaves that kernel uninstrumented, with
//! one line saying which and why.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::{c_int, CStr, CString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use bpftime_isa::Insn;
use bpftime_jit_ptx::{compile, PtxOptions};
use bpftime_runtime::Map;

use crate::error::GpuAttachError;
use crate::launch::{
    EventClock, Geometry, LaunchContext, LaunchProbe, PHASE_COMPLETED, PHASE_LAUNCHED,
};
use crate::scan::FatbinIndex;
use bpftime_gpu_device::arena::Arena;
use bpftime_gpu_device::clock::{self, ClockCalibration};
use bpftime_gpu_device::cuda::{
    self, Api, CuResult, DevicePtr, Handle, Owned, ATTR_MULTIPROCESSOR_COUNT, CUDA_ERROR_NOT_READY,
    CUDA_SUCCESS, EVENT_DEFAULT, EVENT_DISABLE_TIMING, STREAM_NON_BLOCKING,
};
use bpftime_gpu_device::device_maps::{DeviceKind, RuntimeConfig, ShardEntry};
use bpftime_gpu_device::exiting::may_log;
use bpftime_gpu_device::replica::{
    DeviceDelta, HashOpsLaunch, Mover, Replica, RingReader, ShardWindow,
};
use bpftime_gpu_device::sync_kernels::{
    APPLY_DELTAS_PTX, DELTAS_PER_LAUNCH, FOLD_ENTRIES, FOLD_SHARDS_PTX, FOLD_THREADS,
};
use bpftime_gpu_probe::{DeviceMapRef, ProbeCache, ProbeCompiler};
use bpftime_gpu_ptx::fatbin::{FatbinError, ModulePtx};
use bpftime_gpu_ptx::inline::InlineBody;
use bpftime_gpu_ptx::names;
use bpftime_gpu_ptx::ptx::{strip_header, ProbeCall, ProbePoint, PtxModule, Splice, Version};

mod build;
mod launch_path;
mod map_sync;
mod registry;
mod timing;

/// What kind of handle an image was loaded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Module,
    Library,
}

/// A program a tool attached to CUDA kernels.
pub struct GpuProbe {
    /// The store link that attached it.
    pub link_id: u32,
    pub name: String,
    /// Verified under the GPU rules; `lddw` map references carry store map ids.
    pub insns: Vec<Insn>,
    /// The maps those ids name.
    pub maps: Vec<Arc<Map>>,
    pub point: ProbePoint,
    /// The kernels it probes: a mangled or demangled name, with globs.
    pub pattern: String,
}

/// Bytes of each context's trace ring (`bpf_trace_printk` lines on their way out).
const TRACE_RING_BYTES: u64 = 1 << 20;

/// `CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES` and `CU_FUNC_ATTRIBUTE_NUM_REGS`.
const FUNC_LOCAL_SIZE_BYTES: c_int = 3;
const FUNC_NUM_REGS: c_int = 4;
/// Registers a thread at or below which an SM holds its most warps: 64 warps of 32
/// threads with 32 registers each fill its 65536 (every GPU since Volta).
const FULL_OCCUPANCY_REGS: c_int = 32;
/// Registers go to warps in units of 256: 8 a thread.
const REGISTER_UNIT: c_int = 8;
/// How often the sync thread looks for completed launches, while some are awaited and
/// while none is.
const AWAITED_POLL: Duration = Duration::from_micros(100);
const IDLE_POLL: Duration = Duration::from_millis(1);
/// How long records held for a full ring wait at exit for their consumer to make room,
/// counted from the last room it made.
const HELD_PATIENCE: Duration = Duration::from_secs(1);
/// How often rings are drained while kernels run, and clocks re-anchored.
const DRAIN_EVERY: Duration = Duration::from_millis(5);
const REANCHOR_EVERY: Duration = Duration::from_secs(1);
/// Launches whose GPU times are awaited at most; beyond, launches get only their first run
/// (counted, and said once) until the GPU catches up.
const TIMINGS_IN_FLIGHT: usize = 1 << 16;

struct Image {
    ptx: Result<ModulePtx, GpuAttachError>,
    /// The module or library the application loaded it as: where its own variables are.
    owner: (Owner, Handle),
}

struct FunctionInfo {
    /// The image its module or library was loaded from; `None` for a function whose PTX is
    /// unknown.
    image: Option<u64>,
    name: Arc<str>,
    origin: Origin,
}

/// How GPU attach came to know a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Looked up in a module or library whose load it saw.
    Seen,
    /// Of a module loaded before GPU attach started, its PTX found in a mapped object
    /// (`scan`).
    Found,
    /// Of a module loaded before GPU attach started, its PTX not looked for or not found,
    /// as of the probes' generation given: a later probe may name it.
    Unseen(u64),
}

/// A module of the application, instrumented for one context and one set of probes.
struct Patched {
    generation: u64,
    /// The context it is loaded in; `None` when nothing in it is instrumented.
    context: Option<Arc<Context>>,
    /// Kernel name → instrumented function; kernels not probed are absent.
    functions: HashMap<Arc<str>, Handle>,
    replicas: Vec<Arc<Replica>>,
    /// The module's variables, which its instrumented kernels read and write in the
    /// application's module.
    variables: Arc<[SharedVariable]>,
    /// Whether its probes run at tensor copies: the context's table of tensor maps is
    /// brought up to date before its launches.
    tensor_copies: bool,
}

/// A variable of the application's module (`__constant__`, `__device__`) and its twin in
/// the instrumented module. The instrumented module is a module of its own, with its own
/// variables: each instrumented launch gets the application's values copied in before it,
/// in its stream, and what it may have written copied back after it, so that the host's
/// `cudaMemcpyToSymbol` and `cudaMemcpyFromSymbol`, and the application's own kernels, see
/// one variable. Kernels running at the same time in other streams that write the same
/// variable would not see each other's writes while an instrumented one runs.
#[derive(Debug, Clone, Copy)]
struct SharedVariable {
    original: DevicePtr,
    copy: DevicePtr,
    bytes: usize,
    /// `__device__`: kernels may write it, so it goes back after each launch.
    writable: bool,
}

/// The most bytes of module variables copied around each instrumented launch; a module
/// with more is not instrumented.
const SHARED_VARIABLES_MAX: usize = 64 << 20;

impl Patched {
    /// The instrumented function standing for kernel `name`, and its context.
    fn instrumented(&self, name: &str) -> Option<(Handle, Arc<Context>)> {
        Some((*self.functions.get(name)?, self.context.clone()?))
    }
}

/// A kernel's register cap for the second build, and what it took without one.
struct RegisterCap {
    kernel: String,
    cap: c_int,
    /// Registers a thread and bytes of local memory.
    before: (c_int, c_int),
}

/// What an instrumented module is made from, besides its context: [`Session::patched_from`]
/// makes a [`Patched`] of it once loaded, and a second build with fewer registers for its
/// kernels whose probes call out of line (`caps`, see [`Session::register_caps`]) is made
/// from it too.
struct BuildInputs {
    caps: Vec<RegisterCap>,
    /// The instrumented PTX.
    spliced: String,
    image: Arc<Image>,
    /// The application's module, parsed.
    module: PtxModule,
    /// The kernels instrumented.
    kernels: Vec<String>,
    clock_globals: Vec<String>,
    replicas: Vec<Arc<Replica>>,
    generation: u64,
    /// The kernel whose launch asked for the build (for notices).
    kernel: String,
}

/// What one context holds for us.
struct Context {
    ctx: Handle,
    device: i32,
    /// The device's name, as the driver says it.
    device_name: String,
    sm: u32,
    stream: Handle,
    /// Where our device memory goes (`None`: `cuMemAlloc`, where the driver lacks the
    /// virtual memory calls).
    arena: Option<Arena>,
    /// Device address of the process's pid and tgid, as `bpf_get_current_pid_tgid` gives.
    pid_tgid_at: DevicePtr,
    replicas: Mutex<HashMap<u32, Arc<Replica>>>,
    /// Device address of the trace ring (`bpf_trace_printk` lines), and its reader.
    trace_ring: DevicePtr,
    trace: Mutex<RingReader>,
    /// The kernel that applies the CPU's changes (`APPLY_DELTAS_PTX`).
    apply_deltas: Handle,
    /// The kernel that folds per-SM copies into sharded arrays (`FOLD_SHARDS_PTX`).
    fold_shards: Handle,
    /// The kernel that makes the CPU's changes to per-CPU hash maps (`HASH_OPS_PTX`).
    hash_ops: Handle,
    /// The device's SM count: values of a per-CPU map.
    sm_count: u32,
    /// Where small arrays' values and their per-SM copies go.
    shard_window: ShardWindow,
    clock: Mutex<ContextClock>,
    events: Mutex<Vec<Handle>>,
    /// Timing events (launch events' start and end), ready for reuse.
    timing_events: Mutex<Vec<Handle>>,
    event_clock: Mutex<Option<EventClock>>,
    tensor_maps: Mutex<TensorMapTable>,
}

/// A context's copy of the process's tensor maps (`tensor_maps::table`), made when a
/// module probing tensor copies is first loaded there.
#[derive(Default)]
struct TensorMapTable {
    /// Its device address; 0 before it is made.
    at: DevicePtr,
    /// The table's generation it holds.
    generation: Option<u64>,
}

#[derive(Default)]
struct ContextClock {
    calibration: Option<ClockCalibration>,
    /// The `ktime_get_ns` offsets of loaded probes.
    globals: Vec<DevicePtr>,
    /// Kept calibrated without any offset to write: a timeline places the context's
    /// trace lines by it.
    wanted: bool,
    timer: Option<(Handle, DevicePtr)>,
}

#[derive(Default)]
struct State {
    images: HashMap<u64, Arc<Image>>,
    next_image: u64,
    owners: HashMap<Handle, u64>,
    functions: HashMap<Handle, FunctionInfo>,
    probes: BTreeMap<u32, Arc<GpuProbe>>,
    generation: u64,
    contexts: HashMap<Handle, Arc<Context>>,
    patched: HashMap<(Handle, u64), Arc<Patched>>,
}

/// A launch in flight: the function to launch and what to do once it is queued.
pub(crate) struct Launch {
    pub function: Handle,
    stream: Handle,
    work: Option<(Arc<Context>, Vec<Arc<Replica>>)>,
    /// The module variables to copy back after the launch.
    variables: Arc<[SharedVariable]>,
    /// Into a stream being captured into a CUDA graph: nothing runs now; the graph's
    /// launches bring the maps back (see [`Session::after_graph_launch`]).
    captured: bool,
}

impl Launch {
    /// The application's own function, nothing of ours around it.
    fn plain(function: Handle, stream: Handle) -> Launch {
        Launch {
            function,
            stream,
            work: None,
            variables: Arc::new([]),
            captured: false,
        }
    }

    /// `instrumented`, standing for a kernel of `patched`, with its maps brought back and
    /// its module's variables copied back after it.
    fn instrumented(
        instrumented: Handle,
        stream: Handle,
        context: Arc<Context>,
        patched: &Patched,
        captured: bool,
    ) -> Launch {
        Launch {
            function: instrumented,
            stream,
            work: Some((context, patched.replicas.clone())),
            variables: patched.variables.clone(),
            captured,
        }
    }
}

struct Completion {
    context: Arc<Context>,
    event: Handle,
    replicas: Vec<Arc<Replica>>,
}

/// The launch programs attached, and a count that moves at each change.
#[derive(Default)]
struct LaunchProbes {
    generation: u64,
    probes: BTreeMap<u32, Arc<LaunchProbe>>,
}

/// The launch programs watching one kernel.
type Watchers = Arc<[Arc<LaunchProbe>]>;

/// The launch programs watching one function, for the generation they were found in.
struct LaunchMatch {
    generation: u64,
    name: Arc<str>,
    probes: Watchers,
}

/// A launch that launch programs watch, between the call and its first run.
pub(crate) struct Observed {
    context: Arc<Context>,
    probes: Watchers,
    /// The kernel's whole name (the context carries it cut).
    kernel: Arc<str>,
    info: LaunchContext,
    /// Start and end timing events; `None` when the launch is not timed (a stream being
    /// captured into a graph).
    events: Option<(Handle, Handle)>,
    /// The host time once the start event was recorded, just before the launch call.
    submitted_ns: u64,
}

/// A launch whose GPU times are awaited.
struct Timing {
    context: Arc<Context>,
    probes: Watchers,
    kernel: Arc<str>,
    info: LaunchContext,
    start: Handle,
    end: Handle,
    /// No kernel starts before its launch call: on an idle GPU the start event completes
    /// as soon as it is recorded, before the launch reaches the GPU, and the time between
    /// is not the kernel's.
    submitted_ns: u64,
}

/// A kernel node of a CUDA graph between two event-record nodes of ours, whose events
/// time it: a graph's launch is one call for many kernels, and its kernel nodes get their
/// launch events and GPU times from these.
#[derive(Debug, Clone, Copy)]
struct TimedNode {
    kernel_node: Handle,
    function: Handle,
    geometry: Geometry,
    start_node: Handle,
    end_node: Handle,
}

/// The timed kernel nodes of one graph.
struct TimedGraph {
    nodes: Vec<TimedNode>,
    /// What every event-record node of ours records when its kernel is not being timed:
    /// never a launch's timing event, so a replay never writes into one in use.
    idle_event: Handle,
}

/// A graph launch's timed kernel nodes, between the launch call's start and its end.
pub(crate) struct GraphObserved {
    context: Arc<Context>,
    nodes: Vec<ObservedNode>,
    submitted_ns: u64,
}

struct ObservedNode {
    probes: Watchers,
    kernel: Arc<str>,
    info: LaunchContext,
    events: Option<(Handle, Handle)>,
}

/// GPU attach for this process.
pub struct GpuAttach {
    api: Api,
    state: RwLock<State>,
    /// Held while an instrumented module is built, so each is built once.
    build: Mutex<()>,
    /// Held while a context's resources are made, so each is made once.
    making_context: Mutex<()>,
    active: AtomicBool,
    /// Launches recorded and not yet synced, oldest first.
    pending: Mutex<VecDeque<Completion>>,
    /// Held through each sync pass (completions, timings, rings), so that the exit-time
    /// flush waits for a pass the worker is in the middle of: what the worker took off
    /// the queues is then in the store before the process goes.
    syncing: Mutex<()>,
    /// Held through each clock re-anchor, which the exit-time flush waits for.
    anchoring: Mutex<()>,
    pid_tgid: u64,
    driver_version: i32,
    /// Compiles probes, answering from what this run or an earlier one compiled.
    compiler: ProbeCompiler,
    /// Notices already given, so each is given once.
    noticed: Mutex<HashSet<String>>,
    /// Links whose probe named a kernel this process launched.
    matched: Mutex<HashSet<u32>>,
    launch: RwLock<LaunchProbes>,
    launch_active: AtomicBool,
    launch_matches: Mutex<HashMap<Handle, LaunchMatch>>,
    next_launch_id: AtomicU64,
    /// Launches whose GPU times are awaited, oldest first.
    timings: Mutex<VecDeque<Timing>>,
    /// Instrumented kernels captured into CUDA graphs: their context and maps, brought
    /// back after each graph launch.
    graph_work: Mutex<Vec<GraphWork>>,
    /// Graphs whose watched kernel nodes have event-record nodes of ours around them, and
    /// the executable graphs instantiated from them.
    timed_graphs: Mutex<HashMap<Handle, Arc<TimedGraph>>>,
    timed_execs: Mutex<HashMap<Handle, Arc<TimedGraph>>>,
    /// Application functions swapped for instrumented ones and loaded already.
    originals_loaded: Mutex<HashSet<Handle>>,
    /// Stream captures the application has running. While any runs, GPU attach's own
    /// CUDA work (module loads, copies, allocations) waits: done beside a capture it
    /// invalidates the capture or crashes the driver.
    captures: AtomicUsize,
    /// Held shared by GPU attach's CUDA work, exclusively by a capture's start, so that
    /// a capture never starts while that work runs.
    cuda_work: RwLock<()>,
    /// The sync thread, woken when a launch is queued for it while it idles.
    worker: OnceLock<std::thread::Thread>,
    /// Launches that went untimed because too many were awaited.
    untimed: AtomicU64,
    /// Fatbins of the process's objects, for kernels of modules loaded before GPU attach
    /// started.
    discovery: Mutex<Discovery>,
}

/// What the scans for kernels of modules loaded before GPU attach started know.
#[derive(Default)]
struct Discovery {
    /// One per device architecture.
    indexes: HashMap<u32, FatbinIndex>,
    /// Kernels looked for and not found (per architecture), and why.
    missing: HashMap<(u32, Arc<str>), GpuAttachError>,
}

static SESSION: OnceLock<GpuAttach> = OnceLock::new();

pub(crate) fn session() -> Option<&'static GpuAttach> {
    SESSION.get()
}

/// Why GPU attach could not start.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{0} is not loaded in this process: nothing to attach to")]
    NotLoaded(&'static str),
    #[error("the CUDA driver lacks what GPU attach needs: {0}")]
    Driver(String),
}

/// The session, if GPU attach has started in this process (never starts it).
pub fn installed() -> Option<&'static GpuAttach> {
    SESSION.get()
}

/// Whether this process has loaded the CUDA driver.
pub fn cuda_loaded() -> bool {
    cuda::loaded_libcuda().is_some()
}

/// Starts the session over the driver's entry points `api` (the detoured ones already
/// replaced by their originals, so that our own calls never come back through our
/// replacements), with its worker and clock threads. Called once, by
/// [`install`](crate::install), which holds its lock.
pub(crate) fn start(api: Api, driver_version: i32) -> Result<&'static GpuAttach, InstallError> {
    if let Some(s) = SESSION.get() {
        return Ok(s);
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u64;
    let s = SESSION.get_or_init(|| GpuAttach {
        api,
        state: RwLock::new(State::default()),
        build: Mutex::new(()),
        making_context: Mutex::new(()),
        active: AtomicBool::new(false),
        pending: Mutex::new(VecDeque::new()),
        syncing: Mutex::new(()),
        anchoring: Mutex::new(()),
        pid_tgid: (pid << 32) | pid,
        driver_version,
        compiler: ProbeCompiler::new(ProbeCache::for_user()),
        noticed: Mutex::new(HashSet::new()),
        matched: Mutex::new(HashSet::new()),
        launch: RwLock::new(LaunchProbes::default()),
        launch_active: AtomicBool::new(false),
        launch_matches: Mutex::new(HashMap::new()),
        next_launch_id: AtomicU64::new(1),
        timings: Mutex::new(VecDeque::new()),
        graph_work: Mutex::new(Vec::new()),
        timed_graphs: Mutex::new(HashMap::new()),
        timed_execs: Mutex::new(HashMap::new()),
        originals_loaded: Mutex::new(HashSet::new()),
        captures: AtomicUsize::new(0),
        cuda_work: RwLock::new(()),
        untimed: AtomicU64::new(0),
        worker: OnceLock::new(),
        discovery: Mutex::new(Discovery::default()),
    });
    let worker = std::thread::Builder::new()
        .name("bpftime-gpu".into())
        .spawn(move || {
            bpftime_attach::never_run_handlers_on_this_thread();
            // Our threads' copies and allocations must neither fail nor invalidate an
            // application's capture in global mode on another thread.
            let _capture = s.api.relaxed_capture();
            s.worker()
        })
        .map_err(|e| InstallError::Driver(format!("cannot start the GPU sync thread: {e}")))?;
    let _ = s.worker.set(worker.thread().clone());
    std::thread::Builder::new()
        .name("bpftime-gpu-clock".into())
        .spawn(move || {
            bpftime_attach::never_run_handlers_on_this_thread();
            let _capture = s.api.relaxed_capture();
            s.clock_keeper()
        })
        .map_err(|e| InstallError::Driver(format!("cannot start the GPU clock thread: {e}")))?;
    Ok(s)
}

/// An instrumented kernel's context and maps, captured into a CUDA graph.
type GraphWork = (Arc<Context>, Vec<Arc<Replica>>);

/// Whether two lists hold the same replicas, in order.
fn same_replicas(a: &[Arc<Replica>], b: &[Arc<Replica>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

extern "C" fn flush_at_exit() {
    // Registered more than once (see `flush_at_exit_once`): the first call does the work.
    if !bpftime_gpu_device::exiting::mark() {
        return;
    }
    if let Some(s) = SESSION.get() {
        // Our threads' CUDA work under way (an instrumented module built ahead of a launch
        // that never came, say) ends before the CUDA runtime tears the driver down after
        // us: driver calls racing that teardown fail, or crash the process as it exits,
        // losing what it had not flushed. None starts from now on (`quiet`).
        drop(s.cuda_work.write().unwrap_or_else(|e| e.into_inner()));
        // A panic must not cross into the C runtime's exit.
        let _ = std::panic::catch_unwind(|| {
            s.flush();
            s.report_unmatched();
        });
    }
    let _ = std::panic::catch_unwind(run_exit_hooks);
}

type ExitHook = Box<dyn FnOnce() + Send>;

static EXIT_HOOKS: Mutex<Vec<ExitHook>> = Mutex::new(Vec::new());

/// Runs `hook` at exit once everything the GPU had is in: right after the exit-time flush,
/// or, in a process that made no watched launch (no flush), among the last exit handlers.
/// A hook must not call CUDA, which may be torn down by the time the second case runs.
pub fn after_exit_flush(hook: impl FnOnce() + Send + 'static) {
    EXIT_HOOKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Box::new(hook));
    extern "C" fn last_chance() {
        let _ = std::panic::catch_unwind(run_exit_hooks);
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a plain function.
    ONCE.call_once(|| unsafe {
        libc::atexit(last_chance);
    });
}

fn run_exit_hooks() {
    let hooks = std::mem::take(&mut *EXIT_HOOKS.lock().unwrap_or_else(|e| e.into_inner()));
    for hook in hooks {
        hook();
    }
}

/// How many objects the loader had loaded when the exit-time flush was last registered
/// (`u64::MAX` before the first time).
static FLUSH_REGISTERED_AT: AtomicU64 = AtomicU64::new(u64::MAX);

/// Registers the exit-time flush, at the first launch while probes are attached: by then the CUDA
/// runtime has registered its own teardown, and exit handlers run last-registered first,
/// so the flush runs while the driver is still up. One atomic load after the first call:
/// launches call it.
fn flush_at_exit_once() {
    if FLUSH_REGISTERED_AT.load(Ordering::Acquire) == u64::MAX {
        flush_at_exit_after_loads();
    }
}

/// [`flush_at_exit_once`], and again once the dynamic loader has loaded more objects
/// since; called after our own module loads. The driver loads its PTX compiler
/// (`libnvidia-ptxjitcompiler`) at the first JIT compilation, often ours, and that
/// library's static destructors, registered then, run at exit before any handler
/// registered earlier. A second build of ours still compiling while the application
/// exited then ran on a torn-down compiler (the suspect of `realloc(): invalid pointer`
/// and SIGABRT inside the JIT, or SIGSEGV, in memtrace on the tiled matmul on a fresh
/// machine). Registered after it, the flush runs first and waits for our builds.
fn flush_at_exit_after_loads() {
    let loads = objects_loaded();
    if FLUSH_REGISTERED_AT.swap(loads, Ordering::AcqRel) != loads {
        // SAFETY: registers a plain function, which runs its work once.
        unsafe { libc::atexit(flush_at_exit) };
    }
}

/// How many objects the dynamic loader has loaded in this process so far.
fn objects_loaded() -> u64 {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _: libc::size_t,
        out: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid entry; `out` is the u64 below.
        unsafe { *out.cast::<u64>() = (*info).dlpi_adds };
        1
    }
    let mut adds: u64 = 0;
    // SAFETY: the callback writes one u64 through the pointer it is given, then stops.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut adds as *mut u64).cast()) };
    adds
}

impl GpuAttach {
    /// Attaches `probe`; kernels it names are instrumented from their next launch.
    pub fn add_probe(&self, probe: GpuProbe) {
        let mut st = self.write();
        st.probes.insert(probe.link_id, Arc::new(probe));
        st.generation += 1;
        self.active.store(true, Ordering::Release);
    }

    /// Attaches a launch program; launches of kernels it names run it from now on.
    pub fn add_launch_probe(&self, probe: LaunchProbe) {
        let mut l = self.launch.write().unwrap_or_else(|e| e.into_inner());
        l.probes.insert(probe.link_id, Arc::new(probe));
        l.generation += 1;
        self.launch_active.store(true, Ordering::Release);
    }

    /// Detaches the probe of `link_id` (a device or a launch probe); later launches run
    /// without it (the original kernel once no device probe is left). A launch already
    /// made still gets its completion run.
    pub fn remove_probe(&self, link_id: u32) {
        let mut st = self.write();
        if st.probes.remove(&link_id).is_some() {
            st.generation += 1;
        }
        self.active.store(!st.probes.is_empty(), Ordering::Release);
        drop(st);
        let mut l = self.launch.write().unwrap_or_else(|e| e.into_inner());
        if l.probes.remove(&link_id).is_some() {
            l.generation += 1;
        }
        self.launch_active
            .store(!l.probes.is_empty(), Ordering::Release);
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// A device GPU attach worked on.
#[derive(Debug, Clone)]
pub struct GpuDevice {
    pub ordinal: i32,
    /// As the driver names it (`NVIDIA H100 80GB HBM3`); empty if it would not say.
    pub name: String,
    /// Its global timer against `CLOCK_MONOTONIC`, with the error bound.
    pub calibration: Option<ClockCalibration>,
}

/// Bytes in front of a trace record's text (device/runtime.c's `TRACE_HEAD`): three
/// arguments, the global timer, the SM and the block's linear index, the grid's launch
/// number.
const TRACE_HEAD: usize = 48;

/// A trace record as the device runtime wrote it.
#[derive(Debug, PartialEq, Eq)]
struct TraceLine {
    text: String,
    /// `%globaltimer` when it was written.
    timer: u64,
    sm: u32,
    block: u32,
    /// `%gridid`: the launch's number in its context, in the order launches were submitted.
    grid: u64,
}

impl TraceLine {
    /// The record's line (a format filled with its arguments, or raw text), or `None`
    /// for a record too short to be one.
    fn parse(data: &[u8], raw: bool) -> Option<TraceLine> {
        if data.len() < TRACE_HEAD {
            return None;
        }
        let word = |i: usize| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().expect("8"));
        let half = |at: usize| u32::from_le_bytes(data[at..at + 4].try_into().expect("4"));
        let text = &data[TRACE_HEAD..];
        let text = &text[..text.iter().position(|&b| b == 0).unwrap_or(text.len())];
        let text = if raw {
            String::from_utf8_lossy(text).into_owned()
        } else {
            bpftime_runtime::helpers::format_printk(text, &[word(0), word(1), word(2)])
        };
        Some(TraceLine {
            text,
            timer: word(3),
            sm: half(32),
            block: half(36),
            grid: word(5),
        })
    }
}

/// What a probe is compiled with in one context.
struct ProbeInputs {
    maps: HashMap<u32, DeviceMapRef>,
    config: RuntimeConfig,
    replicas: Vec<Arc<Replica>>,
}

/// A probe compiled for one context.
struct CompiledProbe {
    ptx: String,
    /// Its `ktime_get_ns` offset global, if it reads the clock.
    clock_offset: Option<String>,
    replicas: Vec<Arc<Replica>>,
}

/// Runs each launch program on its own copy of the launch's context.
fn run_watchers(probes: &Watchers, kernel: &str, info: LaunchContext) {
    for p in probes.iter() {
        let mut ctx = info;
        (p.run)(&mut ctx, kernel);
    }
}

/// The PTX name of a module's `index`-th probe.
pub(crate) fn probe_symbol(index: u32) -> String {
    format!("__bpftime_probe_{index}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exit-time flush is registered again once a library came in after it (the
    /// driver's JIT, say): the loader's count of loaded objects says so.
    #[test]
    fn the_loaded_object_count_grows_with_a_library_loaded() {
        // A small glibc library this process has not loaded yet.
        let candidates = [c"libresolv.so.2", c"libanl.so.1", c"libutil.so.1"];
        let fresh = candidates.iter().find(|name| {
            // SAFETY: RTLD_NOLOAD only looks the name up among loaded objects.
            unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) }.is_null()
        });
        let fresh = fresh.expect("one of glibc's small libraries is not loaded yet");
        let before = objects_loaded();
        assert!(before > 0, "the test binary and libc are loaded");
        // SAFETY: a glibc library with no initializers that matter here; kept loaded.
        let handle = unsafe { libc::dlopen(fresh.as_ptr(), libc::RTLD_NOW) };
        assert!(!handle.is_null(), "{fresh:?} is part of glibc");
        assert!(objects_loaded() > before);
    }

    #[test]
    fn trace_records_carry_their_gpu_time_and_place() {
        let mut data = Vec::new();
        for w in [7u64, 0, 0, 123_456_789] {
            data.extend_from_slice(&w.to_le_bytes());
        }
        data.extend_from_slice(&5u32.to_le_bytes());
        data.extend_from_slice(&42u32.to_le_bytes());
        data.extend_from_slice(&9u64.to_le_bytes());
        data.extend_from_slice(b"n=%d\0junk");
        let line = TraceLine::parse(&data, false).unwrap();
        assert_eq!(
            line,
            TraceLine {
                text: "n=7".into(),
                timer: 123_456_789,
                sm: 5,
                block: 42,
                grid: 9
            }
        );
        assert_eq!(TraceLine::parse(&data, true).unwrap().text, "n=%d");
        assert_eq!(TraceLine::parse(&data[..TRACE_HEAD - 1], false), None);
    }
}
