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

use crate::arena::Arena;
use crate::clock::{self, ClockCalibration};
use crate::cuda::{
    self, Api, CuResult, DevicePtr, Handle, Owned, ATTR_MULTIPROCESSOR_COUNT, CUDA_ERROR_NOT_READY,
    CUDA_SUCCESS, EVENT_DEFAULT, EVENT_DISABLE_TIMING, STREAM_NON_BLOCKING,
};
use crate::device_maps::{DeviceKind, RuntimeConfig, ShardEntry};
use crate::launch::{
    EventClock, Geometry, LaunchContext, LaunchProbe, PHASE_COMPLETED, PHASE_LAUNCHED,
};
use crate::probe::{DeviceMapRef, ProbeCache, ProbeCompiler};
use crate::replica::{DeviceDelta, HashOpsLaunch, Mover, Replica, RingReader, ShardWindow};
use crate::scan::FatbinIndex;
use bpftime_gpu_ptx::fatbin::{FatbinError, ModulePtx};
use bpftime_gpu_ptx::inline::InlineBody;
use bpftime_gpu_ptx::names;
use bpftime_gpu_ptx::ptx::{strip_header, ProbeCall, ProbePoint, PtxModule, Splice, Version};

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

/// The kernel that makes the CPU's changes to array values on the device, in a launch's
/// stream order, as additions (`replica::DeviceDelta`): up to [`DELTAS_PER_LAUNCH`]
/// (address, value) pairs in its parameters, one thread each. Bit 0 of an address marks
/// a 4-byte word.
const APPLY_DELTAS_PTX: &str = "
.version 7.0
.target sm_70
.address_size 64

.visible .entry __bpftime_apply_deltas(
\t.param .align 8 .b8 __bt_list[1024],
\t.param .u32 __bt_count
)
{
\t.reg .pred %p<3>;
\t.reg .b32 %r<4>;
\t.reg .b64 %rd<8>;

\tmov.u32 %r1, %tid.x;
\tld.param.u32 %r2, [__bt_count];
\tsetp.ge.u32 %p1, %r1, %r2;
\t@%p1 bra DONE;
\tmov.u64 %rd1, __bt_list;
\tmul.wide.u32 %rd2, %r1, 16;
\tadd.u64 %rd3, %rd1, %rd2;
\tld.param.u64 %rd4, [%rd3];
\tld.param.u64 %rd5, [%rd3+8];
\tand.b64 %rd6, %rd4, 1;
\tsetp.ne.u64 %p2, %rd6, 0;
\t@%p2 bra WORD32;
\tred.add.u64 [%rd4], %rd5;
\tbra DONE;
WORD32:
\txor.b64 %rd4, %rd4, 1;
\tcvt.u32.u64 %r3, %rd5;
\tred.add.u32 [%rd4], %r3;
DONE:
\tret;
}
";
const DELTAS_PER_LAUNCH: usize = 64;

/// The kernel that folds sharded arrays' per-SM copies into them (runtime.c's `struct
/// shard_entry`), queued in a launch's stream after each instrumented kernel whose probes
/// use one: one launch for up to [`FOLD_ENTRIES`] arrays (a kernel launch in the
/// application's stream costs microseconds of its time, and memtrace alone has seven
/// arrays), their entries in its parameters (base, len, shards64, shards32, stride,
/// copies: 48 bytes each). The grid's `y` is the copy (the SM), its `x` the 8-byte words
/// of every array's 8-byte copies then of its 4-byte copies, so a thread finds its word
/// without a division; a word that is not zero is taken (exchanged with 0) and added to
/// the array, a 4-byte copy's word as its two halves. It runs inside the application's
/// timing of its kernel, and most words are zero: a thread reads 8 bytes of either kind,
/// and the copies at or past `%nsmid`, which no SM writes (copies are a power of two of
/// them: 256 for an H200's 132 SMs), are not read (memtrace on vectorAdd: 2.06x to 2.02x
/// against the kernel with a division per thread and every copy read).
const FOLD_SHARDS_PTX: &str = "
.version 7.0
.target sm_70
.address_size 64

