//! An assembler for the uBPF assembler text that the bpf_conformance suite is written in.
//!
//! One instruction per line; `#` starts a comment; `name:` on its own line defines a label.
//! Registers are `%r0`..`%r10`, memory operands `[%r1]`, `[%r1+4]` or `[%r10-8]`, immediates
//! decimal or `0x` hex with an optional sign. A jump target is a label, or a signed slot offset
//! such as `+1`. The suite also jumps to `exit` without defining it: an undefined `exit` label
//! means the first `exit` instruction after the jump, which is what every such test expects.

use std::collections::HashMap;

use thiserror::Error;

use crate::opcode::*;
use crate::Insn;

/// Why a line of assembler text was rejected.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("line {line}: {kind}")]
pub struct AsmError {
    /// 1-based line number in the source text.
    pub line: usize,
    pub kind: AsmErrorKind,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum AsmErrorKind {
    #[error("unknown mnemonic `{0}`")]
    UnknownMnemonic(String),
    #[error("`{mnemonic}` takes {expected} operand(s), got {got}")]
    OperandCount {
        mnemonic: String,
        expected: usize,
        got: usize,
    },
    #[error("expected a register %r0..%r10, got `{0}`")]
    BadRegister(String),
    #[error("expected a number, got `{0}`")]
    BadNumber(String),
    #[error("{value} does not fit in a {bits}-bit field")]
    OutOfRange { value: i128, bits: u32 },
    #[error("expected a memory operand like [%r1+8], got `{0}`")]
    BadMemory(String),
    #[error("undefined label `{0}`")]
    UndefinedLabel(String),
    #[error("label `{0}` is defined twice")]
    DuplicateLabel(String),
}

/// Assembles uBPF assembler text into instruction slots (an `lddw` yields two).
pub fn assemble(src: &str) -> Result<Vec<Insn>, AsmError> {
    // Pass 1: find labels and how many slots each statement takes.
    let mut stmts: Vec<Stmt<'_>> = Vec::new();
    let mut labels: HashMap<&str, usize> = HashMap::new();
    let mut exits: Vec<usize> = Vec::new();
    let mut slot = 0usize;
    for (idx, raw) in src.lines().enumerate() {
        let line = idx + 1;
        let text = raw.split('#').next().unwrap_or("").trim();
        if text.is_empty() {
            continue;
        }
        if let Some(name) = text.strip_suffix(':') {
            let name = name.trim();
            if labels.insert(name, slot).is_some() {
                return Err(AsmError {
                    line,
                    kind: AsmErrorKind::DuplicateLabel(name.to_string()),
                });
            }
            continue;
        }
        let (mnemonic, rest) = match text.split_once(char::is_whitespace) {
            Some((m, r)) => (m, r.trim()),
            None => (text, ""),
        };
        if mnemonic == "exit" {
            exits.push(slot);
        }
        stmts.push(Stmt {
            line,
            slot,
            mnemonic,
            rest,
        });
        slot += if mnemonic == "lddw" { 2 } else { 1 };
    }

    // Pass 2: encode, now that every label is known.
    let ctx = Labels {
        labels: &labels,
        exits: &exits,
    };
    let mut out = Vec::with_capacity(slot);
    for s in &stmts {
        encode_stmt(s, &ctx, &mut out).map_err(|kind| AsmError { line: s.line, kind })?;
    }
    Ok(out)
}

struct Stmt<'a> {
    line: usize,
    slot: usize,
    mnemonic: &'a str,
    rest: &'a str,
}

struct Labels<'a> {
    labels: &'a HashMap<&'a str, usize>,
    exits: &'a [usize],
}

impl Labels<'_> {
    /// Resolves a jump target to a slot offset relative to the slot after `from`.
    fn offset(&self, target: &str, from: usize) -> Result<i64, AsmErrorKind> {
        if target.starts_with(['+', '-']) || target.starts_with(|c: char| c.is_ascii_digit()) {
            return Ok(parse_int(target)? as i64);
        }
        let dest = match self.labels.get(target) {
            Some(&d) => d,
            None if target == "exit" => *self
                .exits
                .iter()
                .find(|&&e| e > from)
                .ok_or_else(|| AsmErrorKind::UndefinedLabel(target.to_string()))?,
            None => return Err(AsmErrorKind::UndefinedLabel(target.to_string())),
        };
        Ok(dest as i64 - from as i64 - 1)
    }
}

type R<T> = Result<T, AsmErrorKind>;

fn operands(rest: &str) -> Vec<&str> {
    if rest.is_empty() {
        Vec::new()
    } else {
        rest.split(',').map(str::trim).collect()
    }
}

