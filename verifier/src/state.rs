//! Abstract machine state: registers, stack slots, call frames and held references,
//! with the "old state covers new state" test that state pruning rests on.

use std::fmt;

use crate::scalar::{Scalar, Tnum};

/// What a pointer points into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Region {
    /// The program's context (`struct pt_regs` for kprobes).
    Ctx,
    /// A stack frame, by depth in the call chain (0 = the main program).
    Stack { frame: u8 },
    /// A map value of map `fd`.
    MapValue { fd: i32, size: u32 },
    /// A record reserved from a ring buffer, released by submit/discard.
    Ringbuf { size: u32 },
    /// A plain memory buffer (the conformance program type's input).
    Mem { size: u32 },
    /// An inner map a lookup in a map of maps found, until a null check makes it a
    /// [`Reg::MapPtr`]; `fd` is the key its template answers to
    /// ([`inner_map_key`](crate::inner_map_key)).
    InnerMap { fd: i32 },
    /// A task, as `bpf_get_current_task_btf` gives it: the kernel's BTF pointer to a
    /// `task_struct`, which here is a token only the task helpers read.
    Task,
}

impl Region {
    pub fn name(&self) -> &'static str {
        match self {
            Region::Ctx => "ctx",
            Region::Stack { .. } => "fp",
            Region::MapValue { .. } => "map_value",
            Region::Ringbuf { .. } => "ringbuf_mem",
            Region::Mem { .. } => "mem",
            Region::InnerMap { .. } => "map_ptr",
            Region::Task => "ptr_task_struct",
        }
    }
}

/// The abstract value of one register (or of one spilled stack slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reg {
    Uninit,
    /// `id` links copies of one value so a comparison narrows all of them (0 = unlinked).
    Scalar {
        s: Scalar,
        id: u32,
    },
    /// `off` is the range of byte offsets from the region's start (from the frame
    /// pointer for the stack), `off_bits` the offset's known bits (its alignment).
    /// `id` ties copies of a may-be-null pointer together; `ref_id` names the
    /// reference a ring buffer record holds.
    Ptr {
        region: Region,
        off_min: i64,
        off_max: i64,
        off_bits: Tnum,
        nullable: bool,
        id: u32,
        ref_id: u32,
    },
    /// A map, as `lddw rX, map_fd` leaves it.
    MapPtr {
        fd: i32,
    },
    /// A subprogram's address, as `lddw rX, func` leaves it (callbacks).
    Func {
        pc: usize,
    },
}

impl Reg {
    pub fn scalar(s: Scalar) -> Reg {
        Reg::Scalar { s, id: 0 }
    }

    pub fn konst(v: u64) -> Reg {
        Reg::scalar(Scalar::konst(v))
    }

    pub fn unknown() -> Reg {
        Reg::scalar(Scalar::UNKNOWN)
    }

    pub fn ptr(region: Region, off: i64) -> Reg {
        Reg::Ptr {
            region,
            off_min: off,
            off_max: off,
            off_bits: Tnum::konst(off as u64),
            nullable: false,
            id: 0,
            ref_id: 0,
        }
    }

    pub fn as_scalar(&self) -> Option<Scalar> {
        match self {
            Reg::Scalar { s, .. } => Some(*s),
            _ => None,
        }
    }

    pub fn is_pointer(&self) -> bool {
        matches!(
            self,
            Reg::Ptr { .. } | Reg::MapPtr { .. } | Reg::Func { .. }
        )
    }

