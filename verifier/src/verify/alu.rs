//! Arithmetic: the scalar and pointer results of ALU instructions.

use super::*;

impl Verifier<'_> {
    pub(super) fn alu(&mut self, st: &mut State, i: &Insn) -> R<()> {
        let is64 = i.class() == op::ALU64;
        let o = i.code & op::OP_MASK;
        let x = i.code & op::SRC_MASK == op::X;
        if i.dst == 10 {
            return Err(RejectKind::FramePointerWrite);
        }
        // Byte swaps and negation have no source operand (the X bit of a swap
        // picks its direction), so `src` is never read for them.
        if o == op::NEG || o == op::END {
            return self.unary(st, i, is64);
        }
        // The ISA defines division by zero (the conformance suite relies on it);
        // the kernel refuses a constant zero divisor outright.
        if matches!(o, op::DIV | op::MOD)
            && !x
            && i.imm == 0
            && self.p.prog_type != PROG_TYPE_CONFORMANCE
        {
            return Err(RejectKind::DivByZero);
        }
        let src = if x {
            Self::read(st, i.src)?
        } else if is64 {
            Reg::konst(i.imm as i64 as u64)
        } else {
            Reg::konst(i.imm as u32 as u64)
        };
        let fix32 = |s: Scalar| if is64 { s } else { s.trunc32() };
        if o == op::MOV {
            let v = match src {
                Reg::Scalar { s, .. } if x && i.off != 0 => {
                    let bytes = i.off as u32 / 8;
                    if is64 {
                        Reg::scalar(s.sext(bytes))
                    } else {
                        Reg::scalar(s.trunc32().sext(bytes).trunc32())
                    }
                }
                Reg::Scalar { s, id } if is64 => {
                    if x && s.as_const().is_none() {
                        let id = if id == 0 { self.fresh_id() } else { id };
                        st.cur_mut().regs[i.src as usize] = Reg::Scalar { s, id };
                        Reg::Scalar { s, id }
                    } else {
                        Reg::scalar(s)
                    }
                }
                Reg::Scalar { s, .. } => Reg::scalar(s.trunc32()),
                _ if i.off != 0 => {
                    return Err(RejectKind::PtrOpProhibited {
                        reg: i.src,
                        op: "sign-extending move",
                    });
                }
                // Copying a pointer's low half leaks an address: root may.
                _ if !is64 => unknown_bytes(4),
                p => p,
            };
            return Self::write(st, i.dst, v);
        }
        let bits = if is64 { 64 } else { 32 };
        let shift = matches!(o, op::LSH | op::RSH | op::ARSH);
        // The kernel refuses constant shifts past the width; the ISA (and so the
        // conformance suite) masks them.
        if shift && !x && self.p.prog_type != PROG_TYPE_CONFORMANCE && !(0..bits).contains(&i.imm) {
            return Err(RejectKind::InvalidShift { imm: i.imm });
        }
        let dst = Self::read(st, i.dst)?;
        let v = match (dst, src) {
            (Reg::Scalar { s: a, .. }, Reg::Scalar { s: b, .. }) => {
                let (a, b) = if is64 {
                    (a, b)
                } else {
                    (a.trunc32(), b.trunc32())
                };
                // As the kernel's verifier does, keep no bounds for division,
                // modulo, and shifts by an amount not known to be in range: a
                // program whose safety hangs on them passes here only if it
                // passes the kernel too.
                let untracked = matches!(o, op::DIV | op::MOD)
                    || (shift && !matches!(b.as_const(), Some(c) if c < bits as u64));
                let r = match o {
                    _ if untracked => Scalar::UNKNOWN,
                    op::ADD => a.add(&b),
                    op::SUB => a.sub(&b),
                    op::MUL => a.mul(&b),
                    op::DIV if i.off == 1 && !is64 => a.sext(4).sdiv(&b.sext(4)),
                    op::MOD if i.off == 1 && !is64 => a.sext(4).smod(&b.sext(4)),
                    op::DIV if i.off == 1 => a.sdiv(&b),
                    op::MOD if i.off == 1 => a.smod(&b),
                    op::DIV => a.udiv(&b),
                    op::MOD => a.umod(&b),
                    op::OR => a.or(&b),
                    op::AND => a.and(&b),
                    op::XOR => a.xor(&b),
                    op::LSH => a.shift(&b, Shift::Left, bits as u32),
                    op::RSH => a.shift(&b, Shift::Right, bits as u32),
                    op::ARSH if is64 => a.shift(&b, Shift::Arith, 64),
                    op::ARSH => a.sext(4).shift(&b, Shift::Arith, 32),
                    _ => return Err(RejectKind::UnknownOpcode { code: i.code }),
                };
                Reg::scalar(fix32(r))
            }
            // Privileged programs may turn pointers into numbers: the difference
            // of two pointers, or a 32-bit subtraction involving one, is a scalar.
            (d, s) if o == op::SUB && d.is_pointer() && s.is_pointer() => {
                if is64 {
                    Reg::unknown()
                } else {
                    unknown_bytes(4)
                }
            }
            (_, _) if o == op::SUB && !is64 => unknown_bytes(4),
            (d, s) => {
                if !is64 {
                    return Err(RejectKind::PtrOpProhibited {
                        reg: i.dst,
                        op: "32-bit pointer arithmetic",
                    });
                }
                match (o, d, s) {
                    (op::ADD, p, Reg::Scalar { s, .. }) if p.is_pointer() => {
                        self.ptr_add(p, s, i.dst)?
                    }
                    (op::ADD, Reg::Scalar { s, .. }, p) if p.is_pointer() => {
                        self.ptr_add(p, s, i.src)?
                    }
                    // The kernel never lets a stack pointer be subtracted from.
                    (
                        op::SUB,
                        Reg::Ptr {
                            region: Region::Stack { .. },
                            ..
                        },
                        Reg::Scalar { .. },
                    ) => {
                        return Err(RejectKind::PtrOpProhibited {
                            reg: i.dst,
                            op: "subtraction from stack pointer",
                        })
                    }
                    (op::SUB, p, Reg::Scalar { s, .. }) if p.is_pointer() => {
                        self.ptr_add(p, Scalar::konst(0).sub(&s), i.dst)?
                    }
                    (op::SUB, _, _) => {
                        return Err(RejectKind::PtrOpProhibited {
                            reg: i.dst,
                            op: "subtraction from pointer",
                        })
                    }
                    _ => {
                        let name = match o {
                            op::MUL => "multiplication",
                            op::DIV | op::MOD => "division",
                            op::LSH | op::RSH | op::ARSH => "shift",
                            _ => "bitwise operator",
                        };
                        return Err(RejectKind::PtrOpProhibited {
                            reg: i.dst,
                            op: name,
                        });
                    }
                }
            }
        };
        Self::write(st, i.dst, v)
    }

    /// `neg` and the byte swaps: of a pointer, privileged programs get a number.
    pub(super) fn unary(&mut self, st: &mut State, i: &Insn, is64: bool) -> R<()> {
        let v = match Self::read(st, i.dst)? {
            Reg::Scalar { s, .. } if i.code & op::OP_MASK == op::NEG => {
                if is64 {
                    Reg::scalar(Scalar::konst(0).sub(&s))
                } else {
                    Reg::scalar(Scalar::konst(0).sub(&s.trunc32()).trunc32())
                }
            }
            // A swap's width is its immediate, whatever the class: `le64` in the
            // 32-bit class still yields all 64 bits.
            Reg::Scalar { s, .. } => {
                let to_be = is64 || i.code & op::SRC_MASK == op::X;
                Reg::scalar(s.bswap(i.imm as u32 / 8, to_be))
            }
            _ if is64 || i.code & op::OP_MASK == op::END => Reg::unknown(),
            _ => unknown_bytes(4),
        };
        Self::write(st, i.dst, v)
    }
}
