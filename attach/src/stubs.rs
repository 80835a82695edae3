//! The two assembly stubs every hook shares.
//!
//! `entry_stub` is called by a site's trampoline (see `patch`) with the stack
//! `[rsp] = return into the trampoline, [rsp+8] = &Site`, and 128 bytes of red zone skipped
//! below the hooked code's stack pointer. `return_stub` is where a function returns to when a
//! uretprobe replaced its return address. Both save every general register, the flags and
//! xmm0-15 (arguments and return values of floating-point code), build a [`PtRegs`] on the
//! stack, call into Rust with a 16-byte aligned stack, and restore everything from the
//! `PtRegs`, so a handler's register changes take effect. ymm/zmm upper halves and x87 state
//! are not saved: handlers are Rust code built without AVX, and saving them with `xsave`
//! would cost more than the whole hook.
//!
//! Flags come back without `popfq`, which alone cost 14 ns per hit (measured on our AMD EPYC
//! VM, a third of the hook): OF through an `add` that overflows exactly when it was set, then
//! SF, ZF, AF, PF and CF through `sahf`, and DF by `std` when it was set. TF, AC and the other
//! system flags are left as they are, which user code does not change in practice.
//!
//! [`PtRegs`]: crate::PtRegs

use crate::hook::{on_entry, on_return};

extern "C" {
    #[link_name = "bpftime_attach_entry_stub"]
    fn entry_stub_symbol();
    #[link_name = "bpftime_attach_return_stub"]
    fn return_stub_symbol();
}

pub(crate) fn entry_stub() -> usize {
    entry_stub_symbol as *const () as usize
}

pub(crate) fn return_stub() -> usize {
    return_stub_symbol as *const () as usize
}

// Frame, from rsp up: PtRegs (168 bytes), xmm0-15 (256), flags (8), then the caller's words.
macro_rules! save_state {
    () => {
        "
        pushfq
        sub rsp, 424
        mov [rsp + 0], r15
        mov [rsp + 8], r14
        mov [rsp + 16], r13
        mov [rsp + 24], r12
        mov [rsp + 32], rbp
        mov [rsp + 40], rbx
        mov [rsp + 48], r11
        mov [rsp + 56], r10
        mov [rsp + 64], r9
        mov [rsp + 72], r8
        mov [rsp + 80], rax
        mov [rsp + 88], rcx
        mov [rsp + 96], rdx
        mov [rsp + 104], rsi
        mov [rsp + 112], rdi
        movups [rsp + 168], xmm0
        movups [rsp + 184], xmm1
        movups [rsp + 200], xmm2
        movups [rsp + 216], xmm3
        movups [rsp + 232], xmm4
        movups [rsp + 248], xmm5
        movups [rsp + 264], xmm6
        movups [rsp + 280], xmm7
        movups [rsp + 296], xmm8
        movups [rsp + 312], xmm9
        movups [rsp + 328], xmm10
        movups [rsp + 344], xmm11
        movups [rsp + 360], xmm12
        movups [rsp + 376], xmm13
        movups [rsp + 392], xmm14
        movups [rsp + 408], xmm15
        mov rax, [rsp + 424]
        mov [rsp + 144], rax
        mov qword ptr [rsp + 120], -1
        mov qword ptr [rsp + 128], 0
        mov qword ptr [rsp + 136], 0x33
        mov qword ptr [rsp + 160], 0x2b
        "
    };
}

macro_rules! restore_state {
    () => {
        "
        movups xmm0, [rsp + 168]
        movups xmm1, [rsp + 184]
        movups xmm2, [rsp + 200]
        movups xmm3, [rsp + 216]
        movups xmm4, [rsp + 232]
        movups xmm5, [rsp + 248]
        movups xmm6, [rsp + 264]
        movups xmm7, [rsp + 280]
        movups xmm8, [rsp + 296]
        movups xmm9, [rsp + 312]
        movups xmm10, [rsp + 328]
        movups xmm11, [rsp + 344]
        movups xmm12, [rsp + 360]
        movups xmm13, [rsp + 376]
        movups xmm14, [rsp + 392]
        movups xmm15, [rsp + 408]
        mov rax, [rsp + 144]
        bt eax, 10
        jnc 3f
        std
    3:
        shr eax, 4
        and al, 0x80
        add al, 0x80
        mov ah, byte ptr [rsp + 144]
        sahf
        mov r15, [rsp + 0]
        mov r14, [rsp + 8]
        mov r13, [rsp + 16]
        mov r12, [rsp + 24]
        mov rbp, [rsp + 32]
        mov rbx, [rsp + 40]
        mov r11, [rsp + 48]
        mov r10, [rsp + 56]
        mov r9, [rsp + 64]
        mov r8, [rsp + 72]
        mov rax, [rsp + 80]
        mov rcx, [rsp + 88]
        mov rdx, [rsp + 96]
        mov rsi, [rsp + 104]
        mov rdi, [rsp + 112]
        lea rsp, [rsp + 432]
        "
    };
}

// rbx is callee-saved, so it carries the unaligned rsp across the call into Rust.
std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl bpftime_attach_entry_stub",
    ".hidden bpftime_attach_entry_stub",
    ".type bpftime_attach_entry_stub, @function",
    "bpftime_attach_entry_stub:",
    save_state!(),
    // The hooked code's sp: above PtRegs+xmm (424), flags (8), return (8), &Site (8), red zone (128).
    "lea rax, [rsp + 576]",
    "mov [rsp + 152], rax",
    "mov rdi, [rsp + 440]",
    "mov rsi, rsp",
    "mov rbx, rsp",
    "and rsp, -16",
    "cld",
    "call {on_entry}",
    "mov rsp, rbx",
    restore_state!(),
    "ret",
    ".size bpftime_attach_entry_stub, . - bpftime_attach_entry_stub",
    "",
    ".p2align 4",
    ".globl bpftime_attach_return_stub",
    ".hidden bpftime_attach_return_stub",
    ".type bpftime_attach_return_stub, @function",
    "bpftime_attach_return_stub:",
    // A slot for the real return address, filled from what `on_return` answers.
    "push 0",
    save_state!(),
    // The caller's sp after the return: above PtRegs+xmm (424), flags (8), the slot (8).
    "lea rax, [rsp + 440]",
    "mov [rsp + 152], rax",
    "mov rdi, rsp",
    "mov rbx, rsp",
    "and rsp, -16",
    "cld",
    "call {on_return}",
    "mov rsp, rbx",
    "mov [rsp + 432], rax",
    restore_state!(),
    // Not `ret`: the hooked function's own `ret` already consumed its return-stack-buffer
    // entry, so a second `ret` would be mispredicted here and leave every later return of the
    // caller chain mispredicted too. An indirect jump is predicted from its own history. The
    // slot is inside the red zone, which signal delivery skips, so it survives until read.
    "lea rsp, [rsp + 8]",
    "jmp qword ptr [rsp - 8]",
    ".size bpftime_attach_return_stub, . - bpftime_attach_return_stub",
    on_entry = sym on_entry,
    on_return = sym on_return,
);
