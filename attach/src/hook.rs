//! The hook registry and the Rust side of the stubs: which handlers run at which address.

use std::cell::Cell;
use std::collections::{hash_map, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicPtr, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use crate::error::AttachError;
use crate::patch::{self, PatchKind, SiteOwner, Trampoline};
use crate::regs::PtRegs;
use crate::stubs;
use crate::HookId;

/// What runs at a hook. It gets the registers as the kernel would show them to a program,
/// on the thread that hit the hook, with hooks off on that thread meanwhile (a hooked
/// function it calls runs unobserved, as the kernel does not nest BPF programs). A handler
/// that panics is logged once and never run again; the hooked code goes on either way.
pub type Handler = Arc<dyn Fn(&mut PtRegs) + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Entry,
    Return,
}

/// Where a hook goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HookAddress {
    pub addr: usize,
    /// `addr` is the first instruction of a function, entered only by a call or a jump
    /// from outside it. The System V ABI leaves the status flags undefined there and the
    /// direction flag clear, so the hook neither saves nor restores the flags (it still
    /// reports them in [`PtRegs::flags`]); that spares a few nanoseconds per hit.
    pub function_entry: bool,
    /// Patch one byte (`int3`) rather than five (`jmp`): for an instruction inside a
    /// function where other code may branch into the bytes after it (a USDT site, a
    /// probe at `function+offset`). Each hit then costs a signal delivery (about a
    /// microsecond) instead of a few nanoseconds.
    pub breakpoint: bool,
}

impl HookAddress {
    /// Any instruction, patched with a jump over its first 5 bytes: every register and
    /// flag is kept.
    pub fn instruction(addr: usize) -> HookAddress {
        HookAddress {
            addr,
            function_entry: false,
            breakpoint: false,
        }
    }

    /// The first instruction of a function (see [`HookAddress::function_entry`]).
    pub fn function_entry(addr: usize) -> HookAddress {
        HookAddress {
            addr,
            function_entry: true,
            breakpoint: false,
        }
    }

    /// Any instruction, patched with a breakpoint (see [`HookAddress::breakpoint`]).
    pub fn breakpoint(addr: usize) -> HookAddress {
        HookAddress {
            addr,
            function_entry: false,
            breakpoint: true,
        }
    }

    fn patch_kind(&self) -> PatchKind {
        if self.breakpoint {
            PatchKind::Breakpoint
        } else {
            PatchKind::Jump
        }
    }
}

impl From<usize> for HookAddress {
    fn from(addr: usize) -> HookAddress {
        HookAddress::instruction(addr)
    }
}

/// Machine code run as a handler, with the C ABI: called as `entry(regs, arg, 0)`, its
/// result ignored. That is the shape of a JIT-compiled eBPF program's entry (r1 = the
/// context, r2, a tail-call depth of 0), which then runs straight from the hook, with no
/// closure between. The code must not unwind.
#[derive(Clone)]
pub struct CodeHandler {
    pub entry: unsafe extern "C" fn(regs: *mut PtRegs, arg: u64, zero: u64) -> u64,
    pub arg: u64,
    /// Whatever keeps `entry`'s code and the data it uses alive; held while attached.
    pub owner: Arc<dyn std::any::Any + Send + Sync>,
    /// `entry` leaves xmm0-15 as it found them (it uses none and calls nothing that
    /// does, or saves them itself). When it is a site's only handler, the hook then
    /// skips saving them, a third of its cost.
    pub keeps_vector_registers: bool,
    /// The words of the [`PtRegs`] that `entry` may read (bit i: bytes 8i to 8i+8), as a
    /// verifier found them; `u64::MAX` when not known. When it is the only handler of a
    /// function entry and reads none of r15, r14, rbp, orig_ax, cs and ss, the hook
    /// saves only the other words (see `stubs`), about 2 ns of a counting uprobe's 12.
    pub regs_read: u64,
}

/// The [`PtRegs`] words a function-entry hook's short save fills in: the registers a
/// call may change (which the hook must give back anyway), the ones the stub itself
/// uses (rbx, r12, r13), and ip, flags and sp.
pub(crate) const SHORT_SAVE_WORDS: u64 = {
    use std::mem::offset_of;
    let offsets = [
        offset_of!(PtRegs, r13),
        offset_of!(PtRegs, r12),
        offset_of!(PtRegs, bx),
        offset_of!(PtRegs, r11),
        offset_of!(PtRegs, r10),
        offset_of!(PtRegs, r9),
        offset_of!(PtRegs, r8),
        offset_of!(PtRegs, ax),
        offset_of!(PtRegs, cx),
        offset_of!(PtRegs, dx),
        offset_of!(PtRegs, si),
        offset_of!(PtRegs, di),
        offset_of!(PtRegs, ip),
        offset_of!(PtRegs, flags),
        offset_of!(PtRegs, sp),
    ];
    let mut mask = 0u64;
    let mut i = 0;
    while i < offsets.len() {
        mask |= 1 << (offsets[i] / 8);
        i += 1;
    }
    mask
};

enum Action {
    Closure(Handler),
    Code(CodeHandler),
}

struct Attached {
    id: HookId,
    kind: Kind,
    action: Action,
    failed: AtomicBool,
}

