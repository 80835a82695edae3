use inkwell::AddressSpace;

/// How a helper call is emitted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HelperLowering {
    /// Call through an absolute address in this process (the CPU JIT).
    Address(u64),
    /// Call an external function by name, declared in the module with the helper ABI
    /// `i64 (i64, i64, i64, i64, i64)`; a GPU backend links or defines it.
    Symbol(String),
}

/// Where an array map keeps its values, for inlined lookups and updates: key `k`'s value
/// (CPU `c`'s copy of it, for a per-CPU map) lives at
/// `values + k * key_stride + c * per_cpu.stride` for every `k < max_entries`, for as
/// long as the program does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ArrayMapLayout {
    pub values: u64,
    /// Bytes from one key's value (all its copies, for a per-CPU map) to the next key's.
    pub key_stride: u32,
    pub max_entries: u32,
    /// Bytes an update copies into a value; 0 leaves `bpf_map_update_elem` a helper call.
    pub update_size: u32,
    pub per_cpu: Option<PerCpuCopies>,
}

/// How a per-CPU array map keeps one copy of each value per CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PerCpuCopies {
    /// CPUs `0..cpus` have a copy; a thread on any other goes through the helper.
    pub cpus: u32,
    /// Bytes from one CPU's copy to the next.
    pub stride: u32,
}

/// Where a thread can read the number of the CPU it runs on without a call: a `u32` at
/// `offset` in `address_space` (on x86-64 Linux, the `cpu_id` of the thread's rseq area,
/// relative to the FS segment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuNumber {
    pub address_space: u16,
    pub offset: u64,
}

/// How a program runs as one CPU at a time, as the kernel runs it with preemption off, so
/// that its per-CPU read-modify-writes are never interleaved with another program's on the
/// same CPU (a thread can be preempted anywhere): the entry takes a CPU slot no other
/// thread holds, every per-CPU access uses it, and the exit frees it.
///
/// Every offset is in `address_space` (on x86-64 Linux, FS-relative: the thread's own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuSlotTable {
    pub address_space: u16,
    /// The thread's 8-byte word: `1 << 32 | slot` while it holds a slot, 0 otherwise.
    pub slot_offset: u64,
    /// The thread's cached `tgid << 32 | tid`, 0 until known.
    pub ids_offset: u64,
    /// The thread's rseq area, passed to `claim_own`.
    pub rseq_offset: u64,
    /// Address of slot 0's `u32`: `cpus` of them, `stride` bytes apart, each 0 (free) or
    /// the tid of its holder.
    pub slots: u64,
    pub stride: u32,
    pub cpus: u32,
    /// `u32 claim_own(u64 slots, u32 tid, u64 rseq_offset, u32 cpus)`, a C function that
    /// takes the slot of the CPU the thread runs on if it is free and returns it,
    /// `u32::MAX` otherwise; it uses no vector register.
    pub claim_own: u64,
    /// `u64 claim(u64, u64, u64, u64, u64)`, called like a helper: waits for a slot,
    /// records it in the thread's word and returns it; `u32::MAX` for a thread that
    /// cannot take one (it then runs as the CPU it is on).
    pub claim: u64,
}

/// What differs between code generators; the translation itself never looks at the target.
///
/// The lifted functions have fixed, target-neutral signatures (see the crate docs); a
/// backend that needs another entry ABI (a GPU kernel, say) wraps the entry function.
pub trait LoweringTarget {
    /// How to call helper `id`; `None` makes lifting fail with
    /// [`LiftError::UnknownHelper`](crate::LiftError::UnknownHelper).
    ///
    /// For [`TAIL_CALL`](bpftime_isa::uapi::helper::TAIL_CALL) this names the tail-call
    /// resolver rather than a helper: `u64 resolver(ctx, prog_array, index, r4, r5)`
    /// returning the target's entry address, or 0 when the slot is empty.
    fn helper(&self, id: u32) -> Option<HelperLowering>;

    /// Helper ids that `callx` may dispatch to, since its target is only known at run time.
    fn callx_helpers(&self) -> Vec<u32> {
        (0..256).filter(|&id| self.helper(id).is_some()).collect()
    }

    /// Address space of pointers made from eBPF registers (0, the flat space, on every
    /// target we build today).
    fn memory_address_space(&self) -> AddressSpace {
        AddressSpace::default()
    }

    /// Whether loads and stores through pointers of unknown alignment test the address
    /// at run time: one access of the natural width when it is aligned, byte accesses
    /// when it is not. For targets that fault on misaligned access (GPUs), where an
    /// access LLVM cannot prove aligned is otherwise always split into bytes. Off, every
    /// such access is emitted with alignment 1, which x86-64 runs at full speed.
    fn split_misaligned_access(&self) -> bool {
        false
    }

    /// Hook for inlining `bpf_map_lookup_elem` and `bpf_map_update_elem`: when an `lddw`
    /// put `map` into r1 in the same basic block as the call, and this returns the map's
    /// layout, a lookup becomes a bounds check and an address computation, and an update
    /// with flags `BPF_ANY` or `BPF_EXIST` a copy, instead of a helper call (anything
    /// else still calls the helper). Per-CPU layouts are used only with a
    /// [`cpu_number`](Self::cpu_number).
    fn array_map(&self, map: u64) -> Option<ArrayMapLayout> {
        let _ = map;
        None
    }

    /// Where the running CPU's number can be read, for inlined per-CPU map accesses.
    fn cpu_number(&self) -> Option<CpuNumber> {
        None
    }

    /// Where the entry takes a CPU slot for the run (see [`CpuSlotTable`]); `None` runs
    /// the program as whatever CPU the thread is on.
    fn cpu_slots(&self) -> Option<CpuSlotTable> {
        None
    }

    /// The address of a function through which the helper calls on the slow paths of
    /// inlined map operations go, as `r0 = wrapper(r1, r2, r3, r4, r5, helper)` with the
    /// helper's address last, or `None` to call those helpers directly. Only for
    /// [`HelperLowering::Address`] helpers. The x86 JIT's keeps the vector registers
    /// across the call, so that a program whose map accesses are all inlined leaves them
    /// as it found them whichever path it takes.
    fn slow_path_call_wrapper(&self) -> Option<u64> {
        None
    }

    /// Symbol name of the entry function.
    fn entry_name(&self) -> &str {
        crate::DEFAULT_ENTRY_NAME
    }
}
