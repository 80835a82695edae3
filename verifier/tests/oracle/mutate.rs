//! Deterministic mutations of accepted programs: one small change each (an
//! immediate, an offset, a jump, a size, a register, a comparison, a dropped
//! instruction), seeded by the program's name so that regenerating gives the
//! committed files back.

use bpftime_isa::opcode as op;
use bpftime_isa::Insn;

use super::{Entry, Intent};

/// xorshift64*: small, deterministic, no dependency.
pub struct Rng(u64);

impl Rng {
    pub fn seeded(name: &str, salt: u64) -> Rng {
        let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64 ^ salt, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        Rng(h | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
}

/// Slots that start an instruction (not the second half of an `lddw`).
fn starts(insns: &[Insn]) -> Vec<usize> {
    let mut v = Vec::new();
    let mut pc = 0;
    while pc < insns.len() {
        v.push(pc);
        pc += if insns[pc].is_lddw() { 2 } else { 1 };
    }
    v
}

const SIZES: [u8; 4] = [op::B, op::H, op::W, op::DW];
const CMP_OPS: [u8; 11] = [
    op::JEQ,
    op::JNE,
    op::JGT,
    op::JGE,
    op::JLT,
    op::JLE,
    op::JSGT,
    op::JSGE,
    op::JSLT,
    op::JSLE,
    op::JSET,
];
const ALU_OPS: [u8; 8] = [
    op::ADD,
    op::SUB,
    op::AND,
    op::OR,
    op::XOR,
    op::LSH,
    op::RSH,
    op::MOV,
];

/// One mutation of `insns`: the changed program and what was changed.
pub fn mutate(insns: &[Insn], rng: &mut Rng) -> Option<(Vec<Insn>, String)> {
    let slots = starts(insns);
    for _ in 0..64 {
        let pc = rng.pick(&slots);
        let old = insns[pc];
        let mut i = old;
        let class = i.class();
        let o = i.code & op::OP_MASK;
        let what = match rng.below(8) {
            // An immediate nudged or replaced.
            0 if !i.is_lddw() && i.code != op::CALL_INSN && class != op::LDX => {
                let imm = i.imm;
                i.imm = match rng.below(6) {
                    0 => imm.wrapping_add(1),
                    1 => imm.wrapping_sub(1),
                    2 => imm.wrapping_mul(2),
                    3 => 0,
                    4 => -1,
                    _ => imm.wrapping_add(8),
                };
                format!("imm {imm} -> {}", i.imm)
            }
            // A memory offset moved.
            1 if matches!(class, op::LDX | op::ST | op::STX) => {
                let d = rng.pick(&[1i16, -1, 4, -4, 8, -8]);
                i.off = i.off.wrapping_add(d);
                format!("offset {} -> {}", old.off, i.off)
            }
            // A jump target moved.
            2 if matches!(class, op::JMP | op::JMP32)
                && !matches!(o, op::CALL | op::EXIT)
                && !(class == op::JMP32 && o == op::JA) =>
            {
                let d = rng.pick(&[1i16, -1, 2]);
                i.off = i.off.wrapping_add(d);
                format!("jump offset {} -> {}", old.off, i.off)
            }
            // Another comparison.
            3 if matches!(class, op::JMP | op::JMP32) && CMP_OPS.contains(&o) => {
                let n = rng.pick(&CMP_OPS);
                i.code = (i.code & !op::OP_MASK) | n;
                format!("comparison {:#04x} -> {:#04x}", old.code, i.code)
            }
            // Another access size.
            4 if matches!(class, op::LDX | op::ST)
                || (class == op::STX && i.code & op::MODE_MASK == op::MEM) =>
            {
                let sz = rng.pick(&SIZES);
                i.code = (i.code & !op::SIZE_MASK) | sz;
                format!("size {:#04x} -> {:#04x}", old.code, i.code)
            }
            // Another register.
            5 if !(i.is_lddw() || class == op::JMP && matches!(o, op::CALL | op::EXIT)) => {
                let r = rng.below(11) as u8;
                if rng.below(2) == 0
                    && (i.code & op::SRC_MASK == op::X || matches!(class, op::LDX | op::STX))
                {
                    i.src = r;
                    format!("src r{} -> r{r}", old.src)
                } else {
                    i.dst = r;
                    format!("dst r{} -> r{r}", old.dst)
                }
            }
            // Another ALU operation, or the other width.
            6 if matches!(class, op::ALU | op::ALU64) && ALU_OPS.contains(&o) => {
                if rng.below(3) == 0 {
                    i.code ^= op::ALU ^ op::ALU64;
                    format!("width {:#04x} -> {:#04x}", old.code, i.code)
                } else {
                    let n = rng.pick(&ALU_OPS);
                    i.code = (i.code & !op::OP_MASK) | n;
                    format!("operation {:#04x} -> {:#04x}", old.code, i.code)
                }
            }
            // An instruction dropped (a no-op jump keeps every offset).
            7 if !(i.is_lddw() || class == op::JMP && o == op::EXIT) => {
                i = Insn::new(op::JMP | op::JA, 0, 0, 0, 0);
                "dropped".to_string()
            }
            _ => continue,
        };
        if i == old {
            continue;
        }
        let mut v = insns.to_vec();
        v[pc] = i;
        return Some((v, format!("insn {pc}: {what}")));
    }
    None
}

/// The mutants of `base`: `n` programs, each one change away from it.
pub fn mutants(base: &Entry, n: usize) -> Vec<(Entry, String)> {
    let mut rng = Rng::seeded(&base.name, 0x6d75_7461);
    let mut out: Vec<(Entry, String)> = Vec::new();
    let mut tries = 0;
    while out.len() < n && tries < 16 * n {
        tries += 1;
        let Some((insns, what)) = mutate(&base.insns, &mut rng) else {
            break;
        };
        if out.iter().any(|(e, _)| e.insns == insns) {
            continue;
        }
        let name = format!(
            "mutations/{}-{}",
            base.name.replace('/', "-"),
            out.len() + 1
        );
        let e = Entry {
            name,
            prog_type: base.prog_type,
            maps: base.maps.clone(),
            intent: None,
            insns,
        };
        out.push((e, what));
    }
    out
}

/// The corpus's mutants of `base`: one for every program meant to pass (the
/// hand-written `_ok` rules and the clang-built set), none for the rest.
pub fn corpus_mutants(base: &Entry) -> Vec<(Entry, String)> {
    let meant_to_pass = base.intent == Some(Intent::Accept) || base.name.starts_with("clang/");
    if meant_to_pass {
        mutants(base, 1)
    } else {
        Vec::new()
    }
}
