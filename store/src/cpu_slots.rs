//! One program per CPU at a time, across every process of a store.
//!
//! The kernel runs a tracing program with preemption off, so the code that reads this
//! CPU's copy of a per-CPU value, adds to it and writes it back (bpftrace's `count()`,
//! every `@x = sum()`) is never interleaved with another program on the same CPU. A
//! userspace thread can be preempted anywhere; a thread of the same or another process
//! then runs on that CPU, adds to the same copy for a whole time slice, and the preempted
//! thread's write-back erases those counts (seen: 4 threads on 2 CPUs kept 230185 of
//! 400000 calls of `@c = count()`).
//!
//! So a program that uses per-CPU values runs *as* a CPU slot that it holds alone: the
//! store's file `cpus` has one word per possible CPU, 0 or the tid of the thread running
//! as that CPU. A thread takes the slot of the CPU it runs on, when free, in a restartable
//! sequence (rseq): the kernel restarts the sequence when the thread is preempted,
//! migrated or signalled between reading its CPU number and storing its tid, so no
//! locked instruction is needed; only threads on a CPU take that CPU's slot, and only the
//! holder frees it. When the slot is held (by a thread preempted in a program), the
//! thread waits for it, as a thread of the kernel waits for the CPU. Per-CPU accesses and
//! `bpf_get_smp_processor_id` use the slot held. As in the kernel, at most one program
//! runs as each CPU. A slot held by a thread that died is taken back.
//!
//! Where glibc registers no rseq area (before 2.35, as on RHEL 8 and 9, Debian 11 and
//! Ubuntu 20.04; or `GLIBC_TUNABLES=glibc.pthread.rseq=0`), a thread registers one of
//! ours, in the starter's static TLS ([`use_own_rseq_area`]), the first time it takes a
//! slot. A thread that cannot (the application or a library registered its own area,
//! or the kernel has no rseq) runs programs as the CPU it is on, and a per-CPU update can
//! be lost to preemption there, as before slots existed. It says so once.