fn want(mnemonic: &str, ops: &[&str], n: usize) -> R<()> {
    if ops.len() == n {
        Ok(())
    } else {
        Err(AsmErrorKind::OperandCount {
            mnemonic: mnemonic.to_string(),
            expected: n,
            got: ops.len(),
        })
    }
}

fn parse_reg(s: &str) -> R<u8> {
    s.strip_prefix("%r")
        .and_then(|n| n.parse::<u8>().ok())
        .filter(|&n| n <= 10)
        .ok_or_else(|| AsmErrorKind::BadRegister(s.to_string()))
}

fn is_reg(s: &str) -> bool {
    s.starts_with('%')
}

fn parse_int(s: &str) -> R<i128> {
    let bad = || AsmErrorKind::BadNumber(s.to_string());
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let body = body.trim();
    let mag = if let Some(hex) = body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).map_err(|_| bad())?
    } else {
        body.parse::<u64>().map_err(|_| bad())?
    };
    Ok(if neg { -(mag as i128) } else { mag as i128 })
}

fn fit(value: i128, bits: u32) -> R<i128> {
    // A field of N bits accepts both the signed and the unsigned reading of N bits, as
    // `0xffffffff` and `-1` are the same 32-bit immediate.
    let min = -(1i128 << (bits - 1));
    let max = (1i128 << bits) - 1;
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(AsmErrorKind::OutOfRange { value, bits })
    }
}

fn imm32(s: &str) -> R<i32> {
    Ok(fit(parse_int(s)?, 32)? as u32 as i32)
}

fn off16(v: i64) -> R<i16> {
    i16::try_from(v).map_err(|_| AsmErrorKind::OutOfRange {
        value: v as i128,
        bits: 16,
    })
}

/// Parses `[%rN]`, `[%rN+off]` or `[%rN-off]`.
fn parse_mem(s: &str) -> R<(u8, i16)> {
    let bad = || AsmErrorKind::BadMemory(s.to_string());
    let inner = s
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .ok_or_else(bad)?
        .trim();
    let split = inner.find(['+', '-']);
    let (reg, off) = match split {
        Some(i) => (inner[..i].trim(), parse_int(inner[i..].trim())?),
        None => (inner, 0),
    };
    let off = i16::try_from(off).map_err(|_| AsmErrorKind::OutOfRange {
        value: off,
        bits: 16,
    })?;
    Ok((parse_reg(reg)?, off))
}

fn alu_op(name: &str) -> Option<(u8, i16)> {
    Some(match name {
        "add" => (ADD, 0),
        "sub" => (SUB, 0),
        "mul" => (MUL, 0),
        "div" => (DIV, 0),
        "sdiv" => (DIV, 1),
        "or" => (OR, 0),
        "and" => (AND, 0),
        "lsh" => (LSH, 0),
        "rsh" => (RSH, 0),
        "neg" => (NEG, 0),
        "mod" => (MOD, 0),
        "smod" => (MOD, 1),
        "xor" => (XOR, 0),
        "mov" => (MOV, 0),
        "arsh" => (ARSH, 0),
        _ => return None,
    })
}

fn jmp_op(name: &str) -> Option<u8> {
    Some(match name {
        "ja" => JA,
        "jeq" => JEQ,
        "jgt" => JGT,
        "jge" => JGE,
        "jset" => JSET,
        "jne" => JNE,
        "jsgt" => JSGT,
        "jsge" => JSGE,
        "jlt" => JLT,
        "jle" => JLE,
        "jslt" => JSLT,
        "jsle" => JSLE,
        _ => return None,
    })
}

fn size_suffix(s: &str) -> Option<u8> {
    Some(match s {
        "b" => B,
        "h" => H,
        "w" => W,
        "dw" => DW,
        _ => return None,
    })
}

/// Splits a trailing `32`/`64` width off a mnemonic; no suffix means 64.
fn width(m: &str) -> (&str, bool) {
    if let Some(b) = m.strip_suffix("32") {
        (b, true)
    } else if let Some(b) = m.strip_suffix("64") {
        (b, false)
    } else {
        (m, false)
    }
}