/// A site's handlers in attach order, and the same split by kind for the hot paths.
#[derive(Default, Clone)]
#[repr(C)]
pub(crate) struct List {
    /// Read by the entry stubs (see `stubs`), hence first and `repr(C)`.
    direct: DirectCall,
    /// Read by the entry and return stubs.
    pair: DirectPair,
    entries: Vec<Arc<Attached>>,
    /// The entry handlers, then the return handlers, in attach order: a hit walks only
    /// its own kind, and calls code without reaching through its `Attached`.
    on_entry: Box<[Run]>,
    on_return: Box<[Run]>,
}

/// One handler as a hit runs it.
#[derive(Clone)]
enum Run {
    Code {
        entry: unsafe extern "C" fn(regs: *mut PtRegs, arg: u64, zero: u64) -> u64,
        arg: u64,
    },
    Closure(Arc<Attached>),
}

/// When a site's only handler is code, the entry stubs call it themselves rather than
/// going through [`on_entry`].
#[derive(Default, Clone, Copy)]
#[repr(C)]
pub(crate) struct DirectCall {
    /// `CodeHandler::entry`, or 0 when the list is anything else.
    entry: usize,
    arg: u64,
    /// Non-zero when the code may change xmm0-15, so the stub saves them around it.
    save_vectors: u64,
    /// Non-zero when the code reads only [`SHORT_SAVE_WORDS`] of its registers, so the
    /// function-entry stub saves only those.
    short_save: u64,
}

/// When a site's handlers are code, at most one at the entry and one at the return (a
/// uretprobe and maybe its uprobe: funclatency's pair), the stubs run them, push the
/// pending call on the thread's shadow stack and pop it themselves, without Rust in
/// between; vector registers are saved around them as around any other handler.
#[derive(Default, Clone, Copy)]
#[repr(C)]
pub(crate) struct DirectPair {
    /// The entry handler's code, or 0 for none.
    entry: usize,
    entry_arg: u64,
    /// The return handler's code, or 0 when the list is anything else.
    ret: usize,
    ret_arg: u64,
}

// The stubs use these offsets.
const _: () = assert!(std::mem::offset_of!(List, direct) == 0);
const _: () = assert!(std::mem::offset_of!(List, pair) == 32);
const _: () = assert!(std::mem::offset_of!(DirectPair, entry) == 0);
const _: () = assert!(std::mem::offset_of!(DirectPair, entry_arg) == 8);
const _: () = assert!(std::mem::offset_of!(DirectPair, ret) == 16);
const _: () = assert!(std::mem::offset_of!(DirectPair, ret_arg) == 24);
const _: () = assert!(std::mem::offset_of!(DirectCall, entry) == 0);
const _: () = assert!(std::mem::offset_of!(DirectCall, arg) == 8);
const _: () = assert!(std::mem::offset_of!(DirectCall, save_vectors) == 16);
const _: () = assert!(std::mem::offset_of!(DirectCall, short_save) == 24);
const _: () = assert!(std::mem::offset_of!(Site, addr) == 0);
const _: () = assert!(std::mem::offset_of!(Site, list) == 8);

impl List {
    fn new(entries: Vec<Arc<Attached>>) -> List {
        let runs = |kind: Kind| -> Box<[Run]> {
            entries
                .iter()
                .filter(|a| a.kind == kind)
                .map(|a| match &a.action {
                    Action::Code(code) => Run::Code {
                        entry: code.entry,
                        arg: code.arg,
                    },
                    Action::Closure(_) => Run::Closure(a.clone()),
                })
                .collect()
        };
        let (on_entry, on_return) = (runs(Kind::Entry), runs(Kind::Return));
        let direct = match entries.as_slice() {
            [only] if only.kind == Kind::Entry => match &only.action {
                Action::Code(code) => DirectCall {
                    entry: code.entry as usize,
                    arg: code.arg,
                    save_vectors: u64::from(!code.keeps_vector_registers),
                    short_save: u64::from(code.regs_read & !SHORT_SAVE_WORDS == 0),
                },
                Action::Closure(_) => DirectCall::default(),
            },
            _ => DirectCall::default(),
        };
        let code = |r: &Run| match r {
            Run::Code { entry, arg } => Some((*entry as usize, *arg)),
            Run::Closure(_) => None,
        };
        let pair = match (&*on_entry, &*on_return) {
            ([], [ret]) => code(ret).map(|(ret, ret_arg)| DirectPair {
                ret,
                ret_arg,
                ..DirectPair::default()
            }),
            ([entry], [ret]) => {
                code(entry)
                    .zip(code(ret))
                    .map(|((entry, entry_arg), (ret, ret_arg))| DirectPair {
                        entry,
                        entry_arg,
                        ret,
                        ret_arg,
                    })
            }
            _ => None,
        }
        .unwrap_or_default();
        List {
            direct,
            pair,
            entries,
            on_entry,
            on_return,
        }
    }
}

/// One hooked address. Never freed: trampolines hold its address, and a uretprobe frame may
/// name it long after its last handler is gone.
#[repr(C)]
pub(crate) struct Site {
    addr: usize,
    /// The handlers in attach order; null when there are none. A published list is never
    /// freed or changed (a thread may be walking it), only replaced.
    list: AtomicPtr<List>,
    /// Where this site's trampoline lands a primed hijacked return (0 for none): the
    /// return address a pending call holds in place of the return stub's.
    landing: AtomicUsize,
}