    /// The kernel's name for the type, used in diagnostics.
    pub fn type_name(&self) -> &'static str {
        match self {
            Reg::Uninit => "uninit",
            Reg::Scalar { .. } => "scalar",
            Reg::Ptr {
                region,
                nullable: false,
                ..
            } => region.name(),
            Reg::Ptr {
                region,
                nullable: true,
                ..
            } => match region {
                Region::MapValue { .. } => "map_value_or_null",
                Region::Ringbuf { .. } => "ringbuf_mem_or_null",
                // The lookup's result becomes a map pointer only when a null check
                // proves it is one. 6.18's name; 6.1 said "map_value_or_null".
                Region::InnerMap { .. } => "map_ptr_or_null",
                _ => "ptr_or_null",
            },
            Reg::MapPtr { .. } => "map_ptr",
            Reg::Func { .. } => "func",
        }
    }

    /// True when every concrete value `cur` may stand for is one `self` stands for,
    /// so that what was proved safe from `self` is safe from `cur` too.
    pub fn covers(&self, cur: &Reg, ids: &mut IdMap) -> bool {
        match (self, cur) {
            (Reg::Uninit, _) => true,
            (Reg::Scalar { s: a, id: ia }, Reg::Scalar { s: b, id: ib }) => {
                a.contains(b) && (*ia == 0 || ids.link(*ia, *ib))
            }
            (
                Reg::Ptr {
                    region: ra,
                    off_min: a0,
                    off_max: a1,
                    off_bits: ta,
                    nullable: na,
                    id: ia,
                    ref_id: fa,
                },
                Reg::Ptr {
                    region: rb,
                    off_min: b0,
                    off_max: b1,
                    off_bits: tb,
                    nullable: nb,
                    id: ib,
                    ref_id: fb,
                },
            ) => {
                ra == rb
                    && a0 <= b0
                    && a1 >= b1
                    && ta.contains(*tb)
                    && na == nb
                    && (!*na || ids.link(*ia, *ib))
                    && (*fa == 0 && *fb == 0 || ids.link(*fa | REF_TAG, *fb | REF_TAG))
            }
            (a, b) => a == b,
        }
    }

    /// A value covering both (loop widening for callbacks); `Uninit` when kinds differ.
    pub fn join(&self, o: &Reg) -> Reg {
        match (self, o) {
            (Reg::Scalar { s: a, .. }, Reg::Scalar { s: b, .. }) => {
                if a == b {
                    Reg::scalar(*a)
                } else {
                    Reg::unknown()
                }
            }
            (
                Reg::Ptr {
                    region: ra,
                    off_min: a0,
                    off_max: a1,
                    off_bits: ta,
                    nullable: na,
                    id,
                    ref_id,
                },
                Reg::Ptr {
                    region: rb,
                    off_min: b0,
                    off_max: b1,
                    off_bits: tb,
                    nullable: nb,
                    ..
                },
            ) if ra == rb && na == nb && !na => Reg::Ptr {
                region: *ra,
                off_min: (*a0).min(*b0),
                off_max: (*a1).max(*b1),
                off_bits: ta.union(*tb),
                nullable: false,
                id: *id,
                ref_id: *ref_id,
            },
            (a, b) if a == b => *a,
            _ => Reg::Uninit,
        }
    }
}

/// Keeps reference ids apart from value ids inside one [`IdMap`].
const REF_TAG: u32 = 1 << 31;

/// A consistent renaming of ids from an old state to the current one.
#[derive(Default)]
pub struct IdMap(Vec<(u32, u32)>);

impl IdMap {
    pub fn link(&mut self, old: u32, cur: u32) -> bool {
        for &(o, c) in &self.0 {
            if o == old {
                return c == cur;
            }
            if c == cur {
                return false;
            }
        }
        self.0.push((old, cur));
        true
    }
}