fn encode_stmt(s: &Stmt<'_>, labels: &Labels<'_>, out: &mut Vec<Insn>) -> R<()> {
    let m = s.mnemonic;
    let unknown = || AsmErrorKind::UnknownMnemonic(m.to_string());

    match m {
        "exit" => {
            want(m, &operands(s.rest), 0)?;
            out.push(Insn::new(EXIT_INSN, 0, 0, 0, 0));
            return Ok(());
        }
        "lddw" => {
            let ops = operands(s.rest);
            want(m, &ops, 2)?;
            let dst = parse_reg(ops[0])?;
            let v = fit(parse_int(ops[1])?, 64)? as u64;
            out.push(Insn::new(LD_DW_IMM, dst, 0, 0, v as u32 as i32));
            out.push(Insn::new(0, 0, 0, 0, (v >> 32) as u32 as i32));
            return Ok(());
        }
        "call" | "callx" => return encode_call(s, labels, out),
        "lock" => return encode_atomic(s, out),
        _ => {}
    }

    let ops = operands(s.rest);

    // movsx{8,16,32}{32,64}: sign-extending register moves (ISA v4).
    if let Some(spec) = m.strip_prefix("movsx") {
        let (from, alu32) = match spec {
            "832" => (8, true),
            "1632" => (16, true),
            "864" => (8, false),
            "1664" => (16, false),
            "3264" => (32, false),
            _ => return Err(unknown()),
        };
        want(m, &ops, 2)?;
        let class = if alu32 { ALU } else { ALU64 };
        out.push(Insn::new(
            class | MOV | X,
            parse_reg(ops[0])?,
            parse_reg(ops[1])?,
            from,
            0,
        ));
        return Ok(());
    }

    // Byte swaps: be/le convert (class ALU), swap/bswap swap unconditionally (class ALU64).
    for (prefix, code) in [
        ("be", ALU | END | X),
        ("le", ALU | END | K),
        ("bswap", ALU64 | END | K),
        ("swap", ALU64 | END | K),
    ] {
        if let Some(bits) = m.strip_prefix(prefix) {
            if let Ok(bits @ (16 | 32 | 64)) = bits.parse::<i32>() {
                want(m, &ops, 1)?;
                out.push(Insn::new(code, parse_reg(ops[0])?, 0, 0, bits));
                return Ok(());
            }
        }
    }

    // Loads and stores.
    if let Some(sz) = m.strip_prefix("ldxs").and_then(size_suffix) {
        want(m, &ops, 2)?;
        let (src, off) = parse_mem(ops[1])?;
        out.push(Insn::new(LDX | MEMSX | sz, parse_reg(ops[0])?, src, off, 0));
        return Ok(());
    }
    if let Some(sz) = m.strip_prefix("ldx").and_then(size_suffix) {
        want(m, &ops, 2)?;
        let (src, off) = parse_mem(ops[1])?;
        out.push(Insn::new(LDX | MEM | sz, parse_reg(ops[0])?, src, off, 0));
        return Ok(());
    }
    if let Some(sz) = m.strip_prefix("stx").and_then(size_suffix) {
        want(m, &ops, 2)?;
        let (dst, off) = parse_mem(ops[0])?;
        out.push(Insn::new(STX | MEM | sz, dst, parse_reg(ops[1])?, off, 0));
        return Ok(());
    }
    if let Some(sz) = m.strip_prefix("st").and_then(size_suffix) {
        want(m, &ops, 2)?;
        let (dst, off) = parse_mem(ops[0])?;
        out.push(Insn::new(ST | MEM | sz, dst, 0, off, imm32(ops[1])?));
        return Ok(());
    }

    // `ja32`/`gotol`: the long unconditional jump whose offset lives in imm.
    if m == "ja32" || m == "gotol" {
        want(m, &ops, 1)?;
        let off = labels.offset(ops[0], s.slot)?;
        let imm = fit(off as i128, 32)? as i32;
        out.push(Insn::new(JMP32 | JA, 0, 0, 0, imm));
        return Ok(());
    }

    let (base, is32) = width(m);
    if let Some(op) = jmp_op(base) {
        let class = if is32 { JMP32 } else { JMP };
        if op == JA {
            if is32 {
                return Err(unknown());
            }
            want(m, &ops, 1)?;
            let off = off16(labels.offset(ops[0], s.slot)?)?;
            out.push(Insn::new(JMP | JA, 0, 0, off, 0));
            return Ok(());
        }
        want(m, &ops, 3)?;
        let dst = parse_reg(ops[0])?;
        let off = off16(labels.offset(ops[2], s.slot)?)?;
        let insn = if is_reg(ops[1]) {
            Insn::new(class | op | X, dst, parse_reg(ops[1])?, off, 0)
        } else {
            Insn::new(class | op | K, dst, 0, off, imm32(ops[1])?)
        };
        out.push(insn);
        return Ok(());
    }
    if let Some((op, off)) = alu_op(base) {
        let class = if is32 { ALU } else { ALU64 };
        if op == NEG {
            want(m, &ops, 1)?;
            out.push(Insn::new(class | NEG | K, parse_reg(ops[0])?, 0, 0, 0));
            return Ok(());
        }
        want(m, &ops, 2)?;
        let dst = parse_reg(ops[0])?;
        let insn = if is_reg(ops[1]) {
            Insn::new(class | op | X, dst, parse_reg(ops[1])?, off, 0)
        } else {
            Insn::new(class | op | K, dst, 0, off, imm32(ops[1])?)
        };
        out.push(insn);
        return Ok(());
    }
    Err(unknown())
}