struct SiteState {
    site: &'static Site,
    trampoline: Trampoline,
    kind: PatchKind,
    /// What is written at the site now: `kind`, or a breakpoint where a jump could not
    /// safely go in.
    patched: Option<PatchKind>,
}

#[derive(Default)]
struct Registry {
    sites: HashMap<usize, SiteState>,
    hooks: HashMap<HookId, usize>,
    next_id: u64,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);

fn registry() -> MutexGuard<'static, Registry> {
    // A panic while holding the lock cannot leave the registry half-updated in a way that
    // matters more than refusing all later calls would.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Replaces a site's list. The old one is leaked on purpose: a thread may still be walking
/// it, and knowing when none is would need a quiescence scheme on the hot path. Each attach
/// or detach leaks one list, a few dozen bytes.
fn publish(site: &Site, list: List) {
    let new = if list.entries.is_empty() {
        ptr::null_mut()
    } else {
        Box::into_raw(Box::new(list))
    };
    site.list.store(new, Ordering::Release);
}

/// Whether new function-entry sites prime hijacked returns (see `patch::PRIME_LEN`): 0 lets
/// `BPFTIME_PRIME_RETURNS` (`1` or `0`) or the CPU decide, 1 on, 2 off.
static PRIME_RETURNS: AtomicU8 = AtomicU8::new(0);

/// Makes the function-entry sites hooked from now on prime hijacked returns (`Some(true)`),
/// or not (`Some(false)`), or leaves it to `BPFTIME_PRIME_RETURNS` and the CPU (`None`).
/// Priming saves the mispredicted return of every uretprobe hit where it pays: on the GPU
/// machines' Intel host, a uprobe and a uretprobe counting cost 10-11 ns less per call (three
/// runs; funclatency's change was within that host's noise); on our AMD EPYC (Zen 4) VM the
/// pair gains 2 ns and funclatency loses 10, so by default only Intel CPUs prime.
pub fn prime_returns(choice: Option<bool>) {
    let v = match choice {
        None => 0,
        Some(true) => 1,
        Some(false) => 2,
    };
    PRIME_RETURNS.store(v, Ordering::Relaxed);
}

fn primes_returns() -> bool {
    static BY_DEFAULT: LazyLock<bool> =
        LazyLock::new(|| match std::env::var("BPFTIME_PRIME_RETURNS").as_deref() {
            Ok("1") => true,
            Ok("0") => false,
            _ => cpu_is_intel(),
        });
    match PRIME_RETURNS.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => *BY_DEFAULT,
    }
}

fn cpu_is_intel() -> bool {
    let id = std::arch::x86_64::__cpuid(0);
    let mut vendor = [0u8; 12];
    vendor[..4].copy_from_slice(&id.ebx.to_le_bytes());
    vendor[4..8].copy_from_slice(&id.edx.to_le_bytes());
    vendor[8..].copy_from_slice(&id.ecx.to_le_bytes());
    &vendor == b"GenuineIntel"
}

impl Registry {
    /// The site at `at.addr`, made on first use. Its stub and patch are chosen then: a site
    /// made for an arbitrary instruction keeps the flags even if a later caller says it is a
    /// function entry, and a breakpoint stays one.
    fn site(&mut self, at: HookAddress) -> Result<&mut SiteState, AttachError> {
        let addr = at.addr;
        match self.sites.entry(addr) {
            hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            hash_map::Entry::Vacant(v) => {
                let site: &'static Site = Box::leak(Box::new(Site {
                    addr,
                    list: AtomicPtr::new(ptr::null_mut()),
                    landing: AtomicUsize::new(0),
                }));
                // Only the function-entry stub says whether it hijacked the return.
                let (stub, primed) = if at.function_entry {
                    (
                        stubs::function_entry_stub(),
                        primes_returns().then(stubs::primed_return_stub),
                    )
                } else {
                    (stubs::entry_stub(), None)
                };
                let mut kind = at.patch_kind();
                let build = |kind| {
                    patch::build_trampoline(addr, site as *const Site as usize, stub, primed, kind)
                };
                let trampoline = match build(kind) {
                    // A function shorter than the jump, or one whose code branches back
                    // into its first 5 bytes: one byte is always safe to take.
                    Err(AttachError::Unhookable { reason, .. }) if kind == PatchKind::Jump => {
                        tracing::info!(
                            addr = format_args!("{addr:#x}"),
                            "hooked with a breakpoint (a signal per hit), as {reason}"
                        );
                        kind = PatchKind::Breakpoint;
                        build(kind)?
                    }
                    built => built?,
                };
                site.landing
                    .store(trampoline.landing.unwrap_or(0), Ordering::Release);
                patch::register_trap(addr, trampoline.entry)?;
                Ok(v.insert(SiteState {
                    site,
                    trampoline,
                    kind,
                    patched: None,
                }))
            }
        }
    }
}

fn current(site: &Site) -> List {
    let p = site.list.load(Ordering::Acquire);
    // SAFETY: published lists are never freed (see `Site::list`).
    unsafe { p.as_ref() }.cloned().unwrap_or_default()
}

/// Whether a hook site exists at `addr` (attached now or before).
fn is_hooked(addr: usize) -> bool {
    registry().sites.contains_key(&addr)
}

