//! The checks that need no values: every opcode is known, every jump lands on an
//! instruction of its own subprogram, no path falls off the end, nothing is
//! unreachable. Also finds the pruning points and which registers are live where.

use bpftime_isa::opcode as op;
use bpftime_isa::Insn;

use crate::error::RejectKind;
use crate::helpers;

pub struct Cfg {
    /// Instructions where explored states are kept and compared.
    pub prune: Vec<bool>,
    /// Registers (bit n = rn) that may be read before written, from each instruction on.
    pub live: Vec<u16>,
    /// What is wrong with an instruction's fields, reported only if a path reaches it.
    pub deferred: Vec<Option<RejectKind>>,
}

/// The opcodes of the kernel's instruction table: anything else is refused
/// before verification starts, wherever it is. Which fields an opcode may use is
/// checked only where a path reaches it, as the kernel does.
fn opcode_known(code: u8) -> bool {
    let o = code & op::OP_MASK;
    let x = code & op::SRC_MASK == op::X;
    match code & 0x07 {
        op::LD => matches!(code, 0x18 | 0x20 | 0x28 | 0x30 | 0x40 | 0x48 | 0x50),
        op::LDX => matches!(code, 0x61 | 0x69 | 0x71 | 0x79 | 0x81 | 0x89 | 0x91),
        op::ST => matches!(code, 0x62 | 0x6a | 0x72 | 0x7a),
        op::STX => matches!(code, 0x63 | 0x6b | 0x73 | 0x7b | 0xc3 | 0xcb | 0xd3 | 0xdb),
        class @ (op::ALU | op::ALU64) => match o {
            op::NEG => !x,
            op::END => class == op::ALU || !x,
            op::ADD
            | op::SUB
            | op::MUL
            | op::DIV
            | op::OR
            | op::AND
            | op::LSH
            | op::RSH
            | op::MOD
            | op::XOR
            | op::MOV
            | op::ARSH => true,
            _ => false,
        },
        class @ (op::JMP | op::JMP32) => match o {
            op::JA => !x,
            op::CALL | op::EXIT => class == op::JMP && !x,
            0xe0 | 0xf0 => false,
            _ => true,
        },
        _ => false,
    }
}

type Fail = (usize, RejectKind);

/// Validates the fields of one instruction.
fn check_insn(pc: usize, i: &Insn, next: Option<&Insn>) -> Result<(), Fail> {
    let bad = || Err((pc, RejectKind::UnknownOpcode { code: i.code }));
    let reserved = || Err((pc, RejectKind::ReservedFields { code: i.code }));
    if i.dst > 10 {
        return Err((pc, RejectKind::InvalidRegister { reg: i.dst }));
    }
    if i.src > 10 && !(i.is_lddw() || i.code == op::CALL_INSN) {
        return Err((pc, RejectKind::InvalidRegister { reg: i.src }));
    }
    let src_x = i.code & op::SRC_MASK == op::X;
    match i.class() {
        op::ALU | op::ALU64 => {
            let o = i.code & op::OP_MASK;
            match o {
                op::ADD
                | op::SUB
                | op::MUL
                | op::OR
                | op::AND
                | op::LSH
                | op::RSH
                | op::XOR
                | op::ARSH => {
                    if i.off != 0 || (!src_x && i.src != 0) || (src_x && i.imm != 0) {
                        return reserved();
                    }
                }
                op::DIV | op::MOD => {
                    if !(i.off == 0 || i.off == 1)
                        || (!src_x && i.src != 0)
                        || (src_x && i.imm != 0)
                    {
                        return reserved();
                    }
                }
                op::MOV => {
                    let sx_ok = match i.class() {
                        op::ALU64 => matches!(i.off, 0 | 8 | 16 | 32),
                        _ => matches!(i.off, 0 | 8 | 16),
                    };
                    if (src_x && (!sx_ok || i.imm != 0)) || (!src_x && (i.off != 0 || i.src != 0)) {
                        return reserved();
                    }
                }
                op::NEG => {
                    if src_x || i.src != 0 || i.off != 0 || i.imm != 0 {
                        return reserved();
                    }
                }
                op::END => {
                    if !matches!(i.imm, 16 | 32 | 64) || i.src != 0 || i.off != 0 {
                        return bad();
                    }
                    if i.class() == op::ALU64 && src_x {
                        return bad();
                    }
                }
                _ => return bad(),
            }
        }
        op::LDX => {
            let m = i.code & op::MODE_MASK;
            if !(m == op::MEM || (m == op::MEMSX && i.code & op::SIZE_MASK != op::DW)) {
                return bad();
            }
            if i.imm != 0 {
                return reserved();
            }
        }
        op::ST => {
            if i.code & op::MODE_MASK != op::MEM {
                return bad();
            }
            if i.src != 0 {
                return reserved();
            }
        }
        op::STX => match i.code & op::MODE_MASK {
            op::MEM => {
                if i.imm != 0 {
                    return reserved();
                }
            }
            op::ATOMIC => {}
            _ => return bad(),
        },
        op::LD => {
            if i.is_lddw() {
                match next {
                    Some(n) if n.code == 0 && n.dst == 0 && n.src == 0 && n.off == 0 => {}
                    _ => return Err((pc, RejectKind::InvalidLdImm64)),
                }
                if i.off != 0 {
                    return Err((pc, RejectKind::InvalidLdImm64));
                }
            } else {
                let m = i.code & op::MODE_MASK;
                if !(m == op::ABS || m == op::IND) || i.code & op::SIZE_MASK == op::DW {
                    return bad();
                }
            }
        }
        op::JMP | op::JMP32 => {
            let o = i.code & op::OP_MASK;
            match o {
                op::CALL | op::EXIT if i.class() == op::JMP32 => return bad(),
                op::CALL => {
                    if src_x || i.off != 0 || i.dst != 0 || i.src > op::CALL_KFUNC {
                        return reserved();
                    }
                }
                op::EXIT => {
                    if src_x || i.imm != 0 || i.off != 0 || i.dst != 0 || i.src != 0 {
                        return reserved();
                    }
                }
                op::JA => {
                    // `ja` jumps by `off`, `gotol` (JMP32) by `imm`; the other is reserved.
                    let other = if i.class() == op::JMP {
                        i.imm as i64
                    } else {
                        i.off as i64
                    };
                    if src_x || i.dst != 0 || i.src != 0 || other != 0 {
                        return reserved();
                    }
                }
                op::JEQ
                | op::JGT
                | op::JGE
                | op::JSET
                | op::JNE
                | op::JSGT
                | op::JSGE
                | op::JLT
                | op::JLE
                | op::JSLT
                | op::JSLE => {
                    if (!src_x && i.src != 0) || (src_x && i.imm != 0) {
                        return reserved();
                    }
                }
                _ => return bad(),
            }
        }
        _ => return bad(),
    }
    Ok(())
}

