//! The one list of the helpers bpftime knows: for each id its name, the prototype the
//! verifier checks (written from the helpers' documented contracts, `man bpf-helpers`),
//! and the engines that run it.
//!
//! The verifier's prototypes, the syscall shim's list of loadable helpers, the runtime's
//! dispatch table and the GPU lowering's set of helpers are all read from [`REGISTRY`],
//! so a helper is either available on an engine everywhere or refused at load
//! everywhere, with [`Unavailable`]'s message.

use crate::uapi::{helper as h, map_type as mt};

/// What an argument register must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// Any initialized value (scalars and pointers alike: the helper checks it).
    Anything,
    /// A scalar.
    Scalar,
    /// A map (`lddw rX, map`) of one of these types.
    Map(&'static [u32]),
    /// Memory holding `key_size` initialized bytes.
    MapKey,
    /// Memory holding `value_size` initialized bytes.
    MapValue,
    /// Memory of `value_size` bytes the helper writes.
    MapValueOut,
    /// Readable memory whose size is the next argument.
    Mem,
    /// Readable memory or NULL; size in the next argument.
    MemOrNull,
    /// Memory the helper fills; size in the next argument.
    MemOut,
    /// Memory the helper fills, of a fixed size.
    MemOutFixed(u32),
    /// Readable memory holding a string (at least one byte).
    Str,
    /// A string the program cannot change, checked whole at load (the kernel's
    /// `ARG_PTR_TO_CONST_STR`): a constant offset into the value of a frozen array of
    /// one element that programs cannot write (`BPF_F_RDONLY_PROG`, as libbpf makes
    /// `.rodata`), with a NUL before the value ends.
    ConstStr,
    /// Size of the previous memory argument, at least 1.
    Size,
    /// Size of the previous memory argument, may be 0.
    SizeOrZero,
    /// A size that must be a known constant (ringbuf_reserve).
    ConstSize,
    /// The program's context pointer.
    Ctx,
    /// A ring buffer record to submit or discard (releases the reference).
    RingbufRelease,
    /// A callback subprogram (`lddw rX, func`).
    Callback,
    /// A stack pointer or NULL (the context bpf_loop hands its callback).
    StackOrNull,
    /// A task (`bpf_get_current_task_btf()`) or NULL.
    TaskOrNull,
    /// Memory holding `value_size` initialized bytes, or NULL.
    MapValueOrNull,
}

/// What a helper leaves in r0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ret {
    Integer,
    /// Nothing: r0 is unreadable after the call, as in the kernel.
    Void,
    MapValueOrNull,
    RingbufOrNull,
    /// A task: the kernel's trusted BTF pointer to the current `task_struct`.
    Task,
}

/// An engine that runs programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Engine {
    /// The CPU interpreter.
    Interpreter,
    /// The x86-64 JIT (lifted to LLVM IR, helpers called as runtime functions).
    Jit,
    /// The GPU lowering (PTX and AMDGCN).
    Gpu,
}

impl Engine {
    pub const ALL: [Engine; 3] = [Engine::Interpreter, Engine::Jit, Engine::Gpu];
}

impl std::fmt::Display for Engine {
    // Both CPU engines run the same helpers (one flag, [`HelperDef::cpu`]), and which
    // one runs a program is picked after it loaded: a refusal names the CPU.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Engine::Interpreter | Engine::Jit => "the CPU",
            Engine::Gpu => "the GPU",
        })
    }
}

/// How the GPU lowering runs a helper marked for the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuImpl {
    /// Not on the GPU.
    None,
    /// Computed inside the module from the GPU's registers (the lowering knows which).
    Builtin,
    /// A device function of this name with the helper ABI, which the GPU runtime links.
    Extern(&'static str),
}

/// One helper.
#[derive(Clone, Copy, Debug)]
pub struct HelperDef {
    pub id: u32,
    pub name: &'static str,
    pub args: &'static [Arg],
    pub ret: Ret,
    /// Runs on the CPU engines (the interpreter and the JIT alike: the engine is picked
    /// when the program runs, after it loaded).
    pub cpu: bool,
    pub gpu: GpuImpl,
}