fn attach(at: HookAddress, kind: Kind, action: Action) -> Result<HookId, AttachError> {
    let addr = at.addr;
    let had_site = is_hooked(addr);
    if patch::claim_site(addr, SiteOwner::Hook).is_err() {
        return Err(AttachError::Unhookable {
            addr,
            reason: "the function is detoured (replaced by bpftime's GPU attach)".into(),
        });
    }
    let attached = attach_claimed(at, kind, action);
    // A site that was never made leaves the address to a detour.
    if attached.is_err() && !had_site && !is_hooked(addr) {
        patch::release_site(addr, SiteOwner::Hook);
    }
    attached
}

/// [`attach`] at an address this module holds.
fn attach_claimed(at: HookAddress, kind: Kind, action: Action) -> Result<HookId, AttachError> {
    let addr = at.addr;
    let machinery = [
        stubs::entry_stub(),
        stubs::function_entry_stub(),
        stubs::return_stub(),
        stubs::primed_return_stub(),
        on_entry as *const () as usize,
        on_return as *const () as usize,
    ];
    if machinery.contains(&addr) {
        // Hooking these would recurse before the reentrancy guard could stop it.
        return Err(AttachError::Unhookable {
            addr,
            reason: "this is the hook machinery itself".into(),
        });
    }
    let mut reg = registry();
    let id = HookId(reg.next_id);
    let state = reg.site(at)?;
    let site = state.site;
    let mut entries = current(site).entries;
    entries.push(Arc::new(Attached {
        id,
        kind,
        action,
        failed: AtomicBool::new(false),
    }));
    if state.patched.is_none() {
        let written = match state.kind {
            PatchKind::Jump => {
                patch::write_jump(addr, state.trampoline.entry, &state.trampoline.interior)?
            }
            PatchKind::Breakpoint => {
                patch::write_breakpoint(addr)?;
                PatchKind::Breakpoint
            }
        };
        state.patched = Some(written);
    }
    publish(site, List::new(entries));
    reg.next_id += 1;
    reg.hooks.insert(id, addr);
    tracing::debug!(%id, ?kind, addr = format_args!("{addr:#x}"), "attached");
    Ok(id)
}

/// Runs `handler` every time the instruction at `at` (an address, or a [`HookAddress`])
/// is about to execute, with the registers at that point. Handlers at one address run in
/// the order they were attached, whatever their kind.
///
/// # Safety
/// The address must be the first byte of an instruction in code that stays mapped, and,
/// unless it is a [`HookAddress::breakpoint`], no code may jump into the first 5 bytes from
/// it except at the address itself (a loop head in them, for one; the direct cases are
/// checked, jumps from further away cannot be; [`plan_site`](crate::plan_site) checks a
/// whole function). Nothing else may patch those bytes while the hook is attached. At a
/// breakpoint, a thread that blocks SIGTRAP is killed when it gets there. An address given as a
/// function entry must be one (see [`HookAddress::function_entry`]).
pub unsafe fn attach_uprobe(
    at: impl Into<HookAddress>,
    handler: Handler,
) -> Result<HookId, AttachError> {
    attach(at.into(), Kind::Entry, Action::Closure(handler))
}

/// [`attach_uprobe`] with machine code for the handler.
///
/// # Safety
/// As [`attach_uprobe`], and `code.entry` must be a function with that signature that
/// does not unwind, valid while `code.owner` lives.
pub unsafe fn attach_uprobe_code(
    at: impl Into<HookAddress>,
    code: CodeHandler,
) -> Result<HookId, AttachError> {
    attach(at.into(), Kind::Entry, Action::Code(code))
}

/// Runs `handler` every time the function starting at `addr` returns, with the registers
/// just after the return (`ax`, `dx`: the return value; `ip`: the return address). It works
/// by replacing the return address on the stack with a trampoline and keeping the real one
/// on a per-thread shadow stack, so recursion and nesting are handled; a call that is left
/// by `longjmp` or unwinding instead of a return is not reported, and a frame abandoned that
/// way is dropped at the next return below it.
///
/// # Safety
/// As [`attach_uprobe`], and `addr` must be the entry of a function that finds its return
/// address at `[rsp]`, and returns by `ret` to it. Code that inspects its own return address
/// (some unwinders, stack-protector schemes, `__builtin_return_address`) sees the trampoline's.
pub unsafe fn attach_uretprobe(addr: usize, handler: Handler) -> Result<HookId, AttachError> {
    attach_return(addr, Action::Closure(handler))
}

/// [`attach_uretprobe`] with machine code for the handler.
///
/// # Safety
/// As [`attach_uretprobe`] and [`attach_uprobe_code`].
pub unsafe fn attach_uretprobe_code(addr: usize, code: CodeHandler) -> Result<HookId, AttachError> {
    attach_return(addr, Action::Code(code))
}

fn attach_return(addr: usize, action: Action) -> Result<HookId, AttachError> {
    if shadow_stack_enabled() {
        return Err(AttachError::Unhookable {
            addr,
            reason: "this process runs with CET shadow stacks, which would fault on the \
                     replaced return address; use a uprobe"
                .into(),
        });
    }
    attach(HookAddress::function_entry(addr), Kind::Return, action)
}

