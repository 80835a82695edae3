//! The assembly stubs every hook shares.
//!
//! An entry stub is called by a site's trampoline (see `patch`) with the stack
//! `[rsp] = return into the trampoline, [rsp+8] = &Site`, and 128 bytes of red zone skipped
//! below the hooked code's stack pointer. `return_stub` is where a function returns to when a
//! uretprobe replaced its return address. They save every general register, build a
//! [`PtRegs`] on the stack, call into a handler with a 16-byte aligned stack, and restore
//! everything from the `PtRegs`, so a handler's register changes take effect.
//!
//! xmm0-15 (arguments and return values of floating-point code, and, under GCC's
//! `-fipa-ra`, values a caller keeps across a call to a local function) are saved around
//! anything that may change them. ymm/zmm upper halves and x87 state are not saved:
//! handlers are Rust or JIT code built without AVX, and saving them with `xsave` would cost
//! more than the whole hook.
//!
//! Two entry stubs. `entry_stub` serves any instruction and keeps the flags: OF comes back
//! through an `add` that overflows exactly when it was set, then SF, ZF, AF, PF and CF through
//! `sahf`, and DF by `std` when it was set, without `popfq`, which alone cost 14 ns per hit
//! (measured on our AMD EPYC VM, a third of the hook then). TF, AC and the other system
//! flags are left as they are, which user code does not change in practice.
//! `function_entry_stub` serves function entries, where the flags are dead and DF is clear
//! (System V ABI): it reads the status flags for `PtRegs::flags` with `lahf`/`seto` and
//! restores none, which saves `pushfq` and the restore sequence, about 2 ns per hit.
//!
//! `return_stub` reads the flags as `function_entry_stub` does and restores none either: a
//! hijacked return is a function's return, where the status flags are dead and DF is clear
//! too; `pushfq` and the restore sequence cost about 2 ns of each uretprobe hit.
//!
//! `primed_return_stub` is the same, reached from a trampoline that primed the return
//! (see `patch::PRIME_LEN`): `function_entry_stub` comes back with ZF set when the return
//! address was replaced, the trampoline's `call` then leaves its landing in the return stack
//! buffer, and this stub ends with a `ret` the caller's own entry predicts.
//!
//! At a function entry whose only handler is code reading none of r15, r14, rbp,
//! orig_ax, cs and ss (as the verifier tells of a program), `function_entry_stub` saves
//! only the other words of the frame: the stores are most of a counting uprobe's cost
//! (six stores and three loads fewer took a counting uprobe from 12.6 to 9.7 ns per call
//! on our AMD EPYC VM).
//!
//! When a site's only handler is code (`hook::DirectCall`), the entry stubs test and set
//! the per-thread flag in static TLS themselves and call the code directly, saving the
//! vector registers only if it may change them: a counting program then costs neither the
//! Rust dispatch, nor a `__tls_get_addr` call, nor 32 vector loads and stores. When a
//! site's handlers are a uprobe and a uretprobe of code, or a uretprobe alone
//! (`hook::DirectPair`), the stubs run them and push and pop the pending call on the
//! thread's shadow stack themselves (vector registers saved, as the code may call Rust
//! helpers); that took funclatency from 115 to 104 ns per call on our AMD EPYC VM. Every
//! other case goes through `hook::on_entry` and `hook::on_return`.
//!
//! [`PtRegs`]: crate::PtRegs

use crate::hook::{on_entry, on_return};

use crate::hook::{STATIC_TLS_FLAG, STATIC_TLS_SHADOW};

extern "C" {
    #[link_name = "bpftime_attach_entry_stub"]
    fn entry_stub_symbol();
    #[link_name = "bpftime_attach_function_entry_stub"]
    fn function_entry_stub_symbol();
    #[link_name = "bpftime_attach_return_stub"]
    fn return_stub_symbol();
    #[link_name = "bpftime_attach_primed_return_stub"]
    fn primed_return_stub_symbol();
}

pub(crate) fn entry_stub() -> usize {
    entry_stub_symbol as *const () as usize
}

pub(crate) fn function_entry_stub() -> usize {
    function_entry_stub_symbol as *const () as usize
}

pub(crate) fn return_stub() -> usize {
    return_stub_symbol as *const () as usize
}

pub(crate) fn primed_return_stub() -> usize {
    primed_return_stub_symbol as *const () as usize
}

// Frame, from rsp up: PtRegs (168 bytes), xmm0-15 (256), the flags `pushfq` saved (unused
// by the function-entry stub, which leaves the slot empty), then the caller's words: at 432
// the return into the trampoline (or the return stub's slot), at 440 &Site.

