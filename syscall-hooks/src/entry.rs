//! The assembly every hooked system call goes through, and the only code whose own
//! `syscall` instructions Syscall User Dispatch lets through (it lies between
//! `bpftime_syscalls_start` and `bpftime_syscalls_end`).
//!
//! Two ways in, both with the system call's number in rax and its arguments in rdi, rsi,
//! rdx, r10, r8 and r9, as the `syscall` instruction has them:
//! - `bpftime_syscall_entry_call`, from a rewritten site: its `call *%rax` went to the
//!   number's address in the page at 0, whose sled comes here; `[rsp]` is the return
//!   address, just past the site. The call wrote over the 8 bytes below the caller's stack
//!   pointer, which is why only functions that keep nothing in their red zone are rewritten.
//! - `bpftime_syscall_entry_signal`, from the SIGSYS handler, which sets rcx to the return
//!   address (rcx is the return address after a real `syscall` too). The red zone is
//!   skipped first, so this way in changes nothing of the caller's.
//!
//! Either way the frame below holds `[skip, return]`, `skip` being the bytes between it
//! and the caller's stack pointer (0 or 128). Nothing to run for the number: the system
//! call is made at once and the caller resumes with rcx = the return address and r11
//! clobbered, as after a real one. Otherwise the registers are saved as the kernel's
//! `struct pt_regs` (what a raw tracepoint's first argument points at), xmm0-15 beside
//! them, `syscall::dispatch` runs the programs watching the call, and the call is made
//! here (where no frame made before it has to be returned through, which after a system
//! call is mispredicted) before `syscall::returned` runs those watching its return; but
//! a call whose effects dispatch keeps (signal masks and dispositions) is made by
//! dispatch, and one that must be made from the caller's own stack is made there: `rt_sigreturn` (which reads its frame at the stack pointer) and the calls
//! that make a process or thread (whose child resumes on the caller's stack or on a stack
//! of its own, never on ours). Those are made here with every register as the caller had
//! it; the return address waits in the thread's static TLS (the child's, for a thread with
//! TLS of its own: `dispatch` wrote it there), and a child arms dispatch for itself before
//! it resumes.
//!
//! The status flags are not kept across a hooked call: compilers never keep them across
//! inline assembly on x86. ymm/zmm upper halves and x87 state are not saved around the
//! programs (see `stubs`).

use crate::{
    dispatch, returned, returned_from_fork, returned_in_child, EXIT, FLAGS, SITES, SITE_SLOTS,
    TLS_OFFSET,
};

/// What `dispatch` answers: the call was made (or emulated), its result is in the frame.
pub(crate) const DONE: u64 = 0;
/// Make it from the caller's stack, the thread's own signal frame being there.
pub(crate) const SIGRETURN: u64 = 1;
/// Make it from the caller's stack, frame-free, and resume the child.
pub(crate) const FORK: u64 = 2;
/// Make it here, then run the programs watching its return.
pub(crate) const EXECUTE: u64 = 3;

extern "C" {
    #[link_name = "bpftime_syscalls_start"]
    fn start_symbol();
    #[link_name = "bpftime_syscalls_end"]
    fn end_symbol();
    #[link_name = "bpftime_syscall_entry_call"]
    fn entry_call_symbol();
    #[link_name = "bpftime_syscall_entry_signal"]
    fn entry_signal_symbol();
    #[link_name = "bpftime_syscall_restorer"]
    fn restorer_symbol();
    /// Makes system call `nr` with up to six arguments, from inside the allowed range.
    #[link_name = "bpftime_syscall_raw"]
    pub(crate) fn raw(nr: u64, a1: u64, a2: u64, a3: u64, a4: u64, a5: u64, a6: u64) -> i64;
}

/// The code Syscall User Dispatch lets make system calls: `[start, end)`.
pub(crate) fn allowed_range() -> (usize, usize) {
    (
        start_symbol as *const () as usize,
        end_symbol as *const () as usize,
    )
}

pub(crate) fn entry_call() -> usize {
    entry_call_symbol as *const () as usize
}

pub(crate) fn entry_signal() -> usize {
    entry_signal_symbol as *const () as usize
}

/// Where a signal handler of ours returns through `rt_sigreturn`: inside the range, so
/// that the call is let through while the thread's selector blocks its others.
pub(crate) fn restorer() -> usize {
    restorer_symbol as *const () as usize
}

