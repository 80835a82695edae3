//! Helper prototypes, read from the one registry of helpers
//! ([`bpftime_isa::helpers`]), and the map types each engine knows.

use bpftime_isa::uapi::map_type as mt;

pub use bpftime_isa::helpers::{Arg, Ret};
use bpftime_isa::helpers::{Engine, HelperDef};

pub struct Proto {
    pub name: &'static str,
    pub args: &'static [Arg],
    pub ret: Ret,
    /// Helpers the GPU runtime implements.
    pub gpu: bool,
    /// Helpers the CPU engines (interpreter and JIT) implement.
    pub cpu: bool,
}

impl From<&HelperDef> for Proto {
    fn from(d: &HelperDef) -> Self {
        Proto {
            name: d.name,
            args: d.args,
            ret: d.ret,
            gpu: d.available_on(Engine::Gpu),
            cpu: d.available_on(Engine::Interpreter) && d.available_on(Engine::Jit),
        }
    }
}

/// The prototype of helper `id`, or `None` for helpers this runtime does not have.
pub fn proto(id: u32) -> Option<Proto> {
    bpftime_isa::helpers::lookup(id).map(Proto::from)
}

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
    mt::GPU_KERNEL_SHARED_ARRAY,
    mt::GPU_PER_THREAD_ARRAY_HOST,
    mt::GPU_ARRAY_HOST,
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
    mt::GPU_KERNEL_SHARED_ARRAY,
    mt::GPU_PER_THREAD_ARRAY_HOST,
    mt::GPU_ARRAY_HOST,
    mt::GPU_RINGBUF,
];

/// Name for the disassembler, `unknown` for ids without a prototype.
pub fn name(id: i32) -> &'static str {
    bpftime_isa::helpers::name(id)
}
