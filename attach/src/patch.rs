//! Machine-code work: reading and writing code without ever making it writable, relocating
//! a prologue into a trampoline, and swapping in the jump without a torn instruction.
//!
//! Code is written through `/proc/self/mem`, which the kernel lets a process use to write its
//! own read-only pages (copy-on-write, as a debugger's breakpoints are), so code pages stay
//! R-X throughout and no other thread ever finds its page unexecutable. The 5-byte jump goes
//! in the way the kernel's `text_poke_bp` does it: an `int3` first (one byte, so atomic), then
//! the jump's operand, then its opcode; a thread that reaches the site in between traps, and
//! our SIGTRAP handler sends it to the trampoline, which is equivalent to taking the jump.
//! The kernel patches one instruction that way; our jump may replace several, so before the
//! operand goes in, every other thread found between two of them is moved to the
//! instruction's copy in the trampoline (see `evacuate`), or the site stays a breakpoint.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, Once, OnceLock};

use iced_x86::{
    BlockEncoder, BlockEncoderOptions, Code, Decoder, DecoderOptions, FlowControl, Instruction,
    InstructionBlock, MemoryOperand, Mnemonic, OpKind, Register,
};

use crate::error::AttachError;
use crate::evacuate::{self, Interior};
use crate::maps;
use crate::signals::chain;

/// Length of `jmp rel32`, the patch written over a hooked address.
pub(crate) const JMP_LEN: usize = 5;
const PAGE: usize = 4096;
/// Trampolines stay this far inside ±2 GiB so every rel32 from or to them reaches.
const REACH: i64 = (1 << 31) - (16 << 20);

/// Opened afresh each time: a descriptor kept across `fork` would still write the parent.
fn mem_file() -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
}

