//! Opcode fields, as the kernel's `linux/bpf_common.h` and `linux/bpf.h` number them.

// Classes.
pub const LD: u8 = 0x00;
pub const LDX: u8 = 0x01;
pub const ST: u8 = 0x02;
pub const STX: u8 = 0x03;
pub const ALU: u8 = 0x04;
pub const JMP: u8 = 0x05;
pub const JMP32: u8 = 0x06;
pub const ALU64: u8 = 0x07;

// Sizes (load/store).
pub const SIZE_MASK: u8 = 0x18;
pub const W: u8 = 0x00;
pub const H: u8 = 0x08;
pub const B: u8 = 0x10;
pub const DW: u8 = 0x18;

// Modes (load/store).
pub const MODE_MASK: u8 = 0xe0;
pub const IMM: u8 = 0x00;
pub const ABS: u8 = 0x20;
pub const IND: u8 = 0x40;
pub const MEM: u8 = 0x60;
/// Sign-extending load (`ldxs*`, ISA v4).
pub const MEMSX: u8 = 0x80;
pub const ATOMIC: u8 = 0xc0;

// Source operand (ALU/JMP).
pub const SRC_MASK: u8 = 0x08;
pub const K: u8 = 0x00;
pub const X: u8 = 0x08;

// ALU operations.
pub const OP_MASK: u8 = 0xf0;
pub const ADD: u8 = 0x00;
pub const SUB: u8 = 0x10;
pub const MUL: u8 = 0x20;
pub const DIV: u8 = 0x30;
pub const OR: u8 = 0x40;
pub const AND: u8 = 0x50;
pub const LSH: u8 = 0x60;
pub const RSH: u8 = 0x70;
pub const NEG: u8 = 0x80;
pub const MOD: u8 = 0x90;
pub const XOR: u8 = 0xa0;
pub const MOV: u8 = 0xb0;
pub const ARSH: u8 = 0xc0;
/// Byte swap; in class ALU the source bit picks big (`X`) or little (`K`) endian,
/// in class ALU64 it is an unconditional swap (ISA v4).
pub const END: u8 = 0xd0;

// Jump operations.
pub const JA: u8 = 0x00;
pub const JEQ: u8 = 0x10;
pub const JGT: u8 = 0x20;
pub const JGE: u8 = 0x30;
pub const JSET: u8 = 0x40;
pub const JNE: u8 = 0x50;
pub const JSGT: u8 = 0x60;
pub const JSGE: u8 = 0x70;
pub const CALL: u8 = 0x80;
pub const EXIT: u8 = 0x90;
pub const JLT: u8 = 0xa0;
pub const JLE: u8 = 0xb0;
pub const JSLT: u8 = 0xc0;
pub const JSLE: u8 = 0xd0;

// Atomic operations (in `imm` of an `ATOMIC` store).
pub const FETCH: i32 = 0x01;
pub const ATOMIC_ADD: i32 = 0x00;
pub const ATOMIC_OR: i32 = 0x40;
pub const ATOMIC_AND: i32 = 0x50;
pub const ATOMIC_XOR: i32 = 0xa0;
pub const ATOMIC_XCHG: i32 = 0xe0 | FETCH;
pub const ATOMIC_CMPXCHG: i32 = 0xf0 | FETCH;

// `src` of a `CALL`.
pub const CALL_HELPER: u8 = 0;
/// bpf-to-bpf call; `imm` is the pc-relative target.
pub const CALL_PSEUDO: u8 = 1;
/// Call a kernel function by BTF id (not served in userspace).
pub const CALL_KFUNC: u8 = 2;

// `src` of an `lddw`.
pub const PSEUDO_MAP_FD: u8 = 1;
pub const PSEUDO_MAP_VALUE: u8 = 2;
pub const PSEUDO_BTF_ID: u8 = 3;
pub const PSEUDO_FUNC: u8 = 4;
pub const PSEUDO_MAP_IDX: u8 = 5;
pub const PSEUDO_MAP_IDX_VALUE: u8 = 6;

/// First slot of a 64-bit immediate load.
pub const LD_DW_IMM: u8 = LD | IMM | DW;
/// `exit`.
pub const EXIT_INSN: u8 = JMP | EXIT;
/// `call`.
pub const CALL_INSN: u8 = JMP | CALL;

pub const fn size_bytes(code: u8) -> usize {
    match code & SIZE_MASK {
        W => 4,
        H => 2,
        B => 1,
        _ => 8,
    }
}