// Frame, from rsp up: PtRegs (168 bytes), xmm0-15 (256), 8 bytes of padding, then the
// entry's words: at 432 `skip`, at 440 the return address; the caller's stack pointer is
// at 448 + skip.
macro_rules! save_frame {
    () => {
        "
        sub rsp, 432
        mov [rsp + 0], r15
        mov [rsp + 8], r14
        mov [rsp + 16], r13
        mov [rsp + 24], r12
        mov [rsp + 32], rbp
        mov [rsp + 40], rbx
        mov [rsp + 56], r10
        mov [rsp + 64], r9
        mov [rsp + 72], r8
        mov [rsp + 96], rdx
        mov [rsp + 104], rsi
        mov [rsp + 112], rdi
        mov [rsp + 120], rax
        mov qword ptr [rsp + 80], -38
        mov rcx, [rsp + 440]
        mov [rsp + 88], rcx
        mov [rsp + 128], rcx
        pushfq
        pop rcx
        mov [rsp + 48], rcx
        mov [rsp + 144], rcx
        mov qword ptr [rsp + 136], 0x33
        mov qword ptr [rsp + 160], 0x2b
        mov rcx, [rsp + 432]
        lea rcx, [rsp + rcx + 448]
        mov [rsp + 152], rcx
        .irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        movups [rsp + 168 + 16 * \\i], xmm\\i
        .endr
        "
    };
}