/// Whether the hardware shadow stack (CET) is on for this thread; it checks every `ret`
/// against its own copy of the return address, which a uretprobe replaces.
fn shadow_stack_enabled() -> bool {
    const ARCH_SHSTK_STATUS: libc::c_long = 0x5005;
    const ARCH_SHSTK_SHSTK: u64 = 1;
    let mut features: u64 = 0;
    // SAFETY: ARCH_SHSTK_STATUS writes one u64 to the pointer; kernels without it fail with
    // EINVAL and write nothing.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_SHSTK_STATUS,
            &mut features as *mut u64,
        )
    };
    rc == 0 && features & ARCH_SHSTK_SHSTK != 0
}

/// Removes one handler. The last handler out puts the original code back; the trampoline
/// stays mapped for threads that may still be inside it.
pub fn detach(id: HookId) -> Result<(), AttachError> {
    let mut reg = registry();
    let addr = reg
        .hooks
        .remove(&id)
        .ok_or(AttachError::UnknownHook { id })?;
    let state = reg.sites.get_mut(&addr).expect("every hook has a site");
    let site = state.site;
    let mut entries = current(site).entries;
    entries.retain(|a| a.id != id);
    if let (true, Some(written)) = (entries.is_empty(), state.patched) {
        if let Err(e) = patch::restore(addr, &state.trampoline.original[..written.len()]) {
            reg.hooks.insert(id, addr);
            return Err(e);
        }
        state.patched = None;
    }
    publish(site, List::new(entries));
    tracing::debug!(%id, addr = format_args!("{addr:#x}"), "detached");
    Ok(())
}

thread_local! {
    /// Set while this thread runs handlers: a handler that calls a hooked function (malloc,
    /// say) must not run handlers again, as the kernel does not nest BPF programs. Unused
    /// once [`use_static_tls_flag`] gave a byte for it.
    static IN_HANDLERS: Cell<bool> = const { Cell::new(false) };
    static SHADOW: ShadowStack = const { ShadowStack::new() };
}

/// A thread's pending uretprobe calls: a vector of frames kept as its raw parts, which
/// the stubs push and pop themselves for a site whose handlers are a lone pair of code
/// (see [`DirectPair`]). Where the starter gave 8 bytes of static TLS
/// ([`use_static_tls_shadow`]), they hold its address, so that an entry and a return reach
/// it with one load rather than through `__tls_get_addr` (the agent is `dlopen`ed).
#[repr(C)]
pub(crate) struct ShadowStack {
    /// Non-zero while Rust code or a stub changes or walks the frames: a hooked call in a
    /// signal handler meanwhile is not hijacked, as a `RefCell` already borrowed says.
    busy: Cell<u64>,
    len: Cell<usize>,
    cap: Cell<usize>,
    ptr: Cell<*mut Frame>,
}

// The stubs use these offsets.
const _: () = assert!(std::mem::offset_of!(ShadowStack, busy) == 0);
const _: () = assert!(std::mem::offset_of!(ShadowStack, len) == 8);
const _: () = assert!(std::mem::offset_of!(ShadowStack, cap) == 16);
const _: () = assert!(std::mem::offset_of!(ShadowStack, ptr) == 24);
const _: () = assert!(std::mem::size_of::<Frame>() == 24);
const _: () = assert!(std::mem::offset_of!(Frame, ret) == 0);
const _: () = assert!(std::mem::offset_of!(Frame, sp) == 8);
const _: () = assert!(std::mem::offset_of!(Frame, site) == 16);

impl ShadowStack {
    const fn new() -> ShadowStack {
        ShadowStack {
            busy: Cell::new(0),
            len: Cell::new(0),
            cap: Cell::new(0),
            ptr: Cell::new(ptr::NonNull::dangling().as_ptr()),
        }
    }

    /// `f` on the frames, unless something is changing or walking them already (this
    /// thread, interrupted by the signal handler that calls this).
    fn frames<R>(&self, f: impl FnOnce(&mut Vec<Frame>) -> R) -> Option<R> {
        if self.busy.get() != 0 {
            return None;
        }
        self.busy.set(1);
        // A signal handler on this thread sees the flag before any change.
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        // SAFETY: the parts of a vector that only this thread touches, kept by the last
        // call here (or `new`'s empty one), and by the stubs, which only move `len`
        // within `cap` and write frames below it.
        let mut frames = std::mem::ManuallyDrop::new(unsafe {
            Vec::from_raw_parts(self.ptr.get(), self.len.get(), self.cap.get())
        });
        let r = f(&mut frames);
        self.ptr.set(frames.as_mut_ptr());
        self.len.set(frames.len());
        self.cap.set(frames.capacity());
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        self.busy.set(0);
        Some(r)
    }
}

impl Drop for ShadowStack {
    fn drop(&mut self) {
        // A hooked call during the thread's later TLS destructors finds no stack, as
        // `SHADOW.try_with` then says, instead of this freed one.
        set_static_shadow(0);
        // SAFETY: the vector's parts, as `frames` left them; nothing uses them after this.
        drop(unsafe { Vec::from_raw_parts(self.ptr.get(), self.len.get(), self.cap.get()) });
    }
}