impl fmt::Display for Reg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reg::Uninit => write!(f, "uninit"),
            Reg::Scalar { s, id } => {
                if *id != 0 && s.as_const().is_none() {
                    write!(f, "{s}#{id}")
                } else {
                    write!(f, "{s}")
                }
            }
            Reg::Ptr {
                region: Region::Stack { frame },
                off_min,
                off_max,
                ..
            } => {
                if off_min == off_max {
                    write!(f, "fp{off_min}")?;
                } else {
                    write!(f, "fp(off={off_min}..{off_max})")?;
                }
                if *frame > 0 {
                    write!(f, "[frame{frame}]")?;
                }
                Ok(())
            }
            Reg::Ptr {
                region,
                off_min,
                off_max,
                id,
                ref_id,
                ..
            } => {
                write!(f, "{}(", self.type_name())?;
                if *id != 0 {
                    write!(f, "id={id},")?;
                }
                if *ref_id != 0 {
                    write!(f, "ref_obj_id={ref_id},")?;
                }
                match region {
                    Region::MapValue { fd, size } => write!(f, "map_fd={fd},vs={size},")?,
                    Region::Ringbuf { size } | Region::Mem { size } => write!(f, "sz={size},")?,
                    _ => {}
                }
                if off_min == off_max {
                    write!(f, "off={off_min})")
                } else {
                    write!(f, "off={off_min}..{off_max})")
                }
            }
            Reg::MapPtr { fd } => write!(f, "map_ptr(map_fd={fd})"),
            Reg::Func { pc } => write!(f, "func(pc={pc})"),
        }
    }
}

/// What one stack byte holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Byte {
    /// Never written: it reads as an unknown number (privileged programs may
    /// read uninitialized stack, as the kernel lets them).
    Invalid,
    /// Some scalar data.
    Misc,
    /// Known zero.
    Zero,
    /// Part of the register spilled into this 8-byte slot.
    Spill,
}

/// One aligned 8-byte stack slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    pub bytes: [Byte; 8],
    pub spill: Option<Reg>,
}

impl Slot {
    pub const EMPTY: Slot = Slot {
        bytes: [Byte::Invalid; 8],
        spill: None,
    };

    /// The slot's value read back as a register, if all of it is initialized.
    fn as_scalar_spill(&self) -> Option<Scalar> {
        if let Some(r) = self.spill {
            return r.as_scalar();
        }
        if self.bytes.iter().all(|b| *b == Byte::Zero) {
            return Some(Scalar::konst(0));
        }
        None
    }

    /// Which bytes hold the spilled register (all 8, or an aligned part of a scalar).
    fn spill_mask(&self) -> u8 {
        self.bytes
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == Byte::Spill)
            .fold(0, |m, (i, _)| m | 1 << i)
    }

    fn covers(&self, cur: &Slot, ids: &mut IdMap) -> bool {
        if let Some(o) = &self.spill {
            let layout = self.spill_mask();
            let spill_ok = match &cur.spill {
                Some(c) => layout == cur.spill_mask() && o.covers(c, ids),
                None if layout == 0xff => match (o, cur.as_scalar_spill()) {
                    (Reg::Scalar { .. }, Some(s)) => o.covers(&Reg::scalar(s), ids),
                    _ => false,
                },
                None => false,
            };
            if !spill_ok {
                return false;
            }
            if layout == 0xff {
                return true;
            }
            // The bytes around a partial spill follow the plain rules below.
            let rest = Slot {
                bytes: self
                    .bytes
                    .map(|b| if b == Byte::Spill { Byte::Invalid } else { b }),
                spill: None,
            };
            let cur_rest = Slot {
                bytes: cur
                    .bytes
                    .map(|b| if b == Byte::Spill { Byte::Misc } else { b }),
                spill: None,
            };
            return rest.covers(&cur_rest, ids);
        }
        let cur_scalar = cur
            .spill
            .map(|r| matches!(r, Reg::Scalar { .. }))
            .unwrap_or(true);
        let cur_zero = cur
            .spill
            .map(|r| r.as_scalar().and_then(|s| s.as_const()) == Some(0));
        self.bytes
            .iter()
            .zip(cur.bytes.iter())
            .all(|(o, c)| match (o, c) {
                (Byte::Invalid, _) => true,
                // Unwritten bytes read as unknown numbers, just like misc data.
                (Byte::Misc, Byte::Misc | Byte::Zero | Byte::Invalid) => true,
                (Byte::Misc, Byte::Spill) => cur_scalar,
                (Byte::Zero, Byte::Zero) => true,
                (Byte::Zero, Byte::Spill) => cur_zero == Some(true),
                _ => false,
            })
    }

    fn join(&self, o: &Slot) -> Slot {
        if self == o {
            return *self;
        }
        if let (Some(a), Some(b)) = (&self.spill, &o.spill) {
            let j = a.join(b);
            if j != Reg::Uninit && self.bytes == o.bytes {
                return Slot {
                    bytes: self.bytes,
                    spill: Some(j),
                };
            }
        }
        let init = |s: &Slot, i: usize| match s.bytes[i] {
            Byte::Invalid => false,
            Byte::Spill => matches!(s.spill, Some(Reg::Scalar { .. })),
            _ => true,
        };
        let mut r = Slot::EMPTY;
        for i in 0..8 {
            r.bytes[i] = if self.bytes[i] == o.bytes[i] && self.bytes[i] != Byte::Spill {
                self.bytes[i]
            } else if init(self, i) && init(o, i) {
                Byte::Misc
            } else {
                Byte::Invalid
            };
        }
        r
    }
}