// Everything `save_frame` saved but rax, rcx and r11, and the vectors.
/// Calls the Rust function the asm operand `$f` names from wherever the stack pointer is,
/// on a 16-aligned frame below it, with xmm0-15 kept around the call; rbx (which the
/// caller saved) holds the stack pointer meanwhile.
macro_rules! call_keeping_xmm {
    ($f:literal) => {
        concat!(
            "
        mov rbx, rsp
        and rsp, -16
        sub rsp, 256
        .irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        movups [rsp + 16 * \\i], xmm\\i
        .endr
        cld
        call {",
            $f,
            "}
        .irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        movups xmm\\i, [rsp + 16 * \\i]
        .endr
        mov rsp, rbx
    "
        )
    };
}

macro_rules! restore_frame {
    () => {
        "
        .irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        movups xmm\\i, [rsp + 168 + 16 * \\i]
        .endr
        mov r15, [rsp + 0]
        mov r14, [rsp + 8]
        mov r13, [rsp + 16]
        mov r12, [rsp + 24]
        mov rbp, [rsp + 32]
        mov rbx, [rsp + 40]
        mov r10, [rsp + 56]
        mov r9, [rsp + 64]
        mov r8, [rsp + 72]
        mov rdx, [rsp + 96]
        mov rsi, [rsp + 104]
        mov rdi, [rsp + 112]
        "
    };
}

std::arch::global_asm!(
    ".pushsection .text.bpftime_syscalls,\"ax\",@progbits",
    ".p2align 6",
    ".globl bpftime_syscalls_start",
    ".hidden bpftime_syscalls_start",
    "bpftime_syscalls_start:",
    "",
    ".globl bpftime_syscall_entry_signal",
    ".hidden bpftime_syscall_entry_signal",
    "bpftime_syscall_entry_signal:",
    "
        lea rsp, [rsp - 128]
        push rcx
        push 128
        jmp 10f
    ",
    ".p2align 4",
    ".globl bpftime_syscall_entry_call",
    ".hidden bpftime_syscall_entry_call",
    "bpftime_syscall_entry_call:",
    // Only a call from a rewritten site may come in here: the page at 0 is also where a
    // call through a null function pointer lands, which must not make a system call.
    "
        push rdx
        mov r11, [rsp + 8]
        movabs rcx, 0x9e3779b97f4a7c15
        imul rcx, r11
        shr rcx, 64 - {site_bits}
        lea rdx, [rip + {sites}]
    1:
        cmp [rdx + rcx * 8], r11
        je 2f
        cmp qword ptr [rdx + rcx * 8], 0
        je 3f
        inc ecx
        and ecx, {site_slots} - 1
        jmp 1b
    3:
        ud2
    2:
        pop rdx
        push 0
    10:
        cmp rax, {flag_count}
        jae 20f
        lea r11, [rip + {flags}]
        cmp byte ptr [r11 + rax], 0
        jne 20f
        syscall
        pop r11
        pop rcx
        lea rsp, [rsp + r11]
        jmp rcx
    20:
    ",
    save_frame!(),
    "
        mov rbx, rsp
        and rsp, -16
        mov rdi, rbx
        cld
        call {dispatch}
        mov rsp, rbx
        cmp rax, {execute}
        je 25f
        cmp rax, {fork}
        je 40f
        cmp rax, {sigreturn}
        je 30f
        jmp 26f
    25:
        mov rdi, [rsp + 112]
        mov rsi, [rsp + 104]
        mov rdx, [rsp + 96]
        mov r10, [rsp + 56]
        mov r8, [rsp + 72]
        mov r9, [rsp + 64]
        mov rax, [rsp + 120]
        syscall
        mov [rsp + 80], rax
        mov rax, [rsp + 120]
        cmp rax, {flag_count}
        jae 26f
        lea r11, [rip + {flags}]
        test byte ptr [r11 + rax], {exit}
        jz 26f
        mov rdi, rsp
        and rsp, -16
        call {returned}
        mov rsp, rbx
    26:
    ",
    restore_frame!(),
    "
        mov rax, [rsp + 80]
        add rsp, 432
        pop r11
        pop rcx
        lea rsp, [rsp + r11]
        jmp rcx
    30:
        mov rax, [rsp + 120]
        mov rsp, [rsp + 152]
        syscall
        ud2
    40:
    ",
    restore_frame!(),
    "
        mov rax, [rsp + 120]
        mov rsp, [rsp + 152]
        syscall
        test rax, rax
        jz 50f
    ",
    // The parent, or a failed call: its exit programs, on a frame below the red zone.
    "
        lea rsp, [rsp - 128]
        push rdi
        push rsi
        push rdx
        push r8
        push r9
        push r10
        push rax
        push rbx
        mov rdi, rax
    ",
    call_keeping_xmm!("returned_from_fork"),
    "
        pop rbx
        pop rax
        pop r10
        pop r9
        pop r8
        pop rdx
        pop rsi
        pop rdi
        lea rsp, [rsp + 128]
        mov r11, qword ptr [rip + {tls}]
        jmp qword ptr fs:[r11 + 8]
    ",
    // The child: arms dispatch for itself if its parent was armed (its selector byte is
    // in its own TLS: at the thread pointer, which `fs:0` holds, plus the offset), runs
    // the programs watching the call's return in it (as the kernel does, with 0), on a
    // frame below the red zone of whatever stack it has, then resumes at the return
    // address with rax 0 and every other register as the call left it.
    "
    50:
        lea rsp, [rsp - 128]
        push rdi
        push rsi
        push rdx
        push r10
        push r8
        push r9
        mov r11, qword ptr [rip + {tls}]
        cmp byte ptr fs:[r11 + 1], 0
        je 51f
        mov r8, fs:[0]
        add r8, r11
        mov byte ptr [r8], 1
        mov eax, 157
        mov edi, 59
        mov esi, 1
        lea rdx, [rip + bpftime_syscalls_start]
        lea r10, [rip + bpftime_syscalls_end]
        sub r10, rdx
        syscall
    51:
        push rbx
    ",
    call_keeping_xmm!("returned_in_child"),
    "
        pop rbx
        pop r9
        pop r8
        pop r10
        pop rdx
        pop rsi
        pop rdi
        lea rsp, [rsp + 128]
        xor eax, eax
        mov r11, qword ptr [rip + {tls}]
        jmp qword ptr fs:[r11 + 8]
    ",
    ".p2align 4",
    ".globl bpftime_syscall_raw",
    ".hidden bpftime_syscall_raw",
    "bpftime_syscall_raw:",
    // Returns by a jump: the kernel may have emptied the return stack buffer, and a `ret`
    // would then be mispredicted (about 40 ns on our AMD EPYC VM).
    "
        mov rax, rdi
        mov rdi, rsi
        mov rsi, rdx
        mov rdx, rcx
        mov r10, r8
        mov r8, r9
        mov r9, [rsp + 8]
        syscall
        pop rcx
        jmp rcx
    ",
    ".p2align 4",
    ".globl bpftime_syscall_restorer",
    ".hidden bpftime_syscall_restorer",
    "bpftime_syscall_restorer:",
    "
        mov eax, 15
        syscall
        ud2
    ",
    // The kernel checks the address after a `syscall`: the range must hold the byte after
    // the last one.
    ".globl bpftime_syscalls_end",
    ".hidden bpftime_syscalls_end",
    "bpftime_syscalls_end:",
    "ud2",
    ".popsection",
    sites = sym SITES,
    site_bits = const SITE_BITS,
    site_slots = const SITE_SLOTS,
    flags = sym FLAGS,
    flag_count = const crate::NR_LIMIT,
    dispatch = sym dispatch,
    returned_from_fork = sym returned_from_fork,
    returned_in_child = sym returned_in_child,
    tls = sym TLS_OFFSET,
    fork = const FORK,
    sigreturn = const SIGRETURN,
    execute = const EXECUTE,
    exit = const EXIT,
    returned = sym returned,
);

const SITE_BITS: u32 = SITE_SLOTS.trailing_zeros();