use std::sync::atomic::{AtomicIsize, AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::cpu::possible_cpus;
use crate::layout::{CpuSlotsHeader, CPU_SLOTS_MAGIC, CPU_SLOT_STRIDE};
use crate::lock::{current_tid, thread_alive};
use crate::mapping::{read_tls_word, write_tls_word, Mapping};
use crate::store::{check_magic_and_version, Store};
use crate::{Error, Result};

/// The word the thread's state is kept in while static TLS holds it: `1 << 32 | slot`
/// while the thread runs a program as CPU `slot`, 0 otherwise.
const HELD: u64 = 1 << 32;

/// Offset from the thread pointer of the 8 bytes of static TLS that say which slot the
/// thread holds, or 0 while there are none (then no program holds slots).
static SLOT_TP_OFFSET: AtomicIsize = AtomicIsize::new(0);

/// Offset from the thread pointer of our own rseq area (see [`use_own_rseq_area`]), or 0.
static OWN_RSEQ_TP_OFFSET: AtomicIsize = AtomicIsize::new(0);

/// The signature before an rseq abort handler, as glibc registers it on x86.
const RSEQ_SIG: u32 = 0x5305_3053;
/// The size of the original `struct rseq`, which every kernel with rseq accepts.
const RSEQ_AREA_LEN: u32 = 32;

/// This process's mapping of the store's slot table, once [`install`] ran.
static TABLE: OnceLock<Table> = OnceLock::new();

struct Table {
    mapping: Mapping,
    cpus: u32,
    /// Offset from the thread pointer of glibc's rseq area.
    rseq_offset: isize,
}

impl Table {
    fn slot(&self, i: u32) -> &AtomicU32 {
        debug_assert!(i < self.cpus);
        // SAFETY: the mapping holds the header and `cpus` slots of CPU_SLOT_STRIDE bytes,
        // each starting with a 4-aligned u32 only ever accessed atomically.
        unsafe {
            &*(self
                .mapping
                .base()
                .add(CPU_SLOT_STRIDE * (1 + i as usize))
                .cast::<AtomicU32>())
        }
    }
}

/// Maps the slot table of `store` for the programs of this process; the first store
/// wins (an agent serves one).
pub fn install(store: &Store) -> Result<()> {
    if TABLE.get().is_some() {
        return Ok(());
    }
    let Some(cpu_number) = cpu_number_offset() else {
        return Err(Error::invalid(
            libc::ENOTSUP,
            "glibc keeps no rseq area for this process's threads (glibc before 2.35, or GLIBC_TUNABLES=glibc.pthread.rseq=0) and none of ours was offered",
        ));
    };
    // `cpu_id` is 4 bytes into the area.
    let rseq_offset = cpu_number as isize - 4;
    let dir = store.handle();
    let path = dir.shown("cpus");
    let file = dir
        .open("cpus", libc::O_RDWR)
        .map_err(|e| Error::io("open", &path, e))?;
    let mapping = Mapping::map_existing(&file, &path)?;
    if mapping.byte_len() < CPU_SLOT_STRIDE {
        return Err(Error::invalid(
            libc::EINVAL,
            format!("{} is shorter than its header", path.display()),
        ));
    }
    // SAFETY: at least a header's bytes, page aligned.
    let h = unsafe { &*mapping.base().cast::<CpuSlotsHeader>() };
    check_magic_and_version(&path, h.magic, CPU_SLOTS_MAGIC, h.version)?;
    let len = mapping.byte_len();
    let cpus = h.cpus;
    if cpus != possible_cpus() || len < CPU_SLOT_STRIDE * (1 + cpus as usize) {
        return Err(Error::invalid(
            libc::EINVAL,
            format!(
                "{} holds {cpus} CPU slots in {len} bytes; this machine has {} possible CPUs",
                path.display(),
                possible_cpus()
            ),
        ));
    }
    let _ = TABLE.set(Table {
        mapping,
        cpus,
        rseq_offset,
    });
    Ok(())
}

/// Offers a `struct rseq` of our own at `tp_offset` from the thread pointer, for when
/// glibc keeps none: CPU numbers are then read there, and each thread registers it with
/// the kernel the first time it takes a slot.
///
/// # Safety
/// `tp_offset` must be the offset of 32 bytes, 32-aligned, in the static TLS block of a
/// module that stays loaded, laid out as `struct rseq` with `cpu_id` (bytes 4..8) -1 in
/// every thread, and used by nothing else. Call it before any program runs.
pub unsafe fn use_own_rseq_area(tp_offset: isize) {
    OWN_RSEQ_TP_OFFSET.store(tp_offset, Ordering::Relaxed);
}

/// Our own rseq area's offset from the thread pointer, when one was offered.
pub(crate) fn own_rseq_offset() -> Option<isize> {
    Some(OWN_RSEQ_TP_OFFSET.load(Ordering::Relaxed)).filter(|&o| o != 0)
}

/// `cpu_id` of an area never registered, and of one whose registration failed (the
/// kernel's own markers); the second keeps a thread from trying again. Kept in the area,
/// in static TLS, not in a `thread_local!`: this runs from hooks, maybe in a signal
/// handler, where the agent's dynamic TLS may have to be allocated.
const RSEQ_CPU_ID_UNINITIALIZED: u32 = u32::MAX;
const RSEQ_CPU_ID_REGISTRATION_FAILED: u32 = u32::MAX - 1;

/// Registers our own rseq area for the calling thread, when the process uses it (glibc
/// keeps none) and the thread has not tried yet; whether the kernel took it.
fn register_own_rseq(table: &Table) -> bool {
    if own_rseq_offset() != Some(table.rseq_offset) || rseq_cpu(table) != RSEQ_CPU_ID_UNINITIALIZED
    {
        return false;
    }
    let base: usize;
    // SAFETY: on x86-64 glibc the thread control block starts with a pointer to itself,
    // which is the thread pointer.
    unsafe {
        std::arch::asm!(
            "mov {}, qword ptr fs:[0]",
            out(reg) base,
            options(nostack, readonly, preserves_flags),
        )
    };
    let area = base.wrapping_add_signed(table.rseq_offset);
    // SAFETY: `use_own_rseq_area`'s caller vouched for 32 bytes laid out as `struct rseq`
    // in this thread's static TLS, which lives as long as the thread; the kernel writes
    // there until the thread exits (or execs), and nothing frees it before.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rseq,
            area as *mut libc::c_void,
            RSEQ_AREA_LEN,
            0,
            RSEQ_SIG,
        )
    };
    if rc != 0 {
        let why = std::io::Error::last_os_error();
        // SAFETY: our own area's `cpu_id`, which the kernel does not write: it refused it.
        unsafe {
            std::arch::asm!(
                "mov dword ptr fs:[{offset} + 4], {failed:e}",
                offset = in(reg) table.rseq_offset,
                failed = in(reg) RSEQ_CPU_ID_REGISTRATION_FAILED,
                options(nostack, preserves_flags),
            )
        };
        tracing::debug!("this thread's rseq area was not registered: {why}");
        return false;
    }
    true
}