impl HelperDef {
    pub fn available_on(&self, engine: Engine) -> bool {
        match engine {
            Engine::Interpreter | Engine::Jit => self.cpu,
            Engine::Gpu => self.gpu != GpuImpl::None,
        }
    }
}

/// Why a program's helper call cannot run on the engine it was loaded for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    #[error("unknown func #{id}: this helper is not provided by bpftime")]
    Unknown { id: u32 },
    #[error("helper {name}#{id} is not available on {engine}")]
    NotOnEngine {
        id: u32,
        name: &'static str,
        engine: Engine,
    },
}

/// Map types that keep values a program can look up.
const VALUE_MAPS: &[u32] = &[
    mt::HASH,
    mt::ARRAY,
    mt::PERCPU_HASH,
    mt::PERCPU_ARRAY,
    mt::LRU_HASH,
    mt::LRU_PERCPU_HASH,
    mt::LPM_TRIE,
    mt::GPU_HASH,
    mt::GPU_PER_THREAD_ARRAY,
    mt::GPU_ARRAY,
    mt::GPU_KERNEL_SHARED_ARRAY,
    mt::GPU_PER_THREAD_ARRAY_HOST,
    mt::GPU_ARRAY_HOST,
];
/// Map types a program may look up in: those holding values, and maps of maps (which
/// give an inner map).
const LOOKUP_MAPS: &[u32] = &[
    mt::HASH,
    mt::ARRAY,
    mt::PERCPU_HASH,
    mt::PERCPU_ARRAY,
    mt::LRU_HASH,
    mt::LRU_PERCPU_HASH,
    mt::LPM_TRIE,
    mt::GPU_HASH,
    mt::GPU_PER_THREAD_ARRAY,
    mt::GPU_ARRAY,
    mt::GPU_KERNEL_SHARED_ARRAY,
    mt::GPU_PER_THREAD_ARRAY_HOST,
    mt::GPU_ARRAY_HOST,
    mt::ARRAY_OF_MAPS,
    mt::HASH_OF_MAPS,
];
const QUEUE_MAPS: &[u32] = &[mt::QUEUE, mt::STACK, mt::BLOOM_FILTER];
const RINGBUF_MAPS: &[u32] = &[mt::RINGBUF, mt::GPU_RINGBUF];
const PERF_MAPS: &[u32] = &[mt::PERF_EVENT_ARRAY, mt::GPU_RINGBUF];

use Arg::*;
use GpuImpl::{Builtin, Extern};

const PROBE_READ: &[Arg] = &[MemOut, SizeOrZero, Anything];
/// The GPU dimension helpers write x, y and z as three u64s through pointers.
const XYZ: &[Arg] = &[MemOutFixed(8), MemOutFixed(8), MemOutFixed(8)];

/// A helper of both CPU engines, and of the GPU as `gpu` says.
const fn cpu(
    id: u32,
    name: &'static str,
    args: &'static [Arg],
    ret: Ret,
    gpu: GpuImpl,
) -> HelperDef {
    HelperDef {
        id,
        name,
        args,
        ret,
        cpu: true,
        gpu,
    }
}

/// A helper only the GPU has.
const fn gpu_only(id: u32, name: &'static str, args: &'static [Arg], gpu: GpuImpl) -> HelperDef {
    HelperDef {
        id,
        name,
        args,
        ret: Ret::Integer,
        cpu: false,
        gpu,
    }
}

const NO: GpuImpl = GpuImpl::None;

