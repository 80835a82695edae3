//! The abstract interpreter: walks every path of the program depth-first, checks
//! each instruction against the abstract state, and prunes a path when a state
//! already proved safe at the same instruction covers it.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use bpftime_isa::bprintf;
use bpftime_isa::opcode as op;
use bpftime_isa::uapi::{self, helper as h, map_flags, map_type as mt};
use bpftime_isa::Insn;

use crate::cfg::{self, Cfg};
use crate::disasm::disasm;
use crate::error::{RejectKind, Rejection, Verified};
use crate::helpers::{self, Arg, Ret};
use crate::scalar::{Cmp, Scalar, Shift, Tnum};
use crate::state::{Byte, Frame, FrameKind, Reg, Region, Slot, State};

mod alu;
mod branches;
mod calls;
mod memory;

/// Program type of the conformance suite's programs (not a kernel number): `r1`
/// points to a read-write buffer of `ProgramInfo::mem_len` bytes and `r2` holds
/// that length.
pub const PROG_TYPE_CONFORMANCE: u32 = 0x4254_0001;

/// Size of the context of kprobe/uprobe programs: x86-64 `struct pt_regs`, 21 u64s.
pub const PT_REGS_SIZE: u32 = 168;

/// Where a tracepoint program may read its record: past the 8 bytes of `common_*`
/// fields (the kernel refuses those) and below 2048 (`PERF_MAX_TRACE_SIZE` on Linux
/// 6.1; 6.18 allows 8192). How much of that the record holds is checked when the
/// program is attached, against the program's [`Verified::ctx_read_end`].
pub const TRACEPOINT_CTX: std::ops::Range<i64> = 8..2048;

/// Where a raw tracepoint program may read its context, an array of up to 12 u64
/// arguments (`MAX_BPF_FUNC_ARGS`); how many the tracepoint has is checked at attach.
pub const RAW_TRACEPOINT_CTX: std::ops::Range<i64> = 0..96;

/// Stored states compared at each pruning point, newest first.
const SCAN_STATES: usize = 64;
/// Instructions a path runs between two stored states.
const STORE_EVERY: u32 = 8;

/// Stored states at one instruction before drifting wide numbers are widened.
const WIDEN_AFTER: usize = 16;

/// Largest offset a pointer may carry, as the kernel bounds it.
const MAX_VAR_OFF: i64 = 1 << 29;

/// What the loader knows about a map an `lddw` names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapDesc {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
    pub flags: u32,
    /// `BPF_MAP_FREEZE` was done before the program loaded: system calls can no
    /// longer write the map.
    pub frozen: bool,
    /// The value bytes of a frozen array of one element (global data: libbpf's
    /// `.rodata`), `None` for any other map. When programs cannot write the map
    /// either (`BPF_F_RDONLY_PROG`) nobody can, so the verifier reads constant
    /// strings from them at load, as the kernel does (`bpf_snprintf`'s format).
    pub frozen_value: Option<Arc<[u8]>>,
}

/// The key [`ProgramInfo::maps`] is asked with for the template of the inner maps
/// of the map of maps `fd` (a lookup in it gives one of them). Map fds and indices are
/// never negative, so these keys are apart from theirs.
pub fn inner_map_key(fd: i32) -> i32 {
    !fd
}

/// The map of maps whose inner template `key` names, if it is such a key.
pub fn inner_map_owner(key: i32) -> Option<i32> {
    (key < 0).then_some(!key)
}

/// The program to verify and what it runs against.
pub struct ProgramInfo<'a> {
    pub insns: &'a [Insn],
    /// A `bpftime_isa::uapi::prog_type` number or [`PROG_TYPE_CONFORMANCE`].
    pub prog_type: u32,
    /// The program will run on a GPU: only GPU helpers and map types are allowed.
    pub gpu: bool,
    /// Resolves the `imm` of an `lddw` with a map source (fd or index) to its map, and
    /// [`inner_map_key`]`(imm)` of a map of maps to the template of its inner maps.
    pub maps: &'a dyn Fn(i32) -> Option<MapDesc>,
    /// Size of the input buffer, for [`PROG_TYPE_CONFORMANCE`] only.
    pub mem_len: u32,
}