/// What brought a frame into being, needed to leave it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    Main,
    /// A bpf-to-bpf call; execution resumes at `ret`.
    Call {
        ret: usize,
    },
    /// A `bpf_loop` callback entered from the helper call at `call`; `ctx` is the
    /// value handed to every iteration.
    Loop {
        call: usize,
        ctx: Reg,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub regs: [Reg; 11],
    /// `stack[k]` holds the bytes `[-8k-8, -8k)` from the frame pointer; grown on use.
    pub stack: Vec<Slot>,
    pub kind: FrameKind,
    /// First instruction of the subprogram running in this frame.
    pub subprog: usize,
    /// Which `bpf_loop` call made this callback frame (0 otherwise); not part of
    /// state comparison, only of which states a callback iteration may prune on.
    pub invocation: u32,
    /// Which iteration of its `bpf_loop` a callback frame runs (0 otherwise):
    /// equal states of different iterations are progress, not an infinite loop.
    pub iteration: u32,
}

impl Frame {
    pub fn new(depth: u8, kind: FrameKind, subprog: usize) -> Frame {
        let mut regs = [Reg::Uninit; 11];
        regs[10] = Reg::ptr(Region::Stack { frame: depth }, 0);
        Frame {
            regs,
            stack: Vec::new(),
            kind,
            subprog,
            invocation: 0,
            iteration: 0,
        }
    }

    /// Slot index and byte index for a (negative) frame offset.
    pub fn locate(off: i64) -> (usize, usize) {
        let from_top = (-off - 1) as usize;
        let slot = from_top / 8;
        (slot, 7 - from_top % 8)
    }

    pub fn slot_mut(&mut self, k: usize) -> &mut Slot {
        if self.stack.len() <= k {
            self.stack.resize(k + 1, Slot::EMPTY);
        }
        &mut self.stack[k]
    }

    pub fn slot(&self, k: usize) -> Slot {
        self.stack.get(k).copied().unwrap_or(Slot::EMPTY)
    }
}

/// The whole abstract state of one path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub frames: Vec<Frame>,
    /// References held (ring buffer records), with the instruction that took each.
    pub refs: Vec<(u32, usize)>,
}

impl State {
    pub fn cur(&self) -> &Frame {
        self.frames.last().expect("a state always has a frame")
    }

    pub fn cur_mut(&mut self) -> &mut Frame {
        self.frames.last_mut().expect("a state always has a frame")
    }

    /// Every register and spilled value in every frame, for id-wide updates.
    pub fn for_each_reg(&mut self, mut f: impl FnMut(&mut Reg)) {
        for fr in &mut self.frames {
            fr.regs.iter_mut().for_each(&mut f);
            for s in &mut fr.stack {
                if let Some(r) = &mut s.spill {
                    f(r);
                }
            }
        }
    }