/// Where control may go after `pc`; `None` marks falling through to `pc + 1`
/// (or `pc + 2` after an `lddw`), kept apart so the end of a subprogram can be checked.
fn successors(pc: usize, i: &Insn) -> (Option<usize>, Option<i64>) {
    let fall = if i.is_lddw() { pc + 2 } else { pc + 1 };
    match i.class() {
        op::JMP | op::JMP32 => match i.code & op::OP_MASK {
            op::EXIT => (None, None),
            op::CALL => (Some(fall), None),
            op::JA if i.class() == op::JMP32 => (None, Some(pc as i64 + i.imm as i64 + 1)),
            op::JA => (None, Some(pc as i64 + i.off as i64 + 1)),
            _ => (Some(fall), Some(pc as i64 + i.off as i64 + 1)),
        },
        _ => (Some(fall), None),
    }
}

/// `callx` (a helper call through a register, which uBPF and the conformance
/// suite have and the kernel does not) is allowed when `callx` is set.
pub fn analyze(insns: &[Insn], callx: bool) -> Result<Cfg, Fail> {
    let n = insns.len();
    let mut second = vec![false; n];
    let mut deferred = vec![None; n];
    for pc in 0..n {
        if second[pc] {
            continue;
        }
        let i = &insns[pc];
        if callx && i.code == op::CALL_INSN | op::X {
            if i.dst > 10 {
                return Err((pc, RejectKind::InvalidRegister { reg: i.dst }));
            }
            if i.src != 0 || i.off != 0 || i.imm != 0 {
                return Err((pc, RejectKind::ReservedFields { code: i.code }));
            }
            continue;
        }
        if !opcode_known(i.code) {
            return Err((pc, RejectKind::UnknownOpcode { code: i.code }));
        }
        // The kernel checks loads and 64-bit immediates everywhere up front.
        let upfront = i.class() == op::LDX || i.class() == op::LD;
        match check_insn(pc, i, insns.get(pc + 1)) {
            Err(e) if upfront => return Err(e),
            Err((_, k)) => deferred[pc] = Some(k),
            Ok(()) => {}
        }
        if i.is_lddw() {
            second[pc + 1] = true;
        }
    }

    // Subprograms start at 0 and at every bpf-to-bpf call or callback target.
    let mut subprogs = vec![0usize];
    for pc in 0..n {
        if second[pc] {
            continue;
        }
        let i = &insns[pc];
        let calls = i.code == op::CALL_INSN && i.src == op::CALL_PSEUDO;
        let func_ptr = i.is_lddw() && i.src == op::PSEUDO_FUNC;
        let target = (calls || func_ptr).then_some(pc as i64 + i.imm as i64 + 1);
        if let Some(t) = target {
            if t < 0 || t as usize >= n || second[t as usize] {
                return Err((pc, RejectKind::InvalidCallTarget { target: t }));
            }
            subprogs.push(t as usize);
        }
    }
    subprogs.sort_unstable();
    subprogs.dedup();
    let sub_of = |pc: usize| subprogs.partition_point(|&s| s <= pc) - 1;

    let mut prune = vec![false; n];
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    for pc in 0..n {
        if second[pc] {
            continue;
        }
        let i = &insns[pc];
        let (fall, jump) = successors(pc, i);
        let sp = sub_of(pc);
        let sp_end = subprogs.get(sp + 1).copied().unwrap_or(n);
        if let Some(f) = fall {
            if f >= sp_end {
                return Err((pc, RejectKind::FallOffEnd));
            }
            succ[pc].push(f);
        }
        if let Some(t) = jump {
            if t < subprogs[sp] as i64 || t >= sp_end as i64 {
                return Err((pc, RejectKind::JumpOutOfRange { from: pc, to: t }));
            }
            let t = t as usize;
            if second[t] {
                return Err((pc, RejectKind::JumpIntoLdImm64 { to: t }));
            }
            succ[pc].push(t);
            prune[t] = true;
            if let Some(f) = fall {
                prune[f] = true;
            }
        }
    }
    for &s in &subprogs {
        prune[s] = true;
    }

    // Reachability: from the entry, and into each subprogram from a reachable call.
    let mut seen = vec![false; n];
    let mut work = vec![0usize];
    while let Some(pc) = work.pop() {
        if seen[pc] {
            continue;
        }
        seen[pc] = true;
        let i = &insns[pc];
        if (i.code == op::CALL_INSN && i.src == op::CALL_PSEUDO)
            || (i.is_lddw() && i.src == op::PSEUDO_FUNC)
        {
            work.push((pc as i64 + i.imm as i64 + 1) as usize);
        }
        work.extend(succ[pc].iter().copied());
    }
    if let Some(pc) = (0..n).find(|&pc| !seen[pc] && !second[pc]) {
        return Err((pc, RejectKind::Unreachable { insn: pc }));
    }

    let live = liveness(insns, &second, &succ);
    Ok(Cfg {
        prune,
        live,
        deferred,
    })
}