/// The offset from the thread pointer of the slot that caches this thread's
/// `SHADOW`'s address, or 0 for none.
pub(crate) static STATIC_TLS_SHADOW: AtomicIsize = AtomicIsize::new(0);

/// Gives the hooks 8 bytes of static TLS, at `tp_offset` from the thread pointer in every
/// thread, to find each thread's shadow stack of pending uretprobe calls without
/// `__tls_get_addr`. Call it before anything is attached; it fails afterwards.
///
/// # Safety
/// `tp_offset` must be the offset of 8 bytes in the static TLS block of a module that
/// stays loaded, zero in every new thread, and used by nothing else.
pub unsafe fn use_static_tls_shadow(tp_offset: isize) -> Result<(), AttachError> {
    let reg = registry();
    if !reg.sites.is_empty() || tp_offset == 0 {
        return Err(AttachError::ThreadFlagRefused { tp_offset });
    }
    STATIC_TLS_SHADOW.store(tp_offset, Ordering::Relaxed);
    Ok(())
}

fn set_static_shadow(address: usize) {
    let offset = STATIC_TLS_SHADOW.load(Ordering::Relaxed);
    if offset == 0 {
        return;
    }
    // SAFETY: `use_static_tls_shadow`'s caller vouched for 8 bytes of static TLS at this
    // offset in every thread; these are this thread's own.
    unsafe {
        std::arch::asm!(
            "mov qword ptr fs:[{offset}], {v}",
            offset = in(reg) offset,
            v = in(reg) address,
            options(nostack, preserves_flags),
        )
    };
}

/// `f` on this thread's shadow stack, or `None` once the thread's TLS is going.
fn with_shadow<R>(f: impl FnOnce(&ShadowStack) -> R) -> Option<R> {
    let offset = STATIC_TLS_SHADOW.load(Ordering::Relaxed);
    if offset != 0 {
        let address: usize;
        // SAFETY: as in `set_static_shadow`.
        unsafe {
            std::arch::asm!(
                "mov {v}, qword ptr fs:[{offset}]",
                offset = in(reg) offset,
                v = out(reg) address,
                options(nostack, readonly, preserves_flags),
            )
        };
        if address != 0 {
            // SAFETY: this thread's `SHADOW`, stored below while it lived; its destructor
            // clears the slot before it goes. A forked child's copy of the slot points at
            // the child's copy of the same thread-local.
            return Some(f(unsafe { &*(address as *const ShadowStack) }));
        }
    }
    SHADOW
        .try_with(|s| {
            set_static_shadow(s as *const ShadowStack as usize);
            f(s)
        })
        .ok()
}

/// The offset from the thread pointer of the per-thread byte that says handlers run on the
/// thread, or 0 while there is none (then `IN_HANDLERS` says it, and the stubs always go
/// through [`on_entry`]). Read by the entry stubs.
pub(crate) static STATIC_TLS_FLAG: AtomicIsize = AtomicIsize::new(0);

/// Gives the hooks a byte of static TLS to mark the threads that run handlers, at
/// `tp_offset` from the thread pointer (the FS base) in every thread. The entry stubs can
/// then test it themselves and call a site's only [`CodeHandler`] without entering Rust,
/// which a thread-local of a `dlopen`ed library (reached through `__tls_get_addr`) does
/// not allow. Call it before anything is attached; it fails afterwards, since handlers
/// could be running with the old flag.
///
/// # Safety
/// `tp_offset` must be the offset of a byte in the static TLS block of a module that
/// stays loaded (an initial-exec or local-exec variable, `var@gottpoff`), zero in every
/// thread, and used by nothing else.
pub unsafe fn use_static_tls_flag(tp_offset: isize) -> Result<(), AttachError> {
    let reg = registry();
    if !reg.sites.is_empty() || tp_offset == 0 {
        return Err(AttachError::ThreadFlagRefused { tp_offset });
    }
    let masked = IN_HANDLERS.get();
    STATIC_TLS_FLAG.store(tp_offset, Ordering::Relaxed);
    // A thread masked before the switch (this one, if any) stays masked.
    set_in_handlers(masked);
    Ok(())
}

/// Whether this thread is inside bpftime's handlers (hooks, system call entries), where
/// nothing it calls may be hooked again.
pub fn in_handlers() -> bool {
    let offset = STATIC_TLS_FLAG.load(Ordering::Relaxed);
    if offset == 0 {
        return IN_HANDLERS.get();
    }
    let v: u8;
    // SAFETY: `use_static_tls_flag`'s caller vouched for a byte of static TLS at this
    // offset in every thread.
    unsafe {
        std::arch::asm!(
            "mov {v}, byte ptr fs:[{offset}]",
            offset = in(reg) offset,
            v = out(reg_byte) v,
            options(nostack, readonly, preserves_flags),
        )
    };
    v != 0
}

/// Marks this thread as inside bpftime's handlers, or out of them (see [`in_handlers`]).
pub fn set_in_handlers(on: bool) {
    let offset = STATIC_TLS_FLAG.load(Ordering::Relaxed);
    if offset == 0 {
        IN_HANDLERS.set(on);
        return;
    }
    // SAFETY: as in `in_handlers`; the byte is this thread's own.
    unsafe {
        std::arch::asm!(
            "mov byte ptr fs:[{offset}], {v}",
            offset = in(reg) offset,
            v = in(reg_byte) u8::from(on),
            options(nostack, preserves_flags),
        )
    };
}