    /// `self` (an explored state) covers `cur` where `live[d]` marks the registers
    /// of frame `d` that may still be read.
    pub fn covers(&self, cur: &State, live: &[u16]) -> bool {
        if self.frames.len() != cur.frames.len() || self.refs.len() != cur.refs.len() {
            return false;
        }
        let mut ids = IdMap::default();
        for (d, (o, c)) in self.frames.iter().zip(&cur.frames).enumerate() {
            if o.kind != c.kind || o.subprog != c.subprog {
                return false;
            }
            for r in 0..10 {
                if live[d] & (1 << r) != 0 && !o.regs[r].covers(&c.regs[r], &mut ids) {
                    return false;
                }
            }
            let n = o.stack.len().max(c.stack.len());
            for k in 0..n {
                if !o.slot(k).covers(&c.slot(k), &mut ids) {
                    return false;
                }
            }
        }
        self.refs
            .iter()
            .zip(&cur.refs)
            .all(|((a, _), (b, _))| ids.link(*a | REF_TAG, *b | REF_TAG))
    }

    /// Equal on everything that may still be read: the "did not make progress" test
    /// of the infinite-loop check.
    pub fn same_as(&self, cur: &State, live: &[u16]) -> bool {
        if self.frames.len() != cur.frames.len() || self.refs.len() != cur.refs.len() {
            return false;
        }
        for (d, (o, c)) in self.frames.iter().zip(&cur.frames).enumerate() {
            if o.kind != c.kind || o.subprog != c.subprog {
                return false;
            }
            for r in 0..10 {
                if live[d] & (1 << r) != 0 && !same_reg(&o.regs[r], &c.regs[r]) {
                    return false;
                }
            }
            let n = o.stack.len().max(c.stack.len());
            for k in 0..n {
                let (a, b) = (o.slot(k), c.slot(k));
                let spill_same = match (&a.spill, &b.spill) {
                    (Some(x), Some(y)) => same_reg(x, y),
                    (None, None) => true,
                    _ => false,
                };
                if a.bytes != b.bytes || !spill_same {
                    return false;
                }
            }
        }
        true
    }

    /// Widens `self` to also cover `o` (same frames); used at callback re-entry.
    pub fn join(&self, o: &State) -> State {
        let mut r = self.clone();
        for (fa, fb) in r.frames.iter_mut().zip(&o.frames) {
            for (a, b) in fa.regs.iter_mut().zip(&fb.regs) {
                *a = a.join(b);
            }
            let n = fa.stack.len().max(fb.stack.len());
            let joined: Vec<Slot> = (0..n).map(|k| fa.slot(k).join(&fb.slot(k))).collect();
            fa.stack = joined;
        }
        r
    }
}

/// Equality that ignores how link ids are numbered.
fn same_reg(a: &Reg, b: &Reg) -> bool {
    match (a, b) {
        (Reg::Scalar { s: x, .. }, Reg::Scalar { s: y, .. }) => x == y,
        (
            Reg::Ptr {
                region: ra,
                off_min: a0,
                off_max: a1,
                off_bits: ta,
                nullable: na,
                ..
            },
            Reg::Ptr {
                region: rb,
                off_min: b0,
                off_max: b1,
                off_bits: tb,
                nullable: nb,
                ..
            },
        ) => ra == rb && a0 == b0 && a1 == b1 && ta == tb && na == nb,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_maps_offsets_to_slots() {
        assert_eq!(Frame::locate(-8), (0, 0));
        assert_eq!(Frame::locate(-1), (0, 7));
        assert_eq!(Frame::locate(-9), (1, 7));
        assert_eq!(Frame::locate(-512), (63, 0));
    }

    #[test]
    fn wider_scalar_covers_narrower() {
        let mut ids = IdMap::default();
        let wide = Reg::scalar(Scalar::urange(0, 10));
        let narrow = Reg::scalar(Scalar::urange(2, 3));
        assert!(wide.covers(&narrow, &mut ids));
        assert!(!narrow.covers(&wide, &mut ids));
    }
}