/// Every helper bpftime knows, by id.
pub static REGISTRY: &[HelperDef] = &[
    cpu(
        h::MAP_LOOKUP_ELEM,
        "bpf_map_lookup_elem",
        &[Map(LOOKUP_MAPS), MapKey],
        Ret::MapValueOrNull,
        Extern("bpftime_gpu_map_lookup_elem"),
    ),
    cpu(
        h::MAP_UPDATE_ELEM,
        "bpf_map_update_elem",
        &[Map(VALUE_MAPS), MapKey, MapValue, Scalar],
        Ret::Integer,
        Extern("bpftime_gpu_map_update_elem"),
    ),
    cpu(
        h::MAP_DELETE_ELEM,
        "bpf_map_delete_elem",
        &[Map(VALUE_MAPS), MapKey],
        Ret::Integer,
        Extern("bpftime_gpu_map_delete_elem"),
    ),
    cpu(
        h::PROBE_READ,
        "bpf_probe_read",
        PROBE_READ,
        Ret::Integer,
        Extern("bpftime_gpu_probe_read"),
    ),
    cpu(
        h::KTIME_GET_NS,
        "bpf_ktime_get_ns",
        &[],
        Ret::Integer,
        Builtin,
    ),
    cpu(
        h::TRACE_PRINTK,
        "bpf_trace_printk",
        &[Mem, Size],
        Ret::Integer,
        Extern("bpftime_gpu_trace_printk"),
    ),
    cpu(
        h::GET_PRANDOM_U32,
        "bpf_get_prandom_u32",
        &[],
        Ret::Integer,
        Extern("bpftime_gpu_get_prandom_u32"),
    ),
    cpu(
        h::GET_SMP_PROCESSOR_ID,
        "bpf_get_smp_processor_id",
        &[],
        Ret::Integer,
        Builtin,
    ),
    cpu(
        h::TAIL_CALL,
        "bpf_tail_call",
        &[Ctx, Map(&[mt::PROG_ARRAY]), Scalar],
        Ret::Void,
        NO,
    ),
    cpu(
        h::GET_CURRENT_PID_TGID,
        "bpf_get_current_pid_tgid",
        &[],
        Ret::Integer,
        Extern("bpftime_gpu_get_current_pid_tgid"),
    ),
    cpu(
        h::GET_CURRENT_UID_GID,
        "bpf_get_current_uid_gid",
        &[],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::GET_CURRENT_COMM,
        "bpf_get_current_comm",
        &[MemOut, Size],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::PERF_EVENT_OUTPUT,
        "bpf_perf_event_output",
        &[Ctx, Map(PERF_MAPS), Scalar, Mem, SizeOrZero],
        Ret::Integer,
        Extern("bpftime_gpu_perf_event_output"),
    ),
    cpu(
        h::GET_STACKID,
        "bpf_get_stackid",
        &[Ctx, Map(&[mt::STACK_TRACE]), Scalar],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::GET_CURRENT_TASK,
        "bpf_get_current_task",
        &[],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::CURRENT_TASK_UNDER_CGROUP,
        "bpf_current_task_under_cgroup",
        &[Map(&[mt::CGROUP_ARRAY]), Scalar],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::PROBE_READ_STR,
        "bpf_probe_read_str",
        PROBE_READ,
        Ret::Integer,
        Extern("bpftime_gpu_probe_read_str"),
    ),
    cpu(
        h::GET_STACK,
        "bpf_get_stack",
        &[Ctx, MemOut, SizeOrZero, Scalar],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::MAP_PUSH_ELEM,
        "bpf_map_push_elem",
        &[Map(QUEUE_MAPS), MapValue, Scalar],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::MAP_POP_ELEM,
        "bpf_map_pop_elem",
        &[Map(QUEUE_MAPS), MapValueOut],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::MAP_PEEK_ELEM,
        "bpf_map_peek_elem",
        &[Map(QUEUE_MAPS), MapValueOut],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::PROBE_READ_USER,
        "bpf_probe_read_user",
        PROBE_READ,
        Ret::Integer,
        Extern("bpftime_gpu_probe_read_user"),
    ),
    cpu(
        h::PROBE_READ_KERNEL,
        "bpf_probe_read_kernel",
        PROBE_READ,
        Ret::Integer,
        Extern("bpftime_gpu_probe_read_kernel"),
    ),
    cpu(
        h::PROBE_READ_USER_STR,
        "bpf_probe_read_user_str",
        PROBE_READ,
        Ret::Integer,
        Extern("bpftime_gpu_probe_read_user_str"),
    ),
    cpu(
        h::PROBE_READ_KERNEL_STR,
        "bpf_probe_read_kernel_str",
        PROBE_READ,
        Ret::Integer,
        Extern("bpftime_gpu_probe_read_kernel_str"),
    ),
    cpu(
        h::KTIME_GET_BOOT_NS,
        "bpf_ktime_get_boot_ns",
        &[],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::RINGBUF_OUTPUT,
        "bpf_ringbuf_output",
        &[Map(RINGBUF_MAPS), Mem, SizeOrZero, Scalar],
        Ret::Integer,
        Extern("bpftime_gpu_ringbuf_output"),
    ),
    cpu(
        h::RINGBUF_RESERVE,
        "bpf_ringbuf_reserve",
        &[Map(&[mt::RINGBUF]), ConstSize, Scalar],
        Ret::RingbufOrNull,
        NO,
    ),
    cpu(
        h::RINGBUF_SUBMIT,
        "bpf_ringbuf_submit",
        &[RingbufRelease, Scalar],
        Ret::Void,
        NO,
    ),
    cpu(
        h::RINGBUF_DISCARD,
        "bpf_ringbuf_discard",
        &[RingbufRelease, Scalar],
        Ret::Void,
        NO,
    ),
    cpu(
        h::RINGBUF_QUERY,
        "bpf_ringbuf_query",
        &[Map(RINGBUF_MAPS), Scalar],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::TASK_STORAGE_GET,
        "bpf_task_storage_get",
        &[
            Map(&[mt::TASK_STORAGE]),
            TaskOrNull,
            Arg::MapValueOrNull,
            Scalar,
        ],
        Ret::MapValueOrNull,
        NO,
    ),
    cpu(
        h::TASK_STORAGE_DELETE,
        "bpf_task_storage_delete",
        &[Map(&[mt::TASK_STORAGE]), TaskOrNull],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::GET_CURRENT_TASK_BTF,
        "bpf_get_current_task_btf",
        &[],
        Ret::Task,
        NO,
    ),
    cpu(
        h::KTIME_GET_COARSE_NS,
        "bpf_ktime_get_coarse_ns",
        &[],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::SNPRINTF,
        "bpf_snprintf",
        &[MemOut, SizeOrZero, ConstStr, MemOrNull, SizeOrZero],
        Ret::Integer,
        NO,
    ),
    cpu(h::GET_FUNC_IP, "bpf_get_func_ip", &[Ctx], Ret::Integer, NO),
    cpu(
        h::GET_ATTACH_COOKIE,
        "bpf_get_attach_cookie",
        &[Ctx],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::TRACE_VPRINTK,
        "bpf_trace_vprintk",
        &[Mem, Size, MemOrNull, SizeOrZero],
        Ret::Integer,
        NO,
    ),
    // The callback is a subprogram: the interpreter runs it itself, the JIT passes the
    // lifted function's address to the runtime; the GPU lowering has no indirect calls.
    cpu(
        h::LOOP,
        "bpf_loop",
        &[Scalar, Callback, StackOrNull, Scalar],
        Ret::Integer,
        NO,
    ),
    cpu(
        h::STRNCMP,
        "bpf_strncmp",
        &[Mem, Size, ConstStr],
        Ret::Integer,
        NO,
    ),
    gpu_only(h::GPU_PUTS, "bpf_puts", &[Str], Extern("bpftime_gpu_puts")),
    gpu_only(h::GPU_GLOBALTIMER, "bpf_get_globaltimer", &[], Builtin),
    gpu_only(h::GPU_BLOCK_IDX, "bpf_get_block_idx", XYZ, Builtin),
    gpu_only(h::GPU_BLOCK_DIM, "bpf_get_block_dim", XYZ, Builtin),
    gpu_only(h::GPU_THREAD_IDX, "bpf_get_thread_idx", XYZ, Builtin),
    gpu_only(h::GPU_MEMBAR, "bpf_gpu_membar", &[], Builtin),
    gpu_only(h::GPU_EXIT, "bpf_gpu_exit", &[], Extern("bpftime_gpu_exit")),
    gpu_only(h::GPU_GRID_DIM, "bpf_get_grid_dim", XYZ, Builtin),
    gpu_only(h::GPU_SM_ID, "bpf_get_sm_id", &[], Builtin),
    gpu_only(h::GPU_WARP_ID, "bpf_get_warp_id", &[], Builtin),
    gpu_only(h::GPU_LANE_ID, "bpf_get_lane_id", &[], Builtin),
];