#[derive(Clone, Debug)]
pub struct Options {
    /// 0: only the failure; 1: every processed instruction; 2: with register states.
    pub log_level: u32,
    /// The complexity limit, in processed instructions.
    pub max_processed: u64,
    /// The verbose log stops growing past this many bytes.
    pub max_log_bytes: usize,
    /// Source lines from the loader's BTF line info, sorted by instruction; a
    /// rejection names the line its instruction came from, as the kernel's log does.
    pub source_lines: Vec<SourceLine>,
}

/// One BTF line-info record, resolved: the instructions from `insn` up to the next
/// record's came from `line` of `file`, whose text is `text`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceLine {
    pub insn: usize,
    pub file: String,
    pub line: u32,
    pub text: String,
}

/// The line that covers `insn`: the last one starting at or before it.
fn source_of(lines: &[SourceLine], insn: usize) -> Option<&SourceLine> {
    let at = lines.partition_point(|l| l.insn <= insn).checked_sub(1)?;
    lines.get(at)
}

impl Default for Options {
    fn default() -> Self {
        Options {
            log_level: 0,
            max_processed: uapi::MAX_INSNS as u64,
            max_log_bytes: 16 << 20,
            source_lines: Vec::new(),
        }
    }
}

/// Verifies `p`: `Ok` with statistics when every path is safe, else the first
/// failure found, with its diagnostics.
pub fn verify(p: &ProgramInfo, opts: &Options) -> Result<Verified, Rejection> {
    verify_paths(p, opts).map_err(|mut r| {
        r.source_line = source_of(&opts.source_lines, r.insn).map(|l| Box::new(l.clone()));
        r
    })
}

fn verify_paths(p: &ProgramInfo, opts: &Options) -> Result<Verified, Rejection> {
    let fail = |insn: usize, kind: RejectKind| {
        let disasm = p
            .insns
            .get(insn)
            .map(|i| disasm(i, p.insns.get(insn + 1)))
            .unwrap_or_default();
        Rejection {
            insn,
            kind,
            disasm: disasm.into(),
            regs: Vec::new(),
            verbose: Box::default(),
            source_line: None,
        }
    };
    if p.insns.is_empty() {
        return Err(fail(0, RejectKind::EmptyProgram));
    }
    if p.insns.len() > uapi::MAX_INSNS {
        return Err(fail(0, RejectKind::ProgramTooLarge { len: p.insns.len() }));
    }
    if ctx_range(p.prog_type).is_none() && p.prog_type != PROG_TYPE_CONFORMANCE {
        return Err(fail(
            0,
            RejectKind::UnsupportedProgType {
                prog_type: p.prog_type,
            },
        ));
    }
    let cfg = cfg::analyze(p.insns, p.prog_type == PROG_TYPE_CONFORMANCE)
        .map_err(|(pc, k)| fail(pc, k))?;
    let mut v = Verifier {
        p,
        opts,
        cfg,
        maps: HashMap::new(),
        checkpoints: Vec::new(),
        at: HashMap::new(),
        next_id: 1,
        depth: HashMap::new(),
        has_tail_call: p.insns.iter().any(|i| {
            i.code == op::CALL_INSN && i.src == op::CALL_HELPER && i.imm == h::TAIL_CALL as i32
        }),
        log: String::new(),
        stats: Verified::default(),
    };
    v.run()
}

/// Where programs of `prog_type` may read their context, for the types it verifies.
fn ctx_range(prog_type: u32) -> Option<std::ops::Range<i64>> {
    match prog_type {
        uapi::prog_type::KPROBE => Some(0..PT_REGS_SIZE as i64),
        uapi::prog_type::TRACEPOINT => Some(TRACEPOINT_CTX),
        uapi::prog_type::RAW_TRACEPOINT => Some(RAW_TRACEPOINT_CTX),
        _ => None,
    }
}

/// A state kept at a pruning point. `branches` counts the paths below it still
/// being explored: at 0 it is proved safe and may prune others.
struct Checkpoint {
    state: State,
    branches: u32,
    parent: Option<usize>,
}

