//! Numbers of the kernel's eBPF ABI (`linux/bpf.h`) that userspace tools send us,
//! plus the GPU extensions bpftime's programs use.

/// `bpf()` commands.
pub mod cmd {
    pub const MAP_CREATE: u32 = 0;
    pub const MAP_LOOKUP_ELEM: u32 = 1;
    pub const MAP_UPDATE_ELEM: u32 = 2;
    pub const MAP_DELETE_ELEM: u32 = 3;
    pub const MAP_GET_NEXT_KEY: u32 = 4;
    pub const PROG_LOAD: u32 = 5;
    pub const OBJ_PIN: u32 = 6;
    pub const OBJ_GET: u32 = 7;
    pub const PROG_ATTACH: u32 = 8;
    pub const PROG_DETACH: u32 = 9;
    pub const PROG_TEST_RUN: u32 = 10;
    pub const PROG_GET_NEXT_ID: u32 = 11;
    pub const MAP_GET_NEXT_ID: u32 = 12;
    pub const PROG_GET_FD_BY_ID: u32 = 13;
    pub const MAP_GET_FD_BY_ID: u32 = 14;
    pub const OBJ_GET_INFO_BY_FD: u32 = 15;
    pub const PROG_QUERY: u32 = 16;
    pub const RAW_TRACEPOINT_OPEN: u32 = 17;
    pub const BTF_LOAD: u32 = 18;
    pub const BTF_GET_FD_BY_ID: u32 = 19;
    pub const TASK_FD_QUERY: u32 = 20;
    pub const MAP_LOOKUP_AND_DELETE_ELEM: u32 = 21;
    pub const MAP_FREEZE: u32 = 22;
    pub const BTF_GET_NEXT_ID: u32 = 23;
    pub const MAP_LOOKUP_BATCH: u32 = 24;
    pub const MAP_LOOKUP_AND_DELETE_BATCH: u32 = 25;
    pub const MAP_UPDATE_BATCH: u32 = 26;
    pub const MAP_DELETE_BATCH: u32 = 27;
    pub const LINK_CREATE: u32 = 28;
    pub const LINK_UPDATE: u32 = 29;
    pub const LINK_GET_FD_BY_ID: u32 = 30;
    pub const LINK_GET_NEXT_ID: u32 = 31;
    pub const ENABLE_STATS: u32 = 32;
    pub const ITER_CREATE: u32 = 33;
    pub const LINK_DETACH: u32 = 34;
    pub const PROG_BIND_MAP: u32 = 35;
}

/// `enum bpf_map_type`, plus bpftime's GPU map types.
pub mod map_type {
    pub const UNSPEC: u32 = 0;
    pub const HASH: u32 = 1;
    pub const ARRAY: u32 = 2;
    pub const PROG_ARRAY: u32 = 3;
    pub const PERF_EVENT_ARRAY: u32 = 4;
    pub const PERCPU_HASH: u32 = 5;
    pub const PERCPU_ARRAY: u32 = 6;
    pub const STACK_TRACE: u32 = 7;
    pub const CGROUP_ARRAY: u32 = 8;
    pub const LRU_HASH: u32 = 9;
    pub const LRU_PERCPU_HASH: u32 = 10;
    pub const LPM_TRIE: u32 = 11;
    pub const ARRAY_OF_MAPS: u32 = 12;
    pub const HASH_OF_MAPS: u32 = 13;
    pub const DEVMAP: u32 = 14;
    pub const SOCKMAP: u32 = 15;
    pub const CPUMAP: u32 = 16;
    pub const XSKMAP: u32 = 17;
    pub const SOCKHASH: u32 = 18;
    pub const REUSEPORT_SOCKARRAY: u32 = 20;
    pub const QUEUE: u32 = 22;
    pub const STACK: u32 = 23;
    pub const SK_STORAGE: u32 = 24;
    pub const DEVMAP_HASH: u32 = 25;
    pub const RINGBUF: u32 = 27;
    pub const INODE_STORAGE: u32 = 28;
    pub const TASK_STORAGE: u32 = 29;
    pub const BLOOM_FILTER: u32 = 30;
    pub const USER_RINGBUF: u32 = 31;
    pub const CGRP_STORAGE: u32 = 32;
    // bpftime's GPU map types: its `GPU_MAP_OFFSET` (1500) plus a standard type, as
    // bpftime's runtime/include/bpftime_shm.hpp numbers them.
    /// A hash map shared by every GPU thread and the host.
    pub const GPU_HASH: u32 = 1501;
    /// An array with a copy of every value per GPU thread (see `gpu_threads`).
    pub const GPU_PER_THREAD_ARRAY: u32 = 1502;
    /// An array shared by every GPU thread and the host.
    pub const GPU_ARRAY: u32 = 1503;
    /// bpftime's array shared with a kernel eBPF map; here (no kernel) a GPU array.
    pub const GPU_KERNEL_SHARED_ARRAY: u32 = 1504;
    /// bpftime's per-thread array in host memory (for GPUs without CUDA IPC).
    pub const GPU_PER_THREAD_ARRAY_HOST: u32 = 1512;
    /// bpftime's shared array in host memory (for GPUs without CUDA IPC).
    pub const GPU_ARRAY_HOST: u32 = 1513;
    /// A ring buffer that GPU probes write with `bpf_perf_event_output`.
    pub const GPU_RINGBUF: u32 = 1527;