/// The helper with this id, if bpftime knows it.
pub fn lookup(id: u32) -> Option<&'static HelperDef> {
    REGISTRY.iter().find(|d| d.id == id)
}

/// The helper with this id if `engine` runs it, or why a program calling it cannot be
/// loaded for that engine.
pub fn require(id: u32, engine: Engine) -> Result<&'static HelperDef, Unavailable> {
    let d = lookup(id).ok_or(Unavailable::Unknown { id })?;
    if d.available_on(engine) {
        Ok(d)
    } else {
        Err(Unavailable::NotOnEngine {
            id,
            name: d.name,
            engine,
        })
    }
}

/// Every helper `engine` runs.
pub fn on(engine: Engine) -> impl Iterator<Item = &'static HelperDef> {
    REGISTRY.iter().filter(move |d| d.available_on(engine))
}

/// Name for disassemblers and messages, `unknown` for ids bpftime does not know.
pub fn name(id: i32) -> &'static str {
    u32::try_from(id)
        .ok()
        .and_then(lookup)
        .map(|d| d.name)
        .unwrap_or("unknown")
}

/// `bpf_loop` runs its callback at most this many times (the kernel's `BPF_MAX_LOOPS`);
/// more is `-E2BIG`.
pub const LOOP_MAX_ITERATIONS: u64 = 1 << 23;