/// Up to `len` bytes of code at `addr`, fewer if the mapping ends first; never faults.
pub fn read_code(addr: usize, len: usize) -> io::Result<Vec<u8>> {
    let mem = mem_file()?;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match mem.read_at(&mut buf[got..], (addr + got) as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if got > 0 && e.raw_os_error() == Some(libc::EIO) => break,
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

pub fn write_code(addr: usize, bytes: &[u8]) -> Result<(), AttachError> {
    mem_file()
        .and_then(|f| f.write_all_at(bytes, addr as u64))
        .map_err(|source| AttachError::Memory {
            action: "write code through /proc/self/mem",
            addr,
            source,
        })?;
    sync_cores();
    Ok(())
}

/// Makes every thread of this process serialize its instruction stream, so none runs a stale
/// copy of bytes we just changed. Best effort: without the system call, x86's coherent
/// instruction fetch still sees the store, only later.
fn sync_cores() {
    const REGISTER_SYNC_CORE: libc::c_long = 1 << 6;
    const SYNC_CORE: libc::c_long = 1 << 5;
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    // SAFETY: membarrier takes no pointers; an unsupported command only returns an error.
    let ok = *REGISTERED.get_or_init(
        || unsafe { libc::syscall(libc::SYS_membarrier, REGISTER_SYNC_CORE, 0, 0) } == 0,
    );
    if ok {
        // SAFETY: as above.
        unsafe { libc::syscall(libc::SYS_membarrier, SYNC_CORE, 0, 0) };
    }
}

/// Replaces the first bytes at `addr` with `jmp target`, where `interior` says where each
/// instruction the jump covers was copied to. The bytes after the 5th are left as they were,
/// so a thread already past the last covered instruction keeps running original code.
///
/// Answers what is there now: [`PatchKind::Breakpoint`] (the `int3` alone, which our
/// handler sends to `target` as well) when some thread may be stopped inside the covered
/// instructions and could not be moved out of them.
pub(crate) fn write_jump(
    addr: usize,
    target: usize,
    interior: &Interior,
) -> Result<PatchKind, AttachError> {
    let rel = rel32(addr + JMP_LEN, target).ok_or(AttachError::Unhookable {
        addr,
        reason: "trampoline out of rel32 reach".into(),
    })?;
    write_code(addr, &[0xcc])?;
    if interior.returns_inside {
        tracing::debug!(
            addr = format_args!("{addr:#x}"),
            "a call inside the instructions the jump would cover returns between them; \
             the site stays a breakpoint"
        );
        return Ok(PatchKind::Breakpoint);
    }
    if !evacuate::clear(addr, interior) {
        tracing::debug!(
            addr = format_args!("{addr:#x}"),
            "a thread may be stopped inside the instructions the jump would cover; \
             the site stays a breakpoint"
        );
        return Ok(PatchKind::Breakpoint);
    }
    write_code(addr + 1, &rel.to_le_bytes())?;
    write_code(addr, &[0xe9])?;
    Ok(PatchKind::Jump)
}

/// Puts a lone `int3` at `addr`, for good: every thread that reaches it traps, and our
/// SIGTRAP handler sends it to the trampoline. One byte, so no other instruction is touched
/// and no branch target can be overwritten.
pub(crate) fn write_breakpoint(addr: usize) -> Result<(), AttachError> {
    write_code(addr, &[0xcc])
}

/// Puts back the original bytes a patch replaced (all of a jump's, or a breakpoint's
/// one), under the same `int3` protocol.
///
/// No thread needs moving first, unlike in [`write_jump`]: a jump is one instruction, so
/// no thread can be stopped inside bytes 1 to 4, and none got in between the instructions
/// they held before (those were cleared before the jump went in, and the way in has been
/// the `int3` or the jump since). A site left a breakpoint had only its first byte changed,
/// and a thread still between the instructions after it runs them as they always were.
pub(crate) fn restore(addr: usize, original: &[u8]) -> Result<(), AttachError> {
    write_code(addr, &[0xcc])?;
    if original.len() > 1 {
        write_code(addr + 1, &original[1..])?;
    }
    write_code(addr, &original[..1])
}

fn rel32(from_next: usize, to: usize) -> Option<i32> {
    i32::try_from(to as i64 - from_next as i64).ok()
}

/// A site's trampoline, in its own page that is never unmapped: a thread may be inside it at
/// any time, even after the hook is gone.
pub(crate) struct Trampoline {
    pub entry: usize,
    /// Where a primed hijacked return lands (see [`PRIME_LEN`]); `None` for a trampoline
    /// built without the priming sequence.
    pub landing: Option<usize>,
    /// The bytes the patch replaces: [`JMP_LEN`] for a jump, one for a breakpoint.
    pub original: Vec<u8>,
    pub interior: Interior,
}

/// How a hooked address is patched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchKind {
    /// `jmp rel32` to the trampoline over the first 5 bytes: a few nanoseconds per hit.
    Jump,
    /// `int3` over the first byte, sent to the trampoline by the SIGTRAP handler: a signal
    /// delivery and return per hit, but it replaces one instruction only.
    Breakpoint,
}

impl PatchKind {
    /// How many bytes of the original code the patch replaces.
    pub(crate) fn len(self) -> usize {
        match self {
            PatchKind::Jump => JMP_LEN,
            PatchKind::Breakpoint => 1,
        }
    }
}

// Layout, from `entry`:
//   lea rsp, [rsp-128]           skip the red zone: probes at offsets may sit in leaf code
//   push qword [rip+site_slot]
//   call qword [rip+stub_slot]   the shared entry stub; `ret` there comes back here
//   lea rsp, [rsp+136]           drop &Site and the red zone; lea keeps the flags
//   <relocated prologue>
//   jmp <hooked address + stolen length>     (none when the prologue ends in a call, see
//                                             `relocate`)
//   site_slot: dq &Site
//   stub_slot: dq entry stub
const HEAD_LEN: usize = 25;

// A function entry's trampoline primes the return stack buffer for a hijacked return,
// between the head and the relocated prologue. The function-entry stub comes back with
// ZF set when it replaced the return address (flags are dead at a function entry):
//   jne prologue
//   lea rsp, [rsp+8]             drop the replaced return address (the stub keeps the real
//                                one on the shadow stack); lea keeps the flags
//   call prologue                pushes `landing` where the return address was, and in the
//                                return stack buffer
// landing:
//   jmp qword [rip+return_slot]  the primed return stub
// prologue:
//   ...
//   return_slot: dq primed return stub (after stub_slot)
// The function's `ret` then goes where the return stack buffer says, and the primed stub
// returns to the caller with a `ret` that meets the caller's own entry: both predicted,
// where a plain hijack mispredicts the function's `ret` (on the GPU machines' Intel host,
// a sixth of a uprobe + uretprobe pair's samples fall on the return stub's first
// instructions, and priming takes about 10 ns off the pair).
const PRIME_LEN: usize = 18;
const LANDING_AT: usize = HEAD_LEN + 12;

/// Whether `addr` is where a trampoline's landing could be (trampolines start pages): a
/// cheap first test before looking for the site it lands.
pub(crate) fn may_be_landing(addr: u64) -> bool {
    addr as usize % PAGE == LANDING_AT
}

/// What a patch at `addr` replaces: the instructions, decoded, and the patched bytes.
struct Prologue {
    stolen: Vec<Instruction>,
    original: Vec<u8>,
    /// The process's mappings when it was read, for placing the trampoline.
    maps: Vec<maps::Mapping>,
}

fn prologue(addr: usize, kind: PatchKind) -> Result<Prologue, AttachError> {
    let maps = maps::read_self().map_err(|source| AttachError::Memory {
        action: "read /proc/self/maps",
        addr,
        source,
    })?;
    let mapping = maps
        .iter()
        .find(|m| m.start <= addr && addr < m.end && m.exec)
        .ok_or_else(|| AttachError::Unhookable {
            addr,
            reason: "not in executable memory (is the address from this process?)".into(),
        })?;
    // Only what this mapping holds: the next one may be unrelated or missing.
    let code =
        read_code(addr, 32.min(mapping.end - addr)).map_err(|source| AttachError::Memory {
            action: "read code",
            addr,
            source,
        })?;
    let stolen = steal(addr as u64, &code, kind.len())
        .map_err(|reason| AttachError::Unhookable { addr, reason })?;
    let original = code[..kind.len()].to_vec();
    Ok(Prologue {
        stolen,
        original,
        maps,
    })
}

/// Appends to `buf` (which will live at `page`) the stolen prologue relocated, then a jump
/// back to the rest of the function at `addr`; answers where each stolen instruction went.
fn append_relocated(
    buf: &mut Vec<u8>,
    page: usize,
    addr: usize,
    stolen: &[Instruction],
) -> Result<Interior, AttachError> {
    let stolen_len: usize = stolen.iter().map(|i| i.len()).sum();
    let at = page + buf.len();
    let relocated = relocate(stolen, at as u64).map_err(|e| AttachError::Unhookable {
        addr,
        reason: format!("cannot relocate the prologue: {e}"),
    })?;
    let interior = Interior {
        len: stolen_len,
        boundaries: stolen
            .iter()
            .zip(&relocated.starts)
            .skip(1)
            .map(|(ins, start)| (ins.ip() as usize - addr, start.map_or(0, |s| at + s)))
            .collect(),
        returns_inside: stolen.split_last().is_some_and(|(_, before)| {
            before.iter().any(|i| {
                matches!(
                    i.flow_control(),
                    FlowControl::Call | FlowControl::IndirectCall
                )
            })
        }),
    };
    let falls_through = relocated.falls_through;
    buf.extend_from_slice(&relocated.code);
    let back = addr + stolen_len;
    let jmp_at = page + buf.len();
    match rel32(jmp_at + JMP_LEN, back) {
        _ if !falls_through => {}
        Some(rel) => {
            buf.push(0xe9);
            buf.extend_from_slice(&rel.to_le_bytes());
        }
        None => {
            buf.extend_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
            buf.extend_from_slice(&(back as u64).to_le_bytes());
        }
    }
    Ok(interior)
}

/// Copies `buf` into the fresh RW `page` and makes it RX for good.
fn seal(page: usize, buf: &[u8], addr: usize) -> Result<(), AttachError> {
    if buf.len() > PAGE {
        return Err(AttachError::Unhookable {
            addr,
            reason: "relocated prologue does not fit a page".into(),
        });
    }
    // SAFETY: `page` is a fresh private RW mapping of PAGE bytes that nothing else knows yet.
    unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), page as *mut u8, buf.len()) };
    // SAFETY: flips our own mapping from RW to RX; it is never writable again.
    if unsafe {
        libc::mprotect(
            page as *mut libc::c_void,
            PAGE,
            libc::PROT_READ | libc::PROT_EXEC,
        )
    } != 0
    {
        return Err(AttachError::Memory {
            action: "make the trampoline executable",
            addr: page,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The trampoline of a site at `addr`: its head calls `stub` with `site`, and, given
/// `primed_return`, primes hijacked returns for that return stub (see [`PRIME_LEN`]).
pub(crate) fn build_trampoline(
    addr: usize,
    site: usize,
    stub: usize,
    primed_return: Option<usize>,
    kind: PatchKind,
) -> Result<Trampoline, AttachError> {
    let Prologue {
        stolen,
        original,
        maps,
    } = prologue(addr, kind)?;
    let page = alloc_near(addr, &maps)?;
    let mut buf = Vec::with_capacity(128);
    buf.extend_from_slice(&[0x48, 0x8d, 0x64, 0x24, 0x80]);
    buf.extend_from_slice(&[0xff, 0x35, 0, 0, 0, 0]);
    buf.extend_from_slice(&[0xff, 0x15, 0, 0, 0, 0]);
    buf.extend_from_slice(&[0x48, 0x8d, 0xa4, 0x24, 0x88, 0, 0, 0]);
    debug_assert_eq!(buf.len(), HEAD_LEN);
    if primed_return.is_some() {
        // jne +16; lea rsp, [rsp+8]; call +6; jmp [rip+disp32] (filled in below).
        buf.extend_from_slice(&[0x75, (PRIME_LEN - 2) as u8]);
        buf.extend_from_slice(&[0x48, 0x8d, 0x64, 0x24, 0x08]);
        buf.extend_from_slice(&[0xe8, 6, 0, 0, 0]);
        buf.extend_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
        debug_assert_eq!(buf.len(), HEAD_LEN + PRIME_LEN);
    }
    let interior = append_relocated(&mut buf, page, addr, &stolen)?;
    while buf.len() % 8 != 0 {
        buf.push(0xcc);
    }
    let site_slot = buf.len();
    buf.extend_from_slice(&(site as u64).to_le_bytes());
    let stub_slot = buf.len();
    buf.extend_from_slice(&(stub as u64).to_le_bytes());
    // rip-relative displacements: from the end of each 6-byte instruction to its slot.
    buf[7..11].copy_from_slice(&((site_slot - 11) as i32).to_le_bytes());
    buf[13..17].copy_from_slice(&((stub_slot - 17) as i32).to_le_bytes());
    if let Some(primed) = primed_return {
        let return_slot = buf.len();
        buf.extend_from_slice(&(primed as u64).to_le_bytes());
        let disp_at = LANDING_AT + 2;
        buf[disp_at..disp_at + 4]
            .copy_from_slice(&((return_slot - (LANDING_AT + 6)) as i32).to_le_bytes());
    }
    seal(page, &buf, addr)?;
    tracing::debug!(
        addr = format_args!("{addr:#x}"),
        trampoline = format_args!("{page:#x}"),
        "built trampoline"
    );
    Ok(Trampoline {
        entry: page,
        landing: primed_return.map(|_| page + LANDING_AT),
        original,
        interior,
    })
}

/// The code of a detour, in a page of its own near the function, never unmapped.
pub(crate) struct DetourCode {
    /// `jmp [rip+0]; dq replacement`: where the patched function jumps.
    pub thunk: usize,
    /// The function as it was: its relocated prologue, then a jump to the rest of it.
    pub original_entry: usize,
    pub original: Vec<u8>,
    pub interior: Interior,
}

// Layout, from the page's start:
//   thunk:    jmp qword [rip+0]; dq replacement       (14 bytes, padded to 16)
//   original: <relocated prologue>; jmp <function + stolen length>
const THUNK_LEN: usize = 16;

pub(crate) fn build_detour(addr: usize, replacement: usize) -> Result<DetourCode, AttachError> {
    let Prologue {
        stolen,
        original,
        maps,
    } = prologue(addr, PatchKind::Jump)?;
    let page = alloc_near(addr, &maps)?;
    let mut buf = Vec::with_capacity(128);
    buf.extend_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    buf.extend_from_slice(&(replacement as u64).to_le_bytes());
    buf.resize(THUNK_LEN, 0xcc);
    let interior = append_relocated(&mut buf, page, addr, &stolen)?;
    seal(page, &buf, addr)?;
    Ok(DetourCode {
        thunk: page,
        original_entry: page + THUNK_LEN,
        original,
        interior,
    })
}

/// The stolen instructions encoded to run elsewhere.
struct Relocated {
    code: Vec<u8>,
    /// Whether the code falls through at its end (then the trampoline jumps back after it).
    falls_through: bool,
    /// For each stolen instruction, the offset in `code` of what replaces it; `None` where
    /// the encoder rewrote it into a sequence it does not locate (a `jrcxz`, say).
    starts: Vec<Option<usize>>,
}

/// The stolen instructions, encoded to run at `ip`.
///
/// A call that ends them becomes a push of its original return address and a jump to the
/// callee, so the callee returns straight into the hooked function, past the patched bytes,
/// as it would unhooked (and as a kernel uprobe emulates it). A return address inside the
/// trampoline would appear in every user stack taken below the call, where the kernel shows
/// the hooked function, and unwinders (C++ exceptions) would find no frame information for
/// it. A call whose operand reads the stack pointer, which the push moves, keeps returning
/// into the trampoline.
///
/// A thread is never between the parts of one replaced instruction, so only the start of
/// each replacement matters: the push that stands for the call is where a thread about to
/// call goes on.
fn relocate(stolen: &[Instruction], ip: u64) -> Result<Relocated, String> {
    let mut block = stolen.to_vec();
    let mut falls_through = true;
    if let Some(tail) = call_as_push_and_jump(stolen.last()) {
        block.pop();
        block.extend(tail);
        falls_through = false;
    }
    // One instruction at a time: an encoder given them all as one block also moves what
    // points at one of them (a `lea` of the function's own address, which the code then
    // calls or compares) to its copy, and the copy is not the function.
    let mut code = Vec::new();
    let mut starts = Vec::with_capacity(block.len());
    for ins in &block {
        starts.push(Some(code.len()));
        let encoded = BlockEncoder::encode(
            64,
            InstructionBlock::new(std::slice::from_ref(ins), ip + code.len() as u64),
            BlockEncoderOptions::NONE,
        )
        .map_err(|e| e.to_string())?;
        code.extend_from_slice(&encoded.code_buffer);
    }
    // The block holds the stolen instructions in order, the call's replacement starting at
    // the call's index.
    starts.truncate(stolen.len());
    Ok(Relocated {
        code,
        falls_through,
        starts,
    })
}

/// `push <return address>; jmp <callee>` for a near call, where that keeps its meaning.
fn call_as_push_and_jump(call: Option<&Instruction>) -> Option<[Instruction; 3]> {
    let call = call?;
    let jump = match call.code() {
        Code::Call_rel32_64 => Instruction::with_branch(Code::Jmp_rel32_64, call.near_branch64()),
        Code::Call_rm64 => {
            let reads_sp = (0..call.op_count()).any(|i| call.op_register(i) == Register::RSP)
                || call.memory_base() == Register::RSP;
            if reads_sp {
                return None;
            }
            let mut jump = *call;
            jump.set_code(Code::Jmp_rm64);
            Ok(jump)
        }
        _ => return None,
    }
    .ok()?;
    let ret = call.next_ip();
    // `push imm32` sign-extends; the high half is then written over. Neither touches flags.
    let push = Instruction::with1(Code::Pushq_imm32, ret as u32 as i32).ok()?;
    let high = Instruction::with2(
        Code::Mov_rm32_imm32,
        MemoryOperand::with_base_displ(Register::RSP, 4),
        (ret >> 32) as u32,
    )
    .ok()?;
    Some([push, high, jump])
}

/// Decodes whole instructions at `addr` until they cover the `len` patched bytes. After an
/// instruction that never falls through, only padding (nop, int3) may follow: anything else
/// may be the next function, which the jump must not overwrite.
fn steal(addr: u64, code: &[u8], patch_len: usize) -> Result<Vec<Instruction>, String> {
    // A function does not start with a breakpoint; a kernel uprobe (or a debugger) puts
    // one there, in every process that maps the file, while it is attached.
    if code.first() == Some(&0xcc) {
        return Err(
            "an int3 breakpoint is at the function's entry: a kernel uprobe or a debugger is attached there; detach it (or probe another function) and attach again"
                .into(),
        );
    }
    let mut decoder = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
    let mut out = Vec::new();
    let mut len = 0;
    let mut ended = false;
    while len < patch_len {
        if !decoder.can_decode() {
            return Err(format!("code ends before {patch_len} bytes"));
        }
        let ins = decoder.decode();
        if ins.is_invalid() {
            return Err(format!("cannot decode the instruction at {:#x}", ins.ip()));
        }
        if ended && !matches!(ins.mnemonic(), Mnemonic::Nop | Mnemonic::Int3) {
            return Err(
                "the function is shorter than the 5-byte jump and is not followed by padding"
                    .into(),
            );
        }
        if matches!(
            ins.flow_control(),
            FlowControl::Return
                | FlowControl::UnconditionalBranch
                | FlowControl::IndirectBranch
                | FlowControl::Interrupt
                | FlowControl::Exception
        ) {
            ended = true;
        }
        out.push(ins);
        len += ins.len();
    }
    let end = addr + len as u64;
    for ins in &out {
        if ins.op_count() > 0 && ins.op0_kind() == OpKind::NearBranch64 {
            let t = ins.near_branch64();
            if t > addr && t < end {
                return Err(format!(
                    "the instruction at {:#x} branches into the bytes the jump replaces",
                    ins.ip()
                ));
            }
        }
    }
    Ok(out)
}

/// A fresh RW page within rel32 reach of `addr`, in the nearest hole of the address space.
fn alloc_near(addr: usize, maps: &[maps::Mapping]) -> Result<usize, AttachError> {
    // SAFETY: sbrk(0) only reports the current program break.
    let brk = unsafe { libc::sbrk(0) } as usize;
    let candidates = candidates(addr, maps, brk);
    for c in candidates {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; it fails instead.
        let p = unsafe {
            libc::mmap(
                c as *mut libc::c_void,
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            continue;
        }
        if p as usize == c {
            return Ok(c);
        }
        // An old kernel took the address as a hint only and put the page elsewhere.
        // SAFETY: `p` is the page mmap just gave us, unused.
        unsafe { libc::munmap(p, PAGE) };
    }
    Err(AttachError::NoTrampolineSpace { addr })
}

/// Page addresses to try for a trampoline near `addr`, nearest first: both ends of every
/// hole within reach, so trampolines pack against existing mappings and holes last. Never
/// where the heap grows (after it, or from the program break up while there is no heap
/// yet) or just below the stack.
fn candidates(addr: usize, maps: &[maps::Mapping], brk: usize) -> Vec<usize> {
    const LOWEST: usize = 1 << 20;
    const USER_END: usize = 1 << 47;
    const BRK_ROOM: usize = 1 << 30;
    let mut out = Vec::new();
    let mut prev_end = LOWEST;
    let mut after_heap = false;
    for m in maps.iter().filter(|m| m.start < USER_END) {
        if m.start >= prev_end + PAGE {
            if !after_heap {
                out.push(prev_end);
            }
            if !m.path.starts_with("[stack") {
                out.push(m.start - PAGE);
            }
        }
        prev_end = prev_end.max(m.end);
        after_heap = m.path == "[heap]";
    }
    let distance = |c: usize| {
        (c as i64 - addr as i64)
            .abs()
            .max((c + PAGE) as i64 - addr as i64)
    };
    out.retain(|&c| distance(c) < REACH && !(brk <= c && c < brk.saturating_add(BRK_ROOM)));
    out.sort_by_key(|&c| distance(c));
    out.dedup();
    out
}

// Sites for the SIGTRAP handler, which reads them without locks: slots are only added,
// and a slot's address never changes (its target may: a function detoured again).
const MAX_TRAPS: usize = 4096;
static TRAP_COUNT: AtomicUsize = AtomicUsize::new(0);
static TRAP_ADDR: [AtomicUsize; MAX_TRAPS] = [const { AtomicUsize::new(0) }; MAX_TRAPS];
static TRAP_TO: [AtomicUsize; MAX_TRAPS] = [const { AtomicUsize::new(0) }; MAX_TRAPS];
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
/// The process's own SIGTRAP handler and flags, when it set them while its `rt_sigaction`
/// calls went through the system call hooks (which keep ours installed): what traps that
/// are not ours go to instead of `PREVIOUS`.
static APP_SIGTRAP: [AtomicUsize; 2] = [const { AtomicUsize::new(0) }; 2];
static APP_SIGTRAP_SET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether our SIGTRAP handler is installed (so the process's own disposition is kept
/// apart rather than replacing it).
pub fn trap_handler_installed() -> bool {
    PREVIOUS.get().is_some()
}

/// The process's own SIGTRAP disposition: handler and flags.
pub fn app_sigtrap() -> (usize, usize) {
    if APP_SIGTRAP_SET.load(Ordering::Acquire) {
        (
            APP_SIGTRAP[0].load(Ordering::Acquire),
            APP_SIGTRAP[1].load(Ordering::Acquire),
        )
    } else {
        PREVIOUS.get().map_or((libc::SIG_DFL, 0), |p| {
            (p.sa_sigaction, p.sa_flags as usize)
        })
    }
}

/// Records what the process asked for SIGTRAP, in place of installing it.
pub fn set_app_sigtrap(handler: usize, flags: usize) {
    APP_SIGTRAP[0].store(handler, Ordering::Release);
    APP_SIGTRAP[1].store(flags, Ordering::Release);
    APP_SIGTRAP_SET.store(true, Ordering::Release);
}

/// Which of our patchers owns the code at an address: a uprobe's hook site (for good once
/// made, as a thread may be inside its trampoline) or a detour (until it is removed). One
/// owner an address: the other's patch would overwrite its jump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SiteOwner {
    Hook,
    Detour,
}

static SITE_OWNERS: Mutex<BTreeMap<usize, SiteOwner>> = Mutex::new(BTreeMap::new());

/// Takes `addr` for `owner` (a second claim by the same owner is kept); the other owner,
/// when it holds it.
pub(crate) fn claim_site(addr: usize, owner: SiteOwner) -> Result<(), SiteOwner> {
    let mut owners = SITE_OWNERS.lock().unwrap_or_else(|e| e.into_inner());
    match *owners.entry(addr).or_insert(owner) {
        held if held == owner => Ok(()),
        other => Err(other),
    }
}

/// Gives `addr` back, when `owner` holds it.
pub(crate) fn release_site(addr: usize, owner: SiteOwner) {
    let mut owners = SITE_OWNERS.lock().unwrap_or_else(|e| e.into_inner());
    if owners.get(&addr) == Some(&owner) {
        owners.remove(&addr);
    }
}

/// Tells the SIGTRAP handler that a trap at `addr` means "go to `to`", before any `int3`
/// is written there. An address registered again (a function detoured anew) keeps its
/// slot and takes the new target.
pub fn register_trap(addr: usize, to: usize) -> Result<(), AttachError> {
    // Hooks and detours keep separate registries and may register at once.
    static ONE_WRITER: Mutex<()> = Mutex::new(());
    install_trap_handler()?;
    let _one = ONE_WRITER.lock().unwrap_or_else(|e| e.into_inner());
    let n = TRAP_COUNT.load(Ordering::Relaxed);
    if let Some(i) = (0..n).find(|&i| TRAP_ADDR[i].load(Ordering::Relaxed) == addr) {
        TRAP_TO[i].store(to, Ordering::Release);
        return Ok(());
    }
    if n == MAX_TRAPS {
        return Err(AttachError::Unhookable {
            addr,
            reason: format!("more than {MAX_TRAPS} hooked addresses"),
        });
    }
    TRAP_TO[n].store(to, Ordering::Relaxed);
    TRAP_ADDR[n].store(addr, Ordering::Relaxed);
    TRAP_COUNT.store(n + 1, Ordering::Release);
    Ok(())
}

/// Where a thread that took a SIGTRAP of `si_code` with `rip` goes on, if the trap is one
/// of ours: an `int3` (which the kernel reports as `SI_KERNEL`, with `rip` past it) at a
/// registered address. A SIGTRAP sent with kill, raise or sigqueue is not, wherever the
/// thread happens to be.
fn trap_target(si_code: libc::c_int, rip: usize) -> Option<usize> {
    if si_code != libc::SI_KERNEL {
        return None;
    }
    let at = rip.wrapping_sub(1);
    let n = TRAP_COUNT.load(Ordering::Acquire);
    (0..n)
        .find(|&i| TRAP_ADDR[i].load(Ordering::Relaxed) == at)
        .map(|i| TRAP_TO[i].load(Ordering::Acquire))
}

fn install_trap_handler() -> Result<(), AttachError> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid "no handler, empty mask" value.
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_sigtrap as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: as above, filled in by the kernel.
        let mut previous: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are to live sigaction values; the handler is async-signal-safe.
        if unsafe { libc::sigaction(libc::SIGTRAP, &action, &mut previous) } != 0 {
            result = Err(AttachError::Memory {
                action: "install the SIGTRAP handler",
                addr: 0,
                source: io::Error::last_os_error(),
            });
            return;
        }
        let _ = PREVIOUS.set(previous);
    });
    result
}

extern "C" fn on_sigtrap(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let uc = ctx.cast::<libc::ucontext_t>();
    // SAFETY: the kernel hands an SA_SIGINFO handler a valid ucontext_t.
    let rip = unsafe { &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] };
    // SAFETY: the kernel hands an SA_SIGINFO handler a valid siginfo_t.
    let code = unsafe { (*info).si_code };
    if let Some(to) = trap_target(code, *rip as usize) {
        *rip = to as i64;
        return;
    }
    // Not ours: behave as if we had never been installed.
    if APP_SIGTRAP_SET.load(Ordering::Acquire) {
        // SAFETY: a zeroed sigaction is a valid value; only handler and flags matter.
        let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
        let (handler, flags) = app_sigtrap();
        prev.sa_sigaction = handler;
        prev.sa_flags = flags as libc::c_int;
        // SAFETY: as this handler was called, for the handler the process asked for.
        unsafe { chain(&prev, sig, info, ctx) };
    } else if let Some(prev) = PREVIOUS.get() {
        // SAFETY: as this handler was called, for the handler it replaced.
        unsafe { chain(prev, sig, info, ctx) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(code: &[u8], ip: u64) -> Vec<Instruction> {
        Decoder::with_ip(64, code, ip, DecoderOptions::NONE)
            .into_iter()
            .collect()
    }

    #[test]
    fn steals_whole_instructions_covering_the_jump() {
        // push rbp; mov rbp, rsp; sub rsp, 0x10
        let code = [0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10];
        let got = steal(0x1000, &code, JMP_LEN).unwrap();
        assert_eq!(
            got.iter().map(|i| i.len()).collect::<Vec<_>>(),
            vec![1, 3, 4]
        );
    }

    #[test]
    fn short_functions_need_padding_after_them() {
        // lea eax, [rdi+rsi]; ret; then int3 padding, then nop padding
        assert!(steal(0x1000, &[0x8d, 0x04, 0x37, 0xc3, 0xcc, 0xcc], JMP_LEN).is_ok());
        assert!(steal(0x1000, &[0x8d, 0x04, 0x37, 0xc3, 0x66, 0x90], JMP_LEN).is_ok());
        // ret; push rbp: the next function starts right after.
        // A kernel uprobe's breakpoint at the entry is named as such.
        let err = steal(0x1000, &[0xcc, 0x55, 0x48, 0x89, 0xe5, 0x90], JMP_LEN).unwrap_err();
        assert!(err.contains("kernel uprobe"), "{err}");
        let err = steal(0x1000, &[0xc3, 0x55, 0x48, 0x89, 0xe5], JMP_LEN).unwrap_err();
        assert!(err.contains("shorter"), "{err}");
    }

    #[test]
    fn refuses_branches_into_the_patched_bytes() {
        // xor eax, eax; inc eax (at 0x1002); jne 0x1002
        let err = steal(0x1000, &[0x31, 0xc0, 0xff, 0xc0, 0x75, 0xfc], JMP_LEN).unwrap_err();
        assert!(err.contains("branches into"), "{err}");
    }

    #[test]
    fn rip_relative_operands_keep_their_target_when_moved() {
        // mov rax, [rip+0x100] at 0x40_0000 reads 0x40_0107.
        let code = [0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00];
        let stolen = steal(0x40_0000, &code, JMP_LEN).unwrap();
        let new_ip = 0x7000_0000u64;
        let out = BlockEncoder::encode(
            64,
            InstructionBlock::new(&stolen, new_ip),
            BlockEncoderOptions::NONE,
        )
        .unwrap();
        let moved = decode_all(&out.code_buffer, new_ip);
        assert_eq!(moved.len(), 1);
        assert!(moved[0].is_ip_rel_memory_operand());
        assert_eq!(moved[0].ip_rel_memory_address(), 0x40_0107);
    }

    #[test]
    fn a_call_in_the_prologue_returns_into_the_hooked_function() {
        // push rbp; mov rbp, rsp; call 0x40_1000 (returns to 0x40_0009)
        let code = [0x55, 0x48, 0x89, 0xe5, 0xe8, 0xf7, 0x0f, 0x00, 0x00];
        let stolen = steal(0x40_0000, &code, JMP_LEN).unwrap();
        let new_ip = 0x7000_0000u64;
        let relocated = relocate(&stolen, new_ip).unwrap();
        assert!(!relocated.falls_through);
        // A thread about to call goes on at the push that stands for the call.
        assert_eq!(relocated.starts, vec![Some(0), Some(1), Some(4)]);
        let moved = decode_all(&relocated.code, new_ip);
        let mnemonics: Vec<_> = moved.iter().map(|i| i.mnemonic()).collect();
        assert_eq!(
            mnemonics,
            vec![
                Mnemonic::Push,
                Mnemonic::Mov,
                Mnemonic::Push,
                Mnemonic::Mov,
                Mnemonic::Jmp
            ]
        );
        let low = moved[2].immediate(0) as u32 as u64;
        assert_eq!(moved[3].memory_base(), Register::RSP);
        assert_eq!(moved[3].memory_displacement64(), 4);
        let high = moved[3].immediate(1);
        assert_eq!(high << 32 | low, 0x40_0009);
        assert_eq!(moved[4].near_branch64(), 0x40_1000);

        // call rax: the same, through the register.
        let code = [0x55, 0x48, 0x89, 0xe5, 0xff, 0xd0];
        let relocated = relocate(&steal(0x40_0000, &code, JMP_LEN).unwrap(), new_ip).unwrap();
        assert!(!relocated.falls_through);
        let moved = decode_all(&relocated.code, new_ip);
        assert_eq!(moved.last().unwrap().code(), Code::Jmp_rm64);
        assert_eq!(moved.last().unwrap().op0_register(), Register::RAX);

        // call [rsp+8] reads the stack the push would move: kept as a call.
        let code = [0x55, 0x48, 0x89, 0xe5, 0xff, 0x54, 0x24, 0x08];
        let relocated = relocate(&steal(0x40_0000, &code, JMP_LEN).unwrap(), new_ip).unwrap();
        assert!(relocated.falls_through);
        assert_eq!(
            decode_all(&relocated.code, new_ip)
                .last()
                .unwrap()
                .mnemonic(),
            Mnemonic::Call
        );
    }

    #[test]
    fn a_trap_goes_where_its_latest_registration_says_and_only_from_an_int3() {
        // An address nothing hooks: only the table is looked at.
        static SPOT: [u8; 2] = [0xcc, 0xc3];
        let addr = SPOT.as_ptr() as usize;
        let slots = || {
            (0..TRAP_COUNT.load(Ordering::Acquire))
                .filter(|&i| TRAP_ADDR[i].load(Ordering::Relaxed) == addr)
                .count()
        };
        register_trap(addr, 0x1111).unwrap();
        assert_eq!(trap_target(libc::SI_KERNEL, addr + 1), Some(0x1111));
        // Detoured anew: the same slot, the new target.
        register_trap(addr, 0x2222).unwrap();
        assert_eq!(slots(), 1);
        assert_eq!(trap_target(libc::SI_KERNEL, addr + 1), Some(0x2222));
        assert_eq!(trap_target(libc::SI_KERNEL, addr), None);
        // Sent by kill, raise or sigqueue: not a trap of ours wherever the thread is.
        for code in [libc::SI_USER, libc::SI_TKILL, libc::SI_QUEUE] {
            assert_eq!(trap_target(code, addr + 1), None, "si_code {code}");
        }
    }

    #[test]
    fn every_boundary_inside_the_jump_maps_to_its_copy() {
        // push rdi; pop rax; nop; nop; inc rax; ret: boundaries at 1, 2, 3 and 4.
        let here = interior_target as *const () as usize;
        let t = build_trampoline(here, 0, 0, None, PatchKind::Jump).unwrap();
        let copy = HEAD_LEN + t.entry;
        assert_eq!(t.interior.len, 7);
        assert!(!t.interior.returns_inside, "no call among them");
        assert_eq!(
            t.interior.boundaries,
            (1..=4).map(|k| (k, copy + k)).collect::<Vec<_>>()
        );
        // Each copy is the instruction that was at its boundary.
        for &(k, to) in &t.interior.boundaries {
            let original = decode_all(&read_code(here + k, 3).unwrap(), 0)[0];
            let moved = decode_all(&read_code(to, 3).unwrap(), 0)[0];
            assert_eq!(moved.code(), original.code(), "offset {k}");
        }
        // Rip-relative operands move, and their copies with them.
        let code = [0x55, 0x48, 0x8b, 0x05, 0x00, 0x01, 0x00, 0x00];
        let relocated = relocate(&steal(0x40_0000, &code, JMP_LEN).unwrap(), 0x7000_0000).unwrap();
        assert_eq!(relocated.starts, vec![Some(0), Some(1)]);
        // `push rax; lea rax, [rip - 8]`: the function's own address, as recursion through a
        // pointer takes it, stays the function's, not its copy's.
        let code = [0x50, 0x48, 0x8d, 0x05, 0xf8, 0xff, 0xff, 0xff];
        let relocated = relocate(&steal(0x40_0000, &code, JMP_LEN).unwrap(), 0x7000_0000).unwrap();
        let moved = decode_all(&relocated.code, 0x7000_0000);
        assert_eq!(moved[1].mnemonic(), Mnemonic::Lea);
        assert_eq!(moved[1].memory_displacement64(), 0x40_0000);
    }

    #[test]
    fn trampolines_are_near_executable_and_never_writable() {
        let here = steal_target as *const () as usize;
        let t = build_trampoline(here, 0x1234_5678, 0x9abc_def0, None, PatchKind::Jump).unwrap();
        assert!((t.entry as i64 - here as i64).abs() < REACH);
        let maps = maps::read_self().unwrap();
        let m = maps
            .iter()
            .find(|m| m.start <= t.entry && t.entry < m.end)
            .unwrap();
        assert!(m.exec);
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{:x}-", m.start)))
            .unwrap();
        assert!(
            line.starts_with(&format!("{:x}-{:x} r-xp", m.start, m.end)),
            "{line}"
        );
        // The head pushes the site and calls the stub through its slots.
        let head = read_code(t.entry, HEAD_LEN).unwrap();
        let ins = decode_all(&head, t.entry as u64);
        let mnemonics: Vec<_> = ins.iter().map(|i| i.mnemonic()).collect();
        assert_eq!(
            mnemonics,
            vec![Mnemonic::Lea, Mnemonic::Push, Mnemonic::Call, Mnemonic::Lea]
        );
        let slot = |i: &Instruction| {
            u64::from_le_bytes(
                read_code(i.ip_rel_memory_address() as usize, 8)
                    .unwrap()
                    .try_into()
                    .unwrap(),
            )
        };
        assert_eq!(slot(&ins[1]), 0x1234_5678);
        assert_eq!(slot(&ins[2]), 0x9abc_def0);
        assert_eq!(t.original[..], read_code(here, JMP_LEN).unwrap()[..]);
        assert_eq!(t.landing, None);
    }

    #[test]
    fn a_priming_trampoline_calls_its_prologue_from_just_before_its_landing() {
        let here = interior_target as *const () as usize;
        let t = build_trampoline(
            here,
            0x1234_5678,
            0x9abc_def0,
            Some(0x5555_aaaa),
            PatchKind::Jump,
        )
        .unwrap();
        let landing = t.landing.unwrap();
        assert!(may_be_landing(landing as u64));
        assert!(!may_be_landing(landing as u64 + 1));
        let prologue = t.entry + HEAD_LEN + PRIME_LEN;
        let code = read_code(t.entry, HEAD_LEN + PRIME_LEN).unwrap();
        let ins = decode_all(&code, t.entry as u64);
        let mnemonics: Vec<_> = ins.iter().map(|i| i.mnemonic()).collect();
        assert_eq!(
            mnemonics,
            vec![
                Mnemonic::Lea,
                Mnemonic::Push,
                Mnemonic::Call,
                Mnemonic::Lea,
                Mnemonic::Jne,
                Mnemonic::Lea,
                Mnemonic::Call,
                Mnemonic::Jmp
            ]
        );
        // Without a hijack (ZF clear), straight on to the prologue.
        assert_eq!(ins[4].near_branch_target() as usize, prologue);
        // With one: the return address pops off, and the call pushes the landing in its
        // place, on the stack and in the return stack buffer, on its way to the prologue.
        assert_eq!(ins[5].memory_displacement64(), 8);
        assert_eq!(ins[6].near_branch_target() as usize, prologue);
        assert_eq!(ins[6].next_ip() as usize, landing);
        // The landing jumps to the primed return stub through its slot.
        assert_eq!(ins[7].ip() as usize, landing);
        let target = read_code(ins[7].ip_rel_memory_address() as usize, 8).unwrap();
        assert_eq!(u64::from_le_bytes(target.try_into().unwrap()), 0x5555_aaaa);
        // The prologue's copies are where the interior map says, after the priming code.
        assert_eq!(
            t.interior.boundaries,
            (1..=4).map(|k| (k, prologue + k)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn trampoline_candidates_hug_mappings_and_avoid_heap_and_stack() {
        let text = "\
555555554000-555555556000 r--p 00000000 fd:01 1 /bin/x
555555556000-555555558000 r-xp 00002000 fd:01 1 /bin/x
555555558000-55555555a000 rw-p 00000000 00:00 0
555555600000-555555621000 rw-p 00000000 00:00 0 [heap]
7ffff7d00000-7ffff7d28000 r-xp 00000000 fd:01 2 /lib/libc.so.6
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]
";
        let maps = maps::parse(text);
        let addr = 0x555555556100;
        let brk = 0x555555621000;
        let c = candidates(addr, &maps, brk);
        // Right below the binary first, then right after its bss, then below the heap.
        assert_eq!(c, vec![0x555555553000, 0x55555555a000, 0x5555555ff000]);
        // Without a heap yet, the program break's neighbourhood is left alone.
        let no_heap: Vec<_> = maps
            .iter()
            .filter(|m| m.path != "[heap]")
            .cloned()
            .collect();
        let c = candidates(addr, &no_heap, 0x55555555a000);
        assert_eq!(c, vec![0x555555553000]);
        // libc is out of reach of the binary; its own holes serve it, but not below the stack.
        let c = candidates(0x7ffff7d00100, &maps, brk);
        assert_eq!(c, vec![0x7ffff7cff000, 0x7ffff7d28000]);
    }

    std::arch::global_asm!(
        ".text",
        ".globl bpftime_patch_interior_target",
        "bpftime_patch_interior_target:",
        "push rdi",
        "pop rax",
        "nop",
        "nop",
        "inc rax",
        "ret",
    );

    extern "C" {
        #[link_name = "bpftime_patch_interior_target"]
        fn interior_target(x: u64) -> u64;
    }

    #[inline(never)]
    extern "C" fn steal_target(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(31).rotate_left(7)
    }
}