fn encode_call(s: &Stmt<'_>, labels: &Labels<'_>, out: &mut Vec<Insn>) -> R<()> {
    let rest = s.rest;
    if let Some(label) = rest.strip_prefix("local") {
        let label = label.trim();
        let imm = fit(labels.offset(label, s.slot)? as i128, 32)? as i32;
        out.push(Insn::new(CALL_INSN, 0, CALL_PSEUDO, 0, imm));
        return Ok(());
    }
    let ops = operands(rest);
    want(s.mnemonic, &ops, 1)?;
    if is_reg(ops[0]) || s.mnemonic == "callx" {
        // callx names its target register in dst, as LLVM and the kernel encode it.
        out.push(Insn::new(CALL_INSN | X, parse_reg(ops[0])?, 0, 0, 0));
    } else {
        out.push(Insn::new(CALL_INSN, 0, CALL_HELPER, 0, imm32(ops[0])?));
    }
    Ok(())
}

/// `lock [fetch] OP[32] [%dst+off], %src`.
fn encode_atomic(s: &Stmt<'_>, out: &mut Vec<Insn>) -> R<()> {
    let mut rest = s.rest;
    let mut fetch = false;
    if let Some(r) = rest.strip_prefix("fetch") {
        fetch = true;
        rest = r.trim_start();
    }
    let (op_name, operand_text) = rest
        .split_once(char::is_whitespace)
        .ok_or_else(|| AsmErrorKind::UnknownMnemonic(format!("lock {rest}")))?;
    let (base, is32) = width(op_name);
    let op = match base {
        "add" => ATOMIC_ADD,
        "or" => ATOMIC_OR,
        "and" => ATOMIC_AND,
        "xor" => ATOMIC_XOR,
        "xchg" => ATOMIC_XCHG,
        "cmpxchg" => ATOMIC_CMPXCHG,
        _ => return Err(AsmErrorKind::UnknownMnemonic(format!("lock {op_name}"))),
    };
    let ops = operands(operand_text.trim());
    want(&format!("lock {op_name}"), &ops, 2)?;
    let (dst, off) = parse_mem(ops[0])?;
    let src = parse_reg(ops[1])?;
    let size = if is32 { W } else { DW };
    let imm = if fetch { op | FETCH } else { op };
    out.push(Insn::new(STX | ATOMIC | size, dst, src, off, imm));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(src: &str) -> Insn {
        let v = assemble(src).unwrap();
        assert_eq!(v.len(), 1, "{src}");
        v[0]
    }

    #[test]
    fn alu_forms_pick_class_source_and_offset() {
        assert_eq!(one("mov32 %r1, 5"), Insn::new(0xb4, 1, 0, 0, 5));
        assert_eq!(one("mov %r1, %r2"), Insn::new(0xbf, 1, 2, 0, 0));
        assert_eq!(one("add64 %r0, -1"), Insn::new(0x07, 0, 0, 0, -1));
        assert_eq!(one("sdiv32 %r0, %r3"), Insn::new(0x3c, 0, 3, 1, 0));
        assert_eq!(one("smod %r0, -3"), Insn::new(0x97, 0, 0, 1, -3));
        assert_eq!(one("neg32 %r2"), Insn::new(0x84, 2, 0, 0, 0));
        assert_eq!(one("movsx1632 %r0, %r1"), Insn::new(0xbc, 0, 1, 16, 0));
        assert_eq!(one("movsx3264 %r0, %r9"), Insn::new(0xbf, 0, 9, 32, 0));
    }

    #[test]
    fn unsigned_hex_immediates_wrap_to_their_32_bit_encoding() {
        assert_eq!(one("mov %r0, 0xffffffff").imm, -1);
        assert_eq!(one("jeq %r1, 0x80000000, +1").imm, i32::MIN);
        assert_eq!(
            assemble("mov %r0, 0x100000000").unwrap_err(),
            AsmError {
                line: 1,
                kind: AsmErrorKind::OutOfRange {
                    value: 0x1_0000_0000,
                    bits: 32
                }
            }
        );
    }

    #[test]
    fn byte_swaps() {
        assert_eq!(one("be16 %r0"), Insn::new(0xdc, 0, 0, 0, 16));
        assert_eq!(one("le64 %r3"), Insn::new(0xd4, 3, 0, 0, 64));
        assert_eq!(one("swap32 %r0"), Insn::new(0xd7, 0, 0, 0, 32));
        assert_eq!(one("bswap64 %r0"), Insn::new(0xd7, 0, 0, 0, 64));
    }

    #[test]
    fn memory_operands() {
        assert_eq!(one("ldxw %r0, [%r1]"), Insn::new(0x61, 0, 1, 0, 0));
        assert_eq!(one("ldxh %r3, [%r1+0x10]"), Insn::new(0x69, 3, 1, 16, 0));
        assert_eq!(one("ldxsb %r0, [%r10-1]"), Insn::new(0x91, 0, 10, -1, 0));
        assert_eq!(one("stxdw [%r10-8], %r0"), Insn::new(0x7b, 10, 0, -8, 0));
        assert_eq!(one("stb [%r10-1], 0x80"), Insn::new(0x72, 10, 0, -1, 0x80));
    }

    #[test]
    fn atomics() {
        assert_eq!(one("lock add [%r10-8], %r1"), Insn::new(0xdb, 10, 1, -8, 0));
        assert_eq!(
            one("lock fetch xor32 [%r10-4], %r1"),
            Insn::new(0xc3, 10, 1, -4, 0xa1)
        );
        assert_eq!(
            one("lock cmpxchg [%r10-8], %r1 # comment"),
            Insn::new(0xdb, 10, 1, -8, 0xf1)
        );
        assert_eq!(
            one("lock xchg32 [%r10-8], %r1"),
            Insn::new(0xc3, 10, 1, -8, 0xe1)
        );
    }

    #[test]
    fn lddw_takes_two_slots_and_labels_count_them() {
        let p = assemble("lddw %r0, 0x1122334455667788\nja end\nmov %r0, 1\nend:\nexit").unwrap();
        assert_eq!(p.len(), 5);
        assert_eq!(p[0], Insn::new(0x18, 0, 0, 0, 0x55667788));
        assert_eq!(p[1], Insn::new(0, 0, 0, 0, 0x11223344));
        assert_eq!(p[2], Insn::new(0x05, 0, 0, 1, 0));
        assert_eq!(
            assemble("lddw %r0, -1").unwrap()[1].imm,
            -1,
            "negative 64-bit immediates sign-fill the upper half"
        );
    }

    #[test]
    fn jumps_and_calls() {
        let p = assemble(
            "top:\njne32 %r0, %r1, top\njsle %r0, -5, +2\nja32 top\ncall local f\ncall 12\ncall %r2\nf:\nexit",
        )
        .unwrap();
        assert_eq!(p[0], Insn::new(0x5e, 0, 1, -1, 0));
        assert_eq!(p[1], Insn::new(0xd5, 0, 0, 2, -5));
        assert_eq!(p[2], Insn::new(0x06, 0, 0, 0, -3));
        assert_eq!(p[3], Insn::new(0x85, 0, 1, 0, 2));
        assert_eq!(p[4], Insn::new(0x85, 0, 0, 0, 12));
        assert_eq!(p[5], Insn::new(0x8d, 2, 0, 0, 0));
    }

    #[test]
    fn undefined_exit_label_means_the_next_exit_instruction() {
        let p = assemble("jne %r0, 1, exit\nmov %r0, 2\nexit\nmov %r0, 3\nexit").unwrap();
        assert_eq!(p[0].off, 1);
    }

    #[test]
    fn errors_name_the_line() {
        let e = assemble("mov %r0, 1\n\n  frob %r1\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert_eq!(e.kind, AsmErrorKind::UnknownMnemonic("frob".into()));
        assert_eq!(
            assemble("ja nowhere").unwrap_err().kind,
            AsmErrorKind::UndefinedLabel("nowhere".into())
        );
        assert_eq!(
            assemble("mov %r11, 1").unwrap_err().kind,
            AsmErrorKind::BadRegister("%r11".into())
        );
        assert_eq!(
            assemble("add %r1").unwrap_err().kind,
            AsmErrorKind::OperandCount {
                mnemonic: "add".into(),
                expected: 2,
                got: 1
            }
        );
        assert_eq!(
            assemble("a:\na:\nexit").unwrap_err().kind,
            AsmErrorKind::DuplicateLabel("a".into())
        );
    }
}