// rax, rcx and the flags, as `pushfq` saved them.
macro_rules! save_pushed_flags {
    () => {
        "
        pushfq
        sub rsp, 424
        mov [rsp + 80], rax
        mov [rsp + 88], rcx
        mov rax, [rsp + 424]
        mov [rsp + 144], rax
        "
    };
}

// rax, rcx and the status flags, read without `pushfq` (and without `sub`, which would
// change them): `lahf` gives SF ZF AF PF CF,
// `seto` OF; IF and the always-one bit 1 are set, DF is clear at a function entry.
macro_rules! read_flags {
    () => {
        "
        lea rsp, [rsp - 432]
        mov [rsp + 80], rax
        mov [rsp + 88], rcx
        lahf
        seto al
        movzx ecx, ah
        and ecx, 0xd5
        movzx eax, al
        shl eax, 11
        or eax, ecx
        or eax, 0x202
        mov [rsp + 144], rax
        "
    };
}

// The short save's registers (besides rax and rcx): those a call may change, and the
// ones the stubs use themselves.
macro_rules! save_short {
    () => {
        "
        mov [rsp + 16], r13
        mov [rsp + 24], r12
        mov [rsp + 40], rbx
        mov [rsp + 48], r11
        mov [rsp + 56], r10
        mov [rsp + 64], r9
        mov [rsp + 72], r8
        mov [rsp + 96], rdx
        mov [rsp + 104], rsi
        mov [rsp + 112], rdi
        "
    };
}

// The other general registers and the constant fields; `sp` and `ip` are each stub's.
macro_rules! save_registers {
    () => {
        concat!(
            save_short!(),
            "
        mov [rsp + 0], r15
        mov [rsp + 8], r14
        mov [rsp + 32], rbp
        mov qword ptr [rsp + 120], -1
        mov qword ptr [rsp + 136], 0x33
        mov qword ptr [rsp + 160], 0x2b
        "
        )
    };
}

// Addressed from rbx, which holds the frame while rsp is aligned for a call.
macro_rules! save_vectors {
    () => {
        "
        .irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        movups [rbx + 168 + 16 * \\i], xmm\\i
        .endr
        "
    };
}

macro_rules! restore_vectors {
    () => {
        "
        .irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
        movups xmm\\i, [rsp + 168 + 16 * \\i]
        .endr
        "
    };
}

macro_rules! restore_flags {
    () => {
        "
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
        "
    };
}

