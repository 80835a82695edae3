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
    "movaps [rsp + 0], xmm0",
    "movaps [rsp + 16], xmm1",
    "movaps [rsp + 32], xmm2",
    "movaps [rsp + 48], xmm3",
    "movaps [rsp + 64], xmm4",
    "movaps [rsp + 80], xmm5",
    "movaps [rsp + 96], xmm6",
    "movaps [rsp + 112], xmm7",
    "movaps [rsp + 128], xmm8",
    "movaps [rsp + 144], xmm9",
    "movaps [rsp + 160], xmm10",
    "movaps [rsp + 176], xmm11",
    "movaps [rsp + 192], xmm12",
    "movaps [rsp + 208], xmm13",
    "movaps [rsp + 224], xmm14",
    "movaps [rsp + 240], xmm15",
    "call r9",
    "movaps xmm0, [rsp + 0]",
    "movaps xmm1, [rsp + 16]",
    "movaps xmm2, [rsp + 32]",
    "movaps xmm3, [rsp + 48]",
    "movaps xmm4, [rsp + 64]",
    "movaps xmm5, [rsp + 80]",
    "movaps xmm6, [rsp + 96]",
    "movaps xmm7, [rsp + 112]",
    "movaps xmm8, [rsp + 128]",
    "movaps xmm9, [rsp + 144]",
    "movaps xmm10, [rsp + 160]",
    "movaps xmm11, [rsp + 176]",
    "movaps xmm12, [rsp + 192]",
    "movaps xmm13, [rsp + 208]",
    "movaps xmm14, [rsp + 224]",
    "movaps xmm15, [rsp + 240]",
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