/// A call whose return address a uretprobe replaced.
#[repr(C)]
pub(crate) struct Frame {
    ret: u64,
    /// The stack pointer at the function's entry (where the return address lives).
    sp: u64,
    site: &'static Site,
}

/// Keeps handlers from ever running on the calling thread: for a runtime's own threads,
/// whose work (allocating, reading files) is not the application's to observe.
pub fn never_run_handlers_on_this_thread() {
    set_in_handlers(true);
}

struct Reentry;

impl Reentry {
    fn enter() -> Option<Reentry> {
        // Not `then_some(Reentry)`: that builds the guard either way, and dropping the
        // unused one would clear the flag of the handlers already running.
        if in_handlers() {
            None
        } else {
            set_in_handlers(true);
            Some(Reentry)
        }
    }
}

impl Drop for Reentry {
    fn drop(&mut self) {
        set_in_handlers(false);
    }
}

#[inline]
fn run(what: &Run, regs: &mut PtRegs) {
    let entry = match what {
        Run::Code { entry, arg } => {
            // SAFETY: the attacher vouched for the code (`attach_uprobe_code`), which the
            // `owner` of its `Attached`, in the same list, keeps alive; `regs` is live for
            // the call.
            unsafe { entry(regs, *arg, 0) };
            return;
        }
        Run::Closure(entry) => entry,
    };
    let Action::Closure(handler) = &entry.action else {
        return;
    };
    if entry.failed.load(Ordering::Relaxed) {
        return;
    }
    if catch_unwind(AssertUnwindSafe(|| handler(regs))).is_err()
        && !entry.failed.swap(true, Ordering::Relaxed)
    {
        tracing::error!(id = %entry.id, "handler panicked; it will not run again");
    }
}

/// Called by the entry stubs with the hooked code's registers (`ip` already set), unless
/// they called the site's only handler themselves.
pub(crate) extern "C" fn on_entry(site: *const Site, regs: *mut PtRegs) {
    // SAFETY: the trampoline passes its own leaked, never-freed Site.
    let site: &'static Site = unsafe { &*site };
    // SAFETY: the stub passes a PtRegs on its stack, live and unaliased for this call.
    let regs = unsafe { &mut *regs };
    let list = site.list.load(Ordering::Acquire);
    // SAFETY: published lists are never freed (see `Site::list`).
    let Some(list) = (unsafe { list.as_ref() }) else {
        return;
    };
    let Some(_guard) = Reentry::enter() else {
        return;
    };
    let sp = regs.sp;
    for what in list.on_entry.iter() {
        run(what, regs);
    }
    if !list.on_return.is_empty() {
        hijack_return(site, sp);
    }
}

fn hijack_return(site: &'static Site, sp: u64) {
    let slot = sp as *mut u64;
    // SAFETY: at a function entry (the caller's contract) `[sp]` is the return address the
    // call pushed, on this thread's stack.
    let ret = unsafe { slot.read() };
    let pushed = with_shadow(|s| {
        s.frames(|s| {
            if s.capacity() == 0 {
                s.reserve(64);
            }
            s.push(Frame { ret, sp, site });
        })
    });
    if let Some(Some(())) = pushed {
        // SAFETY: as above; `on_return` gives the real address back when the call returns.
        unsafe { slot.write(stubs::return_stub() as u64) };
    }
}

/// Called by the return stub after a hijacked return; answers where to really return to.
pub(crate) extern "C" fn on_return(regs: *mut PtRegs) -> u64 {
    // SAFETY: the stub passes a PtRegs on its stack, live and unaliased for this call.
    let regs = unsafe { &mut *regs };
    let sp = regs.sp;
    let frame = with_shadow(|s| s.frames(|s| take_frame(s, sp)).flatten()).flatten();
    let Some(frame) = frame else {
        // We replaced a return address and lost the real one: there is nowhere correct to go.
        tracing::error!(
            sp = format_args!("{sp:#x}"),
            "uretprobe: no shadow-stack frame for this return; aborting"
        );
        std::process::abort();
    };
    regs.ip = frame.ret;
    let list = frame.site.list.load(Ordering::Acquire);
    // SAFETY: published lists are never freed (see `Site::list`).
    if let (Some(list), Some(_guard)) = (unsafe { list.as_ref() }, Reentry::enter()) {
        for what in list.on_return.iter() {
            run(what, regs);
        }
    }
    frame.ret
}

/// What a stack walk should read in place of `value`, found on this thread's stack at `slot`:
/// where a pending uretprobe replaced a return address with the return stub (or its site's
/// landing, once primed), the caller's real return address (as the kernel reports it in
/// user stacks); anything else as it is. Only this thread's pending calls are known, so
/// walk only this thread's stack with it.
pub fn original_return_address(slot: u64, value: u64) -> u64 {
    let stub = value == stubs::return_stub() as u64;
    if !stub && !patch::may_be_landing(value) {
        return value;
    }
    with_shadow(|s| {
        // The innermost pending call at that slot: a recursive call reuses no slot
        // while its caller's is still pending, but a frame left by longjmp may linger.
        s.frames(|s| {
            s.iter()
                .rev()
                .find(|f| {
                    f.sp == slot && (stub || value == f.site.landing.load(Ordering::Relaxed) as u64)
                })
                .map(|f| f.ret)
        })
        .flatten()
    })
    .flatten()
    .unwrap_or(value)
}