struct Path {
    state: State,
    pc: usize,
    /// Nearest checkpoint this path descends from.
    parent: Option<usize>,
    /// Instructions processed since this path last stored a checkpoint.
    since: u32,
    /// The branch instruction this path forked at, for the log.
    from: usize,
}

enum Flow {
    Goto(usize),
    /// Continue at `.0`; also explore `.1` from `.2`.
    Fork(usize, State, usize),
    End,
}

type R<T> = Result<T, RejectKind>;

struct Verifier<'a> {
    p: &'a ProgramInfo<'a>,
    opts: &'a Options,
    cfg: Cfg,
    maps: HashMap<i32, MapDesc>,
    checkpoints: Vec<Checkpoint>,
    at: HashMap<usize, Vec<usize>>,
    next_id: u32,
    /// Deepest stack use seen per subprogram (by its first instruction), for
    /// the combined-stack limit.
    depth: HashMap<usize, u32>,
    has_tail_call: bool,
    log: String,
    stats: Verified,
}

fn unknown_bytes(size: u32) -> Reg {
    Reg::scalar(Scalar::unknown_bytes(size))
}

impl<'a> Verifier<'a> {
    fn run(&mut self) -> Result<Verified, Rejection> {
        let mut first = Frame::new(0, FrameKind::Main, 0);
        if self.p.prog_type == PROG_TYPE_CONFORMANCE {
            first.regs[1] = Reg::ptr(
                Region::Mem {
                    size: self.p.mem_len,
                },
                0,
            );
            first.regs[2] = Reg::konst(self.p.mem_len as u64);
        } else {
            first.regs[1] = Reg::ptr(Region::Ctx, 0);
        }
        let mut work = vec![Path {
            state: State {
                frames: vec![first],
                refs: Vec::new(),
            },
            pc: 0,
            parent: None,
            since: 0,
            from: 0,
        }];
        let mut first_path = true;
        while let Some(mut path) = work.pop() {
            if self.opts.log_level > 0 && !first_path {
                self.logln(format_args!(
                    "from {} to {}:{}",
                    path.from,
                    path.pc,
                    self.regs_text(&path.state)
                ));
            }
            first_path = false;
            loop {
                let pc = path.pc;
                if self.cfg.prune[pc]
                    && self
                        .checkpoint(&mut path)
                        .map_err(|k| self.reject(&path.state, pc, k))?
                {
                    self.finish(path.parent);
                    break;
                }
                // Like the kernel, an instruction's fields are judged when a path
                // reaches it: dead code is never run.
                if let Some(k) = self.cfg.deferred[pc].clone() {
                    return Err(self.reject(&path.state, pc, k));
                }
                self.stats.insns_processed += 1;
                path.since += 1;
                if self.stats.insns_processed > self.opts.max_processed {
                    let processed = self.stats.insns_processed;
                    return Err(self.reject(&path.state, pc, RejectKind::TooComplex { processed }));
                }
                if self.opts.log_level > 0 {
                    let i = &self.p.insns[pc];
                    let line = disasm(i, self.p.insns.get(pc + 1));
                    if self.opts.log_level > 1 {
                        let regs = self.regs_text(&path.state);
                        self.logln(format_args!("{pc}: {line} ;{regs}"));
                    } else {
                        self.logln(format_args!("{pc}: {line}"));
                    }
                }
                match self.step(&mut path.state, pc) {
                    // Checks run before an instruction writes its results, so the
                    // state still shows what the failing instruction saw.
                    Err(k) => return Err(self.reject(&path.state, pc, k)),
                    Ok(Flow::Goto(t)) => path.pc = t,
                    Ok(Flow::Fork(t, other, other_pc)) => {
                        if let Some(p) = path.parent {
                            self.checkpoints[p].branches += 1;
                        }
                        work.push(Path {
                            state: other,
                            pc: other_pc,
                            parent: path.parent,
                            since: path.since,
                            from: pc,
                        });
                        path.pc = t;
                    }
                    Ok(Flow::End) => {
                        self.finish(path.parent);
                        break;
                    }
                }
            }
        }
        self.check_stack_chains()?;
        self.stats.states = self.checkpoints.len() as u64;
        self.stats.stack_depth = self.depth.values().copied().max().unwrap_or(0);
        if self.opts.log_level > 0 {
            let s = &self.stats;
            let line = format!(
                "processed {} insns (limit {}) total_states {} peak_states {} pruned {}",
                s.insns_processed, self.opts.max_processed, s.states, s.peak_states, s.pruned
            );
            self.logln(format_args!("{line}"));
        }
        self.stats.log = std::mem::take(&mut self.log);
        Ok(std::mem::take(&mut self.stats))
    }

