use thiserror::Error;

/// Size in bytes of one eBPF instruction slot.
pub const INSN_SIZE: usize = 8;

/// One 8-byte eBPF instruction slot, as the kernel's `struct bpf_insn` lays it out.
///
/// A 64-bit immediate load (`lddw`) occupies two slots; the second slot's `imm`
/// holds the upper 32 bits and the other fields are zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    pub const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Self {
        Insn {
            code,
            dst,
            src,
            off,
            imm,
        }
    }

    /// The instruction class (`BPF_LD`, `BPF_ALU64`, `BPF_JMP`, ...).
    pub const fn class(&self) -> u8 {
        self.code & 0x07
    }

    /// True for the first slot of a 64-bit immediate load.
    pub const fn is_lddw(&self) -> bool {
        self.code == crate::opcode::LD_DW_IMM
    }

    pub fn from_bytes(b: [u8; INSN_SIZE]) -> Self {
        Insn {
            code: b[0],
            dst: b[1] & 0x0f,
            src: b[1] >> 4,
            off: i16::from_le_bytes([b[2], b[3]]),
            imm: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    pub fn to_bytes(&self) -> [u8; INSN_SIZE] {
        let off = self.off.to_le_bytes();
        let imm = self.imm.to_le_bytes();
        [
            self.code,
            (self.dst & 0x0f) | (self.src << 4),
            off[0],
            off[1],
            imm[0],
            imm[1],
            imm[2],
            imm[3],
        ]
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("program is {len} bytes long, not a multiple of {INSN_SIZE}")]
    Truncated { len: usize },
    #[error("program is empty")]
    Empty,
}

/// Splits raw bytecode into instruction slots.
pub fn decode(bytes: &[u8]) -> Result<Vec<Insn>, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    if !bytes.len().is_multiple_of(INSN_SIZE) {
        return Err(DecodeError::Truncated { len: bytes.len() });
    }
    Ok(bytes
        .chunks_exact(INSN_SIZE)
        .map(|c| {
            let mut b = [0u8; INSN_SIZE];
            b.copy_from_slice(c);
            Insn::from_bytes(b)
        })
        .collect())
}

/// Serializes instruction slots back to raw bytecode.
pub fn encode(insns: &[Insn]) -> Vec<u8> {
    insns.iter().flat_map(|i| i.to_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_registers_and_negative_offsets() {
        let i = Insn::new(0x61, 3, 10, -8, -1);
        let b = i.to_bytes();
        assert_eq!(b, [0x61, 0xa3, 0xf8, 0xff, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(Insn::from_bytes(b), i);
    }

    #[test]
    fn rejects_partial_slots() {
        assert_eq!(decode(&[0; 12]), Err(DecodeError::Truncated { len: 12 }));
        assert_eq!(decode(&[]), Err(DecodeError::Empty));
    }
}
