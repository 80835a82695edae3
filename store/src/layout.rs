//! On-disk (in-shm) layouts. Every structure here is shared between processes:
//! `#[repr(C)]`, versioned through [`STORE_VERSION`], and holding offsets and ids,
//! never process-local pointers.

use std::sync::atomic::{AtomicU32, AtomicU64};

pub const PAGE_SIZE: usize = 4096;

/// Bumped whenever any layout in this module changes.
pub const STORE_VERSION: u32 = 5;

pub const OBJECT_MAGIC: u32 = 0x4250_4654; // "BPFT"

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ObjectKind {
    Map = 1,
    Program = 2,
    Link = 3,
    PerfEvent = 4,
    Btf = 5,
}

impl ObjectKind {
    pub const ALL: [ObjectKind; 5] = [
        ObjectKind::Map,
        ObjectKind::Program,
        ObjectKind::Link,
        ObjectKind::PerfEvent,
        ObjectKind::Btf,
    ];

    pub fn prefix(self) -> &'static str {
        match self {
            ObjectKind::Map => "map",
            ObjectKind::Program => "prog",
            ObjectKind::Link => "link",
            ObjectKind::PerfEvent => "perf",
            ObjectKind::Btf => "btf",
        }
    }

    pub fn from_u32(v: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u32 == v)
    }
}

/// The first bytes of every object file.
#[repr(C)]
pub struct ObjectHeader {
    pub magic: u32,
    pub version: u32,
    pub kind: u32,
    pub id: u32,
    /// The process that created the object (shown by `bpftime list`); the object's
    /// lifetime is its references', see `lifetime.rs`.
    pub owner_pid: u32,
    /// Unused since version 3 (pins live in the store's `pins/` tree).
    pub pinned: AtomicU32,
    /// Start time (clock ticks since boot) of the owner, to tell a reused pid apart.
    pub owner_start: u64,
}

/// The store's own header (file `store`).
#[repr(C)]
pub struct StoreHeader {
    pub magic: u32,
    pub version: u32,
    pub next_id: AtomicU32,
    pub _pad: u32,
    /// Bumped on every change of links, so agents can cheaply tell when to rescan.
    pub generation: AtomicU64,
}

/// The first cache line of the store's file `cpus` (see `cpu_slots.rs`); slot `i`'s
/// word, 0 or the tid of the thread running a program as CPU `i`, starts the
/// `CPU_SLOT_STRIDE` bytes at `(1 + i) * CPU_SLOT_STRIDE`.
#[repr(C)]
pub struct CpuSlotsHeader {
    pub magic: u32,
    pub version: u32,
    pub cpus: u32,
    pub _pad: u32,
}

pub const CPU_SLOTS_MAGIC: u32 = 0x4350_5553; // "CPUS"
/// A cache line per slot: threads on different CPUs never write the same line.
pub const CPU_SLOT_STRIDE: usize = 64;

/// Header of a map file. The map's data starts at `PAGE_SIZE`.
#[repr(C)]
pub struct MapHeader {
    pub object: ObjectHeader,
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub ncpus: u32,
    pub name: [u8; 16],
    pub btf_id: u32,
    pub btf_key_type_id: u32,
    pub btf_value_type_id: u32,
    pub frozen: AtomicU32,
    pub map_extra: u64,
    /// Total file length.
    pub file_len: u64,
    /// Tid of the thread holding the structure lock, 0 when free.
    pub lock: AtomicU32,
    /// Live elements (hash maps, queues, stacks).
    pub count: AtomicU32,
    /// Hash maps: first and last element of the FIFO free list (index + 1, 0 = none).
    pub free_head: AtomicU32,
    pub free_tail: AtomicU32,
    pub nbuckets: u32,
    pub nelems: u32,
    pub elem_size: u32,
    /// Queues and stacks: ring positions.
    pub head: AtomicU32,
    pub tail: AtomicU32,
    pub _pad: u32,
    /// LRU clock.
    pub lru_clock: AtomicU64,
    /// Ring buffers: records dropped because the ring was full.
    pub dropped: AtomicU64,
    /// Ring buffers: a wake-up byte is in the notification FIFO.
    pub wakeup_pending: AtomicU32,
    pub _pad2: u32,
    /// Bumped by every hash map insert, replace and delete and every array update made
    /// through `bpf()` or the update helper (not by stores through a looked-up value or
    /// a memory-mapped array), so that a replica (the GPU's) can tell it is stale without
    /// reading every element.
    pub updates: AtomicU64,
    /// Maps of maps: the template every inner map must match (type 0 for other maps),
    /// kept here because the loader may close the template map once the outer exists.
    pub inner: InnerTemplate,
}

/// The shape of the inner maps of a map of maps, from the template map at creation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InnerTemplate {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub map_flags: u32,
    pub _pad: u32,
}

const _: () = assert!(std::mem::size_of::<MapHeader>() <= PAGE_SIZE);