/// The frame of the call that just returned with stack pointer `sp`: its entry sp was
/// `sp - 8`. Frames above it on the same stack were left by longjmp and are dropped; frames
/// of other stacks (coroutines) are kept.
fn take_frame(shadow: &mut Vec<Frame>, sp: u64) -> Option<Frame> {
    if shadow.last().is_some_and(|f| f.sp + 8 == sp) {
        return shadow.pop();
    }
    let i = shadow.iter().rposition(|f| f.sp + 8 == sp)?;
    let frame = shadow.remove(i);
    let mut j = i;
    while j < shadow.len() {
        if shadow[j].sp < sp && sp - shadow[j].sp < (64 << 20) {
            shadow.remove(j);
        } else {
            j += 1;
        }
    }
    Some(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn nothing(_: *mut PtRegs, _: u64, _: u64) -> u64 {
        0
    }

    fn code_reading(regs_read: u64, kind: Kind, id: u64) -> Arc<Attached> {
        Arc::new(Attached {
            id: HookId(id),
            kind,
            action: Action::Code(CodeHandler {
                entry: nothing,
                arg: 0,
                owner: Arc::new(()),
                keeps_vector_registers: true,
                regs_read,
            }),
            failed: AtomicBool::new(false),
        })
    }

    /// The short save only for a lone entry handler of code reading none of r15, r14,
    /// rbp, orig_ax, cs and ss.
    #[test]
    fn the_short_save_is_for_lone_code_reading_only_what_it_fills_in() {
        use std::mem::offset_of;
        let word = |offset: usize| 1u64 << (offset / 8);
        let short = |entries: Vec<Arc<Attached>>| List::new(entries).direct.short_save != 0;
        let filled = [
            offset_of!(PtRegs, di),
            offset_of!(PtRegs, si),
            offset_of!(PtRegs, dx),
            offset_of!(PtRegs, cx),
            offset_of!(PtRegs, r8),
            offset_of!(PtRegs, r9),
            offset_of!(PtRegs, ax),
            offset_of!(PtRegs, bx),
            offset_of!(PtRegs, r12),
            offset_of!(PtRegs, r13),
            offset_of!(PtRegs, ip),
            offset_of!(PtRegs, sp),
            offset_of!(PtRegs, flags),
        ];
        assert!(short(vec![code_reading(0, Kind::Entry, 1)]));
        let all_filled = filled.iter().fold(0, |m, &o| m | word(o));
        assert!(short(vec![code_reading(all_filled, Kind::Entry, 1)]));
        for left_out in [
            offset_of!(PtRegs, r15),
            offset_of!(PtRegs, r14),
            offset_of!(PtRegs, bp),
            offset_of!(PtRegs, orig_ax),
            offset_of!(PtRegs, cs),
            offset_of!(PtRegs, ss),
        ] {
            assert!(
                !short(vec![code_reading(word(left_out), Kind::Entry, 1)]),
                "{left_out}"
            );
        }
        assert!(!short(vec![code_reading(u64::MAX, Kind::Entry, 1)]));
        // Not a lone entry handler: no direct call at all.
        assert!(!short(vec![
            code_reading(0, Kind::Entry, 1),
            code_reading(0, Kind::Entry, 2)
        ]));
        assert!(!short(vec![
            code_reading(0, Kind::Entry, 1),
            code_reading(0, Kind::Return, 2)
        ]));
    }

    #[test]
    fn refuses_data_addresses_and_its_own_stubs() {
        let data = Box::new([0xc3u8; 64]);
        let noop: Handler = Arc::new(|_| {});
        for addr in [
            data.as_ptr() as usize,
            0x1000,
            stubs::entry_stub(),
            stubs::return_stub(),
        ] {
            // SAFETY: every one of these is refused before anything is written.
            let err = unsafe { attach_uprobe(addr, noop.clone()) }.unwrap_err();
            assert!(
                matches!(err, AttachError::Unhookable { addr: a, .. } if a == addr),
                "{err}"
            );
        }
        assert_eq!(data[0], 0xc3);
    }

    static DUMMY: Site = Site {
        addr: 0,
        list: AtomicPtr::new(ptr::null_mut()),
        landing: AtomicUsize::new(0),
    };

    fn frame(sp: u64, ret: u64) -> Frame {
        Frame {
            ret,
            sp,
            site: &DUMMY,
        }
    }

    #[test]
    fn returns_match_their_own_frame_and_drop_longjmped_ones() {
        let mut s = vec![
            frame(0x7000, 1),
            frame(0x6000, 2),
            frame(0x5000, 3),
            frame(0x1000_0000_0000, 9),
        ];
        // The 0x5000 call was left by longjmp; the 0x6000 one returns.
        let f = take_frame(&mut s, 0x6008).unwrap();
        assert_eq!(f.ret, 2);
        let left: Vec<_> = s.iter().map(|f| f.ret).collect();
        assert_eq!(left, vec![1, 9]);
        assert!(take_frame(&mut s, 0x1234).is_none());
        assert_eq!(take_frame(&mut s, 0x7008).unwrap().ret, 1);
    }
}