    fn logln(&mut self, args: std::fmt::Arguments<'_>) {
        if self.log.len() < self.opts.max_log_bytes {
            let _ = self.log.write_fmt(args);
            self.log.push('\n');
        }
    }

    fn regs_text(&self, st: &State) -> String {
        let mut s = String::new();
        if st.frames.len() > 1 {
            let _ = write!(s, " frame{}:", st.frames.len() - 1);
        }
        for (r, v) in st.cur().regs.iter().enumerate() {
            if *v != Reg::Uninit {
                let _ = write!(s, " R{r}={v}");
            }
        }
        s
    }

    fn reject(&self, st: &State, pc: usize, kind: RejectKind) -> Rejection {
        let insns = self.p.insns;
        let i = insns.get(pc).copied().unwrap_or_default();
        let mut used: Vec<u8> = match i.class() {
            op::JMP if i.code & op::OP_MASK == op::CALL => (1..=5).collect(),
            op::JMP if i.code & op::OP_MASK == op::EXIT => vec![0],
            op::LD if i.is_lddw() => vec![],
            _ => {
                let x = matches!(i.class(), op::LDX | op::STX) || i.code & op::SRC_MASK == op::X;
                if x {
                    vec![i.dst, i.src]
                } else {
                    vec![i.dst]
                }
            }
        };
        used.sort_unstable();
        used.dedup();
        // An invalid register number (a malformed instruction) has no state.
        let regs = used
            .into_iter()
            .filter_map(|r| Some((r, *st.cur().regs.get(r as usize)?)))
            .filter(|(_, v)| *v != Reg::Uninit)
            .collect();
        Rejection {
            insn: pc,
            kind,
            disasm: disasm(&i, insns.get(pc + 1)).into(),
            regs,
            verbose: self.log.as_str().into(),
            source_line: None,
        }
    }

    fn fresh_id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    /// A path ended (exit, or pruned): checkpoints with nothing left below them are proved.
    fn finish(&mut self, mut parent: Option<usize>) {
        while let Some(p) = parent {
            let cp = &mut self.checkpoints[p];
            cp.branches -= 1;
            if cp.branches > 0 {
                break;
            }
            parent = cp.parent;
        }
    }

    /// Registers that may still be read, per frame, for a state at `pc`.
    fn live_masks(&self, st: &State, pc: usize) -> Vec<u16> {
        let mut m: Vec<u16> = st
            .frames
            .windows(2)
            .map(|w| {
                // A caller sees only r6-r9 again (r0 is the callee's, r1-r5 are clobbered).
                let ret = match w[1].kind {
                    FrameKind::Call { ret } => ret,
                    FrameKind::Loop { call, .. } => call + 1,
                    FrameKind::Main => pc,
                };
                self.cfg.live[ret] & 0x3c0
            })
            .collect();
        m.push(self.cfg.live[pc]);
        m
    }