.visible .entry __bpftime_fold_shards(
\t.param .align 8 .b8 __bt_entries[768],
\t.param .u32 __bt_count
)
{
\t.reg .pred %p<8>;
\t.reg .b32 %r<12>;
\t.reg .b64 %rd<24>;

\tmov.u32 %r1, %ctaid.x;
\tmov.u32 %r2, %ntid.x;
\tmov.u32 %r3, %tid.x;
\tmad.lo.u32 %r1, %r1, %r2, %r3;
\tcvt.u64.u32 %rd1, %r1;
\tmov.u32 %r8, %ctaid.y;
\tmov.u32 %r7, %nsmid;
\tsetp.ge.u32 %p7, %r8, %r7;
\t@%p7 bra DONE;
\tcvt.u64.u32 %rd2, %r8;
\tld.param.u32 %r4, [__bt_count];
\tmov.u32 %r5, 0;
\tmov.u64 %rd20, __bt_entries;
NEXT:
\tsetp.ge.u32 %p1, %r5, %r4;
\t@%p1 bra DONE;
\tld.param.u64 %rd4, [%rd20+8];
\tshr.u64 %rd9, %rd4, 3;
\tsetp.lt.u64 %p2, %rd1, %rd9;
\t@%p2 bra WORD64;
\tsub.u64 %rd1, %rd1, %rd9;
\tsetp.lt.u64 %p3, %rd1, %rd9;
\t@%p3 bra PAIR32;
\tsub.u64 %rd1, %rd1, %rd9;
\tadd.u32 %r5, %r5, 1;
\tadd.u64 %rd20, %rd20, 48;
\tbra NEXT;
WORD64:
\tsetp.ne.u32 %p3, %r5, %r5;
\tld.param.u64 %rd5, [%rd20+16];
\tbra FOUND;
PAIR32:
\tld.param.u64 %rd5, [%rd20+24];
FOUND:
\tld.param.u32 %r6, [%rd20+40];
\tsetp.ge.u32 %p4, %r8, %r6;
\t@%p4 bra DONE;
\tld.param.u64 %rd3, [%rd20];
\tld.param.u64 %rd7, [%rd20+32];
\tshl.b64 %rd14, %rd1, 3;
\tmad.lo.u64 %rd15, %rd2, %rd7, %rd5;
\tadd.u64 %rd15, %rd15, %rd14;
\tadd.u64 %rd18, %rd3, %rd14;
\tld.volatile.global.u64 %rd16, [%rd15];
\tsetp.eq.u64 %p4, %rd16, 0;
\t@%p4 bra DONE;
\t@%p3 bra SPLIT;
\tmov.u64 %rd17, 0;
\tatom.global.exch.b64 %rd16, [%rd15], %rd17;
\tred.global.add.u64 [%rd18], %rd16;
\tbra DONE;
SPLIT:
\tmov.b64 {%r9, %r10}, %rd16;
\tmov.u32 %r11, 0;
\tsetp.eq.u32 %p5, %r9, 0;
\t@%p5 bra HIGH;
\tatom.global.exch.b32 %r9, [%rd15], %r11;
\tred.global.add.u32 [%rd18], %r9;
HIGH:
\tsetp.eq.u32 %p6, %r10, 0;
\t@%p6 bra DONE;
\tatom.global.exch.b32 %r10, [%rd15+4], %r11;
\tred.global.add.u32 [%rd18+4], %r10;
DONE:
\tret;
}
";
/// Arrays one fold launch takes (its 768-byte parameter list).
const FOLD_ENTRIES: usize = 16;
/// Threads per block of the fold kernel.
const FOLD_THREADS: u32 = 256;

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
    ptx: Result<ModulePtx, String>,
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
    missing: HashMap<(u32, Arc<str>), String>,
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

/// Starts GPU attach in this process: resolves the loaded driver and intercepts it. Call
/// once libcuda is loaded (never loads it); later calls return the same session.
pub fn install() -> Result<&'static GpuAttach, InstallError> {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _once = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = SESSION.get() {
        return Ok(s);
    }
    let lib = cuda::loaded_libcuda().ok_or(InstallError::NotLoaded(cuda::LIBCUDA))?;
    let mut api = cuda::api_from(lib).map_err(InstallError::Driver)?;
    let driver_version = api.driver_version().unwrap_or(0);
    // The replacements pass calls straight through until the session is in place, so
    // the detours go in first and our own calls then use the originals they leave.
    // SAFETY: the driver's handle and the entry points resolved from it.
    let detours = unsafe { crate::entry_points::install(lib, &api) };
    if let Some(f) = crate::entry_points::module_load_data::original() {
        api.module_load_data = f;
    }
    if let Some(f) = crate::entry_points::module_get_function::original() {
        api.module_get_function = f;
    }
    if let Some(f) = crate::entry_points::launch_kernel::original() {
        api.launch_kernel = f;
    }
    if let Some(f) = crate::entry_points::library_get_kernel::original() {
        api.library_get_kernel = f;
    }
    if let Some(f) = crate::entry_points::module_unload::original() {
        api.module_unload = f;
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
    tracing::info!(
        entry_points = detours.len(),
        driver = driver_version,
        "GPU attach: CUDA driver intercepted"
    );
    Ok(s)
}

