//! Whether compiled code leaves the vector registers alone, so that a hook may skip saving
//! them around it (see `JitProgram::keeps_vector_registers`).

use iced_x86::{Decoder, DecoderOptions, InstructionInfoFactory, Register};

extern "C" {
    #[link_name = "bpftime_jit_call_keeping_vectors"]
    fn call_keeping_vectors_symbol();
}

/// `r0 = wrapper(r1, r2, r3, r4, r5, helper)`: calls `helper(r1, .., r5)` with xmm0-15
/// saved around it. Helpers are Rust code, free to use the vector registers; through this
/// wrapper, the rare slow paths of inlined map operations leave them as they were.
pub(crate) fn call_keeping_vectors() -> u64 {
    call_keeping_vectors_symbol as *const () as u64
}

std::arch::global_asm!(
    ".text",
    ".p2align 4",
    ".globl bpftime_jit_call_keeping_vectors",
    ".hidden bpftime_jit_call_keeping_vectors",
    ".type bpftime_jit_call_keeping_vectors, @function",
    "bpftime_jit_call_keeping_vectors:",
    "push rbp",
    "mov rbp, rsp",
    "sub rsp, 256",
    "and rsp, -16",
    ".irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "movaps [rsp + 16 * \\i], xmm\\i",
    ".endr",
    "call r9",
    ".irp i, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15",
    "movaps xmm\\i, [rsp + 16 * \\i]",
    ".endr",
    "leave",
    "ret",
    ".size bpftime_jit_call_keeping_vectors, . - bpftime_jit_call_keeping_vectors",
);

/// Whether any instruction of `code` (machine code loaded at `ip`) reads or writes a
/// vector, MMX or x87 register, explicitly or implicitly. Undecodable bytes count as yes.
pub(crate) fn touches_vector_registers(code: &[u8], ip: u64) -> bool {
    let mut decoder = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    for insn in &mut decoder {
        if insn.is_invalid() {
            return true;
        }
        let used = info.info(&insn);
        if used
            .used_registers()
            .iter()
            .any(|r| is_vector(r.register()))
        {
            return true;
        }
    }
    false
}

fn is_vector(r: Register) -> bool {
    r.is_xmm() || r.is_ymm() || r.is_zmm() || r.is_mm() || r.is_st() || r.is_k()
}