    /// At a pruning point: `Ok(true)` when an explored state covers this one.
    fn checkpoint(&mut self, path: &mut Path) -> R<bool> {
        let pc = path.pc;
        let live = self.live_masks(&path.state, pc);
        let callback_entry = matches!(path.state.cur().kind, FrameKind::Loop { .. })
            && pc == path.state.cur().subprog;
        let mut widen_with = None;
        let mut loop_ancestor = None;
        let stored_here = self.at.get(&pc).map_or(0, Vec::len);
        if let Some(list) = self.at.get(&pc) {
            // Recent states prune best; an old one that still could is rare, and a
            // full scan would make long loops quadratic.
            for &idx in list.iter().rev().take(SCAN_STATES) {
                let cp = &self.checkpoints[idx];
                let same_run =
                    callback_entry && cp.state.cur().invocation == path.state.cur().invocation;
                if cp.branches == 0 || same_run {
                    // A callback's iterations are bounded by its helper, so covering an
                    // ancestor iteration (a fixpoint) is enough there.
                    if cp.state.covers(&path.state, &live) {
                        self.stats.pruned += 1;
                        return Ok(true);
                    }
                    if same_run && cp.branches > 0 && widen_with.is_none() {
                        widen_with = Some(idx);
                    }
                } else if cp.state.same_as(&path.state, &live)
                    && same_iterations(&cp.state, &path.state)
                {
                    return Err(RejectKind::InfiniteLoop { insn: pc });
                } else if loop_ancestor.is_none() {
                    loop_ancestor = Some(idx);
                }
            }
        }
        // A loop head that keeps collecting states: numbers that were already
        // nearly unknown and still drift (a count of matches, say) become
        // unknown, so that the iterations can prune each other. The kernel gets
        // there by tracking which values need to be precise; this is cheaper and
        // still sound (a wider value covers the narrower one).
        if let (Some(idx), true) = (loop_ancestor, stored_here >= WIDEN_AFTER) {
            let old = &self.checkpoints[idx].state;
            if old.frames.len() == path.state.frames.len() {
                for (d, (of, cf)) in old
                    .frames
                    .iter()
                    .zip(path.state.frames.iter_mut())
                    .enumerate()
                {
                    for r in 0..10 {
                        if live[d] & (1 << r) == 0 {
                            continue;
                        }
                        if let (Reg::Scalar { s: a, .. }, Reg::Scalar { s: b, .. }) =
                            (of.regs[r], cf.regs[r])
                        {
                            if !a.contains(&b) && wide(&a) && wide(&b) {
                                cf.regs[r] = Reg::unknown();
                            }
                        }
                    }
                }
            }
        }
        // Like the kernel, keep a state only every few instructions: enough to prune
        // and to catch loops, without one state per iteration of a tight loop.
        if path.since < STORE_EVERY && !callback_entry {
            return Ok(false);
        }
        path.since = 0;
        if let Some(idx) = widen_with {
            let old = &self.checkpoints[idx].state;
            // Widening keeps the old state's references, so only when they are the same.
            if old.frames.len() == path.state.frames.len() && old.refs == path.state.refs {
                let mut joined = old.join(&path.state);
                // The widened state is still this path's iteration.
                for (j, f) in joined.frames.iter_mut().zip(&path.state.frames) {
                    j.iteration = f.iteration;
                }
                path.state = joined;
            }
        }
        let idx = self.checkpoints.len();
        self.checkpoints.push(Checkpoint {
            state: path.state.clone(),
            branches: 1,
            parent: path.parent,
        });
        let list = self.at.entry(pc).or_default();
        list.push(idx);
        self.stats.peak_states = self.stats.peak_states.max(list.len() as u64);
        path.parent = Some(idx);
        Ok(false)
    }

    fn map(&mut self, fd: i32) -> R<MapDesc> {
        if let Some(m) = self.maps.get(&fd) {
            return Ok(m.clone());
        }
        let m = (self.p.maps)(fd).ok_or(RejectKind::UnknownMap { fd })?;
        if !helpers::KNOWN_MAP_TYPES.contains(&m.map_type) {
            return Err(RejectKind::UnsupportedMapType {
                map_type: m.map_type,
            });
        }
        if self.p.gpu && !helpers::GPU_MAP_TYPES.contains(&m.map_type) {
            return Err(RejectKind::MapTypeNotOnGpu {
                map_type: m.map_type,
            });
        }
        self.maps.insert(fd, m.clone());
        Ok(m)
    }

    fn read(st: &State, r: u8) -> R<Reg> {
        match st.cur().regs[r as usize] {
            Reg::Uninit => Err(RejectKind::UninitRegister { reg: r }),
            v => Ok(v),
        }
    }

    fn write(st: &mut State, r: u8, v: Reg) -> R<()> {
        if r == 10 {
            return Err(RejectKind::FramePointerWrite);
        }
        st.cur_mut().regs[r as usize] = v;
        Ok(())
    }