/// An instrumented kernel's context and maps, captured into a CUDA graph.
type GraphWork = (Arc<Context>, Vec<Arc<Replica>>);

/// Whether two lists hold the same replicas, in order.
fn same_replicas(a: &[Arc<Replica>], b: &[Arc<Replica>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

/// Set once the process is exiting: thread-local state (the log formatter's among it) is
/// gone by then, so nothing is logged.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Whether logging is still possible (see [`EXITING`]).
pub(crate) fn may_log() -> bool {
    !EXITING.load(Ordering::Relaxed)
}

extern "C" fn flush_at_exit() {
    // Registered more than once (see `flush_at_exit_once`): the first call does the work.
    if EXITING.swap(true, Ordering::AcqRel) {
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

    /// The device address of module `handle`'s global `name`, if it has one.
    fn module_global(&self, handle: Handle, name: &str) -> Option<DevicePtr> {
        let name = CString::new(name).ok()?;
        let (mut ptr, mut size) = (0, 0);
        // SAFETY: writes a device pointer and a size.
        let r = unsafe { (self.api.module_get_global)(&mut ptr, &mut size, handle, name.as_ptr()) };
        (r == CUDA_SUCCESS).then_some(ptr)
    }

    /// `context`'s table of tensor maps, made if need be and brought up to the process's
    /// (the copy waits for itself, so a launch queued after sees it).
    fn tensor_map_table(&self, context: &Context) -> Result<DevicePtr, crate::cuda::CudaError> {
        let mut table = context
            .tensor_maps
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if table.generation == Some(crate::tensor_maps::generation()) {
            return Ok(table.at);
        }
        let mover = self.mover(context);
        if table.at == 0 {
            table.at = mover.alloc(crate::tensor_maps::TABLE_BYTES)?;
        }
        let (generation, bytes) = crate::tensor_maps::table();
        mover.put(table.at, &bytes)?;
        table.generation = Some(generation);
        Ok(table.at)
    }

    /// A tensor map was made whose copies memory-access probes cannot follow: said once
    /// per reason, where such probes are attached.
    pub(crate) fn tensor_map_refused(&self, why: &str) {
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

    fn notice(&self, key: &str, line: impl FnOnce() -> String) {
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
            ptx: ptx.map_err(|e| e.to_string()),
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
    fn build_ahead(&'static self, id: u64, image: Arc<Image>) {
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
        if EXITING.load(Ordering::Relaxed) {
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

    /// A function launched that GPU attach has not seen looked up: its module was loaded
    /// before GPU attach started (`bpftime attach PID`). When a probe names it, its PTX is
    /// looked for in the objects the process maps and, found, noted as its module's image,
    /// as if the load had been seen. Each outcome is remembered: a kernel is looked for
    /// once per set of probes, and each object scanned once.
    fn discover(&self, function: Handle) -> Option<(u64, Arc<str>)> {
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
                self.unseen_notice(
                    &name,
                    "the driver does not say which module it is in (cuFuncGetModule)",
                );
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
    fn unseen_notice(&self, name: &str, why: &str) {
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
    fn find_ptx(&self, name: &Arc<str>, owner: Owned) -> Result<(ModulePtx, PathBuf), String> {
        let sm = self
            .api
            .device_sm()
            .map_err(|e| format!("its device is unknown ({e})"))?;
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
            .map_err(|e| e.to_string());
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

    /// A launch into a capturing stream, whose instrumented module is ready: the graph
    /// node gets the instrumented function. Values the CPU wrote since the last launch
    /// are not pushed now (copies while a capture runs invalidate it); the next launch
    /// outside a capture pushes them.
    fn prepare_captured(
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
    fn prepare_launch(
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
    fn copy_variables_in(
        &self,
        variables: &[SharedVariable],
        stream: Handle,
    ) -> Result<(), crate::cuda::CudaError> {
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
    fn copy_variables_back(&self, variables: &[SharedVariable], stream: Handle) {
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
    fn share_variables(
        &self,
        image: &Image,
        module: &PtxModule,
        copy: Handle,
    ) -> Result<Vec<SharedVariable>, String> {
        let api = &self.api;
        let (owner, original) = image.owner;
        let mut shared = Vec::new();
        let mut total = 0usize;
        for v in module.variables.iter().filter(|v| v.used) {
            let name = CString::new(v.name.as_str()).map_err(|e| e.to_string())?;
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
                        return Err(format!(
                            "its module's variable {} cannot be found in the application's \
                             library (this driver has no cuLibraryGetGlobal)",
                            v.name
                        ))
                    }
                },
            };
            if r != CUDA_SUCCESS || theirs_bytes != ours_bytes {
                return Err(format!(
                    "its module's variable {} cannot be paired with the application's ({})",
                    v.name,
                    if r != CUDA_SUCCESS {
                        api.error_name(r)
                    } else {
                        format!("{theirs_bytes} bytes there, {ours_bytes} here")
                    }
                ));
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
            return Err(format!(
                "its module's variables hold {} MiB, which each launch would copy twice",
                total >> 20
            ));
        }
        Ok(shared)
    }

    /// Makes `deltas` on the device in `stream`'s order: after the work queued there so far,
    /// before the launch that follows.
    fn apply_deltas(
        &self,
        context: &Context,
        stream: Handle,
        deltas: &[DeviceDelta],
    ) -> Result<(), crate::cuda::CudaError> {
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
    fn make_hash_ops(
        &self,
        context: &Context,
        stream: Handle,
        mut ops: HashOpsLaunch,
    ) -> Result<(), crate::cuda::CudaError> {
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
    fn quiet(&self) -> Option<std::sync::RwLockReadGuard<'_, ()>> {
        if self.captures.load(Ordering::Acquire) != 0 || EXITING.load(Ordering::Relaxed) {
            return None;
        }
        let guard = self.cuda_work.read().unwrap_or_else(|e| e.into_inner());
        // A capture that began, or an exit that came, before the lock was ours.
        (self.captures.load(Ordering::Acquire) == 0 && !EXITING.load(Ordering::Relaxed))
            .then_some(guard)
    }

    /// [`Session::quiet`], waiting for the application's captures to end (they are
    /// short: a few launches recorded into a graph); `None` once the process exits.
    fn wait_quiet(&self) -> Option<std::sync::RwLockReadGuard<'_, ()>> {
        loop {
            if let Some(g) = self.quiet() {
                return Some(g);
            }
            if EXITING.load(Ordering::Relaxed) {
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

    fn lock_originals_loaded(&self) -> std::sync::MutexGuard<'_, HashSet<Handle>> {
        self.originals_loaded
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn lock_graph_work(&self) -> std::sync::MutexGuard<'_, Vec<GraphWork>> {
        self.graph_work.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Brings `replicas` back once the work queued on `stream` so far completes.
    fn queue_completion(&self, context: Arc<Context>, stream: Handle, replicas: Vec<Arc<Replica>>) {
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

    /// The launch programs watching `function`, with its name; `None` when none does.
    /// Cached per function and set of launch programs, since a pattern match demangles.
    fn launch_probes_for(&self, function: Handle) -> Option<(Arc<str>, Watchers)> {
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

    fn lock_timed_graphs(&self) -> std::sync::MutexGuard<'_, HashMap<Handle, Arc<TimedGraph>>> {
        self.timed_graphs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_timed_execs(&self) -> std::sync::MutexGuard<'_, HashMap<Handle, Arc<TimedGraph>>> {
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
    fn await_timing(&self, timing: Timing) {
        let mut timings = self.lock_timings();
        let was_idle = timings.is_empty();
        timings.push_back(timing);
        drop(timings);
        if was_idle {
            self.wake_worker();
        }
    }

    /// Wakes the sync thread from its idle wait: a launch is queued for it.
    fn wake_worker(&self) {
        if let Some(t) = self.worker.get() {
            t.unpark();
        }
    }

    fn lock_timings(&self) -> std::sync::MutexGuard<'_, VecDeque<Timing>> {
        self.timings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A timing event of `context` (the current context), reused or made.
    fn timing_event(&self, context: &Context) -> Option<Handle> {
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

    fn recycle_timing_events(&self, context: &Context, events: &[Handle]) {
        context
            .timing_events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(events);
    }

    /// Runs the completion of every timed launch that completed (with `wait`, of every
    /// one). A stream completes its launches in order, so a stream's first launch not yet
    /// complete stands for the rest of that stream.
    fn sync_timings(&self, wait: bool) {
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
    fn event_clock(&self, context: &Context) -> Result<EventClock, String> {
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
            return Err("no CUDA event could be made".into());
        };
        let record_and_wait = |e: Handle| -> Result<(), String> {
            // SAFETY: an event of this context, on our own stream.
            api.check("cuEventRecord", unsafe {
                (api.event_record)(e, context.stream)
            })
            .map_err(|e| e.to_string())?;
            // SAFETY: as above.
            api.check("cuEventSynchronize", unsafe { (api.event_synchronize)(e) })
                .map_err(|e| e.to_string())
        };
        let calibrated = record_and_wait(base).and_then(|()| {
            clock::calibrate(|| -> Result<u64, String> {
                record_and_wait(probe)?;
                let ms = api.elapsed_ms(base, probe).map_err(|e| e.to_string())?;
                Ok((ms.max(0.0) as f64 * 1e6).round() as u64)
            })
            .map_err(|e| e.either("no clock sample was usable".into()))
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

    fn any_probe_matches(&self, kernel: &str) -> bool {
        self.read()
            .probes
            .values()
            .any(|p| names::matches(&p.pattern, kernel))
    }

    /// The instrumented module of `image` in `ctx` for the current probes, built on first
    /// use. `None` when nothing in it is probed or it cannot be instrumented.
    /// The instrumented module of `image` in `ctx`, if built for the current probes.
    fn ready_patched(&self, ctx: Handle, image: u64) -> Option<Arc<Patched>> {
        let st = self.read();
        st.patched
            .get(&(ctx, image))
            .filter(|p| p.generation == st.generation)
            .cloned()
    }

    fn patched(&'static self, ctx: Handle, image: u64, kernel: &str) -> Option<Arc<Patched>> {
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
    fn build_patched(
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
        let mut failed: Vec<(u32, String)> = Vec::new();
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
    fn patched_from(
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
    fn register_caps(&self, splice: &Splice, handle: Handle) -> Vec<RegisterCap> {
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
    fn register_usage(&self, module: Handle, kernel: &str) -> Option<(c_int, c_int)> {
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
    fn refit_behind(
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
    fn probe_inputs(&self, context: &Context, probe: &GpuProbe) -> Result<ProbeInputs, String> {
        let mut replicas: HashMap<u32, Arc<Replica>> = HashMap::new();
        for m in &probe.maps {
            let mut all = context.replicas.lock().unwrap_or_else(|e| e.into_inner());
            let r = match all.get(&m.id()) {
                Some(r) => r.clone(),
                None => {
                    let r = Arc::new(
                        Replica::new(
                            &self.mover(context),
                            m.clone(),
                            context.sm_count,
                            &context.shard_window,
                        )
                        .map_err(|e| e.to_string())?,
                    );
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
    fn compile_probes(
        &self,
        context: &Context,
        probes: &[Arc<GpuProbe>],
        sm: u32,
    ) -> Vec<Result<CompiledProbe, String>> {
        let started = Instant::now();
        let inputs: Vec<Result<ProbeInputs, String>> = probes
            .iter()
            .map(|p| self.probe_inputs(context, p))
            .collect();
        let replicas_ms = started.elapsed().as_secs_f64() * 1e3;
        let started = Instant::now();
        let compile = |index: usize,
                       probe: &GpuProbe,
                       inputs: ProbeInputs|
         -> Result<CompiledProbe, String> {
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
                        .unwrap_or_else(|_| Err("the probe's compilation panicked".into())),
                    Ok(Err(e)) => Err(format!("no thread to compile it: {e}")),
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
    fn fold_shards(
        &self,
        context: &Context,
        stream: Handle,
        replicas: &[Arc<Replica>],
    ) -> Result<(), crate::cuda::CudaError> {
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

    /// Our state in `ctx` (the current context), made on first use.
    fn context(&self, ctx: Handle) -> Result<Arc<Context>, String> {
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
        let sm = api.device_sm().map_err(|e| e.to_string())?;
        let sms = api
            .device_attribute(ATTR_MULTIPROCESSOR_COUNT)
            .map_err(|e| e.to_string())?
            .max(1) as u32;
        let mut stream = 0;
        // SAFETY: writes one stream handle.
        api.check("cuStreamCreate", unsafe {
            (api.stream_create)(&mut stream, STREAM_NON_BLOCKING)
        })
        .map_err(|e| e.to_string())?;
        let mut device = 0;
        // SAFETY: writes one int.
        api.check("cuCtxGetDevice", unsafe {
            (api.ctx_get_device)(&mut device)
        })
        .map_err(|e| e.to_string())?;
        let arena = Arena::new(api, device)
            .map_err(|e| tracing::debug!("GPU attach's device memory from cuMemAlloc: {e}"))
            .ok();
        let mover = Mover {
            api,
            stream,
            arena: arena.as_ref(),
        };
        let pid_tgid_at = mover.alloc(8).map_err(|e| e.to_string())?;
        mover
            .put(pid_tgid_at, &self.pid_tgid.to_le_bytes())
            .map_err(|e| e.to_string())?;
        let trace = RingReader::new(&mover, TRACE_RING_BYTES, 1).map_err(|e| e.to_string())?;
        let load_kernel = |ptx: &str, name: &CStr| -> Result<Handle, String> {
            let source = CString::new(ptx).map_err(|e| e.to_string())?;
            let (mut module, mut f) = (0, 0);
            // SAFETY: NUL-terminated PTX; writes a module handle.
            api.check("cuModuleLoadData", unsafe {
                (api.module_load_data)(&mut module, source.as_ptr().cast())
            })
            .map_err(|e| e.to_string())?;
            // SAFETY: writes a function handle.
            api.check("cuModuleGetFunction", unsafe {
                (api.module_get_function)(&mut f, module, name.as_ptr())
            })
            .map_err(|e| e.to_string())?;
            Ok(f)
        };
        let apply_deltas = load_kernel(APPLY_DELTAS_PTX, c"__bpftime_apply_deltas")?;
        let fold_shards = load_kernel(FOLD_SHARDS_PTX, c"__bpftime_fold_shards")?;
        let hash_ops = load_kernel(crate::device_maps::HASH_OPS_PTX, c"__bpftime_hash_ops")?;
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
    fn calibrate(
        &self,
        context: &Context,
        clock: &mut ContextClock,
    ) -> Result<ClockCalibration, String> {
        let api = &self.api;
        let mover = self.mover(context);
        if clock.timer.is_none() {
            let prog = bpftime_isa::asm::assemble("call 502\nexit").map_err(|e| e.to_string())?;
            let program = compile(
                &prog,
                &bpftime_jit_ptx::StandardGpuEnv,
                &PtxOptions {
                    sm: context.sm.clamp(70, 90),
                    symbol: "__bpftime_timer".into(),
                    ..PtxOptions::default()
                },
            )
            .map_err(|e| e.to_string())?;
            let source = CString::new(program.ptx).map_err(|e| e.to_string())?;
            let mut module = 0;
            // SAFETY: NUL-terminated PTX; writes a module handle.
            api.check("cuModuleLoadData", unsafe {
                (api.module_load_data)(&mut module, source.as_ptr().cast())
            })
            .map_err(|e| e.to_string())?;
            let name =
                CString::new(program.kernel.unwrap_or_default()).map_err(|e| e.to_string())?;
            let mut f = 0;
            // SAFETY: writes a function handle.
            api.check("cuModuleGetFunction", unsafe {
                (api.module_get_function)(&mut f, module, name.as_ptr())
            })
            .map_err(|e| e.to_string())?;
            let result = mover.alloc(8).map_err(|e| e.to_string())?;
            clock.timer = Some((f, result));
        }
        let (f, result) = clock.timer.expect("set above");
        clock::calibrate(|| -> Result<u64, String> {
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
            })
            .map_err(|e| e.to_string())?;
            let mut v = [0u8; 8];
            mover.get(result, &mut v).map_err(|e| e.to_string())?;
            Ok(u64::from_le_bytes(v))
        })
        .map_err(|e| match e {
            clock::CalibrationError::Read(e) => e,
            clock::CalibrationError::NoSample => "no clock sample was usable".into(),
        })
    }

    /// The clock thread: re-anchors the contexts' clocks every [`REANCHOR_EVERY`], off the
    /// sync thread, whose trace lines and completion runs must not wait for it.
    fn clock_keeper(&self) {
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
    fn worker(&self) {
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

    fn lock_matched(&self) -> std::sync::MutexGuard<'_, HashSet<u32>> {
        self.matched.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_syncing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.syncing.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, VecDeque<Completion>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Syncs the launches that completed; with `wait`, waits for every one first.
    /// Completions come in launch order per stream; one on another stream may finish
    /// first, so each pending one is looked at.
    fn sync_completed(&self, wait: bool) {
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
    fn deliver_held(&self, hit: impl Fn(&Context) -> bool) {
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
                crate::replica::PERF_RING_BYTES >> 20
            );
        }
    }

    /// Every replica of the contexts `hit` picks, pulled whatever launched (a CUDA graph's
    /// launches, say, which are not seen one by one), and their trace lines drained.
    fn pull_all(&self, hit: impl Fn(&Context) -> bool) {
        self.pull_replicas(hit, |_| true);
    }

    /// Pulls the replicas `which` picks in the contexts `hit` picks, and drains those
    /// contexts' trace lines: one sync pass.
    fn pull_replicas(&self, hit: impl Fn(&Context) -> bool, which: impl Fn(&Replica) -> bool) {
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
    fn report_unmatched(&self) {
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

    fn set_context(&self, ctx: Handle) {
        // SAFETY: a context the application made; it stays current on this thread only.
        unsafe { (self.api.ctx_set_current)(ctx) };
    }

    /// Moves bytes in `context` on its stream of ours.
    fn mover<'a>(&'a self, context: &'a Context) -> Mover<'a> {
        Mover {
            api: &self.api,
            stream: context.stream,
            arena: context.arena.as_ref(),
        }
    }

    fn contexts(&self) -> Vec<Arc<Context>> {
        self.read().contexts.values().cloned().collect()
    }

    /// Rings (ring buffers, perf buffers, trace lines) drained while kernels run.
    fn drain_all(&self) {
        self.pull_replicas(
            |_| true,
            |r| matches!(r.kind, DeviceKind::Ringbuf | DeviceKind::PerfEventArray),
        );
    }

    fn drain_trace(&self, context: &Context) {
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

    fn reanchor_all(&self) {
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

    #[test]
    fn the_apply_kernel_passes_ptxas() {
        let Some(ptxas) = bpftime_gpu_ptx::toolchain::ptxas_for_tests() else {
            return;
        };
        let dir = std::env::temp_dir().join(format!("bpftime-apply-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("apply.ptx");
        std::fs::write(&file, APPLY_DELTAS_PTX).unwrap();
        // CUDA 13's ptxas starts at sm_75.
        for sm in [75, 90] {
            bpftime_gpu_ptx::toolchain::run_ptxas(&ptxas, &file, sm, false)
                .unwrap_or_else(|e| panic!("sm_{sm}: {e}"));
        }
        // 64 (address, value) pairs fill the kernel's 1024-byte list.
        assert!(APPLY_DELTAS_PTX.contains(&format!("__bt_list[{}]", DELTAS_PER_LAUNCH * 16)));
    }

    #[test]
    fn the_fold_kernel_passes_ptxas() {
        // FOLD_ENTRIES entries of six u64s fill the kernel's parameter list.
        assert!(FOLD_SHARDS_PTX.contains(&format!("__bt_entries[{}]", FOLD_ENTRIES * 48)));
        let Some(ptxas) = bpftime_gpu_ptx::toolchain::ptxas_for_tests() else {
            return;
        };
        let dir = std::env::temp_dir().join(format!("bpftime-fold-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("fold.ptx");
        std::fs::write(&file, FOLD_SHARDS_PTX).unwrap();
        for sm in [75, 90] {
            bpftime_gpu_ptx::toolchain::run_ptxas(&ptxas, &file, sm, false)
                .unwrap_or_else(|e| panic!("sm_{sm}: {e}"));
        }
    }
}
