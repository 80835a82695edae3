//! Helper prototypes: what each argument must be and what the helper returns,
//! written from the helpers' documented contracts (`man bpf-helpers`).

use bpftime_isa::uapi::{helper as h, map_type as mt};

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

pub struct Proto {
    pub name: &'static str,
    pub args: &'static [Arg],
    pub ret: Ret,
    /// Helpers the GPU runtime implements.
    pub gpu: bool,
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
    mt::ARRAY_OF_MAPS,
    mt::HASH_OF_MAPS,
];
const QUEUE_MAPS: &[u32] = &[mt::QUEUE, mt::STACK, mt::BLOOM_FILTER];
const RINGBUF_MAPS: &[u32] = &[mt::RINGBUF, mt::GPU_RINGBUF];
const PERF_MAPS: &[u32] = &[mt::PERF_EVENT_ARRAY, mt::GPU_RINGBUF];

use Arg::*;

const fn p(name: &'static str, args: &'static [Arg], ret: Ret, gpu: bool) -> Proto {
    Proto {
        name,
        args,
        ret,
        gpu,
    }
}

const PROBE_READ: &[Arg] = &[MemOut, SizeOrZero, Anything];

/// The prototype of helper `id`, or `None` for helpers this runtime does not have.
pub fn proto(id: u32) -> Option<Proto> {
    use Ret::*;
    Some(match id {
        h::MAP_LOOKUP_ELEM => p(
            "bpf_map_lookup_elem",
            &[Map(LOOKUP_MAPS), MapKey],
            MapValueOrNull,
            true,
        ),
        h::MAP_UPDATE_ELEM => p(
            "bpf_map_update_elem",
            &[Map(VALUE_MAPS), MapKey, MapValue, Scalar],
            Integer,
            true,
        ),
        h::MAP_DELETE_ELEM => p(
            "bpf_map_delete_elem",
            &[Map(VALUE_MAPS), MapKey],
            Integer,
            true,
        ),
        h::PROBE_READ => p("bpf_probe_read", PROBE_READ, Integer, true),
        h::KTIME_GET_NS => p("bpf_ktime_get_ns", &[], Integer, true),
        h::TRACE_PRINTK => p("bpf_trace_printk", &[Mem, Size], Integer, true),
        h::GET_PRANDOM_U32 => p("bpf_get_prandom_u32", &[], Integer, true),
        h::GET_SMP_PROCESSOR_ID => p("bpf_get_smp_processor_id", &[], Integer, true),
        h::TAIL_CALL => p(
            "bpf_tail_call",
            &[Ctx, Map(&[mt::PROG_ARRAY]), Scalar],
            Void,
            false,
        ),
        h::GET_CURRENT_PID_TGID => p("bpf_get_current_pid_tgid", &[], Integer, true),
        h::GET_CURRENT_UID_GID => p("bpf_get_current_uid_gid", &[], Integer, false),
        h::GET_CURRENT_COMM => p("bpf_get_current_comm", &[MemOut, Size], Integer, false),
        h::CURRENT_TASK_UNDER_CGROUP => p(
            "bpf_current_task_under_cgroup",
            &[Map(&[mt::CGROUP_ARRAY]), Scalar],
            Integer,
            false,
        ),
        h::PERF_EVENT_OUTPUT => p(
            "bpf_perf_event_output",
            &[Ctx, Map(PERF_MAPS), Scalar, Mem, SizeOrZero],
            Integer,
            true,
        ),
        h::GET_STACKID => p(
            "bpf_get_stackid",
            &[Ctx, Map(&[mt::STACK_TRACE]), Scalar],
            Integer,
            false,
        ),
        h::GET_CURRENT_TASK => p("bpf_get_current_task", &[], Integer, false),
        h::GET_CURRENT_TASK_BTF => p("bpf_get_current_task_btf", &[], Task, false),
        h::TASK_STORAGE_GET => p(
            "bpf_task_storage_get",
            &[
                Map(&[mt::TASK_STORAGE]),
                TaskOrNull,
                Arg::MapValueOrNull,
                Scalar,
            ],
            MapValueOrNull,
            false,
        ),
        h::TASK_STORAGE_DELETE => p(
            "bpf_task_storage_delete",
            &[Map(&[mt::TASK_STORAGE]), TaskOrNull],
            Integer,
            false,
        ),
        h::PROBE_READ_STR => p("bpf_probe_read_str", PROBE_READ, Integer, true),
        h::GET_STACK => p(
            "bpf_get_stack",
            &[Ctx, MemOut, SizeOrZero, Scalar],
            Integer,
            false,
        ),
        h::MAP_PUSH_ELEM => p(
            "bpf_map_push_elem",
            &[Map(QUEUE_MAPS), MapValue, Scalar],
            Integer,
            false,
        ),
        h::MAP_POP_ELEM => p(
            "bpf_map_pop_elem",
            &[Map(QUEUE_MAPS), MapValueOut],
            Integer,
            false,
        ),
        h::MAP_PEEK_ELEM => p(
            "bpf_map_peek_elem",
            &[Map(QUEUE_MAPS), MapValueOut],
            Integer,
            false,
        ),
        h::PROBE_READ_USER => p("bpf_probe_read_user", PROBE_READ, Integer, true),
        h::PROBE_READ_KERNEL => p("bpf_probe_read_kernel", PROBE_READ, Integer, true),
        h::PROBE_READ_USER_STR => p("bpf_probe_read_user_str", PROBE_READ, Integer, true),
        h::PROBE_READ_KERNEL_STR => p("bpf_probe_read_kernel_str", PROBE_READ, Integer, true),
        h::KTIME_GET_BOOT_NS => p("bpf_ktime_get_boot_ns", &[], Integer, false),
        h::RINGBUF_OUTPUT => p(
            "bpf_ringbuf_output",
            &[Map(RINGBUF_MAPS), Mem, SizeOrZero, Scalar],
            Integer,
            true,
        ),
        h::RINGBUF_RESERVE => p(
            "bpf_ringbuf_reserve",
            &[Map(&[mt::RINGBUF]), ConstSize, Scalar],
            RingbufOrNull,
            false,
        ),
        h::RINGBUF_SUBMIT => p("bpf_ringbuf_submit", &[RingbufRelease, Scalar], Void, false),
        h::RINGBUF_DISCARD => p(
            "bpf_ringbuf_discard",
            &[RingbufRelease, Scalar],
            Void,
            false,
        ),
        h::RINGBUF_QUERY => p(
            "bpf_ringbuf_query",
            &[Map(RINGBUF_MAPS), Scalar],
            Integer,
            false,
        ),
        h::KTIME_GET_COARSE_NS => p("bpf_ktime_get_coarse_ns", &[], Integer, false),
        h::SNPRINTF => p(
            "bpf_snprintf",
            &[MemOut, SizeOrZero, Str, MemOrNull, SizeOrZero],
            Integer,
            false,
        ),
        h::GET_FUNC_IP => p("bpf_get_func_ip", &[Ctx], Integer, false),
        h::GET_ATTACH_COOKIE => p("bpf_get_attach_cookie", &[Ctx], Integer, false),
        h::TRACE_VPRINTK => p(
            "bpf_trace_vprintk",
            &[Mem, Size, MemOrNull, SizeOrZero],
            Integer,
            false,
        ),
        h::LOOP => p(
            "bpf_loop",
            &[Scalar, Callback, StackOrNull, Scalar],
            Integer,
            false,
        ),
        h::STRNCMP => p("bpf_strncmp", &[Mem, Size, Str], Integer, false),
        h::GPU_PUTS => p("bpf_puts", &[Str], Integer, true),
        h::GPU_GLOBALTIMER => p("bpf_get_globaltimer", &[], Integer, true),
        h::GPU_BLOCK_IDX => p("bpf_get_block_idx", XYZ, Integer, true),
        h::GPU_BLOCK_DIM => p("bpf_get_block_dim", XYZ, Integer, true),
        h::GPU_THREAD_IDX => p("bpf_get_thread_idx", XYZ, Integer, true),
        h::GPU_MEMBAR => p("bpf_gpu_membar", &[], Integer, true),
        h::GPU_EXIT => p("bpf_gpu_exit", &[], Integer, true),
        h::GPU_GRID_DIM => p("bpf_get_grid_dim", XYZ, Integer, true),
        h::GPU_SM_ID => p("bpf_get_sm_id", &[], Integer, true),
        h::GPU_WARP_ID => p("bpf_get_warp_id", &[], Integer, true),
        h::GPU_LANE_ID => p("bpf_get_lane_id", &[], Integer, true),
        _ => return None,
    })
}