/// Keeps each thread's slot in 8 bytes of static TLS at `tp_offset` from the thread
/// pointer, which JIT-compiled programs read with one load. Until this is called,
/// programs hold no slots.
///
/// # Safety
/// `tp_offset` must be the offset of 8 bytes, 8-aligned, in the static TLS block of a
/// module that stays loaded (an initial-exec variable, `var@gottpoff`), zero in every
/// thread, and used by nothing else.
pub unsafe fn use_static_tls_slot(tp_offset: isize) {
    SLOT_TP_OFFSET.store(tp_offset, Ordering::Relaxed);
}

/// The slot this thread runs a program as, if it holds one.
#[inline]
pub fn held_slot() -> Option<u32> {
    let offset = SLOT_TP_OFFSET.load(Ordering::Relaxed);
    if offset == 0 {
        return None;
    }
    // SAFETY: `use_static_tls_slot`'s caller vouched for the word.
    let v = unsafe { read_tls_word(offset) };
    (v & HELD != 0).then_some(v as u32)
}

/// Where JIT-compiled programs find and take slots, once the process has both the table
/// and the static TLS for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotTable {
    /// Offset from the thread pointer of the thread's `1 << 32 | slot` word (0 when it
    /// holds none).
    pub slot_tp_offset: u64,
    /// Offset from the thread pointer of the thread's cached `tgid << 32 | tid` (0 until
    /// known).
    pub ids_tp_offset: u64,
    /// Offset from the thread pointer of the thread's rseq area.
    pub rseq_tp_offset: u64,
    /// The first slot's word: `cpus` words `stride` bytes apart, each 0 or its holder's tid.
    pub slots: u64,
    pub stride: u32,
    pub cpus: u32,
    /// `u32 claim_own(slots, tid, rseq_tp_offset, cpus)`: takes the slot of the CPU the
    /// thread runs on when it is free, and returns it (`u32::MAX` otherwise); touches
    /// rax, r8, r9 and the flags only.
    pub claim_own: u64,
    /// `u64 claim(u64, u64, u64, u64, u64)`: waits for the CPU's slot and records it in
    /// the thread's word; returns it, or `u32::MAX` for a thread that cannot take slots.
    pub claim: u64,
}

/// What the JIT needs to inline the taking of a slot; `None` while programs take none.
pub fn slot_table() -> Option<SlotTable> {
    let table = TABLE.get()?;
    let slot_tp_offset = SLOT_TP_OFFSET.load(Ordering::Relaxed);
    let ids_tp_offset = crate::thread::ids_tp_offset();
    if slot_tp_offset == 0 || ids_tp_offset == 0 {
        return None;
    }
    let claim: unsafe extern "C" fn(u64, u64, u64, u64, u64) -> u64 = claim_for_jit;
    Some(SlotTable {
        slot_tp_offset: slot_tp_offset as u64,
        ids_tp_offset: ids_tp_offset as u64,
        rseq_tp_offset: table.rseq_offset as u64,
        slots: table.slot(0) as *const AtomicU32 as u64,
        stride: CPU_SLOT_STRIDE as u32,
        cpus: table.cpus,
        claim_own: bpftime_claim_own_slot as *const () as usize as u64,
        claim: claim as usize as u64,
    })
}

unsafe extern "C" fn claim_for_jit(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    // No slot (u32::MAX) is what a claim that cannot be made gives anyway.
    bpftime_ffi_guard::ffi_guard_hot!("the CPU slot claim", u64::from(u32::MAX), {
        let slot = TABLE.get().and_then(claim);
        u64::from(slot.unwrap_or(u32::MAX))
    })
}

const _: () = assert!(
    CPU_SLOT_STRIDE == 64,
    "bpftime_claim_own_slot's `shl r9, 6`"
);

extern "C" {
    fn bpftime_claim_own_slot(slots: *const AtomicU32, tid: u32, rseq: isize, cpus: u32) -> u32;
}