/// Registers an instruction reads and writes (bit n = rn).
fn use_def(i: &Insn) -> (u16, u16) {
    let d = 1u16 << i.dst;
    let s = 1u16 << i.src;
    let x = i.code & op::SRC_MASK == op::X;
    let args = |n: usize| ((1u16 << (n + 1)) - 1) & !1;
    match i.class() {
        op::ALU | op::ALU64 => match i.code & op::OP_MASK {
            op::MOV => (if x { s } else { 0 }, d),
            op::NEG | op::END => (d, d),
            _ => (d | if x { s } else { 0 }, d),
        },
        op::LDX => (s, d),
        op::ST => (d, 0),
        op::STX if i.code & op::MODE_MASK == op::ATOMIC => {
            if i.imm == op::ATOMIC_CMPXCHG {
                (d | s | 1, 1)
            } else if i.imm & op::FETCH != 0 {
                (d | s, s)
            } else {
                (d | s, 0)
            }
        }
        op::STX => (d | s, 0),
        op::LD if i.is_lddw() => (0, d),
        op::LD => (
            1 << 6
                | if i.code & op::MODE_MASK == op::IND {
                    s
                } else {
                    0
                },
            0x3f,
        ),
        _ => match i.code & op::OP_MASK {
            op::EXIT => (1, 0),
            op::CALL if x => (args(5) | d, 0x3f),
            op::CALL => {
                let n = match i.src {
                    op::CALL_HELPER => u32::try_from(i.imm)
                        .ok()
                        .and_then(helpers::proto)
                        .map(|p| p.args.len())
                        .unwrap_or(5),
                    _ => 5,
                };
                (args(n), 0x3f)
            }
            op::JA => (0, 0),
            _ => (d | if x { s } else { 0 }, 0),
        },
    }
}

fn liveness(insns: &[Insn], second: &[bool], succ: &[Vec<usize>]) -> Vec<u16> {
    let n = insns.len();
    let ud: Vec<(u16, u16)> = insns.iter().map(use_def).collect();
    let mut live = vec![0u16; n];
    let mut changed = true;
    while changed {
        changed = false;
        for pc in (0..n).rev() {
            if second[pc] {
                continue;
            }
            let out = succ[pc].iter().fold(0u16, |a, &t| a | live[t]);
            let (u, d) = ud[pc];
            let v = u | (out & !d);
            if v != live[pc] {
                live[pc] = v;
                changed = true;
            }
        }
    }
    live
}
