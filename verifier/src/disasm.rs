//! One-line disassembly in the kernel verifier log's syntax, for log lines.

use bpftime_isa::opcode as op;
use bpftime_isa::Insn;

use crate::helpers;

fn size_name(code: u8) -> &'static str {
    match code & op::SIZE_MASK {
        op::B => "u8",
        op::H => "u16",
        op::W => "u32",
        _ => "u64",
    }
}

fn alu_sym(o: u8) -> &'static str {
    match o {
        op::ADD => "+=",
        op::SUB => "-=",
        op::MUL => "*=",
        op::DIV => "/=",
        op::OR => "|=",
        op::AND => "&=",
        op::LSH => "<<=",
        op::RSH => ">>=",
        op::MOD => "%=",
        op::XOR => "^=",
        op::MOV => "=",
        op::ARSH => "s>>=",
        _ => "?=",
    }
}

fn jmp_sym(o: u8) -> &'static str {
    match o {
        op::JEQ => "==",
        op::JGT => ">",
        op::JGE => ">=",
        op::JSET => "&",
        op::JNE => "!=",
        op::JSGT => "s>",
        op::JSGE => "s>=",
        op::JLT => "<",
        op::JLE => "<=",
        op::JSLT => "s<",
        op::JSLE => "s<=",
        _ => "?",
    }
}

/// `(code) text` for slot `pc`; `next` is the following slot (the high half of an `lddw`).
pub fn disasm(i: &Insn, next: Option<&Insn>) -> String {
    format!("({:02x}) {}", i.code, text(i, next))
}

fn text(i: &Insn, next: Option<&Insn>) -> String {
    let (d, s) = (i.dst, i.src);
    match i.class() {
        op::ALU | op::ALU64 => {
            let p = if i.class() == op::ALU64 { 'r' } else { 'w' };
            let o = i.code & op::OP_MASK;
            match o {
                op::NEG => format!("{p}{d} = -{p}{d}"),
                op::END => {
                    let kind = if i.class() == op::ALU64 {
                        "bswap"
                    } else if i.code & op::SRC_MASK == op::X {
                        "be"
                    } else {
                        "le"
                    };
                    format!("r{d} = {kind}{} r{d}", i.imm)
                }
                _ => {
                    let sym = alu_sym(o);
                    let sdiv = i.off == 1 && matches!(o, op::DIV | op::MOD);
                    let sym = match (sdiv, o) {
                        (true, op::DIV) => "s/=",
                        (true, _) => "s%=",
                        _ => sym,
                    };
                    let src = if i.code & op::SRC_MASK == op::X {
                        if o == op::MOV && i.off != 0 {
                            format!("(s{}){p}{s}", i.off)
                        } else {
                            format!("{p}{s}")
                        }
                    } else {
                        format!("{}", i.imm)
                    };
                    format!("{p}{d} {sym} {src}")
                }
            }
        }
        op::LDX => {
            let sign = if i.code & op::MODE_MASK == op::MEMSX {
                "s"
            } else {
                "u"
            };
            let sz = &size_name(i.code)[1..];
            format!("r{d} = *({sign}{sz} *)(r{s} {:+})", i.off)
        }
        op::STX if i.code & op::MODE_MASK == op::ATOMIC => {
            let name = match i.imm & !op::FETCH {
                op::ATOMIC_ADD => "add",
                op::ATOMIC_OR => "or",
                op::ATOMIC_AND => "and",
                op::ATOMIC_XOR => "xor",
                0xe0 => "xchg",
                0xf0 => "cmpxchg",
                _ => "?",
            };
            let fetch = if i.imm & op::FETCH != 0 { "fetch_" } else { "" };
            format!(
                "lock {fetch}{name} *({} *)(r{d} {:+}), r{s}",
                size_name(i.code),
                i.off
            )
        }
        op::STX => format!("*({} *)(r{d} {:+}) = r{s}", size_name(i.code), i.off),
        op::ST => format!("*({} *)(r{d} {:+}) = {}", size_name(i.code), i.off, i.imm),
        op::LD if i.is_lddw() => {
            let hi = next.map(|n| n.imm).unwrap_or(0);
            match s {
                op::PSEUDO_MAP_FD | op::PSEUDO_MAP_IDX => format!("r{d} = map[fd:{}] ll", i.imm),
                op::PSEUDO_MAP_VALUE | op::PSEUDO_MAP_IDX_VALUE => {
                    format!("r{d} = map[fd:{}][0]+{hi} ll", i.imm)
                }
                op::PSEUDO_FUNC => format!("r{d} = func pc{:+} ll", i.imm),
                _ => {
                    let v = ((hi as u32 as u64) << 32) | i.imm as u32 as u64;
                    format!("r{d} = {v:#x} ll")
                }
            }
        }
        op::LD => format!("r0 = *({} *)skb[{}]", size_name(i.code), i.imm),
        op::JMP | op::JMP32 => {
            let p = if i.class() == op::JMP { 'r' } else { 'w' };
            match i.code & op::OP_MASK {
                op::JA if i.class() == op::JMP32 => format!("gotol pc{:+}", i.imm),
                op::JA => format!("goto pc{:+}", i.off),
                op::EXIT => "exit".into(),
                op::CALL => match s {
                    op::CALL_PSEUDO => format!("call pc{:+}", i.imm),
                    op::CALL_KFUNC => format!("call kernel-function#{}", i.imm),
                    _ => format!("call {}#{}", helpers::name(i.imm), i.imm),
                },
                o => {
                    let rhs = if i.code & op::SRC_MASK == op::X {
                        format!("{p}{s}")
                    } else {
                        format!("{:#x}", i.imm)
                    };
                    format!("if {p}{d} {} {rhs} goto pc{:+}", jmp_sym(o), i.off)
                }
            }
        }
        _ => format!("unknown {:02x}", i.code),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_the_kernel_log() {
        assert_eq!(
            disasm(&Insn::new(0x61, 2, 1, 200, 0), None),
            "(61) r2 = *(u32 *)(r1 +200)"
        );
        assert_eq!(
            disasm(&Insn::new(0x7b, 10, 1, -8, 0), None),
            "(7b) *(u64 *)(r10 -8) = r1"
        );
        assert_eq!(
            disasm(&Insn::new(0x85, 0, 0, 0, 1), None),
            "(85) call bpf_map_lookup_elem#1"
        );
        assert_eq!(
            disasm(&Insn::new(0x25, 1, 0, 3, 5), None),
            "(25) if r1 > 0x5 goto pc+3"
        );
        assert_eq!(disasm(&Insn::new(0xb7, 0, 0, 0, -1), None), "(b7) r0 = -1");
    }
}