// Takes the slot of the CPU the thread is on, if free, in a restartable sequence: the
// kernel restarts it at `abort` when the thread is preempted, migrated or signalled
// between its read of the CPU number and its store of the tid (the commit), so the slot
// it checked is the slot of the CPU it still runs on, and no thread of that CPU ran in
// between. Only threads on a CPU write that CPU's free slot this way, and only its
// holder frees it, so no locked instruction is needed.
//
// rdi: slot 0's word; esi: the tid (non-zero); rdx: the rseq area's offset from the
// thread pointer; ecx: the number of slots. Returns the slot in eax, or u32::MAX when
// the CPU's slot is taken (or the CPU has none). Touches rax, r8, r9 and flags only.
::std::arch::global_asm!(
    ".pushsection .text.bpftime_claim_own_slot,\"ax\",@progbits",
    ".globl bpftime_claim_own_slot",
    ".hidden bpftime_claim_own_slot",
    ".type bpftime_claim_own_slot,@function",
    ".p2align 4",
    "bpftime_claim_own_slot:",
    "lea rax, [rip + bpftime_claim_own_slot_cs]",
    ".Lbpftime_claim_arm:",
    "mov qword ptr fs:[rdx + 8], rax",
    ".Lbpftime_claim_start:",
    // `cpu_id`: the CPU, or -1 or -2 (out of range) while the thread has no area.
    "mov r8d, dword ptr fs:[rdx + 4]",
    "cmp r8d, ecx",
    "jae .Lbpftime_claim_taken",
    "mov r9, r8",
    "shl r9, 6",
    "cmp dword ptr [rdi + r9], 0",
    "jne .Lbpftime_claim_taken",
    "mov dword ptr [rdi + r9], esi",
    ".Lbpftime_claim_commit:",
    "mov qword ptr fs:[rdx + 8], 0",
    "mov eax, r8d",
    "ret",
    // The signature the kernel checks before an abort address: glibc's, for x86.
    ".long 0x53053053",
    ".Lbpftime_claim_abort:",
    "jmp .Lbpftime_claim_arm",
    ".Lbpftime_claim_taken:",
    "mov qword ptr fs:[rdx + 8], 0",
    "mov eax, -1",
    "ret",
    ".size bpftime_claim_own_slot, . - bpftime_claim_own_slot",
    ".popsection",
    ".pushsection .data.rel.ro.bpftime_claim_own_slot_cs,\"aw\",@progbits",
    ".p2align 5",
    "bpftime_claim_own_slot_cs:",
    ".long 0",
    ".long 0",
    ".quad .Lbpftime_claim_start",
    ".quad .Lbpftime_claim_commit - .Lbpftime_claim_start",
    ".quad .Lbpftime_claim_abort",
    ".popsection",
);

/// How long a thread waits for its CPU's slot before taking the table for damaged:
/// holders keep a slot for one program run, microseconds, but may be preempted; the same
/// patience as the map locks' (see `lock::PATIENCE` for why 10 s).
const SLOT_PATIENCE: std::time::Duration = crate::lock::PATIENCE;

/// Why the slot table is damaged, if a fault or a wait found it so (`None` also while
/// no table is installed).
pub fn damage() -> Option<crate::Damage> {
    TABLE.get().and_then(|t| t.mapping.damage())
}

/// Waits for the slot of the CPU the thread runs on, and records it in the thread's word;
/// `None` for a thread the kernel keeps no rseq area for.
#[cold]
#[inline(never)]
fn claim(table: &Table) -> Option<u32> {
    if table.mapping.damage().is_some() {
        return None;
    }
    let me = current_tid();
    let offset = SLOT_TP_OFFSET.load(Ordering::Relaxed);
    let mut rounds: u32 = 0;
    let started = std::time::Instant::now();
    loop {
        // SAFETY: the table's slots, this thread's own rseq area (registered: checked
        // below before any wait), a non-zero tid.
        let slot =
            unsafe { bpftime_claim_own_slot(table.slot(0), me, table.rseq_offset, table.cpus) };
        if slot != u32::MAX {
            // SAFETY: programs take slots only once the offset is set (see
            // `use_static_tls_slot`).
            unsafe { write_tls_word(offset, HELD | u64::from(slot)) };
            return Some(slot);
        }
        let cpu = rseq_cpu(table);
        if cpu >= table.cpus {
            if register_own_rseq(table) {
                continue;
            }
            not_registered();
            return None;
        }
        // A thread preempted in a program holds the slot: let it go on. A word that
        // names no thread, or one holding the slot past all patience, is garbage: the
        // table is damaged, and programs run as the CPU they are on.
        rounds = rounds.wrapping_add(1);
        let holder = table.slot(cpu).load(Ordering::Relaxed);
        if (holder != 0 && !crate::lock::plausible_tid(holder))
            || (rounds.is_multiple_of(64) && started.elapsed() > SLOT_PATIENCE)
        {
            table.mapping.mark_damaged(crate::Damage::Garbage);
            return None;
        }
        if rounds.is_multiple_of(64) {
            take_back_from_dead(table.slot(cpu), cpu);
        }
        std::thread::yield_now();
    }
}