    fn step(&mut self, st: &mut State, pc: usize) -> R<Flow> {
        let i = self.p.insns[pc];
        match i.class() {
            op::ALU | op::ALU64 => {
                self.alu(st, &i)?;
                Ok(Flow::Goto(pc + 1))
            }
            op::LDX => {
                let base = Self::read(st, i.src)?;
                let size = op::size_bytes(i.code) as u32;
                let mut v = self.load(st, i.src, base, i.off as i64, size)?;
                if i.code & op::MODE_MASK == op::MEMSX {
                    if let Reg::Scalar { s, .. } = v {
                        v = Reg::scalar(s.sext(size));
                    }
                }
                Self::write(st, i.dst, v)?;
                Ok(Flow::Goto(pc + 1))
            }
            op::ST | op::STX => {
                let base = Self::read(st, i.dst)?;
                let size = op::size_bytes(i.code) as u32;
                if i.code & op::MODE_MASK == op::ATOMIC {
                    self.atomic(st, &i, base, size)?;
                } else {
                    let val = if i.class() == op::STX {
                        Self::read(st, i.src)?
                    } else {
                        Reg::konst(i.imm as i64 as u64)
                    };
                    self.store(st, i.dst, base, i.off as i64, size, val)?;
                }
                Ok(Flow::Goto(pc + 1))
            }
            op::LD => {
                if !i.is_lddw() {
                    return Err(RejectKind::LdAbsNotAllowed);
                }
                let hi = self.p.insns[pc + 1].imm;
                let v = match i.src {
                    0 => Reg::konst(((hi as u32 as u64) << 32) | i.imm as u32 as u64),
                    op::PSEUDO_MAP_FD | op::PSEUDO_MAP_IDX | op::PSEUDO_FUNC if hi != 0 => {
                        return Err(RejectKind::InvalidLdImm64);
                    }
                    op::PSEUDO_MAP_FD | op::PSEUDO_MAP_IDX => {
                        self.map(i.imm)?;
                        Reg::MapPtr { fd: i.imm }
                    }
                    op::PSEUDO_MAP_VALUE | op::PSEUDO_MAP_IDX_VALUE => {
                        let m = self.map(i.imm)?;
                        let off = hi as u32;
                        // Only single-element arrays (global data) have one address.
                        let direct = mt::served_as(m.map_type) == mt::ARRAY && m.max_entries == 1;
                        if off >= m.value_size || !direct {
                            return Err(RejectKind::MapValueOffset {
                                value_size: m.value_size,
                                off: off as i64,
                            });
                        }
                        Reg::ptr(
                            Region::MapValue {
                                fd: i.imm,
                                size: m.value_size,
                            },
                            off as i64,
                        )
                    }
                    op::PSEUDO_FUNC => Reg::Func {
                        pc: (pc as i64 + i.imm as i64 + 1) as usize,
                    },
                    s => return Err(RejectKind::UnsupportedLdImm64 { src: s }),
                };
                Self::write(st, i.dst, v)?;
                Ok(Flow::Goto(pc + 2))
            }
            _ => self.jump(st, &i, pc),
        }
    }

    // ---- ALU ---------------------------------------------------------------
}

fn eval32(cmp: Cmp, a: u32, b: u32) -> bool {
    let (sa, sb) = (a as i32, b as i32);
    match cmp {
        Cmp::Eq => a == b,
        Cmp::Ne => a != b,
        Cmp::Gt => a > b,
        Cmp::Ge => a >= b,
        Cmp::Lt => a < b,
        Cmp::Le => a <= b,
        Cmp::Sgt => sa > sb,
        Cmp::Sge => sa >= sb,
        Cmp::Slt => sa < sb,
        Cmp::Sle => sa <= sb,
        Cmp::Set => a & b != 0,
        Cmp::NotSet => a & b == 0,
    }
}