    /// What a map of type `t` is served as here: bpftime's shared GPU arrays and hash
    /// maps are the standard array and hash map (one copy that every GPU thread, CPU
    /// program and `bpf()` caller sees), its host-memory per-thread array is the
    /// per-thread array; every other type is itself. Code that dispatches on a map's
    /// type asks this, and keeps the created type only for what it reports
    /// (`BPF_OBJ_GET_INFO_BY_FD`, listings).
    pub const fn served_as(t: u32) -> u32 {
        match t {
            GPU_HASH => HASH,
            GPU_ARRAY | GPU_KERNEL_SHARED_ARRAY | GPU_ARRAY_HOST => ARRAY,
            GPU_PER_THREAD_ARRAY_HOST => GPU_PER_THREAD_ARRAY,
            t => t,
        }
    }

    /// Whether `t` keeps a copy of each value per GPU thread.
    pub const fn is_per_gpu_thread(t: u32) -> bool {
        served_as(t) == GPU_PER_THREAD_ARRAY
    }

    /// Every bpftime GPU map type.
    pub const GPU_TYPES: [u32; 7] = [
        GPU_HASH,
        GPU_PER_THREAD_ARRAY,
        GPU_ARRAY,
        GPU_KERNEL_SHARED_ARRAY,
        GPU_PER_THREAD_ARRAY_HOST,
        GPU_ARRAY_HOST,
        GPU_RINGBUF,
    ];
}

/// How many GPU threads a per-thread array (and a GPU ring buffer) is made for, as
/// bpftime sizes them: `BPFTIME_MAP_GPU_THREAD_COUNT` in the environment of the process
/// that creates the map, else 1024 (bpftime's `gpu_thread_count` default). A thread
/// whose global id is past it gets no value (its lookup is NULL).
pub mod gpu_threads {
    /// The variable bpftime reads, in the loader's environment.
    pub const ENV: &str = "BPFTIME_MAP_GPU_THREAD_COUNT";
    /// bpftime's default.
    pub const DEFAULT: u32 = 1024;
}

/// `enum bpf_prog_type`.
pub mod prog_type {
    pub const UNSPEC: u32 = 0;
    pub const SOCKET_FILTER: u32 = 1;
    pub const KPROBE: u32 = 2;
    pub const SCHED_CLS: u32 = 3;
    pub const SCHED_ACT: u32 = 4;
    pub const TRACEPOINT: u32 = 5;
    pub const XDP: u32 = 6;
    pub const PERF_EVENT: u32 = 7;
    pub const RAW_TRACEPOINT: u32 = 17;
    pub const TRACING: u32 = 26;
    pub const EXT: u32 = 28;
    pub const LSM: u32 = 29;
    pub const SYSCALL: u32 = 31;
}

/// `enum bpf_attach_type` values this runtime recognises.
pub mod attach_type {
    pub const PERF_EVENT: u32 = 41;
    pub const TRACE_KPROBE_MULTI: u32 = 42;
    pub const TRACE_UPROBE_MULTI: u32 = 48;
}

/// `BPF_F_*` flags of `MAP_CREATE`.
pub mod map_flags {
    pub const NO_PREALLOC: u32 = 1 << 0;
    pub const NO_COMMON_LRU: u32 = 1 << 1;
    pub const NUMA_NODE: u32 = 1 << 2;
    pub const RDONLY: u32 = 1 << 3;
    pub const WRONLY: u32 = 1 << 4;
    pub const STACK_BUILD_ID: u32 = 1 << 5;
    pub const ZERO_SEED: u32 = 1 << 6;
    pub const RDONLY_PROG: u32 = 1 << 7;
    pub const WRONLY_PROG: u32 = 1 << 8;
    pub const CLONE: u32 = 1 << 9;
    pub const MMAPABLE: u32 = 1 << 10;
    pub const PRESERVE_ELEMS: u32 = 1 << 11;
    pub const INNER_MAP: u32 = 1 << 12;
}

/// Flags of element updates.
pub mod update_flags {
    pub const ANY: u64 = 0;
    pub const NOEXIST: u64 = 1;
    pub const EXIST: u64 = 2;
    pub const LOCK: u64 = 4;
}