/// The GPU dimension helpers write x, y and z as three u64s through pointers.
const XYZ: &[Arg] = &[MemOutFixed(8), MemOutFixed(8), MemOutFixed(8)];

/// Map types a GPU program may use.
pub const GPU_MAP_TYPES: &[u32] = &[
    mt::ARRAY,
    mt::HASH,
    mt::LRU_HASH,
    mt::LRU_PERCPU_HASH,
    mt::PERCPU_ARRAY,
    mt::PERCPU_HASH,
    mt::RINGBUF,
    mt::PERF_EVENT_ARRAY,
    mt::GPU_HASH,
    mt::GPU_PER_THREAD_ARRAY,
    mt::GPU_ARRAY,
    mt::GPU_RINGBUF,
];

/// Map types the verifier understands at all.
pub const KNOWN_MAP_TYPES: &[u32] = &[
    mt::HASH,
    mt::ARRAY,
    mt::PROG_ARRAY,
    mt::PERF_EVENT_ARRAY,
    mt::CGROUP_ARRAY,
    mt::PERCPU_HASH,
    mt::PERCPU_ARRAY,
    mt::STACK_TRACE,
    mt::LRU_HASH,
    mt::LRU_PERCPU_HASH,
    mt::LPM_TRIE,
    mt::ARRAY_OF_MAPS,
    mt::HASH_OF_MAPS,
    mt::QUEUE,
    mt::STACK,
    mt::RINGBUF,
    mt::BLOOM_FILTER,
    mt::TASK_STORAGE,
    mt::INODE_STORAGE,
    mt::SK_STORAGE,
    mt::CGRP_STORAGE,
    mt::SOCKMAP,
    mt::SOCKHASH,
    mt::DEVMAP,
    mt::DEVMAP_HASH,
    mt::CPUMAP,
    mt::XSKMAP,
    mt::REUSEPORT_SOCKARRAY,
    mt::GPU_HASH,
    mt::GPU_PER_THREAD_ARRAY,
    mt::GPU_ARRAY,
    mt::GPU_RINGBUF,
];

/// Name for the disassembler, `unknown` for ids without a prototype.
pub fn name(id: i32) -> &'static str {
    u32::try_from(id)
        .ok()
        .and_then(proto)
        .map(|p| p.name)
        .unwrap_or("unknown")
}