// What `save_short` and `read_flags` saved, and the frame dropped.
macro_rules! restore_short {
    () => {
        "
        mov r13, [rsp + 16]
        mov r12, [rsp + 24]
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

macro_rules! restore_registers {
    () => {
        concat!(
            "
        mov r15, [rsp + 0]
        mov r14, [rsp + 8]
        mov rbp, [rsp + 32]
        ",
            restore_short!()
        )
    };
}

// A direct call of the code of the list in r12 (`hook::DirectCall`), with the frame in
// rbx and the per-thread flag's offset in r13: none while handlers run on this thread
// (then to `$skip`), the vector registers saved around it when the code may change them;
// after it, on to `$skip` unless they were saved, which the caller then restores.
macro_rules! direct_call {
    ($skip:literal) => {
        concat!(
            "
        cmp byte ptr fs:[r13], 0
        jne ",
            $skip,
            "f
        mov byte ptr fs:[r13], 1
        cmp qword ptr [r12 + 16], 0
        je 30f
        ",
            save_vectors!(),
            "
    30:
        mov rdi, rbx
        mov rsi, [r12 + 8]
        xor edx, edx
        and rsp, -16
        call qword ptr [r12]
        mov rsp, rbx
        mov byte ptr fs:[r13], 0
        cmp qword ptr [r12 + 16], 0
        je ",
            $skip,
            "f
        "
        )
    };
}

// This thread's shadow stack in r14 and its length in rax, or on to `$bail` when it is not
// in static TLS or something is changing it.
macro_rules! free_shadow_stack {
    ($bail:literal) => {
        concat!(
            "
        mov r14, qword ptr [rip + {shadow}]
        test r14, r14
        jz ",
            $bail,
            "f
        mov r14, qword ptr fs:[r14]
        test r14, r14
        jz ",
            $bail,
            "f
        cmp qword ptr [r14], 0
        jne ",
            $bail,
            "f
        mov rax, [r14 + 8]
        "
        )
    };
}

// A lone code pair's entry (`hook::DirectPair`), with the list in r12, the flag's offset in
// r13 and the frame in rbx, the vector registers saved: unless the list is no such pair,
// the flag or the thread's shadow stack is not in static TLS, the stack is busy or full
// (then on to 50, the general path, with nothing done), runs the entry code if any and
// pushes the pending call (its return address, its entry sp and the Site) on the shadow
// stack, the return address replaced by the return stub's, as `hook::on_entry` does; a
// thread running handlers already runs none (on to 6). r14 holds the shadow stack, r15
// the entry sp (both saved in the frame).
macro_rules! pair_entry {
    () => {
        concat!(
            "
        cmp qword ptr [r12 + 48], 0
        je 50f
        test r13, r13
        jz 50f
        cmp byte ptr fs:[r13], 0
        jne 6f
        ",
            free_shadow_stack!("50"),
            "
        cmp rax, [r14 + 16]
        jae 50f
        mov byte ptr fs:[r13], 1
        mov r15, [rbx + 152]
        mov rax, [r12 + 32]
        test rax, rax
        jz 51f
        mov rdi, rbx
        mov rsi, [r12 + 40]
        xor edx, edx
        and rsp, -16
        call rax
        mov rsp, rbx
    51:
        mov qword ptr [r14], 1
        mov rax, [r14 + 8]
        lea rcx, [rax + rax * 2]
        mov rdx, [r14 + 24]
        lea rdx, [rdx + rcx * 8]
        mov rcx, [r15]
        mov [rdx], rcx
        mov [rdx + 8], r15
        mov rcx, [rbx + 440]
        mov [rdx + 16], rcx
        inc rax
        mov [r14 + 8], rax
        mov qword ptr [r14], 0
        lea rcx, [rip + bpftime_attach_return_stub]
        mov [r15], rcx
        mov byte ptr fs:[r13], 0
        jmp 6f
        "
        )
    };
}

// A lone code pair's return, with the frame in rbx and the vector registers saved: unless
// the flag or the shadow stack is not in static TLS, the stack is busy or empty, its top
// frame is not this return's (longjmp left frames above it: `hook::take_frame` sorts that
// out), the site's list is no such pair, or this thread runs handlers already (then on to
// 60, the general path, with nothing done), pops the frame, sets `ip` and the slot the
// final jump reads to the real return address, and runs the return code.
macro_rules! pair_return {
    () => {
        concat!(
            "
        mov r13, qword ptr [rip + {flag}]
        test r13, r13
        jz 60f
        ",
            free_shadow_stack!("60"),
            "
        test rax, rax
        jz 60f
        lea rcx, [rax + rax * 2 - 3]
        mov rdx, [r14 + 24]
        lea rdx, [rdx + rcx * 8]
        mov rcx, [rdx + 8]
        add rcx, 8
        cmp rcx, [rbx + 152]
        jne 60f
        mov rsi, [rdx + 16]
        mov r12, [rsi + 8]
        test r12, r12
        jz 60f
        cmp qword ptr [r12 + 48], 0
        je 60f
        cmp byte ptr fs:[r13], 0
        jne 60f
        mov qword ptr [r14], 1
        mov r15, [rdx]
        dec rax
        mov [r14 + 8], rax
        mov qword ptr [r14], 0
        mov [rbx + 128], r15
        mov [rbx + 432], r15
        mov byte ptr fs:[r13], 1
        mov rdi, rbx
        mov rsi, [r12 + 56]
        xor edx, edx
        and rsp, -16
        call qword ptr [r12 + 48]
        mov rsp, rbx
        mov byte ptr fs:[r13], 0
        jmp 61f
        "
        )
    };
}

// An entry stub's body, between saving the flags and restoring them. Across calls, r12
// holds the handler list, r13 the flag's offset and rbx the frame (callee-saved, and
// already in PtRegs).
// The list is never freed, so reading it again after the call is safe even if it was
// replaced meanwhile.
macro_rules! dispatch {
    () => {
        concat!(
            "
        lea rax, [rsp + 576]
        mov [rsp + 152], rax
        mov rdi, [rsp + 440]
        mov rax, [rdi]
        mov [rsp + 128], rax
        mov r12, [rdi + 8]
        test r12, r12
        jz 7f
        mov rbx, rsp
        mov r13, qword ptr [rip + {flag}]
        mov rax, [r12]
        test rax, rax
        jz 5f
        test r13, r13
        jz 5f
        ",
            direct_call!("7"),
            "
        jmp 6f
    5:
        ",
            save_vectors!(),
            pair_entry!(),
            "
    50:
        mov rsi, rbx
        and rsp, -16
        call {on_entry}
        mov rsp, rbx
    6:
        ",
            restore_vectors!(),
            "
    7:
        "
        )
    };
}

// A hijacked return's work, from the slot for the real return address to the registers
// restored with that address in the slot; each return stub then goes there its own way.
macro_rules! return_stub_body {
    () => {
        concat!(
            // A slot for the real return address, filled from what `on_return` answers.
            "push 0\n",
            read_flags!(),
            save_registers!(),
            // The caller's sp after the return: above PtRegs+xmm (424), flags (8), the slot (8).
            "
        lea rax, [rsp + 440]
        mov [rsp + 152], rax
        mov rbx, rsp
        ",
            save_vectors!(),
            // Handlers are C-ABI code, which expects DF clear.
            "cld\n",
            pair_return!(),
            "
    60:
        mov rdi, rsp
        and rsp, -16
        call {on_return}
        mov rsp, rbx
        mov [rsp + 432], rax
    61:
        ",
            restore_vectors!(),
            restore_registers!(),
        )
    };
}

std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl bpftime_attach_entry_stub",
    ".hidden bpftime_attach_entry_stub",
    ".type bpftime_attach_entry_stub, @function",
    "bpftime_attach_entry_stub:",
    save_pushed_flags!(),
    save_registers!(),
    // Handlers are C-ABI code, which expects DF clear.
    "cld",
    dispatch!(),
    restore_flags!(),
    restore_registers!(),
    "ret",
    ".size bpftime_attach_entry_stub, . - bpftime_attach_entry_stub",
    "",
    ".p2align 4",
    ".globl bpftime_attach_function_entry_stub",
    ".hidden bpftime_attach_function_entry_stub",
    ".type bpftime_attach_function_entry_stub, @function",
    "bpftime_attach_function_entry_stub:",
    read_flags!(),
    // The short save, when the site's only handler is code that reads nothing else (see
    // `hook::SHORT_SAVE_WORDS`) and the flag is in static TLS; the list read here is the
    // one the call uses, so a list published meanwhile cannot meet a short frame.
    "
        mov rax, [rsp + 440]
        mov rcx, [rax + 8]
        test rcx, rcx
        jz 20f
        cmp qword ptr [rcx + 24], 0
        je 20f
        cmp qword ptr [rip + {flag}], 0
        je 20f
        ",
    save_short!(),
    "
        mov rax, [rax]
        mov [rsp + 128], rax
        lea rax, [rsp + 576]
        mov [rsp + 152], rax
        mov r12, rcx
        mov rbx, rsp
        mov r13, qword ptr [rip + {flag}]
        ",
    direct_call!("23"),
    restore_vectors!(),
    "
    23:
        ",
    restore_short!(),
    // No return to hijack on this path: ZF clear for the trampoline.
    "
        test rsp, rsp
        ret
    20:
        ",
    save_registers!(),
    dispatch!(),
    // ZF set when the return address was replaced (by `pair_entry` or `hook::on_entry`),
    // for the trampoline to prime the return; the restores below are moves and leas.
    "
        mov rax, [rsp + 152]
        mov rax, [rax]
        lea rcx, [rip + bpftime_attach_return_stub]
        cmp rax, rcx
        ",
    restore_registers!(),
    "ret",
    ".size bpftime_attach_function_entry_stub, . - bpftime_attach_function_entry_stub",
    "",
    ".p2align 4",
    ".globl bpftime_attach_return_stub",
    ".hidden bpftime_attach_return_stub",
    ".type bpftime_attach_return_stub, @function",
    "bpftime_attach_return_stub:",
    return_stub_body!(),
    // Not `ret`: the hooked function's own `ret` already consumed its return-stack-buffer
    // entry, so a second `ret` would be mispredicted here and leave every later return of the
    // caller chain mispredicted too. An indirect jump is predicted from its own history. The
    // slot is inside the red zone, which signal delivery skips, so it survives until read.
    "lea rsp, [rsp + 8]",
    "jmp qword ptr [rsp - 8]",
    ".size bpftime_attach_return_stub, . - bpftime_attach_return_stub",
    "",
    ".p2align 4",
    ".globl bpftime_attach_primed_return_stub",
    ".hidden bpftime_attach_primed_return_stub",
    ".type bpftime_attach_primed_return_stub, @function",
    "bpftime_attach_primed_return_stub:",
    return_stub_body!(),
    // The trampoline's `call` put its landing in the return stack buffer above the caller's
    // own entry, and the function's `ret` took the landing's: this `ret` meets the caller's.
    "ret",
    ".size bpftime_attach_primed_return_stub, . - bpftime_attach_primed_return_stub",
    on_entry = sym on_entry,
    on_return = sym on_return,
    flag = sym STATIC_TLS_FLAG,
    shadow = sym STATIC_TLS_SHADOW,
);