/// Ring buffer constants shared by producers and libbpf's consumer.
pub mod ringbuf {
    pub const BUSY_BIT: u32 = 1 << 31;
    pub const DISCARD_BIT: u32 = 1 << 30;
    pub const HDR_SZ: u32 = 8;
    pub const NO_WAKEUP: u64 = 1;
    pub const FORCE_WAKEUP: u64 = 2;
    pub const AVAIL_DATA: u64 = 0;
    pub const RING_SIZE: u64 = 1;
    pub const CONS_POS: u64 = 2;
    pub const PROD_POS: u64 = 3;
}

/// `BPF_F_CURRENT_CPU` / `BPF_F_INDEX_MASK` of `perf_event_output`.
pub const F_INDEX_MASK: u64 = 0xffff_ffff;
pub const F_CURRENT_CPU: u64 = 0xffff_ffff;

/// Helper function ids (`enum bpf_func_id`), plus bpftime's GPU helpers.
pub mod helper {
    pub const MAP_LOOKUP_ELEM: u32 = 1;
    pub const MAP_UPDATE_ELEM: u32 = 2;
    pub const MAP_DELETE_ELEM: u32 = 3;
    pub const PROBE_READ: u32 = 4;
    pub const KTIME_GET_NS: u32 = 5;
    pub const TRACE_PRINTK: u32 = 6;
    pub const GET_PRANDOM_U32: u32 = 7;
    pub const GET_SMP_PROCESSOR_ID: u32 = 8;
    pub const TAIL_CALL: u32 = 12;
    pub const GET_CURRENT_PID_TGID: u32 = 14;
    pub const GET_CURRENT_UID_GID: u32 = 15;
    pub const GET_CURRENT_COMM: u32 = 16;
    pub const PERF_EVENT_OUTPUT: u32 = 25;
    pub const GET_STACKID: u32 = 27;
    pub const GET_CURRENT_TASK: u32 = 35;
    pub const CURRENT_TASK_UNDER_CGROUP: u32 = 37;
    pub const PROBE_READ_STR: u32 = 45;
    pub const GET_STACK: u32 = 67;
    pub const MAP_PUSH_ELEM: u32 = 87;
    pub const MAP_POP_ELEM: u32 = 88;
    pub const MAP_PEEK_ELEM: u32 = 89;
    pub const PROBE_READ_USER: u32 = 112;
    pub const PROBE_READ_KERNEL: u32 = 113;
    pub const PROBE_READ_USER_STR: u32 = 114;
    pub const PROBE_READ_KERNEL_STR: u32 = 115;
    pub const KTIME_GET_BOOT_NS: u32 = 125;
    pub const RINGBUF_OUTPUT: u32 = 130;
    pub const RINGBUF_RESERVE: u32 = 131;
    pub const RINGBUF_SUBMIT: u32 = 132;
    pub const RINGBUF_DISCARD: u32 = 133;
    pub const RINGBUF_QUERY: u32 = 134;
    pub const SK_STORAGE_GET: u32 = 107;
    pub const SK_STORAGE_DELETE: u32 = 108;
    pub const INODE_STORAGE_GET: u32 = 145;
    pub const INODE_STORAGE_DELETE: u32 = 146;
    pub const TASK_STORAGE_GET: u32 = 156;
    pub const TASK_STORAGE_DELETE: u32 = 157;
    pub const GET_CURRENT_TASK_BTF: u32 = 158;
    pub const KTIME_GET_COARSE_NS: u32 = 160;
    pub const CGRP_STORAGE_GET: u32 = 210;
    pub const CGRP_STORAGE_DELETE: u32 = 211;
    pub const SNPRINTF: u32 = 165;
    pub const GET_FUNC_IP: u32 = 173;
    pub const GET_ATTACH_COOKIE: u32 = 174;
    pub const TRACE_VPRINTK: u32 = 177;
    pub const LOOP: u32 = 181;
    pub const STRNCMP: u32 = 182;

    pub const GPU_PUTS: u32 = 501;
    pub const GPU_GLOBALTIMER: u32 = 502;
    pub const GPU_BLOCK_IDX: u32 = 503;
    pub const GPU_BLOCK_DIM: u32 = 504;
    pub const GPU_THREAD_IDX: u32 = 505;
    pub const GPU_MEMBAR: u32 = 506;
    pub const GPU_EXIT: u32 = 507;
    pub const GPU_GRID_DIM: u32 = 508;
    pub const GPU_SM_ID: u32 = 509;
    pub const GPU_WARP_ID: u32 = 510;
    pub const GPU_LANE_ID: u32 = 511;
}

/// The kernel's limit on instructions in one program.
pub const MAX_INSNS: usize = 1_000_000;
/// Size of an eBPF stack frame.
pub const STACK_SIZE: usize = 512;
/// Deepest chain of bpf-to-bpf calls.
pub const MAX_CALL_FRAMES: usize = 8;
/// Longest chain of tail calls.
pub const MAX_TAIL_CALLS: u32 = 33;