/// What `bpf_loop(nr_loops, .., flags)` answers before running anything: `Err(errno)`
/// (positive) for flags it does not know (`EINVAL`) or too many iterations (`E2BIG`),
/// else the number of iterations to run. `nr_loops` is a `u32` in the kernel's
/// prototype, so only its low half counts.
pub fn loop_iterations(nr_loops: u64, flags: u64) -> Result<u32, i32> {
    const EINVAL: i32 = 22;
    const E2BIG: i32 = 7;
    if flags != 0 {
        return Err(EINVAL);
    }
    let n = nr_loops as u32;
    if u64::from(n) > LOOP_MAX_ITERATIONS {
        return Err(E2BIG);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_named() {
        for (i, d) in REGISTRY.iter().enumerate() {
            assert!(
                REGISTRY[..i].iter().all(|e| e.id != d.id),
                "helper id {} is listed twice",
                d.id
            );
            assert!(d.name.starts_with("bpf_"), "{} has no bpf_ name", d.id);
            assert!(
                d.available_on(Engine::Interpreter) || d.available_on(Engine::Gpu),
                "{} runs nowhere",
                d.name
            );
        }
    }

    #[test]
    fn an_unavailable_helper_is_named_with_its_engine() {
        let e = require(h::LOOP, Engine::Gpu).unwrap_err();
        assert_eq!(
            e.to_string(),
            "helper bpf_loop#181 is not available on the GPU"
        );
        let e = require(h::GPU_THREAD_IDX, Engine::Jit).unwrap_err();
        assert_eq!(
            e.to_string(),
            "helper bpf_get_thread_idx#505 is not available on the CPU"
        );
        assert_eq!(
            require(9999, Engine::Interpreter).unwrap_err(),
            Unavailable::Unknown { id: 9999 }
        );
        assert_eq!(
            require(h::SNPRINTF, Engine::Interpreter).unwrap().name,
            "bpf_snprintf"
        );
    }

    #[test]
    fn loop_limits_follow_the_kernel() {
        assert_eq!(loop_iterations(5, 0), Ok(5));
        assert_eq!(loop_iterations(5, 1), Err(22));
        assert_eq!(loop_iterations(LOOP_MAX_ITERATIONS, 0), Ok(1 << 23));
        assert_eq!(loop_iterations(LOOP_MAX_ITERATIONS + 1, 0), Err(7));
        // Only the low 32 bits are the count.
        assert_eq!(loop_iterations(1 << 32 | 3, 0), Ok(3));
    }
}