/// The key a stack pointer points to, when it is a known constant: `size` zero
/// bytes, or a scalar constant spilled with exactly that size, inside one slot.
fn const_stack_key(st: &State, key: Reg, size: u32) -> Option<u64> {
    let Reg::Ptr {
        region: Region::Stack { frame },
        off_min,
        off_max,
        ..
    } = key
    else {
        return None;
    };
    if off_min != off_max || !(1..=8).contains(&size) {
        return None;
    }
    let (k, b) = Frame::locate(off_min);
    let end = b + size as usize;
    if end > 8 {
        return None;
    }
    let slot = st.frames[frame as usize].slot(k);
    if slot.bytes[b..end].iter().all(|x| *x == Byte::Zero) {
        return Some(0);
    }
    // Like the kernel, only a spill at the slot's start (an 8-aligned offset)
    // carries its value.
    let exact = b == 0
        && slot
            .bytes
            .iter()
            .enumerate()
            .all(|(i, x)| (*x == Byte::Spill) == (b..end).contains(&i));
    match slot.spill {
        Some(Reg::Scalar { s, .. }) if exact => s.as_const(),
        _ => None,
    }
}

/// A number whose range is already so wide (2^31 values or more) that its exact
/// bounds rarely prove anything.
fn wide(s: &Scalar) -> bool {
    s.umax - s.umin >= 1 << 31 && s.smax.abs_diff(s.smin) >= 1 << 31
}

/// Largest errno a helper returns (negated).
const MAX_ERRNO: i64 = 4095;

/// Helpers whose result is bounded by their size argument.
fn returns_length(id: u32) -> bool {
    matches!(
        id,
        h::PROBE_READ_STR | h::PROBE_READ_USER_STR | h::PROBE_READ_KERNEL_STR | h::GET_STACK
    )
}

/// Both states run the same iteration of every callback they are in.
fn same_iterations(a: &State, b: &State) -> bool {
    a.frames
        .iter()
        .zip(&b.frames)
        .all(|(x, y)| x.iteration == y.iteration)
}

/// Narrows register `r` and every copy linked to it by `id`.
fn set_scalar(st: &mut State, r: u8, s: Scalar, id: u32) {
    if r == 10 {
        return;
    }
    if id == 0 {
        st.cur_mut().regs[r as usize] = Reg::scalar(s);
        return;
    }
    st.for_each_reg(|reg| {
        if let Reg::Scalar { id: other, .. } = reg {
            if *other == id {
                *reg = Reg::Scalar { s, id };
            }
        }
    });
}

/// After `if rX == 0`: every copy of the may-be-null pointer `id` is now NULL (and
/// its reference is gone) or known valid.
fn mark_null(st: &mut State, id: u32, ref_id: u32, is_null: bool) {
    st.for_each_reg(|reg| {
        if let Reg::Ptr {
            id: other,
            nullable: true,
            ..
        } = reg
        {
            if *other == id {
                if is_null {
                    *reg = Reg::konst(0);
                } else if let Reg::Ptr {
                    region: Region::InnerMap { fd },
                    ..
                } = *reg
                {
                    *reg = Reg::MapPtr { fd };
                } else if let Reg::Ptr { nullable, .. } = reg {
                    *nullable = false;
                }
            }
        }
    });
    if is_null && ref_id != 0 {
        st.refs.retain(|(r, _)| *r != ref_id);
    }
}

/// What is left of a spilled register is plain data now.
fn unspill(slot: &mut Slot) {
    if slot.spill.take().is_some() {
        for x in slot.bytes.iter_mut() {
            if *x == Byte::Spill {
                *x = Byte::Misc;
            }
        }
    }
}

/// A frame is gone: pointers into it that a callee left in its callers' stacks
/// are plain numbers now.
fn forget_frame(st: &mut State, depth: usize) {
    st.for_each_reg(|r| {
        if matches!(r, Reg::Ptr { region: Region::Stack { frame }, .. } if *frame as usize >= depth)
        {
            *r = Reg::unknown();
        }
    });
}

/// Submit/discard: the record's pointers are dead in every frame.
fn release(st: &mut State, ref_id: u32) {
    st.refs.retain(|(r, _)| *r != ref_id);
    for f in &mut st.frames {
        for r in f.regs.iter_mut() {
            if matches!(r, Reg::Ptr { ref_id: x, .. } if *x == ref_id) {
                *r = Reg::Uninit;
            }
        }
        for s in &mut f.stack {
            if matches!(s.spill, Some(Reg::Ptr { ref_id: x, .. }) if x == ref_id) {
                s.spill = Some(Reg::unknown());
            }
        }
    }
}