/// The `cpu_id` of the thread's rseq area: its CPU, or a value out of range while the
/// kernel keeps no area for the thread.
fn rseq_cpu(table: &Table) -> u32 {
    let cpu: u32;
    // SAFETY: glibc's rseq area, at this offset from every thread's pointer.
    unsafe {
        std::arch::asm!(
            "mov {cpu:e}, dword ptr fs:[{offset} + 4]",
            cpu = out(reg) cpu,
            offset = in(reg) table.rseq_offset,
            options(nostack, readonly, preserves_flags),
        )
    };
    cpu
}

#[cold]
fn not_registered() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!(
            "a thread without an rseq area runs programs as the CPU it is on: its per-CPU updates can be lost to preemption"
        )
    });
}

/// Frees `cpu`'s slot if its holder died (a process killed while it ran a program).
fn take_back_from_dead(word: &AtomicU32, cpu: u32) {
    let holder = word.load(Ordering::Relaxed);
    if holder != 0
        && !thread_alive(holder)
        && word
            .compare_exchange(holder, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            cpu,
            dead_tid = holder,
            "took back a CPU slot held by a thread that died in a program"
        );
    }
}

/// Holds a slot for a program run outside JIT code (the interpreter), unless the thread
/// holds one already (a tail call) or programs take none in this process.
pub struct SlotGuard {
    slot: Option<u32>,
}

impl SlotGuard {
    pub fn take() -> SlotGuard {
        let (Some(table), offset) = (TABLE.get(), SLOT_TP_OFFSET.load(Ordering::Relaxed)) else {
            return SlotGuard { slot: None };
        };
        if offset == 0 || held_slot().is_some() {
            return SlotGuard { slot: None };
        }
        SlotGuard { slot: claim(table) }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let (Some(slot), Some(table)) = (self.slot, TABLE.get()) else {
            return;
        };
        // SAFETY: a slot was taken, so the offset is set.
        unsafe { write_tls_word(SLOT_TP_OFFSET.load(Ordering::Relaxed), 0) };
        table.slot(slot).store(0, Ordering::Release);
    }
}

/// Offset from the FS segment base of the `u32` in which the kernel keeps the number of
/// the CPU the thread runs on: the `cpu_id` field (offset 4) of the rseq area glibc
/// (2.35 and newer) registers for every thread, else of ours, which a thread registers
/// when it first takes a CPU slot (`cpu_slots::use_own_rseq_area`; -1 there until then).
/// `None` where there is neither.
pub fn cpu_number_offset() -> Option<u64> {
    static OFFSET: OnceLock<Option<u64>> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        // SAFETY: dlsym with NUL-terminated names; both symbols, where glibc has them,
        // are constants set before any user code runs.
        unsafe {
            let offset = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr());
            let size = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr());
            if offset.is_null() || size.is_null() || *size.cast::<u32>() < 8 {
                // Ours, which threads register as they take CPU slots.
                return own_rseq_offset().map(|o| (o as u64).wrapping_add(4));
            }
            Some((*offset.cast::<isize>() as u64).wrapping_add(4))
        }
    })
}

/// The CPU a program on this thread runs as, below `ncpus`: the CPU slot it holds (see
/// `cpu_slots.rs`), else the CPU it runs on.
#[inline]
pub fn current_cpu(ncpus: u32) -> usize {
    match held_slot() {
        Some(slot) if slot < ncpus => slot as usize,
        _ => hardware_cpu(ncpus),
    }
}

/// The CPU this thread runs on, below `ncpus`: from the rseq area when glibc keeps one,
/// from `sched_getcpu` otherwise.
pub(crate) fn hardware_cpu(ncpus: u32) -> usize {
    if let Some(offset) = cpu_number_offset() {
        let cpu: u32;
        // SAFETY: the rseq area (glibc's or ours) is at this offset from every thread's
        // pointer for the thread's whole life; the kernel keeps `cpu_id` current once
        // the area is registered, and it reads out of range before.
        unsafe {
            std::arch::asm!(
                "mov {cpu:e}, dword ptr fs:[{offset}]",
                cpu = out(reg) cpu,
                offset = in(reg) offset,
                options(nostack, readonly, preserves_flags),
            )
        };
        // A thread whose registration failed reads a negative marker.
        if cpu < ncpus {
            return cpu as usize;
        }
    }
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 {
        0
    } else {
        (c as u32 % ncpus.max(1)) as usize
    }
}
