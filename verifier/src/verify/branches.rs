//! Branches: jumps, and conditional jumps that narrow both paths' registers.

use super::*;

impl Verifier<'_> {
    pub(super) fn jump(&mut self, st: &mut State, i: &Insn, pc: usize) -> R<Flow> {
        let o = i.code & op::OP_MASK;
        match o {
            op::JA if i.class() == op::JMP32 => {
                Ok(Flow::Goto((pc as i64 + i.imm as i64 + 1) as usize))
            }
            op::JA => Ok(Flow::Goto((pc as i64 + i.off as i64 + 1) as usize)),
            op::EXIT => self.exit(st),
            // callx: the helper whose id the register holds, which must be known.
            op::CALL if i.code & op::SRC_MASK == op::X => {
                let id = Self::read(st, i.dst)?
                    .as_scalar()
                    .and_then(|s| s.as_const())
                    .and_then(|c| i32::try_from(c).ok())
                    .ok_or(RejectKind::NotConstant { reg: i.dst })?;
                self.helper(st, id, pc)
            }
            op::CALL => match i.src {
                op::CALL_PSEUDO => self.call(st, pc, (pc as i64 + i.imm as i64 + 1) as usize),
                op::CALL_HELPER => self.helper(st, i.imm, pc),
                _ => Err(RejectKind::KfuncUnsupported),
            },
            _ => self.cond(st, i, pc),
        }
    }

    pub(super) fn cond(&mut self, st: &mut State, i: &Insn, pc: usize) -> R<Flow> {
        let is64 = i.class() == op::JMP;
        let x = i.code & op::SRC_MASK == op::X;
        let a = Self::read(st, i.dst)?;
        let b = if x {
            Self::read(st, i.src)?
        } else if is64 {
            Reg::konst(i.imm as i64 as u64)
        } else {
            Reg::konst(i.imm as u32 as u64)
        };
        let cmp = match i.code & op::OP_MASK {
            op::JEQ => Cmp::Eq,
            op::JNE => Cmp::Ne,
            op::JGT => Cmp::Gt,
            op::JGE => Cmp::Ge,
            op::JLT => Cmp::Lt,
            op::JLE => Cmp::Le,
            op::JSGT => Cmp::Sgt,
            op::JSGE => Cmp::Sge,
            op::JSLT => Cmp::Slt,
            op::JSLE => Cmp::Sle,
            op::JSET => Cmp::Set,
            _ => return Err(RejectKind::UnknownOpcode { code: i.code }),
        };
        let target = (pc as i64 + i.off as i64 + 1) as usize;
        let mut taken = st.clone();
        let (t_ok, f_ok) = match (a, b) {
            (Reg::Scalar { s: sa, id: ia }, Reg::Scalar { s: sb, id: ib }) => {
                let usable = is64
                    || (sa.umax <= u32::MAX as u64
                        && sb.umax <= u32::MAX as u64
                        && !cmp.is_signed())
                    || (sa.umax <= i32::MAX as u64 && sb.umax <= i32::MAX as u64);
                if usable {
                    let t = sa.refine(&sb, cmp);
                    let f = sa.refine(&sb, cmp.negate());
                    if let Some((na, nb)) = t {
                        set_scalar(&mut taken, i.dst, na, ia);
                        if x {
                            set_scalar(&mut taken, i.src, nb, ib);
                        }
                    }
                    if let Some((na, nb)) = f {
                        set_scalar(st, i.dst, na, ia);
                        if x {
                            set_scalar(st, i.src, nb, ib);
                        }
                    }
                    (t.is_some(), f.is_some())
                } else if let (Some(ca), Some(cb)) = (sa.as_const(), sb.as_const()) {
                    let r = eval32(cmp, ca as u32, cb as u32);
                    (r, !r)
                } else {
                    // The 32-bit subregisters alone may decide the branch (the
                    // upper halves are unknown, so nothing is narrowed).
                    let view = |s: Scalar| {
                        if cmp.is_signed() {
                            s.trunc32().sext(4)
                        } else {
                            s.trunc32()
                        }
                    };
                    let (a32, b32) = (view(sa), view(sb));
                    (
                        a32.refine(&b32, cmp).is_some(),
                        a32.refine(&b32, cmp.negate()).is_some(),
                    )
                }
            }
            (
                p @ Reg::Ptr {
                    nullable: true, id, ..
                },
                Reg::Scalar { s, .. },
            ) if is64 && s.as_const() == Some(0) && matches!(cmp, Cmp::Eq | Cmp::Ne) => {
                let ref_id = if let Reg::Ptr { ref_id, .. } = p {
                    ref_id
                } else {
                    0
                };
                let (null_st, nonnull_st) = if cmp == Cmp::Eq {
                    (&mut taken, &mut *st)
                } else {
                    (&mut *st, &mut taken)
                };
                mark_null(null_st, id, ref_id, true);
                mark_null(nonnull_st, id, ref_id, false);
                (true, true)
            }
            // Like the kernel, only maps and pointers to map values and to memory
            // count as known non-null; tests of the others explore both ways.
            (
                Reg::Ptr {
                    nullable: false,
                    region: Region::MapValue { .. } | Region::Ringbuf { .. } | Region::Mem { .. },
                    ..
                }
                | Reg::MapPtr { .. },
                Reg::Scalar { s, .. },
            ) if s.as_const() == Some(0) && is64 => match cmp {
                Cmp::Eq => (false, true),
                Cmp::Ne => (true, false),
                _ => (true, true),
            },
            _ => (true, true),
        };
        match (t_ok, f_ok) {
            (true, true) => Ok(Flow::Fork(pc + 1, taken, target)),
            (true, false) => {
                *st = taken;
                Ok(Flow::Goto(target))
            }
            (false, true) => Ok(Flow::Goto(pc + 1)),
            (false, false) => Ok(Flow::End),
        }
    }
}
